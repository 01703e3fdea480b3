//! Build IDs and the entries that carry them: the BUILD_ID feature table
//! (perf-format.md §1.7) and HEADER_BUILD_ID records share one entry layout. Its own
//! module, so that records and features both use it without using each other.

use super::framing::{RecordHeader, misc};
use super::{Endian, c_str};
use std::fmt;

/// A build ID of 1 to 20 bytes (sha1 20, md5/uuid 16, others).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BuildId {
    bytes: [u8; 20],
    len: u8,
}

impl BuildId {
    /// Takes the first `len` bytes of `raw`; `None` if `len` is 0 or over 20 or
    /// `raw` is shorter, or if the ID is all zeros (what perf leaves when it has none).
    pub(crate) fn new(raw: &[u8], len: usize) -> Option<BuildId> {
        if len == 0 || len > 20 || raw.len() < len {
            return None;
        }
        let mut bytes = [0u8; 20];
        bytes[..len].copy_from_slice(&raw[..len]);
        if bytes.iter().all(|&b| b == 0) {
            return None;
        }
        Some(BuildId {
            bytes,
            len: len as u8,
        })
    }

    /// The ID bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Parses an even-length hex string of at most 40 digits.
    pub fn from_hex(s: &str) -> Option<BuildId> {
        let s = s.trim();
        if s.is_empty() || !s.len().is_multiple_of(2) || s.len() > 40 {
            return None;
        }
        let mut raw = [0u8; 20];
        hex::decode_to_slice(s, &mut raw[..s.len() / 2]).ok()?;
        BuildId::new(&raw, s.len() / 2)
    }
}

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BuildId({self})")
    }
}

/// One entry of a build-ID table as read from a file.
#[derive(Clone, Debug)]
pub(crate) struct TableEntry {
    /// KERNEL/USER/GUEST_* cpumode from misc.
    pub cpumode: u16,
    /// The ID.
    pub build_id: BuildId,
    /// DSO name as perf looks it up.
    pub filename: String,
}

impl TableEntry {
    /// Whether the entry names a kernel-space DSO (kernel or module).
    pub(crate) fn is_kernel(&self) -> bool {
        matches!(self.cpumode, misc::KERNEL | misc::GUEST_KERNEL)
    }
}

/// The parsed BUILD_ID feature payload.
#[derive(Clone, Debug, Default)]
pub(crate) struct BuildIdTable {
    /// The entries perf would read.
    pub entries: Vec<TableEntry>,
    /// Set when the table uses the pre-2010 layout without the pid field; pdinject
    /// cannot append modern entries to such a table (perf re-parses all of it).
    pub legacy: bool,
    /// Set when the payload ended in bytes that are not a whole entry (or in an
    /// entry perf cannot read: a name longer than its PATH_MAX buffer).
    pub malformed: bool,
    /// Bytes of whole, readable entries before the damage (the payload's length when
    /// not malformed). Entries appended after a damaged one would be invisible to
    /// perf, which reads on from the damaged size, so they go here instead.
    pub valid_len: usize,
}

/// Parses a BUILD_ID feature payload. Never fails: a damaged tail stops the walk and
/// sets `malformed` (the bytes themselves are copied verbatim on output).
pub(crate) fn parse_build_id_table(payload: &[u8], e: Endian) -> BuildIdTable {
    let mut t = BuildIdTable::default();
    // perf's legacy detection: the first filename, read with the modern layout,
    // looks like "nel.kallsyms]" when the entries lack the pid field.
    if payload.len() > 36 + 13 && payload[36..].starts_with(b"nel.kallsyms]") {
        t.legacy = true;
        return t;
    }
    let mut off = 0usize;
    while off < payload.len() {
        let rest = &payload[off..];
        let Some(h) = RecordHeader::parse(rest, e) else {
            t.malformed = true;
            break;
        };
        let size = h.size as usize;
        // perf reads the name into a PATH_MAX buffer without checking its length.
        if size < 36 || size > rest.len() || size - 36 > crate::limits::PATH_MAX {
            t.malformed = true;
            break;
        }
        if let Some(entry) = parse_build_id_entry(&h, &rest[..size]) {
            t.entries.push(TableEntry {
                cpumode: entry.cpumode,
                build_id: entry.build_id,
                filename: String::from_utf8_lossy(entry.filename).into_owned(),
            });
        }
        off += size;
        t.valid_len = off;
    }
    t
}

/// The whole, readable entries of a BUILD_ID payload (modern layout) that `keep`
/// takes, byte for byte, and how many it left out; a damaged tail is left out too
/// (see [`BuildIdTable::valid_len`]).
pub(crate) fn retain_entries(
    payload: &[u8],
    e: Endian,
    keep: &dyn Fn(&TableEntry) -> bool,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(payload.len());
    let mut dropped = 0;
    let mut off = 0usize;
    // The same walk as parse_build_id_table: one entry per header.size.
    while let Some(rest) = payload.get(off..).filter(|r| !r.is_empty()) {
        let Some(h) = RecordHeader::parse(rest, e) else {
            break;
        };
        let size = h.size as usize;
        if size < 36 || size > rest.len() || size - 36 > crate::limits::MAX_DSO_NAME + 1 {
            break;
        }
        let entry = parse_build_id_entry(&h, &rest[..size]).map(|entry| TableEntry {
            cpumode: entry.cpumode,
            build_id: entry.build_id,
            filename: String::from_utf8_lossy(entry.filename).into_owned(),
        });
        match entry {
            Some(t) if !keep(&t) => dropped += 1,
            _ => out.extend_from_slice(&rest[..size]),
        }
        off += size;
    }
    (out, dropped)
}

/// Encodes one table entry in the modern form: misc carries BUILD_ID_SIZE, byte 32
/// the real length, the filename NUL-terminated and padded so the entry is
/// `round_up(36 + len + 1, 8)` bytes. Readers use `header.size`; perf 7.3 refuses a
/// stream event whose size is not a multiple of 8, so the whole entry is aligned
/// (as perf 7.3 writes it), not only the name (perf 6.12's 36 + round_up(len + 1, 8)).
/// False (nothing written) when perf could not read the name back: perf reads table
/// names into a PATH_MAX buffer, so a longer name would crash it (limits policy).
pub(crate) fn encode_table_entry(
    out: &mut Vec<u8>,
    e: Endian,
    cpumode: u16,
    build_id: &BuildId,
    name: &[u8],
) -> bool {
    if !crate::limits::name_fits(name) {
        return false;
    }
    let size = (36 + name.len() + 1).next_multiple_of(8);
    let name_len = size - 36;
    if size > u16::MAX as usize {
        return false;
    }
    out.extend_from_slice(&e.put_u32(0)); // type: 0 in the feature table
    out.extend_from_slice(&e.put_u16(cpumode | misc::BUILD_ID_SIZE));
    out.extend_from_slice(&e.put_u16(size as u16));
    // perf never byte-swaps the pid field; -1 reads the same either way.
    out.extend_from_slice(&(-1i32).to_ne_bytes());
    let mut raw = [0u8; 20];
    raw[..build_id.as_bytes().len()].copy_from_slice(build_id.as_bytes());
    out.extend_from_slice(&raw);
    out.push(build_id.as_bytes().len() as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(name);
    out.resize(out.len() + name_len - name.len(), 0);
    true
}

/// A HEADER_BUILD_ID entry (stream record or feature-table entry).
#[derive(Clone, Debug)]
pub(crate) struct BuildIdEntry<'a> {
    /// cpumode from misc. (The machine pid at 8..12 is not read: a guest's entries
    /// carry the guest cpumodes, which is what the claims go by.)
    pub cpumode: u16,
    /// The build ID.
    pub build_id: BuildId,
    /// DSO name.
    pub filename: &'a [u8],
}

/// Parses a HEADER_BUILD_ID entry (`rec` spans exactly `header.size` bytes).
pub(crate) fn parse_build_id_entry<'a>(
    h: &RecordHeader,
    rec: &'a [u8],
) -> Option<BuildIdEntry<'a>> {
    let raw = rec.get(12..32)?;
    let len = if h.misc & misc::BUILD_ID_SIZE != 0 {
        (*rec.get(32)? as usize).min(20)
    } else {
        20
    };
    Some(BuildIdEntry {
        cpumode: h.cpumode(),
        build_id: BuildId::new(raw, len)?,
        filename: c_str(rec.get(36..)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retain_entries_keeps_the_bytes_of_what_it_keeps() {
        let e = Endian::Little;
        let (a, b) = (
            BuildId::from_hex("aa").unwrap(),
            BuildId::from_hex("bbbb").unwrap(),
        );
        let mut p = Vec::new();
        encode_table_entry(&mut p, e, misc::USER, &a, b"/a");
        let first = p.len();
        encode_table_entry(&mut p, e, misc::KERNEL, &b, b"[m]");
        let (kept, n) = retain_entries(&p, e, &|t| t.filename != "/a");
        assert_eq!((kept.as_slice(), n), (&p[first..], 1));
        let (kept, n) = retain_entries(&p, e, &|_| true);
        assert_eq!((kept, n), (p.clone(), 0));
        // A damaged tail ends the walk.
        p.extend_from_slice(&[1, 2, 3]);
        let (kept, n) = retain_entries(&p, e, &|_| true);
        assert_eq!((kept.len(), n), (p.len() - 3, 0));
    }

    #[test]
    fn entry_round_trip_both_orders() {
        for e in [Endian::Little, Endian::Big] {
            let id = BuildId::from_hex("00112233445566778899aabbccddeeff").unwrap();
            let mut buf = Vec::new();
            assert!(encode_table_entry(
                &mut buf,
                e,
                misc::USER,
                &id,
                b"/usr/lib/libx.so"
            ));
            // 36 + 17 bytes of name and NUL, aligned to 8 (perf 7.3 refuses others).
            assert_eq!(buf.len(), 56);
            let t = parse_build_id_table(&buf, e);
            assert!(!t.malformed);
            assert_eq!(t.entries.len(), 1);
            assert_eq!(t.entries[0].build_id, id);
            assert_eq!(t.entries[0].filename, "/usr/lib/libx.so");
            assert_eq!(t.entries[0].cpumode, misc::USER);
        }
    }

    #[test]
    fn hex_rules() {
        assert!(BuildId::from_hex("abc").is_none());
        assert!(BuildId::from_hex("zz").is_none());
        assert!(BuildId::from_hex(&"ab".repeat(21)).is_none());
        assert_eq!(BuildId::from_hex("0A0b").unwrap().to_string(), "0a0b");
    }

    #[test]
    fn names_perf_cannot_read_are_refused() {
        let id = BuildId::from_hex("0011").unwrap();
        let mut buf = Vec::new();
        let name = vec![b'/'; crate::limits::MAX_DSO_NAME];
        assert!(encode_table_entry(
            &mut buf,
            Endian::Little,
            misc::USER,
            &id,
            &name
        ));
        let long = vec![b'/'; crate::limits::MAX_DSO_NAME + 1];
        let n = buf.len();
        assert!(!encode_table_entry(
            &mut buf,
            Endian::Little,
            misc::USER,
            &id,
            &long
        ));
        assert_eq!(buf.len(), n);
        let t = parse_build_id_table(&buf, Endian::Little);
        assert_eq!((t.entries.len(), t.valid_len, t.malformed), (1, n, false));
        buf.extend_from_slice(&[1, 2, 3]);
        let t = parse_build_id_table(&buf, Endian::Little);
        assert_eq!((t.entries.len(), t.valid_len, t.malformed), (1, n, true));
    }

    #[test]
    fn damaged_table_stops() {
        let t = parse_build_id_table(&[1, 2, 3, 4, 5, 6, 7, 8, 9], Endian::Little);
        assert!(t.malformed);
        assert!(t.entries.is_empty());
    }
}
