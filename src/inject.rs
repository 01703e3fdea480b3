//! One run of `pdinject --buildids`: scan → model → resolve → identify → write, with
//! the copy of the unchanged bytes running beside scan and resolve.

use crate::buildid::{self, Evidence, Group, HostTrust, Outcome, RecordingTimes, host::HostInfo};
use crate::format::attr::st;
use crate::format::feature::{
    BuildId, BuildIdTable, encode_table_entry, parse_build_id_table, parse_clock_data, parse_string,
};
use crate::format::header::{
    FEAT_ARCH, FEAT_BUILD_ID, FEAT_CLOCK_DATA, FEAT_HOSTNAME, FEAT_OSRELEASE,
};
use crate::input::PerfInput;
use crate::model::{DsoKind, ModelBuilder};
use crate::report::{DsoReport, Report};
use crate::resolve::Resolver;
use crate::resolve::unwind::{Arch, UnwindConfig, UnwindMode, UnwindTables};
use crate::write::{TempOutput, copy_prefix, write_tail};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Which DSOs get table entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// DSOs touched by samples (`-b`, `--buildids`).
    #[default]
    Hit,
    /// Every mapped DSO (`--buildid-all`).
    All,
}

/// Progress callback: `(stage, done, total)` in bytes.
pub type ProgressFn = std::sync::Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// Options of a run.
#[derive(Clone)]
pub struct Options {
    /// Hit or all.
    pub mode: Mode,
    /// `--known-build-ids`.
    pub known: Vec<(BuildId, String)>,
    /// Worker threads (default: all cores).
    pub jobs: Option<usize>,
    /// Progress reporting.
    pub progress: Option<ProgressFn>,
    /// How user stacks are walked.
    pub unwind: UnwindChoice,
    /// Time allowed to unwind one sample.
    pub unwind_budget: Duration,
    /// Frames walked at most per sample.
    pub max_frames: usize,
}

/// `--unwind`: how user stacks (`--call-graph dwarf` samples) are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindChoice {
    /// DWARF when the samples carry user stacks, else nothing.
    #[default]
    Auto,
    /// Never.
    None,
    /// Frame pointers only.
    Fp,
    /// DWARF CFI (frame pointers where CFI is missing).
    Dwarf,
}

/// Default per-sample unwinding budget (see the README for the measurement).
pub const DEFAULT_UNWIND_BUDGET: Duration = Duration::from_millis(1);
/// Default frame cap: perf's own PERF_MAX_STACK_DEPTH is 127; deeper DWARF stacks exist.
pub const DEFAULT_MAX_FRAMES: usize = 512;

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Hit,
            known: Vec::new(),
            jobs: None,
            progress: None,
            unwind: UnwindChoice::Auto,
            unwind_budget: DEFAULT_UNWIND_BUDGET,
            max_frames: DEFAULT_MAX_FRAMES,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("known", &self.known)
            .field("jobs", &self.jobs)
            .field("unwind", &self.unwind)
            .field("unwind_budget", &self.unwind_budget)
            .finish_non_exhaustive()
    }
}

/// Parses `--known-build-ids='HEX PATH,HEX PATH'`.
pub fn parse_known(s: &str) -> Result<Vec<(BuildId, String)>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (hex, path) = item.split_once(char::is_whitespace).ok_or_else(|| {
            Error::Usage(format!("--known-build-ids: '{item}' is not 'HEX PATH'"))
        })?;
        let id = BuildId::from_hex(hex).ok_or_else(|| {
            Error::Usage(format!(
                "--known-build-ids: '{hex}' is not an even-length hex build ID of at most 40 digits"
            ))
        })?;
        out.push((id, path.trim().to_string()));
    }
    Ok(out)
}

pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// The worker pool: `jobs` threads, all cores by default.
pub fn pool(jobs: Option<usize>) -> Result<rayon::ThreadPool> {
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {jobs} worker threads: {e}")))
}

/// Runs the whole job from `input_path` to `output_path`. A pipe-format input, or
/// `-` for either (stdin, stdout), takes the streaming pipeline ([`crate::pipe`]).
pub fn run(input_path: &Path, output_path: &Path, opts: &Options) -> Result<Report> {
    run_with_report(input_path, output_path, opts, None)
}

/// [`run`], also writing the report as JSON to `report_path`: one run, one outcome.
/// The report goes to a temp file committed together with the output, so a report
/// that cannot be written leaves no output (file mode; a stream's output is gone
/// before the report exists, so there it is only written whole or not at all).
pub fn run_with_report(
    input_path: &Path,
    output_path: &Path,
    opts: &Options,
    report_path: Option<&Path>,
) -> Result<Report> {
    if let Some(r) = report_path {
        crate::report::check_report_path(r, input_path, output_path)?;
    }
    if input_path.as_os_str() == "-"
        || output_path.as_os_str() == "-"
        || crate::pipe::is_pipe_file(input_path)
    {
        let report = crate::pipe::run(input_path, output_path, opts)?;
        if let Some(r) = report_path {
            crate::report::stage_json(&report, r)?.commit()?;
        }
        return Ok(report);
    }
    if input_path == output_path || same_file(input_path, output_path) {
        return Err(Error::Usage(format!(
            "{}: output would overwrite the input; write to another file",
            output_path.display()
        )));
    }
    let input = PerfInput::open(input_path)?;
    let pool = pool(opts.jobs)?;
    let jobs = pool.current_num_threads();
    let tmp = TempOutput::create(output_path, input.is_dir)?;
    if input.is_dir
        && let Ok(m) = std::fs::metadata(input_path)
    {
        let _ = std::fs::set_permissions(&tmp.path, m.permissions());
    }
    // A table needs the feature bitmap (104-byte header) and a non-empty data
    // section: perf reads a data size of 0 as "to the end of the file", which would
    // swallow a feature table written after it.
    let can_write_table = input.header.header_size == crate::format::header::FILE_HEADER_SIZE
        && input.header.data.size > 0;
    let copy_len = if can_write_table {
        input.header.feature_table_offset()
    } else {
        input.file_len
    };
    // Each side stops the other: a failed analysis ends the copy, a failed copy (disk
    // full) ends the analysis at its next chunk instead of after the whole file.
    let cancel = AtomicBool::new(false);
    let copy_failed = AtomicBool::new(false);
    let header_out = tmp.header_file_path();

    let report = std::thread::scope(|s| -> Result<Report> {
        let copier = s.spawn(|| -> Result<Duration> {
            let t = Instant::now();
            let r = (|| {
                copy_prefix(&input.header_path, &header_out, copy_len, &cancel)?;
                for df in input.data_files.iter().skip(1) {
                    let name = df
                        .path
                        .file_name()
                        .map(|n| tmp.path.join(n))
                        .unwrap_or_default();
                    copy_prefix(&df.path, &name, df.range.size, &cancel)?;
                }
                Ok(())
            })();
            if r.is_err() {
                copy_failed.store(true, Ordering::Relaxed);
            }
            r.map(|()| t.elapsed())
        });
        let r = pool.install(|| analyse(&input, opts, jobs, &copy_failed));
        if r.is_err() {
            cancel.store(true, Ordering::Relaxed);
        }
        let copied = copier
            .join()
            .map_err(|_| Error::unsupported("the copy thread panicked"))?;
        // The copy's error explains a stopped analysis; otherwise the analysis's own.
        let t_copy = match (&r, copied) {
            (Err(Error::Stopped), Err(e)) => return Err(e),
            (_, c) => c,
        };
        let (mut report, payload) = r?;
        let t_copy = t_copy?;
        report
            .timings_ms
            .insert("copy".into(), t_copy.as_secs_f64() * 1e3);
        if can_write_table {
            let t = Instant::now();
            write_tail(&input, &header_out, payload.as_deref())
                .map_err(|e| e.in_file(&input.header_path))?;
            report
                .timings_ms
                .insert("write-tail".into(), t.elapsed().as_secs_f64() * 1e3);
        } else if report.ids_new > 0 {
            report.notes.push(
                "the input has no feature bitmap (pre-2010 header) or no records: no build-ID table can be added"
                    .into(),
            );
            report.ids_written -= report.ids_new;
            report.ids_new = 0;
        }
        Ok(report)
    });
    let mut report = report.map_err(|e| e.for_output(&tmp.path, output_path))?;
    report.input = input_path.display().to_string();
    report.output = output_path.display().to_string();
    if !input.skipped.is_empty() {
        report.notes.push(format!(
            "skipped {} data.N entries that are not regular files (as perf does): {}",
            input.skipped.len(),
            input
                .skipped
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let report_tmp = match report_path {
        Some(r) => Some(crate::report::stage_json(&report, r)?),
        None => None,
    };
    tmp.commit()?;
    if let Some(r) = report_tmp {
        r.commit()?;
    }
    Ok(report)
}

/// Scan, model and resolve without unwinding and without asking the host anything
/// (no file outside the input is opened): what the fuzzers drive.
pub fn resolve_only(input: &PerfInput) -> Result<crate::resolve::Hits> {
    let opts = Options {
        unwind: UnwindChoice::None,
        ..Options::default()
    };
    resolve_with(input, &opts, false, &AtomicBool::new(false)).map(|r| r.hits)
}

/// What scan, model and resolve produce.
pub struct Resolved {
    /// The scan's findings.
    pub scan: crate::scan::ScanOutput,
    /// The process model.
    pub model: crate::model::Model,
    /// Hits and counts.
    pub hits: crate::resolve::Hits,
    /// Whether local files and this host's kernel may speak for the recording.
    pub trust: HostTrust,
    /// Unwinding settings used, if any.
    pub unwind: Option<UnwindConfig>,
    /// Things the user should know.
    pub notes: Vec<String>,
    /// Wall time of the scan (model included) and of the resolve stage.
    pub timings: (Duration, Duration),
    /// Samples were resolved by time (else by file order).
    pub time_ordered: bool,
}

/// Scan, model and resolve (unwinding included) on the current rayon pool: everything
/// but identify and write. The criterion bench drives this.
pub fn resolve(input: &PerfInput, opts: &Options) -> Result<Resolved> {
    resolve_with(input, opts, true, &AtomicBool::new(false))
}

/// [`resolve`]; with `consult_host` false nothing outside the input is read (no host
/// identity, no local files) and every local source is untrusted. `stop` ends scan and
/// resolve early with [`Error::Stopped`].
fn resolve_with(
    input: &PerfInput,
    opts: &Options,
    consult_host: bool,
    stop: &AtomicBool,
) -> Result<Resolved> {
    let e = input.header.endian;
    let time_mode =
        input.attrs.iter().all(|a| a.sample_type & st::TIME != 0) && input.attrs[0].sample_id_all();
    let total = input.data_bytes();
    let progress = |stage: &str, done: u64| {
        if let Some(p) = &opts.progress {
            p(stage, done, total)
        }
    };
    let t0 = Instant::now();
    let mut builder = ModelBuilder::new();
    let scan = crate::scan::scan(
        input,
        time_mode,
        &mut builder,
        &|d| progress("scan", d),
        stop,
    )?;
    let model = builder.build();
    let t_scan = t0.elapsed();

    let trust = if consult_host {
        let host = HostInfo::detect();
        let hostname = input
            .feature(FEAT_HOSTNAME)
            .and_then(|p| parse_string(&p, e));
        let release = input
            .feature(FEAT_OSRELEASE)
            .and_then(|p| parse_string(&p, e));
        let kref = model.kernel_ref.as_ref().map(|(s, a)| (s.as_str(), *a));
        HostTrust::decide(hostname.as_deref(), release.as_deref(), kref, &host)
    } else {
        let no = || Err("the host was not consulted".to_string());
        HostTrust {
            local: no(),
            kernel: no(),
        }
    };

    let mut notes = Vec::new();
    let arch = input.feature(FEAT_ARCH).and_then(|p| parse_string(&p, e));
    let unwind = unwind_config(opts, &input.attrs, arch.as_deref()).unwrap_or_else(|note| {
        notes.push(note);
        None
    });
    // Unwinding reads CFI from files proven to be the mapped ones; the recording's
    // start is estimated from the mapping records until the samples are in.
    let scan_times = recording_times(input, &scan, &crate::resolve::Hits::default());
    let tables = UnwindTables::new(&model, trust.local.is_ok(), scan_times);
    let mut resolver = Resolver::new(&model, &input.attrs, time_mode, e);
    if let Some(cfg) = unwind {
        resolver = resolver.with_unwinding(cfg, &tables);
    }
    let done = AtomicU64::new(0);
    let t1 = Instant::now();
    let hits = resolver.run(
        &input.data_files,
        &scan.chunks,
        &|n| {
            let d = done.fetch_add(n, Ordering::Relaxed) + n;
            progress("resolve", d);
        },
        stop,
    )?;
    let t_resolve = t1.elapsed();
    drop(resolver);
    Ok(Resolved {
        scan,
        model,
        hits,
        trust,
        unwind,
        notes,
        timings: (t_scan, t_resolve),
        time_ordered: time_mode,
    })
}

/// How user stacks are walked, from `--unwind`, the events and the recording's ARCH;
/// Err is a note for the user (stacks present, architecture not supported).
pub(crate) fn unwind_config(
    opts: &Options,
    attrs: &[crate::format::attr::Attr],
    arch: Option<&str>,
) -> std::result::Result<Option<UnwindConfig>, String> {
    let has_stacks = attrs
        .iter()
        .any(|a| a.sample_type & st::STACK_USER != 0 && a.sample_type & st::REGS_USER != 0);
    let choice = match (opts.unwind, has_stacks) {
        (UnwindChoice::None, _) | (UnwindChoice::Auto, false) => return Ok(None),
        (choice, _) => choice,
    };
    match arch.and_then(Arch::from_perf) {
        Some(arch) => Ok(Some(UnwindConfig {
            mode: if choice == UnwindChoice::Fp {
                UnwindMode::Fp
            } else {
                UnwindMode::Dwarf
            },
            arch,
            budget: opts.unwind_budget,
            max_frames: opts.max_frames,
        })),
        None if has_stacks => Err(format!(
            "user stacks are not unwound: architecture {} is not supported (x86_64, aarch64)",
            arch.unwrap_or("unknown")
        )),
        None => Ok(None),
    }
}

/// Scan, model, resolve and identify; returns the report and the new BUILD_ID payload.
fn analyse(
    input: &PerfInput,
    opts: &Options,
    jobs: usize,
    stop: &AtomicBool,
) -> Result<(Report, Option<Vec<u8>>)> {
    let e = input.header.endian;
    let Resolved {
        scan,
        model,
        hits,
        trust,
        unwind: unwind_cfg,
        notes,
        timings: (t_scan, t_resolve),
        time_ordered,
    } = resolve_with(input, opts, true, stop)?;

    // Group DSOs by (address space, name): one table entry each.
    let all_hit = opts.mode == Mode::All || scan.has_aux;
    let mut groups: BTreeMap<(bool, String), Group> = BTreeMap::new();
    for (i, d) in model.dsos.iter().enumerate() {
        let h = hits.per_dso.get(i).copied().unwrap_or(0);
        let g = groups
            .entry((d.kind.is_kernel_space(), d.name.clone()))
            .or_insert_with(|| Group {
                name: d.name.clone(),
                kind: d.kind,
                dsos: Vec::new(),
                hits: 0,
            });
        g.dsos.push(i as u32);
        g.hits += h;
    }
    // perf always lists the vdso; --buildid-all and AUX recordings list every DSO
    // mapped as code (files only ever mapped as data, like locale archives, are not).
    let groups: Vec<Group> = groups
        .into_values()
        .filter(|g| (all_hit && g.is_code(&model)) || g.hits > 0 || g.kind == DsoKind::Vdso)
        .collect();

    let table = match input.feature(FEAT_BUILD_ID) {
        Some(p) if input.header.has_feature(FEAT_BUILD_ID) => {
            (parse_build_id_table(&p, e), Some(p))
        }
        _ => (BuildIdTable::default(), None),
    };
    let (table, old_payload) = table;
    let times = recording_times(input, &scan, &hits);
    let ev = Evidence {
        table: &table,
        stream: &scan.stream_build_ids,
        known: &opts.known,
        trust: &trust,
        times,
    };
    let t2 = Instant::now();
    let outcomes = buildid::identify(&groups, &model, &ev);
    let t_identify = t2.elapsed();

    let mut new_entries = Vec::new();
    let mut report = Report {
        records: scan.records,
        samples: hits.samples,
        guest_samples: hits.guest_samples,
        unmapped_addresses: hits.unmapped,
        unknown_event_samples: hits.unknown_event,
        compressed_records: scan.compressed,
        time_ordered,
        aux_all_hit: scan.has_aux,
        unwound_samples: hits.unwound_samples,
        unwound_frames: hits.unwound_frames,
        over_budget_samples: hits.over_budget,
        frame_capped_samples: hits.frame_capped,
        unwind_budget_us: unwind_cfg.map(|c| c.budget.as_secs_f64() * 1e6),
        notes,
        jobs,
        timings_ms: [
            ("scan", t_scan),
            ("resolve", t_resolve),
            ("identify", t_identify),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.as_secs_f64() * 1e3))
        .collect(),
        ..Report::default()
    };
    if table.legacy {
        report.notes.push(
            "the input's build-ID table uses the pre-2010 layout; no entries are added to it"
                .into(),
        );
    }
    if let Err(why) = &trust.local {
        report
            .notes
            .push(format!("no local file is trusted: {why}"));
    } else if let Err(why) = &trust.kernel {
        report.notes.push(format!(
            "kernel, modules and vdso of this host are not used: {why}"
        ));
    }
    for (g, o) in groups.iter().zip(outcomes) {
        let listed = g.hits > 0 || all_hit;
        let o = if add_entry(&mut new_entries, e, g, &o, &table) {
            o
        } else {
            Outcome {
                reason: Some(buildid::Reason::Unsupported),
                detail: Some(format!(
                    "the name is {} bytes; perf reads at most {} (PATH_MAX) and would crash on it",
                    g.name.len(),
                    crate::limits::MAX_DSO_NAME
                )),
                ..Outcome::default()
            }
        };
        if !listed {
            continue;
        }
        report.dsos_hit += 1;
        if o.build_id.is_some() {
            report.ids_written += 1;
            if !o.in_input_table && !table.legacy {
                report.ids_new += 1;
            }
        } else {
            report.ids_missing += 1;
        }
        report.dsos.push(DsoReport {
            path: g.name.clone(),
            kind: g.kind,
            hits: g.hits,
            build_id: o.build_id.map(|b| b.to_string()),
            source: o.source,
            reason: o.reason,
            detail: o.detail.clone(),
        });
    }
    if table.malformed && new_entries.is_empty() {
        report.notes.push(
            "the input's build-ID table ends in a damaged entry; it is copied as it is".into(),
        );
    }
    // The BUILD_ID section is rewritten only when it changes or did not exist.
    let payload = if table.legacy || (new_entries.is_empty() && old_payload.is_some()) {
        None
    } else {
        let mut p = old_payload.unwrap_or_default();
        // Hook (hostile input): perf reads on from a damaged entry's size and would
        // never see entries appended after it: the damaged tail is dropped.
        if table.malformed && p.len() > table.valid_len {
            report.notes.push(format!(
                "the damaged last {} bytes of the input's build-ID table were dropped so that perf reads the new entries",
                p.len() - table.valid_len
            ));
            p.truncate(table.valid_len);
        }
        p.extend_from_slice(&new_entries);
        Some(p)
    };
    Ok((report, payload))
}

/// Appends the group's new table entry, if it has an ID the input's table lacks.
/// False when the entry cannot be encoded (a name longer than a record can hold).
fn add_entry(
    out: &mut Vec<u8>,
    e: crate::format::Endian,
    g: &Group,
    o: &Outcome,
    table: &BuildIdTable,
) -> bool {
    let Some(id) = o.build_id else { return true };
    if o.in_input_table || table.legacy {
        return true;
    }
    encode_table_entry(out, e, g.kind.build_id_cpumode(), &id, g.name.as_bytes())
}

/// When did the recording start, in wall-clock ns? From CLOCK_DATA when the file has
/// it; otherwise the input's mtime (end of the recording) minus the span of its times.
fn recording_times(
    input: &PerfInput,
    scan: &crate::scan::ScanOutput,
    hits: &crate::resolve::Hits,
) -> RecordingTimes {
    let e = input.header.endian;
    let min = [scan.min_time, hits.min_time].into_iter().flatten().min();
    let max = [scan.max_time, hits.max_time].into_iter().flatten().max();
    if let (Some(cd), Some(min)) = (
        input
            .feature(FEAT_CLOCK_DATA)
            .and_then(|p| parse_clock_data(&p, e)),
        min,
    ) {
        return RecordingTimes {
            start_ns: Some(cd.wall_ns as i128 + min as i128 - cd.clock_ns as i128),
        };
    }
    let span = match (min, max) {
        (Some(a), Some(b)) => (b - a) as i128,
        _ => 0,
    };
    RecordingTimes {
        start_ns: input.mtime_ns.map(|m| m - span),
    }
}
