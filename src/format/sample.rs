//! PERF_RECORD_SAMPLE bodies (perf-format.md §1.5), decoded lazily: only the fields
//! that lead to DSOs (IP, pid, time, callchain, branch stack, user regs and stack) are
//! located; everything else is skipped by size.

use super::Endian;
use super::attr::{Attr, bst, rf, st};

/// Precomputed layout of samples of one event.
#[derive(Clone, Debug)]
pub(crate) struct SampleLayout {
    sample_type: u64,
    read_format: u64,
    branch_hw_index: bool,
    branch_counters: bool,
    regs_user_count: usize,
}

impl SampleLayout {
    /// Layout for `attr`.
    pub(crate) fn new(attr: &Attr) -> Self {
        SampleLayout {
            sample_type: attr.sample_type,
            read_format: attr.read_format,
            branch_hw_index: attr.branch_sample_type & bst::HW_INDEX != 0,
            branch_counters: attr.branch_sample_type & bst::COUNTERS != 0,
            regs_user_count: attr.sample_regs_user.count_ones() as usize,
        }
    }
}

/// The located fields of one sample. Arrays stay as raw bytes in the writer's order.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample<'a> {
    /// Sample IP.
    pub ip: Option<u64>,
    /// Process id.
    pub pid: Option<u32>,
    /// Time.
    pub time: Option<u64>,
    /// `nr` u64 callchain entries.
    pub callchain: &'a [u8],
    /// `nr` × {from, to, flags}.
    pub branches: &'a [u8],
    /// User register ABI (0 = none).
    pub regs_abi: u64,
    /// User registers in ascending mask-bit order.
    pub regs_user: &'a [u8],
    /// The valid part (`dyn_size`) of the user stack copy.
    pub stack_user: &'a [u8],
    /// Where the fields a rewrite replaces lie in the record.
    pub spans: Spans,
}

/// Why a sample could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SampleError {
    /// Offset of the problem within the record.
    pub at: usize,
    /// What is wrong.
    pub what: &'static str,
}

struct Cur<'a> {
    d: &'a [u8],
    at: usize,
    e: Endian,
}

impl<'a> Cur<'a> {
    #[inline]
    fn u64(&mut self, what: &'static str) -> Result<u64, SampleError> {
        let v = self
            .e
            .u64(self.d, self.at)
            .ok_or(SampleError { at: self.at, what })?;
        self.at += 8;
        Ok(v)
    }
    #[inline]
    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), SampleError> {
        let end = (self.at as u64)
            .checked_add(n)
            .filter(|&e| e <= self.d.len() as u64)
            .ok_or(SampleError { at: self.at, what })?;
        self.at = end as usize;
        Ok(())
    }
    #[inline]
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], SampleError> {
        let start = self.at;
        self.skip(n, what)?;
        Ok(&self.d[start..self.at])
    }
}

/// The sample id (for picking the event) of a sample record, if the layout has one.
#[inline]
pub(crate) fn sample_id(rec: &[u8], e: Endian, sample_type: u64) -> Option<u64> {
    if sample_type & st::IDENTIFIER != 0 {
        return e.u64(rec, 8);
    }
    if sample_type & st::ID == 0 {
        return None;
    }
    let pos = [st::IP, st::TID, st::TIME, st::ADDR]
        .iter()
        .filter(|&&b| sample_type & b != 0)
        .count();
    e.u64(rec, 8 + 8 * pos)
}

/// A sample's time alone, without decoding the rest: it follows only fixed-size
/// fields (IDENTIFIER, IP and TID) in perf's sample layout. Passes that order records
/// by time (the engine's, the `--jit` scan and merge) read it so.
#[inline]
pub(crate) fn sample_time(rec: &[u8], e: Endian, sample_type: u64) -> Option<u64> {
    if sample_type & st::TIME == 0 {
        return None;
    }
    let before = [st::IDENTIFIER, st::IP, st::TID]
        .iter()
        .filter(|&&b| sample_type & b != 0)
        .count();
    e.u64(rec, 8 + 8 * before)
}

impl SampleLayout {
    /// Locates the fields of the sample record `rec` (header included).
    pub(crate) fn decode<'a>(&self, rec: &'a [u8], e: Endian) -> Result<Sample<'a>, SampleError> {
        let t = self.sample_type;
        let mut c = Cur { d: rec, at: 8, e };
        let mut s = Sample::default();
        if t & st::IDENTIFIER != 0 {
            c.u64("truncated sample id")?;
        }
        if t & st::IP != 0 {
            s.ip = Some(c.u64("truncated sample ip")?);
        }
        if t & st::TID != 0 {
            s.pid = e.u32(rec, c.at);
            c.u64("truncated sample pid/tid")?;
        }
        if t & st::TIME != 0 {
            s.time = Some(c.u64("truncated sample time")?);
        }
        for b in [st::ADDR, st::ID, st::STREAM_ID, st::CPU, st::PERIOD] {
            if t & b != 0 {
                c.u64("truncated sample field")?;
            }
        }
        if t & st::READ != 0 {
            let rfm = self.read_format;
            let (per_value, times) = read_words(rfm);
            let (per_value, times) = (8 * per_value, 8 * times);
            if rfm & rf::GROUP != 0 {
                let nr = c.u64("truncated read group count")?;
                let len = nr
                    .checked_mul(per_value)
                    .and_then(|v| v.checked_add(times))
                    .ok_or(SampleError {
                        at: c.at,
                        what: "read group count overflows",
                    })?;
                c.skip(len, "read group larger than the sample")?;
            } else {
                c.skip(per_value + times, "truncated read value")?;
            }
        }
        s.spans.callchain = c.at;
        if t & st::CALLCHAIN != 0 {
            let nr = c.u64("truncated callchain count")?;
            let len = nr.checked_mul(8).ok_or(SampleError {
                at: c.at,
                what: "callchain count overflows",
            })?;
            s.callchain = c.take(len, "callchain larger than the sample")?;
        }
        s.spans.callchain_end = c.at;
        if t & st::RAW != 0 {
            let size = e.u32(rec, c.at).ok_or(SampleError {
                at: c.at,
                what: "truncated raw size",
            })?;
            c.skip(4 + size as u64, "raw data larger than the sample")?;
        }
        if t & st::BRANCH_STACK != 0 {
            let nr = c.u64("truncated branch stack count")?;
            if self.branch_hw_index {
                c.u64("truncated branch hw_index")?;
            }
            let len = nr.checked_mul(24).ok_or(SampleError {
                at: c.at,
                what: "branch count overflows",
            })?;
            s.branches = c.take(len, "branch stack larger than the sample")?;
            if self.branch_counters {
                c.skip(nr * 8, "branch counters larger than the sample")?;
            }
        }
        s.spans.regs = c.at;
        if t & st::REGS_USER != 0 {
            s.regs_abi = c.u64("truncated user regs abi")?;
            if s.regs_abi != 0 {
                s.regs_user = c.take(
                    8 * self.regs_user_count as u64,
                    "user regs larger than the sample",
                )?;
            }
        }
        if t & st::STACK_USER != 0 {
            let size = c.u64("truncated user stack size")?;
            if size != 0 {
                let data = c.take(size, "user stack larger than the sample")?;
                let dyn_size = c.u64("truncated user stack dyn_size")?;
                s.stack_user = &data[..(dyn_size.min(size)) as usize];
            }
        }
        s.spans.stack_end = c.at;
        Ok(s)
    }
}

/// Where the fields that `--convert-callchain` rewrites lie in a sample record:
/// offsets from the record's start (header included), found by the one decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Spans {
    /// Where the callchain's `nr` is (or, without PERF_SAMPLE_CALLCHAIN, where the
    /// field would go: after READ).
    pub callchain: usize,
    /// One past its last entry (equal to `callchain` when the field is absent).
    pub callchain_end: usize,
    /// Where REGS_USER begins (its ABI word), or would.
    pub regs: usize,
    /// One past STACK_USER (its `dyn_size` when the stack has bytes).
    pub stack_end: usize,
}

/// Iterates the u64 entries of a raw callchain in the file's byte order.
#[inline]
pub(crate) fn u64s(raw: &[u8], e: Endian) -> impl Iterator<Item = u64> + '_ {
    raw.chunks_exact(8).filter_map(move |c| e.u64(c, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(sample_type: u64, read_format: u64) -> Attr {
        let mut bytes = vec![0u8; 128];
        bytes[4..8].copy_from_slice(&128u32.to_le_bytes());
        bytes[24..32].copy_from_slice(&sample_type.to_le_bytes());
        bytes[32..40].copy_from_slice(&read_format.to_le_bytes());
        Attr::parse(&bytes, Endian::Little, false).unwrap()
    }

    fn rec(words: &[u64]) -> Vec<u8> {
        let mut r = vec![9, 0, 0, 0, 2, 0, 0, 0];
        for w in words {
            r.extend_from_slice(&w.to_le_bytes());
        }
        let n = r.len() as u16;
        r[6..8].copy_from_slice(&n.to_le_bytes());
        r
    }

    #[test]
    fn period_comes_before_callchain() {
        // IP|TID|TIME|CALLCHAIN|PERIOD as perf record -g writes it.
        let a = attr(0x127, 0);
        let r = rec(&[
            0x1000,
            (7u64 << 32) | 7,
            99,
            1,
            2,
            0xfffffffffffffe00,
            0x1000,
        ]);
        let s = SampleLayout::new(&a).decode(&r, Endian::Little).unwrap();
        assert_eq!(s.ip, Some(0x1000));
        assert_eq!(s.pid, Some(7));
        assert_eq!(s.time, Some(99));
        assert_eq!(
            u64s(s.callchain, Endian::Little).collect::<Vec<_>>(),
            vec![0xfffffffffffffe00, 0x1000]
        );
    }

    #[test]
    fn time_alone_is_the_decoded_time() {
        // Every combination of the fields before TIME, and none.
        for pre in 0..8u64 {
            let t = [st::IDENTIFIER, st::IP, st::TID]
                .iter()
                .enumerate()
                .filter(|(i, _)| pre & (1 << i) != 0)
                .fold(st::TIME | st::CALLCHAIN, |t, (_, b)| t | b);
            let words: Vec<u64> = (0..pre.count_ones() as u64)
                .map(|i| 0x100 + i)
                .chain([777, 1, 0x1000])
                .collect();
            let r = rec(&words);
            let whole = SampleLayout::new(&attr(t, 0))
                .decode(&r, Endian::Little)
                .unwrap()
                .time;
            assert_eq!(
                (sample_time(&r, Endian::Little, t), whole),
                (Some(777), Some(777))
            );
            let cut = &r[..8 + 8 * pre.count_ones() as usize];
            assert_eq!(sample_time(cut, Endian::Little, t), None);
        }
        assert_eq!(sample_time(&rec(&[1, 2]), Endian::Little, st::IP), None);
    }

    #[test]
    fn group_read_is_skipped() {
        let a = attr(st::IP | st::READ | st::CALLCHAIN, rf::GROUP | rf::ID);
        let r = rec(&[0x42, 2, 10, 1, 20, 2, 1, 0x77]);
        let s = SampleLayout::new(&a).decode(&r, Endian::Little).unwrap();
        assert_eq!(
            u64s(s.callchain, Endian::Little).collect::<Vec<_>>(),
            vec![0x77]
        );
    }

    #[test]
    fn hostile_counts_are_errors() {
        let a = attr(st::CALLCHAIN, 0);
        let r = rec(&[u64::MAX]);
        assert!(SampleLayout::new(&a).decode(&r, Endian::Little).is_err());
        let a = attr(st::READ | st::CALLCHAIN, rf::GROUP | rf::ID | rf::LOST);
        let r = rec(&[u64::MAX / 2]);
        assert!(SampleLayout::new(&a).decode(&r, Endian::Little).is_err());
    }
}

/// The time of any record: a sample's from its event's layout (found by its sample
/// id, which the first event's layout locates, as perf reads it), any other kernel
/// record's from its sample-id trailer; `None` for perf's own records.
#[derive(Clone, Debug)]
pub(crate) struct Times {
    e: Endian,
    types: Vec<u64>,
    ids: std::collections::HashMap<u64, usize>,
    trailer: super::record::TrailerLayout,
}

impl Times {
    /// The times of records of `attrs`.
    pub(crate) fn new(attrs: &[Attr], e: Endian) -> Self {
        let mut ids = std::collections::HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                ids.entry(id).or_insert(i);
            }
        }
        Times {
            e,
            types: attrs.iter().map(|a| a.sample_type).collect(),
            ids,
            trailer: attrs
                .first()
                .map(|a| super::record::TrailerLayout::new(a.sample_type, a.sample_id_all()))
                .unwrap_or_default(),
        }
    }

    /// The byte order of the records.
    pub(crate) fn endian(&self) -> Endian {
        self.e
    }

    /// The time of record `rec` of `kind`.
    pub(crate) fn of(&self, kind: u32, rec: &[u8]) -> Option<u64> {
        use super::record::rt;
        if kind == rt::SAMPLE {
            let first = *self.types.first()?;
            let t = if self.types.len() == 1 {
                first
            } else {
                self.types[*self.ids.get(&sample_id(rec, self.e, first)?)?]
            };
            return sample_time(rec, self.e, t);
        }
        if kind >= rt::USER_START {
            return None;
        }
        self.trailer.read(rec, self.e).time
    }
}

/// The 8-byte words of a READ field for `read_format`: per value (the value, its id,
/// its lost count), and the times before them (enabled, running).
pub(crate) fn read_words(rfm: u64) -> (u64, u64) {
    let per = 1 + u64::from(rfm & rf::ID != 0) + u64::from(rfm & rf::LOST != 0);
    let times =
        u64::from(rfm & rf::TOTAL_TIME_ENABLED != 0) + u64::from(rfm & rf::TOTAL_TIME_RUNNING != 0);
    (per, times)
}
