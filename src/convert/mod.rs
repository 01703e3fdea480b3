//! `--convert-callchain`: each `--call-graph dwarf` sample's user stack is unwound
//! into its callchain (after `PERF_CONTEXT_USER`, behind any kernel entries) and
//! its register and stack dumps are dropped, as perf 7.3's `perf inject
//! --convert-callchain` does; the event's attr loses `PERF_SAMPLE_REGS_USER` and
//! `PERF_SAMPLE_STACK_USER` (and gains `PERF_SAMPLE_CALLCHAIN`), at the input's attr
//! size. See docs/convert.md.
//!
//! One path for every input and output form: the conversion is a rewrite of the
//! resolve ([`crate::resolve::Rewrite`]). The resolve decodes each sample and
//! unwinds its stack once, for its hits and for the chain written here; each chunk's
//! records go to a [`Spill`] (an unnamed temp file for a file input, memory for a
//! stream's batch), which the sink writes in order, build-ID mapping records laid
//! over the records they replace as it goes.

pub(crate) mod spill;

pub(crate) use spill::{Spill, SpillTap};

use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::attr_compat::FEAT_EVENT_DESC;
use crate::format::record::rt;
use crate::format::sample::u64s;
use crate::format::walk::Rec;
use crate::model::Model;
use crate::resolve::Decoded;
use crate::resolve::unwind::{Frame, UnwindConfig};

/// `PERF_CONTEXT_USER`: the callchain entries after it are user addresses.
pub(crate) const PERF_CONTEXT_USER: u64 = (-512i64) as u64;

/// Bit of `exclude_callchain_user` in the attr's flags word.
const EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;

/// What the conversion did, for the summary and `--report`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// DWARF samples rewritten (their dumps dropped).
    pub samples: u64,
    /// Of those, samples that got user frames.
    pub with_user_frames: u64,
    /// User frames written (the IP included).
    pub frames: u64,
    /// Samples whose chain stopped at `--unwind-max-frames`.
    pub lost_frame_cap: u64,
    /// Samples whose chain ended at a frame in a file whose unwind tables could not
    /// be used: not proven to be the file recorded (changed since, another host,
    /// unreadable) or without CFI.
    pub lost_unproven_dso: u64,
    /// Samples whose chain ended at a frame outside every file mapping (JIT or
    /// anonymous code, or no mapping at all): nothing to unwind it by.
    pub lost_no_file: u64,
    /// Samples without user registers or stack bytes (taken in the kernel with no
    /// user context, a guest sample, or no process): only their kernel chain stays.
    pub not_unwound: u64,
}

impl Counts {
    /// Adds `o` (a later batch).
    pub(crate) fn merge(&mut self, o: &Counts) {
        self.samples += o.samples;
        self.with_user_frames += o.with_user_frames;
        self.frames += o.frames;
        self.lost_frame_cap += o.lost_frame_cap;
        self.lost_unproven_dso += o.lost_unproven_dso;
        self.lost_no_file += o.lost_no_file;
        self.not_unwound += o.not_unwound;
    }

    /// The summary line.
    pub(crate) fn line(&self) -> String {
        format!(
            "converted {} DWARF samples to callchains ({} user frames); {} lost frames: {} at the frame cap, {} at a file not proven or without unwind tables, {} at code outside any file; {} had no user stack",
            self.samples,
            self.frames,
            self.lost_frame_cap + self.lost_unproven_dso + self.lost_no_file,
            self.lost_frame_cap,
            self.lost_unproven_dso,
            self.lost_no_file,
            self.not_unwound
        )
    }
}

/// True for an event whose samples carry DWARF stack dumps.
pub(crate) fn is_dwarf(sample_type: u64) -> bool {
    sample_type & st::REGS_USER != 0 && sample_type & st::STACK_USER != 0
}

/// Rewrites one attr (without its ids) as the conversion leaves it: callchains,
/// no user registers or stack (their sizes zero), user callchains no longer
/// excluded. Fields the attr's size does not reach stay absent. Returns whether it
/// changed (only attrs of DWARF events do).
pub(crate) fn convert_attr(attr: &mut [u8], e: Endian) -> bool {
    let Some(t) = e.u64(attr, 24) else {
        return false;
    };
    if !is_dwarf(t) {
        return false;
    }
    let size = match e.u32(attr, 4) {
        Some(0) | None => 64,
        Some(n) => n as usize,
    }
    .min(attr.len());
    let flags = e.u64(attr, 40);
    let mut put = |at: usize, v: &[u8]| {
        if at + v.len() <= size {
            attr[at..at + v.len()].copy_from_slice(v);
        }
    };
    put(
        24,
        &e.put_u64((t | st::CALLCHAIN) & !(st::REGS_USER | st::STACK_USER)),
    );
    if let Some(flags) = flags {
        put(40, &e.put_u64(flags & !EXCLUDE_CALLCHAIN_USER));
    }
    // sample_regs_user, sample_stack_user
    put(80, &e.put_u64(0));
    put(88, &e.put_u32(0));
    true
}

/// `a` as the conversion leaves it (see [`convert_attr`]).
pub(crate) fn converted(a: &Attr) -> Attr {
    let mut a = a.clone();
    if is_dwarf(a.sample_type) {
        a.sample_type = (a.sample_type | st::CALLCHAIN) & !(st::REGS_USER | st::STACK_USER);
        a.sample_regs_user = 0;
        a.sample_stack_user = 0;
    }
    a
}

/// Rewrites the attrs an EVENT_DESC payload repeats (`u32 nr, u32 attr_size`, then
/// per event the attr, `u32 nr_ids`, a string, the ids): readers such as
/// linux-perf-data take the attrs from it rather than from the attrs section.
/// Stops at the first thing that does not fit.
pub(crate) fn convert_event_desc(p: &mut [u8], e: Endian) {
    rewrite_event_desc(p, e, &convert_attr)
}

/// Rewrites, with `how`, the attrs an EVENT_DESC payload repeats (see
/// [`convert_event_desc`]).
pub(crate) fn rewrite_event_desc(p: &mut [u8], e: Endian, how: &dyn Fn(&mut [u8], Endian) -> bool) {
    let (Some(nr), Some(sz)) = (e.u32(p, 0), e.u32(p, 4)) else {
        return;
    };
    let mut at = 8usize;
    for _ in 0..nr.min(crate::limits::MAX_ATTRS as u32) {
        let Some(a) = at.checked_add(sz as usize) else {
            return;
        };
        let (Some(nids), Some(slen)) = (e.u32(p, a), a.checked_add(4).and_then(|b| e.u32(p, b)))
        else {
            return;
        };
        if let Some(attr) = p.get_mut(at..a) {
            how(attr, e);
        }
        let next = (a + 8)
            .checked_add(slen as usize)
            .and_then(|s| (nids as usize).checked_mul(8)?.checked_add(s));
        match next {
            Some(n) if n <= p.len() => at = n,
            _ => return,
        }
    }
}

/// Rewrites with `how` (which says whether it changed one) the attrs section of the
/// finished file-format perf.data at `path`, in place (the same sizes), and the
/// copy of the attrs in its EVENT_DESC feature.
pub(crate) fn rewrite_file_attrs(
    path: &std::path::Path,
    how: &dyn Fn(&mut [u8], Endian) -> bool,
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let io = |err| Error::io(path, err);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; crate::format::header::FILE_HEADER_SIZE as usize];
    f.read_exact_at(&mut head, 0).map_err(io)?;
    let h = crate::format::header::FileHeader::parse(&head, len).map_err(|e| e.in_file(path))?;
    let n = usize::try_from(h.attrs.size).map_err(|_| Error::format(24, "attrs too large"))?;
    let mut attrs = vec![0u8; n];
    f.read_exact_at(&mut attrs, h.attrs.offset).map_err(io)?;
    let entry = h.attr_size as usize;
    if entry <= 16 {
        return Ok(());
    }
    let mut changed = false;
    for a in attrs.chunks_exact_mut(entry) {
        changed |= how(&mut a[..entry - 16], h.endian);
    }
    if changed {
        f.write_all_at(&attrs, h.attrs.offset).map_err(io)?;
    }
    if h.has_feature(FEAT_EVENT_DESC) {
        let idx = h
            .feature_bits()
            .take_while(|&b| b < FEAT_EVENT_DESC)
            .count() as u64;
        let mut ent = [0u8; 16];
        f.read_exact_at(&mut ent, h.feature_table_offset() + 16 * idx)
            .map_err(io)?;
        if let (Some(off), Some(size)) = (h.endian.u64(&ent, 0), h.endian.u64(&ent, 8))
            && size <= 1 << 24
            && off.checked_add(size).is_some_and(|end| end <= len)
        {
            let mut p = vec![0u8; size as usize];
            f.read_exact_at(&mut p, off).map_err(io)?;
            let before = p.clone();
            rewrite_event_desc(&mut p, h.endian, how);
            if p != before {
                f.write_all_at(&p, off).map_err(io)?;
            }
        }
    }
    Ok(())
}

/// A stream's HEADER_FEATURE record of EVENT_DESC (`u64 feature`, then the
/// payload) gets its attrs rewritten; any other record is left alone.
pub(crate) fn convert_header_feature(rec: &mut [u8], e: Endian) {
    if e.u32(rec, 0) == Some(rt::HEADER_FEATURE)
        && e.u64(rec, 8) == Some(u64::from(FEAT_EVENT_DESC))
        && let Some(p) = rec.get_mut(16..)
    {
        convert_event_desc(p, e);
    }
}

/// Converts the records of one input as the resolve hands them over.
pub(crate) struct Converter<'a> {
    model: &'a Model,
    dwarf: Vec<bool>,
    e: Endian,
}

impl<'a> Converter<'a> {
    /// A converter for `attrs`, refusing a recording this host cannot unwind: the
    /// dumps are dropped for good, so an output without the chains they hold would
    /// lose them. `local` says why local files may not be read, if so.
    pub(crate) fn new(
        model: &'a Model,
        unwind: Option<UnwindConfig>,
        local: Option<&str>,
        attrs: &[Attr],
        e: Endian,
    ) -> Result<Self> {
        if attrs.iter().any(|a| is_dwarf(a.sample_type)) {
            if let Some(why) = local {
                return Err(Error::unsupported(format!(
                    "--convert-callchain: this host cannot unwind the recording ({why}); converting would drop its stack dumps for good. Convert it on the host that recorded it"
                )));
            }
            if unwind.is_none() {
                return Err(Error::unsupported(
                    "--convert-callchain: the recording's user stacks cannot be unwound here (unsupported architecture, or --unwind none)",
                ));
            }
        }
        Ok(Converter {
            model,
            dwarf: attrs.iter().map(|a| is_dwarf(a.sample_type)).collect(),
            e,
        })
    }

    /// One record: a DWARF sample converted, a HEADER_ATTR of a DWARF event
    /// rewritten, anything else as it is.
    pub(crate) fn record(
        &self,
        r: &Rec<'_>,
        s: Option<&Decoded<'_, '_>>,
        out: &mut Vec<u8>,
        counts: &mut Counts,
        chain: &mut Vec<u64>,
    ) -> Result<()> {
        if r.inner {
            return Err(Error::Internal(
                "conversion: compressed records reached the converter".into(),
            ));
        }
        match (r.header.kind, s) {
            (rt::SAMPLE, Some(d)) if self.dwarf.get(d.attr) == Some(&true) => {
                self.sample(r, d, out, counts, chain);
            }
            (rt::HEADER_ATTR, _) => {
                let start = out.len();
                out.extend_from_slice(r.bytes);
                let size = match self.e.u32(r.bytes, 12) {
                    Some(0) | None => 64,
                    Some(n) => n as usize,
                };
                let end = (8 + size).min(out.len() - start);
                convert_attr(&mut out[start + 8..start + end], self.e);
            }
            _ => {
                let start = out.len();
                out.extend_from_slice(r.bytes);
                convert_header_feature(&mut out[start..], self.e);
            }
        }
        Ok(())
    }

    /// A DWARF sample: its kernel chain, `PERF_CONTEXT_USER` and the frames the
    /// resolve unwound, in place of the chain, registers and stack it had.
    fn sample(
        &self,
        r: &Rec<'_>,
        d: &Decoded<'_, '_>,
        out: &mut Vec<u8>,
        counts: &mut Counts,
        chain: &mut Vec<u64>,
    ) {
        let (e, bytes, s) = (self.e, r.bytes, d.sample);
        let spans = s.spans;
        counts.samples += 1;
        chain.clear();
        chain.extend(u64s(s.callchain, e));
        let kernel_len = chain.len();
        match (d.unwound, s.pid) {
            (Some((frames, o)), Some(pid)) => {
                chain.push(PERF_CONTEXT_USER);
                // The chain ends at the first frame the proof cannot back: its own
                // address is right (the caller's CFI found it, or it is the IP), but
                // the way on from it would be frame-pointer guesswork.
                let mut end: Option<Lost> = None;
                let mut lost = None;
                for &(f, addr) in frames {
                    if let Some(why) = end {
                        lost.get_or_insert(why);
                        break;
                    }
                    match f {
                        Frame::Dso(_) if addr != 0 => chain.push(addr),
                        Frame::Dso(_) => end = Some(Lost::Unproven),
                        Frame::Address(a) => {
                            chain.push(a);
                            let in_file = self
                                .model
                                .space(pid, d.key)
                                .and_then(|sp| sp.lookup(a))
                                .is_some_and(|m| m.dso.is_some());
                            end = Some(if in_file {
                                Lost::Unproven
                            } else {
                                Lost::NoFile
                            });
                        }
                    }
                }
                match lost {
                    Some(Lost::Unproven) => counts.lost_unproven_dso += 1,
                    Some(Lost::NoFile) => counts.lost_no_file += 1,
                    None if o.frame_capped => counts.lost_frame_cap += 1,
                    None => {}
                }
                if chain.len() == kernel_len + 1 {
                    chain.pop();
                    counts.not_unwound += 1;
                } else {
                    counts.with_user_frames += 1;
                    counts.frames += (chain.len() - kernel_len - 1) as u64;
                }
            }
            _ => counts.not_unwound += 1,
        }
        // The record: what precedes the callchain, the chain, what lies between it
        // and the user registers, and what follows the user stack.
        let keep =
            spans.callchain + (spans.regs - spans.callchain_end) + (bytes.len() - spans.stack_end);
        let room = (u16::MAX as usize).saturating_sub(keep + 8) / 8;
        if chain.len() > room {
            // A record's size is 16 bits: the chain is cut to fit (never met; a
            // sample's stack dump is larger than the frames it holds).
            chain.truncate(room);
        }
        let size = keep + 8 + 8 * chain.len();
        let start = out.len();
        out.extend_from_slice(&bytes[..spans.callchain]);
        out[start + 6..start + 8].copy_from_slice(&e.put_u16(size as u16));
        out.extend_from_slice(&e.put_u64(chain.len() as u64));
        for a in chain.iter() {
            out.extend_from_slice(&e.put_u64(*a));
        }
        out.extend_from_slice(&bytes[spans.callchain_end..spans.regs]);
        out.extend_from_slice(&bytes[spans.stack_end..]);
    }
}

/// Why a chain ended before the stack did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lost {
    Unproven,
    NoFile,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_loses_the_dumps_and_gains_callchains() {
        let e = Endian::Little;
        let mut a = vec![0u8; 128];
        a[4..8].copy_from_slice(&128u32.to_le_bytes());
        let t = st::IP | st::TID | st::REGS_USER | st::STACK_USER;
        a[24..32].copy_from_slice(&t.to_le_bytes());
        a[40..48].copy_from_slice(&(EXCLUDE_CALLCHAIN_USER | 1).to_le_bytes());
        a[80..88].copy_from_slice(&0xff0fffu64.to_le_bytes());
        a[88..92].copy_from_slice(&8192u32.to_le_bytes());
        assert!(convert_attr(&mut a, e));
        assert_eq!(e.u64(&a, 24), Some(st::IP | st::TID | st::CALLCHAIN));
        assert_eq!(e.u64(&a, 40), Some(1));
        assert_eq!(e.u64(&a, 80), Some(0));
        assert_eq!(e.u32(&a, 88), Some(0));
        // Not DWARF: untouched.
        let mut b = vec![0u8; 128];
        b[24..32].copy_from_slice(&(st::IP | st::CALLCHAIN).to_le_bytes());
        let before = b.clone();
        assert!(!convert_attr(&mut b, e));
        assert_eq!(b, before);
    }
}
