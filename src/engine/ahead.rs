//! Resolving a file beside its scan, in one place: when to pause the scan
//! ([`Beside::due`]), what a batch resolved ahead needs and resolving it on the pool
//! ([`Beside::spawn`]), and, once the scan has ended, whether those batches hold or
//! the whole file is resolved again ([`Beside::conclude`]). A file's run
//! ([`super::file`]) sees only [`Beside`] and [`Engine::scan_until`].
//!
//! The scan is one thread's work, so the pool resolves behind it (with one data file
//! and [`crate::options::Memory::resolve_ahead`]): each time the scan has gone that
//! far and the pool is free, the records perf's round rule says are complete (those
//! before the second-to-last FINISHED_ROUND) are resolved against the model so far,
//! as a stream would be. Once the scan has ended the rule is checked to have held and
//! the settings to be the whole recording's; if not, everything is resolved again at
//! the end, so the result never depends on it.

use super::dating::RecordingStart;
use super::{Cuts, Ending, Engine, batch_trust};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::walk::Chunk;
use crate::input::DataFile;
use crate::model::Model;
use crate::resolve::unwind::{UnwindConfig, UnwindTables};
use crate::resolve::{Hits, Resolver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A batch of a file resolved while its scan goes on: the model as far as the scan
/// has gone and the settings as far as it can tell. perf's round rule (see
/// [`super::rounds`]) says which records such a model already serves; once the scan
/// has ended, [`Beside::conclude`] checks that it did.
pub(crate) struct Ahead {
    /// The model of the records scanned.
    pub model: Model,
    /// Samples are keyed by time.
    pub time_mode: bool,
    /// How stacks are walked.
    pub unwind: Option<UnwindConfig>,
    /// Local files may be read (the host, as far as the scan has seen).
    pub allow_local: crate::buildid::LocalFiles,
    /// The recording's start as far as the scan has seen: never before the real one.
    pub start: RecordingStart,
    /// The `seq` of the first record not in the model.
    pub upto_seq: u64,
}

/// A batch resolved ahead of the scan: its settings, its chunks, and what resolving
/// them gave (with the unwind tables, handed from batch to batch).
struct AheadDone {
    ahead: Ahead,
    chunks: Vec<Chunk>,
    hits: Result<Hits>,
    /// The newest sample time the batch met.
    newest: Option<u64>,
    took: Duration,
    /// Handed to the next batch, then to the last resolve.
    tables: Option<UnwindTables>,
}

/// A file's scan with batches resolved beside it.
pub(crate) struct Beside<'f> {
    /// Bytes the scan goes on between batches (`None`: no batch is resolved beside).
    every: Option<u64>,
    files: &'f [DataFile],
    stop: &'f AtomicBool,
    attrs: Vec<Attr>,
    e: Endian,
    /// A batch is being resolved.
    busy: AtomicBool,
    /// Where a conversion goes, when the resolve converts ([`Engine::convert_into`]).
    spill: Option<Arc<crate::convert::Spill>>,
    /// The tables of the first batch (each later one takes its predecessor's).
    first_tables: Mutex<Option<UnwindTables>>,
    finished: Mutex<Vec<AheadDone>>,
}

impl<'f> Beside<'f> {
    /// Batches of `files` every `every` bytes of the scan, with one data file only.
    pub(crate) fn new(
        engine: &Engine<'_>,
        files: &'f [DataFile],
        every: Option<u64>,
        stop: &'f AtomicBool,
    ) -> Self {
        Beside {
            every: every
                .filter(|_| files.len() == 1 && !engine.edits_data())
                .map(|n| n.max(1)),
            spill: engine.stages.spill.clone(),
            files,
            stop,
            attrs: engine.attrs().to_vec(),
            e: engine.endian(),
            busy: AtomicBool::new(false),
            first_tables: Mutex::new(Some(UnwindTables::new(
                Some(engine.handles().memo.clone()),
                engine.opts().effective_vouchers(),
            ))),
            finished: Mutex::new(Vec::new()),
        }
    }

    /// Whether a data file of `size` bytes is scanned with batches resolved beside it.
    pub(crate) fn in_batches(&self, size: u64) -> bool {
        self.every.is_some_and(|n| size > n)
    }

    /// Whether the scan, now at `at` and last paused at `last`, pauses for a batch:
    /// it has gone far enough and the previous batch is done.
    pub(crate) fn due(&self, at: u64, last: u64) -> bool {
        self.every.is_some_and(|n| at - last >= n) && !self.busy.load(Ordering::Acquire)
    }

    /// The scan paused: what the round rule says is complete of `cuts` is resolved
    /// on the pool while the scan goes on.
    pub(crate) fn spawn<'s>(
        &'s self,
        scope: &rayon::Scope<'s>,
        engine: &mut Engine<'_>,
        cuts: &mut Cuts,
    ) where
        'f: 's,
    {
        // The round rule, with no limit on what waits: a file holds it all.
        let upto = cuts
            .rounds
            .safe_end(cuts.base(), 0, usize::MAX, Ending::MoreToCome);
        if upto.offset <= cuts.base().offset {
            return;
        }
        // The IDs the header's table and --known-build-ids give (as the last
        // resolve's tables have them: a file's table is in its header).
        let claimed = engine
            .head
            .meta
            .as_ref()
            .map(|m| crate::buildid::claimed_user_ids(m.table.entries.iter(), &engine.opts().known))
            .unwrap_or_default();
        let Some(ahead) = engine.ahead() else {
            return;
        };
        // A batch converts only what this host may unwind now; else its chunks wait
        // for the last resolve, which converts them or refuses the run.
        if self.spill.is_some()
            && (ahead.allow_local != crate::buildid::LocalFiles::Trusted || ahead.unwind.is_none())
        {
            return;
        }
        // The previous batch is done (`due` waits for it): its tables come back.
        let first = self.first_tables.lock().ok().and_then(|mut t| t.take());
        let Some(mut t) = first.or_else(|| {
            self.finished
                .lock()
                .ok()
                .and_then(|mut f| f.last_mut()?.tables.take())
        }) else {
            return;
        };
        let batch = cuts.take(upto);
        t.grow(&ahead.model);
        t.set_proof(ahead.allow_local, ahead.start.clone());
        t.set_claimed(claimed);
        self.busy.store(true, Ordering::Release);
        scope.spawn(move |_| {
            let t0 = Instant::now();
            let mut resolver = Resolver::new(&ahead.model, &self.attrs, ahead.time_mode, self.e);
            if let Some(cfg) = ahead.unwind {
                resolver = resolver.with_unwinding(cfg, &t);
            }
            let hits = self
                .spill
                .as_deref()
                .map(|spill| {
                    crate::convert::Converter::new(
                        &ahead.model,
                        ahead.unwind,
                        None,
                        &self.attrs,
                        self.e,
                    )
                    .map(|conv| crate::convert::SpillTap::new(spill, conv))
                })
                .transpose()
                .and_then(|tap| {
                    let tap = tap.as_ref().map(|t| t as &dyn crate::resolve::Rewrite);
                    resolver.run(self.files, &batch, &|_| {}, self.stop, tap)
                });
            drop(resolver);
            // Only the batch's settings are judged at the end: its model goes now, or
            // every batch's would be held until the scan ends.
            let mut ahead = ahead;
            ahead.model = Model::default();
            if let Ok(mut f) = self.finished.lock() {
                f.push(AheadDone {
                    newest: hits.as_ref().ok().and_then(|h| h.max_time),
                    ahead,
                    chunks: batch,
                    hits,
                    took: t0.elapsed(),
                    tables: Some(t),
                });
            }
            self.busy.store(false, Ordering::Release);
        });
    }

    /// The scan ended in `scanned` with `chunks` left to resolve: the batches resolved
    /// beside it are kept when they hold (their hits go into the last resolve), else
    /// thrown away and their chunks returned with the rest, to be resolved again.
    pub(crate) fn conclude(
        self,
        engine: &mut Engine<'_>,
        scanned: Result<()>,
        chunks: Vec<Chunk>,
    ) -> Result<Vec<Chunk>> {
        let mut finished = self
            .finished
            .into_inner()
            .map_err(|_| Error::Internal("a batch resolved ahead panicked".into()))?;
        scanned?;
        if finished.is_empty() {
            return Ok(chunks);
        }
        // The first error of a batch, in file order, is the run's (as when resolved at the end).
        let mut hits = Hits::default();
        for f in &mut finished {
            match std::mem::replace(&mut f.hits, Ok(Default::default())) {
                Ok(h) => hits.merge(h),
                Err(err) => return Err(err),
            }
        }
        let tables = finished.iter_mut().rev().find_map(|f| f.tables.take());
        let done: Vec<_> = finished.iter().map(|f| (&f.ahead, f.newest)).collect();
        let took: Duration = finished.iter().map(|f| f.took).sum();
        engine.add_time("resolve (beside the scan)", took);
        match tables {
            Some(t) if engine.ahead_holds(&done, &t) => {
                engine.add_prior(hits, t, done.len() as u64);
                Ok(chunks)
            }
            _ => {
                engine.ahead_redone();
                // Resolved again whole, with tables proven under the final settings.
                let mut all: Vec<_> = finished.into_iter().flat_map(|f| f.chunks).collect();
                all.extend(chunks);
                Ok(all)
            }
        }
    }
}

impl Engine<'_> {
    /// What resolving the records scanned so far needs, taken now: the model so far
    /// and the proof as far as the scan can tell (see [`Ahead`]). `None` when this
    /// input is not resolved ahead of its scan: compressed data (resolved in order
    /// by one decompressor) or records before any attr.
    fn ahead(&mut self) -> Option<Ahead> {
        if self.head.attrs.is_empty() || self.scan.compressed > 0 || self.head.time_mode.is_none() {
            return None;
        }
        let model = self.builder.snapshot();
        let meta = self.metadata();
        let start = self.start();
        let trust = batch_trust(self.decide_trust(&meta, model.kernel_ref.as_ref()), &start);
        Some(Ahead {
            unwind: self.unwind_config(&meta),
            time_mode: self.head.time_mode.unwrap_or(false),
            allow_local: crate::buildid::LocalFiles::of(&trust.local),
            start,
            upto_seq: self.walker.seq,
            model,
        })
    }

    /// Whether what batches resolved ahead of the scan found is what resolving them
    /// now would find: the scan has ended (call before the last [`Engine::resolve`])
    /// and `done` lists each batch's settings and the newest sample time it met.
    /// Samples see the mappings made before them, in time: a batch is right when no
    /// mapping, fork or exec scanned after it is older than its newest sample (perf's
    /// round rule promises that; a file that breaks it is resolved again whole), and
    /// when it trusted local files and walked stacks as the whole recording says
    /// (its start, its kernel, the executable offsets of each DSO).
    fn ahead_holds(&mut self, done: &[(&Ahead, Option<u64>)], tables: &UnwindTables) -> bool {
        if self.scan.compressed > 0 || done.is_empty() {
            return done.is_empty();
        }
        let meta = self.metadata();
        let start = self.start();
        let kernel_ref = self.builder.kernel_ref.clone();
        let trust = self.effective_trust(&meta, kernel_ref.as_ref(), &start);
        let unwind = self.unwind_config(&meta);
        let time_mode = self.head.time_mode.unwrap_or(false);
        done.iter().all(|(a, newest)| {
            let in_order = !time_mode
                || match (newest, self.builder.oldest_event_from(a.upto_seq)) {
                    (Some(s), Some(e)) => e >= *s,
                    _ => true,
                };
            in_order
                && a.time_mode == time_mode
                && a.allow_local == crate::buildid::LocalFiles::of(&trust.local)
                && a.unwind.map(|c| c.mode) == unwind.map(|c| c.mode)
        }) && tables.still_proven(self.builder.dsos(), &start)
    }

    /// Hits of `batches` resolved ahead of the scan, merged into the next resolve's.
    fn add_prior(&mut self, hits: Hits, tables: UnwindTables, batches: u64) {
        self.res.prior = Some(hits);
        self.res.tables = Some(tables);
        self.res.ahead_stat = (batches, false);
    }

    /// Batches resolved ahead of the scan were thrown away (to be resolved again).
    fn ahead_redone(&mut self) {
        self.res.ahead_stat = (0, true);
    }
}
