//! The process model: an immutable, time-versioned picture of every process's
//! address space, built append-only from MMAP/MMAP2/COMM-exec/FORK in one pass.
//!
//! Each process keeps its events sorted by [`Key`] (time, then file order). A lookup
//! at key `k` answers with the newest mapping covering the address among the events at
//! or before `k`; an exec ends the search (the old image is gone); a fork continues in
//! the parent as of the fork.
//!
//! Lookups do not replay events. When the model is frozen, each process's events are
//! laid over each other once, in order, and every stretch of a mapping that stayed
//! visible (uncut) over a run of versions becomes a [`Piece`] with that run. The
//! pieces go into a segment tree over versions: the pieces of one tree node were all
//! visible at every version of its range, so they never overlap and are sorted by
//! address. A lookup at version `n` binary-searches the nodes on `n`'s path from leaf
//! to root (O(log² n)), whatever the process's shape: a JIT's process with 50,000
//! code loads answers as fast as a shell's with 50 mappings. Each piece sits in at
//! most two nodes per tree level, and an event makes at most three pieces, so memory
//! is O(events × log events) of 4-byte entries.

use crate::format::record::{FileIdent, MAP_HUGETLB, Mmap, PROT_EXEC, misc};
use crate::limits::Exceeded;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Ordering key of records: sample/record time first (0 when the recording has no
/// times), then position in the file. Named fields (not a tuple) so that the two
/// numbers cannot be swapped; the derived order is time, then `seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    /// The record's time (0 when the recording has no times).
    pub time: u64,
    /// The record's number in the file.
    pub seq: u64,
}

impl Key {
    /// The key of a record at `time` numbered `seq`.
    pub(crate) const fn new(time: u64, seq: u64) -> Key {
        Key { time, seq }
    }
}

/// The pid under which kernel-space maps are kept (perf's HOST_KERNEL_ID, -1).
pub(crate) const KERNEL_PID: u32 = u32::MAX;

/// Index of a DSO in [`Model::dsos`].
pub(crate) type DsoId = u32;

/// What kind of object a DSO is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DsoKind {
    /// A user-space file (executable or shared library).
    User,
    /// The kernel image (`[kernel.kallsyms]`).
    Kernel,
    /// A kernel module.
    Module,
    /// The vdso (`[vdso]`, `[vdso32]`, `[vdsox32]`).
    Vdso,
}

impl DsoKind {
    /// Kernel-space DSOs are listed with the KERNEL cpumode in the build-ID table.
    pub(crate) fn is_kernel_space(self) -> bool {
        matches!(self, DsoKind::Kernel | DsoKind::Module)
    }

    /// The cpumode of its build-ID table entry or record.
    pub(crate) fn build_id_cpumode(self) -> u16 {
        if self.is_kernel_space() {
            misc::KERNEL
        } else {
            misc::USER
        }
    }
}

/// One distinct mapped object: a name plus the identity the records gave it.
#[derive(Clone, Debug)]
pub(crate) struct Dso {
    /// Name as perf's build-ID table spells it.
    pub name: String,
    /// Kind.
    pub kind: DsoKind,
    /// Identity from the records (build ID, inode, or nothing).
    pub ident: FileIdent,
    /// Its executable mappings as recorded (a few, for layout checks).
    pub exec_maps: ExecMaps,
}

/// The distinct executable mappings a recording made of one DSO, as `(file offset,
/// length)`: what the proof of a local file compares with the file's loadable
/// segments (a file whose ctime moved is accepted only if they match exactly).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct ExecMaps {
    /// Distinct `(pgoff, len)`, at most [`ExecMaps::KEPT`], in the order first seen.
    pub maps: Vec<(u64, u64)>,
    /// More distinct mappings were recorded than kept: `maps` is not all of them, so
    /// it cannot show that every mapping fits the file.
    pub more: bool,
}

impl ExecMaps {
    /// Distinct mappings kept per DSO (a library is mapped the same way by every
    /// process; more than a few means something remaps its code).
    pub(crate) const KEPT: usize = 8;

    /// Adds one recorded executable mapping.
    pub(crate) fn add(&mut self, pgoff: u64, len: u64) {
        if !self.maps.contains(&(pgoff, len)) {
            if self.maps.len() < Self::KEPT {
                self.maps.push((pgoff, len));
            } else {
                self.more = true;
            }
        }
    }

    /// Adds every mapping of `other` (the DSOs of one path).
    pub(crate) fn merge(&mut self, other: &ExecMaps) {
        for &(pgoff, len) in &other.maps {
            self.add(pgoff, len);
        }
        self.more |= other.more;
    }

    /// Whether the DSO was mapped executable at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.maps.is_empty() && !self.more
    }

    /// The distinct file offsets mapped.
    pub(crate) fn pgoffs(&self) -> impl Iterator<Item = u64> + '_ {
        self.maps.iter().map(|m| m.0)
    }
}

/// One process's address space at one key: its own layer at one version and what
/// that layer lies on (see [`Model::space`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Space<'m> {
    model: &'m Model,
    pid: u32,
    depth: u32,
    proc: &'m Proc,
    /// The version: how many of the process's events are at or before the key (>= 1).
    version: usize,
}

impl Space<'_> {
    /// The mapping covering `addr`: the part of it that is visible at this key (a
    /// newer mapping that overlaps it cuts it, as perf's maps__fixup_overlappings).
    ///
    /// Iterative: a fork continues in the parent as of the fork, one process at a
    /// time, so a chain of forks costs one step per fork (never a recursion per event).
    pub(crate) fn lookup(&self, addr: u64) -> Option<MapEntry> {
        self.lookup_seen(addr).map(|(m, _)| m)
    }

    /// [`Space::lookup`], with the keys over which this process sees the same mapping
    /// at `addr` when the process's own mappings hold it (not a parent's as of a
    /// fork): a caller that meets the address again within them has its answer.
    pub(crate) fn lookup_seen(&self, addr: u64) -> Option<(MapEntry, Option<Seen>)> {
        let mut sp = *self;
        // The visible interval around `addr` left by the mappings of the children
        // already searched (a child's own mappings hide its parent's).
        let (mut lo, mut hi) = (0u64, u64::MAX);
        loop {
            match sp.proc.stab(sp.version, addr) {
                Stab::Found(id) => {
                    let m = sp.proc.pieces[id as usize];
                    let seen = (sp.depth == self.depth).then(|| sp.proc.seen(id));
                    return Some((clamp(m, lo, hi), seen.flatten()));
                }
                Stab::Gap { below, above } => {
                    lo = lo.max(below);
                    hi = hi.min(above);
                }
            }
            let (parent, key) = match sp.proc.base(sp.version) {
                Base::Empty => return None,
                Base::Fork { parent, key } => (parent, key),
            };
            if sp.depth >= MAX_FORK_DEPTH || parent == sp.pid {
                return None;
            }
            sp = sp.model.space_depth(parent, key, sp.depth + 1)?;
        }
    }
}

/// The keys over which a process sees one piece of a mapping unchanged: every key
/// from `from` on and before `until` (none: to the end of the recording).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub from: Key,
    pub until: Option<Key>,
}

impl Seen {
    /// Whether `key` is in the window.
    #[inline]
    pub(crate) fn holds(&self, key: Key) -> bool {
        self.from <= key && self.until.is_none_or(|u| key < u)
    }
}

/// The part of `m` inside `[lo, hi)`, its file offset moved with its start.
fn clamp(m: MapEntry, lo: u64, hi: u64) -> MapEntry {
    let start = m.start.max(lo);
    MapEntry {
        start,
        end: m.end.min(hi),
        pgoff: m.pgoff.wrapping_add(start - m.start),
        ..m
    }
}

/// What a process's own mappings lie on: nothing (a new process, or one that exec'd)
/// or its parent's address space as of the fork. A fork is a reference, never a
/// copy, so a thousand forks of a process with a thousand mappings cost a thousand
/// events, not a million entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    Empty,
    Fork { parent: u32, key: Key },
}

/// A mapping of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapEntry {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The DSO, or `None` for anonymous and special memory (which still hides
    /// whatever was mapped there before).
    pub dso: Option<DsoId>,
    /// Mapped executable (unwind modules are built from these only).
    pub exec: bool,
}

#[derive(Clone, Copy, Debug)]
enum EventKind {
    Map(MapEntry),
    Exec,
    Fork { parent: u32 },
}

#[derive(Clone, Copy, Debug)]
struct Event {
    key: Key,
    kind: EventKind,
}

/// What a search of one process's own layer at one version found: the piece covering
/// the address, or the nearest ends of the pieces around it (`below` is the end of the
/// nearest one below the address, 0 when none; `above` the start of the nearest one
/// above, `u64::MAX` when none).
enum Stab {
    Found(u32),
    Gap { below: u64, above: u64 },
}

/// [`Proc::laid`] of an event that is no mapping.
const NOT_A_MAP: u32 = u32::MAX;

/// One process's events and the index of its own layer over versions (version `v` is
/// the state after its first `v` events).
#[derive(Debug, Default)]
struct Proc {
    /// Each event's key, in order (version `v` is the state after the first `v`).
    keys: Vec<Key>,
    /// The piece each mapping event laid down whole (the mapping as recorded),
    /// [`NOT_A_MAP`] for an exec or a fork: 4 bytes an event, where a copy of the
    /// events was 64 (a JIT's process has one per code load).
    laid: Vec<u32>,
    /// The versions at which an exec or a fork started a new layer, ascending, with
    /// what that layer lies on.
    resets: Vec<(usize, Base)>,
    /// Every piece: a stretch of a mapping visible, uncut, over a run of versions.
    pieces: Vec<MapEntry>,
    /// Each piece's run: the first version it is visible at and the first it is not.
    spans: Vec<(u32, u32)>,
    /// Leaves of the segment tree (a power of two above the last version).
    width: usize,
    /// Node `i`'s pieces are `ids[offsets[i]..offsets[i + 1]]`, sorted by start; node
    /// `1` is the root, node `width + v` the leaf of version `v`. Only pieces that a
    /// later event cuts or hides go into the tree.
    offsets: Vec<u32>,
    ids: Vec<u32>,
    /// The pieces visible from their version to the end, sorted by start (they never
    /// overlap): most of a process's, and nearly all of a JIT's code loads, found by
    /// one search and their first version, with no tree (indexing a JIT's 53,000
    /// code loads into the tree was a fifth of a --jit run).
    lasting: Vec<u32>,
    /// A tree of the lasting pieces' first versions (the least of each node's
    /// leaves; leaf `n + i` is `lasting[i]`'s): the nearest piece visible at a
    /// version on either side of an address, in a logarithmic search.
    lasting_born: Vec<u32>,
}

impl Proc {
    /// Builds the process's index from its events, sorted by key.
    fn new<'e>(events: impl ExactSizeIterator<Item = &'e Event>) -> Proc {
        // Leaves 0..width cover versions 0..=versions. What is still visible after the
        // last event stays so up to the last leaf: no lookup asks past `versions`, and a
        // run that ends at the tree's end is covered by about half as many nodes.
        let width = (events.len() + 1).next_power_of_two();
        let Replay {
            keys,
            laid,
            resets,
            mut pieces,
            runs,
        } = Replay::of(events, width);
        // Every node whose range a run covers gets the run's piece (the canonical cover
        // of [born, died): at most two nodes per level). A counting sort by node over
        // the runs taken in order of their pieces' starts leaves each node's pieces
        // sorted by start with no comparison sort of the (many) node entries: sorting
        // them was most of indexing a JIT's process of 50,000 code loads.
        let mut spans = vec![(0u32, 0u32); pieces.len()];
        for &(id, born, died) in &runs {
            spans[id as usize] = (born, died);
        }
        // Sorted with the start beside each run, not looked up in `pieces` per compare.
        let mut runs: Vec<(u64, u32, u32, u32)> = runs
            .into_iter()
            .map(|(id, born, died)| (pieces[id as usize].start, id, born, died))
            .collect();
        runs.sort_unstable_by_key(|r| r.0);
        let lasting: Vec<u32> = runs
            .iter()
            .filter(|r| r.3 as usize == width)
            .map(|r| r.1)
            .collect();
        runs.retain(|r| (r.3 as usize) < width);
        let lasting_born = born_tree(&lasting, &spans);
        let (offsets, ids) = node_pieces(&runs, width);
        // A JIT's process grows these by tens of thousands: no doubling slack kept.
        pieces.shrink_to_fit();
        Proc {
            keys,
            laid,
            resets,
            pieces,
            spans,
            width,
            offsets,
            ids,
            lasting,
            lasting_born,
        }
    }

    /// The index in `lasting` of the nearest piece before index `k` (`back`) or from
    /// `k` on visible at `version`.
    fn nearest_lasting(&self, k: usize, version: usize, back: bool) -> Option<usize> {
        let n = self.lasting_born.len() / 2;
        let t = &self.lasting_born;
        let ok = |i: usize| t[i] as usize <= version;
        // Walk up from the leaf next to the boundary to the first node on the wanted
        // side with a visible leaf, then down to its nearest one.
        let mut i = if back {
            (k > 0).then(|| n + k - 1)?
        } else {
            (k < self.lasting.len()).then_some(n + k)?
        };
        loop {
            if ok(i) {
                break;
            }
            // Move to the neighbouring subtree on the wanted side.
            loop {
                let at_edge = if back { i & 1 == 0 } else { i & 1 == 1 };
                if i <= 1 {
                    return None;
                }
                if !at_edge {
                    i = if back { i - 1 } else { i + 1 };
                    break;
                }
                i /= 2;
            }
        }
        while i < n {
            i = if back {
                if ok(2 * i + 1) { 2 * i + 1 } else { 2 * i }
            } else if ok(2 * i) {
                2 * i
            } else {
                2 * i + 1
            };
        }
        Some(i - n)
    }

    /// The pieces of tree node `node`, sorted by start.
    fn node(&self, node: usize) -> &[u32] {
        let (Some(&a), Some(&b)) = (self.offsets.get(node), self.offsets.get(node + 1)) else {
            return &[];
        };
        self.ids.get(a as usize..b as usize).unwrap_or(&[])
    }

    /// The nodes whose pieces are visible at `version`: its leaf and every ancestor.
    fn path(&self, version: usize) -> impl Iterator<Item = &[u32]> + '_ {
        std::iter::successors(Some(self.width + version), |&i| (i > 1).then_some(i / 2))
            .map(|i| self.node(i))
    }

    /// Searches the process's own layer at `version` for `addr`.
    fn stab(&self, version: usize, addr: u64) -> Stab {
        let (mut below, mut above) = (0u64, u64::MAX);
        // The lasting pieces first: the one holding the address, if visible at
        // `version`; else the nearest visible ones on either side bound the gap.
        let k = self
            .lasting
            .partition_point(|&id| self.pieces[id as usize].start <= addr);
        if let Some(&id) = k.checked_sub(1).and_then(|j| self.lasting.get(j)) {
            let p = self.pieces[id as usize];
            if addr < p.end && self.spans[id as usize].0 as usize <= version {
                return Stab::Found(id);
            }
        }
        if let Some(j) = self.nearest_lasting(k, version, true) {
            below = self.pieces[self.lasting[j] as usize].end;
        }
        if let Some(j) = self.nearest_lasting(k, version, false) {
            above = self.pieces[self.lasting[j] as usize].start;
        }
        for ids in self.path(version) {
            let k = ids.partition_point(|&id| self.pieces[id as usize].start <= addr);
            if let Some((id, p)) = k
                .checked_sub(1)
                .map(|j| (ids[j], self.pieces[ids[j] as usize]))
            {
                if addr < p.end {
                    return Stab::Found(id);
                }
                below = below.max(p.end);
            }
            if let Some(&id) = ids.get(k) {
                above = above.min(self.pieces[id as usize].start);
            }
        }
        Stab::Gap { below, above }
    }

    /// The keys of piece `id`'s run of versions: version `v` is the state after the
    /// first `v` events, so the piece is seen from the key of event `born - 1` on
    /// and up to (not at) the key of event `died - 1`.
    fn seen(&self, id: u32) -> Option<Seen> {
        let &(born, died) = self.spans.get(id as usize)?;
        let from = *self.keys.get((born as usize).checked_sub(1)?)?;
        let until = match (died as usize).checked_sub(1) {
            Some(i) if i < self.keys.len() => Some(self.keys[i]),
            _ => None,
        };
        Some(Seen { from, until })
    }

    /// What the layer at `version` lies on: set by the newest exec or fork at or
    /// before it.
    fn base(&self, version: usize) -> Base {
        let k = self.resets.partition_point(|&(v, _)| v <= version);
        k.checked_sub(1).map_or(Base::Empty, |j| self.resets[j].1)
    }

    /// The process's own mappings at `version`, sorted, non-overlapping.
    fn layer(&self, version: usize) -> Vec<MapEntry> {
        let born = |id: &&u32| self.spans[**id as usize].0 as usize <= version;
        let mut maps: Vec<MapEntry> = self
            .path(version)
            .flatten()
            .chain(self.lasting.iter().filter(born))
            .map(|&id| self.pieces[id as usize])
            .collect();
        maps.sort_unstable_by_key(|m| m.start);
        maps
    }
}

/// What replaying a process's events in order leaves: [`Proc`]'s per-version columns
/// and every piece with its run.
struct Replay {
    keys: Vec<Key>,
    laid: Vec<u32>,
    resets: Vec<(usize, Base)>,
    pieces: Vec<MapEntry>,
    /// (piece, first version it is visible at, first version it is not)
    runs: Vec<(u32, u32, u32)>,
}

impl Replay {
    /// Replays `events`; what is visible after the last one is closed at `width`.
    fn of<'e>(events: impl ExactSizeIterator<Item = &'e Event>, width: usize) -> Replay {
        let versions = events.len();
        let mut r = Replay {
            keys: Vec::with_capacity(versions),
            laid: Vec::with_capacity(versions),
            resets: Vec::new(),
            pieces: Vec::new(),
            runs: Vec::new(),
        };
        // The layer being built: start -> (the piece there, the version it appeared).
        let mut state: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        // Versions and piece ids fit 32 bits: the model's limits stop a recording
        // long before 4 billion events.
        for (i, ev) in events.enumerate() {
            let v = (i + 1) as u32;
            r.keys.push(ev.key);
            // `m` itself is the last piece the overlay adds.
            r.laid.push(match ev.kind {
                EventKind::Map(m) => {
                    overlay_pieces(&mut state, &mut r.pieces, &mut r.runs, m, v);
                    (r.pieces.len() - 1) as u32
                }
                EventKind::Exec | EventKind::Fork { .. } => NOT_A_MAP,
            });
            let base = match ev.kind {
                EventKind::Map(_) => continue,
                EventKind::Exec => Base::Empty,
                EventKind::Fork { parent } => Base::Fork {
                    parent,
                    key: ev.key,
                },
            };
            r.close_all(&mut state, v);
            r.resets.push((v as usize, base));
        }
        r.close_all(&mut state, width as u32);
        r
    }

    /// Ends, at version `v`, the run of every piece of the layer `state`.
    fn close_all(&mut self, state: &mut BTreeMap<u64, (u32, u32)>, v: u32) {
        self.runs.extend(
            std::mem::take(state)
                .into_values()
                .map(|(id, born)| (id, born, v)),
        );
    }
}

/// [`Proc::lasting_born`] of `lasting`. A perfect tree (its leaves padded with pieces
/// never visible): a node's neighbour on its level is then the next range of leaves.
fn born_tree(lasting: &[u32], spans: &[(u32, u32)]) -> Vec<u32> {
    let n = lasting.len().next_power_of_two();
    let mut lasting_born = vec![u32::MAX; 2 * n];
    for (i, &id) in lasting.iter().enumerate() {
        lasting_born[n + i] = spans[id as usize].0;
    }
    for i in (1..n).rev() {
        lasting_born[i] = lasting_born[2 * i].min(lasting_born[2 * i + 1]);
    }
    lasting_born
}

/// [`Proc::offsets`] and [`Proc::ids`] of `runs` (start, piece, born, died), sorted by
/// start: counted per node, then laid out in that order.
fn node_pieces(runs: &[(u64, u32, u32, u32)], width: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; 2 * width + 1];
    let mut nodes = Vec::new();
    for &(_, _, born, died) in runs {
        cover(born as usize, died as usize, width, &mut nodes);
        for &node in &nodes {
            offsets[node + 1] += 1;
        }
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut ids = vec![0u32; offsets.last().map_or(0, |&n| n as usize)];
    let mut next: Vec<u32> = offsets[..2 * width].to_vec();
    for &(_, id, born, died) in runs {
        cover(born as usize, died as usize, width, &mut nodes);
        for &node in &nodes {
            ids[next[node] as usize] = id;
            next[node] += 1;
        }
    }
    (offsets, ids)
}

/// The nodes of a segment tree of `width` leaves whose ranges make up the versions
/// `[born, died)` (the canonical cover: at most two per level), into `out`.
fn cover(born: usize, died: usize, width: usize, out: &mut Vec<usize>) {
    out.clear();
    let (mut l, mut r) = (born + width, died.min(width) + width);
    while l < r {
        if l & 1 == 1 {
            out.push(l);
            l += 1;
        }
        if r & 1 == 1 {
            r -= 1;
            out.push(r);
        }
        l >>= 1;
        r >>= 1;
    }
}

/// Lays `m` over the layer at version `v` (as [`overlay`]): the pieces it cuts or
/// hides stop being visible at `v`, their remnants and `m` itself start at `v`.
fn overlay_pieces(
    state: &mut BTreeMap<u64, (u32, u32)>,
    pieces: &mut Vec<MapEntry>,
    runs: &mut Vec<(u32, u32, u32)>,
    m: MapEntry,
    v: u32,
) {
    let add = |pieces: &mut Vec<MapEntry>, state: &mut BTreeMap<u64, (u32, u32)>, p: MapEntry| {
        let id = pieces.len() as u32;
        pieces.push(p);
        state.insert(p.start, (id, v));
    };
    // The pieces `m` overlaps, highest first, one search each (most maps of a JIT's
    // process overlap none): a remnant put back below `m` ends at its start, one
    // above starts at its end, so neither is met again.
    while let Some((&start, &(id, born))) = state.range(..m.end).next_back() {
        let old = pieces[id as usize];
        if old.end <= m.start {
            break;
        }
        state.remove(&start);
        runs.push((id, born, v));
        if old.start < m.start {
            add(
                pieces,
                state,
                MapEntry {
                    end: m.start,
                    ..old
                },
            );
        }
        if old.end > m.end {
            add(
                pieces,
                state,
                MapEntry {
                    start: m.end,
                    pgoff: old.pgoff.wrapping_add(m.end - old.start),
                    ..old
                },
            );
        }
    }
    add(pieces, state, m);
}

/// Collects model events during the scan.
#[derive(Clone, Debug)]
pub(crate) struct ModelBuilder {
    dsos: Vec<Dso>,
    index: HashMap<(DsoKind, String, FileIdent), DsoId>,
    /// The DSO the last mapping named: a library's segments come one after another,
    /// so most lookups are answered without hashing or copying the name.
    last: Option<DsoId>,
    events: Vec<(u32, Event)>,
    /// `(symbol, address)` of the kernel reference map (`[kernel.kallsyms]_text`).
    pub kernel_ref: Option<(String, u64)>,
    /// Estimated bytes of model so far, and the most allowed (limits policy).
    used: u64,
    budget: u64,
    /// Each process's index in the last snapshot, with the number of its events then
    /// (see [`build_sorted`]): batches resolved beside a scan take a snapshot each.
    indexed: HashMap<u32, (usize, Arc<Proc>)>,
}

impl Default for ModelBuilder {
    fn default() -> Self {
        ModelBuilder {
            dsos: Vec::new(),
            index: HashMap::new(),
            last: None,
            events: Vec::new(),
            kernel_ref: None,
            used: 0,
            budget: crate::limits::MODEL_BYTES_FLOOR,
            indexed: HashMap::new(),
        }
    }
}

/// Classifies a mapping's file name the way perf does (map.h): `None` for anonymous
/// memory, heap, stack, SysV shm, hugetlb and other special names that have no DSO.
pub(crate) fn classify(name: &[u8], cpumode: u16, flags: u32) -> Option<(DsoKind, Cow<'_, str>)> {
    let s = String::from_utf8_lossy(name);
    if cpumode == misc::KERNEL {
        if s.starts_with("[kernel.kallsyms]") {
            return Some((DsoKind::Kernel, Cow::Borrowed("[kernel.kallsyms]")));
        }
        if s.starts_with("[guest.kernel") || s.is_empty() {
            return None;
        }
        return Some((DsoKind::Module, s));
    }
    if flags & MAP_HUGETLB != 0 {
        return None;
    }
    match &*s {
        "[vdso]" | "[vdso32]" | "[vdsox32]" => return Some((DsoKind::Vdso, s)),
        _ => {}
    }
    let special = [
        "//anon",
        "/dev/zero",
        "/anon_hugepage",
        "/SYSV",
        "/memfd:",
        "//",
    ];
    if !s.starts_with('/') || special.iter().any(|p| s.starts_with(p)) {
        return None;
    }
    Some((DsoKind::User, s))
}

impl ModelBuilder {
    /// A new, empty builder.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Raises the model's memory budget by what `bytes` of input may ask for
    /// ([`crate::limits::MODEL_BYTES_PER_INPUT_BYTE`]): file mode calls it once with
    /// the data size, a stream with every batch.
    pub(crate) fn account_input(&mut self, bytes: u64) {
        self.budget = self
            .budget
            .saturating_add(bytes.saturating_mul(crate::limits::MODEL_BYTES_PER_INPUT_BYTE));
    }

    /// Estimated bytes of model so far (see [`crate::limits::MODEL_EVENT_COST`]).
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    fn charge(&mut self, bytes: u64) -> Result<(), Exceeded> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.budget {
            return Err(Exceeded {
                what: "process model memory (bytes, estimated)",
                value: self.used,
                limit: self.budget,
            });
        }
        Ok(())
    }

    /// Records an MMAP or MMAP2 at `key` with the record's cpumode; returns the DSO
    /// the mapping names, if it names one. Err when the model would go over its
    /// memory budget.
    pub(crate) fn mmap(
        &mut self,
        key: Key,
        cpumode: u16,
        m: &Mmap<'_>,
    ) -> Result<Option<DsoId>, Exceeded> {
        let pid = match cpumode {
            misc::KERNEL => KERNEL_PID,
            misc::USER | misc::HYPERVISOR | 0 => m.pid,
            _ => return Ok(None), // guest machines are not modelled
        };
        if m.len == 0 {
            return Ok(None);
        }
        self.charge(crate::limits::MODEL_EVENT_COST)?;
        let end = m.start.saturating_add(m.len);
        let dso = classify(m.filename, cpumode, m.flags)
            .map(|(kind, name)| -> Result<DsoId, Exceeded> {
                if kind == DsoKind::Kernel && self.kernel_ref.is_none() {
                    let raw = String::from_utf8_lossy(m.filename);
                    if let Some(sym) = raw
                        .strip_prefix("[kernel.kallsyms]")
                        .filter(|s| !s.is_empty())
                    {
                        self.kernel_ref = Some((sym.to_string(), m.pgoff));
                    }
                }
                let ident = match (kind, m.ident) {
                    // The kernel map's device fields are meaningless.
                    (
                        DsoKind::Kernel | DsoKind::Module | DsoKind::Vdso,
                        FileIdent::Inode { .. },
                    ) => FileIdent::None,
                    (_, i) => i,
                };
                let id = self.intern(kind, name, ident)?;
                if m.prot & PROT_EXEC != 0 {
                    let d = &mut self.dsos[id as usize];
                    d.exec_maps.add(m.pgoff, m.len);
                }
                Ok(id)
            })
            .transpose()?;
        self.events.push((
            pid,
            Event {
                key,
                kind: EventKind::Map(MapEntry {
                    start: m.start,
                    end,
                    pgoff: m.pgoff,
                    dso,
                    // perf synthesizes kernel maps with prot 0: kernel space is code.
                    exec: m.prot & PROT_EXEC != 0 || pid == KERNEL_PID,
                }),
            },
        ));
        Ok(dso)
    }

    fn intern(
        &mut self,
        kind: DsoKind,
        name: Cow<'_, str>,
        ident: FileIdent,
    ) -> Result<DsoId, Exceeded> {
        if let Some(id) = self.last
            && let Some(d) = self.dsos.get(id as usize)
            && (d.kind, d.ident) == (kind, ident)
            && d.name == name
        {
            return Ok(id);
        }
        let k = (kind, name.into_owned(), ident);
        if let Some(&id) = self.index.get(&k) {
            self.last = Some(id);
            return Ok(id);
        }
        // The name is held twice (the DSO and the index).
        self.charge(2 * k.1.len() as u64 + crate::limits::MODEL_DSO_COST)?;
        let id = self.dsos.len() as DsoId;
        self.dsos.push(Dso {
            name: k.1.clone(),
            kind,
            ident,
            exec_maps: ExecMaps::default(),
        });
        self.index.insert(k, id);
        self.last = Some(id);
        Ok(id)
    }

    /// The DSO of `name` with `ident` (a JIT image, which no record names), added if
    /// new. Err when the model would go over its memory budget.
    pub(crate) fn intern_dso(
        &mut self,
        kind: DsoKind,
        name: &str,
        ident: FileIdent,
    ) -> Result<DsoId, Exceeded> {
        self.intern(kind, Cow::Borrowed(name), ident)
    }

    /// Records a mapping of `pid` at `key` that no record of the input made (a JIT's
    /// code load). Err when the model would go over its memory budget.
    pub(crate) fn map(&mut self, pid: u32, key: Key, m: MapEntry) -> Result<(), Exceeded> {
        self.charge(crate::limits::MODEL_EVENT_COST)?;
        if let (Some(d), true) = (m.dso, m.exec)
            && let Some(dso) = self.dsos.get_mut(d as usize)
        {
            dso.exec_maps.add(m.pgoff, m.end - m.start);
        }
        self.events.push((
            pid,
            Event {
                key,
                kind: EventKind::Map(m),
            },
        ));
        Ok(())
    }

    /// Forgets the mappings made by the records numbered in `seqs` (a JIT's marker
    /// and the anonymous maps after it, which perf drops when it injects the JIT's
    /// code).
    pub(crate) fn forget(&mut self, seqs: &std::collections::HashSet<u64>) {
        self.events
            .retain(|(_, e)| !(matches!(e.kind, EventKind::Map(_)) && seqs.contains(&e.key.seq)));
        self.indexed.clear();
    }

    /// Records that `pid` exec'd at `key`: its old mappings are gone.
    pub(crate) fn exec(&mut self, key: Key, pid: u32) -> Result<(), Exceeded> {
        self.charge(crate::limits::MODEL_EVENT_COST)?;
        self.events.push((
            pid,
            Event {
                key,
                kind: EventKind::Exec,
            },
        ));
        Ok(())
    }

    /// Records that `pid` was forked from `parent` at `key` (new processes only;
    /// new threads share their process's maps and need no event).
    pub(crate) fn fork(&mut self, key: Key, pid: u32, parent: u32) -> Result<(), Exceeded> {
        if pid != parent {
            self.charge(crate::limits::MODEL_EVENT_COST)?;
            self.events.push((
                pid,
                Event {
                    key,
                    kind: EventKind::Fork { parent },
                },
            ));
        }
        Ok(())
    }

    /// The DSOs so far.
    pub(crate) fn dsos(&self) -> &[Dso] {
        &self.dsos
    }

    /// The oldest time of the events recorded from record `seq` on (in time mode a
    /// key is the record's time, then its `seq`).
    pub(crate) fn oldest_event_from(&self, seq: u64) -> Option<u64> {
        self.events
            .iter()
            .filter(|(_, e)| e.key.seq >= seq)
            .map(|(_, e)| e.key.time)
            .min()
    }

    /// The model of the events so far, for a stream that goes on (pipe mode): DSO ids
    /// stay valid in later snapshots, since DSOs are only ever appended. The events
    /// are sorted where they are (the builder's order matters to nothing) rather
    /// than copied: a stream holds the builder and its batch's model at once, and
    /// a copy of every event besides was a fifth of its peak memory.
    pub(crate) fn snapshot(&mut self) -> Model {
        self.events.sort_by_key(|&(pid, ev)| (pid, ev.key));
        build_sorted(
            &self.events,
            self.dsos.clone(),
            self.kernel_ref.clone(),
            &mut self.indexed,
        )
    }

    /// Freezes the model: sorts every process's events by key and indexes each
    /// process's own mappings (a fork or exec starts a new layer).
    pub(crate) fn build(mut self) -> Model {
        self.events.sort_by_key(|&(pid, ev)| (pid, ev.key));
        build_sorted(&self.events, self.dsos, self.kernel_ref, &mut self.indexed)
    }
}

/// The model of `events` sorted by process and key (see [`ModelBuilder::build`]).
/// A process whose events are those `indexed` holds for it (events are only ever
/// added) keeps that index; the others are indexed and go into `indexed`.
fn build_sorted(
    events: &[(u32, Event)],
    dsos: Vec<Dso>,
    kernel_ref: Option<(String, u64)>,
    indexed: &mut HashMap<u32, (usize, Arc<Proc>)>,
) -> Model {
    let procs = events
        .chunk_by(|a, b| a.0 == b.0)
        .map(|evs| {
            let pid = evs[0].0;
            let proc = match indexed.get(&pid) {
                Some((n, p)) if *n == evs.len() => p.clone(),
                _ => {
                    let p = Arc::new(Proc::new(evs.iter().map(|(_, ev)| ev)));
                    indexed.insert(pid, (evs.len(), p.clone()));
                    p
                }
            };
            (pid, proc)
        })
        .collect();
    Model {
        procs,
        dsos,
        kernel_ref,
    }
}

/// Inserts `m`, trimming or removing what it overlaps (perf's maps__fixup_overlappings).
fn overlay(state: &mut BTreeMap<u64, MapEntry>, m: MapEntry) {
    let mut hit = Vec::new();
    for (&start, old) in state.range(..m.end).rev() {
        if old.end <= m.start {
            break;
        }
        hit.push(start);
    }
    for start in hit {
        let Some(old) = state.remove(&start) else {
            continue;
        };
        if old.start < m.start {
            state.insert(
                old.start,
                MapEntry {
                    end: m.start,
                    ..old
                },
            );
        }
        if old.end > m.end {
            let pgoff = old.pgoff.wrapping_add(m.end - old.start);
            state.insert(
                m.end,
                MapEntry {
                    start: m.end,
                    pgoff,
                    ..old
                },
            );
        }
    }
    state.insert(m.start, m);
}

/// Lays mapping `m` over the sorted, non-overlapping `maps`, as [`overlay`] does: what
/// it covers is cut out of the entries there; it is kept itself when `keep` says so
/// (a caller that holds only some kinds of mappings still has them cut).
pub(crate) fn lay_over(maps: &mut Vec<MapEntry>, m: MapEntry, keep: impl Fn(&MapEntry) -> bool) {
    let lo = maps.partition_point(|o| o.end <= m.start);
    let hi = maps.partition_point(|o| o.start < m.end);
    let mut pieces = Vec::with_capacity(3);
    if let Some(first) = maps.get(lo).filter(|o| lo < hi && o.start < m.start) {
        pieces.push(MapEntry {
            end: m.start,
            ..*first
        });
    }
    if keep(&m) {
        pieces.push(m);
    }
    if let Some(last) = hi
        .checked_sub(1)
        .and_then(|i| maps.get(i))
        .filter(|o| lo < hi && o.end > m.end)
    {
        pieces.push(MapEntry {
            start: m.end,
            pgoff: last.pgoff.wrapping_add(m.end - last.start),
            ..*last
        });
    }
    maps.splice(lo..hi.max(lo), pieces);
}

/// The frozen model, shared read-only by the resolve workers.
#[derive(Debug, Default)]
pub(crate) struct Model {
    procs: HashMap<u32, Arc<Proc>>,
    /// Every distinct DSO.
    pub dsos: Vec<Dso>,
    /// `(symbol, address)` of the recorded kernel reference map.
    pub kernel_ref: Option<(String, u64)>,
}

/// Forks followed at most this deep (guards against hostile fork loops).
const MAX_FORK_DEPTH: u32 = 64;

impl Model {
    /// The mapping covering `addr` in process `pid` as of `key` (the unit tests ask
    /// one address at a time; the resolve asks a [`Space`]).
    #[cfg(test)]
    pub(crate) fn lookup(&self, pid: u32, addr: u64, key: Key) -> Option<MapEntry> {
        self.space_depth(pid, key, 0)?.lookup(addr)
    }

    /// `pid`'s address space as of `key`, for many lookups at that key (the entries
    /// of one sample's callchain): the process and checkpoint are found once.
    pub(crate) fn space(&self, pid: u32, key: Key) -> Option<Space<'_>> {
        self.space_depth(pid, key, 0)
    }

    fn space_depth(&self, pid: u32, key: Key, depth: u32) -> Option<Space<'_>> {
        let proc = self.procs.get(&pid)?;
        let version = proc.keys.partition_point(|&k| k <= key);
        (version > 0).then_some(Space {
            model: self,
            pid,
            depth,
            proc,
            version,
        })
    }

    /// Version of `pid`'s address space as of `key`: equal versions of one process
    /// have equal address spaces (the parent's state at a fork is fixed).
    pub(crate) fn version(&self, pid: u32, key: Key) -> usize {
        self.procs
            .get(&pid)
            .map_or(0, |p| p.keys.partition_point(|&k| k <= key))
    }

    /// The mappings `pid` made between versions `from` and `to` of its address space
    /// (see [`Model::version`]), oldest first, when it did nothing else in between
    /// (no exec, no fork): laid over the address space at `from` with
    /// [`lay_over`], they give the one at `to`.
    pub(crate) fn mappings_between(
        &self,
        pid: u32,
        from: usize,
        to: usize,
    ) -> Option<Vec<MapEntry>> {
        let proc = self.procs.get(&pid)?;
        proc.laid
            .get(from..to)?
            .iter()
            .map(|&id| match id {
                NOT_A_MAP => None,
                id => proc.pieces.get(id as usize).copied(),
            })
            .collect()
    }

    /// The whole address space of `pid` as of `key`, sorted, non-overlapping: the
    /// layers of the fork chain (at most [`MAX_FORK_DEPTH`]), each built once, then
    /// laid over each other from the oldest ancestor up.
    pub(crate) fn address_space(&self, pid: u32, key: Key) -> Vec<MapEntry> {
        let mut layers: Vec<Vec<MapEntry>> = Vec::new();
        let (mut pid, mut key) = (pid, key);
        for _ in 0..=MAX_FORK_DEPTH {
            let Some(sp) = self.space_depth(pid, key, 0) else {
                break;
            };
            layers.push(sp.proc.layer(sp.version));
            match sp.proc.base(sp.version) {
                Base::Fork { parent, key: k } if parent != pid => {
                    pid = parent;
                    key = k;
                }
                _ => break,
            }
        }
        let mut state: BTreeMap<u64, MapEntry> = layers
            .pop()
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.start, m))
            .collect();
        while let Some(layer) = layers.pop() {
            for m in layer {
                overlay(&mut state, m);
            }
        }
        state.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mm(pid: u32, start: u64, len: u64, name: &'static [u8]) -> Mmap<'static> {
        Mmap {
            pid,
            tid: pid,
            start,
            len,
            pgoff: 0,
            ident: FileIdent::None,
            prot: 5,
            flags: 2,
            filename: name,
        }
    }

    fn name(m: &Model, e: Option<MapEntry>) -> Option<&str> {
        e.and_then(|e| e.dso)
            .map(|d| m.dsos[d as usize].name.as_str())
    }

    #[test]
    fn time_versions_exec_and_fork() {
        let mut b = ModelBuilder::new();
        b.mmap(
            Key::new(10, 1),
            misc::USER,
            &mm(1, 0x1000, 0x1000, b"/bin/a"),
        )
        .unwrap();
        b.mmap(
            Key::new(20, 2),
            misc::USER,
            &mm(1, 0x1000, 0x1000, b"/bin/b"),
        )
        .unwrap();
        b.fork(Key::new(15, 3), 2, 1).unwrap();
        b.exec(Key::new(30, 4), 1).unwrap();
        b.mmap(
            Key::new(40, 5),
            misc::USER,
            &mm(1, 0x2000, 0x1000, b"//anon"),
        )
        .unwrap();
        let m = b.build();
        assert_eq!(name(&m, m.lookup(1, 0x1800, Key::new(5, 0))), None);
        assert_eq!(
            name(&m, m.lookup(1, 0x1800, Key::new(12, 9))),
            Some("/bin/a")
        );
        assert_eq!(
            name(&m, m.lookup(1, 0x1800, Key::new(25, 9))),
            Some("/bin/b")
        );
        assert_eq!(m.lookup(1, 0x1800, Key::new(35, 9)), None);
        // The child sees the parent as of the fork, not the later remap.
        assert_eq!(
            name(&m, m.lookup(2, 0x1800, Key::new(99, 9))),
            Some("/bin/a")
        );
        let space: Vec<_> = m
            .address_space(2, Key::new(99, 9))
            .iter()
            .map(|e| (e.start, e.end))
            .collect();
        assert_eq!(space, vec![(0x1000, 0x2000)]);
        assert_eq!(m.address_space(1, Key::new(35, 9)), vec![]);
        assert_ne!(m.version(1, Key::new(12, 9)), m.version(1, Key::new(25, 9)));
        // Anonymous memory is a mapping without a DSO.
        assert!(
            m.lookup(1, 0x2000, Key::new(99, 9))
                .is_some_and(|e| e.dso.is_none())
        );
    }

    #[test]
    fn overlay_splits() {
        let mut s = BTreeMap::new();
        overlay(
            &mut s,
            MapEntry {
                start: 0,
                end: 100,
                pgoff: 0,
                dso: Some(0),
                exec: true,
            },
        );
        overlay(
            &mut s,
            MapEntry {
                start: 40,
                end: 60,
                pgoff: 0,
                dso: Some(1),
                exec: true,
            },
        );
        let v: Vec<_> = s
            .values()
            .map(|m| (m.start, m.end, m.pgoff, m.dso))
            .collect();
        assert_eq!(
            v,
            vec![
                (0, 40, 0, Some(0)),
                (40, 60, 0, Some(1)),
                (60, 100, 60, Some(0))
            ]
        );
    }

    #[test]
    fn lay_over_is_overlay_keeping_some() {
        // Random mappings laid over each other both ways: the sorted list kept by
        // lay_over (executable ones only) is the executable part of overlay's map.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let mut all = BTreeMap::new();
            let mut exec = Vec::new();
            for _ in 0..12 {
                let start = next(64) * 16;
                let m = MapEntry {
                    start,
                    end: start + 16 * (1 + next(8)),
                    pgoff: next(4) * 4096,
                    dso: (next(3) > 0).then(|| next(5) as u32),
                    exec: next(2) == 0,
                };
                overlay(&mut all, m);
                lay_over(&mut exec, m, |m| m.exec && m.dso.is_some());
            }
            let want: Vec<_> = all
                .into_values()
                .filter(|m| m.exec && m.dso.is_some())
                .collect();
            assert_eq!(exec, want);
        }
    }

    #[test]
    fn many_events_in_one_process() {
        let mut b = ModelBuilder::new();
        for i in 0..1000u64 {
            b.mmap(
                Key::new(i, i),
                misc::USER,
                &mm(7, 0x10000 * i, 0x1000, b"/lib/x"),
            )
            .unwrap();
        }
        let m = b.build();
        for i in (0..1000u64).step_by(37) {
            assert!(m.lookup(7, 0x10000 * i + 5, Key::new(i, i)).is_some());
            assert!(
                m.lookup(7, 0x10000 * i + 5, Key::new(i.wrapping_sub(1), 0))
                    .is_none()
                    || i == 0
            );
        }
    }
}

/// The index against a replay: every lookup and address space of random histories
/// (maps over maps, execs, forks, fork loops) equals what laying the events over
/// each other from scratch gives.
#[cfg(test)]
mod replay_tests {
    use super::*;

    /// A small deterministic generator (xorshift), so that a failure repeats.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// The mapping covering `addr` in `pid` at `key`, by replaying its events.
    fn replay(evs: &[(u32, Event)], pid: u32, addr: u64, key: Key) -> Option<MapEntry> {
        let (mut pid, mut key) = (pid, key);
        let (mut lo, mut hi) = (0u64, u64::MAX);
        for _ in 0..=MAX_FORK_DEPTH {
            let mine: Vec<Event> = evs
                .iter()
                .filter(|(p, e)| *p == pid && e.key <= key)
                .map(|&(_, e)| e)
                .collect();
            if mine.is_empty() {
                return None;
            }
            let reset = mine
                .iter()
                .rposition(|e| !matches!(e.kind, EventKind::Map(_)));
            let mut state = BTreeMap::new();
            for e in &mine[reset.map_or(0, |r| r + 1)..] {
                if let EventKind::Map(m) = e.kind {
                    overlay(&mut state, m);
                }
            }
            if let Some((_, m)) = state.range(..=addr).next_back()
                && addr < m.end
            {
                return Some(clamp(*m, lo, hi));
            }
            if let Some((_, m)) = state.range(..=addr).next_back() {
                lo = lo.max(m.end);
            }
            if let Some((&s, _)) = state.range(addr + 1..).next() {
                hi = hi.min(s);
            }
            match reset.map(|r| mine[r]) {
                Some(Event {
                    key: k,
                    kind: EventKind::Fork { parent },
                }) if parent != pid => {
                    pid = parent;
                    key = k;
                }
                _ => return None,
            }
        }
        None
    }

    /// Bytes of a process's index beside its events (pieces, tree entries, offsets).
    fn index_bytes(p: &Proc) -> usize {
        p.pieces.len() * std::mem::size_of::<MapEntry>()
            + 4 * (p.ids.len() + p.offsets.len() + p.lasting.len())
    }

    #[test]
    fn the_index_fits_the_event_cost_estimate() {
        // The event is 56 bytes (64 with its pid while the scan collects it); the rest of
        // the estimate is the index's.
        assert_eq!(std::mem::size_of::<(u32, Event)>(), 64);
        let share = (crate::limits::MODEL_EVENT_COST - 64) as usize;
        // A JIT's growing address space, and a process remapping one region at random.
        let mut rng = Rng(7);
        for shape in ["grows", "grows over its last maps", "remaps at random"] {
            let mut b = ModelBuilder::new();
            let n = 50_000u64;
            for i in 0..n {
                let (start, pages) = match shape {
                    "grows" => (0x1000 * i, 1),
                    "grows over its last maps" => (0x1000 * i, 1 + rng.below(4)),
                    _ => (0x1000 * rng.below(4096), 1 + rng.below(4)),
                };
                let m = Mmap {
                    pid: 9,
                    tid: 9,
                    start,
                    len: 0x1000 * pages,
                    pgoff: 0,
                    ident: FileIdent::None,
                    prot: 5,
                    flags: 2,
                    filename: b"//anon",
                };
                b.mmap(Key::new(i, i), misc::USER, &m).unwrap();
            }
            let model = b.build();
            let per_event = index_bytes(&model.procs[&9]) / n as usize;
            assert!(per_event <= share, "{shape}: {per_event} bytes per event");
        }
    }

    #[test]
    fn lookups_equal_a_replay_of_random_histories() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..40 {
            let mut b = ModelBuilder::new();
            let n = 1 + rng.below(if round % 4 == 0 { 2000 } else { 120 });
            for i in 0..n {
                let pid = 1 + rng.below(3) as u32;
                let key = Key::new(rng.below(n / 2 + 1), i);
                match rng.below(20) {
                    0 => b.exec(key, pid).unwrap(),
                    1 => b.fork(key, pid, 1 + rng.below(3) as u32).unwrap(),
                    _ => {
                        let start = 0x1000 * rng.below(64);
                        let len = 0x1000 * (1 + rng.below(8));
                        let name: &'static [u8] =
                            [b"/a".as_slice(), b"/b", b"//anon"][rng.below(3) as usize];
                        let mut m = Mmap {
                            pid,
                            tid: pid,
                            start,
                            len,
                            pgoff: 0x1000 * rng.below(4),
                            ident: FileIdent::None,
                            prot: 5,
                            flags: 2,
                            filename: name,
                        };
                        m.len = len;
                        b.mmap(key, misc::USER, &m).unwrap();
                    }
                }
            }
            let mut evs = b.events.clone();
            evs.sort_by_key(|&(pid, ev)| (pid, ev.key));
            let model = b.build();
            for _ in 0..400 {
                let pid = 1 + rng.below(3) as u32;
                let addr = rng.below(0x1000 * 72);
                let key = Key::new(rng.below(n / 2 + 2), rng.below(n + 1));
                assert_eq!(
                    model.lookup(pid, addr, key),
                    replay(&evs, pid, addr, key),
                    "round {round}: pid {pid} addr {addr:#x} at {key:?}"
                );
                // Every key of the window a lookup gives sees the same mapping there:
                // its ends, and keys of the process's events inside it.
                let Some((m, Some(seen))) = model.space(pid, key).and_then(|s| s.lookup_seen(addr))
                else {
                    continue;
                };
                assert!(seen.holds(key), "round {round}: {key:?} outside {seen:?}");
                let inside = evs
                    .iter()
                    .map(|&(_, ev)| ev.key)
                    .chain([seen.from, Key::new(u64::MAX, u64::MAX)])
                    .chain(seen.until.map(|u| Key::new(u.time, u.seq.wrapping_sub(1))))
                    .filter(|&k| seen.holds(k));
                for k in inside {
                    assert_eq!(
                        replay(&evs, pid, addr, k),
                        Some(m),
                        "round {round}: pid {pid} addr {addr:#x} seen {seen:?}, at {k:?}"
                    );
                }
            }
            // The whole address space: each of its entries is what a lookup there gives.
            for _ in 0..20 {
                let pid = 1 + rng.below(3) as u32;
                let key = Key::new(rng.below(n / 2 + 2), rng.below(n + 1));
                let space = model.address_space(pid, key);
                for w in space.windows(2) {
                    assert!(w[0].end <= w[1].start, "round {round}: overlapping space");
                }
                for addr in (0..0x1000 * 72).step_by(0x800) {
                    let want = replay(&evs, pid, addr, key);
                    let got = space.iter().find(|m| m.start <= addr && addr < m.end);
                    assert_eq!(
                        got.copied(),
                        want,
                        "round {round}: space of {pid} at {key:?}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    fn mm(pid: u32, start: u64, name: &'static [u8]) -> Mmap<'static> {
        Mmap {
            pid,
            tid: pid,
            start,
            len: 0x1000,
            pgoff: 0,
            ident: FileIdent::None,
            prot: 5,
            flags: 2,
            filename: name,
        }
    }

    #[test]
    fn fork_chain_is_followed_in_linear_time() {
        let mut b = ModelBuilder::new();
        b.mmap(Key::new(1, 1), misc::USER, &mm(100, 0x40_0000, b"/a"))
            .unwrap();
        b.mmap(Key::new(2, 2), misc::USER, &mm(101, 0x50_0000, b"/b"))
            .unwrap();
        for i in 0..60u64 {
            let (c, p) = if i % 2 == 0 { (100, 101) } else { (101, 100) };
            b.fork(Key::new(10 + i, 10 + i), c, p).unwrap();
        }
        let m = b.build();
        // Each fork replaces the child's space with the parent's: only /b is left,
        // found through the whole chain.
        assert!(m.lookup(100, 0x40_0100, Key::new(99, 99)).is_none());
        let e = m.lookup(100, 0x50_0100, Key::new(99, 99));
        assert_eq!(e.and_then(|e| e.dso), Some(1));
        let s = m.address_space(100, Key::new(99, 99));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].start, 0x50_0000);
    }

    #[test]
    fn the_model_budget_stops_runaway_inputs() {
        let mut b = ModelBuilder::new();
        let max = crate::limits::MODEL_BYTES_FLOOR / crate::limits::MODEL_EVENT_COST;
        let mut n = 0u64;
        let err = loop {
            match b.mmap(Key::new(n, n), misc::USER, &mm(1, 0x1000 * (n % 64), b"/x")) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(n <= max, "no limit after {n} events");
        };
        assert!(n >= max - 8, "stopped after only {n} events");
        assert_eq!(err.limit, crate::limits::MODEL_BYTES_FLOOR);
        // Input bytes raise the budget.
        b.account_input(1 << 20);
        assert!(b.mmap(Key::new(n, n), misc::USER, &mm(1, 0, b"/x")).is_ok());
    }

    #[test]
    fn a_child_mapping_cuts_the_parents() {
        let mut b = ModelBuilder::new();
        let mut big = mm(1, 0x1000, b"/big");
        big.len = 0x9000;
        b.mmap(Key::new(1, 1), misc::USER, &big).unwrap();
        b.fork(Key::new(2, 2), 2, 1).unwrap();
        b.mmap(Key::new(3, 3), misc::USER, &mm(2, 0x4000, b"/small"))
            .unwrap();
        let m = b.build();
        // The part of the parent's mapping before the child's: cut at its start.
        let e = m.lookup(2, 0x2000, Key::new(9, 9)).unwrap();
        assert_eq!(
            (e.start, e.end, e.pgoff, e.dso),
            (0x1000, 0x4000, 0, Some(0))
        );
        // After it: the file offset moves with the start.
        let e = m.lookup(2, 0x6000, Key::new(9, 9)).unwrap();
        assert_eq!((e.start, e.end, e.pgoff), (0x5000, 0xa000, 0x4000));
        let e = m.lookup(2, 0x4800, Key::new(9, 9)).unwrap();
        assert_eq!(e.dso, Some(1));
        let s: Vec<_> = m
            .address_space(2, Key::new(9, 9))
            .iter()
            .map(|e| (e.start, e.end))
            .collect();
        assert_eq!(
            s,
            vec![(0x1000, 0x4000), (0x4000, 0x5000), (0x5000, 0xa000)]
        );
    }
}
