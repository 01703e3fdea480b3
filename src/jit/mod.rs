//! `--jit`: JIT code named like any DSO (perf's `inject -j, --jit`, docs/jit.md), as a
//! stage of the one engine.
//!
//! A JIT that writes a jitdump (`jit-PID.dump`) maps it once, executable, so that
//! perf records the mapping as a marker. The scan notes the markers and the
//! anonymous maps ([`Stage::mapping`]); once it is done, each marker's dump is read
//! ([`Stage::read`]) and every code load (and move) of it becomes a mapping of the
//! process model at its time, of the process's image (`jit-PID.so`, each load at its
//! own offset on a shelf of every load), while the marker and the process's
//! anonymous maps after it leave the model, as perf's `jit_process` drops them. The
//! one resolve then meets JIT code like any DSO (IPs, callchains, branch stacks,
//! unwound and deferred stacks) and says which loads' offsets samples touched; the
//! choice keeps the records that map them ([`Stage::choose`]; every one with
//! `--jit-maps all`), the image is written with the loads they map, and the sink
//! splices the kept records, in build-ID form, into the data by time ([`Splices`]).
//!
//! Left out with a note (the dump unused, its marker kept, never a wrong symbol): a
//! recording from another host, one not recorded with `perf record -k 1`
//! (CLOCK_MONOTONIC, the jitdump's clock) or without sample-id trailers, a dump that
//! is missing, not a jitdump, of another process, changed between its two reads,
//! written with TSC timestamps or in the other byte order. Records written after the
//! recording's end are left out. A dump cut short is used up to the cut; from the
//! cut on, its code ranges are covered by anonymous maps so that a sample after it
//! never takes the name of code that may have been replaced.

mod dump;
pub(crate) mod image;

use crate::buildid::{Outcome, Reason, Source};
use crate::format::Endian;
use crate::format::attr::{Attr, st};
use crate::format::buildid::BuildId;
use crate::format::jitdump;
use crate::format::record::{FileIdent, Mmap, TrailerLayout, misc, rt};
use crate::model::{DsoId, DsoKind, Key, MapEntry, ModelBuilder};
use crate::options::JitMaps;
use dump::{COVER, Dump, MapRec, Shared};
use std::collections::HashSet;
use std::path::PathBuf;

/// CLOCK_MONOTONIC, the clock of jitdump timestamps.
const CLOCK_MONOTONIC: u32 = 1;
/// attr flag bit `use_clockid`.
const USE_CLOCKID: u64 = 1 << 25;
/// prot of the records: read and execute (samply keeps only executable maps).
const PROT_RX: u32 = 5;
/// flags of the records: MAP_PRIVATE.
const MAP_PRIVATE: u32 = 2;

/// A marker mapping met by the scan.
#[derive(Clone, Debug)]
struct Marker {
    seq: u64,
    pid: u32,
    time: Option<u64>,
    path: Vec<u8>,
}

/// An anonymous mapping, dropped when it follows a used marker of its process.
#[derive(Clone, Copy, Debug)]
struct Anon {
    seq: u64,
    pid: u32,
    time: Option<u64>,
}

/// What the stage needs of the recording once it is scanned.
pub(crate) struct Recording<'a> {
    /// Its events.
    pub attrs: &'a [Attr],
    /// Its HOSTNAME.
    pub hostname: Option<&'a str>,
    /// The newest time of its records.
    pub end_time: u64,
    /// Why every load must be kept whatever samples touch, if so: something looks
    /// code up that the resolve does not (AUX traces, data addresses).
    pub keep_all: Option<&'static str>,
}

/// One dump used: what it was read into and the model's DSOs for it.
struct Used {
    dump: Dump,
    marker: Marker,
    /// The shared image's DSO.
    dso: DsoId,
    /// Each single image's DSO.
    singles: Vec<DsoId>,
    /// Which records are written (`None`: every one).
    kept: Option<Vec<bool>>,
    /// Where the loads of an image written after the choice went: shelf offset,
    /// image offset, sorted by shelf offset.
    placement: Option<Vec<(u64, u64)>>,
    /// Why it was left out after the resolve (its image could not be written).
    left_out: Option<String>,
    /// Records read after samples of their time were resolved (a stream whose JIT
    /// had not yet written them): written whatever samples touched, since a sample
    /// of their code may have been looked up without them.
    forced: Vec<bool>,
}

/// The `--jit` stage of one run.
pub(crate) struct Stage {
    maps: JitMaps,
    markers: Vec<Marker>,
    /// Markers whose dumps were opened (or left out) so far.
    opened: usize,
    anons: Vec<Anon>,
    /// Anonymous maps forgotten by the model so far.
    forgotten: HashSet<u64>,
    used: Vec<Used>,
    end_time: u64,
    keep_all: Option<&'static str>,
    /// What the resolve found in the images so far (a stream's batches add theirs),
    /// and the newest sample time resolved.
    offsets: Vec<(DsoId, u64, u64)>,
    resolved: u64,
    /// Notes for the report.
    pub notes: Vec<String>,
}

/// The records the sink splices into the data, and those it drops.
#[derive(Debug, Default)]
pub(crate) struct Splices {
    /// Records to insert, by time (then dump, then list order): each waits for the
    /// marker of its dump (record number `marker`) and goes before the first record
    /// after it whose time is not earlier.
    pub inserts: Vec<Insert>,
    /// Record numbers of the records dropped: the used markers and the anonymous
    /// maps of their processes after them.
    pub drops: HashSet<u64>,
    /// A stream's records go on as they come, before the dumps are complete: its
    /// inserts go at its end, and its FINISHED_ROUND records are dropped so that
    /// perf sorts every record by time before it uses one (as perf inject --jit
    /// writes its output).
    pub at_end: bool,
}

/// One record to insert.
#[derive(Debug)]
pub(crate) struct Insert {
    /// Its time.
    pub time: u64,
    /// The record number of its dump's marker.
    pub marker: u64,
    /// The record.
    pub bytes: Vec<u8>,
}

fn is_anon_name(name: &[u8]) -> bool {
    name.starts_with(b"//anon") || name.starts_with(b"[anon:") || name.starts_with(b"/memfd:")
}

impl Stage {
    /// A stage that writes the records `maps` says.
    pub(crate) fn new(maps: JitMaps) -> Self {
        Stage {
            maps,
            markers: Vec::new(),
            opened: 0,
            anons: Vec::new(),
            forgotten: HashSet::new(),
            used: Vec::new(),
            end_time: 0,
            keep_all: None,
            offsets: Vec::new(),
            resolved: 0,
            notes: Vec::new(),
        }
    }

    /// The scan met mapping record number `seq` of `cpumode` at `time`.
    pub(crate) fn mapping(&mut self, seq: u64, cpumode: u16, m: &Mmap<'_>, time: Option<u64>) {
        if cpumode != misc::USER {
            return;
        }
        if jitdump::marker_pid(m.filename) == Some(m.pid) {
            if !self
                .markers
                .iter()
                .any(|k| k.pid == m.pid && k.path == m.filename)
            {
                self.markers.push(Marker {
                    seq,
                    pid: m.pid,
                    time,
                    path: m.filename.to_vec(),
                });
            }
        } else if is_anon_name(m.filename) {
            self.anons.push(Anon {
                seq,
                pid: m.pid,
                time,
            });
        }
    }

    /// Why the recording's dumps cannot be used, if they cannot.
    fn refusal(rec: &Recording<'_>) -> Option<String> {
        let host = crate::buildid::host::HostInfo::detect();
        match rec.hostname {
            None => return Some("the recording does not say which host it was made on".into()),
            Some(h) if h != host.hostname => {
                return Some(format!(
                    "the recording was made on host '{h}', this is '{}' (a jitdump here is not that process's)",
                    host.hostname
                ));
            }
            Some(_) => {}
        }
        let trailer = rec
            .attrs
            .first()
            .map(|a| TrailerLayout::new(a.sample_type, a.sample_id_all()))
            .unwrap_or_default();
        if trailer.time_at.is_none() || trailer.tid_at.is_none() {
            return Some("the recording's records carry no time and pid (sample_id_all with TID and TIME), so a code load cannot be placed at its time".into());
        }
        if rec.attrs.is_empty()
            || rec
                .attrs
                .iter()
                .any(|a| a.flags & USE_CLOCKID == 0 || a.clockid != CLOCK_MONOTONIC)
        {
            return Some("the recording was not made with perf record -k 1 (CLOCK_MONOTONIC, the clock of jitdump times), so code loads cannot be placed in time".into());
        }
        None
    }

    /// Reads the dumps of the markers the scan met into the model (each process's on
    /// a core of the pool): their loads become mappings, their markers and the
    /// anonymous maps after them leave it. A stream's batches read on from where
    /// the last read stopped; `last` is the input's end.
    pub(crate) fn read(
        &mut self,
        rec: &Recording<'_>,
        b: &mut ModelBuilder,
        pool: &rayon::ThreadPool,
        last: bool,
    ) -> crate::error::Result<()> {
        if self.markers.is_empty() {
            if last {
                self.notes.push(
                    "--jit: no jitdump marker (an executable mapping of a jit-PID.dump by its process) in the recording; nothing injected".into(),
                );
            }
            return Ok(());
        }
        if let Some(why) = Self::refusal(rec) {
            if last {
                self.notes.push(format!("--jit: jitdumps left out: {why}"));
            }
            self.opened = self.markers.len();
            return Ok(());
        }
        self.end_time = if last { rec.end_time } else { u64::MAX };
        // Where stacks are unwound (DWARF user stacks), every load keeps an image of
        // its own, perf's layout: perf's libdw unwinder reports each DSO's ELF at its
        // map's start - pgoff, so the loads of one shared image would be the same
        // ELF at as many overlapping places, which libdw refuses (measured: node,
        // 3,136 of 4,135 chains cut at the first JIT frame).
        let per_load = rec
            .attrs
            .iter()
            .any(|a| a.sample_type & st::STACK_USER != 0);
        let shared = match (per_load, self.maps) {
            (true, _) => Shared::PerLoad,
            (false, JitMaps::Every) => Shared::Now,
            (false, JitMaps::Touched) => Shared::Later,
        };
        self.keep_all = match (per_load, self.maps) {
            (true, _) => {
                Some("the recording has DWARF stacks (the unwinder finds frames in any load)")
            }
            (false, JitMaps::Every) => None,
            (false, JitMaps::Touched) => rec.keep_all,
        };
        self.open_new(b, shared)?;
        let end = self.end_time;
        let read: Vec<Result<usize, String>> = pool.install(|| {
            use rayon::prelude::*;
            self.used
                .par_iter_mut()
                .filter(|u| u.left_out.is_none())
                .map(|u| u.dump.read_more(end, last))
                .collect()
        });
        let mut read = read.into_iter();
        for u in self.used.iter_mut().filter(|u| u.left_out.is_none()) {
            match read.next() {
                Some(Ok(from)) => model_recs(u, from, self.resolved, b)?,
                Some(Err(why)) => {
                    u.left_out = Some(format!("--jit: {} left out: {why}", u.dump.path.display()))
                }
                None => {}
            }
        }
        self.forget_anons(b);
        Ok(())
    }

    /// Opens the dumps of markers met since the last read, and puts their images into
    /// the model as DSOs.
    fn open_new(&mut self, b: &mut ModelBuilder, shared: Shared) -> crate::error::Result<()> {
        let over = |e: crate::limits::Exceeded| e.at(0);
        let new: Vec<Marker> = self.markers[self.opened..].to_vec();
        for m in new {
            use std::os::unix::ffi::OsStrExt;
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(&m.path));
            let dump = match Dump::open(&path, m.pid, shared) {
                Ok(d) => d,
                Err(why) => {
                    self.notes
                        .push(format!("--jit: {} left out: {why}", path.display()));
                    continue;
                }
            };
            let dso = b
                .intern_dso(
                    DsoKind::User,
                    &dump.image.to_string_lossy(),
                    FileIdent::None,
                )
                .map_err(over)?;
            let mut gone: HashSet<u64> = self.anons_after(&m).collect();
            gone.insert(m.seq);
            b.forget(&gone);
            self.forgotten.extend(gone);
            self.used.push(Used {
                dump,
                marker: m,
                dso,
                singles: Vec::new(),
                kept: None,
                placement: None,
                left_out: None,
                forced: Vec::new(),
            });
        }
        self.opened = self.markers.len();
        Ok(())
    }

    /// The anonymous maps of marker `m`'s process after it.
    fn anons_after<'s>(&'s self, m: &'s Marker) -> impl Iterator<Item = u64> + 's {
        self.anons
            .iter()
            .filter(move |a| {
                a.pid == m.pid
                    && match (a.time, m.time) {
                        (Some(t), Some(mt)) => t >= mt,
                        _ => a.seq > m.seq,
                    }
            })
            .map(|a| a.seq)
    }

    /// The model forgets the anonymous maps met since the last read that follow a
    /// used marker (a stream's come batch by batch).
    fn forget_anons(&mut self, b: &mut ModelBuilder) {
        let new: HashSet<u64> = self
            .used
            .iter()
            .flat_map(|u| self.anons_after(&u.marker))
            .filter(|s| !self.forgotten.contains(s))
            .collect();
        if !new.is_empty() {
            b.forget(&new);
            self.forgotten.extend(new);
        }
    }

    /// A resolve found `offsets` in the images, of samples up to time `newest`.
    pub(crate) fn resolved(&mut self, offsets: &[(DsoId, u64, u64)], newest: Option<u64>) {
        self.offsets.extend_from_slice(offsets);
        self.resolved = self.resolved.max(newest.unwrap_or(0));
    }

    /// The DSOs whose touched offsets the resolve must say (the shared images
    /// written after the choice).
    pub(crate) fn offset_dsos(&self) -> Vec<DsoId> {
        if self.keep_all.is_some() {
            return Vec::new();
        }
        self.used
            .iter()
            .filter(|u| u.dump.shared == Shared::Later)
            .map(|u| u.dso)
            .collect()
    }

    /// Keeps the records that samples' addresses lie in (`offsets`: DSO, file offset
    /// and the mapping's start less its pgoff, as the resolve found them), and writes
    /// the images that waited for the choice (each on a core of the pool).
    pub(crate) fn choose(&mut self, pool: &rayon::ThreadPool) {
        let offsets = &self.offsets;
        if let Some(why) = self.keep_all.filter(|_| self.maps == JitMaps::Touched)
            && !self.used.is_empty()
        {
            self.notes
                .push(format!("--jit: every code load gets its record: {why}"));
        }
        let keep_all = self.keep_all.is_some();
        let end = self.end_time;
        let done: Vec<Vec<String>> = pool.install(|| {
            use rayon::prelude::*;
            self.used
                .par_iter_mut()
                .map(|u| {
                    if u.dump.shared != Shared::Later {
                        return Vec::new();
                    }
                    if !keep_all {
                        let mut k = kept(&u.dump.recs, u.dso, offsets);
                        for (k, f) in k.iter_mut().zip(&u.forced) {
                            *k |= f;
                        }
                        u.kept = Some(k);
                    }
                    write_later(u, end)
                })
                .collect()
        });
        self.notes.extend(done.into_iter().flatten());
        for u in &mut self.used {
            if u.left_out.is_none() && u.dump.shared != Shared::Later {
                self.notes.append(&mut u.dump.notes);
                self.notes.push(summary(u));
            }
        }
    }

    /// The answer for DSO `dso` when it is one of the images, with the image open
    /// for the build-ID cache.
    pub(crate) fn outcome(&self, dso: DsoId) -> Option<Outcome> {
        for u in &self.used {
            let found = |path: &std::path::Path, id: BuildId| {
                let mut o = Outcome::found(id, Source::Jit);
                if let Ok(f) = std::fs::File::open(path) {
                    o = o.with_file(f);
                }
                o
            };
            if u.dso == dso {
                return Some(match (&u.left_out, u.dump.id) {
                    (Some(why), _) => Outcome::refused((Reason::Unreadable, why.clone())),
                    (None, Some(id)) => found(&u.dump.image, id),
                    (None, None) => {
                        Outcome::refused((Reason::Unreadable, "no image was written".into()))
                    }
                });
            }
            if let Some(i) = u.singles.iter().position(|&s| s == dso) {
                let (p, id) = &u.dump.singles[i];
                return Some(found(p, *id));
            }
        }
        None
    }

    /// The records to splice into the data, in build-ID form (`e`, `attrs`: the
    /// recording's byte order and events, whose sample-id trailer they carry).
    /// A stream's batches (`Ending`: whether it has ended) drop what they must and
    /// wait for the end to take the inserts.
    pub(crate) fn splices(&self, e: Endian, attrs: &[Attr], stream: Option<bool>) -> Splices {
        let trailer = attrs
            .first()
            .map(|a| TrailerLayout::new(a.sample_type, a.sample_id_all()))
            .unwrap_or_default();
        let mut s = Splices {
            at_end: stream.is_some(),
            ..Splices::default()
        };
        for u in self.used.iter().filter(|u| u.left_out.is_none()) {
            s.drops.insert(u.marker.seq);
            let m = &u.marker;
            s.drops.extend(
                self.anons
                    .iter()
                    .filter(|a| {
                        a.pid == m.pid
                            && match (a.time, m.time) {
                                (Some(t), Some(mt)) => t >= mt,
                                _ => a.seq > m.seq,
                            }
                    })
                    .map(|a| a.seq),
            );
            if stream == Some(false) {
                continue;
            }
            for (i, r) in u.dump.recs.iter().enumerate() {
                if u.kept.as_ref().is_some_and(|k| !k[i]) {
                    continue;
                }
                let mut bytes = Vec::new();
                encode(r, u, e, &trailer, &mut bytes);
                s.inserts.push(Insert {
                    time: r.time,
                    marker: m.seq,
                    bytes,
                });
            }
        }
        // By time; ties keep dump order, then list order (a stable sort).
        s.inserts.sort_by_key(|i| i.time);
        s
    }
}

/// Puts the records of `u` from `from` on into the model, its single images as DSOs;
/// those of a time already resolved are forced (see [`Used::forced`]).
fn model_recs(
    u: &mut Used,
    from: usize,
    resolved: u64,
    b: &mut ModelBuilder,
) -> crate::error::Result<()> {
    let over = |e: crate::limits::Exceeded| e.at(0);
    for (p, id) in &u.dump.singles[u.singles.len()..] {
        let dso = b
            .intern_dso(DsoKind::User, &p.to_string_lossy(), FileIdent::BuildId(*id))
            .map_err(over)?;
        u.singles.push(dso);
    }
    for r in &u.dump.recs[from..] {
        let entry = MapEntry {
            start: r.start,
            end: r.start.saturating_add(r.len),
            pgoff: if r.pgoff == COVER { 0 } else { r.pgoff },
            dso: match (r.pgoff, r.img) {
                (COVER, _) => None,
                (_, 0) => Some(u.dso),
                (_, n) => u.singles.get(n as usize - 1).copied(),
            },
            exec: true,
        };
        b.map(u.marker.pid, Key::new(r.time, 0), entry)
            .map_err(over)?;
        u.forced.push(r.time <= resolved);
    }
    Ok(())
}

/// Which of `recs` a sample lies in: a record is kept when a touched offset lies in
/// its load and the touched mapping has its start less pgoff (a move maps its load's
/// code at another address); a cover when the record it repeats is.
fn kept(recs: &[MapRec], dso: DsoId, offsets: &[(DsoId, u64, u64)]) -> Vec<bool> {
    let mut loads: Vec<(u64, u64)> = recs
        .iter()
        .filter(|r| r.load)
        .map(|r| (r.pgoff, r.len))
        .collect();
    loads.sort_unstable();
    let mut hit: HashSet<(u64, u64)> = HashSet::new();
    for &(d, off, bias) in offsets.iter().filter(|o| o.0 == dso) {
        let _ = d;
        let i = loads.partition_point(|l| l.0 <= off);
        if let Some(&(pg, len)) = i.checked_sub(1).and_then(|i| loads.get(i))
            && off < pg + len
        {
            hit.insert((pg, bias));
        }
    }
    let mut k: Vec<bool> = recs
        .iter()
        .map(|r| r.pgoff != COVER && hit.contains(&(r.pgoff, r.start.wrapping_sub(r.pgoff))))
        .collect();
    // Covers repeat the records before them, in order.
    let n = recs.iter().filter(|r| r.pgoff != COVER).count();
    for i in n..recs.len() {
        k[i] = k.get(i - n).copied().unwrap_or(false);
    }
    k
}

/// Writes a waiting image with the loads its kept records map; a dump that can no
/// longer be read as it was is left out.
fn write_later(u: &mut Used, end_time: u64) -> Vec<String> {
    let mut shelf: Vec<u64> = u
        .dump
        .recs
        .iter()
        .enumerate()
        .filter(|(i, r)| r.pgoff != COVER && u.kept.as_ref().is_none_or(|k| k[*i]))
        .map(|(_, r)| r.pgoff)
        .collect();
    shelf.sort_unstable();
    shelf.dedup();
    if shelf.is_empty() {
        // No sample in its code: no image, no record.
        u.kept = Some(vec![false; u.dump.recs.len()]);
        return vec![format!(
            "--jit: {}: no sample in its {} code loads; no image written",
            u.dump.path.display(),
            u.dump.count.loads
        )];
    }
    match u.dump.write_kept(&shelf, end_time) {
        Ok(image) => {
            u.placement = Some(shelf.iter().copied().zip(image).collect());
            let mut notes = std::mem::take(&mut u.dump.notes);
            notes.push(summary(u));
            notes
        }
        Err(why) => {
            let note = format!("--jit: {} left out: {why}", u.dump.path.display());
            u.left_out = Some(note.clone());
            vec![note]
        }
    }
}

/// The note of a dump used.
fn summary(u: &Used) -> String {
    let d = &u.dump;
    let moves = if d.count.moves > 0 {
        format!(" and {} moves", d.count.moves)
    } else {
        String::new()
    };
    let records = u
        .kept
        .as_ref()
        .map_or(d.recs.len(), |k| k.iter().filter(|&&x| x).count());
    let mut into = Vec::new();
    if let Some(id) = d.id {
        let held = u
            .placement
            .as_ref()
            .map_or(d.count.loads, |p| p.len() as u64);
        into.push(format!(
            "{} (build ID {id}){}",
            d.image.display(),
            if held == d.count.loads {
                String::new()
            } else {
                format!(": of them the {held} that samples touch (--jit-maps all: every one)")
            }
        ));
    }
    if !d.singles.is_empty() {
        into.push(format!(
            "{} images of one load each (jitted-{}-N.so: a recording with DWARF stacks, one image per load as perf's DWARF unwinding needs)",
            d.singles.len(),
            d.pid
        ));
    }
    format!(
        "--jit: {}: {} code loads{moves} into {}; {records} MMAP2 records",
        d.path.display(),
        d.count.loads,
        into.join(" and ")
    )
}

/// An MMAP2 record in build-ID form for `r` of dump `u` (or an anonymous cover).
fn encode(r: &MapRec, u: &Used, e: Endian, trailer: &TrailerLayout, b: &mut Vec<u8>) {
    let d = &u.dump;
    // A load an image written later holds is at its offset there.
    let at = |pg: u64| match &u.placement {
        None => Some(pg),
        Some(p) => p.binary_search_by_key(&pg, |x| x.0).ok().map(|i| p[i].1),
    };
    let image: Option<(Vec<u8>, BuildId, u64)> = match (r.pgoff, r.img) {
        (COVER, _) => None,
        (pg, 0) => {
            d.id.zip(at(pg))
                .map(|(id, off)| (d.image.as_os_str().as_encoded_bytes().to_vec(), id, off))
        }
        (pg, n) => d
            .singles
            .get(n as usize - 1)
            .map(|(p, id)| (p.as_os_str().as_encoded_bytes().to_vec(), *id, pg)),
    };
    let name: &[u8] = image.as_ref().map_or(b"//anon", |(p, _, _)| p);
    let name_len = (name.len() + 1).next_multiple_of(8);
    let size = 8 + 64 + name_len + trailer.size;
    b.clear();
    b.extend_from_slice(&e.put_u32(rt::MMAP2));
    let m = misc::USER
        | if image.is_some() {
            misc::MMAP_BUILD_ID
        } else {
            0
        };
    b.extend_from_slice(&e.put_u16(m));
    b.extend_from_slice(&e.put_u16(size as u16));
    b.extend_from_slice(&e.put_u32(d.pid));
    b.extend_from_slice(&e.put_u32(r.tid));
    b.extend_from_slice(&e.put_u64(r.start));
    b.extend_from_slice(&e.put_u64(r.len));
    match &image {
        None => {
            b.extend_from_slice(&e.put_u64(0));
            b.extend_from_slice(&[0u8; 24]);
            b.extend_from_slice(&e.put_u32(PROT_RX));
            b.extend_from_slice(&e.put_u32(MAP_PRIVATE | 0x20));
        }
        Some((_, id, pgoff)) => {
            b.extend_from_slice(&e.put_u64(*pgoff));
            let id = id.as_bytes();
            b.push(id.len() as u8);
            b.extend_from_slice(&[0, 0, 0]);
            let mut padded = [0u8; 20];
            padded[..id.len().min(20)].copy_from_slice(&id[..id.len().min(20)]);
            b.extend_from_slice(&padded);
            b.extend_from_slice(&e.put_u32(PROT_RX));
            b.extend_from_slice(&e.put_u32(MAP_PRIVATE));
        }
    }
    b.extend_from_slice(name);
    b.resize(8 + 64 + name_len, 0);
    let t = b.len();
    b.resize(t + trailer.size, 0);
    if let Some(o) = trailer.tid_at {
        b[t + o..t + o + 4].copy_from_slice(&e.put_u32(d.pid));
        b[t + o + 4..t + o + 8].copy_from_slice(&e.put_u32(r.tid));
    }
    if let Some(o) = trailer.time_at {
        b[t + o..t + o + 8].copy_from_slice(&e.put_u64(r.time));
    }
}
