//! `--convert-callchain`: each `--call-graph dwarf` sample's user stack is unwound
//! into its callchain (after `PERF_CONTEXT_USER`, behind any kernel entries) and
//! its register and stack dumps are dropped, as perf 7.3's `perf inject
//! --convert-callchain` does; the event's attr loses `PERF_SAMPLE_REGS_USER` and
//! `PERF_SAMPLE_STACK_USER` (and gains `PERF_SAMPLE_CALLCHAIN`), at the input's attr
//! size. See docs/convert.md.
//!
//! A file into a file in the table form: the resolve converts each chunk as it walks
//! it ([`SpillTap`]), unwinding each stack once for its hits and its chain, and the
//! chunks go to a [`Spill`] that the sink copies into the output in order; batches
//! are resolved (and converted) beside the scan as in every run.
//!
//! Streams and the MMAP2 forms (whose build-ID records are only known once the
//! resolve is done): the engine resolves the input as in every run, and the sink
//! then walks the same chunks again, unwinds each DWARF sample on the pool with the
//! model and unwind tables of that resolve, and writes the records in order, a
//! bounded group of chunks at a time.

mod spill;

pub(crate) use spill::{Spill, SpillTap};

use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::attr_compat::FEAT_EVENT_DESC;
use crate::format::record::{misc, rt};
use crate::format::sample::{SampleLayout, sample_id, u64s};
use crate::format::walk::{Chunk, Rec, Walker, Windows};
use crate::model::{Key, Model};
use crate::resolve::unwind::{self, Frame, Outcome, SampleStack, UnwindConfig, UnwindTables};
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// What the engine's last resolve used, kept for the conversion.
pub struct Seen {
    /// The model the samples were resolved against.
    pub model: Arc<Model>,
    /// The chunks resolved (a file: all of its records).
    pub chunks: Vec<Chunk>,
    /// How stacks were unwound (`None`: not at all).
    pub unwind: Option<UnwindConfig>,
    /// Samples were resolved by time.
    pub time_mode: bool,
    /// Why local files may not be read (another host, no recording time), if so.
    pub local: Option<String>,
    /// The records as the resolve converted them ([`Spill`]), when it did: then the
    /// sink only copies them.
    pub spill: Option<Arc<Spill>>,
}

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
    pub fn merge(&mut self, o: &Counts) {
        self.samples += o.samples;
        self.with_user_frames += o.with_user_frames;
        self.frames += o.frames;
        self.lost_frame_cap += o.lost_frame_cap;
        self.lost_unproven_dso += o.lost_unproven_dso;
        self.lost_no_file += o.lost_no_file;
        self.not_unwound += o.not_unwound;
    }

    /// The summary line.
    pub fn line(&self) -> String {
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

/// Rewrites the attrs an EVENT_DESC payload repeats (`u32 nr, u32 attr_size`, then
/// per event the attr, `u32 nr_ids`, a string, the ids): readers such as
/// linux-perf-data take the attrs from it rather than from the attrs section.
/// Stops at the first thing that does not fit.
pub(crate) fn convert_event_desc(p: &mut [u8], e: Endian) {
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
            convert_attr(attr, e);
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

/// Rewrites the attrs section of the finished file-format perf.data at `path`, in
/// place (the same sizes), and the copy of the attrs in its EVENT_DESC feature.
pub(crate) fn convert_file_attrs(path: &std::path::Path) -> Result<()> {
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
        changed |= convert_attr(&mut a[..entry - 16], h.endian);
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
            convert_event_desc(&mut p, h.endian);
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

/// Input bytes of chunks converted at a time: their output (the same size for
/// records that pass through) is held until written in order.
const GROUP_BYTES: u64 = 64 << 20;

/// How a resolve unwinds, as a converter must unwind too: its model and tables, its
/// unwinding, whether samples are keyed by time, and why local files may not be read
/// (another host, no recording time), if so.
#[derive(Clone, Copy)]
pub(crate) struct How<'a, 'w> {
    pub model: &'a Model,
    pub tables: &'a UnwindTables,
    pub unwind: Option<UnwindConfig>,
    pub time_mode: bool,
    pub local: Option<&'w str>,
}

/// Converts the records of one input with what the engine's last resolve saw.
pub(crate) struct Converter<'a> {
    model: &'a Model,
    tables: &'a UnwindTables,
    cfg: Option<UnwindConfig>,
    time_mode: bool,
    layouts: Vec<SampleLayout>,
    dwarf: Vec<bool>,
    regs_masks: Vec<u64>,
    id_to_attr: HashMap<u64, usize>,
    sample_type0: u64,
    e: Endian,
    /// Records replaced whole (build-ID MMAP2 records): their offset and new bytes,
    /// sorted by offset.
    splices: &'a [(u64, &'a [u8])],
}

impl<'a> Converter<'a> {
    /// A converter for `attrs`, refusing a recording this host cannot unwind: the
    /// dumps are dropped for good, so an output without the chains they hold would
    /// lose them.
    pub(crate) fn new(
        seen: &'a Seen,
        tables: &'a UnwindTables,
        attrs: &[Attr],
        e: Endian,
        splices: &'a [(u64, &'a [u8])],
    ) -> Result<Self> {
        let how = How {
            model: &seen.model,
            tables,
            unwind: seen.unwind,
            time_mode: seen.time_mode,
            local: seen.local.as_deref(),
        };
        Self::with(how, attrs, e, splices)
    }

    /// A converter for `attrs` unwinding as `how` says (see [`Converter::new`]).
    pub(crate) fn with(
        how: How<'a, '_>,
        attrs: &[Attr],
        e: Endian,
        splices: &'a [(u64, &'a [u8])],
    ) -> Result<Self> {
        let any = attrs.iter().any(|a| is_dwarf(a.sample_type));
        if any {
            if let Some(why) = how.local {
                return Err(Error::unsupported(format!(
                    "--convert-callchain: this host cannot unwind the recording ({why}); converting would drop its stack dumps for good. Convert it on the host that recorded it"
                )));
            }
            if how.unwind.is_none() {
                return Err(Error::unsupported(
                    "--convert-callchain: the recording's user stacks cannot be unwound here (unsupported architecture, or --unwind none)",
                ));
            }
        }
        let mut id_to_attr = HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                id_to_attr.entry(id).or_insert(i);
            }
        }
        Ok(Converter {
            model: how.model,
            tables: how.tables,
            cfg: how.unwind,
            time_mode: how.time_mode,
            layouts: attrs.iter().map(SampleLayout::new).collect(),
            dwarf: attrs.iter().map(|a| is_dwarf(a.sample_type)).collect(),
            regs_masks: attrs.iter().map(|a| a.sample_regs_user).collect(),
            id_to_attr,
            sample_type0: attrs.first().map_or(0, |a| a.sample_type),
            e,
            splices,
        })
    }

    /// Converts `chunks` of `src` on `pool`, a group at a time, handing the output
    /// of each chunk to `emit` in order; bytes of `[from, to)` that no chunk holds
    /// are handed on as they are.
    pub(crate) fn run<W: Windows + Sync + ?Sized>(
        &self,
        pool: &rayon::ThreadPool,
        src: &W,
        (from, to): (u64, u64),
        chunks: &[Chunk],
        emit: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<Counts> {
        // Bytes between chunks (none in practice: the chunks of a resolve tile
        // its range) hold no sample to convert, but must not be lost.
        let mut pos = from;
        let gap = |pos: &mut u64, upto: u64, emit: &mut dyn FnMut(&[u8]) -> Result<()>| {
            while *pos < upto {
                let n = (upto - *pos).min(crate::limits::MAX_RESOLVE_WINDOW);
                emit(&src.window(*pos, n)?)?;
                *pos += n;
            }
            Ok::<(), Error>(())
        };
        let workers = unwind::WorkerSlots::new(pool.current_num_threads());
        let arch = self.cfg.map(|cfg| (cfg.arch, self.tables));
        let mut total = Counts::default();
        let mut i = 0;
        let r = (|| -> Result<()> {
            while i < chunks.len() {
                let mut j = i;
                let mut bytes = 0;
                while j < chunks.len() && (j == i || bytes < GROUP_BYTES) {
                    bytes += chunks[j].end - chunks[j].start;
                    j += 1;
                }
                let outs: Vec<Result<(Vec<u8>, Counts)>> = pool.install(|| {
                    chunks[i..j]
                        .par_iter()
                        .map(|c| workers.with(arch, |w| self.chunk(src, c, w)))
                        .collect()
                });
                for (o, c) in outs.into_iter().zip(&chunks[i..j]) {
                    let (b, n) = o?;
                    gap(&mut pos, c.start, emit)?;
                    emit(&b)?;
                    total.merge(&n);
                    pos = pos.max(c.end);
                }
                i = j;
            }
            gap(&mut pos, to, emit)
        })();
        workers.park_all(self.tables);
        r.map(|()| total)
    }

    /// Converts one chunk.
    fn chunk<W: Windows + ?Sized>(
        &self,
        src: &W,
        c: &Chunk,
        mut w: Option<&mut unwind::Worker>,
    ) -> Result<(Vec<u8>, Counts)> {
        let mut out = Vec::with_capacity(((c.end - c.start) / 16) as usize);
        let mut counts = Counts::default();
        let mut bufs = Bufs::default();
        let mut walker = Walker::new(self.e, c.first_seq);
        walker.walk(
            src,
            c.start,
            c.end,
            (c.end - c.start).min(crate::limits::MAX_RESOLVE_WINDOW),
            &mut |r| {
                self.record(r, &mut out, &mut counts, w.as_deref_mut(), &mut bufs)
                    .map(drop)
            },
            &mut |_, _| Ok(()),
        )?;
        Ok((out, counts))
    }

    /// One record: a DWARF sample converted, a HEADER_ATTR of a DWARF event
    /// rewritten, a record the MMAP2 plan replaces replaced, anything else as it is.
    /// A sample whose user stack was unwound leaves its frames in `bufs.frames` and
    /// returns the unwinding's outcome (see [`crate::resolve::Tap`]).
    pub(crate) fn record(
        &self,
        r: &Rec<'_>,
        out: &mut Vec<u8>,
        counts: &mut Counts,
        w: Option<&mut unwind::Worker>,
        bufs: &mut Bufs,
    ) -> Result<Option<Outcome>> {
        if r.inner {
            return Err(Error::Internal(
                "conversion: compressed records reached the converter".into(),
            ));
        }
        if !self.splices.is_empty() {
            let i = self.splices.partition_point(|s| s.0 < r.offset);
            if let Some((_, new)) = self.splices.get(i).filter(|s| s.0 == r.offset) {
                out.extend_from_slice(new);
                return Ok(None);
            }
        }
        match r.header.kind {
            rt::SAMPLE => self.sample(r, out, counts, w, bufs),
            rt::HEADER_ATTR => {
                let start = out.len();
                out.extend_from_slice(r.bytes);
                let size = match self.e.u32(r.bytes, 12) {
                    Some(0) | None => 64,
                    Some(n) => n as usize,
                };
                let end = (8 + size).min(out.len() - start);
                convert_attr(&mut out[start + 8..start + end], self.e);
                Ok(None)
            }
            _ => {
                let start = out.len();
                out.extend_from_slice(r.bytes);
                convert_header_feature(&mut out[start..], self.e);
                Ok(None)
            }
        }
    }

    fn sample(
        &self,
        r: &Rec<'_>,
        out: &mut Vec<u8>,
        counts: &mut Counts,
        w: Option<&mut unwind::Worker>,
        bufs: &mut Bufs,
    ) -> Result<Option<Outcome>> {
        let e = self.e;
        let bytes = r.bytes;
        let ai = if self.layouts.len() == 1 {
            Some(0)
        } else {
            sample_id(bytes, e, self.sample_type0).and_then(|id| self.id_to_attr.get(&id).copied())
        };
        // A sample of an event not declared, or not DWARF, passes as it is.
        let Some(ai) = ai.filter(|&i| self.dwarf.get(i) == Some(&true)) else {
            out.extend_from_slice(bytes);
            return Ok(None);
        };
        let layout = &self.layouts[ai];
        let bad = |err: crate::format::sample::SampleError| {
            Error::format(
                r.offset,
                format!(
                    "SAMPLE record of size {}: {} (at byte {})",
                    bytes.len(),
                    err.what,
                    err.at
                ),
            )
        };
        let s = layout.decode(bytes, e).map_err(bad)?;
        let spans = layout.spans(bytes, e).map_err(bad)?;
        counts.samples += 1;
        let Bufs { frames, chain } = bufs;
        chain.clear();
        chain.extend(u64s(s.callchain, e));
        let kernel_len = chain.len();
        let cpumode = r.header.cpumode();
        let guest = matches!(cpumode, misc::GUEST_KERNEL | misc::GUEST_USER);
        frames.clear();
        let mut outcome = None;
        match (self.cfg, w, s.pid) {
            (Some(cfg), Some(w), Some(pid))
                if !guest && s.regs_abi != 0 && !s.stack_user.is_empty() =>
            {
                let key = Key::new(
                    if self.time_mode {
                        s.time.unwrap_or(0)
                    } else {
                        0
                    },
                    r.seq,
                );
                let stack = SampleStack {
                    pid,
                    key,
                    regs_mask: self.regs_masks[ai],
                    regs: s.regs_user,
                    stack: s.stack_user,
                    e,
                };
                chain.push(PERF_CONTEXT_USER);
                let model = self.model;
                // The chain ends at the first frame the proof cannot back: its own
                // address is right (the caller's CFI found it, or it is the IP), but
                // the way on from it would be frame-pointer guesswork.
                let mut end: Option<Lost> = None;
                let mut lost = None;
                let o = unwind::unwind_at(&cfg, model, self.tables, w, &stack, &mut |f, addr| {
                    frames.push(f);
                    if let Some(why) = end {
                        lost.get_or_insert(why);
                        return;
                    }
                    match f {
                        Frame::Dso(_) if addr != 0 => chain.push(addr),
                        Frame::Dso(_) => end = Some(Lost::Unproven),
                        Frame::Address(a) => {
                            chain.push(a);
                            let in_file = model
                                .space(pid, key)
                                .and_then(|sp| sp.lookup(a))
                                .is_some_and(|m| m.dso.is_some());
                            end = Some(if in_file {
                                Lost::Unproven
                            } else {
                                Lost::NoFile
                            });
                        }
                    }
                });
                outcome = Some(o);
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
        Ok(outcome)
    }
}

/// A converting worker's buffers, kept from sample to sample.
#[derive(Default)]
pub(crate) struct Bufs {
    /// The frames of the last sample unwound (see [`Converter::record`]).
    pub frames: Vec<Frame>,
    chain: Vec<u64>,
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
