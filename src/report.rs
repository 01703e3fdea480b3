//! The run summary: a few lines on stderr and, with `--report FILE`, the same as JSON.

use crate::buildid::Contradiction;
use crate::error::{Error, Result};
use crate::write::TempOutput;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

// The types of the report's fields, named here so a caller can match on them.
pub use crate::{
    aslr::remap::DropReason,
    buildid::cache::{CacheState, CacheTotals},
    buildid::proof::{Reason, Source, Verdict},
    buildid::store::{DebugInfo, StoreState, StoreTotals},
    convert::Counts,
    live::{LiveFills, LiveRefusals, LiveSummary},
    model::DsoKind,
};

/// One DSO line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct DsoReport {
    /// Name as in the table.
    pub path: String,
    /// Kind.
    pub kind: DsoKind,
    /// Samples that touched it.
    pub hits: u64,
    /// Hex build ID in the output table, if any.
    pub build_id: Option<String>,
    /// Where the ID came from.
    pub source: Option<Source>,
    /// Why there is none.
    pub reason: Option<Reason>,
    /// Words for the user.
    pub detail: Option<String>,
    /// Build-ID cache: what happened to this DSO's entry (no cache: absent).
    pub cached: Option<CacheState>,
    /// Build-ID cache: the entry's directory, relative to the cache.
    pub cache_entry: Option<String>,
    /// Build-ID cache: why the DSO is not cached.
    pub cache_detail: Option<String>,
    /// Symbol store: what happened to this DSO (no store: absent).
    pub stored: Option<StoreState>,
    /// Symbol store: where its debug info is.
    pub store_debuginfo: Option<DebugInfo>,
    /// Symbol store: why it is not stored, or where its debug info came from.
    pub store_detail: Option<String>,
    /// The input's claim of an ID for this DSO was contradicted: what became of it.
    pub claim: Option<ClaimReport>,
}

/// A contradicted claim in the report (see [`crate::buildid::Contradiction`]).
#[derive(Clone, Debug, Serialize)]
pub struct ClaimReport {
    /// The ID the input claims, hex.
    pub build_id: String,
    /// `confirmed` (kept), `corrected` (the proven ID written instead) or
    /// `refused` (no ID, reason `conflicting-claim`).
    pub verdict: Verdict,
    /// Other DSOs the input claims it for (a few; `others_total` counts them all);
    /// empty when this boot's kernel or module notes contradict it.
    pub others: Vec<String>,
    /// How many other DSOs claim it.
    pub others_total: usize,
    /// The input's own build-ID MMAP2 records carry the claim (passed on unchanged).
    pub in_records: bool,
}

impl From<&Contradiction> for ClaimReport {
    fn from(c: &Contradiction) -> Self {
        ClaimReport {
            build_id: c.claimed.to_string(),
            verdict: c.verdict,
            others: c.others.clone(),
            others_total: c.others_total,
            in_records: c.in_records,
        }
    }
}

/// How an `--in-place` run wrote the BUILD_ID section.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TableWrite {
    /// Not written (nothing new for it).
    Unchanged,
    /// The feature tail rewritten over itself: the file keeps its size.
    Rewritten,
    /// A new payload past the old end of the file, the feature table pointed at it.
    Appended,
}

/// What an `--in-place` run did to the file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct InPlaceReport {
    /// How the BUILD_ID section was written.
    pub table: TableWrite,
    /// The file is longer than before.
    pub grew: bool,
    /// By this many bytes (0 when it did not grow).
    pub grew_bytes: u64,
    /// Feature strings re-padded from perf's 64 bytes to 8 to make room.
    pub strings_repadded: usize,
    /// IDs that mapping records carry, so the table need not (mmap2 modes).
    pub ids_in_records: usize,
    /// Why the table could not be written over the old tail, when it was appended
    /// in a mode that tries (`--mmap2-buildid-all`, `--mmap2-buildids`).
    pub no_room: Option<String>,
}

/// What a sink tells the report.
#[derive(Debug, Default)]
pub(crate) struct SinkReport {
    /// IDs the output gained (table entries or records pdinject wrote).
    pub ids_new: usize,
    /// IDs decided that the output cannot hold (no table can be added to it).
    pub ids_lost: usize,
    /// Things the user should know about the output.
    pub notes: Vec<String>,
    /// Wall time of the sink's own stages.
    pub timings: std::collections::BTreeMap<&'static str, std::time::Duration>,
    /// `--in-place`: how the file was changed.
    pub in_place: Option<InPlaceReport>,
    /// `--convert-callchain`: what the conversion did.
    pub convert: Option<crate::convert::Counts>,
    /// `--aslr`: what was removed, by reason.
    pub aslr: Option<crate::aslr::Dropped>,
}

/// The whole report. Its JSON (`--report`) is flat: the parts below are written as
/// fields of the report itself.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// Input path.
    pub input: String,
    /// Output path.
    pub output: String,
    /// Pipe format: IDs were written as HEADER_BUILD_ID records in the stream, not as
    /// a table.
    pub pipe: bool,
    /// What the input held and how it was read.
    #[serde(flatten)]
    pub reading: Reading,
    /// DSOs and their IDs.
    #[serde(flatten)]
    pub ids: IdCounts,
    /// DWARF unwinding of user stacks.
    #[serde(flatten)]
    pub unwinding: Unwinding,
    /// How the run went: memory, batches resolved beside the scan, times, threads.
    #[serde(flatten)]
    pub run: RunFigures,
    /// Notes about the run (things the user should know).
    pub notes: Vec<String>,
    /// What the modes that change the data did (each absent for other runs).
    #[serde(flatten)]
    pub modes: Modes,
    /// Build-ID cache totals (absent with --no-buildid-cache).
    pub cache: Option<crate::buildid::cache::CacheTotals>,
    /// Symbol store totals (absent without --symbol-store).
    pub store: Option<crate::buildid::store::StoreTotals>,
    /// Per DSO.
    pub dsos: Vec<DsoReport>,
}

/// What the input held and how it was read.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct Reading {
    /// Records read (compressed ones' contents included).
    pub records: u64,
    /// Samples decoded.
    pub samples: u64,
    /// Guest samples (not attributed).
    pub guest_samples: u64,
    /// Addresses that fell in no mapping.
    pub unmapped_addresses: u64,
    /// Samples of events the file does not declare.
    pub unknown_event_samples: u64,
    /// COMPRESSED records decoded.
    pub compressed_records: u64,
    /// Samples were resolved by time (else by file order).
    pub time_ordered: bool,
    /// AUX data present: every mapped DSO counts as hit.
    pub aux_all_hit: bool,
}

/// DSOs and their IDs.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct IdCounts {
    /// Distinct DSOs touched by samples (or mapped, with --buildid-all).
    pub dsos_hit: usize,
    /// DSOs with an ID in the output table (pipe: known to perf from the stream).
    pub ids_written: usize,
    /// Of those, entries (pipe: HEADER_BUILD_ID records) pdinject added.
    pub ids_new: usize,
    /// DSOs without an ID.
    pub ids_missing: usize,
}

/// DWARF unwinding of user stacks.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct Unwinding {
    /// Samples whose user stack was unwound.
    pub unwound_samples: u64,
    /// Return addresses found by unwinding.
    pub unwound_frames: u64,
    /// Samples whose unwinding ran out of its time budget (DSOs found so far kept).
    pub over_budget_samples: u64,
    /// Samples whose unwinding reached the frame cap.
    pub frame_capped_samples: u64,
    /// The per-sample unwinding budget in microseconds, when unwinding ran.
    pub unwind_budget_us: Option<f64>,
}

/// How the run went: memory, batches resolved beside the scan, times, threads.
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct RunFigures {
    /// A stream input: the most it kept across its batches, in estimated bytes (the
    /// `--stream-memory` budget's measure); absent for a file.
    pub stream_kept_bytes: Option<u64>,
    /// Batches of a file resolved beside its scan and kept (0: none, or they were
    /// resolved again at the end, see `resolved_again`).
    pub resolved_beside_scan: u64,
    /// Batches resolved beside the scan were thrown away and everything resolved
    /// after it: the file broke perf's round rule, or the whole recording changed a
    /// setting they used (its start, its host, a DSO's offsets).
    pub resolved_again: bool,
    /// Wall time of each stage in milliseconds (copy runs beside scan and resolve).
    pub timings_ms: std::collections::BTreeMap<String, f64>,
    /// Worker threads used.
    pub jobs: usize,
    /// Print stage timings in the human summary.
    #[serde(skip)]
    pub verbose_timings: bool,
}

/// What the modes that change the data did (each absent for other runs).
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct Modes {
    /// `--in-place`: how the file was changed (absent for other runs).
    pub in_place: Option<InPlaceReport>,
    /// `--convert-callchain`: samples converted, and those whose chain lost frames,
    /// by reason (absent for other runs).
    pub convert: Option<crate::convert::Counts>,
    /// `--aslr`: records removed from the output because they hold addresses that
    /// cannot be remapped, by reason (absent for other runs).
    pub aslr: Option<crate::aslr::Dropped>,
    /// Live capture (issue 32; absent when it did not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<crate::live::LiveSummary>,
}

impl Report {
    /// Fills in the build-ID cache totals (and the cache directory) from the DSO
    /// lines, with a note when the cache itself cannot be written; with `archive`
    /// (`--archive FILE.tar`), the archive of the DSOs' cache entries and a note of
    /// what went into it.
    pub fn add_cache(&mut self, dir: &Path, archive: Option<&Path>) -> Result<()> {
        use crate::buildid::cache::{CacheTotals, is_unwritable};
        let t = CacheTotals::of(dir, self.dsos.iter().map(|d| d.cached));
        if let Some(d) = self
            .dsos
            .iter()
            .filter_map(|d| d.cache_detail.as_deref())
            .find(|d| is_unwritable(d))
        {
            self.notes.push(format!("build-ID cache: {d}"));
        }
        self.cache = Some(t);
        if let Some(a) = archive {
            let entries = self.dsos.iter().filter_map(|d| d.cache_entry.as_deref());
            let sum = crate::buildid::archive::write(entries, dir, a)?;
            self.notes.push(format!(
                "archive {}: {} cache entries, {} bytes (unpack with: tar xf {} -C ~/.debug)",
                a.display(),
                sum.entries,
                sum.bytes,
                a.display()
            ));
        }
        Ok(())
    }

    /// Writes the short human summary.
    pub fn print_human(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let name = |s: &str, dash: &'static str| {
            if s == "-" {
                dash.to_string()
            } else {
                s.to_string()
            }
        };
        writeln!(
            w,
            "pdinject: {} -> {}: {} samples, {} DSOs hit, {} build IDs {} ({} new), {} missing",
            escape(&name(&self.input, "<stdin>")),
            escape(&name(&self.output, "<stdout>")),
            self.reading.samples,
            self.ids.dsos_hit,
            self.ids.ids_written,
            if self.pipe {
                "in the stream"
            } else if self
                .modes
                .in_place
                .as_ref()
                .is_some_and(|p| p.ids_in_records > 0)
            {
                "in mapping records and table"
            } else {
                "in table"
            },
            self.ids.ids_new,
            self.ids.ids_missing
        )?;
        if let Some(c) = &self.modes.convert {
            writeln!(w, "  {}", c.line())?;
        }
        if let Some(d) = &self.modes.aslr {
            writeln!(w, "  {}", crate::aslr::line(d))?;
        }
        if self.unwinding.unwound_samples > 0 {
            writeln!(
                w,
                "  unwound {} user stacks ({} return addresses); {} over the time budget, {} at the frame cap",
                self.unwinding.unwound_samples,
                self.unwinding.unwound_frames,
                self.unwinding.over_budget_samples,
                self.unwinding.frame_capped_samples
            )?;
        }
        if self.run.verbose_timings {
            let t: Vec<String> = self
                .run
                .timings_ms
                .iter()
                .map(|(k, v)| format!("{k} {v:.1} ms"))
                .collect();
            writeln!(w, "  timings ({} threads): {}", self.run.jobs, t.join(", "))?;
            if let Some(k) = self.run.stream_kept_bytes {
                writeln!(
                    w,
                    "  kept across batches: {} at most (--stream-memory)",
                    crate::limits::format_size(k)
                )?;
            }
        }
        self.print_stores(w)?;
        for n in &self.notes {
            writeln!(w, "  note: {}", escape(n))?;
        }
        self.print_dso_lines(w)
    }

    /// The summary's lines on `--symfs`, the build-ID cache and the symbol store.
    fn print_stores(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let symfs = self
            .dsos
            .iter()
            .filter(|d| d.source == Some(Source::Symfs))
            .count();
        if symfs > 0 {
            writeln!(
                w,
                "  {symfs} build IDs read under --symfs (no inode proof there: files not modified since the recording started)"
            )?;
        }
        if let Some(c) = &self.cache {
            writeln!(
                w,
                "  build-ID cache {}: {} added, {} already there, {} fetched, {} not cached",
                c.dir, c.added, c.present, c.fetched, c.not_cached
            )?;
        }
        if let Some(s) = &self.store {
            writeln!(
                w,
                "  symbol store {}: {} added ({} bytes, {} debug files), {} already there, {} not stored",
                escape(&s.dir),
                s.added,
                s.bytes_added,
                s.debuginfo_added,
                s.present,
                s.not_stored
            )?;
            let shown = crate::buildid::store::PRINTED_NOT_STORED;
            for n in s.not_stored_dsos.iter().take(shown) {
                writeln!(
                    w,
                    "  not stored  {} ({}): {}",
                    escape(&n.path),
                    n.build_id,
                    escape(&n.why)
                )?;
            }
            if s.not_stored_dsos.len() > shown {
                writeln!(
                    w,
                    "  not stored  {} more (the JSON report names them)",
                    s.not_stored_dsos.len() - shown
                )?;
            }
        }
        Ok(())
    }

    /// The summary's DSO lines: contradicted claims kept, then DSOs without an ID by
    /// reason.
    fn print_dso_lines(&self, w: &mut dyn Write) -> std::io::Result<()> {
        // Contradicted claims that still have an ID: kept by a proof, or replaced by
        // the proven ID (the refused ones are listed below with their reason).
        for d in &self.dsos {
            let word = match d.claim.as_ref().map(|c| c.verdict) {
                Some(Verdict::Confirmed) if d.build_id.is_some() => "confirmed",
                Some(Verdict::Corrected) if d.build_id.is_some() => "corrected",
                _ => continue,
            };
            writeln!(
                w,
                "  {word:<11} {}: {}",
                escape(&d.path),
                escape(d.detail.as_deref().unwrap_or(""))
            )?;
        }
        let mut by_reason: Vec<&DsoReport> =
            self.dsos.iter().filter(|d| d.build_id.is_none()).collect();
        by_reason.sort_by_key(|d| (d.reason.map(|r| r as u8), std::cmp::Reverse(d.hits)));
        // Many DSOs with one reason (a recording from another host lists every DSO
        // as other-host) are one line with a count and a few examples; the full list
        // is in the JSON report and with -v.
        for group in by_reason.chunk_by(|a, b| a.reason == b.reason) {
            let reason = group[0].reason.map(reason_word).unwrap_or("missing");
            if group.len() > GROUP_OVER && !self.run.verbose_timings {
                let examples: Vec<String> = group[..GROUP_EXAMPLES]
                    .iter()
                    .map(|d| escape(&d.path))
                    .collect();
                writeln!(
                    w,
                    "  {reason:<11} {} DSOs, e.g. {}, ... ({}; all of them with -v or in --report)",
                    group.len(),
                    examples.join(", "),
                    escape(group[0].detail.as_deref().unwrap_or(""))
                )?;
                continue;
            }
            for d in group {
                writeln!(
                    w,
                    "  {reason:<11} {}: {}",
                    escape(&d.path),
                    escape(d.detail.as_deref().unwrap_or(""))
                )?;
            }
        }
        Ok(())
    }
}

/// DSOs of one reason listed one by one up to this many; more are one line.
const GROUP_OVER: usize = 5;
/// Examples named on a grouped line.
const GROUP_EXAMPLES: usize = 3;

pub(crate) use crate::format::escape;

/// Refuses a `--report` path that is the input or the output (same name, or the same
/// file by device and inode): the report would overwrite the recording.
pub(crate) fn check_report_path(report: &Path, input: &Path, output: &Path) -> Result<()> {
    for (p, what) in [(input, "input"), (output, "output")] {
        if p.as_os_str() != "-" && same_path(report, p) {
            return Err(Error::Usage(format!(
                "--report {}: is the {what}; give the report its own file",
                report.display()
            )));
        }
    }
    Ok(())
}

/// True when `a` and `b` name the same file: by device and inode when both exist,
/// else by their canonical directory and file name.
fn same_path(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    let canon = |p: &Path| {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => Path::new(".").to_path_buf(),
        };
        Some((std::fs::canonicalize(dir).ok()?, p.file_name()?.to_owned()))
    };
    matches!((canon(a), canon(b)), (Some(x), Some(y)) if x == y)
}

/// Writes the report as JSON into a temp file beside `path`, to be committed with
/// the output (nothing is left if either fails).
pub(crate) fn stage_json(report: &Report, path: &Path) -> Result<TempOutput> {
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| Error::unsupported(format!("report: {e}")))?;
    let tmp = TempOutput::create(path, false)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&tmp.path)
        .map_err(|e| Error::io(&tmp.path, e))?;
    f.write_all(json.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_all())
        .map_err(|source| Error::Output {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(tmp)
}

/// The word used for a reason in summaries (same as the JSON value).
pub(crate) fn reason_word(r: Reason) -> &'static str {
    match r {
        Reason::Stale => "stale",
        Reason::Ambiguous => "ambiguous",
        Reason::Missing => "missing",
        Reason::Unreadable => "unreadable",
        Reason::NoNote => "no-note",
        Reason::OtherHost => "other-host",
        Reason::NotRegular => "not-regular",
        Reason::Undated => "undated",
        Reason::Deleted => "deleted",
        Reason::Unsupported => "unsupported",
        Reason::ConflictingClaim => "conflicting-claim",
        Reason::CtimeMoved => "ctime-moved",
    }
}
