//! The perf.data on-disk format: zero-copy, endian-aware views over bytes.
//!
//! Nothing here allocates per record or assumes alignment: perf-tool records need not
//! be 8-byte aligned (perf 6.1 writes 100-byte HEADER_BUILD_ID records), so every read
//! is an unaligned, bounds-checked copy of a few bytes in the writer's byte order.

pub(crate) mod attr;
pub(crate) mod attr_compat;
pub(crate) mod buildid;
pub(crate) mod compressed;
pub(crate) mod feature;
mod framing;
pub(crate) mod header;
pub(crate) mod jitdump;
pub(crate) mod record;
pub(crate) mod sample;
pub(crate) mod walk;

/// Byte order of the writer of a perf.data file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endian {
    /// Written by a little-endian host (magic bytes `PERFILE2`).
    Little,
    /// Written by a big-endian host (magic bytes `2ELIFREP`).
    Big,
}

impl Endian {
    /// Reads a `u16` at `off`, `None` if out of bounds.
    #[inline]
    pub(crate) fn u16(self, data: &[u8], off: usize) -> Option<u16> {
        let b: [u8; 2] = data.get(off..off.checked_add(2)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        })
    }

    /// Reads a `u32` at `off`, `None` if out of bounds.
    #[inline]
    pub(crate) fn u32(self, data: &[u8], off: usize) -> Option<u32> {
        let b: [u8; 4] = data.get(off..off.checked_add(4)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        })
    }

    /// Reads a `u64` at `off`, `None` if out of bounds.
    #[inline]
    pub(crate) fn u64(self, data: &[u8], off: usize) -> Option<u64> {
        let b: [u8; 8] = data.get(off..off.checked_add(8)?)?.try_into().ok()?;
        Some(match self {
            Endian::Little => u64::from_le_bytes(b),
            Endian::Big => u64::from_be_bytes(b),
        })
    }

    /// Encodes a `u16` in this byte order.
    pub(crate) fn put_u16(self, v: u16) -> [u8; 2] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }

    /// Encodes a `u32` in this byte order.
    pub(crate) fn put_u32(self, v: u32) -> [u8; 4] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }

    /// Encodes a `u64` in this byte order.
    pub(crate) fn put_u64(self, v: u64) -> [u8; 8] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
}

/// A NUL-terminated string inside `data` (the whole slice if no NUL), lossily decoded.
pub(crate) fn c_str(data: &[u8]) -> &[u8] {
    match data.iter().position(|&b| b == 0) {
        Some(n) => &data[..n],
        None => data,
    }
}

/// Makes a string from a recording safe to print on a terminal: control characters
/// (a newline would forge summary lines, ESC drives the terminal) become `\n`, `\t`,
/// `\r`, `\e` or `\xNN`, bidirectional overrides `\u{NNNN}`, and a backslash is
/// doubled so an escaped name cannot pass for another (as perf and `ls -b` do).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32))
                || (0x202a..=0x202e).contains(&(c as u32))
                || (0x2066..=0x2069).contains(&(c as u32)) =>
            {
                out.push_str(&format!("\\u{{{:04x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}
