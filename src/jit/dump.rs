//! Reading one process's jitdump into its mapping records: each code load (with
//! code) and move of the recording's time, placed on a shelf of every load (the
//! model maps them there, [`Shelf`]), the images of one load each where perf's DWARF
//! unwinder needs them, and, with every load kept, the shared image at once. The
//! shared image of the loads samples touch is written after the choice, from a
//! second read of those loads alone ([`Dump::write_kept`]).

use super::image::{DebugLines, Image, Kind, Load, Placed, Shelf, Tables};
use crate::format::buildid::BuildId;
use crate::format::jitdump::{self, Header, JitdumpError, Reader, Record};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One mapping record a dump gives: a code load, a move of one, or (a dump cut
/// short) a cover of a range loaded before the cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MapRec {
    pub time: u64,
    pub tid: u32,
    pub start: u64,
    pub len: u64,
    /// Offset on the shelf (a move's: its load's); [`COVER`]: an anonymous cover.
    pub pgoff: u64,
    /// Its image: 0 the shared one, n the n-th single-load one.
    pub img: u32,
    /// A load's records in the dump (its lines and tables, then the load), for the
    /// second read: from offset `at`, `size` bytes.
    pub at: u64,
    pub size: u64,
    /// A load (not a move or a cover).
    pub load: bool,
}

/// [`MapRec::pgoff`] of an anonymous cover.
pub(super) const COVER: u64 = u64::MAX;

/// How the shared image of a dump is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shared {
    /// As the dump is read, with every load (`--jit-maps all`).
    Now,
    /// After the choice, with the loads the kept records map.
    Later,
    /// None: every load has an image of its own (a recording with DWARF stacks).
    PerLoad,
}

/// Each code index's newest load (see [`Dump::indexes`]).
type Indexes = (
    Vec<(u64, usize)>,
    Option<std::collections::HashMap<u64, usize>>,
);

/// A dump read.
pub(super) struct Dump {
    pub pid: u32,
    pub path: PathBuf,
    /// The shared image's path.
    pub image: PathBuf,
    pub header: Header,
    pub recs: Vec<MapRec>,
    /// The single-load images: path and ID.
    pub singles: Vec<(PathBuf, BuildId)>,
    /// The shared image's ID, once written.
    pub id: Option<BuildId>,
    pub shared: Shared,
    /// What the walk counted.
    pub count: Tally,
    pub notes: Vec<String>,
    /// Where the next read goes on from: the first record after the last load read
    /// (the lines and tables before a load are read again with it).
    resume: u64,
    shelf: Shelf,
    /// The shared image being written as the dump is read ([`Shared::Now`]).
    img: Option<Image>,
    /// Each code index's newest load, for moves: a list while no move has come (V8
    /// and CPython write none, and 50,000 inserts into a map were 5 % of a run), a
    /// map from the first move on.
    indexes: Indexes,
}

/// What a dump's walk counted.
#[derive(Default)]
pub(super) struct Tally {
    pub loads: u64,
    pub moves: u64,
    lost_moves: u64,
    /// Loads of single images left without lines: their DEBUG_INFO record does not
    /// read as it says (one note for them all, at the end of the walk).
    malformed_singles: u64,
}

/// Why a dump is left out.
pub(super) type LeftOut = String;

impl Dump {
    /// Opens the dump at `path` of process `pid` and checks its header.
    pub(super) fn open(path: &Path, pid: u32, shared: Shared) -> Result<Dump, LeftOut> {
        let f = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
        let r = Reader::new(f).map_err(|e| e.to_string())?;
        let h = r.header;
        if h.swapped {
            return Err("written in the other byte order (not read yet)".into());
        }
        if h.flags & jitdump::FLAG_ARCH_TIMESTAMP != 0 {
            return Err(
                "its times are TSC counts (JITDUMP_FLAGS_ARCH_TIMESTAMP), not read yet".into(),
            );
        }
        if h.pid != pid {
            return Err(format!(
                "it was written by process {}, the marker is process {pid}'s",
                h.pid
            ));
        }
        let stem = path
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".dump").to_string())
            .unwrap_or_else(|| format!("jit-{pid}"));
        Ok(Dump {
            pid,
            path: path.to_path_buf(),
            image: path.with_file_name(format!("{stem}.so")),
            header: h,
            recs: Vec::new(),
            singles: Vec::new(),
            id: None,
            shared,
            count: Tally::default(),
            notes: Vec::new(),
            resume: r.offset(),
            shelf: Shelf::default(),
            img: (shared == Shared::Now).then(|| Image::new(Kind::Shared)),
            indexes: (Vec::new(), None),
        })
    }

    /// Reads the dump on from where the last read stopped, keeping what is of the
    /// recording's time (up to `end_time`); returns where its new records begin in
    /// [`Dump::recs`]. A record the dump ends inside is where the next read goes on
    /// from; with `last`, it is a cut (the JIT was killed while writing) and the
    /// records of the recording's time are complete: the shared image written with
    /// every load is written, and the records are sorted by time.
    pub(super) fn read_more(&mut self, end_time: u64, last: bool) -> Result<usize, LeftOut> {
        use std::io::{Seek, SeekFrom};
        let first_new = self.recs.len();
        let mut f = File::open(&self.path).map_err(|e| format!("cannot open it: {e}"))?;
        let mut r = if self.resume == u64::from(self.header.total_size) {
            // The first read: a thread reads the dump ahead (the copy out of the page
            // cache was 40 % of node's first read).
            Reader::read_ahead(f).map_err(|e| e.to_string())?
        } else {
            f.seek(SeekFrom::Start(self.resume))
                .map_err(|e| format!("cannot read it: {e}"))?;
            Reader::records(f, self.header, self.resume, 256 << 10)
        };
        let bytes = self.shared != Shared::Later;
        let mut img = self.img.take();
        let walked = walk(&mut r, end_time, bytes, |step| self.step(step, &mut img));
        self.img = img;
        let walked = walked?;
        self.resume = walked.resume;
        if last {
            self.after_walk(&walked);
            if let Some(img) = self.img.take().filter(|_| self.count.loads > 0) {
                let done = img
                    .write(&self.image)
                    .map_err(|e| format!("cannot write its image: {e}"))?;
                self.id = Some(done.id);
                self.dropped_note(done.dropped_tables);
                self.malformed_note(done.malformed_lines);
            }
        }
        // A JIT whose threads take their time before the dump's lock (Java's agent)
        // writes some records behind later ones: sorted by time (stable), the records
        // go into the recording in the order the engine keys them.
        self.recs[first_new..].sort_by_key(|r| r.time);
        Ok(first_new)
    }

    /// One load or move of a walk.
    fn step(&mut self, step: Step<'_>, img: &mut Option<Image>) -> Result<(), LeftOut> {
        match step {
            Step::Load(x) => {
                let (placed, which) = self.place(&x, img)?;
                match &mut self.indexes {
                    (_, Some(map)) => {
                        map.insert(x.index, self.recs.len());
                    }
                    (list, None) => list.push((x.index, self.recs.len())),
                }
                self.count.loads += 1;
                self.recs.push(MapRec {
                    time: x.time,
                    tid: x.load.tid,
                    start: x.load.code_addr,
                    len: placed.len,
                    pgoff: placed.offset,
                    img: which,
                    at: x.at,
                    size: x.size,
                    load: true,
                });
            }
            Step::Move { time, mv } => {
                let (list, map) = &mut self.indexes;
                let map = map.get_or_insert_with(|| list.drain(..).collect());
                let Some(&n) = map.get(&mv.code_index) else {
                    self.count.lost_moves += 1;
                    return Ok(());
                };
                let load: MapRec = self.recs[n];
                self.count.moves += 1;
                self.recs.push(MapRec {
                    time,
                    tid: mv.tid,
                    start: mv.new_code_addr,
                    len: mv.code_size.min(load.len).max(1),
                    load: false,
                    ..load
                });
            }
        }
        Ok(())
    }

    /// Where load `x` goes: a single image of its own (written now), the shared
    /// image being written, or the shelf.
    fn place(&mut self, x: &Loaded<'_>, img: &mut Option<Image>) -> Result<(Placed, u32), LeftOut> {
        let load = Load {
            name: x.load.name,
            code: x.load.code,
            tables: x.tables,
            lines: x.lines,
        };
        if self.shared == Shared::PerLoad {
            let path = self
                .image
                .with_file_name(format!("jitted-{}-{}.so", self.pid, x.index));
            let mut one = Image::new(Kind::Single);
            let placed = one.add(load);
            let done = one
                .write(&path)
                .map_err(|e| format!("cannot write its image: {e}"))?;
            self.dropped_note(done.dropped_tables);
            self.count.malformed_singles += done.malformed_lines;
            self.singles.push((path, done.id));
            return Ok((placed, self.singles.len() as u32));
        }
        Ok(match img {
            Some(img) => (img.add(load), 0),
            None => (self.shelf.place(x.load.code.len() as u64, x.mapped), 0),
        })
    }

    /// The notes of the walk, and the covers of a dump cut short.
    fn after_walk(&mut self, walked: &Walked) {
        let lost_moves = self.count.lost_moves;
        let shown = self.path.display().to_string();
        if let Some(c) = &walked.cut {
            // From the cut on, code may have been loaded where older code was: every
            // range loaded so far is covered by an anonymous map at the cut's time.
            let t = match c {
                JitdumpError::Truncated { time: Some(t), .. } => (*t).max(walked.last_time),
                _ => walked.last_time,
            }
            .saturating_add(1);
            let covers: Vec<MapRec> = self
                .recs
                .iter()
                .map(|r| MapRec {
                    time: t,
                    pgoff: COVER,
                    load: false,
                    ..*r
                })
                .collect();
            self.recs.extend(covers);
            self.notes.push(format!(
                "--jit: {shown} is cut short ({c}): its {} code loads before the cut are used; samples in JIT code from {t} ns on show as [unknown] (code loaded after the cut is not in the dump, and must not take an older load's name)",
                self.count.loads
            ));
        }
        if walked.late > 0 {
            self.notes.push(if self.count.loads == 0 {
                format!(
                    "--jit: {shown}: no code load of it was written before the recording's end ({} records after it: a later process with the same pid rewrote it, or the JIT loaded its code after the recording)",
                    walked.late
                )
            } else {
                format!(
                    "--jit: {shown}: {} records written after the recording's end left out (the JIT went on after the recording)",
                    walked.late
                )
            });
        }
        let malformed = std::mem::take(&mut self.count.malformed_singles);
        self.malformed_note(malformed);
        if lost_moves > 0 {
            self.notes.push(format!(
                "--jit: {shown}: {lost_moves} code moves name a load not in the dump; left out"
            ));
        }
    }

    fn dropped_note(&mut self, dropped: u64) {
        if dropped > 0 {
            self.notes.push(format!(
                "--jit: {}: {dropped} loads without a name or lines (the image's 32-bit tables are full)",
                self.path.display()
            ));
        }
    }

    fn malformed_note(&mut self, loads: u64) {
        if loads > 0 {
            self.notes.push(format!(
                "--jit: {}: {loads} loads without lines: their DEBUG_INFO record does not read as it says (its entries do not end where it ends; node 20's V8 writes a freed buffer as a script's name)",
                self.path.display()
            ));
        }
    }

    /// Writes the shared image with the loads whose shelf offsets `kept` lists
    /// (sorted), read again where the first read found them; returns each one's
    /// offset in the image. Err: the dump changed between the two reads.
    pub(super) fn write_kept(&mut self, kept: &[u64], end_time: u64) -> Result<Vec<u64>, LeftOut> {
        let changed = || {
            "it changed between its two reads (a later process with the same pid rewrote it)"
                .to_string()
        };
        let mut wanted: Vec<MapRec> = self
            .recs
            .iter()
            .filter(|r| r.load && kept.binary_search(&r.pgoff).is_ok())
            .copied()
            .collect();
        wanted.sort_by_key(|r| r.pgoff);
        let f = File::open(&self.path).map_err(|e| format!("cannot open it: {e}"))?;
        let mut img = Image::new(Kind::Shared);
        let mut offsets = Vec::with_capacity(wanted.len());
        let mut buf = Vec::new();
        let mut i = 0;
        while i < wanted.len() {
            // Near neighbours are read at once (a read per load was 40 % of node's
            // image stage): runs whose gaps are under READ_GAP, up to READ_RUN bytes.
            let from = wanted[i].at;
            let mut j = i + 1;
            while j < wanted.len()
                && wanted[j].at >= wanted[j - 1].at + wanted[j - 1].size
                && wanted[j].at - (wanted[j - 1].at + wanted[j - 1].size) <= READ_GAP
                && wanted[j].at + wanted[j].size - from <= READ_RUN
            {
                j += 1;
            }
            let to = wanted[j - 1].at + wanted[j - 1].size;
            buf.resize((to - from) as usize, 0);
            f.read_exact_at(&mut buf, from).map_err(|_| changed())?;
            for w in &wanted[i..j] {
                let part = &buf[(w.at - from) as usize..(w.at - from + w.size) as usize];
                let mut r = Reader::records(part, self.header, w.at, part.len());
                let mut got = None;
                walk(&mut r, end_time, true, |step| {
                    if let Step::Load(x) = step {
                        let same = x.time == w.time && x.load.code_addr == w.start && x.at == w.at;
                        if !same || got.is_some() {
                            return Err(changed());
                        }
                        got = Some(img.add(Load {
                            name: x.load.name,
                            code: x.load.code,
                            tables: x.tables,
                            lines: x.lines,
                        }));
                    }
                    Ok(())
                })?;
                offsets.push(got.ok_or_else(changed)?.offset);
            }
            i = j;
        }
        let done = img
            .write(&self.image)
            .map_err(|e| format!("cannot write its image: {e}"))?;
        self.id = Some(done.id);
        self.dropped_note(done.dropped_tables);
        self.malformed_note(done.malformed_lines);
        Ok(offsets)
    }
}

/// Bytes of the dump read at once for the loads an image holds.
const READ_RUN: u64 = 1 << 20;
/// Bytes between two wanted loads' records read with them rather than by a read of
/// their own (a read costs about what copying 5 KB does).
const READ_GAP: u64 = 4 << 10;

/// A load of a dump, with the lines and unwinding tables of the records before it
/// (perf attaches them to the next load).
struct Loaded<'a> {
    time: u64,
    index: u64,
    /// Its records in the dump: from offset `at` (the first record after the load
    /// before it), `size` bytes up to its end.
    at: u64,
    size: u64,
    load: jitdump::CodeLoad<'a>,
    lines: Option<DebugLines<'a>>,
    tables: Option<Tables<'a>>,
    /// What its tables map behind the code ([`Tables::mapped`]).
    mapped: u64,
}

/// What a walk over a dump meets.
enum Step<'a> {
    Load(Loaded<'a>),
    Move { time: u64, mv: jitdump::CodeMove },
}

/// How a walk over a dump ended.
struct Walked {
    /// Why it ended before the dump's end, if it did.
    cut: Option<JitdumpError>,
    /// The latest time met.
    last_time: u64,
    /// Records written after the recording's end, left out.
    late: u64,
    /// The first record after the last load walked (or where the walk began).
    resume: u64,
}

/// Walks `r`'s records, giving `each` every load (with code) and move of the
/// recording's time (up to `end_time`: a JIT that goes on after the recording writes
/// more, and a later process with the same pid rewrites the dump from its start).
/// With `bytes` false, loads come without lines or tables (only what the tables map
/// behind the code): a first read that only places loads copies none (a copy of
/// each load's lines was a tenth of node's first read).
fn walk<R: std::io::Read>(
    r: &mut Reader<R>,
    end_time: u64,
    bytes: bool,
    mut each: impl FnMut(Step<'_>) -> Result<(), LeftOut>,
) -> Result<Walked, LeftOut> {
    let swapped = r.header.swapped;
    // The last DEBUG_INFO's entries and unwinding tables, until their load.
    let mut debug: Option<(Vec<u8>, u64)> = None;
    let mut unwind: Option<(Vec<u8>, u64, u64)> = None;
    // Where the records of the next load begin.
    let mut group = r.offset();
    let mut w = Walked {
        cut: None,
        last_time: 0,
        late: 0,
        resume: group,
    };
    loop {
        let entry = match r.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                w.cut = Some(e);
                break;
            }
        };
        if entry.time > end_time {
            // No sample sees it. A thread that took its time before the dump's lock
            // may still write an earlier one after it: the walk goes on. A late load
            // still takes the lines and tables before it (perf gives them to the
            // next load in the dump), so that no later load gets them.
            w.late += 1;
            if matches!(&entry.record, Record::Load(l) if !l.code.is_empty()) {
                (debug, unwind) = (None, None);
            }
            continue;
        }
        w.last_time = w.last_time.max(entry.time);
        match entry.record {
            Record::Debug { count, raw, .. } => {
                debug = Some((if bytes { raw.to_vec() } else { Vec::new() }, count));
            }
            Record::Unwinding(u) => {
                let t = Tables {
                    data: u.data,
                    hdr_size: u.eh_frame_hdr_size,
                    mapped: u.mapped_size,
                };
                let data = if bytes { u.data.to_vec() } else { Vec::new() };
                unwind = Some((data, u.eh_frame_hdr_size, t.mapped()));
            }
            Record::Load(load) if !load.code.is_empty() => {
                let (d, u) = (debug.take(), unwind.take());
                let end = entry.offset + entry.size;
                let at = std::mem::replace(&mut group, end);
                each(Step::Load(Loaded {
                    time: entry.time,
                    index: load.code_index,
                    at,
                    size: end - at,
                    lines: d.as_ref().filter(|_| bytes).map(|(raw, count)| DebugLines {
                        raw,
                        count: *count,
                        swapped,
                        code_addr: load.code_addr,
                    }),
                    tables: u
                        .as_ref()
                        .filter(|_| bytes)
                        .map(|(data, hdr, mapped)| Tables {
                            data,
                            hdr_size: *hdr,
                            mapped: *mapped,
                        }),
                    mapped: u.as_ref().map_or(0, |u| u.2),
                    load,
                }))?;
            }
            Record::Move(mv) => each(Step::Move {
                time: entry.time,
                mv,
            })?,
            Record::Load(_) | Record::Close | Record::Unknown(_) => {}
        }
    }
    w.resume = group;
    Ok(w)
}
