//! The resolve stage: rayon workers take chunks, decode their samples and turn sample
//! IPs, callchain entries, branch-stack ends and DWARF-unwound return addresses into
//! DSO hits against the model at the sample's time. Results merge in chunk order, so
//! output never depends on the number of threads.

pub(crate) mod callchain;
mod cfi;
pub(crate) mod unwind;

use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::record::{CallchainDeferred, TrailerLayout, misc, rt};
use crate::format::sample::{Sample, SampleLayout, sample_id, u64s};
use crate::format::walk::{Chunk, Rec, Walker};
use crate::input::DataFile;
use crate::model::{DsoId, KERNEL_PID, Key, MapEntry, Model, Seen, Space};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use unwind::{Frame, Outcome, SampleStack, UnwindConfig, UnwindMode, UnwindTables};

/// A rewrite of the records the resolve walks (`--convert-callchain`): each chunk's
/// records are handed to it in order, each sample with what the resolve decoded and
/// unwound, so that a record is decoded and a stack unwound once for both.
pub(crate) trait Rewrite: Sync {
    /// Whether user stacks are unwound with each frame's address for the rewrite
    /// (the resolve alone needs only the DSOs).
    fn wants_frames(&self) -> bool;
    /// The pass over one chunk.
    fn chunk<'t>(&'t self, c: &Chunk) -> Box<dyn ChunkRewrite + 't>;
}

/// [`Rewrite`]'s pass over one chunk.
pub(crate) trait ChunkRewrite {
    /// Takes record `r`, with its sample as the resolve decoded it when it is a
    /// sample of a known event (`None` for every other record).
    fn record(&mut self, r: &Rec<'_>, s: Option<&Decoded<'_, '_>>) -> Result<()>;
    /// The chunk's records are all taken.
    fn done(self: Box<Self>) -> Result<()>;
}

/// A sample as the resolve decoded it, for a [`Rewrite`].
pub(crate) struct Decoded<'s, 'r> {
    /// Its event's index among the attrs.
    pub attr: usize,
    /// Its fields.
    pub sample: &'s Sample<'r>,
    /// Its key in the model.
    pub key: Key,
    /// Its user stack unwound, each frame with its address (the IP; a return address
    /// minus one), when the rewrite wants frames and the stack was walked.
    pub unwound: Option<(&'s [(Frame, u64)], Outcome)>,
}

/// What the workers need besides the chunk.
pub(crate) struct Resolver<'a> {
    model: &'a Model,
    layouts: Vec<SampleLayout>,
    regs_masks: Vec<u64>,
    id_to_attr: HashMap<u64, usize>,
    sample_type0: u64,
    /// The sample-id trailer of non-sample records (the first attr's, as perf reads
    /// it): a deferred user callchain's pid and time.
    trailer: TrailerLayout,
    time_mode: bool,
    e: Endian,
    unwind: Option<(UnwindConfig, &'a UnwindTables)>,
    /// Which DSOs' offsets are asked for, by id.
    want: Vec<bool>,
}

/// Per-chunk (and, merged, per-run) counts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Hits {
    /// Samples touching each DSO, indexed by [`DsoId`].
    pub per_dso: Vec<u64>,
    /// Samples decoded.
    pub samples: u64,
    /// Samples of guest machines (not modelled).
    pub guest_samples: u64,
    /// Addresses (IPs, callchain entries, branch ends) that fell in no mapping.
    pub unmapped: u64,
    /// Samples whose event could not be identified.
    pub unknown_event: u64,
    /// Samples whose user stack was unwound.
    pub unwound_samples: u64,
    /// Return addresses found by unwinding.
    pub unwound_frames: u64,
    /// Samples whose unwinding ran out of time (their DSOs found so far are kept).
    pub over_budget: u64,
    /// Samples whose unwinding reached the frame cap.
    pub frame_capped: u64,
    /// Where samples' addresses lie in the DSOs whose offsets were asked for (JIT
    /// images): DSO, file offset, and the mapping's start less its pgoff.
    pub offsets: Vec<(DsoId, u64, u64)>,
    /// Smallest and largest non-zero sample time.
    pub min_time: Option<u64>,
    /// See `min_time`.
    pub max_time: Option<u64>,
}

impl Hits {
    fn new(n: usize) -> Self {
        Hits {
            per_dso: vec![0; n],
            ..Hits::default()
        }
    }

    /// Adds `o` (a later chunk or batch) to these counts.
    pub(crate) fn merge(&mut self, o: Hits) {
        if self.per_dso.len() < o.per_dso.len() {
            self.per_dso.resize(o.per_dso.len(), 0);
        }
        for (a, b) in self.per_dso.iter_mut().zip(o.per_dso) {
            *a += b;
        }
        self.samples += o.samples;
        self.guest_samples += o.guest_samples;
        self.unmapped += o.unmapped;
        self.unknown_event += o.unknown_event;
        self.unwound_samples += o.unwound_samples;
        self.unwound_frames += o.unwound_frames;
        self.over_budget += o.over_budget;
        self.frame_capped += o.frame_capped;
        if !o.offsets.is_empty() {
            self.offsets.extend(o.offsets);
            self.offsets.sort_unstable();
            self.offsets.dedup();
        }
        self.min_time = [self.min_time, o.min_time].into_iter().flatten().min();
        self.max_time = [self.max_time, o.max_time].into_iter().flatten().max();
    }
}

/// Slots of [`Scratch::seen`].
const SEEN_SLOTS: usize = 256;

/// Scratch reused for every sample of a chunk.
struct Scratch<'m> {
    touched: Vec<DsoId>,
    last: Option<(u32, MapEntry)>,
    /// Mappings found by earlier samples of the chunk, each with the keys over which
    /// its process sees it unchanged, by address: the next sample in the same code
    /// is answered without a search (a JIT's process has tens of thousands of
    /// mappings, and a search of them was most of a resolve).
    seen: Vec<Option<(u32, MapEntry, Seen)>>,
    /// The sample's address spaces (kernel, process), found once per sample.
    spaces: [Option<(u32, Option<Space<'m>>)>; 2],
    /// The frames of the last stack unwound for a rewrite, with their addresses.
    frames: Vec<(Frame, u64)>,
    /// Which DSOs' offsets are asked for, by id; the offsets found in the chunk.
    want: Vec<bool>,
    offsets: HashSet<(DsoId, u64, u64)>,
}

impl<'m> Scratch<'m> {
    /// Forgets the previous sample.
    fn reset(&mut self) {
        self.touched.clear();
        self.last = None;
        self.spaces = [None, None];
    }

    /// The address space `pid` of the current sample (at `key`).
    #[inline]
    fn space(&mut self, model: &'m Model, pid: u32, key: Key) -> Option<Space<'m>> {
        for (p, sp) in self.spaces.iter().flatten() {
            if *p == pid {
                return *sp;
            }
        }
        let sp = model.space(pid, key);
        let slot = if self.spaces[0].is_none() { 0 } else { 1 };
        self.spaces[slot] = Some((pid, sp));
        sp
    }

    /// Looks `addr` up in `space` at `key` and marks its DSO; the last mapping found
    /// answers first, since neighbouring entries of one sample share DSOs.
    #[inline]
    fn look(&mut self, model: &'m Model, space: u32, addr: u64, key: Key, unmapped: &mut u64) {
        let slot = (addr >> 6) as usize % SEEN_SLOTS;
        let m = match self.last {
            Some((sp, m)) if sp == space && m.start <= addr && addr < m.end => m,
            _ => match self.seen.get(slot).copied().flatten() {
                Some((sp, m, seen))
                    if sp == space && m.start <= addr && addr < m.end && seen.holds(key) =>
                {
                    self.last = Some((space, m));
                    m
                }
                _ => match self
                    .space(model, space, key)
                    .and_then(|s| s.lookup_seen(addr))
                {
                    Some((m, seen)) => {
                        self.last = Some((space, m));
                        if let (Some(seen), Some(s)) = (seen, self.seen.get_mut(slot)) {
                            *s = Some((space, m, seen));
                        }
                        m
                    }
                    None => {
                        *unmapped += 1;
                        return;
                    }
                },
            },
        };
        // Only code counts: an address in a data mapping (a locale archive, a
        // library's .data) is a stray stack word, not a frame of that file.
        if let Some(d) = m.dso.filter(|_| m.exec) {
            self.touch(d);
            self.offset(d, &m, addr);
        }
    }

    /// Notes where `addr` lies in DSO `d` by mapping `m`, if its offsets are asked for.
    #[inline]
    fn offset(&mut self, d: DsoId, m: &MapEntry, addr: u64) {
        if self.want.get(d as usize) == Some(&true) {
            let off = m.pgoff.wrapping_add(addr - m.start);
            self.offsets.insert((d, off, m.start.wrapping_sub(m.pgoff)));
        }
    }

    /// Notes the offset of a return address less one (perf looks a callchain's
    /// return addresses up so too), in a DSO whose offsets are asked for only: it
    /// counts no hit.
    fn offset_before(&mut self, model: &'m Model, space: u32, addr: u64, key: Key) {
        let Some(a) = addr.checked_sub(1) else { return };
        if let Some((m, _)) = self.space(model, space, key).and_then(|s| s.lookup_seen(a))
            && let Some(d) = m.dso.filter(|_| m.exec)
        {
            self.offset(d, &m, a);
        }
    }

    /// Marks DSO `d` as touched by the current sample.
    #[inline]
    fn touch(&mut self, d: DsoId) {
        if !self.touched.contains(&d) {
            self.touched.push(d);
        }
    }
}

impl<'a> Resolver<'a> {
    /// Prepares sample layouts and the id → event table.
    pub(crate) fn new(model: &'a Model, attrs: &[Attr], time_mode: bool, e: Endian) -> Self {
        let mut id_to_attr = HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                id_to_attr.entry(id).or_insert(i);
            }
        }
        Resolver {
            model,
            layouts: attrs.iter().map(SampleLayout::new).collect(),
            regs_masks: attrs.iter().map(|a| a.sample_regs_user).collect(),
            id_to_attr,
            sample_type0: attrs[0].sample_type,
            trailer: TrailerLayout::new(attrs[0].sample_type, attrs[0].sample_id_all()),
            time_mode,
            e,
            unwind: None,
            want: Vec::new(),
        }
    }

    /// Also say where samples' addresses lie in `dsos` (JIT images, whose records
    /// are kept for the loads samples touch).
    pub(crate) fn with_offsets(mut self, dsos: &[DsoId]) -> Self {
        for &d in dsos {
            if self.want.len() <= d as usize {
                self.want.resize(d as usize + 1, false);
            }
            self.want[d as usize] = true;
        }
        self
    }

    /// Also unwind user stacks of samples that carry them.
    pub(crate) fn with_unwinding(mut self, cfg: UnwindConfig, tables: &'a UnwindTables) -> Self {
        if cfg.mode != UnwindMode::None {
            self.unwind = Some((cfg, tables));
        }
        self
    }

    /// Resolves every chunk on the current rayon pool and merges in chunk order;
    /// chunks not begun when `stop` turns true end the run with [`Error::Stopped`].
    /// With a `rewrite`, each chunk's records go through it too (see [`Rewrite`]).
    pub(crate) fn run(
        &self,
        files: &[DataFile],
        chunks: &[Chunk],
        progress: &(dyn Fn(u64) + Sync),
        stop: &AtomicBool,
        rewrite: Option<&dyn Rewrite>,
    ) -> Result<Hits> {
        let workers = unwind::WorkerSlots::new(rayon::current_num_threads());
        let arch = self.unwind.map(|(cfg, tables)| (cfg.arch, tables));
        let results: Vec<Result<Hits>> = chunks
            .par_iter()
            .map(|c| {
                if stop.load(Ordering::Relaxed) {
                    return Err(Error::Stopped);
                }
                let r = workers.with(arch, |w| self.chunk(files, c, w, rewrite));
                progress(c.end - c.start);
                r
            })
            .collect();
        if let Some((_, tables)) = self.unwind {
            workers.park_all(tables);
        }
        let mut total = Hits::new(self.model.dsos.len());
        for r in results {
            total.merge(r?);
        }
        Ok(total)
    }

    /// Resolves one chunk (its records handed to `rewrite` too, when there is one).
    pub(crate) fn chunk(
        &self,
        files: &[DataFile],
        c: &Chunk,
        mut w: Option<&mut unwind::Worker>,
        rewrite: Option<&dyn Rewrite>,
    ) -> Result<Hits> {
        let df = files
            .get(c.file)
            .ok_or_else(|| Error::Internal("chunk of an unknown data file".into()))?;
        let mut hits = Hits::new(self.model.dsos.len());
        let mut sc = Scratch {
            touched: Vec::with_capacity(64),
            last: None,
            seen: vec![None; SEEN_SLOTS],
            spaces: [None, None],
            frames: Vec::new(),
            want: self.want.clone(),
            offsets: HashSet::new(),
        };
        let mut walker = Walker::new(self.e, c.first_seq);
        let mut rw = rewrite.map(|t| t.chunk(c));
        let wants = rewrite.is_some_and(|t| t.wants_frames());
        let mut on_rec = |r: &Rec<'_>| -> Result<()> {
            let rw = rw.as_deref_mut();
            match r.header.kind {
                rt::SAMPLE => self.sample(r, &mut hits, &mut sc, w.as_deref_mut(), rw, wants),
                rt::CALLCHAIN_DEFERRED => {
                    self.deferred(r, &mut hits, &mut sc)?;
                    rw.map_or(Ok(()), |t| t.record(r, None))
                }
                _ => rw.map_or(Ok(()), |t| t.record(r, None)),
            }
        };
        walker
            .walk(
                df,
                c.start,
                c.end,
                // Limits policy: a chunk is mapped a bounded window at a time.
                (c.end - c.start).min(crate::limits::MAX_RESOLVE_WINDOW),
                &mut on_rec,
                &mut |_, _| Ok(()),
            )
            .map_err(|e| e.in_file(&df.path))?;
        if let Some(t) = rw {
            t.done()?;
        }
        hits.offsets = sc.offsets.into_iter().collect();
        hits.offsets.sort_unstable();
        Ok(hits)
    }

    /// A PERF_RECORD_CALLCHAIN_DEFERRED record: the user part of the callchains of
    /// earlier samples of its thread (`--call-graph fp,defer`), whose own chains end
    /// at PERF_CONTEXT_USER_DEFERRED. Its addresses are looked up in the address
    /// space of the process its trailer names, at its own time: the user code the
    /// samples ran is that process's at that moment, whichever samples perf joins it
    /// to (by tid, then cookie). Its DSOs count as touched by one sample.
    fn deferred(&self, r: &Rec<'_>, hits: &mut Hits, sc: &mut Scratch<'a>) -> Result<()> {
        let e = self.e;
        let d = CallchainDeferred::parse(r.bytes, e, self.trailer.size).ok_or_else(|| {
            Error::format(
                r.offset,
                format!(
                    "{}CALLCHAIN_DEFERRED record of size {}: its addresses do not fit in it",
                    if r.inner { "compressed " } else { "" },
                    r.bytes.len()
                ),
            )
        })?;
        if matches!(r.header.cpumode(), misc::GUEST_KERNEL | misc::GUEST_USER) {
            return Ok(());
        }
        let id = self.trailer.read(r.bytes, e);
        // Without sample_id_all nothing names the process: nothing to look up in
        // (perf joins such a record to no sample either).
        let Some(pid) = id.pid else {
            return Ok(());
        };
        if let Some(t) = id.time.filter(|&t| t != 0) {
            hits.min_time = Some(hits.min_time.map_or(t, |m| m.min(t)));
            hits.max_time = Some(hits.max_time.map_or(t, |m| m.max(t)));
        }
        let key = Key::new(
            if self.time_mode {
                id.time.unwrap_or(0)
            } else {
                0
            },
            r.seq,
        );
        sc.reset();
        for ip in u64s(d.ips, e).filter(|&ip| ip < callchain::CONTEXT_MAX) {
            sc.look(self.model, pid, ip, key, &mut hits.unmapped);
            if !sc.want.is_empty() {
                sc.offset_before(self.model, pid, ip, key);
            }
        }
        for &d in &sc.touched {
            if let Some(h) = hits.per_dso.get_mut(d as usize) {
                *h += 1;
            }
        }
        Ok(())
    }

    /// The event of sample `r`, by its id (`None`: an event not declared).
    fn event_of(&self, r: &Rec<'_>) -> Option<usize> {
        if self.layouts.len() == 1 {
            return Some(0);
        }
        sample_id(r.bytes, self.e, self.sample_type0)
            .and_then(|id| self.id_to_attr.get(&id).copied())
    }

    /// One sample: its DSOs counted into `hits`, then the record handed to the
    /// rewrite with what was decoded and unwound.
    fn sample(
        &self,
        r: &Rec<'_>,
        hits: &mut Hits,
        sc: &mut Scratch<'a>,
        w: Option<&mut unwind::Worker>,
        rw: Option<&mut (dyn ChunkRewrite + '_)>,
        wants: bool,
    ) -> Result<()> {
        let e = self.e;
        prefetch_after(r.bytes);
        let Some(ai) = self.event_of(r) else {
            hits.unknown_event += 1;
            return rw.map_or(Ok(()), |t| t.record(r, None));
        };
        let s = self.layouts[ai].decode(r.bytes, e).map_err(|err| {
            Error::format(
                r.offset,
                format!(
                    "{}SAMPLE record of size {}: {} (at byte {})",
                    if r.inner { "compressed " } else { "" },
                    r.bytes.len(),
                    err.what,
                    err.at
                ),
            )
        })?;
        hits.samples += 1;
        if let Some(t) = s.time.filter(|&t| t != 0) {
            hits.min_time = Some(hits.min_time.map_or(t, |m| m.min(t)));
            hits.max_time = Some(hits.max_time.map_or(t, |m| m.max(t)));
        }
        let key = Key::new(
            if self.time_mode {
                s.time.unwrap_or(0)
            } else {
                0
            },
            r.seq,
        );
        sc.reset();
        let guest = matches!(r.header.cpumode(), misc::GUEST_KERNEL | misc::GUEST_USER);
        let unwound = if guest {
            hits.guest_samples += 1;
            None
        } else {
            self.addresses(r, &s, key, hits, sc);
            self.unwind_stack(ai, &s, key, hits, sc, w, wants && rw.is_some())
        };
        for &d in &sc.touched {
            if let Some(h) = hits.per_dso.get_mut(d as usize) {
                *h += 1;
            }
        }
        match rw {
            Some(t) => {
                let d = Decoded {
                    attr: ai,
                    sample: &s,
                    key,
                    unwound: unwound.map(|o| (sc.frames.as_slice(), o)),
                };
                t.record(r, Some(&d))
            }
            None => Ok(()),
        }
    }

    /// Looks up the sample's IP, callchain entries and branch ends.
    fn addresses(
        &self,
        r: &Rec<'_>,
        s: &Sample<'_>,
        key: Key,
        hits: &mut Hits,
        sc: &mut Scratch<'a>,
    ) {
        let (e, model, pid) = (self.e, self.model, s.pid);
        if let Some(ip) = s.ip {
            match (r.header.cpumode(), pid) {
                (misc::KERNEL, _) => sc.look(model, KERNEL_PID, ip, key, &mut hits.unmapped),
                (misc::USER, Some(pid)) => sc.look(model, pid, ip, key, &mut hits.unmapped),
                _ => {}
            }
        }
        if !s.callchain.is_empty() {
            callchain::walk(u64s(s.callchain, e), |space, addr| match (space, pid) {
                (callchain::Space::Kernel, _) => {
                    sc.look(model, KERNEL_PID, addr, key, &mut hits.unmapped)
                }
                (callchain::Space::User, Some(pid)) => {
                    sc.look(model, pid, addr, key, &mut hits.unmapped);
                    if !sc.want.is_empty() {
                        sc.offset_before(model, pid, addr, key);
                    }
                }
                _ => {}
            });
        }
        for entry in s.branches.chunks_exact(24) {
            for addr in [e.u64(entry, 0), e.u64(entry, 8)]
                .into_iter()
                .flatten()
                .filter(|&a| a != 0)
            {
                // Branch entries carry no cpumode; the kernel lives in the upper half.
                let space = match pid {
                    Some(p) if addr >> 63 == 0 => p,
                    _ => KERNEL_PID,
                };
                sc.look(model, space, addr, key, &mut hits.unmapped);
            }
        }
    }

    /// Unwinds the sample's user stack when it has one and unwinding is on, its
    /// frames looked up; with `keep`, the frames and their addresses are left in
    /// `sc.frames` for the rewrite.
    #[allow(clippy::too_many_arguments)]
    fn unwind_stack(
        &self,
        ai: usize,
        s: &Sample<'_>,
        key: Key,
        hits: &mut Hits,
        sc: &mut Scratch<'a>,
        w: Option<&mut unwind::Worker>,
        keep: bool,
    ) -> Option<Outcome> {
        let (Some((cfg, tables)), Some(w), Some(pid)) = (self.unwind, w, s.pid) else {
            return None;
        };
        if s.regs_abi == 0 || s.stack_user.is_empty() {
            return None;
        }
        let stack = SampleStack {
            pid,
            key,
            regs_mask: self.regs_masks[ai],
            regs: s.regs_user,
            stack: s.stack_user,
            e: self.e,
        };
        let model = self.model;
        let mut frames = std::mem::take(&mut sc.frames);
        frames.clear();
        let o = unwind::unwind_at(&cfg, model, tables, w, &stack, &mut |f, addr| {
            if keep {
                frames.push((f, addr));
            }
            match f {
                Frame::Dso(d) => sc.touch(d),
                Frame::Address(a) => sc.look(model, pid, a, key, &mut hits.unmapped),
            }
        });
        sc.frames = frames;
        hits.unwound_samples += 1;
        hits.unwound_frames += o.frames as u64;
        hits.over_budget += u64::from(o.over_budget);
        hits.frame_capped += u64::from(o.frame_capped);
        Some(o)
    }
}

/// Bytes after a record that [`prefetch_after`] asks the CPU for: the next sample's
/// header, registers and the top of its stack.
const PREFETCH_BYTES: usize = 1024;

/// Starts loading the record after `rec` into the cache while this one is worked on.
/// Samples of `--call-graph dwarf` are kilobytes apart, too far for the hardware
/// prefetcher, and each began with cache misses on its header and its stack's top
/// (5 % of the resolve's CPU on dwarf-med).
fn prefetch_after(rec: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        // Only addresses are computed (wrapping, never dereferenced): a prefetch of
        // an address past the window, or unmapped, does nothing.
        let next = rec.as_ptr().wrapping_add(rec.len());
        for off in (0..PREFETCH_BYTES).step_by(64) {
            // SAFETY: a prefetch reads nothing the program sees and cannot fault.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    next.wrapping_add(off).cast::<i8>(),
                    std::arch::x86_64::_MM_HINT_T0,
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rec;
}
