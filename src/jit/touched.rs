//! `--jit-maps touched`: which code loads a sample touches, so that only they get a
//! mapping record.
//!
//! perf names an address by the newest mapping covering it at the sample's time. A
//! load no sample address lies in while it is the newest there names nothing, and
//! leaving its record out changes no lookup: each address's newest mapping at its
//! time is kept, and nothing newer than it there is ever laid (a later load covering
//! the address before the sample's time would be the newest instead). So the records
//! kept are exactly those loads, and every sample names the code it names with all
//! of them, whichever of several loads at one time perf takes first (both are kept).
//!
//! The addresses are those perf and the engine look up: the sample's IP, its
//! callchain entries (and each one less, for lookups of return addresses) and its
//! branch stack's from and to. Where something else looks code up, every load is
//! kept: DWARF stacks (the unwinder finds frames from the loads' tables), data
//! addresses (`perf mem` names them), AUX traces (decoders walk the code), deferred
//! user callchains (perf joins them to samples later), a child forked from the JIT's
//! process after its first load (its samples see the parent's loads), samples
//! without a pid or time, or more addresses than [`MAX_POINTS`]. User registers are
//! looked up too (perf on arm64 names the leaf's caller from the link register).
//!
//! Each address is answered as the pass over the recording meets it, from the
//! dump's records indexed by address in clusters of records that overlap one
//! another ([`Index`]); no address is kept but those of a cluster too large, which
//! the general sweep ([`general`]) answers at the end. A dump of more than [`RUN`]
//! records keeps its addresses instead, and its records are sorted in runs on disk
//! ([`sweep_runs`]), so that memory does not follow the dump's size.

use super::runs::Merge;
use super::{Dump, Layout, Records, sample_attr};
use crate::format::attr::st;
use crate::format::record::{CONTEXT_USER_DEFERRED, RecordHeader, rt};
use crate::format::sample::{SampleLayout, u64s};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Sample addresses kept for the sweep at most (16 bytes each: 64 MB); past them
/// every load is kept, so memory stays within the limits policy's 256 MB.
const MAX_POINTS: usize = 4 << 20;

/// Loads overlapping one another that a cluster answers from one by one at most.
const MAX_CLUSTER: usize = 64;

/// Records of one dump the choice sorts in memory (32 bytes each: 32 MB); a larger
/// dump is sorted in runs of this many on disk ([`sweep_runs`]).
const RUN: usize = 1 << 20;

/// Which of each dump's list records to write (`None`: all), and for each dump
/// that keeps every load, why.
pub(super) struct Choice {
    pub kept: Vec<Option<Vec<bool>>>,
    pub notes: Vec<String>,
}

/// A dump, as the collection of its process's sample addresses needs it.
struct Dumped {
    /// Its number among the dumps.
    i: usize,
    /// The lowest address and the end of the highest its records cover.
    lo: u64,
    hi: u64,
    /// The time of its first record.
    first: u64,
}

/// perf's PERF_RECORD_CALLCHAIN_DEFERRED: a callchain's user part comes later, in a
/// record of its own (PERF_CONTEXT_USER_DEFERRED marks the chains that wait for one;
/// both are defined once, beside the record's typed view in `format::record`).
const RECORD_CALLCHAIN_DEFERRED: u32 = rt::CALLCHAIN_DEFERRED;

/// One record of a dump's list, as the sweep needs it.
#[derive(Clone, Copy)]
struct Span {
    time: u64,
    start: u64,
    end: u64,
    /// Its number in the list.
    idx: u32,
    /// An anonymous cover of a dump cut short: always written.
    cover: bool,
}

/// Chooses the records of `dumps` that samples of the recording at `src` touch.
pub(super) fn choose(
    src: &Path,
    l: &Layout,
    dumps: &[Dump],
    splits: &[u64],
    pool: &rayon::ThreadPool,
) -> Result<Choice> {
    let all = |why: &str| Choice {
        kept: dumps.iter().map(|_| None).collect(),
        notes: vec![format!(
            "--jit: every code load gets a mapping record: {why}"
        )],
    };
    let types = l.attrs.iter().fold(0, |acc, a| acc | a.sample_type);
    if types & st::STACK_USER != 0 {
        return Ok(all(
            "the recording has DWARF stacks, whose unwinding finds frames in any load",
        ));
    }
    if types & st::ADDR != 0 {
        return Ok(all(
            "the recording samples data addresses, which perf names by the mappings too",
        ));
    }
    if l.attrs
        .iter()
        .any(|a| a.sample_type & (st::TID | st::TIME) != st::TID | st::TIME)
    {
        return Ok(all("an event's samples carry no pid or time"));
    }
    // The span of addresses each dump's records cover (the records themselves are
    // read one dump at a time: memory follows the largest dump, not the sum).
    let mut by_pid: HashMap<u32, Dumped> = HashMap::new();
    for (i, d) in dumps.iter().enumerate() {
        if !d.singles.is_empty() {
            return Ok(all("a process has images of one load each"));
        }
        if d.count > u64::from(u32::MAX) {
            return Ok(all("a dump has more records than the choice numbers"));
        }
        let x = d.extent;
        let dumped = Dumped {
            i,
            lo: x.lo,
            hi: x.hi,
            first: x.first,
        };
        if by_pid.insert(d.marker.pid, dumped).is_some() {
            return Ok(all("a process has two dumps"));
        }
    }
    // A dump of up to RUN records (and RUN in all) is indexed before the pass and
    // answers each address as the pass meets it; a larger one keeps its points for
    // the runs on disk.
    let mut indexed = 0u64;
    let mut answers = Vec::with_capacity(dumps.len());
    for d in dumps {
        if d.count <= RUN as u64 && indexed + d.count <= RUN as u64 {
            indexed += d.count;
            let mut spans = Vec::with_capacity(d.count as usize);
            read_spans(d, |s| {
                spans.push(s);
                Ok(())
            })?;
            answers.push(Answers::Index(Index::new(spans, d.count as usize)));
        } else {
            answers.push(Answers::Points);
        }
    }
    // The pass runs over parts of the recording at once, one a core (a sample's
    // answer does not depend on any other's), each with marks of its own.
    let parts = parts(l, splits, pool.current_num_threads());
    let limit = MAX_POINTS / parts.len().max(1);
    let got: Vec<_> = pool.install(|| {
        use rayon::prelude::*;
        parts
            .par_iter()
            .map(|&(from, to)| collect(src, l, &by_pid, &answers, (from, to), limit))
            .collect()
    });
    let mut locals: Vec<Vec<Local>> = Vec::with_capacity(got.len());
    for g in got {
        match g? {
            Ok(v) => locals.push(v),
            Err(why) => return Ok(all(why)),
        }
    }
    let mut kept = Vec::with_capacity(dumps.len());
    let mut notes = Vec::new();
    for (i, (a, d)) in answers.iter().zip(dumps).enumerate() {
        let mine = locals
            .iter_mut()
            .filter_map(|v| v.get_mut(i))
            .map(std::mem::take);
        let k = match a {
            Answers::Index(x) => x.finish(mine.filter_map(Local::marks)),
            Answers::Points => {
                let mut p: Vec<(u64, u64)> = mine.flat_map(Local::points).collect();
                sweep_runs(d, &mut p)?
            }
        };
        let n = k.iter().filter(|&&k| k).count();
        notes.push(format!(
            "--jit: {}: {n} of its {} MMAP2 records written, for the code loads samples touch (the others name no sample; --jit-maps all writes every one)",
            d.marker_path().display(),
            k.len()
        ));
        kept.push(Some(k));
    }
    Ok(Choice { kept, notes })
}

/// The parts of the recording's data the pass reads at once: `threads` of about
/// one size, cut at the records the scan noted (one part for a small recording:
/// a thread costs more than it saves there).
fn parts(l: &Layout, splits: &[u64], threads: usize) -> Vec<(u64, u64)> {
    let (from, to) = l.data;
    let n = (threads as u64).clamp(1, super::SPLITS);
    if to.saturating_sub(from) < PART_MIN || n == 1 {
        return vec![(from, to)];
    }
    let mut cuts = vec![from];
    for k in 1..n {
        // splits[j] is the first record at or past (j + 1) / SPLITS of the data.
        let j = (k * super::SPLITS / n) as usize;
        if let Some(&c) = j.checked_sub(1).and_then(|j| splits.get(j))
            && c > *cuts.last().unwrap_or(&from)
            && c < to
        {
            cuts.push(c);
        }
    }
    cuts.push(to);
    cuts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Data smaller than this is read by one thread.
const PART_MIN: u64 = 256 << 10;

/// How a dump answers the addresses its process's samples look up.
enum Answers {
    /// At once, from its records indexed by address.
    Index(Index),
    /// At the end, from the points kept (a dump too large to index).
    Points,
}

/// What one part of the pass found for a dump.
#[derive(Default)]
enum Local {
    #[default]
    None,
    Marks(Marks),
    Points(Vec<(u64, u64)>),
}

impl Local {
    fn marks(self) -> Option<Marks> {
        match self {
            Local::Marks(m) => Some(m),
            _ => None,
        }
    }

    fn points(self) -> Vec<(u64, u64)> {
        match self {
            Local::Points(p) => p,
            _ => Vec::new(),
        }
    }
}

/// A dump's records sorted by address, in clusters of records that overlap one
/// another (most loads are a cluster of their own: JITs seldom reuse an address): an
/// address looked up at a time is answered from its cluster alone, as the pass
/// meets it, by the newest record there covering it before that time (list order
/// breaks ties of time, as the merge writes them) and every one covering it at that
/// time. The points of a cluster larger than [`MAX_CLUSTER`] are held for the
/// general sweep over that cluster at the end. Each part of the pass marks its
/// answers in [`Marks`] of its own; the index is shared.
struct Index {
    /// The records with a length, sorted by start.
    spans: Vec<Span>,
    /// Each cluster's `[lo, hi)` and its records `spans[from..to]`, by address.
    clusters: Vec<(u64, u64, u32, u32)>,
    /// The number of records, and the covers among them (always kept).
    n: usize,
    covers: Vec<u32>,
}

/// One part's answers for an [`Index`].
struct Marks {
    kept: Vec<bool>,
    /// Points held for clusters too large, with their cluster's number.
    held: Vec<(u32, u64, u64)>,
    /// The cluster of the last address found (a callchain's entry and the byte
    /// before it come one after the other).
    last: usize,
    /// Addresses met and their clusters (`c + 1`; 0: none; `u32::MAX`: an empty
    /// slot), by a hash of the address: samples look the same return addresses and
    /// hot code up again and again, and a search of the clusters costs a cache miss
    /// a step.
    memo: Vec<(u64, u32)>,
}

/// Slots of [`Marks::memo`] at most, as a power of two (64 KB; a dump of few
/// records gets fewer: many small JIT processes must not cost 64 KB each).
const MEMO_BITS: u32 = 12;

/// The memo's size for a dump of `n` records: four slots a record, 16 to 4,096.
fn memo_bits(n: usize) -> u32 {
    (usize::BITS - n.leading_zeros() + 2).clamp(4, MEMO_BITS)
}

impl Index {
    /// The index of a dump's `n` records `spans`.
    fn new(mut spans: Vec<Span>, n: usize) -> Index {
        let covers = spans.iter().filter(|s| s.cover).map(|s| s.idx).collect();
        spans.retain(|s| s.end > s.start);
        spans.sort_unstable_by_key(|s| (s.start, s.idx));
        let mut clusters: Vec<(u64, u64, u32, u32)> = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            match clusters.last_mut() {
                Some((_, hi, _, to)) if s.start < *hi => {
                    *hi = (*hi).max(s.end);
                    *to = i as u32 + 1;
                }
                _ => clusters.push((s.start, s.end, i as u32, i as u32 + 1)),
            }
        }
        Index {
            spans,
            clusters,
            n,
            covers,
        }
    }

    /// Fresh marks for one part of the pass.
    fn marks(&self) -> Marks {
        Marks {
            kept: vec![false; self.n],
            held: Vec::new(),
            last: 0,
            memo: vec![(0, u32::MAX); 1 << memo_bits(self.n)],
        }
    }

    /// The cluster whose `[lo, hi)` holds `a`.
    fn find(&self, m: &mut Marks, a: u64) -> Option<usize> {
        let bits = m.memo.len().trailing_zeros();
        let h = (a.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize;
        if let Some(&(at, c)) = m.memo.get(h)
            && at == a
            && c != u32::MAX
        {
            return (c as usize).checked_sub(1);
        }
        let within = |c: usize| {
            self.clusters
                .get(c)
                .is_some_and(|&(lo, hi, ..)| lo <= a && a < hi)
        };
        let found = if within(m.last) {
            Some(m.last)
        } else {
            self.clusters
                .partition_point(|&(lo, ..)| lo <= a)
                .checked_sub(1)
                .filter(|&c| within(c))
        };
        if let Some(slot) = m.memo.get_mut(h) {
            *slot = (a, found.map_or(0, |c| c as u32 + 1));
        }
        found
    }

    /// Looks `a` up at time `t` into `m`; true when the point is held (it takes
    /// memory).
    fn point(&self, m: &mut Marks, t: u64, a: u64) -> bool {
        let Some(c) = self.find(m, a) else {
            return false;
        };
        let Some(&(_, _, from, to)) = self.clusters.get(c) else {
            return false;
        };
        m.last = c;
        if (to - from) as usize > MAX_CLUSTER {
            m.held.push((c as u32, t, a));
            return true;
        }
        answer(&self.spans[from as usize..to as usize], t, a, &mut m.kept);
        false
    }

    /// Which records to keep, by list number, from every part's marks.
    fn finish(&self, marks: impl Iterator<Item = Marks>) -> Vec<bool> {
        let mut kept = vec![false; self.n];
        let mut held = Vec::new();
        for m in marks {
            for (k, x) in kept.iter_mut().zip(&m.kept) {
                *k |= *x;
            }
            held.extend(m.held);
        }
        for &c in &self.covers {
            if let Some(k) = kept.get_mut(c as usize) {
                *k = true;
            }
        }
        held.sort_unstable_by_key(|&(c, ..)| c);
        for group in held.chunk_by(|x, y| x.0 == y.0) {
            let (_, _, from, to) = self.clusters[group[0].0 as usize];
            let mut spans = self.spans[from as usize..to as usize].to_vec();
            let mut points: Vec<(u64, u64)> = group.iter().map(|&(_, t, a)| (t, a)).collect();
            general(&mut spans, &mut points, &mut kept);
        }
        kept
    }
}

/// A dump's list records, in list order, to `each`.
fn read_spans(d: &Dump, mut each: impl FnMut(Span) -> Result<()>) -> Result<()> {
    let io = |e| Error::io(&d.image, e);
    super::read_list(&d.list, d.count, io, |k, r| {
        each(Span {
            time: r.time,
            start: r.start,
            end: r.start.saturating_add(r.len),
            idx: k as u32,
            cover: r.pgoff == u64::MAX,
        })
    })
}

/// The `(time, address)` each dump's process's samples look up inside the dump's
/// span, by dump; `Err`: why every load is kept.
#[allow(clippy::type_complexity)]
fn collect(
    src: &Path,
    l: &Layout,
    by_pid: &HashMap<u32, Dumped>,
    answers: &[Answers],
    (from, to): (u64, u64),
    limit: usize,
) -> Result<std::result::Result<Vec<Local>, &'static str>> {
    let mut recs = Records::open_range(src, l, from, to)?;
    let mut locals: Vec<Local> = answers
        .iter()
        .map(|a| match a {
            Answers::Index(x) => Local::Marks(x.marks()),
            Answers::Points => Local::Points(Vec::new()),
        })
        .collect();
    let e = l.endian;
    let ids = l.ids();
    let trailer = l.trailer();
    let layouts: Vec<SampleLayout> = l.attrs.iter().map(SampleLayout::new).collect();
    let mut total = 0usize;
    while let Some((_, extra)) = recs.next(src)? {
        if extra > 0 {
            std::io::copy(&mut (&mut recs.r).take(extra), &mut std::io::sink())
                .map_err(|e| Error::io(src, e))?;
        }
        let rec = &recs.buf;
        let Some(h) = RecordHeader::parse(rec, e) else {
            continue;
        };
        match h.kind {
            rt::AUX | rt::AUXTRACE | rt::AUXTRACE_INFO => {
                return Ok(Err(
                    "the recording has AUX trace data, whose decoding walks the code",
                ));
            }
            rt::FORK => {
                // pid, ppid: a process forked from a JIT's after its first load sees
                // its loads as of the fork (before it, none).
                if let (Some(pid), Some(ppid)) = (e.u32(rec, 8), e.u32(rec, 12))
                    && pid != ppid
                    && let Some(d) = by_pid.get(&ppid)
                    && trailer.read(rec, e).time.is_none_or(|t| t >= d.first)
                {
                    return Ok(Err(
                        "a process forked from a JIT's process after its first code load sees its code",
                    ));
                }
                continue;
            }
            RECORD_CALLCHAIN_DEFERRED => {
                return Ok(Err(
                    "the recording has deferred user callchains, which perf joins to samples later",
                ));
            }
            rt::SAMPLE => {}
            _ => continue,
        }
        let Some(i) = sample_attr(rec, l, &ids) else {
            continue;
        };
        let Ok(s) = layouts[i].decode(rec, e) else {
            continue;
        };
        let (Some(pid), Some(time)) = (s.pid, s.time) else {
            continue;
        };
        let Some(&Dumped { i: d, lo, hi, .. }) = by_pid.get(&pid) else {
            continue;
        };
        let (Some(x), Some(local)) = (answers.get(d), locals.get_mut(d)) else {
            continue;
        };
        let mut add = |a: u64| {
            if a >= lo && a < hi {
                match (x, &mut *local) {
                    (Answers::Index(x), Local::Marks(m)) => {
                        total += usize::from(x.point(m, time, a));
                    }
                    (_, Local::Points(p)) => {
                        p.push((time, a));
                        total += 1;
                    }
                    _ => {}
                }
            }
        };
        if let Some(ip) = s.ip {
            add(ip);
        }
        for a in u64s(s.callchain, e) {
            if a == CONTEXT_USER_DEFERRED {
                return Ok(Err(
                    "the recording has deferred user callchains, which perf joins to samples later",
                ));
            }
            add(a);
            add(a.wrapping_sub(1));
        }
        // User registers: perf on arm64 names the leaf's caller from the link
        // register, which the callchain lacks (any register is a harmless extra).
        for a in u64s(s.regs_user, e) {
            add(a);
        }
        for (j, a) in u64s(s.branches, e).enumerate() {
            // {from, to, flags}
            if j % 3 != 2 {
                add(a);
            }
        }
        if total > limit {
            return Ok(Err(
                "the samples look up more addresses in JIT code than are kept for the choice",
            ));
        }
    }
    Ok(Ok(locals))
}

/// The general sweep: marks in `kept` (by list number) each record of `spans` that
/// some point lies in while it is the newest record there. The records are laid in
/// time order, list order breaking ties (the merge writes them so), over the points
/// in time order; a record at a point's own time is kept too (perf may take it first
/// or not). Both are sorted here.
fn general(spans: &mut [Span], points: &mut [(u64, u64)], kept: &mut [bool]) {
    spans.sort_by_key(|s| (s.time, s.idx));
    points.sort_unstable();
    // start -> (end, record): the newest record covering each address so far.
    let mut live: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
    let mut inside = Vec::new();
    let mut next = 0usize;
    for &(t, a) in points.iter() {
        while let Some(s) = spans.get(next) {
            if s.time >= t {
                break;
            }
            lay(&mut live, s.start, s.end, s.idx, &mut inside);
            next += 1;
        }
        if let Some((_, &(end, i))) = live.range(..=a).next_back()
            && end > a
        {
            kept[i as usize] = true;
        }
        // Records at the sample's own time: perf may take them first or not.
        for s in spans[next..].iter().take_while(|s| s.time == t) {
            if s.start <= a && a < s.end {
                kept[s.idx as usize] = true;
            }
        }
    }
}

/// The clusters of `spans` (sorted by start) answer `points` (sorted by address),
/// as [`Index`] answers them, except that a cluster larger than [`MAX_CLUSTER`]
/// keeps every record of it (never wrong: a record kept changes no lookup that finds
/// the newest record, and the newest is among them). Streams the records: memory is
/// one cluster.
fn by_clusters(spans: impl Iterator<Item = Span>, points: &[(u64, u64)], kept: &mut [bool]) {
    let mut cluster: Vec<Span> = Vec::new();
    // The open cluster's [lo, hi), and whether it outgrew MAX_CLUSTER.
    let mut open: Option<(u64, u64, bool)> = None;
    let mut p = 0usize;
    let close = |cluster: &mut Vec<Span>,
                 (lo, hi, grown): (u64, u64, bool),
                 p: &mut usize,
                 kept: &mut [bool]| {
        while points.get(*p).is_some_and(|&(_, a)| a < lo) {
            *p += 1;
        }
        while let Some(&(t, a)) = points.get(*p).filter(|&&(_, a)| a < hi) {
            *p += 1;
            if !grown {
                answer(cluster, t, a, kept);
            }
        }
        cluster.clear();
    };
    for s in spans.filter(|s| s.end > s.start) {
        match &mut open {
            Some((_, hi, _)) if s.start < *hi => *hi = (*hi).max(s.end),
            _ => {
                if let Some(c) = open.take() {
                    close(&mut cluster, c, &mut p, kept);
                }
                open = Some((s.start, s.end, false));
            }
        }
        let Some((_, _, grown)) = &mut open else {
            continue;
        };
        if *grown {
            kept[s.idx as usize] = true;
            continue;
        }
        cluster.push(s);
        if cluster.len() > MAX_CLUSTER {
            *grown = true;
            for c in cluster.drain(..) {
                kept[c.idx as usize] = true;
            }
        }
    }
    if let Some(c) = open.take() {
        close(&mut cluster, c, &mut p, kept);
    }
}

/// Marks the records of `cluster` that the lookup of `a` at time `t` may find.
fn answer(cluster: &[Span], t: u64, a: u64, kept: &mut [bool]) {
    let mut newest: Option<(u64, u32)> = None;
    for s in cluster {
        if s.start <= a && a < s.end {
            if s.time < t {
                newest = newest.max(Some((s.time, s.idx)));
            } else if s.time == t {
                kept[s.idx as usize] = true;
            }
        }
    }
    if let Some((_, i)) = newest {
        kept[i as usize] = true;
    }
}

/// The choice for a dump of more than [`RUN`] records: they are sorted by start in
/// runs of [`RUN`] written to a scratch file beside the image, and the runs merged
/// into [`by_clusters`] (a cluster too large keeps all its records), so memory is a
/// run and the points, whatever the dump's size.
fn sweep_runs(d: &Dump, points: &mut [(u64, u64)]) -> Result<Vec<bool>> {
    // At most u32::MAX records (`choose`).
    let n = d.count as usize;
    let scratch = super::scratch_beside(&d.image).map_err(|e| Error::io(&d.image, e))?;
    in_runs(
        |each| read_spans(d, each),
        n,
        (&scratch, &d.image),
        RUN,
        points,
    )
}

/// [`sweep_runs`] of the `n` records `fill` gives, in runs of `run` on `scratch`
/// (a file and the name its errors go by: it is unlinked beside that file).
fn in_runs(
    fill: impl FnOnce(&mut dyn FnMut(Span) -> Result<()>) -> Result<()>,
    n: usize,
    (scratch, name): (&std::fs::File, &Path),
    run: usize,
    points: &mut [(u64, u64)],
) -> Result<Vec<bool>> {
    let io = |e: std::io::Error| Error::io(name, e);
    let mut kept = vec![false; n];
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut buf: Vec<Span> = Vec::with_capacity(run.min(n));
    let mut written = 0u64;
    let mut flush = |buf: &mut Vec<Span>, runs: &mut Vec<(u64, u64)>| -> Result<()> {
        buf.sort_unstable_by_key(|s| (s.start, s.idx));
        let mut b = Vec::with_capacity(buf.len() * SPAN_SIZE);
        for s in buf.iter() {
            b.extend_from_slice(&s.encode());
        }
        scratch.write_all_at(&b, written).map_err(io)?;
        runs.push((written, buf.len() as u64));
        written += b.len() as u64;
        buf.clear();
        Ok(())
    };
    fill(&mut |s: Span| {
        if let Some(k) = kept.get_mut(s.idx as usize) {
            *k |= s.cover;
        }
        buf.push(s);
        if buf.len() >= run {
            flush(&mut buf, &mut runs)?;
        }
        Ok(())
    })?;
    if !buf.is_empty() {
        flush(&mut buf, &mut runs)?;
    }
    drop(buf);
    points.sort_unstable_by_key(|&(t, a)| (a, t));
    let mut merged = Merge::new(scratch, &runs, |b: &[u8; SPAN_SIZE]| {
        let s = Span::decode(b);
        (s.start, s.idx)
    })
    .map_err(io)?;
    let mut failed = None;
    let spans = std::iter::from_fn(|| match merged.next() {
        Ok(s) => s.map(|b| Span::decode(&b)),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    // Records numbered past `n` (none: the list gives n) are not looked at.
    let spans = spans.filter(|s| (s.idx as usize) < n);
    by_clusters(spans, points, &mut kept);
    if let Some(e) = failed {
        return Err(io(e));
    }
    Ok(kept)
}

/// Bytes of a [`Span`] in a scratch run.
const SPAN_SIZE: usize = 32;

impl Span {
    fn encode(&self) -> [u8; SPAN_SIZE] {
        let mut b = [0u8; SPAN_SIZE];
        b[0..8].copy_from_slice(&self.time.to_le_bytes());
        b[8..16].copy_from_slice(&self.start.to_le_bytes());
        b[16..24].copy_from_slice(&self.end.to_le_bytes());
        b[24..28].copy_from_slice(&self.idx.to_le_bytes());
        b[28] = u8::from(self.cover);
        b
    }

    fn decode(b: &[u8; SPAN_SIZE]) -> Span {
        let (w, _) = b.as_chunks::<8>();
        Span {
            time: u64::from_le_bytes(w[0]),
            start: u64::from_le_bytes(w[1]),
            end: u64::from_le_bytes(w[2]),
            idx: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
            cover: b[28] != 0,
        }
    }
}

/// Lays `[start, end)` of record `id` over `live`, cutting what it covers.
fn lay(live: &mut BTreeMap<u64, (u64, u32)>, start: u64, end: u64, id: u32, inside: &mut Vec<u64>) {
    if end <= start {
        return;
    }
    if let Some((&s, &(e, i))) = live.range(..start).next_back()
        && e > start
    {
        live.insert(s, (start, i));
        if e > end {
            live.insert(end, (e, i));
        }
    }
    inside.clear();
    inside.extend(live.range(start..end).map(|(&s, _)| s));
    for s in inside.drain(..) {
        if let Some((e, i)) = live.remove(&s)
            && e > end
        {
            live.insert(end, (e, i));
        }
    }
    live.insert(start, (end, id));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random numbers below their argument, from `seed` (the same every run).
    fn numbers(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut x = seed;
        move |m| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        }
    }

    /// A dump's list of `(time, start, end)` records.
    fn list(recs: &[(u64, u64, u64)]) -> Vec<Span> {
        recs.iter()
            .enumerate()
            .map(|(i, &(time, start, end))| Span {
                time,
                start,
                end,
                idx: i as u32,
                cover: false,
            })
            .collect()
    }

    /// `spans` answered by their [`Index`], the points met in the given order by
    /// two parts of the pass (the first third, the rest), as two cores meet them;
    /// with how many points were held for clusters too large.
    fn by_index(spans: Vec<Span>, pts: &[(u64, u64)]) -> (Vec<bool>, usize) {
        let n = spans.len();
        let x = Index::new(spans, n);
        let (mut a, mut b) = (x.marks(), x.marks());
        let cut = pts.len() / 3;
        let held = pts[..cut]
            .iter()
            .filter(|&&(t, p)| x.point(&mut a, t, p))
            .count()
            + pts[cut..]
                .iter()
                .filter(|&&(t, p)| x.point(&mut b, t, p))
                .count();
        (x.finish([a, b].into_iter()), held)
    }

    /// The pass's parts cover the data once, in order, cut at noted records only.
    #[test]
    fn parts_cover_the_data_at_records() {
        let l = Layout {
            endian: crate::format::Endian::Little,
            stream: false,
            data: (100, 100 + (8 << 20)),
            attrs: vec![],
            clocks: vec![],
            hostname: None,
        };
        let splits: Vec<u64> = (1..8).map(|k| 100 + k * (1 << 20) + 24).collect();
        for threads in [1, 2, 3, 4, 8, 64] {
            let p = parts(&l, &splits, threads);
            assert_eq!(p.first().map(|x| x.0), Some(l.data.0), "{threads}");
            assert_eq!(p.last().map(|x| x.1), Some(l.data.1), "{threads}");
            assert!(p.windows(2).all(|w| w[0].1 == w[1].0), "{threads}: {p:?}");
            assert!(
                p.iter()
                    .all(|&(a, b)| a < b && (a == l.data.0 || splits.contains(&a)))
            );
            assert_eq!(p.len(), threads.min(8), "{threads}: {p:?}");
        }
        assert_eq!(
            parts(&l, &splits[..2], 4).len(),
            2,
            "cuts the scan did not note"
        );
        // A small recording, or cuts at the data's start (records larger than a part).
        let small = Layout {
            data: (100, 200_000),
            ..l
        };
        assert_eq!(parts(&small, &[150_000], 2), vec![(100, 200_000)]);
        let big = Layout {
            data: (100, 100 + (8 << 20)),
            ..small
        };
        assert_eq!(parts(&big, &[100; 7], 2), vec![big.data]);
    }

    fn chosen(recs: &[(u64, u64, u64)], pts: &[(u64, u64)]) -> Vec<bool> {
        by_index(list(recs), pts).0
    }

    /// The general sweep alone.
    fn by_sweep(recs: &[(u64, u64, u64)], pts: &[(u64, u64)]) -> Vec<bool> {
        let mut kept = vec![false; recs.len()];
        general(&mut list(recs), &mut pts.to_vec(), &mut kept);
        kept
    }

    #[test]
    fn the_newest_load_at_each_sample_is_kept() {
        // 0: [100,200) at 10; 1: [150,160) at 20 (inside 0); 2: [300,400) at 30,
        // never sampled; 3: [100,120) at 40 over 0's start.
        let recs = [
            (10, 100, 200),
            (20, 150, 160),
            (30, 300, 400),
            (40, 100, 120),
        ];
        for f in [chosen, by_sweep] {
            // At 25: 155 is 1's, 170 is 0's (right of 1). At 50: 110 is 3's.
            let pts = [(25, 155), (25, 170), (50, 110)];
            assert_eq!(f(&recs, &pts), vec![true, true, false, true]);
            // Only 0's right part after 1 was laid: 0 kept, 1 not.
            assert_eq!(f(&recs, &[(25, 165)]), vec![true, false, false, false]);
            // Before any load: nothing.
            assert_eq!(f(&recs, &[(5, 150)]), vec![false; 4]);
        }
    }

    #[test]
    fn a_load_at_the_samples_time_keeps_both_candidates() {
        let recs = [(10, 100, 200), (20, 100, 200)];
        for f in [chosen, by_sweep] {
            assert_eq!(f(&recs, &[(20, 150)]), vec![true, true]);
            assert_eq!(f(&recs, &[(21, 150)]), vec![false, true]);
        }
    }

    #[test]
    fn records_out_of_time_order_are_laid_by_time() {
        // The list has the later load first: by time, 1 is older and 0 covers it.
        let recs = [(20, 100, 200), (10, 100, 200)];
        for f in [chosen, by_sweep] {
            assert_eq!(f(&recs, &[(30, 150)]), vec![true, false]);
        }
    }

    #[test]
    fn covers_are_always_kept() {
        let mut spans = list(&[(10, 100, 200), (20, 100, 200)]);
        spans[1].cover = true;
        assert_eq!(by_index(spans, &[]).0, vec![false, true]);
    }

    #[test]
    fn the_index_chooses_as_the_sweep_chooses() {
        // Loads at shuffled times over a few hundred addresses, so that some are
        // apart and some overlap (reused addresses, ties of time); points before, at
        // and after each load's time, inside and at its edges, met in time order (even
        // rounds) or in list order. Every third round reuses a few addresses so often that clusters
        // outgrow MAX_CLUSTER, whose points the general sweep answers.
        let mut rnd = numbers(12345u64);
        let mut held = 0;
        for round in 0..60 {
            let (n, span) = if round % 3 == 2 { (300, 60) } else { (40, 400) };
            let recs: Vec<(u64, u64, u64)> = (0..n)
                .map(|_| {
                    let start = rnd(span);
                    let len = 1 + rnd(if round % 2 == 0 { 8 } else { 60 });
                    (rnd(30), start, start + len)
                })
                .collect();
            let mut pts: Vec<(u64, u64)> = recs
                .iter()
                .flat_map(|&(t, s, e)| {
                    [
                        (t.saturating_sub(1), s),
                        (t, e - 1),
                        (t + 1, (s + e) / 2),
                        (t + 5, e),
                    ]
                })
                .collect();
            if round % 2 == 0 {
                pts.sort_unstable();
            }
            let (fast, h) = by_index(list(&recs), &pts);
            held += h;
            assert_eq!(fast, by_sweep(&recs, &pts), "round {round}");
        }
        assert!(held > 0, "no cluster outgrew MAX_CLUSTER");
    }

    /// `recs` through [`in_runs`] with runs of `run` records.
    fn by_runs(recs: &[(u64, u64, u64)], pts: &[(u64, u64)], run: usize) -> Vec<bool> {
        let f = tempfile::tempfile().unwrap();
        let spans = list(recs);
        in_runs(
            |each| spans.iter().try_for_each(|&s| each(s)),
            spans.len(),
            (&f, Path::new("scratch")),
            run,
            &mut pts.to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn runs_on_disk_choose_as_the_sweep_chooses() {
        let mut rnd = numbers(777u64);
        for round in 0..20 {
            let recs: Vec<(u64, u64, u64)> = (0..300)
                .map(|_| {
                    let start = rnd(3000);
                    (
                        rnd(100),
                        start,
                        start + 1 + rnd(if round % 2 == 0 { 10 } else { 40 }),
                    )
                })
                .collect();
            let pts: Vec<(u64, u64)> = recs
                .iter()
                .flat_map(|&(t, s, e)| [(t, s), (t + 1, e - 1), (t + 50, (s + e) / 2)])
                .collect();
            let want = by_sweep(&recs, &pts);
            assert_eq!(chosen(&recs, &pts), want);
            for run in [1, 7, 64, 1000] {
                assert_eq!(
                    by_runs(&recs, &pts, run),
                    want,
                    "round {round}, runs of {run}"
                );
            }
        }
    }

    #[test]
    fn runs_keep_every_record_of_a_cluster_too_large() {
        // One address reused more than MAX_CLUSTER times, and a load apart.
        let mut recs: Vec<(u64, u64, u64)> =
            (0..MAX_CLUSTER as u64 + 5).map(|i| (i, 100, 200)).collect();
        recs.push((3, 500, 600));
        let pts = [(1000, 150)];
        let got = by_runs(&recs, &pts, 16);
        let exact = by_sweep(&recs, &pts);
        assert!(
            exact.iter().zip(&got).all(|(e, g)| !e || *g),
            "a record the sweep keeps is kept"
        );
        assert!(
            got[..recs.len() - 1].iter().all(|&k| k),
            "the large cluster is kept whole"
        );
        assert!(
            !got[recs.len() - 1],
            "the load apart no sample touches is not"
        );
    }

    #[test]
    fn a_load_split_in_three_keeps_both_sides() {
        let mut live = BTreeMap::new();
        let mut v = Vec::new();
        lay(&mut live, 0, 100, 0, &mut v);
        lay(&mut live, 40, 60, 1, &mut v);
        lay(&mut live, 50, 200, 2, &mut v);
        let got: Vec<_> = live.iter().map(|(&s, &(e, i))| (s, e, i)).collect();
        assert_eq!(got, vec![(0, 40, 0), (40, 50, 1), (50, 200, 2)]);
    }
}
