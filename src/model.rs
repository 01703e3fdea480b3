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
use std::collections::{BTreeMap, HashMap};

/// Ordering key of records: sample/record time first (0 when the recording has no
/// times), then position in the file.
pub type Key = (u64, u64);

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
    /// Distinct file offsets of its executable mappings (a few, for layout checks).
    pub exec_pgoffs: Vec<u64>,
}

/// One process's address space at one key: the newest checkpoint at or before it and
/// the events that follow (see [`Model::space`]).
#[derive(Clone, Copy, Debug)]
pub struct Space<'m> {
    model: &'m Model,
    pid: u32,
    depth: u32,
    maps: &'m [MapEntry],
    events: &'m [Event],
}

impl Space<'_> {
    /// The mapping covering `addr`.
    pub fn lookup(&self, addr: u64) -> Option<MapEntry> {
        for ev in self.events.iter().rev() {
            match ev.kind {
                EventKind::Map(m) if m.start <= addr && addr < m.end => return Some(m),
                EventKind::Map(_) => {}
                EventKind::Exec => return None,
                EventKind::Fork { parent } => {
                    if self.depth >= MAX_FORK_DEPTH || parent == self.pid {
                        return None;
                    }
                    return self
                        .model
                        .lookup_depth(parent, addr, ev.key, self.depth + 1);
                }
            }
        }
        let i = self.maps.partition_point(|m| m.start <= addr);
        let m = self.maps.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(*m)
    }
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

#[derive(Debug, Default)]
struct Checkpoint {
    /// Number of the process's events folded into `maps`.
    upto: usize,
    maps: Vec<MapEntry>,
}

#[derive(Debug, Default)]
struct Proc {
    events: Vec<Event>,
    checkpoints: Vec<Checkpoint>,
}

/// Collects model events during the scan.
#[derive(Clone, Debug, Default)]
pub struct ModelBuilder {
    dsos: Vec<Dso>,
    index: HashMap<(DsoKind, String, FileIdent), DsoId>,
    events: Vec<(u32, Event)>,
    /// `(symbol, address)` of the kernel reference map (`[kernel.kallsyms]_text`).
    pub kernel_ref: Option<(String, u64)>,
}

/// Classifies a mapping's file name the way perf does (map.h): `None` for anonymous
/// memory, heap, stack, SysV shm, hugetlb and other special names that have no DSO.
pub fn classify(name: &[u8], cpumode: u16, flags: u32) -> Option<(DsoKind, String)> {
    let s = String::from_utf8_lossy(name);
    if cpumode == misc::KERNEL {
        if s.starts_with("[kernel.kallsyms]") {
            return Some((DsoKind::Kernel, "[kernel.kallsyms]".to_string()));
        }
        if s.starts_with("[guest.kernel") || s.is_empty() {
            return None;
        }
        return Some((DsoKind::Module, s.into_owned()));
    }
    if flags & MAP_HUGETLB != 0 {
        return None;
    }
    match &*s {
        "[vdso]" | "[vdso32]" | "[vdsox32]" => return Some((DsoKind::Vdso, s.into_owned())),
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
    Some((DsoKind::User, s.into_owned()))
}

impl ModelBuilder {
    /// A new, empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an MMAP or MMAP2 at `key` with the record's cpumode.
    /// Returns the DSO the mapping names, if it names one.
    pub fn mmap(&mut self, key: Key, cpumode: u16, m: &Mmap<'_>) -> Option<DsoId> {
        let pid = match cpumode {
            misc::KERNEL => KERNEL_PID,
            misc::USER | misc::HYPERVISOR | 0 => m.pid,
            _ => return None, // guest machines are not modelled
        };
        if m.len == 0 {
            return None;
        }
        let end = m.start.saturating_add(m.len);
        let dso = classify(m.filename, cpumode, m.flags).map(|(kind, name)| {
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
                (DsoKind::Kernel | DsoKind::Module | DsoKind::Vdso, FileIdent::Inode { .. }) => {
                    FileIdent::None
                }
                (_, i) => i,
            };
            let id = self.intern(kind, name, ident);
            if m.prot & PROT_EXEC != 0 {
                let d = &mut self.dsos[id as usize];
                if d.exec_pgoffs.len() < 8 && !d.exec_pgoffs.contains(&m.pgoff) {
                    d.exec_pgoffs.push(m.pgoff);
                }
            }
            id
        });
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
        dso
    }

    fn intern(&mut self, kind: DsoKind, name: String, ident: FileIdent) -> DsoId {
        let k = (kind, name, ident);
        if let Some(&id) = self.index.get(&k) {
            return id;
        }
        let id = self.dsos.len() as DsoId;
        self.dsos.push(Dso {
            name: k.1.clone(),
            kind,
            ident,
            exec_pgoffs: Vec::new(),
        });
        self.index.insert(k, id);
        id
    }

    /// Records that `pid` exec'd at `key`: its old mappings are gone.
    pub fn exec(&mut self, key: Key, pid: u32) {
        self.events.push((
            pid,
            Event {
                key,
                kind: EventKind::Exec,
            },
        ));
    }

    /// Records that `pid` was forked from `parent` at `key` (new processes only;
    /// new threads share their process's maps and need no event).
    pub fn fork(&mut self, key: Key, pid: u32, parent: u32) {
        if pid != parent {
            self.events.push((
                pid,
                Event {
                    key,
                    kind: EventKind::Fork { parent },
                },
            ));
        }
    }

    /// The model of the events so far, for a stream that goes on (pipe mode): DSO ids
    /// stay valid in later snapshots, since DSOs are only ever appended.
    pub fn snapshot(&self) -> Model {
        self.clone().build()
    }

    /// Freezes the model: sorts every process's events by key and builds checkpoints.
    pub fn build(mut self) -> Model {
        // Replay all events in global key order so a fork copies its parent's state
        // as of the fork.
        self.events.sort_by_key(|(_, ev)| ev.key);
        let mut procs: HashMap<u32, Proc> = HashMap::new();
        let mut state: HashMap<u32, BTreeMap<u64, MapEntry>> = HashMap::new();
        let mut since_cp: HashMap<u32, usize> = HashMap::new();
        for (pid, ev) in self.events {
            match ev.kind {
                EventKind::Map(m) => overlay(state.entry(pid).or_default(), m),
                EventKind::Exec => {
                    state.insert(pid, BTreeMap::new());
                }
                EventKind::Fork { parent } => {
                    let copy = state.get(&parent).cloned().unwrap_or_default();
                    state.insert(pid, copy);
                }
            }
            let p = procs.entry(pid).or_default();
            p.events.push(ev);
            let n = since_cp.entry(pid).or_default();
            *n += 1;
            let size = state.get(&pid).map_or(0, |s| s.len());
            // Checkpoint spacing grows with the address-space size so the copies
            // stay linear in the number of events.
            if *n >= 32.max(size / 8) {
                *n = 0;
                p.checkpoints.push(Checkpoint {
                    upto: p.events.len(),
                    maps: state
                        .get(&pid)
                        .map(|s| s.values().copied().collect())
                        .unwrap_or_default(),
                });
            }
        }
        for (pid, p) in procs.iter_mut() {
            if p.checkpoints.last().map(|c| c.upto) != Some(p.events.len()) {
                p.checkpoints.push(Checkpoint {
                    upto: p.events.len(),
                    maps: state
                        .get(pid)
                        .map(|s| s.values().copied().collect())
                        .unwrap_or_default(),
                });
            }
        }
        Model {
            procs,
            dsos: self.dsos,
            kernel_ref: self.kernel_ref,
        }
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
        let (maps, from): (&[MapEntry], usize) = match ci.checked_sub(1) {
            Some(i) => (&p.checkpoints[i].maps, p.checkpoints[i].upto),
            None => (&[], 0),
        };
        Some(Space {
            model: self,
            pid,
            depth,
            maps,
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

    /// The whole address space of `pid` as of `key`, sorted, non-overlapping.
    pub fn address_space(&self, pid: u32, key: Key) -> Vec<MapEntry> {
        self.address_space_depth(pid, key, 0)
            .into_values()
            .collect()
    }

    fn address_space_depth(&self, pid: u32, key: Key, depth: u32) -> BTreeMap<u64, MapEntry> {
        let Some(p) = self.procs.get(&pid) else {
            return BTreeMap::new();
        };
        let n = p.events.partition_point(|e| e.key <= key);
        let ci = p.checkpoints.partition_point(|c| c.upto <= n);
        let (mut state, from): (BTreeMap<u64, MapEntry>, usize) = match ci.checked_sub(1) {
            Some(i) => (
                p.checkpoints[i]
                    .maps
                    .iter()
                    .map(|m| (m.start, *m))
                    .collect(),
                p.checkpoints[i].upto,
            ),
            None => (BTreeMap::new(), 0),
        };
        for ev in &p.events[from..n] {
            match ev.kind {
                EventKind::Map(m) => overlay(&mut state, m),
                EventKind::Exec => state.clear(),
                EventKind::Fork { parent } => {
                    state = if depth >= MAX_FORK_DEPTH || parent == pid {
                        BTreeMap::new()
                    } else {
                        self.address_space_depth(parent, ev.key, depth + 1)
                    };
                }
            }
        }
        state
    }

    /// Number of processes (the kernel counts as one).
    pub fn process_count(&self) -> usize {
        self.procs.len()
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
        b.mmap((10, 1), misc::USER, &mm(1, 0x1000, 0x1000, b"/bin/a"));
        b.mmap((20, 2), misc::USER, &mm(1, 0x1000, 0x1000, b"/bin/b"));
        b.fork((15, 3), 2, 1);
        b.exec((30, 4), 1);
        b.mmap((40, 5), misc::USER, &mm(1, 0x2000, 0x1000, b"//anon"));
        let m = b.build();
        assert_eq!(name(&m, m.lookup(1, 0x1800, (5, 0))), None);
        assert_eq!(name(&m, m.lookup(1, 0x1800, (12, 9))), Some("/bin/a"));
        assert_eq!(name(&m, m.lookup(1, 0x1800, (25, 9))), Some("/bin/b"));
        assert_eq!(m.lookup(1, 0x1800, (35, 9)), None);
        // The child sees the parent as of the fork, not the later remap.
        assert_eq!(name(&m, m.lookup(2, 0x1800, (99, 9))), Some("/bin/a"));
        let space: Vec<_> = m
            .address_space(2, (99, 9))
            .iter()
            .map(|e| (e.start, e.end))
            .collect();
        assert_eq!(space, vec![(0x1000, 0x2000)]);
        assert_eq!(m.address_space(1, (35, 9)), vec![]);
        assert_ne!(m.version(1, (12, 9)), m.version(1, (25, 9)));
        // Anonymous memory is a mapping without a DSO.
        assert!(
            m.lookup(1, 0x2000, (99, 9))
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
    fn many_events_use_checkpoints() {
        let mut b = ModelBuilder::new();
        for i in 0..1000u64 {
            b.mmap((i, i), misc::USER, &mm(7, 0x10000 * i, 0x1000, b"/lib/x"));
        }
        let m = b.build();
        for i in (0..1000u64).step_by(37) {
            assert!(m.lookup(7, 0x10000 * i + 5, (i, i)).is_some());
            assert!(
                m.lookup(7, 0x10000 * i + 5, (i.wrapping_sub(1), 0))
                    .is_none()
                    || i == 0
            );
        }
    }
}
