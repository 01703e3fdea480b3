//! `--aslr` (issue 31): profiles that can leave the building. Every mapping moves to a
//! fixed, deterministic layout as perf 7.3's `perf inject --aslr` lays it out, and every
//! address that names a place in the recorded machine's memory follows or is removed.
//! docs/aslr.md has perf's exact semantics and where pdinject goes further.
//!
//! - [`layout`]: from the recording's mapping events (and forks and exits), the new
//!   start of each mapping and the remapped value of any address at any time (pure);
//! - [`remap`]: one record's bytes in, its rewritten bytes (or a drop with a reason)
//!   out, given a remapper (pure);
//! - [`Recorder`]: the layout's events, as the engine's scan meets the records;
//! - [`Remapper`]: the rewrite of the resolve's records (after a conversion, when
//!   there is one), into the output's spill.

pub(crate) mod layout;
pub(crate) mod remap;
pub(crate) mod tracing;

use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::record::{FileIdent, Fork, Mmap, RecordHeader, TrailerLayout, misc, rt};
use crate::format::sample::sample_id;
use crate::model::Key;
use crate::resolve::callchain::Space;
use layout::{Config, Event, Layout, LayoutBuilder, MapClass};
use remap::{DropReason, SampleCtx, Verdict};
use std::collections::{BTreeMap, HashMap};

/// What was removed from the output, by reason (the summary and the report).
pub(crate) type Dropped = BTreeMap<DropReason, u64>;

/// The summary line of what `--aslr` removed.
pub(crate) fn line(d: &Dropped) -> String {
    let total: u64 = d.values().sum();
    if total == 0 {
        return "addresses remapped (--aslr); no record removed".into();
    }
    let why: Vec<String> = d
        .iter()
        .map(|(r, n)| format!("{n} {}", r.describe()))
        .collect();
    format!(
        "addresses remapped (--aslr); {total} records removed, whose addresses cannot be remapped: {}",
        why.join(", ")
    )
}

/// A feature section of the output file under `--aslr` (`write::TailShape::Edited`):
/// BPF_PROG_INFO (JITed programs' addresses) goes; the tracing data loses its kernel
/// addresses, or goes when it cannot be read; the rest stays.
pub(crate) fn shared_feature(bit: u32, bytes: Vec<u8>) -> Option<Vec<u8>> {
    const FEAT_TRACING_DATA: u32 = 1;
    const FEAT_BPF_PROG_INFO: u32 = 25;
    match bit {
        FEAT_BPF_PROG_INFO => None,
        FEAT_TRACING_DATA => tracing::without_kernel_addresses(&bytes),
        _ => Some(bytes),
    }
}

/// The header records a stream sink made of a file's header (HEADER_ATTR,
/// HEADER_FEATURE, HEADER_TRACING_DATA), as `--aslr` writes them: what goes is
/// counted in `dropped`.
pub(crate) fn shared_head(
    recs: &[u8],
    e: Endian,
    dropped: &mut Dropped,
) -> crate::error::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(recs.len());
    let mut at = 0usize;
    while at < recs.len() {
        let Some(fr) = crate::format::walk::frame(&recs[at..], e, at as u64)? else {
            break;
        };
        let end = (at + fr.total() as usize).min(recs.len());
        let rec = &recs[at..end];
        let start = out.len();
        let verdict = match remap::record(&fr.header, rec, e) {
            Verdict::Rewritten if fr.header.kind == rt::HEADER_TRACING_DATA => {
                remap::tracing_data(rec, e, &mut out)
            }
            v => v,
        };
        match verdict {
            Verdict::Drop(why) => {
                out.truncate(start);
                *dropped.entry(why).or_default() += 1;
            }
            Verdict::Rewritten => {}
            _ => out.extend_from_slice(rec),
        }
        if fr.header.kind == rt::HEADER_ATTR {
            strip_attr_record(&mut out[start..], e);
        }
        at = end.max(at + 8);
    }
    Ok(out)
}

/// The attr of the HEADER_ATTR record `rec` without the masks of the dumps `--aslr`
/// removes.
fn strip_attr_record(rec: &mut [u8], e: Endian) {
    let size = match e.u32(rec, 12) {
        Some(0) | None => 64,
        Some(n) => n as usize,
    };
    let end = (8 + size).min(rec.len());
    if let Some(a) = rec.get_mut(8..end) {
        remap::strip_attr(a, e, false);
    }
}

/// The layout's events as the scan meets the records, laid out when the resolve needs
/// them: a file's at once, a stream's batch by batch.
#[derive(Debug)]
pub(crate) struct Recorder {
    cfg: Config,
    /// Events scanned and not yet laid out, with the offset of their record.
    pending: Vec<(u64, Key, Event)>,
    /// A number for each DSO as perf's machine tells them apart (name, identity).
    dsos: HashMap<(Vec<u8>, FileIdent), u32>,
    layout: Option<Layout>,
}

impl Recorder {
    /// A recorder of perf 7.3's layout.
    pub(crate) fn new() -> Self {
        Recorder {
            cfg: Config::default(),
            pending: Vec::new(),
            dsos: HashMap::new(),
            layout: None,
        }
    }

    fn dso(&mut self, name: &[u8], ident: FileIdent) -> u32 {
        let n = self.dsos.len() as u32;
        *self.dsos.entry((name.to_vec(), ident)).or_insert(n)
    }

    /// An MMAP or MMAP2 record at `offset`, `key`.
    pub(crate) fn mapping(&mut self, offset: u64, key: Key, cpumode: u16, m: &Mmap<'_>) {
        let space = match cpumode {
            misc::KERNEL | misc::GUEST_KERNEL => Space::Kernel,
            _ => Space::User,
        };
        let exec = m.prot & 4 != 0;
        let ev = Event::Map {
            pid: m.pid,
            space,
            start: m.start,
            len: m.len,
            pgoff: m.pgoff,
            dso: self.dso(m.filename, m.ident),
            class: MapClass::of(m.filename, exec, space == Space::Kernel),
        };
        self.pending.push((offset, key, ev));
    }

    /// A FORK or EXIT record at `offset`, `key`.
    pub(crate) fn task(&mut self, offset: u64, key: Key, kind: u32, f: &Fork) {
        let ev = match kind {
            rt::FORK if f.pid != f.ppid => Event::Fork {
                pid: f.pid,
                parent: f.ppid,
            },
            rt::EXIT if f.tid == Some(f.pid) => Event::Exit { pid: f.pid },
            _ => return,
        };
        self.pending.push((offset, key, ev));
    }

    /// A KSYMBOL record at `offset`, `key` (`{addr, len, type, flags, name}`).
    pub(crate) fn ksymbol(&mut self, offset: u64, key: Key, rec: &[u8], e: Endian) {
        let (Some(addr), Some(len), Some(flags)) = (e.u64(rec, 8), e.u32(rec, 16), e.u16(rec, 22))
        else {
            return;
        };
        let ev = if flags & 1 != 0 {
            Event::Unmap {
                addr,
                len: u64::from(len),
            }
        } else {
            let name = rec.get(24..).unwrap_or_default();
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            Event::Map {
                pid: u32::MAX,
                space: Space::Kernel,
                start: addr,
                len: u64::from(len),
                pgoff: 0,
                dso: self.dso(name, FileIdent::None),
                class: MapClass {
                    keyed_by_start: false,
                    pgoff_is_addr: false,
                },
            }
        };
        self.pending.push((offset, key, ev));
    }

    /// The layout laid out so far.
    pub(crate) fn laid(&self) -> Option<&Layout> {
        self.layout.as_ref()
    }

    /// The layout of every event of records before `upto` (a file's end; a stream's
    /// batch's). Err: a stream whose mappings go back in time across batches, which
    /// perf's order cannot be kept for.
    pub(crate) fn layout(&mut self, upto: u64) -> Result<&Layout, Key> {
        let n = self.pending.partition_point(|p| p.0 < upto);
        let now: Vec<(Key, Event)> = self.pending.drain(..n).map(|(_, k, e)| (k, e)).collect();
        match &mut self.layout {
            Some(l) => l.extend(now)?,
            None => {
                let mut b = LayoutBuilder::new(self.cfg);
                for (k, e) in now {
                    b.push(k, e);
                }
                self.layout = Some(b.build());
            }
        }
        self.layout.as_ref().ok_or(Key::new(0, 0))
    }
}

/// The rewrite of records into the remapped layout, for one resolve.
pub(crate) struct Remapper<'a> {
    layout: &'a Layout,
    e: Endian,
    ctxs: Vec<SampleCtx>,
    ids: HashMap<u64, usize>,
    sample_type0: u64,
    trailer: TrailerLayout,
    time_mode: bool,
    /// The layout at the last record's key, with the pieces it hit (records come in
    /// key order; one event between them clears it).
    at: std::cell::RefCell<layout::At<'a>>,
}

impl<'a> Remapper<'a> {
    /// A rewrite by `layout` of records of `attrs` (as the output has them: a
    /// conversion's rewritten attrs), `names` each event's name.
    pub(crate) fn new(
        layout: &'a Layout,
        attrs: &[Attr],
        names: &[String],
        e: Endian,
        time_mode: bool,
    ) -> Self {
        let mut ids = HashMap::new();
        for (i, a) in attrs.iter().enumerate() {
            for &id in &a.ids {
                ids.entry(id).or_insert(i);
            }
        }
        Remapper {
            layout,
            at: std::cell::RefCell::new(layout.at(Key::new(0, 0))),
            e,
            ctxs: attrs
                .iter()
                .enumerate()
                .map(|(i, a)| SampleCtx::new(a, names.get(i).map_or("", String::as_str)))
                .collect(),
            ids,
            sample_type0: attrs.first().map_or(0, |a| a.sample_type),
            trailer: attrs
                .first()
                .map(|a| TrailerLayout::new(a.sample_type, a.sample_id_all()))
                .unwrap_or_default(),
            time_mode,
        }
    }

    /// The byte order of the records it rewrites.
    pub(crate) fn endian(&self) -> Endian {
        self.e
    }

    fn key(&self, time: Option<u64>, seq: u64) -> Key {
        Key::new(if self.time_mode { time.unwrap_or(0) } else { 0 }, seq)
    }

    /// Record `rec` (number `seq`) rewritten into `out` (cleared first); `Err` with why
    /// it goes.
    pub(crate) fn record(
        &self,
        rec: &[u8],
        seq: u64,
        sample_time: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), DropReason> {
        let e = self.e;
        let Some(h) = RecordHeader::parse(rec, e) else {
            out.extend_from_slice(rec);
            return Ok(());
        };
        // Rewritten straight into `out` (the rewrites clear it first); anything but a
        // rewrite takes its bytes back.
        out.clear();
        let start = 0;
        let verdict = match remap::record(&h, rec, e) {
            Verdict::Rewritten => self.rewrite(&h, rec, seq, sample_time, out),
            v => v,
        };
        match verdict {
            Verdict::Keep | Verdict::Inner => {
                out.truncate(start);
                out.extend_from_slice(rec);
            }
            Verdict::Rewritten => {}
            Verdict::Drop(why) => {
                out.truncate(start);
                return Err(why);
            }
        }
        if h.kind == rt::HEADER_ATTR {
            strip_attr_record(&mut out[start..], e);
        }
        Ok(())
    }

    fn rewrite(
        &self,
        h: &RecordHeader,
        rec: &[u8],
        seq: u64,
        sample_time: Option<u64>,
        out: &mut Vec<u8>,
    ) -> Verdict {
        let e = self.e;
        match h.kind {
            rt::SAMPLE => {
                let ai = if self.ctxs.len() == 1 {
                    Some(0)
                } else {
                    sample_id(rec, e, self.sample_type0).and_then(|id| self.ids.get(&id).copied())
                };
                let Some(ctx) = ai.and_then(|i| self.ctxs.get(i)) else {
                    return Verdict::Drop(DropReason::Unreadable);
                };
                let mut at = self.at.borrow_mut();
                at.move_to(self.key(sample_time, seq));
                at.set_thread(match remap::sample_thread(rec, e, ctx.sample_type) {
                    Some((pid, tid)) if pid != tid => layout::Thread::Other,
                    _ => layout::Thread::Leader,
                });
                let map = |pid: u32, space: Space, a: u64| at.remap(pid, space, a);
                match remap::sample(rec, e, ctx, &map, out) {
                    Ok(v) => v,
                    // A sample that cannot be read goes: its addresses cannot be
                    // found to remap (the resolve has refused the input already if it
                    // is damaged).
                    Err(_) => Verdict::Drop(DropReason::Unreadable),
                }
            }
            rt::MMAP | rt::MMAP2 | remap::kind::KSYMBOL => {
                let key = self.key(self.trailer.read(rec, e).time, seq);
                match self.layout.mapped(key) {
                    Some(p) if h.kind == remap::kind::KSYMBOL => remap::ksymbol(rec, e, p, out),
                    Some(p) => remap::mmap(rec, e, p, out),
                    // A mapping the layout did not place (a guest's): nothing of it
                    // can stay.
                    None => Verdict::Drop(DropReason::Unplaced),
                }
            }
            remap::kind::CALLCHAIN_DEFERRED => {
                let mut at = self.at.borrow_mut();
                at.move_to(self.key(self.trailer.read(rec, e).time, seq));
                // The trailer's tid is not read: the leader's view.
                at.set_thread(layout::Thread::Leader);
                let map = |pid: u32, space: Space, a: u64| at.remap(pid, space, a);
                remap::callchain_deferred(rec, e, &self.trailer, &map, out)
                    .unwrap_or(Verdict::Drop(DropReason::TruncatedDeferredCookie))
            }
            rt::HEADER_TRACING_DATA => remap::tracing_data(rec, e, out),
            _ => Verdict::Keep,
        }
    }

    /// The new start of JIT code loaded at `start` by process `pid` at `time` (its
    /// mapping is one of the layout's events).
    pub(crate) fn jit_start(&self, pid: u32, start: u64, time: u64) -> u64 {
        self.layout
            .remap(pid, Space::User, start, Key::new(time, u64::MAX))
            .unwrap_or(0)
    }
}
