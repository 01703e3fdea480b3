//! `pdinject batch`: the command line of batch mode (flags, progress bar, error lines,
//! JSON-lines report, exit codes). The work is [`crate::batch`].

use super::EngineArgs;
use clap::Parser;
use pdinject::batch::{
    self, BatchOptions, CONCURRENT_BELOW, Dest, FileResult, SHARD_COUNT_ENV, Shard, Status,
    WalkSkip,
};
use pdinject::options::Options;
use pdinject::{Error, Result};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

const AFTER_HELP: &str = "\
Outputs keep each input's path relative to the inputs' common parent folder under
--out-dir (fleets name every file perf.data), or go beside each input with --suffix.
An output is skipped when it is up to date: written by this pdinject version with the
same options from the input as it is now (a marker in OUT/.pdinject/, or
.NAME.pdinject.json beside a suffixed output); --force redoes it.

Exit codes: 0 every input done or up to date, 3 some failed, 1 all failed (or none
found), 2 usage.";

/// Writes build IDs into many perf.data files: one thread pool, one memo of DSO build
/// IDs, per-file errors that never stop the batch.
#[derive(Parser, Debug)]
#[command(name = "pdinject batch", bin_name = "pdinject batch", version, after_help = AFTER_HELP)]
pub struct BatchArgs {
    /// What the engine is asked (the flags of a single-file run).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Write outputs under DIR, at each input's path relative to the inputs' common
    /// parent folder.
    #[arg(long = "out-dir", value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Write each output beside its input, named as the input plus SUFFIX (e.g. .bid).
    #[arg(long = "suffix", value_name = "SUFFIX")]
    pub suffix: Option<String>,
    /// Rewrite each input itself, only what changes, crash-safe (see "In place").
    #[arg(long = "in-place")]
    pub in_place: bool,
    /// Also read input paths from FILE, one per line ('-': standard input).
    #[arg(long = "from", value_name = "FILE")]
    pub from: Vec<PathBuf>,
    /// Process only shard K of N (1-based): the inputs whose relative path hashes to
    /// it; 'auto' takes K and N from a Slurm job array or a Kubernetes Indexed Job.
    #[arg(long = "shard", value_name = "K/N|auto")]
    pub shard: Option<String>,
    /// Number of shards for --shard auto in a Kubernetes Indexed Job (else from
    /// PDINJECT_SHARD_COUNT).
    #[arg(long = "shard-count", value_name = "N")]
    pub shard_count: Option<u64>,
    /// Redo outputs that are up to date.
    #[arg(long = "force")]
    pub force: bool,
    /// Worker threads in all (default: all cores).
    #[arg(long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Write one JSON line per input to FILE (the single-file report's fields plus
    /// status, error and skipped), then one {"summary": ...} line.
    #[arg(long = "report", value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Also print one summary line per input done.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Only error lines on stderr (no progress, no summary).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Inputs of this many bytes or more run one at a time with every thread; smaller
    /// ones side by side (for measurements).
    #[arg(long = "concurrent-below", value_name = "BYTES", default_value_t = CONCURRENT_BELOW, hide = true)]
    pub concurrent_below: u64,
    /// perf.data files, `perf record --threads` directories, or directories to walk.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// Runs `pdinject batch ARGS` (`args` starts at `batch`); returns the exit code.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let args = match BatchArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match execute(&args) {
        Ok(code) => code,
        Err(Error::Usage(m)) => {
            eprintln!("pdinject batch: {m}");
            2
        }
        Err(e) => {
            eprintln!("pdinject batch: {e}");
            1
        }
    }
}

fn engine_options(args: &BatchArgs) -> Result<Options> {
    // The cache is filled as by single runs: one entry per DSO file, the later
    // inputs finding it present.
    args.engine.options(None)
}

fn destination(args: &BatchArgs) -> Result<Dest> {
    if args.in_place {
        // Refused before any input is touched.
        args.engine.attrs_for().check_in_place()?;
        return match (&args.out_dir, &args.suffix) {
            (None, None) => Ok(Dest::InPlace),
            _ => Err(Error::Usage(
                "--in-place rewrites each input: it goes with neither --out-dir nor --suffix"
                    .into(),
            )),
        };
    }
    match (&args.out_dir, &args.suffix) {
        (Some(d), None) => Ok(Dest::OutDir(d.clone())),
        (None, Some(s)) if !s.is_empty() && !s.contains('/') => Ok(Dest::Suffix(s.clone())),
        (None, Some(s)) => Err(Error::Usage(format!(
            "--suffix '{s}': give a non-empty suffix without '/', e.g. .bid"
        ))),
        (Some(_), Some(_)) => Err(Error::Usage(
            "give either --out-dir or --suffix, not both".into(),
        )),
        (None, None) => Err(Error::Usage(
            "say where outputs go: --out-dir DIR or --suffix SUFFIX".into(),
        )),
    }
}

fn input_paths(args: &BatchArgs) -> Result<Vec<PathBuf>> {
    let mut paths = args.paths.clone();
    let mut stdin_read = false;
    for f in &args.from {
        if f.as_os_str() == "-" {
            if std::mem::replace(&mut stdin_read, true) {
                continue;
            }
            paths.extend(batch::read_list(
                &mut std::io::stdin().lock(),
                Path::new("<stdin>"),
            )?);
        } else {
            let mut r = std::fs::File::open(f).map_err(|e| Error::io(f, e))?;
            paths.extend(batch::read_list(&mut r, f)?);
        }
    }
    if paths.is_empty() {
        return Err(Error::Usage(
            "no inputs: give perf.data files or directories, or --from FILE".into(),
        ));
    }
    Ok(paths)
}

fn execute(args: &BatchArgs) -> Result<i32> {
    let engine = engine_options(args)?;
    let dest = destination(args)?;
    if args.jobs == Some(0) {
        return Err(Error::Usage("--jobs must be at least 1".into()));
    }
    let shard = match args.shard.as_deref() {
        None => None,
        Some("auto") => Some(Shard::from_env(
            &|k| std::env::var(k).ok(),
            args.shard_count,
        )?),
        Some(s) => Some(Shard::parse(s)?),
    };
    if args.shard_count.is_some() && args.shard.as_deref() != Some("auto") {
        return Err(Error::Usage(format!(
            "--shard-count goes with --shard auto (or set {SHARD_COUNT_ENV})"
        )));
    }
    let paths = input_paths(args)?;
    if let Dest::OutDir(d) = &dest {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let listing = batch::collect(&paths, &WalkSkip::for_dest(&dest));
    if listing.inputs.is_empty() {
        eprintln!("pdinject batch: no perf.data files found");
        return Ok(1);
    }
    let all = listing.inputs.len();
    let inputs: Vec<_> = match shard {
        Some(s) => listing
            .inputs
            .into_iter()
            .filter(|i| s.owns(&i.rel))
            .collect(),
        None => listing.inputs,
    };
    let report = match &args.report {
        Some(p) => Some(Mutex::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| Error::io(p, e))?,
        ))),
        None => None,
    };
    let total_bytes: u64 = inputs.iter().map(|i| i.bytes).sum();
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(total_bytes),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(format!("0/{} files", inputs.len()));
        b
    });
    let files_done = AtomicUsize::new(0);
    let report_error = Mutex::new(None::<String>);
    let say = |line: &str| match &bar {
        Some(b) => b.println(line),
        None => eprintln!("{line}"),
    };
    let done = |r: &FileResult| {
        if let Some(e) = &r.error {
            say(&format!("pdinject batch: {e}"));
        } else if let Some(w) = &r.warning {
            say(&format!("pdinject batch: warning: {w}"));
        } else if args.verbose && !args.quiet {
            let mut v = Vec::new();
            if r.status == Status::Skipped {
                let _ = writeln!(v, "pdinject: {}: up to date", r.report.output);
            } else {
                let _ = r.report.print_human(&mut v);
            }
            say(String::from_utf8_lossy(&v).trim_end());
        }
        if let Some(w) = &report
            && let Ok(mut w) = w.lock()
        {
            let line = serde_json::to_string(r).unwrap_or_default();
            // Flushed line by line: an interrupted batch leaves a usable report.
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush())
                && let Ok(mut slot) = report_error.lock()
            {
                slot.get_or_insert_with(|| e.to_string());
            }
        }
        if let Some(b) = &bar {
            let n = files_done.fetch_add(1, Ordering::Relaxed) + 1;
            b.set_message(format!("{n}/{} files", inputs.len()));
            b.inc(r.input_bytes);
        }
    };
    let opts = BatchOptions {
        engine,
        dest,
        jobs: args.jobs,
        force: args.force,
        concurrent_below: args.concurrent_below,
    };
    let summary = batch::run(&inputs, &opts, &done);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if let Some(w) = &report
        && let Ok(mut w) = w.lock()
    {
        let line = serde_json::json!({ "summary": &summary });
        if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush())
            && let Ok(mut slot) = report_error.lock()
        {
            slot.get_or_insert_with(|| e.to_string());
        }
    }
    if !args.quiet {
        let shard_note = match shard {
            Some(s) => format!(" (shard {}/{} of {all})", s.index + 1, s.count),
            None => String::new(),
        };
        eprintln!(
            "pdinject batch: {} inputs{shard_note}: {} done, {} up to date, {} failed in {:.2} s; {} distinct DSO files read ({} lookups from the memo)",
            summary.inputs,
            summary.ok,
            summary.skipped,
            summary.failed,
            summary.seconds,
            summary.memo.dso_files_read,
            summary.memo.memo_hits
        );
    }
    if let Some(e) = report_error.into_inner().ok().flatten() {
        let p = args.report.as_deref().unwrap_or(Path::new("report"));
        eprintln!(
            "pdinject batch: {}: cannot write the report: {e}",
            p.display()
        );
        return Ok(if summary.exit_code() == 0 {
            1
        } else {
            summary.exit_code()
        });
    }
    Ok(summary.exit_code())
}
