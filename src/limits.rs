//! The limits policy (README "Limits"): every bound pdinject puts on what an input may
//! make it do, in one place, each with the reason for its value. Work and memory stay
//! proportional to the input; where compression or aliasing could make a small input
//! stand for a huge one, a ceiling stops the run with an error that names the file,
//! the offset and the limit.

use crate::format::header::Section;
use crate::{Error, Result};

/// perf's `PATH_MAX`: it reads a build-ID entry's name area (the entry's bytes after
/// its 36-byte head) into a `char filename[PATH_MAX]` without checking: a longer area
/// smashes its stack (perf 6.1 aborts). Entries with a longer area are not read.
pub const PATH_MAX: usize = 4096;

/// Longest DSO name written into a build-ID table or HEADER_BUILD_ID record, in bytes
/// without the NUL. Entries are written 8-byte aligned (perf 7.3 refuses stream events
/// that are not), so the name area is `round_up(36 + len + 1, 8) - 36`: at most
/// [`PATH_MAX`] for names up to 4091 bytes.
pub const MAX_DSO_NAME: usize = 4091;

/// Worker threads at most (`-j`). Each thread costs a stack and a share of the
/// unwinder caches; 100,000 threads take minutes to start. Larger requests are a usage
/// error rather than a silent clamp, so the user learns the value did not take.
pub const MAX_JOBS: usize = 1024;

/// Events (`perf_event_attr` entries) per input. perf records a few per event given
/// with `-e`; even `-e 'syscalls:*'` is under 1,000.
pub const MAX_ATTRS: u64 = 65_536;

/// The process model may always hold this many bytes (estimated: an event costs
/// [`MODEL_EVENT_COST`] bytes, a DSO its name twice plus [`MODEL_DSO_COST`]) ...
pub const MODEL_BYTES_FLOOR: u64 = 64 << 20;
/// ... plus this many per byte of input. Uncompressed records cost less than one model
/// byte per input byte (an MMAP2 record is 80+ bytes, its event 64); only compressed
/// data can ask for more, and 16 leaves room for real `perf record -z` files.
pub const MODEL_BYTES_PER_INPUT_BYTE: u64 = 16;
/// Estimated bytes of one model event.
pub const MODEL_EVENT_COST: u64 = 64;
/// Estimated fixed bytes of one DSO (beyond its name).
pub const MODEL_DSO_COST: u64 = 128;

/// Decompressed bytes allowed per compressed byte, past [`DECOMPRESS_FLOOR`]. perf's
/// zstd records compress 5-50 times; 128 leaves room for idle stacks and still
/// turns a 3 MB bomb into 384 MB of work rather than 10 GiB.
pub const MAX_DECOMPRESS_RATIO: u64 = 128;
/// Decompressed bytes always allowed whatever the ratio (small files of near-empty
/// records legitimately compress very well).
pub const DECOMPRESS_FLOOR: u64 = 64 << 20;
/// Bytes of a data file one worker maps at once when resolving a chunk. A chunk can
/// only end where no zstd frame is open, so one frame that never ends makes the rest
/// of the file one chunk: mapped whole, memory would follow the file size.
pub const MAX_RESOLVE_WINDOW: u64 = 64 << 20;

/// Feature tail (every byte after the data section) that `--in-place` rewrites over
/// itself at most, to fit a BUILD_ID table without growing the file: the undo journal
/// holds the old tail, memory the old and the new. perf writes tails of kilobytes (a
/// tracepoint recording's TRACING_DATA, a few MB); a larger tail gets its table
/// appended past the end instead, as `--buildids --in-place` does.
pub const MAX_FIT_TAIL: u64 = 64 << 20;

/// A limit that an input went over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    /// What grew too large, in words ("model memory", "decompressed data").
    pub what: &'static str,
    /// How much the input asked for.
    pub value: u64,
    /// The limit.
    pub limit: u64,
}

impl Exceeded {
    /// The error for this limit at `offset` (the file is filled in by the stage that
    /// knows it, with [`Error::in_file`]).
    pub fn at(&self, offset: u64) -> Error {
        Error::format(offset, self.to_string())
    }
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} is over the limit of {} (see \"Limits\" in the README)",
            self.what, self.value, self.limit
        )
    }
}

/// Checks decompressed output `bytes_out` against compressed input `bytes_in`.
pub fn check_decompressed(bytes_in: u64, bytes_out: u64) -> std::result::Result<(), Exceeded> {
    let limit = DECOMPRESS_FLOOR.max(bytes_in.saturating_mul(MAX_DECOMPRESS_RATIO));
    if bytes_out > limit {
        return Err(Exceeded {
            what: "decompressed data",
            value: bytes_out,
            limit,
        });
    }
    Ok(())
}

/// Checks a `-j` value.
pub fn check_jobs(jobs: usize) -> Result<()> {
    if jobs == 0 {
        return Err(Error::Usage("--jobs must be at least 1".into()));
    }
    if jobs > MAX_JOBS {
        return Err(Error::Usage(format!(
            "--jobs {jobs} is over the limit of {MAX_JOBS} worker threads"
        )));
    }
    Ok(())
}

/// Whether a DSO name can be written where perf reads it back.
pub fn name_fits(name: &[u8]) -> bool {
    name.len() <= MAX_DSO_NAME
}

/// A region of the file that must not share bytes with another: `(what, section,
/// offset of the field that points at it)`.
pub type Region = (String, Section, u64);

/// The section overlap rule: the regions given (ids sections of the attrs, feature
/// sections) must not share a byte. Identical aliases are allowed when `identical_ok`
/// (they are read and written once). perf never writes overlapping sections; without
/// this rule 1,500 attrs whose ids all cover the whole file make 1,500 copies of it.
pub fn check_disjoint(mut regions: Vec<Region>, identical_ok: bool) -> Result<()> {
    // Empty sections own no bytes.
    regions.retain(|(_, s, _)| s.size > 0);
    regions.sort_by_key(|(_, s, _)| (s.offset, s.size));
    // Furthest end so far and who reached it.
    let mut reach: Option<(u64, usize)> = None;
    for i in 0..regions.len() {
        let (_, s, _) = &regions[i];
        if let Some((end, j)) = reach {
            let prev = &regions[j].1;
            let alias = identical_ok && prev == s;
            if s.offset < end && !alias {
                let (what, _, at) = &regions[i];
                return Err(Error::format(
                    *at,
                    format!(
                        "{what} [{:#x}, +{:#x}) overlaps {} [{:#x}, +{:#x}): sections must not share bytes (see \"Limits\" in the README)",
                        s.offset, s.size, regions[j].0, prev.offset, prev.size
                    ),
                ));
            }
        }
        let end = s.offset.saturating_add(s.size);
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, offset: u64, size: u64) -> Region {
        (name.to_string(), Section { offset, size }, 0)
    }

    #[test]
    fn disjoint_rules() {
        assert!(check_disjoint(vec![r("a", 0, 8), r("b", 8, 8)], false).is_ok());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 8, 8)], false).is_err());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 16)], false).is_err());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 16)], true).is_ok());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 8)], true).is_err());
        // Empty sections own no bytes.
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 4, 0)], false).is_ok());
    }

    #[test]
    fn ratio_and_jobs() {
        assert!(check_decompressed(1, DECOMPRESS_FLOOR).is_ok());
        assert!(check_decompressed(1, DECOMPRESS_FLOOR + 1).is_err());
        assert!(check_decompressed(1 << 20, 100 << 20).is_ok());
        assert!(check_jobs(0).is_err());
        assert!(check_jobs(MAX_JOBS + 1).is_err());
        assert!(check_jobs(4).is_ok());
    }
}
