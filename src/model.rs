//! The process model: an immutable, time-versioned picture of every process's
//! address space, built append-only from MMAP/MMAP2/COMM-exec/FORK in one pass.
//!
//! Each process keeps its events sorted by [`Key`] (time, then file order). A lookup
//! at key `k` answers with the newest mapping covering the address among the events at
//! or before `k`; an exec ends the search (the old image is gone); a fork continues in
//! the parent as of the fork. Flattened checkpoints (sorted, non-overlapping ranges)
//! bound the scan: the newest checkpoint at or before `k` is binary-searched after the
//! few events that follow it have been checked, so steady-state lookups are O(log n).

use crate::format::record::{FileIdent, MAP_HUGETLB, Mmap, PROT_EXEC, misc};
use crate::limits::Exceeded;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// Ordering key of records: sample/record time first (0 when the recording has no
/// times), then position in the file. Named fields (not a tuple) so that the two
/// numbers cannot be swapped; the derived order is time, then `seq`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The record's time (0 when the recording has no times).
    pub time: u64,
    /// The record's number in the file.
    pub seq: u64,
}

impl Key {
    /// The key of a record at `time` numbered `seq`.
    pub const fn new(time: u64, seq: u64) -> Key {
        Key { time, seq }
    }
}

/// The pid under which kernel-space maps are kept (perf's HOST_KERNEL_ID, -1).
pub const KERNEL_PID: u32 = u32::MAX;

/// Index of a DSO in [`Model::dsos`].
pub type DsoId = u32;

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
    pub fn is_kernel_space(self) -> bool {
        matches!(self, DsoKind::Kernel | DsoKind::Module)
    }

    /// The cpumode of its build-ID table entry or record.
    pub fn build_id_cpumode(self) -> u16 {
        if self.is_kernel_space() {
            misc::KERNEL
        } else {
            misc::USER
        }
    }
}

/// One distinct mapped object: a name plus the identity the records gave it.
#[derive(Clone, Debug)]
pub struct Dso {
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
pub struct ExecMaps {
    /// Distinct `(pgoff, len)`, at most [`ExecMaps::KEPT`], in the order first seen.
    pub maps: Vec<(u64, u64)>,
    /// More distinct mappings were recorded than kept: `maps` is not all of them, so
    /// it cannot show that every mapping fits the file.
    pub more: bool,
}

impl ExecMaps {
    /// Distinct mappings kept per DSO (a library is mapped the same way by every
    /// process; more than a few means something remaps its code).
    pub const KEPT: usize = 8;

    /// Adds one recorded executable mapping.
    pub fn add(&mut self, pgoff: u64, len: u64) {
        if !self.maps.contains(&(pgoff, len)) {
            if self.maps.len() < Self::KEPT {
                self.maps.push((pgoff, len));
            } else {
                self.more = true;
            }
        }
    }

    /// Adds every mapping of `other` (the DSOs of one path).
    pub fn merge(&mut self, other: &ExecMaps) {
        for &(pgoff, len) in &other.maps {
            self.add(pgoff, len);
        }
        self.more |= other.more;
    }

    /// Whether the DSO was mapped executable at all.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty() && !self.more
    }

    /// The distinct file offsets mapped.
    pub fn pgoffs(&self) -> impl Iterator<Item = u64> + '_ {
        self.maps.iter().map(|m| m.0)
    }
}

/// One process's address space at one key: the newest checkpoint at or before it and
/// the events that follow (see [`Model::space`]).
#[derive(Clone, Copy, Debug)]
pub struct Space<'m> {
    model: &'m Model,
    pid: u32,
    depth: u32,
    maps: &'m [MapEntry],
    base: Base,
    events: &'m [Event],
}

impl Space<'_> {
    /// The mapping covering `addr`: the part of it that is visible at this key (a
    /// newer mapping that overlaps it cuts it, as perf's maps__fixup_overlappings).
    ///
    /// Iterative: a fork continues in the parent as of the fork, one process at a
    /// time, so a chain of forks costs one step per fork (never a recursion per event).
    pub fn lookup(&self, addr: u64) -> Option<MapEntry> {
        let mut sp = *self;
        // The visible interval around `addr` left by newer mappings.
        let (mut lo, mut hi) = (0u64, u64::MAX);
        loop {
            let mut next = None;
            for ev in sp.events.iter().rev() {
                match ev.kind {
                    EventKind::Map(m) if m.start <= addr && addr < m.end => {
                        return Some(clamp(m, lo, hi));
                    }
                    EventKind::Map(m) => {
                        if m.end <= addr {
                            lo = lo.max(m.end);
                        } else {
                            hi = hi.min(m.start);
                        }
                    }
                    EventKind::Exec => return None,
                    EventKind::Fork { parent } => {
                        next = Some((parent, ev.key));
                        break;
                    }
                }
            }
            if next.is_none() {
                let i = sp.maps.partition_point(|m| m.start <= addr);
                if let Some(m) = i.checked_sub(1).and_then(|j| sp.maps.get(j)) {
                    if addr < m.end {
                        return Some(clamp(*m, lo, hi));
                    }
                    lo = lo.max(m.end);
                }
                if let Some(m) = sp.maps.get(i) {
                    hi = hi.min(m.start);
                }
                match sp.base {
                    Base::Empty => return None,
                    Base::Fork { parent, key } => next = Some((parent, key)),
                }
            }
            let (parent, key) = next?;
            if sp.depth >= MAX_FORK_DEPTH || parent == sp.pid {
                return None;
            }
            sp = sp.model.space_depth(parent, key, sp.depth + 1)?;
        }
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
pub struct MapEntry {
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

#[derive(Debug)]
struct Checkpoint {
    /// Number of the process's events folded into `maps`.
    upto: usize,
    /// What the mappings lie on (set by the last exec or fork before `upto`).
    base: Base,
    /// The process's own mappings since that exec or fork, sorted, non-overlapping.
    maps: Vec<MapEntry>,
}

#[derive(Debug, Default)]
struct Proc {
    events: Vec<Event>,
    checkpoints: Vec<Checkpoint>,
}

/// Collects model events during the scan.
#[derive(Clone, Debug)]
pub struct ModelBuilder {
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
        }
    }
}

/// Classifies a mapping's file name the way perf does (map.h): `None` for anonymous
/// memory, heap, stack, SysV shm, hugetlb and other special names that have no DSO.
pub fn classify(name: &[u8], cpumode: u16, flags: u32) -> Option<(DsoKind, Cow<'_, str>)> {
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
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the model's memory budget by what `bytes` of input may ask for
    /// ([`crate::limits::MODEL_BYTES_PER_INPUT_BYTE`]): file mode calls it once with
    /// the data size, a stream with every batch.
    pub fn account_input(&mut self, bytes: u64) {
        self.budget = self
            .budget
            .saturating_add(bytes.saturating_mul(crate::limits::MODEL_BYTES_PER_INPUT_BYTE));
    }

    /// Estimated bytes of model so far (see [`crate::limits::MODEL_EVENT_COST`]).
    pub fn used(&self) -> u64 {
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
    pub fn mmap(
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

    /// Records that `pid` exec'd at `key`: its old mappings are gone.
    pub fn exec(&mut self, key: Key, pid: u32) -> Result<(), Exceeded> {
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
    pub fn fork(&mut self, key: Key, pid: u32, parent: u32) -> Result<(), Exceeded> {
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
    pub fn dsos(&self) -> &[Dso] {
        &self.dsos
    }

    /// The oldest time of the events recorded from record `seq` on (in time mode a
    /// key is the record's time, then its `seq`).
    pub fn oldest_event_from(&self, seq: u64) -> Option<u64> {
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
    pub fn snapshot(&mut self) -> Model {
        self.events.sort_by_key(|&(pid, ev)| (pid, ev.key));
        build_sorted(&self.events, self.dsos.clone(), self.kernel_ref.clone())
    }

    /// Freezes the model: sorts every process's events by key and builds checkpoints
    /// of each process's own mappings (a fork or exec starts a new layer).
    pub fn build(mut self) -> Model {
        self.events.sort_by_key(|&(pid, ev)| (pid, ev.key));
        build_sorted(&self.events, self.dsos, self.kernel_ref)
    }
}

/// The model of `events` sorted by process and key (see [`ModelBuilder::build`]).
fn build_sorted(
    events: &[(u32, Event)],
    dsos: Vec<Dso>,
    kernel_ref: Option<(String, u64)>,
) -> Model {
    let total = events.len();
    // Checkpoints copy a process's mappings every `max(32, size / 8)` events,
    // which costs at most ~9 entries per event when an address space only grows;
    // past this budget the spacing becomes `size` (2 per event), so memory stays
    // proportional to the input whatever its shape.
    let cp_budget = 2 * total + 65_536;
    let mut cp_used = 0usize;
    let mut procs: HashMap<u32, Proc> = HashMap::new();
    let mut i = 0;
    while i < events.len() {
        let pid = events[i].0;
        let n = events[i..].partition_point(|(p, _)| *p == pid);
        let evs = &events[i..i + n];
        i += n;
        let mut p = Proc {
            events: Vec::with_capacity(evs.len()),
            checkpoints: Vec::new(),
        };
        let mut state: BTreeMap<u64, MapEntry> = BTreeMap::new();
        let mut base = Base::Empty;
        let mut since = 0usize;
        for &(_, ev) in evs {
            match ev.kind {
                EventKind::Map(m) => overlay(&mut state, m),
                EventKind::Exec => {
                    state.clear();
                    base = Base::Empty;
                }
                EventKind::Fork { parent } => {
                    state.clear();
                    base = Base::Fork {
                        parent,
                        key: ev.key,
                    };
                }
            }
            p.events.push(ev);
            since += 1;
            let size = state.len();
            let spacing = if cp_used < cp_budget { size / 8 } else { size };
            if since >= 32.max(spacing) {
                since = 0;
                cp_used += size;
                p.checkpoints.push(Checkpoint {
                    upto: p.events.len(),
                    base,
                    maps: state.values().copied().collect(),
                });
            }
        }
        if p.checkpoints.last().map(|c| c.upto) != Some(p.events.len()) {
            p.checkpoints.push(Checkpoint {
                upto: p.events.len(),
                base,
                maps: state.values().copied().collect(),
            });
        }
        procs.insert(pid, p);
    }
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
pub fn lay_over(maps: &mut Vec<MapEntry>, m: MapEntry, keep: impl Fn(&MapEntry) -> bool) {
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
pub struct Model {
    procs: HashMap<u32, Proc>,
    /// Every distinct DSO.
    pub dsos: Vec<Dso>,
    /// `(symbol, address)` of the recorded kernel reference map.
    pub kernel_ref: Option<(String, u64)>,
}

/// Forks followed at most this deep (guards against hostile fork loops).
const MAX_FORK_DEPTH: u32 = 64;

impl Model {
    /// The mapping covering `addr` in process `pid` as of `key`.
    pub fn lookup(&self, pid: u32, addr: u64, key: Key) -> Option<MapEntry> {
        self.lookup_depth(pid, addr, key, 0)
    }

    fn lookup_depth(&self, pid: u32, addr: u64, key: Key, depth: u32) -> Option<MapEntry> {
        self.space_depth(pid, key, depth)?.lookup(addr)
    }

    /// `pid`'s address space as of `key`, for many lookups at that key (the entries
    /// of one sample's callchain): the process and checkpoint are found once.
    pub fn space(&self, pid: u32, key: Key) -> Option<Space<'_>> {
        self.space_depth(pid, key, 0)
    }

    fn space_depth(&self, pid: u32, key: Key, depth: u32) -> Option<Space<'_>> {
        let p = self.procs.get(&pid)?;
        let n = p.events.partition_point(|e| e.key <= key);
        if n == 0 {
            return None;
        }
        let ci = p.checkpoints.partition_point(|c| c.upto <= n);
        let (maps, base, from): (&[MapEntry], Base, usize) = match ci.checked_sub(1) {
            Some(i) => (
                &p.checkpoints[i].maps,
                p.checkpoints[i].base,
                p.checkpoints[i].upto,
            ),
            None => (&[], Base::Empty, 0),
        };
        Some(Space {
            model: self,
            pid,
            depth,
            maps,
            base,
            events: &p.events[from..n],
        })
    }

    /// Version of `pid`'s address space as of `key`: equal versions of one process
    /// have equal address spaces (the parent's state at a fork is fixed).
    pub fn version(&self, pid: u32, key: Key) -> usize {
        self.procs
            .get(&pid)
            .map_or(0, |p| p.events.partition_point(|e| e.key <= key))
    }

    /// The mappings `pid` made between versions `from` and `to` of its address space
    /// (see [`Model::version`]), oldest first, when it did nothing else in between
    /// (no exec, no fork): laid over the address space at `from` with
    /// [`lay_over`], they give the one at `to`.
    pub fn mappings_between(&self, pid: u32, from: usize, to: usize) -> Option<Vec<MapEntry>> {
        self.procs
            .get(&pid)?
            .events
            .get(from..to)?
            .iter()
            .map(|e| match e.kind {
                EventKind::Map(m) => Some(m),
                EventKind::Exec | EventKind::Fork { .. } => None,
            })
            .collect()
    }

    /// The whole address space of `pid` as of `key`, sorted, non-overlapping: the
    /// layers of the fork chain (at most [`MAX_FORK_DEPTH`]), each built once, then
    /// laid over each other from the oldest ancestor up.
    pub fn address_space(&self, pid: u32, key: Key) -> Vec<MapEntry> {
        let mut layers: Vec<BTreeMap<u64, MapEntry>> = Vec::new();
        let (mut pid, mut key) = (pid, key);
        for _ in 0..=MAX_FORK_DEPTH {
            let Some(sp) = self.space_depth(pid, key, 0) else {
                break;
            };
            // Only the newest exec or fork of the window matters: it starts the layer.
            let reset = sp
                .events
                .iter()
                .rposition(|e| !matches!(e.kind, EventKind::Map(_)));
            let (mut state, rest, base) = match reset {
                Some(r) => {
                    let ev = &sp.events[r];
                    let base = match ev.kind {
                        EventKind::Fork { parent } => Base::Fork {
                            parent,
                            key: ev.key,
                        },
                        _ => Base::Empty,
                    };
                    (BTreeMap::new(), &sp.events[r + 1..], base)
                }
                None => (
                    sp.maps.iter().map(|m| (m.start, *m)).collect(),
                    sp.events,
                    sp.base,
                ),
            };
            for ev in rest {
                if let EventKind::Map(m) = ev.kind {
                    overlay(&mut state, m);
                }
            }
            layers.push(state);
            match base {
                Base::Fork { parent, key: k } if parent != pid => {
                    pid = parent;
                    key = k;
                }
                _ => break,
            }
        }
        let mut state = layers.pop().unwrap_or_default();
        while let Some(layer) = layers.pop() {
            for m in layer.into_values() {
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
    fn many_events_use_checkpoints() {
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
