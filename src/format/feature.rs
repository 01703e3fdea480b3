//! Feature sections: the strings and clock data used to tell whose machine a
//! recording was made on and when (the BUILD_ID table is in `buildid`).

use super::Endian;

/// Reads a perf header string (`{u32 len; char s[len]}`), the form of HOSTNAME,
/// OSRELEASE, ARCH and friends.
pub(crate) fn parse_string(payload: &[u8], e: Endian) -> Option<String> {
    let len = e.u32(payload, 0)? as usize;
    let s = payload.get(4..4usize.checked_add(len)?)?;
    Some(String::from_utf8_lossy(super::c_str(s)).into_owned())
}

/// CLOCK_DATA: a pair of readings of the sampling clock and of wall-clock time taken
/// together, which turns sample times into wall-clock times.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockData {
    /// Wall-clock time in ns since the epoch.
    pub wall_ns: u64,
    /// The sampling clock's time at the same moment.
    pub clock_ns: u64,
}

/// Parses CLOCK_DATA (`u32 version; u32 clockid; u64 wall_clock_ns; u64 clockid_time_ns`).
pub(crate) fn parse_clock_data(payload: &[u8], e: Endian) -> Option<ClockData> {
    if e.u32(payload, 0)? != 1 {
        return None;
    }
    Some(ClockData {
        wall_ns: e.u64(payload, 8)?,
        clock_ns: e.u64(payload, 16)?,
    })
}

/// One header string as written in a payload: `{u32 len; char s[len]}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StringAt {
    /// Offset of its `len` field in the payload.
    pub at: usize,
    /// The `len` field: bytes after it (perf writes strlen + 1 rounded up to 64).
    pub len: usize,
    /// Bytes before the first NUL: what perf reads.
    pub text: usize,
}

impl StringAt {
    /// Bytes it takes in the payload.
    pub(crate) fn size(&self) -> usize {
        4 + self.len
    }

    /// Bytes it takes padded to 8 instead: `strlen + 1` rounded up to 8 (what perf
    /// reads is the same, since it reads `len` bytes and uses the string up to its NUL).
    pub(crate) fn tight_size(&self) -> usize {
        4 + (self.text + 1).next_multiple_of(8)
    }
}

/// The header strings of a payload that holds nothing else: one string (`counted`
/// false: HOSTNAME, OSRELEASE, VERSION, ARCH, CPUDESC, CPUID) or a `u32` count then
/// that many strings (`counted`: CMDLINE). `None` when the payload is anything but
/// exactly that, or a string has no NUL inside its `len` bytes: such a payload is
/// only ever copied as it is. Features that mix strings with other fields (CPU and
/// NUMA topology, PMU mappings, event and group descriptions) are never split: perf
/// decides from their sizes which optional parts they hold.
pub(crate) fn header_strings(payload: &[u8], e: Endian, counted: bool) -> Option<Vec<StringAt>> {
    let (n, mut at) = if counted {
        (e.u32(payload, 0)? as usize, 4usize)
    } else {
        (1, 0)
    };
    // Each string takes at least 4 bytes: a count beyond that is damage.
    if n > payload.len().saturating_sub(at) / 4 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = e.u32(payload, at)? as usize;
        let bytes = payload.get(at + 4..(at + 4).checked_add(len)?)?;
        let text = bytes.iter().position(|&b| b == 0)?;
        out.push(StringAt { at, len, text });
        at += 4 + len;
    }
    (at == payload.len()).then_some(out)
}

/// Writes string `s` of `payload` padded to 8 bytes (see [`StringAt::tight_size`]).
pub(crate) fn put_tight_string(out: &mut Vec<u8>, payload: &[u8], s: &StringAt, e: Endian) {
    let len = s.tight_size() - 4;
    out.extend_from_slice(&e.put_u32(len as u32));
    out.extend_from_slice(&payload[s.at + 4..s.at + 4 + s.text]);
    out.resize(out.len() + len - s.text, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perf_string(out: &mut Vec<u8>, s: &str, e: Endian) {
        // perf's do_write_string: strlen + 1 rounded up to NAME_ALIGN (64).
        let len = (s.len() + 1).next_multiple_of(64);
        out.extend_from_slice(&e.put_u32(len as u32));
        out.extend_from_slice(s.as_bytes());
        out.resize(out.len() + len - s.len(), 0);
    }

    #[test]
    fn strings_read_the_same_tight() {
        for e in [Endian::Little, Endian::Big] {
            let mut p = Vec::new();
            perf_string(&mut p, "6.18.44-fc-v669", e);
            let s = header_strings(&p, e, false).unwrap();
            assert_eq!(
                s,
                vec![StringAt {
                    at: 0,
                    len: 64,
                    text: 15
                }]
            );
            let mut t = Vec::new();
            put_tight_string(&mut t, &p, &s[0], e);
            assert_eq!(t.len(), s[0].tight_size());
            assert_eq!(t.len(), 4 + 16);
            assert_eq!(parse_string(&t, e), parse_string(&p, e));
            // A string of exactly 7, 8 bytes: NUL included, rounded to 8.
            for (text, want) in [("1234567", 8), ("12345678", 16), ("", 8)] {
                let mut p = Vec::new();
                perf_string(&mut p, text, e);
                let s = header_strings(&p, e, false).unwrap();
                let mut t = Vec::new();
                put_tight_string(&mut t, &p, &s[0], e);
                assert_eq!(t.len(), 4 + want, "{text:?}");
                assert_eq!(parse_string(&t, e).as_deref(), Some(text));
            }
            let mut c = e.put_u32(3).to_vec();
            for a in ["/usr/bin/perf", "record", "-B"] {
                perf_string(&mut c, a, e);
            }
            let s = header_strings(&c, e, true).unwrap();
            assert_eq!(s.len(), 3);
            assert_eq!((s[1].at, s[1].text), (4 + 68, 6));
        }
    }

    #[test]
    fn anything_else_is_not_split() {
        let e = Endian::Little;
        let mut p = Vec::new();
        perf_string(&mut p, "vm", e);
        // Bytes after the string, a string cut short, no NUL in len bytes.
        let mut more = p.clone();
        more.push(0);
        assert!(header_strings(&more, e, false).is_none());
        assert!(header_strings(&p[..p.len() - 1], e, false).is_none());
        let mut no_nul = e.put_u32(4).to_vec();
        no_nul.extend_from_slice(b"abcd");
        assert!(header_strings(&no_nul, e, false).is_none());
        assert!(header_strings(&[], e, false).is_none());
        // A count beyond what the payload can hold, or short of it.
        let mut c = e.put_u32(u32::MAX).to_vec();
        c.extend_from_slice(&p);
        assert!(header_strings(&c, e, true).is_none());
        let mut c = e.put_u32(2).to_vec();
        c.extend_from_slice(&p);
        assert!(header_strings(&c, e, true).is_none());
        let mut c = e.put_u32(0).to_vec();
        assert_eq!(header_strings(&c, e, true), Some(vec![]));
        c.extend_from_slice(&p);
        assert!(header_strings(&c, e, true).is_none());
    }
}
