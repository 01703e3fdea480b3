//! The limits policy (docs/guarantees.md, "Limits"): every bound pdinject puts on what an input may
//! make it do, in one place, each with the reason for its value. Work and memory stay
//! proportional to the input; where compression or aliasing could make a small input
//! stand for a huge one, a ceiling stops the run with an error that names the file,
//! the offset and the limit.

use crate::error::{Error, Result};

/// perf's `PATH_MAX`: it reads a build-ID entry's name area (the entry's bytes after
/// its 36-byte head) into a `char filename[PATH_MAX]` without checking: a longer area
/// smashes its stack (perf 6.1 aborts). Entries with a longer area are not read.
pub(crate) const PATH_MAX: usize = 4096;

/// Longest DSO name written into a build-ID table or HEADER_BUILD_ID record, in bytes
/// without the NUL. Entries are written 8-byte aligned (perf 7.3 refuses stream events
/// that are not), so the name area is `round_up(36 + len + 1, 8) - 36`: at most
/// [`PATH_MAX`] for names up to 4091 bytes.
pub(crate) const MAX_DSO_NAME: usize = 4091;

/// Worker threads at most (`-j`). Each thread costs a stack and a share of the
/// unwinder caches; 100,000 threads take minutes to start. Larger requests are a usage
/// error rather than a silent clamp, so the user learns the value did not take.
pub(crate) const MAX_JOBS: usize = 1024;

/// Events (`perf_event_attr` entries) per input. perf records a few per event given
/// with `-e`; even `-e 'syscalls:*'` is under 1,000.
pub(crate) const MAX_ATTRS: u64 = 65_536;

/// The process model may always hold this many bytes (estimated: an event costs
/// [`MODEL_EVENT_COST`] bytes, a DSO its name twice plus [`MODEL_DSO_COST`]) ...
pub(crate) const MODEL_BYTES_FLOOR: u64 = 64 << 20;
/// ... plus this many per byte of input. Uncompressed records cost about three model
/// bytes per input byte (an MMAP2 record is 80+ bytes, its event 224); only compressed
/// data can ask for more, and 16 leaves room for real `perf record -z` files.
pub(crate) const MODEL_BYTES_PER_INPUT_BYTE: u64 = 16;
/// Estimated bytes of one model event: the event itself (64) and its share of the
/// lookup index (model.rs): the 1-3 pieces a mapping leaves (40 bytes each) and their
/// entries in the version tree (4 bytes each, up to two per tree level). Measured
/// (model.rs `the_index_fits_the_event_cost_estimate`): 83 bytes of index per event
/// for an address space that grows (a JIT's code loads), 125-132 for one that maps over
/// its own mappings.
pub(crate) const MODEL_EVENT_COST: u64 = 224;
/// Estimated fixed bytes of one DSO (beyond its name).
pub(crate) const MODEL_DSO_COST: u64 = 128;

/// Decompressed bytes allowed per compressed byte, past [`DECOMPRESS_FLOOR`]. perf's
/// zstd records compress 5-50 times; 128 leaves room for idle stacks and still
/// turns a 3 MB bomb into 384 MB of work rather than 10 GiB.
pub(crate) const MAX_DECOMPRESS_RATIO: u64 = 128;
/// Decompressed bytes always allowed whatever the ratio (small files of near-empty
/// records legitimately compress very well).
pub(crate) const DECOMPRESS_FLOOR: u64 = 64 << 20;
/// Bytes of a data file one worker maps at once when resolving a chunk. A chunk can
/// only end where no zstd frame is open, so one frame that never ends makes the rest
/// of the file one chunk: mapped whole, memory would follow the file size.
pub(crate) const MAX_RESOLVE_WINDOW: u64 = 64 << 20;

/// Bytes of one dpkg `info/PKG.md5sums` read when a moved ctime needs the package
/// manager's word (the vouchers of `buildid`): a package's list of digests is kilobytes
/// (libc6's 3 KB, the largest on this machine 1.3 MB); a larger one is not read.
pub(crate) const MAX_DPKG_MD5SUMS: u64 = 16 << 20;

/// Bytes of a build-ID cache's link record (`.pdinject-links`, one line of about 100
/// bytes per file pdinject ever linked into the cache) read at most; a longer record
/// is read from its newest end.
pub(crate) const MAX_LINK_LOG: u64 = 64 << 20;

/// Feature tail (every byte after the data section) that `--in-place` rewrites over
/// itself at most, to fit a BUILD_ID table without growing the file: the undo journal
/// holds the old tail, memory the old and the new. perf writes tails of kilobytes (a
/// tracepoint recording's TRACING_DATA, a few MB); a larger tail gets its table
/// appended past the end instead, as `--buildids --in-place` does.
pub(crate) const MAX_FIT_TAIL: u64 = 64 << 20;

/// What a stream run may keep across its batches by default (`--stream-memory`): the
/// process model (mappings, DSO names), the HEADER_BUILD_ID records taken, events and
/// features, the decisions, and records a file output writes at its end; records
/// waiting for the next round count too, but past the budget they are resolved
/// without waiting (that frees them) rather than refused. A stream
/// never ends by itself, so without a ceiling what it keeps grows with its length:
/// distinct 60 KB HEADER_BUILD_ID names were 4.8 GB after 20 s, MMAP2 records of
/// ever new paths 2.9 GB. Real streams keep a few MB (3.2 MB for an 8.4 GB DWARF
/// recording; `perf record -a` on a machine starting processes non-stop about 4 MB a
/// minute). What is kept is estimated, and while a batch's model is built and
/// resolved real memory is up to 4-5 times that (the builder, its snapshot with
/// checkpoints, the groups): 32 MiB keeps the worst shapes measured at 189-194 MB of
/// peak RSS beside their batch, within the 256 MB the limits policy aims at.
pub(crate) const DEFAULT_STREAM_MEMORY: u64 = 32 << 20;
/// `DEFAULT_STREAM_MEMORY` as `--stream-memory` spells it (its default in `--help`).
pub const DEFAULT_STREAM_MEMORY_ARG: &str = "32M";
/// The smallest `--stream-memory` taken: less is surely a unit mistake (a bare
/// number is bytes), and no real stream fits in it.
pub(crate) const MIN_STREAM_MEMORY: u64 = 1 << 20;
/// Estimated fixed bytes of one HEADER_BUILD_ID record a stream keeps (its name is
/// held twice besides: the entry and the set that drops repeats).
pub(crate) const STREAM_ID_COST: u64 = 96;
/// Estimated fixed bytes of one HEADER_ATTR record (the parsed attr beside its bytes).
pub(crate) const STREAM_ATTR_COST: u64 = 256;
/// Estimated fixed bytes of one decision (its name is held twice besides).
pub(crate) const STREAM_DECISION_COST: u64 = 256;

/// What a stream keeps across its batches, estimated in bytes, by kind: the terms of
/// the `--stream-memory` budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamKept {
    /// The process model: mapping events and DSO names.
    pub model: u64,
    /// HEADER_BUILD_ID records taken: their names and IDs.
    pub build_ids: u64,
    /// HEADER_ATTR records: the events and their sample ids.
    pub attrs: u64,
    /// HEADER_FEATURE payloads.
    pub features: u64,
    /// The DSOs decided so far (one table entry or record each).
    pub decisions: u64,
    /// Records a file output keeps for its end (HEADER_BUILD_ID records become its
    /// table, HEADER_TRACING_DATA its feature).
    pub output: u64,
}

impl StreamKept {
    /// Everything kept.
    pub(crate) fn total(&self) -> u64 {
        [
            self.model,
            self.build_ids,
            self.attrs,
            self.features,
            self.decisions,
            self.output,
        ]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Checks the total against `limit`.
    pub(crate) fn check(&self, limit: u64) -> std::result::Result<(), StreamOver> {
        if self.total() > limit {
            return Err(StreamOver { kept: *self, limit });
        }
        Ok(())
    }

    /// The terms in words, largest first (zero ones left out).
    fn terms(&self) -> Vec<(&'static str, u64)> {
        let mut t = vec![
            ("HEADER_BUILD_ID names", self.build_ids),
            ("process model (mappings, DSO names)", self.model),
            ("HEADER_ATTR records", self.attrs),
            ("HEADER_FEATURE payloads", self.features),
            ("decided DSOs", self.decisions),
            (
                "records kept for the output file (build-ID table, tracing data)",
                self.output,
            ),
        ];
        t.retain(|(_, v)| *v > 0);
        t.sort_by_key(|t| std::cmp::Reverse(t.1));
        t
    }
}

/// A stream that went over its `--stream-memory` budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamOver {
    /// What it keeps, by kind.
    pub kept: StreamKept,
    /// The budget.
    pub limit: u64,
}

impl StreamOver {
    /// The error for this budget at `offset`, the record that went over (the file is
    /// filled in by the stage that knows it, with [`Error::in_file`]).
    pub(crate) fn at(&self, offset: u64) -> Error {
        Error::format(offset, self.to_string())
    }
}

impl std::fmt::Display for StreamOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terms: Vec<String> = self
            .kept
            .terms()
            .iter()
            .map(|(what, v)| format!("{what}: {}", format_size(*v)))
            .collect();
        write!(
            f,
            "the stream keeps {} across batches, over its budget of {} ({}); raise it with --stream-memory SIZE for a recording that needs more (see \"Limits\" in docs/guarantees.md)",
            format_size(self.kept.total()),
            format_size(self.limit),
            terms.join(", ")
        )
    }
}

/// `bytes` in binary units as perf prints them: "512 KiB", "48 MiB", "60.1 MiB".
pub(crate) fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale = 1u64;
    while unit + 1 < UNITS.len() && bytes >= scale << 10 {
        scale <<= 10;
        unit += 1;
    }
    if bytes.is_multiple_of(scale) {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", bytes as f64 / scale as f64, UNITS[unit])
    }
}

/// Parses a size as perf's size options take it (`--max-size`, `--mmap-pages`): a
/// number of bytes with an optional binary suffix K, M, G or T (any case, `B` or
/// `iB` after it allowed): `512K`, `64M`, `1G`, `1.5G`, `67108864`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("'{s}' is not a size like 512M or 2G");
    let v: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad()),
    };
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("'{s}' is out of range"));
    }
    Ok(bytes as u64)
}

/// Checks a `--stream-memory` value.
pub fn check_stream_memory(bytes: u64) -> Result<()> {
    if bytes < MIN_STREAM_MEMORY {
        return Err(Error::Usage(format!(
            "--stream-memory {bytes} bytes is below {}: give a size like 512M or 2G (a bare number is bytes)",
            format_size(MIN_STREAM_MEMORY)
        )));
    }
    Ok(())
}

/// A limit that an input went over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
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
    pub(crate) fn at(&self, offset: u64) -> Error {
        Error::format(offset, self.to_string())
    }
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} is over the limit of {} (see \"Limits\" in docs/guarantees.md)",
            self.what, self.value, self.limit
        )
    }
}

/// Checks decompressed output `bytes_out` against compressed input `bytes_in`.
pub(crate) fn check_decompressed(
    bytes_in: u64,
    bytes_out: u64,
) -> std::result::Result<(), Exceeded> {
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
pub(crate) fn name_fits(name: &[u8]) -> bool {
    name.len() <= MAX_DSO_NAME
}

// The section overlap rule (regions of the file sharing no byte) is
// `check_disjoint` of `format::header`, beside the sections it reads.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print_as_perf_spells_them() {
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 8 MB "), Ok(8 << 20));
        for bad in ["", "M", "12Q", "-1G", "1e99G", "1..2M"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_size(DEFAULT_STREAM_MEMORY_ARG),
            Ok(DEFAULT_STREAM_MEMORY)
        );
        assert_eq!(format_size(48 << 20), "48 MiB");
        assert_eq!(format_size((60 << 20) + (1 << 19)), "60.5 MiB");
        assert_eq!(format_size(100), "100 bytes");
        assert!(check_stream_memory(MIN_STREAM_MEMORY).is_ok());
        assert!(check_stream_memory(64).is_err());
    }

    #[test]
    fn a_stream_over_its_budget_names_what_it_keeps() {
        let kept = StreamKept {
            build_ids: 3 << 20,
            model: 1 << 20,
            ..StreamKept::default()
        };
        assert_eq!(kept.total(), 4 << 20);
        assert!(kept.check(4 << 20).is_ok());
        let over = kept.check((4 << 20) - 1).unwrap_err();
        let m = over.to_string();
        assert!(
            m.contains("HEADER_BUILD_ID names: 3 MiB, process model (mappings, DSO names): 1 MiB"),
            "{m}"
        );
        assert!(m.contains("--stream-memory"), "{m}");
        assert!(!m.contains("HEADER_ATTR"), "zero terms are left out: {m}");
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
