//! A new BUILD_ID section written over the old feature tail, in the bytes the tail
//! already has, so that an `--in-place` run leaves the file's size as it was.
//!
//! The tail is everything after the data section: the feature table, then the
//! feature sections. perf writes every string of the simple string features
//! (HOSTNAME, OSRELEASE, VERSION, ARCH, CPUDESC, CPUID and each string of CMDLINE)
//! with `do_write_string`: a `u32 len` of `strlen + 1` rounded up to 64 (NAME_ALIGN),
//! then the NUL-padded bytes. perf's reader (`do_read_string`, 6.1 and 6.12) reads
//! `len` bytes and uses the string up to its NUL, so a string written with `len` =
//! `strlen + 1` rounded up to 8 reads the same and frees up to 56 bytes. The new tail
//! is the feature table with the BUILD_ID entry, then every section in bit order:
//! BUILD_ID's new payload, every other feature byte for byte, except that strings are
//! re-padded, in bit order, until the tail is no longer than the old one; the bytes
//! left over are zeros after the last section (perf reads only what the table points
//! at). Features that mix strings with other fields are never touched (perf decides
//! from the sizes of the CPU topology which optional parts it holds).

use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::feature::{StringAt, header_strings, put_tight_string};
use crate::format::header::{
    FEAT_ARCH, FEAT_BUILD_ID, FEAT_CMDLINE, FEAT_CPUDESC, FEAT_CPUID, FEAT_HOSTNAME,
    FEAT_OSRELEASE, FEAT_VERSION, Section,
};
use crate::input::PerfInput;

/// Features that are one string each.
const ONE_STRING: [u32; 6] = [
    FEAT_HOSTNAME,
    FEAT_OSRELEASE,
    FEAT_VERSION,
    FEAT_ARCH,
    FEAT_CPUDESC,
    FEAT_CPUID,
];

/// The new tail, exactly as long as the old one.
#[derive(Debug)]
pub(crate) struct Fit {
    /// The bytes from the end of the data section to the end of the file.
    pub tail: Vec<u8>,
    /// Strings re-padded from perf's 64 bytes to 8.
    pub repadded: usize,
    /// Zero bytes after the last section (the unit tests check the arithmetic by it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub gap: u64,
}

/// Why the table cannot be written over the old tail.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoFit {
    /// The tail holds more than features, or is too large to rewrite.
    Layout(String),
    /// The new tail needs `need` bytes even with every string re-padded; the old
    /// one has `have`.
    Room {
        /// Bytes the smallest new tail takes.
        need: u64,
        /// Bytes of the old tail.
        have: u64,
    },
}

impl std::fmt::Display for NoFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoFit::Layout(why) => f.write_str(why),
            NoFit::Room { need, have } => write!(
                f,
                "the feature tail has {have} bytes and the new one needs {need} even with its strings re-padded"
            ),
        }
    }
}

/// One feature payload of the new tail.
struct Payload {
    bytes: Vec<u8>,
    /// Its strings, when it is only strings and only one feature uses it.
    strings: Vec<StringAt>,
    /// Which of them are written padded to 8.
    tight: Vec<bool>,
}

impl Payload {
    fn raw(bytes: Vec<u8>) -> Self {
        Payload {
            bytes,
            strings: Vec::new(),
            tight: Vec::new(),
        }
    }

    fn len(&self) -> u64 {
        let saved: usize = self
            .strings
            .iter()
            .zip(&self.tight)
            .filter(|(_, t)| **t)
            .map(|(s, _)| s.size() - s.tight_size())
            .sum();
        (self.bytes.len() - saved) as u64
    }

    fn encode(&self, e: Endian, out: &mut Vec<u8>) {
        let mut from = 0;
        for (s, _) in self.strings.iter().zip(&self.tight).filter(|(_, t)| **t) {
            out.extend_from_slice(&self.bytes[from..s.at]);
            put_tight_string(out, &self.bytes, s, e);
            from = s.at + s.size();
        }
        out.extend_from_slice(&self.bytes[from..]);
    }
}

/// The new tail of `input` with `build_id` as its BUILD_ID section (added to the
/// feature table when the file has none), or why there is none. Only features may
/// lie after the data section (perf 6.12's pipe-to-file output puts attrs and ids
/// there: not rewritten here).
pub(crate) fn fit_tail(
    input: &PerfInput,
    build_id: &[u8],
) -> Result<std::result::Result<Fit, NoFit>> {
    let h = &input.header;
    let e = h.endian;
    let data_end = h.feature_table_offset();
    let have = input.file_len.saturating_sub(data_end);
    if have > crate::limits::MAX_FIT_TAIL {
        return Ok(Err(NoFit::Layout(format!(
            "the feature tail is {have} bytes, over the {} rewritten in place (see \"Limits\" in docs/guarantees.md)",
            crate::limits::MAX_FIT_TAIL
        ))));
    }
    let after = |s: &Section| s.size > 0 && s.end().is_some_and(|end| end > data_end);
    if after(&h.attrs) {
        return Ok(Err(NoFit::Layout(
            "the attrs section lies after the data section".into(),
        )));
    }
    for ids in input.ids_sections()? {
        if after(&ids) {
            return Ok(Err(NoFit::Layout(
                "an ids section lies after the data section".into(),
            )));
        }
    }
    let mut features = Vec::with_capacity(input.features.len());
    for &(bit, s) in &input.features {
        features.push((bit, s, input.data_files[0].read_at(s.offset, s.size)?));
    }
    fit(e, data_end, have, &features, build_id)
}

/// An old feature: its bit, section and payload.
type OldFeature = (u32, Section, Vec<u8>);

/// [`fit_tail`] over the old features, in bit order.
fn fit(
    e: Endian,
    data_end: u64,
    have: u64,
    features: &[OldFeature],
    build_id: &[u8],
) -> Result<std::result::Result<Fit, NoFit>> {
    let (mut payloads, slots) = payloads_of(e, features, build_id);
    let table = 16 * slots.len() as u64;
    let mut len = table + payloads.iter().map(Payload::len).sum::<u64>();
    let repadded = repad(&mut payloads, &mut len, have);
    if len > have {
        return Ok(Err(NoFit::Room { need: len, have }));
    }
    // Sections in the order of the first feature that uses each.
    let mut order: Vec<usize> = Vec::with_capacity(payloads.len());
    for &(_, i) in &slots {
        if !order.contains(&i) {
            order.push(i);
        }
    }
    let mut at = vec![0u64; payloads.len()];
    let mut pos = data_end + table;
    for &i in &order {
        at[i] = pos;
        pos += payloads[i].len();
    }
    let mut tail = Vec::with_capacity(have as usize);
    for &(_, i) in &slots {
        tail.extend_from_slice(&e.put_u64(at[i]));
        tail.extend_from_slice(&e.put_u64(payloads[i].len()));
    }
    for &i in &order {
        payloads[i].encode(e, &mut tail);
    }
    let gap = have.checked_sub(tail.len() as u64).ok_or_else(|| {
        Error::Internal(format!(
            "in place: the new feature tail is {} bytes, over the old {have}",
            tail.len()
        ))
    })?;
    tail.resize(have as usize, 0);
    // What perf will read back: the new BUILD_ID section, every other section byte
    // for byte but for its re-padded strings, which say the same.
    for &(bit, i) in &slots {
        let p = &payloads[i];
        let from = (at[i] - data_end) as usize;
        let got = tail.get(from..from + p.len() as usize).unwrap_or_default();
        if !same_reading(p, got, e, bit == FEAT_CMDLINE) {
            return Err(Error::Internal(format!(
                "in place: feature {bit} would not read back the same from the rewritten tail"
            )));
        }
    }
    Ok(Ok(Fit {
        tail,
        repadded,
        gap,
    }))
}

/// The new tail's payloads, the BUILD_ID's `build_id` first, and each feature's
/// (bit, payload), in bit order.
fn payloads_of(
    e: Endian,
    features: &[OldFeature],
    build_id: &[u8],
) -> (Vec<Payload>, Vec<(u32, usize)>) {
    // One payload per distinct section (exact aliases are written once, as perf
    // reads them: the table entries share the offset).
    let mut payloads: Vec<Payload> = vec![Payload::raw(build_id.to_vec())];
    let mut sources: Vec<Option<Section>> = vec![None];
    let mut slots: Vec<(u32, usize)> = vec![(FEAT_BUILD_ID, 0)];
    for (bit, s, bytes) in features {
        if *bit == FEAT_BUILD_ID {
            continue;
        }
        let slot = match sources.iter().position(|x| *x == Some(*s)) {
            Some(i) => i,
            None => {
                sources.push(Some(*s));
                payloads.push(Payload::raw(bytes.clone()));
                payloads.len() - 1
            }
        };
        slots.push((*bit, slot));
    }
    slots.sort_by_key(|&(bit, _)| bit);
    for (i, p) in payloads.iter_mut().enumerate().skip(1) {
        let users: Vec<u32> = slots
            .iter()
            .filter(|(_, s)| *s == i)
            .map(|(b, _)| *b)
            .collect();
        let strings = match users[..] {
            [b] if ONE_STRING.contains(&b) => header_strings(&p.bytes, e, false),
            [FEAT_CMDLINE] => header_strings(&p.bytes, e, true),
            _ => None,
        };
        p.strings = strings.unwrap_or_default();
        p.tight = vec![false; p.strings.len()];
    }
    (payloads, slots)
}

/// Strings re-padded in bit order, only as many as bring `len` within `have`; how
/// many were.
fn repad(payloads: &mut [Payload], len: &mut u64, have: u64) -> usize {
    let mut repadded = 0;
    'pad: for p in payloads.iter_mut().skip(1) {
        for k in 0..p.strings.len() {
            if *len <= have {
                break 'pad;
            }
            let s = p.strings[k];
            if s.tight_size() < s.size() {
                p.tight[k] = true;
                *len -= (s.size() - s.tight_size()) as u64;
                repadded += 1;
            }
        }
    }
    repadded
}

/// Whether `got` reads as payload `p`: the same bytes, or the same strings.
fn same_reading(p: &Payload, got: &[u8], e: Endian, counted: bool) -> bool {
    if p.strings.is_empty() {
        return got == p.bytes;
    }
    let text = |b: &[u8], s: &StringAt| b.get(s.at + 4..s.at + 4 + s.text).map(<[u8]>::to_vec);
    header_strings(got, e, counted).is_some_and(|g| {
        g.len() == p.strings.len()
            && g.iter()
                .zip(&p.strings)
                .all(|(a, b)| text(got, a).is_some() && text(got, a) == text(&p.bytes, b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::feature::parse_string;

    const E: Endian = Endian::Little;

    fn perf_string(out: &mut Vec<u8>, s: &str, e: Endian) {
        let len = (s.len() + 1).next_multiple_of(64);
        out.extend_from_slice(&e.put_u32(len as u32));
        out.extend_from_slice(s.as_bytes());
        out.resize(out.len() + len - s.len(), 0);
    }

    /// A perf-like tail after `data_end`: features (bit, payload) laid out as perf
    /// does; returns the tail bytes and the (bit, section, payload) list.
    fn tail_of(data_end: u64, feats: &[(u32, Vec<u8>)], e: Endian) -> (Vec<u8>, Vec<OldFeature>) {
        let mut pos = data_end + 16 * feats.len() as u64;
        let mut table = Vec::new();
        let mut body = Vec::new();
        let mut list = Vec::new();
        for (bit, p) in feats {
            let s = Section {
                offset: pos,
                size: p.len() as u64,
            };
            table.extend_from_slice(&e.put_u64(s.offset));
            table.extend_from_slice(&e.put_u64(s.size));
            body.extend_from_slice(p);
            list.push((*bit, s, p.clone()));
            pos += p.len() as u64;
        }
        table.extend_from_slice(&body);
        (table, list)
    }

    /// Reads feature `bit` back from a tail the way perf does: by the table.
    fn read_back(tail: &[u8], data_end: u64, bits: &[u32], bit: u32, e: Endian) -> Vec<u8> {
        let i = bits.iter().position(|&b| b == bit).unwrap();
        let off = e.u64(tail, 16 * i).unwrap() - data_end;
        let size = e.u64(tail, 16 * i + 8).unwrap();
        tail[off as usize..(off + size) as usize].to_vec()
    }

    fn recording(e: Endian) -> Vec<(u32, Vec<u8>)> {
        let s = |t: &str| {
            let mut p = Vec::new();
            perf_string(&mut p, t, e);
            p
        };
        let mut cmd = e.put_u32(4).to_vec();
        for a in ["/usr/bin/perf", "record", "-B", "./prog"] {
            perf_string(&mut cmd, a, e);
        }
        vec![
            (FEAT_HOSTNAME, s("vm")),
            (FEAT_OSRELEASE, s("6.18.44-fc-v669")),
            (7, vec![2, 0, 0, 0, 2, 0, 0, 0]),
            (FEAT_CMDLINE, cmd),
            (13, vec![9; 20]),
        ]
    }

    #[test]
    fn a_table_fits_and_everything_reads_the_same() {
        for e in [Endian::Little, Endian::Big] {
            let data_end = 1000;
            let feats = recording(e);
            let (old, list) = tail_of(data_end, &feats, e);
            let table = vec![7u8; 120];
            let fit = fit(e, data_end, old.len() as u64, &list, &table)
                .unwrap()
                .unwrap();
            assert_eq!(fit.tail.len(), old.len());
            // 16 + 120 bytes needed: HOSTNAME (56) and OSRELEASE (48) are not enough,
            // the first CMDLINE string (48) is.
            assert_eq!(fit.repadded, 3);
            assert_eq!(fit.gap, 56 + 48 + 48 - 136);
            let bits = [2, 3, 4, 7, 11, 13];
            assert_eq!(read_back(&fit.tail, data_end, &bits, 2, e), table);
            for (bit, p) in &feats {
                let got = read_back(&fit.tail, data_end, &bits, *bit, e);
                match *bit {
                    FEAT_HOSTNAME | FEAT_OSRELEASE => {
                        assert_eq!(parse_string(&got, e), parse_string(p, e));
                        assert!(got.len() < p.len());
                    }
                    FEAT_CMDLINE => {
                        let a = header_strings(&got, e, true).unwrap();
                        let b = header_strings(p, e, true).unwrap();
                        assert_eq!(a.len(), 4);
                        for (x, y) in a.iter().zip(&b) {
                            assert_eq!(parse_string(&got[x.at..], e), parse_string(&p[y.at..], e));
                        }
                        assert_eq!(got.len(), p.len() - 48);
                    }
                    _ => assert_eq!(&got, p),
                }
            }
            assert!(
                fit.tail[fit.tail.len() - fit.gap as usize..]
                    .iter()
                    .all(|&b| b == 0)
            );
        }
    }

    #[test]
    fn room_is_taken_only_as_needed_and_refused_past_it() {
        let data_end = 1000;
        let (old, list) = tail_of(data_end, &recording(E), E);
        let have = old.len() as u64;
        // Room without re-padding: dead bytes after the sections.
        let fit0 = fit(E, data_end, have + 200, &list, &[1; 100])
            .unwrap()
            .unwrap();
        assert_eq!((fit0.repadded, fit0.gap), (0, 200 - 116));
        // Every string re-padded: 56 + 48 + 48 + 56 * 3 = 320 bytes.
        let most = 320 - 16;
        let f = fit(E, data_end, have, &list, &vec![1; most])
            .unwrap()
            .unwrap();
        assert_eq!((f.repadded, f.gap), (6, 0));
        let none = fit(E, data_end, have, &list, &vec![1; most + 1]).unwrap();
        assert_eq!(
            none.unwrap_err(),
            NoFit::Room {
                need: have + 1,
                have
            }
        );
    }

    #[test]
    fn aliases_and_odd_strings_are_copied_as_they_are() {
        let data_end = 64;
        let mut feats = recording(E);
        // HOSTNAME with bytes after its string: not only a string.
        feats[0].1.push(0);
        let (old, mut list) = tail_of(data_end, &feats, E);
        // OSRELEASE aliased by feature 13: written once, never re-padded.
        list[4].1 = list[1].1;
        list[4].2 = list[1].2.clone();
        let f = fit(E, data_end, old.len() as u64, &list, &[1; 16])
            .unwrap()
            .unwrap();
        let bits = [2, 3, 4, 7, 11, 13];
        assert_eq!(read_back(&f.tail, data_end, &bits, 3, E), feats[0].1);
        assert_eq!(read_back(&f.tail, data_end, &bits, 4, E), feats[1].1);
        assert_eq!(E.u64(&f.tail, 16 * 2), E.u64(&f.tail, 16 * 5));
        // Only CMDLINE's strings could be re-padded: one was enough.
        assert_eq!(f.repadded, 1);
    }

    #[test]
    fn an_existing_table_is_replaced() {
        let data_end = 64;
        let mut feats = recording(E);
        feats.insert(0, (FEAT_BUILD_ID, vec![5; 60]));
        let (old, list) = tail_of(data_end, &feats, E);
        let f = fit(E, data_end, old.len() as u64, &list, &[6; 100])
            .unwrap()
            .unwrap();
        let bits = [2, 3, 4, 7, 11, 13];
        assert_eq!(read_back(&f.tail, data_end, &bits, 2, E), vec![6; 100]);
        assert_eq!(f.tail.len(), old.len());
    }
}
