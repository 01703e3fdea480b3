//! Event attributes written at an older perf's size (`--attrs-for`).
//!
//! perf reads each attr of a perf.data file by its own `attr.size` and refuses the
//! file when that is larger than its `struct perf_event_attr` (header.c `read_attr`:
//! "file uses a more recent and unsupported ABI", shown as "incompatible file
//! format"): perf 6.1 knows 128 bytes, perf 6.12 136, perf 7.3 writes 144. An attr
//! cut to the older size keeps every field that perf knows; it loses nothing when
//! the bytes cut off are zero (the kernel's ABI: a field beyond `attr.size` reads
//! as zero). When they are not, the conversion is refused, naming the event and the
//! field, rather than written without it.

use super::Endian;
use crate::error::{Error, Result};

/// `--attrs-for`: the perf whose attr size the output's event attributes are
/// written at. perf refuses a perf.data file whose attrs are larger than its own
/// `struct perf_event_attr` ("incompatible file format"), so a file recorded by a
/// newer perf can be read by an older one only with its attrs cut to the older
/// size, which is lossless only when the fields cut off are zero
/// (this module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttrsFor {
    /// The input's attrs as they are (the default).
    #[default]
    Verbatim,
    /// perf 6.1: attrs of 128 bytes (`PERF_ATTR_SIZE_VER7`, up to `sig_data`).
    Perf6_1,
    /// perf 6.12: attrs of 136 bytes (`PERF_ATTR_SIZE_VER8`, up to `config3`).
    Perf6_12,
}

impl AttrsFor {
    /// The attr size to write at most (`None`: verbatim).
    pub(crate) fn size(self) -> Option<usize> {
        match self {
            AttrsFor::Verbatim => None,
            AttrsFor::Perf6_1 => Some(128),
            AttrsFor::Perf6_12 => Some(136),
        }
    }

    /// Refuses `--in-place` with a size to write: cutting the attrs rewrites the
    /// header's attr fields and the attrs section, which the crash-safe in-place
    /// writer (`write::inplace`) neither journals nor switches in one
    /// write; a new file is written whole or not at all.
    pub fn check_in_place(self) -> Result<()> {
        if self == AttrsFor::Verbatim {
            return Ok(());
        }
        Err(Error::Usage(format!(
            "--attrs-for {} cannot rewrite a file in place (the attrs section and the header would change in more than one write, which the crash-safe in-place writer does not do); write a new file: pdinject --attrs-for {} IN OUT",
            self.perf(),
            self.perf()
        )))
    }

    /// The perf version, as the user gave it.
    pub(crate) fn perf(self) -> &'static str {
        match self {
            AttrsFor::Verbatim => "",
            AttrsFor::Perf6_1 => "6.1",
            AttrsFor::Perf6_12 => "6.12",
        }
    }
}

/// Fields of `struct perf_event_attr` past perf 6.1's 128 bytes: (offset, name).
const NEWER_FIELDS: &[(usize, &str)] = &[(128, "config3"), (136, "config4")];

/// `perf_event_attr.size` of `attr` as perf reads it (0 means `PERF_ATTR_SIZE_VER0`).
pub(crate) fn own_size(attr: &[u8], e: Endian) -> usize {
    match e.u32(attr, 4) {
        Some(0) | None => 64,
        Some(n) => n as usize,
    }
}

/// `attr` (the struct only, without ids) cut to `to.size()` bytes with its `size`
/// field saying so, or `None` when it is not larger (left as it is). Fails when a
/// byte that would be cut off is not zero; `event` names the event for the message.
pub(crate) fn shrink(
    attr: &[u8],
    e: Endian,
    to: AttrsFor,
    event: &dyn Fn() -> String,
) -> Result<Option<Vec<u8>>> {
    let Some(n) = to.size() else {
        return Ok(None);
    };
    if attr.len() <= n {
        return Ok(None);
    }
    if let Some(at) = attr[n..].iter().position(|&b| b != 0).map(|i| n + i) {
        // Name the 8-byte field holding the first non-zero byte.
        let field = at - at % 8;
        let name = NEWER_FIELDS
            .iter()
            .find(|(off, _)| *off == field)
            .map_or_else(
                || format!("bytes {field}..{}", field + 8),
                |(_, name)| (*name).to_string(),
            );
        let value = attr
            .get(field..field + 8)
            .and_then(|b| e.u64(b, 0))
            .map_or_else(|| format!("{:#04x}", attr[at]), |v| format!("{v:#x}"));
        return Err(Error::unsupported(format!(
            "{}: {name} = {value} is not zero; perf {}'s attr has no {name} ({n} bytes), so --attrs-for {} would lose it",
            event(),
            to.perf(),
            to.perf()
        )));
    }
    let mut out = attr[..n].to_vec();
    out[4..8].copy_from_slice(&e.put_u32(n as u32));
    Ok(Some(out))
}

/// A stream's HEADER_ATTR record (header, attr of `attr.size` bytes, then ids) with
/// its attr cut to `to.size()`, or `None` when it stays as it is.
pub(crate) fn shrink_record(
    rec: &[u8],
    e: Endian,
    to: AttrsFor,
    event: &dyn Fn() -> String,
) -> Result<Option<Vec<u8>>> {
    let body = rec.get(8..).unwrap_or_default();
    let size = own_size(body, e).min(body.len());
    let Some(attr) = shrink(&body[..size], e, to, event)? else {
        return Ok(None);
    };
    let ids = &body[size..];
    let Ok(total) = u16::try_from(8 + attr.len() + ids.len()) else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&rec[..6]);
    out.extend_from_slice(&e.put_u16(total));
    out.extend_from_slice(&attr);
    out.extend_from_slice(ids);
    Ok(Some(out))
}

/// Rewrites the attrs section of the finished file-format output `path` at
/// `to.size()` (the output's own header says where it is): every attr cut and its
/// `size` set, the header's attr entry size and attrs size with them. The section
/// keeps its offset, so nothing else moves: the bytes it no longer uses become
/// zeros (perf reads only what the header points at), or are cut off when the
/// section ends the file. Event names come from the output's EVENT_DESC feature.
/// Returns the attr size it cut from, `None` when the attrs were not larger.
pub(crate) fn rewrite_file(path: &std::path::Path, to: AttrsFor) -> Result<Option<usize>> {
    use super::header::FileHeader;
    use std::os::unix::fs::FileExt;
    let Some(n) = to.size() else {
        return Ok(None);
    };
    let io = |err| Error::io(path, err);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; 104.min(len as usize)];
    f.read_exact_at(&mut head, 0).map_err(io)?;
    let h = FileHeader::parse(&head, len)?;
    let e = h.endian;
    let entry = h.attr_size as usize;
    let attr_len = entry - 16;
    if attr_len <= n {
        return Ok(None);
    }
    let mut raw = vec![0u8; h.attrs.size as usize];
    f.read_exact_at(&mut raw, h.attrs.offset).map_err(io)?;
    let names = event_names(&f, &h, len);
    let mut out = Vec::with_capacity(raw.len() / entry * (n + 16));
    for (i, ent) in raw.chunks_exact(entry).enumerate() {
        let event = || describe(i, names.get(i).map(String::as_str), &ent[..attr_len], e);
        let attr = shrink(&ent[..attr_len], e, to, &event)?.unwrap_or_else(|| ent[..n].to_vec());
        out.extend_from_slice(&attr);
        out.extend_from_slice(&ent[attr_len..]);
    }
    f.write_all_at(&out, h.attrs.offset).map_err(io)?;
    let end = h.attrs.offset + h.attrs.size;
    if end == len {
        f.set_len(h.attrs.offset + out.len() as u64).map_err(io)?;
    } else {
        f.write_all_at(
            &vec![0u8; raw.len() - out.len()],
            h.attrs.offset + out.len() as u64,
        )
        .map_err(io)?;
    }
    let mut fields = Vec::with_capacity(24);
    fields.extend_from_slice(&e.put_u64(n as u64 + 16));
    fields.extend_from_slice(&e.put_u64(h.attrs.offset));
    fields.extend_from_slice(&e.put_u64(out.len() as u64));
    f.write_all_at(&fields, 16).map_err(io)?;
    Ok(Some(attr_len))
}

/// The summary line of a run that cut attrs.
pub(crate) fn note(from: usize, to: usize, attrs_for: AttrsFor) -> String {
    format!(
        "event attrs cut from {from} to {to} bytes for perf {} (--attrs-for; the bytes cut off were zero)",
        attrs_for.perf()
    )
}

/// Feature bit of EVENT_DESC (the events' names).
pub(crate) const FEAT_EVENT_DESC: u32 = 12;

/// The event names of an output file's EVENT_DESC feature (empty when it has none).
fn event_names(f: &std::fs::File, h: &super::header::FileHeader, len: u64) -> Vec<String> {
    use std::os::unix::fs::FileExt;
    if !h.has_feature(FEAT_EVENT_DESC) {
        return Vec::new();
    }
    let e = h.endian;
    let idx = h
        .feature_bits()
        .take_while(|&b| b < FEAT_EVENT_DESC)
        .count() as u64;
    let mut ent = [0u8; 16];
    if f.read_exact_at(&mut ent, h.feature_table_offset() + 16 * idx)
        .is_err()
    {
        return Vec::new();
    }
    let (Some(off), Some(size)) = (e.u64(&ent, 0), e.u64(&ent, 8)) else {
        return Vec::new();
    };
    // Names are for a message: a section that is not plausible gives none.
    if size > 1 << 20 || off.checked_add(size).is_none_or(|end| end > len) {
        return Vec::new();
    }
    let mut p = vec![0u8; size as usize];
    if f.read_exact_at(&mut p, off).is_err() {
        return Vec::new();
    }
    parse_event_desc(&p, e)
}

/// Event names from an EVENT_DESC payload: `u32 nr, u32 attr_size`, then per event
/// the attr, `u32 nr_ids`, a perf string (`u32 len`, `len` bytes NUL-padded) and
/// the ids. Stops at the first thing that does not fit.
pub(crate) fn parse_event_desc(p: &[u8], e: Endian) -> Vec<String> {
    let mut out = Vec::new();
    let (Some(nr), Some(sz)) = (e.u32(p, 0), e.u32(p, 4)) else {
        return out;
    };
    let mut at = 8usize;
    for _ in 0..nr.min(crate::limits::MAX_ATTRS as u32) {
        let Some(a) = at.checked_add(sz as usize) else {
            break;
        };
        let (Some(nids), Some(slen)) = (e.u32(p, a), a.checked_add(4).and_then(|b| e.u32(p, b)))
        else {
            break;
        };
        let s_at = a + 8;
        let Some(s_end) = s_at.checked_add(slen as usize) else {
            break;
        };
        let Some(s) = p.get(s_at..s_end) else {
            break;
        };
        let name = s.split(|&b| b == 0).next().unwrap_or_default();
        out.push(String::from_utf8_lossy(name).into_owned());
        let Some(next) = (nids as usize)
            .checked_mul(8)
            .and_then(|n| s_end.checked_add(n))
        else {
            break;
        };
        at = next;
    }
    out
}

/// "event I (NAME)": the name from EVENT_DESC, else perf's name of a generic
/// hardware or software event, else its type and config.
pub(crate) fn describe(i: usize, name: Option<&str>, attr: &[u8], e: Endian) -> String {
    if let Some(n) = name.filter(|n| !n.is_empty()) {
        return format!("event {i} ({})", super::escape(n));
    }
    const HW: &[&str] = &[
        "cycles",
        "instructions",
        "cache-references",
        "cache-misses",
        "branches",
        "branch-misses",
        "bus-cycles",
        "stalled-cycles-frontend",
        "stalled-cycles-backend",
        "ref-cycles",
    ];
    const SW: &[&str] = &[
        "cpu-clock",
        "task-clock",
        "page-faults",
        "context-switches",
        "cpu-migrations",
        "minor-faults",
        "major-faults",
        "alignment-faults",
        "emulation-faults",
        "dummy",
        "bpf-output",
        "cgroup-switches",
    ];
    let kind = e.u32(attr, 0).unwrap_or(u32::MAX);
    let config = e.u64(attr, 8).unwrap_or(0);
    let known = match kind {
        0 => HW.get(config as usize),
        1 => SW.get(config as usize),
        _ => None,
    };
    match known {
        Some(n) => format!("event {i} ({n})"),
        None => format!("event {i} (type {kind}, config {config:#x})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(len: usize) -> Vec<u8> {
        let mut a = vec![0u8; len];
        a[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        a[8] = 1; // config 1
        a
    }

    #[test]
    fn cuts_zero_tails_and_names_non_zero_fields() {
        let e = Endian::Little;
        let ev = || "event 0 (cycles)".to_string();
        let a = attr(144);
        let s = shrink(&a, e, AttrsFor::Perf6_1, &ev).unwrap().unwrap();
        assert_eq!(s.len(), 128);
        assert_eq!(e.u32(&s, 4), Some(128));
        let s = shrink(&a, e, AttrsFor::Perf6_12, &ev).unwrap().unwrap();
        assert_eq!((s.len(), e.u32(&s, 4)), (136, Some(136)));
        assert!(
            shrink(&attr(128), e, AttrsFor::Perf6_1, &ev)
                .unwrap()
                .is_none()
        );
        assert!(shrink(&a, e, AttrsFor::Verbatim, &ev).unwrap().is_none());
        let mut c3 = a.clone();
        c3[130] = 0x12;
        let m = shrink(&c3, e, AttrsFor::Perf6_1, &ev)
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("event 0 (cycles): config3 = 0x120000 is not zero"),
            "{m}"
        );
        assert!(m.contains("perf 6.1's attr has no config3"), "{m}");
        // 6.12 keeps config3; config4 it cannot.
        assert!(shrink(&c3, e, AttrsFor::Perf6_12, &ev).is_ok());
        let mut c4 = a.clone();
        c4[143] = 1;
        let m = shrink(&c4, e, AttrsFor::Perf6_12, &ev)
            .unwrap_err()
            .to_string();
        assert!(m.contains("config4 = 0x100000000000000"), "{m}");
        let mut far = attr(160);
        far[150] = 1;
        let m = shrink(&far, e, AttrsFor::Perf6_1, &ev)
            .unwrap_err()
            .to_string();
        assert!(m.contains("bytes 144..152"), "{m}");
    }

    #[test]
    fn header_attr_records_keep_their_ids() {
        let e = Endian::Little;
        let mut rec = vec![0u8; 8];
        rec[0..4].copy_from_slice(&64u32.to_le_bytes());
        rec.extend_from_slice(&attr(144));
        rec.extend_from_slice(&7u64.to_le_bytes());
        rec.extend_from_slice(&9u64.to_le_bytes());
        let size = rec.len() as u16;
        rec[6..8].copy_from_slice(&size.to_le_bytes());
        let ev = String::new;
        let s = shrink_record(&rec, e, AttrsFor::Perf6_1, &ev)
            .unwrap()
            .unwrap();
        assert_eq!(s.len(), 8 + 128 + 16);
        assert_eq!(e.u16(&s, 6), Some(s.len() as u16));
        assert_eq!(e.u32(&s, 12), Some(128));
        assert_eq!(e.u64(&s, 136), Some(7));
        assert_eq!(e.u64(&s, 144), Some(9));
    }

    #[test]
    fn event_desc_names() {
        let e = Endian::Little;
        let mut p = Vec::new();
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&136u32.to_le_bytes());
        for (name, ids) in [("cycles:P", 2u32), ("sched:sched_switch", 0)] {
            p.extend_from_slice(&[0u8; 136]);
            p.extend_from_slice(&ids.to_le_bytes());
            let mut s = name.as_bytes().to_vec();
            s.resize(64, 0);
            p.extend_from_slice(&(s.len() as u32).to_le_bytes());
            p.extend_from_slice(&s);
            p.extend_from_slice(&vec![0u8; 8 * ids as usize]);
        }
        assert_eq!(parse_event_desc(&p, e), ["cycles:P", "sched:sched_switch"]);
        assert_eq!(parse_event_desc(&p[..150], e), Vec::<String>::new());
        assert_eq!(
            describe(3, None, &attr(128), e),
            "event 3 (instructions)".to_string()
        );
    }
}
