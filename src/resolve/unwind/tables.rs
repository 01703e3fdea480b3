//! Loading and proving unwind tables: each DSO's unwind sections, read once from a
//! file proven to be the recorded one (the rules the IDs obey), shared by every
//! worker, and checked again once the whole recording is known
//! ([`UnwindTables::still_proven`]). The workers get them here: a worker meets a DSO
//! through the tables, and workers are parked with them between passes
//! ([`WorkerSlots`]).

use super::arch::{Arch, ArchState};
use super::image::{Image, Shared, Worker};
use super::types::{Bytes, DsoUnwind, IMAGE_SLOT, image_addr};
use crate::buildid::elf::{
    CtimeEvidence, FileTimes, Place, Vouchers, judge, open_regular, read_build_id,
};
use crate::buildid::memo::{Memo, prove_and_read};
use crate::buildid::{LocalFiles, RecordingStart};
use crate::format::Endian;
use crate::model::{Dso, DsoId, DsoKind, Model};
use crate::resolve::cfi::EhFrameRules;
use framehop::{ExplicitModuleSectionInfo, Module};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// Unwind information for every DSO, loaded on first use by whichever worker needs it.
pub(crate) struct UnwindTables {
    pub(super) per_dso: Vec<OnceLock<Option<Arc<DsoUnwind>>>>,
    /// Loaded tables by `(st_dev, st_ino)`: a file reached by several paths (merged
    /// /usr, symlinks, hard links) or mapped under several identities is read once.
    pub(super) by_file: Mutex<HashMap<(u64, u64), Arc<DsoUnwind>>>,
    /// Local files may be read (the recording is of this host) and when it started:
    /// the proof the IDs obey, set for each batch.
    pub(super) local: LocalFiles,
    pub(super) start: RecordingStart,
    /// The run's memo of file proofs, if it keeps one.
    pub(super) memo: Option<Arc<Memo>>,
    /// What may excuse a ctime moved after the start (the run's, as for IDs).
    pub(super) vouchers: Vouchers,
    /// IDs the input's table and `--known-build-ids` give user DSO names
    /// ([`crate::buildid::claimed_user_ids`]): a file whose note carries its name's
    /// is that build.
    pub(super) claimed: Arc<HashMap<String, crate::format::buildid::BuildId>>,
    /// Workers between two runs over these tables: their images and rule caches stay
    /// right (image addresses depend on the DSO only), so a later batch starts warm.
    pub(super) idle: Mutex<Vec<Worker>>,
}

impl Default for UnwindTables {
    /// No tables yet, and no local file trusted until [`UnwindTables::set_proof`].
    fn default() -> Self {
        UnwindTables {
            per_dso: Vec::new(),
            by_file: Mutex::new(HashMap::new()),
            local: LocalFiles::Refused,
            start: RecordingStart::Unknown("not dated yet".into()),
            memo: None,
            vouchers: Vouchers::none(),
            claimed: Arc::default(),
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl UnwindTables {
    /// No tables yet, proving files through `memo` (the run's, if it keeps one) by
    /// the rules the IDs obey, `vouchers` included.
    pub(crate) fn new(memo: Option<Arc<Memo>>, vouchers: Vouchers) -> Self {
        UnwindTables {
            memo,
            vouchers,
            ..UnwindTables::default()
        }
    }

    /// A worker for `arch` for a run sharing `shared`: one parked by an earlier run
    /// over these tables, or a new one.
    pub(crate) fn worker(&self, arch: Arch, shared: &Arc<Shared>) -> Worker {
        let parked = self.idle.lock().ok().and_then(|mut v| {
            let i = v.iter().position(|w| w.arch() == arch)?;
            Some(v.swap_remove(i))
        });
        match parked {
            Some(mut w) => {
                w.shared = shared.clone();
                w
            }
            None => Worker::sharing(arch, shared.clone()),
        }
    }

    /// Parks `w` for the next run over these tables.
    pub(crate) fn park(&self, w: Worker) {
        if let Ok(mut v) = self.idle.lock() {
            v.push(w);
        }
    }

    /// Makes room for DSOs a growing model (pipe mode) added since; tables already
    /// loaded are kept.
    pub(crate) fn grow(&mut self, model: &Model) {
        let n = model.dsos.len();
        if self.per_dso.len() < n {
            self.per_dso.resize_with(n, OnceLock::new);
        }
    }

    /// Sets the proof for the DSOs loaded from now on: whether local files may be
    /// read at all, and the recording's start (an unknown start loads nothing, as it
    /// gives no ID). Tables loaded before keep the proof they were loaded under.
    pub(crate) fn set_proof(&mut self, local: LocalFiles, start: RecordingStart) {
        self.local = local;
        self.start = start;
    }

    /// Sets the IDs the input gives user DSO names ([`crate::buildid::claimed_user_ids`]).
    pub(crate) fn set_claimed(
        &mut self,
        claimed: Arc<HashMap<String, crate::format::buildid::BuildId>>,
    ) {
        self.claimed = claimed;
    }

    /// Whether every table loaded so far would still be loaded under `start` and with
    /// the executable offsets `dsos` now record: tables loaded while a file was being
    /// scanned were proven against the recording's start as far as the scan had seen
    /// it (later than the real one, never earlier) and the offsets mapped so far. The
    /// rules are those of [`prove_and_read`], on what it read.
    pub(crate) fn still_proven(&self, dsos: &[Dso], start: &RecordingStart) -> bool {
        let RecordingStart::Known(start) = *start else {
            return self
                .per_dso
                .iter()
                .all(|t| !matches!(t.get(), Some(Some(_))));
        };
        self.per_dso.iter().zip(dsos).all(|(t, dso)| {
            let Some(Some(t)) = t.get() else {
                return true;
            };
            t.by_id
                || judge(
                    &t.proven,
                    &t.loads,
                    &dso.exec_maps,
                    start,
                    Place::of(&dso.ident),
                    &t.ctime,
                )
                .is_ok()
        })
    }

    pub(super) fn get(&self, model: &Model, d: DsoId) -> Option<&Arc<DsoUnwind>> {
        self.per_dso
            .get(d as usize)?
            .get_or_init(|| self.load(model, d))
            .as_ref()
    }

    pub(super) fn load(&self, model: &Model, d: DsoId) -> Option<Arc<DsoUnwind>> {
        let dso = model.dsos.get(d as usize)?;
        if self.local == LocalFiles::Refused || dso.kind != DsoKind::User {
            return None;
        }
        // Unwind only with a file proven to be the one mapped: wrong CFI would walk
        // into wrong callers.
        let (proven, by_id) = match prove_and_read(
            Path::new(&dso.name),
            &dso.ident,
            &dso.exec_maps,
            &self.start,
            self.memo.as_deref(),
            &self.vouchers,
        ) {
            Ok(p) => (p, false),
            // A mapping the kernel named by its build ID (perf 6.17 on records them
            // so), or a name the input's table or --known-build-ids give an ID: a
            // file with that very ID is that build, whatever its times say (a hard
            // link into a build-ID cache moves a library's ctime: `perf record`
            // links every DSO of its table).
            Err(_) => match (&dso.ident, self.claimed.get(&dso.name)) {
                (crate::format::record::FileIdent::BuildId(id), _) | (_, Some(id)) => {
                    let (file, meta) = open_regular(Path::new(&dso.name)).ok()?;
                    if read_build_id(&file).ok()? != *id {
                        return None;
                    }
                    use std::os::unix::fs::MetadataExt;
                    let key = (meta.dev(), meta.ino());
                    (
                        crate::buildid::elf::Proven {
                            build_id: *id,
                            file: Arc::new(file),
                            key,
                            ctime: CtimeEvidence::default(),
                        },
                        true,
                    )
                }
                _ => return None,
            },
        };
        if let Some(t) = self.by_file.lock().ok()?.get(&proven.key) {
            return Some(t.clone());
        }
        // Loaded outside the lock; a second worker racing on the same file keeps the
        // first copy stored.
        let meta = proven.file.metadata().ok()?;
        let mut t = load_sections(&proven.file, FileTimes::of(&meta))?;
        t.by_id = by_id;
        t.ctime = proven.ctime.clone();
        let t = Arc::new(t);
        Some(
            self.by_file
                .lock()
                .ok()?
                .entry(proven.key)
                .or_insert(t)
                .clone(),
        )
    }
}

// Here, not with the rest of the worker: the image address space stands below the
// tables, and adding a DSO's image is where the two meet.
impl Worker {
    /// Adds DSO `d`'s image, with its unwind tables when it has any.
    pub(super) fn meet(&mut self, model: &Model, tables: &UnwindTables, d: DsoId) {
        let i = d as usize;
        if self.images.len() <= i {
            self.images.resize(i + 1, Image::Unseen);
        }
        if !matches!(self.images[i], Image::Unseen) {
            return;
        }
        let (Some(t), Some(base), Some(dso)) =
            (tables.get(model, d), image_addr(d, 0), model.dsos.get(i))
        else {
            self.images[i] = Image::None;
            return;
        };
        let slot = base..base + IMAGE_SLOT;
        let name = dso.name.clone();
        let module = Module::new(name, slot, base, t.info.clone());
        match &mut self.arch {
            ArchState::X86(a) => {
                let rules = t
                    .rules
                    .get_or_init(|| EhFrameRules::new(&t.info).map(Arc::new))
                    .clone();
                a.add(d, module, rules)
            }
            ArchState::Arm(a) => a.add(d, module, None),
        }
        self.images[i] = Image::Known(t.clone());
    }
}

/// One unwinding worker per pool thread, kept for a whole pass and parked in the
/// tables after it: its caches warm up once (rayon's map_init would start one per
/// split of the work).
pub(crate) struct WorkerSlots {
    shared: Arc<Shared>,
    slots: Vec<std::sync::Mutex<Option<Worker>>>,
}

impl WorkerSlots {
    /// Slots for a pool of `threads` threads.
    pub(crate) fn new(threads: usize) -> Self {
        WorkerSlots {
            shared: Arc::new(Shared::default()),
            slots: (0..threads).map(|_| std::sync::Mutex::new(None)).collect(),
        }
    }

    /// Runs `f` with the calling pool thread's worker (made on first use; `None`
    /// when there is no unwinding). try_lock: a thread that steals work while inside
    /// a chunk (nothing in a chunk waits on the pool today) gets a worker of its
    /// own, parked in the tables after.
    pub(crate) fn with<R>(
        &self,
        unwind: Option<(Arch, &UnwindTables)>,
        f: impl FnOnce(Option<&mut Worker>) -> R,
    ) -> R {
        let slot = rayon::current_thread_index().and_then(|i| self.slots.get(i));
        let mut guard = slot.and_then(|m| m.try_lock().ok());
        let mut own = None;
        let w = match guard.as_deref_mut() {
            Some(w) => w,
            None => &mut own,
        };
        if w.is_none() {
            *w = unwind.map(|(arch, tables)| tables.worker(arch, &self.shared));
        }
        let r = f(w.as_mut());
        if let (Some(w), Some((_, tables))) = (own, unwind) {
            tables.park(w);
        }
        r
    }

    /// Parks every thread's worker in `tables` at the end of the pass.
    pub(crate) fn park_all(self, tables: &UnwindTables) {
        for w in self
            .slots
            .into_iter()
            .filter_map(|m| m.into_inner().ok().flatten())
        {
            tables.park(w);
        }
    }
}

pub(super) fn load_sections(file: &std::fs::File, proven: FileTimes) -> Option<DsoUnwind> {
    let cache = crate::buildid::elf::reader(file);
    let elf = crate::buildid::elf::Elf::parse(&cache).ok()?;
    let segments = elf.load_segments();
    let loads = elf.loads();
    let section = |name: &str, max: u64| -> Option<(Range<u64>, Bytes)> {
        let s = elf.section(name.as_bytes())?;
        // Compressed CFI is not read (object, without its compression feature, did
        // not either).
        if s.size > max || s.compressed {
            return None;
        }
        // Read straight into their buffer: through the ReadCache they were zeroed,
        // read, then copied again. A section without bytes in the file is empty.
        let data = match s.offset {
            Some(at) => crate::buildid::elf::pread_new(file, at, usize::try_from(s.size).ok()?)?,
            None => Vec::new(),
        };
        Some((
            s.address..s.address.checked_add(s.size)?,
            Bytes::whole(data),
        ))
    };
    let mut info = ExplicitModuleSectionInfo::<Bytes> {
        base_svma: 0,
        ..Default::default()
    };
    if let Some((r, b)) = section(".eh_frame", u64::MAX) {
        info.eh_frame_svma = Some(r);
        info.eh_frame = Some(b);
    }
    if let Some((r, b)) = section(".eh_frame_hdr", u64::MAX) {
        info.eh_frame_hdr_svma = Some(r);
        info.eh_frame_hdr = Some(b);
    }
    if let Some((_, b)) = section(".debug_frame", u64::MAX) {
        // framehop reads one CFI section: .eh_frame when present. A library built
        // without unwind tables but with -g has its CFI in .debug_frame, and its
        // .eh_frame only covers the few functions of the crt objects linked in.
        let le = elf.is_little_endian();
        let eh_fdes = info
            .eh_frame
            .as_deref()
            .map_or(0, |d| count_fdes(d, le, false));
        if count_fdes(&b, le, true) > eh_fdes {
            info.eh_frame = None;
            info.eh_frame_svma = None;
            info.eh_frame_hdr = None;
            info.eh_frame_hdr_svma = None;
        }
        info.debug_frame = Some(b);
    }
    // .text is left out: framehop reads instructions only for mach-O compact unwind,
    // and reading cc1's 25 MB of code would cost more than all its samples.
    if let Some(s) = elf.section(b".text") {
        info.text_svma = Some(s.address..s.address.wrapping_add(s.size));
    }
    if let Some(s) = elf.section(b".got") {
        info.got_svma = Some(s.address..s.address.wrapping_add(s.size));
    }
    Some(DsoUnwind {
        segments,
        info,
        rules: OnceLock::new(),
        proven,
        loads,
        by_id: false,
        ctime: Default::default(),
    })
}

/// Counts the FDEs of a CFI section by walking its entry lengths (a CIE has id 0 in
/// `.eh_frame` and 0xffffffff in `.debug_frame`).
pub(super) fn count_fdes(data: &[u8], little: bool, debug_frame: bool) -> usize {
    let e = if little { Endian::Little } else { Endian::Big };
    let (mut off, mut n) = (0usize, 0usize);
    while let Some(len) = e.u32(data, off) {
        if len == 0 {
            if debug_frame {
                off += 4;
                continue;
            }
            break; // .eh_frame terminator
        }
        let (len, id_at, wide) = if len == u32::MAX {
            match e.u64(data, off + 4) {
                Some(l) => (l, off + 12, true),
                None => break,
            }
        } else {
            (len as u64, off + 4, false)
        };
        let id = if wide && debug_frame {
            e.u64(data, id_at)
        } else {
            e.u32(data, id_at).map(u64::from)
        };
        let cie = match id {
            Some(id) if debug_frame => id == if wide { u64::MAX } else { u32::MAX as u64 },
            Some(id) => id == 0,
            None => break,
        };
        n += usize::from(!cie);
        match usize::try_from(len).ok().and_then(|l| id_at.checked_add(l)) {
            Some(next) if next > off => off = next,
            _ => break,
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buildid::elf::Segment;

    #[test]
    fn tables_loaded_early_are_checked_against_the_whole_recording() {
        // A table proven while the scan thought the recording started later, and
        // with fewer executable mappings seen, is kept only if the final start and
        // mappings would have let it be loaded too.
        let t = |mtime, ctime, btime| DsoUnwind {
            segments: vec![(0, 0), (0x1000, 0x1000)],
            info: ExplicitModuleSectionInfo::default(),
            rules: OnceLock::new(),
            proven: FileTimes {
                mtime,
                ctime,
                btime,
            },
            loads: vec![
                Segment {
                    filesz: 0x490,
                    memsz: 0x490,
                    ..Segment::default()
                },
                Segment {
                    offset: 0x1000,
                    vaddr: 0x1000,
                    filesz: 0x189,
                    memsz: 0x189,
                    exec: true,
                },
            ],
            by_id: false,
            ctime: Default::default(),
        };
        let tables = |d: DsoUnwind| UnwindTables {
            per_dso: vec![OnceLock::from(Some(Arc::new(d))), OnceLock::from(None)],
            ..UnwindTables::default()
        };
        let inode = crate::format::record::FileIdent::Inode {
            maj: 8,
            min: 1,
            ino: 42,
            generation: 0,
        };
        let dso = |ident, maps: &[(u64, u64)]| {
            let mut exec_maps = crate::model::ExecMaps::default();
            for &(o, l) in maps {
                exec_maps.add(o, l);
            }
            Dso {
                name: "/lib/x.so".into(),
                kind: DsoKind::User,
                ident,
                exec_maps,
            }
        };
        let at = |ns| RecordingStart::Known(ns);
        let two = |m: &[(u64, u64)]| vec![dso(inode, m), dso(inode, &[(0x5000, 0x1000)])];
        let text = [(0x1000, 0x1000)];
        assert!(tables(t(100, 100, None)).still_proven(&two(&text), &at(150)));
        // Modified after the real start.
        assert!(!tables(t(100, 100, None)).still_proven(&two(&text), &at(99)));
        // Created after it (its mtime set back).
        assert!(!tables(t(100, 120, Some(120))).still_proven(&two(&text), &at(110)));
        // Changed after it: kept only with what excused that when it was loaded (a
        // voucher from before the real start, or --trust-same-layout and the
        // recorded mapping exactly the file's text segment), never when the layout
        // differs or the records name no inode.
        assert!(!tables(t(100, 120, Some(90))).still_proven(&two(&text), &at(110)));
        let excused = |since: Option<i128>, same_layout| {
            let mut d = t(100, 120, Some(90));
            d.ctime = CtimeEvidence {
                voucher: since.map(|since| crate::buildid::vouch::Voucher {
                    since,
                    what: "a test's".into(),
                }),
                same_layout,
            };
            tables(d)
        };
        assert!(excused(Some(105), false).still_proven(&two(&text), &at(110)));
        assert!(!excused(Some(115), false).still_proven(&two(&text), &at(110)));
        assert!(excused(None, true).still_proven(&two(&text), &at(110)));
        assert!(!excused(None, true).still_proven(&two(&[(0x1000, 0x2000)]), &at(110)));
        assert!(!tables(t(100, 120, None)).still_proven(&two(&[(0x1000, 0x2000)]), &at(110)));
        let no_inode = vec![
            dso(crate::format::record::FileIdent::None, &text),
            dso(inode, &[]),
        ];
        assert!(!tables(t(100, 120, None)).still_proven(&no_inode, &at(110)));
        // An offset mapped later that no segment holds.
        let far = [(0x1000, 0x1000), (0x9_0000, 0x1000)];
        assert!(!tables(t(100, 100, None)).still_proven(&two(&far), &at(150)));
        // Undated at the end: nothing loaded may stay.
        let undated = RecordingStart::Unknown("x".into());
        assert!(!tables(t(100, 100, None)).still_proven(&two(&text), &undated));
        assert!(UnwindTables::default().still_proven(&[], &undated));
    }
}
