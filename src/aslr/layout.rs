//! The remapped address layout of `--aslr`, as perf 7.3's `perf inject --aslr` assigns
//! it (`tools/perf/util/aslr.c`; docs/aslr.md has the semantics and how each was
//! checked against perf 7.3.4). Pure: no I/O, no records; the caller hands it the
//! mapping events of a recording with their ordering [`Key`]s and asks for new starts
//! and remapped addresses.
//!
//! perf's rules, as reproduced here:
//! - Events are taken in perf's processing order: time, then file order (perf's
//!   ordered events); [`LayoutBuilder::build`] sorts them by [`Key`] so the caller may
//!   push them in file order.
//! - Every address space has its own *top*: each process (keyed by pid; threads share
//!   their process's) and the kernel (one for the machine). The first mapping of a
//!   space starts at the base ([`Config::user_base`], 0x200000; [`Config::kernel_base`],
//!   0xffff800010000000 on a 64-bit kernel); the top is then the highest remapped end.
//! - A mapping is keyed by (space, DSO, invariant): the invariant is `start - pgoff`
//!   for a file (constant over the pieces perf splits a map into), `start` for
//!   anonymous and no-DSO memory (`//anon`, `/dev/zero*`, `/anon_hugepage*`, `[stack*`,
//!   `/SYSV*`, `[heap]`). A key seen before in the space keeps its shift: the mapping's
//!   new start is `start + shift` (so the segments of one library keep their distances),
//!   and the top grows if it ends past it. A new key gets the top rounded up to a page,
//!   plus one page unless a mapping of the space (as perf's machine holds it, the new one
//!   already inserted) ends exactly at `start` in the original layout.
//! - An address is remapped through the map that covers it at that time (the newest
//!   mapping laid over it; an exec does not clear a process's maps in perf, nor reset
//!   its top), by that map's key's shift. An address in no map, or in a map whose key
//!   has no shift in the address's space, is `None`: perf writes 0 there.
//! - A fork copies the parent's maps into the child, but perf 7.3 keys its table by the
//!   child's own pid, so the child finds none of the shifts of what it inherited: its
//!   samples in inherited maps become 0 ([`Inherit::Perf73`], measured on perf 7.3.4).
//!   [`Inherit::Parent`] gives the child its parent's shifts and top instead, so a forked
//!   worker keeps its stacks (what pdinject can do better; it departs from perf's bytes).
//!
//! Deterministic: the answer depends only on the events and their keys, never on the
//! order of pushes with distinct keys, a hash order or a thread count.

use crate::model::Key;
use crate::resolve::callchain::Space;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

/// perf's user-space base (`user_space_start`).
pub(crate) const USER_BASE: u64 = 0x20_0000;
/// perf's kernel base on a 64-bit kernel (`kernel_space_start_64`).
pub(crate) const KERNEL_BASE_64: u64 = 0xffff_8000_1000_0000;

/// The kernel's layout, apart from every pid's (a sample without a pid is pid -1, and
/// its user addresses are not the kernel's).
const KERNEL_SPACE: u64 = u64::MAX;

/// The layout of `space` for process `pid`.
fn space_id(pid: u32, space: Space) -> u64 {
    match space {
        Space::Kernel => KERNEL_SPACE,
        Space::User => u64::from(pid),
    }
}

/// The DSO of a place perf's machine holds no map at (its key's DSO is NULL).
const NO_DSO: u32 = u32::MAX;

/// What a forked child's inherited maps remap to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Inherit {
    /// As perf 7.3: the child has no shifts of its own for what it inherited (its
    /// samples there are `None`, 0 in perf's output) and its own top starts at the base.
    #[default]
    Perf73,
    /// The child starts with a copy of its parent's shifts and top at the fork.
    Parent,
}

/// The constants of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// Page size of the machine perf inject ran on (`sysconf(_SC_PAGESIZE)`: 4096 on
    /// x86-64); the gaps and roundings use it.
    pub page: u64,
    /// First address of every process's layout.
    pub user_base: u64,
    /// First address of the kernel's layout. perf 7.3 starts a 32-bit kernel's at
    /// 0x8000_0000 (`kernel_space_start_32`, from the header's arch); pdinject
    /// starts every kernel's at [`KERNEL_BASE_64`], as no recording here is 32-bit.
    pub kernel_base: u64,
    /// Forked children.
    pub inherit: Inherit,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            page: 4096,
            user_base: USER_BASE,
            kernel_base: KERNEL_BASE_64,
            inherit: Inherit::Perf73,
        }
    }
}

/// How perf keys a mapping and what its record's pgoff holds (see [`MapClass::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapClass {
    /// The invariant is the start (anonymous or no-DSO memory as perf's map names
    /// it), not `start - pgoff`.
    pub keyed_by_start: bool,
    /// The record's pgoff holds an address (anonymous or no-DSO memory by the
    /// record's name, or kernel-space memory that is not a module): perf writes the
    /// new start there.
    pub pgoff_is_addr: bool,
}

/// perf's `is_anon_memory()`.
pub(crate) fn is_anon(name: &[u8]) -> bool {
    name == b"//anon" || name.starts_with(b"/dev/zero") || name.starts_with(b"/anon_hugepage")
}

/// perf's `is_no_dso_memory()`.
pub(crate) fn is_no_dso(name: &[u8]) -> bool {
    name.starts_with(b"[stack") || name.starts_with(b"/SYSV") || name == b"[heap]"
}

/// perf's `is_kernel_module()` for a kernel-space name: a `.ko` file (compressed or
/// not), or a bracketed name that is not the kernel's, the vdso's or vsyscall's.
pub(crate) fn is_kernel_module(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    if base.first() == Some(&b'[') {
        let not = [
            &b"[kernel.kallsyms"[..],
            b"[guest.kernel.kallsyms",
            b"[vdso",
            b"[vsyscall]",
        ];
        return !not.iter().any(|p| base.starts_with(p));
    }
    [".ko", ".ko.gz", ".ko.xz", ".ko.zst", ".ko.bz2"]
        .iter()
        .any(|s| base.ends_with(s.as_bytes()))
}

impl MapClass {
    /// The class of a mapping record named `name` (as recorded), executable or not, in
    /// kernel space or not. perf renames an executable anonymous or no-DSO user map
    /// `/tmp/perf-PID.map` (a JIT's code), which is then keyed like a file (by
    /// `start - pgoff`, and its pgoff holds its start: every such map of a process
    /// shares the first one's shift), while its record's pgoff is still rewritten.
    pub(crate) fn of(name: &[u8], exec: bool, kernel: bool) -> MapClass {
        let anon = is_anon(name) || is_no_dso(name);
        MapClass {
            keyed_by_start: anon && (kernel || !exec),
            pgoff_is_addr: anon || (kernel && !is_kernel_module(name)),
        }
    }
}

/// One event of the layout, in the recording's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// An MMAP or MMAP2 record (kernel space when its cpumode is the kernel's, or the
    /// guest kernel's), or a KSYMBOL registration (kernel space, pgoff 0, the symbol's
    /// own DSO).
    Map {
        /// The process (ignored in kernel space).
        pid: u32,
        /// Which layout.
        space: Space,
        /// Original start.
        start: u64,
        /// Length.
        len: u64,
        /// The record's pgoff.
        pgoff: u64,
        /// The DSO as perf's machine would find it (the caller interns names, and
        /// identities where perf tells two files of one name apart).
        dso: u32,
        /// How it is keyed.
        class: MapClass,
    },
    /// A KSYMBOL unregistration: the map at `addr` leaves the kernel's maps (perf
    /// places the record's address first, while the map is still there).
    Unmap {
        /// The symbol's address.
        addr: u64,
        /// The symbol's length.
        len: u64,
    },
    /// The end of process `pid`: an EXIT of its leader thread (tid == pid). perf
    /// removes the thread, and a later record of the pid starts a thread with no maps
    /// (a sample of the leader after its EXIT is 0 in perf's output); the pid's places
    /// and top stay. The process's other threads share the maps and keep them until
    /// the space changes again ([`Thread::Other`]: a multi-threaded process's last
    /// samples come after its leader's EXIT).
    Exit {
        /// The process.
        pid: u32,
    },
    /// A new process `pid` forked from `parent` (a FORK whose pid differs from its
    /// ppid; a new thread of a process is not an event).
    Fork {
        /// The child.
        pid: u32,
        /// The parent.
        parent: u32,
    },
}

/// What [`Layout::mapped`] answers for a mapping event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// The new start (perf's `aslr_tool__findnew_mapping`).
    pub start: u64,
    /// The pgoff to write: the new start when [`MapClass::pgoff_is_addr`], else the
    /// record's.
    pub pgoff: u64,
}

/// Collects the events of a recording; [`LayoutBuilder::build`] lays them out.
#[derive(Debug, Default)]
pub(crate) struct LayoutBuilder {
    cfg: Config,
    events: Vec<(Key, Event)>,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    start: u64,
    end: u64,
    dso: u32,
    /// `start - pgoff` of the mapping it came from, or its own start when keyed so.
    inv: u64,
    /// Keyed by its start (anonymous or no-DSO memory).
    by_start: bool,
    /// Visible to lookups at versions in `born+1..=died` (see `Layout::version`).
    born: u32,
    died: u32,
}

#[derive(Clone, Copy, Debug)]
struct Shift {
    shift: u64,
    created: u32,
}

#[derive(Debug, Default)]
struct AddrSpace {
    /// Every piece ever visible, in birth order.
    pieces: Vec<Piece>,
    /// The visible pieces after the last event laid, by start (indices into `pieces`).
    alive: BTreeMap<u64, usize>,
    /// After building: `pieces` indices sorted by start, and the running maximum of
    /// their ends (a lookup walks back from the last start <= addr while that
    /// maximum is past it).
    by_start: Vec<usize>,
    max_end: Vec<u64>,
    top: Option<u64>,
    shifts: HashMap<(u32, u64), Shift>,
    /// The events that changed the space, in order, and whether each was its
    /// leader's EXIT (see [`AddrSpace::threads_version`]).
    changes: Vec<(u32, bool)>,
}

impl AddrSpace {
    /// The version the process's other threads see at `v`: perf removes the leader's
    /// thread at its EXIT, but a thread it already had shares the maps and keeps
    /// them, so until the space changes again they see it as before the EXIT (the
    /// samples of a multi-threaded process's last moments).
    fn threads_version(&self, v: u32) -> u32 {
        let i = self.changes.partition_point(|&(at, _)| at < v);
        match i.checked_sub(1).map(|j| self.changes[j]) {
            Some((exit, true)) => exit,
            _ => v,
        }
    }

    fn covering_now(&self, addr: u64) -> Option<&Piece> {
        let (_, &i) = self.alive.range(..=addr).next_back()?;
        let p = &self.pieces[i];
        (addr < p.end).then_some(p)
    }

    /// Lays `[start, end)` over the visible pieces at event `at`: what it covers dies,
    /// what sticks out of it lives on as new pieces (perf's
    /// `maps__fixup_overlap_and_insert`; a file piece keeps its invariant, an
    /// anonymous one cut at its front is keyed by its new start).
    fn lay(&mut self, at: u32, new: Piece) {
        let hit: Vec<usize> = self
            .alive
            .range(..new.end)
            .rev()
            .map(|(_, &i)| i)
            .take_while(|&i| self.pieces[i].end > new.start)
            .collect();
        for i in hit {
            let old = self.pieces[i];
            self.alive.remove(&old.start);
            self.pieces[i].died = at;
            if old.start < new.start {
                self.add(Piece {
                    end: new.start,
                    born: at,
                    ..old
                });
            }
            if old.end > new.end {
                self.add(Piece {
                    start: new.end,
                    inv: if old.by_start { new.end } else { old.inv },
                    born: at,
                    ..old
                });
            }
        }
        self.add(new);
    }

    fn add(&mut self, p: Piece) {
        self.pieces.push(p);
        self.alive.insert(p.start, self.pieces.len() - 1);
    }

    /// perf's `aslr_tool__findnew_mapping` for a mapping event at `start` whose map (if
    /// any) is already laid: the shift of the covering map's key, or a new place at the
    /// top (the base for the space's first), with a page gap unless a map ends at
    /// `start`. A start in no map is keyed by itself under no DSO.
    fn findnew(&mut self, at: u32, start: u64, len: u64, base: u64, page: u64) -> u64 {
        let round = |a: u64| a.wrapping_add(page - 1) & !(page - 1);
        let key = self
            .covering_now(start)
            .map_or((NO_DSO, start), |p| (p.dso, p.inv));
        if let Some(sh) = self.shifts.get(&key) {
            let new = start.wrapping_add(sh.shift);
            if let Some(t) = self.top.as_mut() {
                *t = (*t).max(new.wrapping_add(len));
            }
            return new;
        }
        let new = match self.top {
            Some(top) => {
                let contiguous = start
                    .checked_sub(1)
                    .and_then(|a| self.covering_now(a))
                    .is_some_and(|p| p.end == start);
                round(top) + if contiguous { 0 } else { page }
            }
            None => round(base),
        };
        let end = new.wrapping_add(len);
        self.top = Some(self.top.map_or(end, |t| t.max(end)));
        self.shifts.insert(
            key,
            Shift {
                shift: new.wrapping_sub(start),
                created: at,
            },
        );
        new
    }

    fn remove_at(&mut self, at: u32, addr: u64) {
        if let Some((&s, &i)) = self.alive.range(..=addr).next_back()
            && addr < self.pieces[i].end
        {
            self.alive.remove(&s);
            self.pieces[i].died = at;
        }
    }

    fn freeze(&mut self) {
        let mut idx: Vec<usize> = (0..self.pieces.len()).collect();
        idx.sort_by_key(|&i| (self.pieces[i].start, i));
        let mut m = 0;
        self.max_end = idx
            .iter()
            .map(|&i| {
                m = m.max(self.pieces[i].end);
                m
            })
            .collect();
        self.by_start = idx;
    }

    /// The newest piece covering `addr` at version `v`.
    fn covering_at(&self, addr: u64, v: u32) -> Option<&Piece> {
        let n = self
            .by_start
            .partition_point(|&i| self.pieces[i].start <= addr);
        let mut best: Option<&Piece> = None;
        for k in (0..n).rev() {
            if self.max_end[k] <= addr {
                break;
            }
            let p = &self.pieces[self.by_start[k]];
            if addr < p.end && p.born < v && v <= p.died {
                // Visible pieces never overlap; the newest birth wins a tie anyway.
                if best.is_none_or(|b| p.born > b.born) {
                    best = Some(p);
                }
            }
        }
        best
    }

    /// Around an `addr` no piece visible at `v` covers: a range `[lo, hi)` holding it
    /// that no piece visible at `v` touches (a callchain's addresses outside every
    /// map, a stack's or a heap's, come again and again: half the lookups of a
    /// frame-pointer recording).
    fn gap_at(&self, addr: u64, v: u32) -> (u64, u64) {
        let visible = |p: &Piece| p.born < v && v <= p.died;
        let n = self
            .by_start
            .partition_point(|&i| self.pieces[i].start <= addr);
        // Below: every visible piece starting at or before `addr` ends at or before it.
        let mut lo = 0;
        for k in (0..n).rev() {
            if self.max_end[k] <= addr {
                lo = lo.max(self.max_end[k]);
                break;
            }
            let p = &self.pieces[self.by_start[k]];
            if visible(p) {
                lo = lo.max(p.end.min(addr));
            }
        }
        // Above: the first visible start, or where the scan stops (starts are sorted).
        let mut hi = u64::MAX;
        for (j, &i) in self.by_start[n..].iter().enumerate() {
            let p = &self.pieces[i];
            if visible(p) || j == GAP_SCAN {
                hi = p.start;
                break;
            }
        }
        (lo, hi)
    }
}

/// How far [`AddrSpace::gap_at`] looks for the next visible piece before it settles
/// for a smaller gap.
const GAP_SCAN: usize = 64;

impl LayoutBuilder {
    /// An empty builder.
    pub(crate) fn new(cfg: Config) -> Self {
        LayoutBuilder {
            cfg,
            events: Vec::new(),
        }
    }

    /// Adds an event at `key` (time, then file order). Two events must not share a key.
    pub(crate) fn push(&mut self, key: Key, ev: Event) {
        self.events.push((key, ev));
    }

    /// Lays every event out in key order.
    pub(crate) fn build(mut self) -> Layout {
        self.events.sort_by_key(|&(k, _)| k);
        let mut l = Layout {
            cfg: self.cfg,
            keys: Vec::with_capacity(self.events.len()),
            placed: Vec::with_capacity(self.events.len()),
            spaces: HashMap::new(),
        };
        l.apply(&self.events);
        l
    }
}

impl Layout {
    /// Lays out `events` (sorted by key, all after the last key laid) after those laid.
    fn apply(&mut self, events: &[(Key, Event)]) {
        for &(key, ev) in events {
            let at = self.keys.len() as u32;
            self.keys.push(key);
            let placed = match ev {
                Event::Map { .. } => Some(self.lay_map(at, ev)),
                Event::Unmap { addr, len } => {
                    let page = self.cfg.page.max(1);
                    let s = self.spaces.entry(KERNEL_SPACE).or_default();
                    let new = s.findnew(at, addr, len, self.cfg.kernel_base, page);
                    s.remove_at(at, addr);
                    Some(Placed {
                        start: new,
                        pgoff: 0,
                    })
                }
                Event::Exit { pid } => {
                    if let Some(s) = self.spaces.get_mut(&u64::from(pid)) {
                        for (_, i) in std::mem::take(&mut s.alive) {
                            s.pieces[i].died = at;
                        }
                        s.changes.push((at, true));
                    }
                    None
                }
                Event::Fork { pid, parent } => {
                    self.fork(at, pid, parent);
                    None
                }
            };
            self.placed.push(placed);
        }
        for s in self.spaces.values_mut() {
            s.freeze();
        }
    }

    /// A mapping event (number `at`): laid over its space's pieces, then placed.
    fn lay_map(&mut self, at: u32, ev: Event) -> Placed {
        let Event::Map {
            pid,
            space,
            start,
            len,
            pgoff,
            dso,
            class,
        } = ev
        else {
            return Placed { start: 0, pgoff: 0 };
        };
        let (sid, base) = match space {
            Space::Kernel => (KERNEL_SPACE, self.cfg.kernel_base),
            Space::User => (u64::from(pid), self.cfg.user_base),
        };
        let page = self.cfg.page.max(1);
        let s = self.spaces.entry(sid).or_default();
        s.changes.push((at, false));
        let inv = if class.keyed_by_start {
            start
        } else {
            start.wrapping_sub(pgoff)
        };
        s.lay(
            at,
            Piece {
                start,
                end: start.saturating_add(len),
                dso,
                inv,
                by_start: class.keyed_by_start,
                born: at,
                died: u32::MAX,
            },
        );
        let new_start = s.findnew(at, start, len, base, page);
        Placed {
            start: new_start,
            pgoff: if class.pgoff_is_addr {
                new_start
            } else {
                pgoff
            },
        }
    }

    /// A new process `pid` forked from `parent` at event `at`: perf removes a thread it
    /// already had under that pid and starts the child from a copy of its parent's
    /// maps (and, with [`Inherit::Parent`], its places and top).
    fn fork(&mut self, at: u32, pid: u32, parent: u32) {
        let inherit = self.cfg.inherit;
        let (pieces, inherited) = match self.spaces.get(&u64::from(parent)) {
            Some(p) => (
                p.alive.values().map(|&i| p.pieces[i]).collect::<Vec<_>>(),
                (inherit == Inherit::Parent).then(|| (p.top, p.shifts.clone())),
            ),
            None => (Vec::new(), None),
        };
        let c = self.spaces.entry(u64::from(pid)).or_default();
        c.changes.push((at, false));
        for (_, i) in std::mem::take(&mut c.alive) {
            c.pieces[i].died = at;
        }
        for p in pieces {
            c.add(Piece { born: at, ..p });
        }
        if let Some((top, shifts)) = inherited {
            c.top = top;
            for (k, sh) in shifts {
                c.shifts.insert(
                    k,
                    Shift {
                        shift: sh.shift,
                        created: at,
                    },
                );
            }
        }
    }

    /// Lays out the events of a stream's next batch after those laid: perf places
    /// mappings in time order, so a batch's events must all come after the last key
    /// laid (a batch that ends at a FINISHED_ROUND, whose records perf has all ordered
    /// by then). `Err` with the first key that does not, nothing laid.
    pub(crate) fn extend(&mut self, mut events: Vec<(Key, Event)>) -> Result<(), Key> {
        events.sort_by_key(|&(k, _)| k);
        if let (Some(&last), Some(&(first, _))) = (self.keys.last(), events.first())
            && first <= last
        {
            return Err(first);
        }
        self.apply(&events);
        Ok(())
    }
}

/// A recording's layout: the new place of each mapping event and of any address.
#[derive(Debug)]
pub(crate) struct Layout {
    cfg: Config,
    keys: Vec<Key>,
    placed: Vec<Option<Placed>>,
    spaces: HashMap<u64, AddrSpace>,
}

impl Layout {
    /// The number of events at or before `key`: a lookup at `key` sees them.
    fn version(&self, key: Key) -> u32 {
        self.keys.partition_point(|&k| k <= key) as u32
    }

    /// The new start and pgoff of the mapping event pushed at `key` (`None` for a key
    /// that was no mapping event).
    pub(crate) fn mapped(&self, key: Key) -> Option<Placed> {
        let i = self.keys.binary_search(&key).ok()?;
        self.placed[i]
    }

    /// `addr` of process `pid` in `space`, remapped as of `key` (a sample's time and
    /// place in the file); `None` where perf 7.3 writes 0.
    pub(crate) fn remap_in(&self, pid: u32, space: Space, addr: u64, key: Key) -> Option<u64> {
        let s = self.spaces.get(&space_id(pid, space))?;
        let v = self.version(key);
        let p = s.covering_at(addr, v)?;
        let sh = s.shifts.get(&(p.dso, p.inv))?;
        (sh.created < v).then(|| addr.wrapping_add(sh.shift))
    }

    /// `addr` remapped as perf does a sample's address of cpumode `space`: looked up
    /// there, then (when no map there holds it) in the other space, "to be robust
    /// against a bad cpumode".
    pub(crate) fn remap(&self, pid: u32, space: Space, addr: u64, key: Key) -> Option<u64> {
        let other = match space {
            Space::Kernel => Space::User,
            Space::User => Space::Kernel,
        };
        match self.covers(pid, space, addr, key) {
            true => self.remap_in(pid, space, addr, key),
            false => self.remap_in(pid, other, addr, key),
        }
    }

    /// The layout as lookups at `key` see it (a sample's addresses: the version found
    /// once, the pieces hit remembered).
    pub(crate) fn at(&self, key: Key) -> At<'_> {
        At {
            l: self,
            v: self.version(key),
            thread: Thread::Leader,
            memo: RefCell::new([Hit::NONE; MEMO]),
            next: Cell::new(0),
        }
    }

    /// Whether some map of `space` covers `addr` at `key` (perf's fallback to the
    /// other space happens only when none does, even if the one found has no shift).
    fn covers(&self, pid: u32, space: Space, addr: u64, key: Key) -> bool {
        self.spaces
            .get(&space_id(pid, space))
            .and_then(|s| s.covering_at(addr, self.version(key)))
            .is_some()
    }
}

/// How many pieces an [`At`] remembers: a callchain's frames fall in a few DSOs (the
/// kernel, libc, the program). Without it `--aslr` spent 9 s of 12 on an 855 MB
/// frame-pointer recording looking the same pieces up again (perf record of
/// `pdinject --aslr fp-big.data`: `remap_in`, `remap`, `covering_at`, hashing).
const MEMO: usize = 4;

/// A piece visible at an [`At`]'s version and what it does to an address in it, or
/// a gap no piece visible at it touches. Pieces visible at one version never
/// overlap, so any address in `[start, end)` of that space is in this one.
#[derive(Clone, Copy, Debug)]
struct Hit {
    space: u64,
    /// The thread the lookup was for.
    thread: Thread,
    start: u64,
    end: u64,
    /// A piece covers the range (else it is a gap: the lookup tries the other space).
    covered: bool,
    /// The shift to add, `None` where perf writes 0.
    shift: Option<u64>,
}

impl Hit {
    const NONE: Hit = Hit {
        space: u64::MAX,
        thread: Thread::Leader,
        start: 0,
        end: 0,
        covered: false,
        shift: None,
    };
}

/// The layout at one key: [`Layout::remap`] without finding the version and the same
/// pieces again for each address of a sample.
#[derive(Debug)]
pub(crate) struct At<'a> {
    l: &'a Layout,
    v: u32,
    /// Whose lookups: a process's leader thread, or one of its other threads.
    thread: Thread,
    memo: RefCell<[Hit; MEMO]>,
    next: Cell<usize>,
}

/// Which thread of its process a sample is of (see [`AddrSpace::threads_version`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Thread {
    /// The leader (tid == pid), or a sample without a tid.
    Leader,
    /// Another thread of the process.
    Other,
}

impl At<'_> {
    /// Lookups for a sample of `thread` from now on (what is remembered is by
    /// thread: samples of a process's threads interleave).
    pub(crate) fn set_thread(&mut self, thread: Thread) {
        self.thread = thread;
    }

    /// The view at `key`, keeping what it remembers when no event lies between
    /// (consecutive samples mostly share their version).
    pub(crate) fn move_to(&mut self, key: Key) {
        // Still between the same two events: the version holds (no search).
        let keys = &self.l.keys;
        let v = self.v as usize;
        let after_last = v == 0 || keys[v - 1] <= key;
        let before_next = v == keys.len() || key < keys[v];
        if after_last && before_next {
            return;
        }
        self.v = self.l.version(key);
        *self.memo.get_mut() = [Hit::NONE; MEMO];
    }

    /// [`Layout::remap`] at this key.
    pub(crate) fn remap(&self, pid: u32, space: Space, addr: u64) -> Option<u64> {
        let other = match space {
            Space::Kernel => Space::User,
            Space::User => Space::Kernel,
        };
        let h = self.hit(space_id(pid, space), addr);
        let h = match h.covered {
            true => h,
            false => self.hit(space_id(pid, other), addr),
        };
        h.shift.map(|s| addr.wrapping_add(s))
    }

    /// The version of space `s` this view's thread sees.
    fn version_in(&self, s: &AddrSpace) -> u32 {
        match self.thread {
            Thread::Leader => self.v,
            Thread::Other => s.threads_version(self.v),
        }
    }

    /// What space `id` has at `addr`, remembered or looked up.
    fn hit(&self, id: u64, addr: u64) -> Hit {
        if let Some(h) =
            self.memo.borrow().iter().find(|h| {
                h.space == id && h.thread == self.thread && h.start <= addr && addr < h.end
            })
        {
            return *h;
        }
        let h = match self.l.spaces.get(&id) {
            None => Hit {
                space: id,
                thread: self.thread,
                start: 0,
                end: u64::MAX,
                ..Hit::NONE
            },
            Some(s) => match s.covering_at(addr, self.version_in(s)) {
                Some(p) => Hit {
                    space: id,
                    thread: self.thread,
                    start: p.start,
                    end: p.end,
                    covered: true,
                    shift: s
                        .shifts
                        .get(&(p.dso, p.inv))
                        .filter(|sh| sh.created < self.v)
                        .map(|sh| sh.shift),
                },
                None => {
                    let (start, end) = s.gap_at(addr, self.version_in(s));
                    Hit {
                        space: id,
                        thread: self.thread,
                        start,
                        end,
                        ..Hit::NONE
                    }
                }
            },
        };
        let i = self.next.get();
        self.memo.borrow_mut()[i] = h;
        self.next.set((i + 1) % MEMO);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: MapClass = MapClass {
        keyed_by_start: false,
        pgoff_is_addr: false,
    };
    const ANON: MapClass = MapClass {
        keyed_by_start: true,
        pgoff_is_addr: true,
    };
    const KTEXT: MapClass = MapClass {
        keyed_by_start: false,
        pgoff_is_addr: true,
    };

    fn k(t: u64) -> Key {
        Key::new(t, t)
    }

    fn user(pid: u32, start: u64, len: u64, pgoff: u64, dso: u32) -> Event {
        Event::Map {
            pid,
            space: Space::User,
            start,
            len,
            pgoff,
            dso,
            class: FILE,
        }
    }

    /// fp-med's first process as perf 7.3.4 laid it out (perf script of its output):
    /// bash at 0x200000, then a page gap before each non-contiguous map.
    #[test]
    fn first_process_of_fp_med_as_perf_73_placed_it() {
        let mut b = LayoutBuilder::new(Config::default());
        let maps = [
            (
                0x5582_42c7_9000u64,
                0xc1000u64,
                0x2f000u64,
                1u32,
                0x20_0000u64,
            ),
            (0x7f4d_435c_c000, 0x26000, 0x1000, 2, 0x2c_2000),
            (0x7f4d_435c_9000, 0x2000, 0, 3, 0x2e_9000),
            (0x7f4d_4359_4000, 0x11000, 0xf000, 4, 0x2e_c000),
            (0x7f4d_433c_9000, 0x156000, 0x26000, 5, 0x2f_e000),
        ];
        for (i, &(s, l, o, d, _)) in maps.iter().enumerate() {
            b.push(k(10 + i as u64), user(16285, s, l, o, d));
        }
        b.push(
            k(1),
            Event::Map {
                pid: u32::MAX,
                space: Space::Kernel,
                start: 0xffff_ffff_8100_0000,
                len: 0x1269a88,
                pgoff: 0xffff_ffff_8100_0000,
                dso: 9,
                class: KTEXT,
            },
        );
        let l = b.build();
        for (i, &(s, _, o, _, want)) in maps.iter().enumerate() {
            let p = l.mapped(k(10 + i as u64)).unwrap();
            assert_eq!((p.start, p.pgoff), (want, o), "map {i}");
            // An address inside moves with its map.
            assert_eq!(
                l.remap(16285, Space::User, s + 0x123, k(100)),
                Some(want + 0x123)
            );
        }
        let kp = l.mapped(k(1)).unwrap();
        assert_eq!((kp.start, kp.pgoff), (KERNEL_BASE_64, KERNEL_BASE_64));
        assert_eq!(
            l.remap(16285, Space::Kernel, 0xffff_ffff_815f_f761, k(100)),
            Some(KERNEL_BASE_64 + 0x5f_f761)
        );
        // A user sample's kernel address falls back to the kernel space.
        assert_eq!(
            l.remap(16285, Space::User, 0xffff_ffff_8100_0010, k(100)),
            Some(KERNEL_BASE_64 + 0x10)
        );
        // In no map: perf writes 0.
        assert_eq!(l.remap(16285, Space::User, 0x7ffe_c3d8_6e42, k(100)), None);
        // Before its map was recorded: no map yet.
        assert_eq!(l.remap(16285, Space::User, 0x5582_42c7_9100, k(5)), None);
        // A sample without a pid (-1) has no user maps, and does not see the kernel's
        // as its own: its kernel address is found by the fallback alone.
        assert_eq!(
            l.remap_in(u32::MAX, Space::User, 0xffff_ffff_8100_0010, k(100)),
            None
        );
        // Another process has no maps at all.
        assert_eq!(l.remap(1, Space::User, 0x5582_42c7_9100, k(100)), None);
    }

    /// Segments of one file with one invariant keep their distances; a contiguous
    /// map of another key gets no gap.
    #[test]
    fn one_file_keeps_its_distances_and_contiguous_maps_get_no_gap() {
        let mut b = LayoutBuilder::new(Config::default());
        // r--p at 0x1000_0000 (pgoff 0, 0x3000 long), r-xp at +0x3000 (pgoff 0x3000),
        // then an anonymous map right after it, then a far file.
        b.push(k(1), user(7, 0x1000_0000, 0x3000, 0, 1));
        b.push(k(2), user(7, 0x1000_3000, 0x5000, 0x3000, 1));
        b.push(
            k(3),
            Event::Map {
                pid: 7,
                space: Space::User,
                start: 0x1000_8000,
                len: 0x1800,
                pgoff: 0x1000_8000,
                dso: 2,
                class: ANON,
            },
        );
        b.push(k(4), user(7, 0x5000_0000, 0x1000, 0, 3));
        let l = b.build();
        assert_eq!(l.mapped(k(1)).unwrap().start, 0x20_0000);
        assert_eq!(l.mapped(k(2)).unwrap().start, 0x20_3000);
        let anon = l.mapped(k(3)).unwrap();
        // Contiguous with the file's end: top 0x208000, no gap; its pgoff is its start.
        assert_eq!((anon.start, anon.pgoff), (0x20_8000, 0x20_8000));
        // top 0x209800 rounds to 0x20a000, plus a gap.
        assert_eq!(l.mapped(k(4)).unwrap().start, 0x20_b000);
        assert_eq!(l.remap(7, Space::User, 0x1000_4abc, k(9)), Some(0x20_4abc));
    }

    /// An exec neither clears the maps nor resets the top (perf 7.3.4: `./a` exec'ing
    /// `./b` put b at 0x383000, after a's libc).
    #[test]
    fn exec_continues_from_the_top() {
        let mut b = LayoutBuilder::new(Config::default());
        b.push(k(1), user(5, 0x5638_391f_b000, 0x1000, 0x1000, 1));
        b.push(k(2), user(5, 0x7f6c_fdb8_7000, 0x26000, 0x1000, 2));
        b.push(k(3), user(5, 0x7f6c_fdb8_4000, 0x2000, 0, 3));
        b.push(k(4), user(5, 0x7f6c_fd9b_7000, 0x156000, 0x26000, 4));
        // exec: nothing to tell the layout
        b.push(k(5), user(5, 0x5564_4897_6000, 0x1000, 0x1000, 5));
        b.push(k(6), user(5, 0x7f13_97b3_6000, 0x26000, 0x1000, 2));
        let l = b.build();
        let got: Vec<u64> = (1..=6).map(|t| l.mapped(k(t)).unwrap().start).collect();
        assert_eq!(
            got,
            [
                0x20_0000, 0x20_2000, 0x22_9000, 0x22_c000, 0x38_3000, 0x38_5000
            ]
        );
        // The old image's libc is still a map of the process for perf.
        assert_eq!(
            l.remap(5, Space::User, 0x7f6c_fd9b_7010, k(9)),
            Some(0x22_c010)
        );
    }

    /// A forked child: perf 7.3 finds no shift for its inherited maps (0 in its
    /// output); Inherit::Parent gives it the parent's.
    #[test]
    fn forked_child_inherits_maps_but_not_shifts_in_perf73() {
        for inherit in [Inherit::Perf73, Inherit::Parent] {
            let mut b = LayoutBuilder::new(Config {
                inherit,
                ..Config::default()
            });
            b.push(k(1), user(10, 0x55f8_337f_a000, 0x1000, 0x1000, 1));
            b.push(
                k(2),
                Event::Fork {
                    pid: 11,
                    parent: 10,
                },
            );
            // A map the parent makes after the fork is not the child's.
            b.push(k(3), user(10, 0x7000_0000, 0x1000, 0, 2));
            // The child's own new map: a fresh top in perf 7.3, after the parent's in
            // Parent mode.
            b.push(k(4), user(11, 0x7100_0000, 0x1000, 0, 3));
            let l = b.build();
            let ip = 0x55f8_337f_a17a;
            assert_eq!(l.remap(10, Space::User, ip, k(9)), Some(0x20_017a));
            assert_eq!(l.remap(11, Space::User, 0x7000_0010, k(9)), None);
            let (child_ip, child_map) = match inherit {
                Inherit::Perf73 => (None, 0x20_0000),
                Inherit::Parent => (Some(0x20_017a), 0x20_2000),
            };
            assert_eq!(l.remap(11, Space::User, ip, k(9)), child_ip, "{inherit:?}");
            assert_eq!(l.mapped(k(4)).unwrap().start, child_map, "{inherit:?}");
            // Before the fork the child had nothing.
            assert_eq!(l.remap(11, Space::User, ip, k(1)), None);
        }
    }

    /// After its EXIT a process has no maps (perf removed its thread), but keeps its
    /// places: a map of the same key later is placed where it was.
    #[test]
    fn exit_clears_the_maps_not_the_places() {
        let mut b = LayoutBuilder::new(Config::default());
        b.push(k(1), user(10, 0x7f00_0000_0000, 0x1000, 0, 1));
        b.push(k(2), Event::Exit { pid: 10 });
        b.push(k(3), user(10, 0x7f00_0000_0000, 0x1000, 0, 1));
        let l = b.build();
        let a = 0x7f00_0000_0010;
        assert_eq!(l.remap(10, Space::User, a, k(1)), Some(0x20_0010));
        assert_eq!(l.remap(10, Space::User, a, k(2)), None);
        assert_eq!(l.mapped(k(3)).unwrap().start, 0x20_0000);
        assert_eq!(l.remap(10, Space::User, a, k(3)), Some(0x20_0010));
    }

    /// The process's other threads keep the maps past their leader's EXIT (perf's
    /// threads share them), until the pid's space changes again.
    #[test]
    fn other_threads_keep_the_maps_past_their_leaders_exit() {
        let mut b = LayoutBuilder::new(Config::default());
        b.push(k(1), user(10, 0x7f00_0000_0000, 0x1000, 0, 1));
        b.push(k(2), Event::Exit { pid: 10 });
        b.push(k(4), user(10, 0x7e00_0000_0000, 0x1000, 0, 2));
        let l = b.build();
        let look = |key, thread| {
            let mut at = l.at(key);
            at.set_thread(thread);
            at.remap(10, Space::User, 0x7f00_0000_0010)
        };
        assert_eq!(look(k(3), Thread::Leader), None);
        assert_eq!(look(k(3), Thread::Other), Some(0x20_0010));
        // A map of the pid after the EXIT: a new state of the space, for every thread.
        assert_eq!(look(k(5), Thread::Other), None);
    }

    /// A map laid over part of another: the file's pieces keep its shift, the
    /// anonymous map's tail piece (keyed by its new start) has none.
    #[test]
    fn overlapped_maps_split_as_perf_splits_them() {
        let mut b = LayoutBuilder::new(Config::default());
        b.push(k(1), user(3, 0x1000_0000, 0x10000, 0, 1));
        b.push(
            k(2),
            Event::Map {
                pid: 3,
                space: Space::User,
                start: 0x2000_0000,
                len: 0x10000,
                pgoff: 0x2000_0000,
                dso: 2,
                class: ANON,
            },
        );
        b.push(k(3), user(3, 0x1000_4000, 0x1000, 0, 3));
        b.push(k(4), user(3, 0x2000_4000, 0x1000, 0, 3));
        let l = b.build();
        let f = l.mapped(k(1)).unwrap().start;
        let a = l.mapped(k(2)).unwrap().start;
        let late = k(9);
        assert_eq!(
            l.remap(3, Space::User, 0x1000_8000, late),
            Some(f + 0x8000),
            "the file's tail piece keeps its shift"
        );
        assert_eq!(l.remap(3, Space::User, 0x2000_0010, late), Some(a + 0x10));
        assert_eq!(
            l.remap(3, Space::User, 0x2000_8000, late),
            None,
            "the anonymous map's tail piece is keyed by a start no map had"
        );
        // Before the second library was laid over it, its place was the first's.
        assert_eq!(l.remap(3, Space::User, 0x1000_4010, k(2)), Some(f + 0x4010));
        let third = l.mapped(k(3)).unwrap().start;
        assert_eq!(
            l.remap(3, Space::User, 0x1000_4010, late),
            Some(third + 0x10)
        );
    }

    /// [`Layout::at`] answers what [`Layout::remap`] answers, whatever it remembers:
    /// every address around every piece's edges, in both spaces, at every key, asked
    /// in one view in an order that makes its memo hit and miss.
    #[test]
    fn a_view_at_a_key_remaps_as_the_layout_does() {
        let mut b = LayoutBuilder::new(Config::default());
        b.push(k(1), user(3, 0x1000_0000, 0x10000, 0, 1));
        b.push(k(2), user(3, 0x1000_4000, 0x1000, 0, 3));
        b.push(k(3), user(3, 0x3000_0000, 0x8000, 0x1000, 2));
        b.push(
            k(4),
            Event::Map {
                pid: 0,
                space: Space::Kernel,
                start: 0xffff_ffff_8100_0000,
                len: 0x100_0000,
                pgoff: 0xffff_ffff_8100_0000,
                dso: 9,
                class: KTEXT,
            },
        );
        b.push(k(5), Event::Exit { pid: 3 });
        b.push(k(6), user(3, 0x1000_2000, 0x1000, 0, 4));
        let l = b.build();
        let mut addrs = Vec::new();
        for base in [
            0x1000_0000u64,
            0x1000_4000,
            0x1000_5000,
            0x3000_0000,
            0x3000_8000,
            0x1000_2000,
            0xffff_ffff_8100_0000,
            0xffff_ffff_8200_0000,
        ] {
            for d in [0u64, 1, 0xfff, 0x1000] {
                addrs.push(base.wrapping_add(d));
                addrs.push(base.wrapping_sub(d + 1));
            }
        }
        let mut moving = l.at(k(0));
        for t in 0..=7 {
            let at = l.at(k(t));
            moving.move_to(k(t));
            for &a in &addrs {
                assert_eq!(
                    moving.remap(3, Space::User, a),
                    l.remap(3, Space::User, a, k(t))
                );
            }
            for round in 0..2 {
                for (i, &a) in addrs.iter().enumerate() {
                    let space = if (i + round) % 3 == 0 {
                        Space::Kernel
                    } else {
                        Space::User
                    };
                    assert_eq!(
                        at.remap(3, space, a),
                        l.remap(3, space, a, k(t)),
                        "{a:#x} in {space:?} at {t}"
                    );
                }
            }
        }
    }

    /// KSYMBOLs: kernel space, pgoff 0, each its own DSO; an unregistered one is gone.
    #[test]
    fn ksymbols_extend_the_kernel_layout_and_leave_it() {
        let mut b = LayoutBuilder::new(Config::default());
        let kmap = |start, len, dso| Event::Map {
            pid: u32::MAX,
            space: Space::Kernel,
            start,
            len,
            pgoff: 0,
            dso,
            class: FILE,
        };
        b.push(k(1), kmap(0xffff_ffff_8100_0000, 0x100_0000, 1));
        b.push(k(2), kmap(0xffff_ffff_c000_1000, 0x800, 2));
        b.push(
            k(3),
            Event::Unmap {
                addr: 0xffff_ffff_c000_1000,
                len: 0x800,
            },
        );
        let l = b.build();
        assert_eq!(
            l.mapped(k(3)),
            l.mapped(k(2)).map(|p| Placed { pgoff: 0, ..p })
        );
        assert_eq!(l.mapped(k(2)).unwrap().start, KERNEL_BASE_64 + 0x100_1000);
        assert_eq!(
            l.remap(1, Space::Kernel, 0xffff_ffff_c000_1010, k(2)),
            Some(KERNEL_BASE_64 + 0x100_1010)
        );
        assert_eq!(l.remap(1, Space::Kernel, 0xffff_ffff_c000_1010, k(3)), None);
    }

    #[test]
    fn classes_by_name() {
        let c = MapClass::of(b"//anon", false, false);
        assert!(c.keyed_by_start && c.pgoff_is_addr);
        let jit = MapClass::of(b"//anon", true, false);
        assert!(!jit.keyed_by_start && jit.pgoff_is_addr);
        assert!(MapClass::of(b"[heap]", false, false).keyed_by_start);
        let k = MapClass::of(b"[kernel.kallsyms]_text", true, true);
        assert!(!k.keyed_by_start && k.pgoff_is_addr);
        let m = MapClass::of(b"/lib/modules/6.1/kernel/fs/xfs.ko.zst", true, true);
        assert!(!m.pgoff_is_addr);
        assert!(!MapClass::of(b"/usr/lib/libc.so.6", true, false).pgoff_is_addr);
        assert!(is_kernel_module(b"[xfs]") && !is_kernel_module(b"[vdso]"));
    }

    /// A stream laid out batch by batch is laid out as a whole; a batch reaching back
    /// before the last key laid is refused.
    #[test]
    fn extending_by_batches_is_building_at_once() {
        let evs: Vec<(Key, Event)> = (0..30u64)
            .map(|i| {
                let ev = if i == 10 {
                    Event::Fork { pid: 1, parent: 0 }
                } else {
                    user(
                        (i % 2) as u32,
                        0x4000_0000 + (i * 13 % 29) * 0x10000,
                        0x3000,
                        0,
                        i as u32 % 4,
                    )
                };
                (k(i), ev)
            })
            .collect();
        let mut b = LayoutBuilder::new(Config::default());
        for &(key, ev) in &evs {
            b.push(key, ev);
        }
        let whole = b.build();
        let mut parts = LayoutBuilder::new(Config::default()).build();
        for batch in evs.chunks(7) {
            parts.extend(batch.to_vec()).unwrap();
        }
        for t in 0..30 {
            assert_eq!(whole.mapped(k(t)), parts.mapped(k(t)));
            for a in [0x4000_1000u64, 0x4005_2000, 0x401c_0010] {
                for pid in [0, 1] {
                    assert_eq!(
                        whole.remap(pid, Space::User, a, k(t)),
                        parts.remap(pid, Space::User, a, k(t))
                    );
                }
            }
        }
        assert_eq!(parts.extend(vec![(k(29), evs[0].1)]), Err(k(29)));
    }

    /// The same events pushed in any order give the same layout.
    #[test]
    fn push_order_does_not_matter() {
        let evs: Vec<(Key, Event)> = (0..40u64)
            .map(|i| {
                (
                    k(i),
                    user(
                        (i % 3) as u32,
                        0x4000_0000 + (i * 7919 % 97) * 0x10000,
                        0x3000,
                        0,
                        i as u32 % 5,
                    ),
                )
            })
            .collect();
        let lay = |order: &[usize]| {
            let mut b = LayoutBuilder::new(Config::default());
            for &i in order {
                b.push(evs[i].0, evs[i].1);
            }
            let l = b.build();
            (0..40u64).map(|t| l.mapped(k(t))).collect::<Vec<_>>()
        };
        let fwd: Vec<usize> = (0..40).collect();
        let rev: Vec<usize> = (0..40).rev().collect();
        assert_eq!(lay(&fwd), lay(&rev));
    }
}
