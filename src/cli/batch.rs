//! `pdinject batch`: the command line of batch mode (flags, progress bar, error lines,
//! summary). The work, the JSON-lines report included, is [`pdinject::batch`].

use super::args::RunArgs;
use super::exit::Exit;
use indicatif::ProgressBar;
use pdinject::batch::{
    self, BatchOptions, CONCURRENT_BELOW, Dest, FileResult, Input, LineReport, SHARD_COUNT_ENV,
    Shard, Status, Summary, WalkSkip,
};
use pdinject::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) const AFTER_HELP: &str = "\
Outputs keep each input's path relative to the inputs' common parent folder under
--out-dir (fleets name every file perf.data), or go beside each input with --suffix.
An output is skipped when it is up to date: written by this pdinject version with the
same options from the input as it is now (a marker in OUT/.pdinject/, or
.NAME.pdinject.json beside a suffixed output); --force redoes it.

Exit codes: 0 every input done or up to date, 3 some failed, 1 all failed (or none
found), 2 usage.";

/// The batch's help of the shared flags that mean more in a batch.
pub(crate) fn help(c: clap::Command) -> clap::Command {
    c.mut_arg("in_place", |a| {
        a.help("Rewrite each input itself, only what changes, crash-safe (see \"In place\")")
    })
    .mut_arg("jobs", |a| a.help("Worker threads in all (default: all cores)"))
    .mut_arg("report", |a| {
        a.help("Write one JSON line per input to FILE (the single-file report's fields plus status, error and skipped), then one {\"summary\": ...} line")
    })
    .mut_arg("verbose", |a| a.help("Also print one summary line per input done"))
    .mut_arg("quiet", |a| a.help("Only error lines on stderr (no progress, no summary)"))
}

/// The flags of `pdinject batch`.
#[derive(clap::Args, Debug)]
pub(crate) struct BatchArgs {
    /// The flags single runs share.
    #[command(flatten)]
    pub run: RunArgs,
    /// Write outputs under DIR, at each input's path relative to the inputs' common
    /// parent folder.
    #[arg(long = "out-dir", value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
    /// Write each output beside its input, named as the input plus SUFFIX (e.g. .bid).
    #[arg(long = "suffix", value_name = "SUFFIX")]
    pub suffix: Option<String>,
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
    /// Inputs of this many bytes or more run one at a time with every thread; smaller
    /// ones side by side (for measurements).
    #[arg(long = "concurrent-below", value_name = "BYTES", default_value_t = CONCURRENT_BELOW, hide = true)]
    pub concurrent_below: u64,
    /// perf.data files, `perf record --threads` directories, or directories to walk.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// Runs `pdinject batch`: every usage error before any input is touched, then the
/// inputs this task owns.
pub(crate) fn execute(args: &BatchArgs) -> Result<Exit> {
    // The cache is filled as by single runs: one entry per DSO file, the later inputs
    // finding it present.
    let engine = args.run.engine.options(None)?;
    // The run opens what the options name (the symbol store); a batch checks it as a
    // usage error before any input, as a single run does before its input.
    pdinject::cli_support::check_handles(&engine)?;
    let dest = destination(args)?;
    args.run.check_jobs()?;
    let shard = shard(args)?;
    let paths = input_paths(args)?;
    if let Dest::OutDir(d) = &dest {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let listing = batch::collect(&paths, &WalkSkip::for_dest(&dest));
    if listing.inputs.is_empty() {
        eprintln!("pdinject batch: no perf.data files found");
        return Ok(Exit::Failed);
    }
    let all = listing.inputs.len();
    let inputs: Vec<Input> = match shard {
        Some(s) => listing
            .inputs
            .into_iter()
            .filter(|i| s.owns(&i.rel))
            .collect(),
        None => listing.inputs,
    };
    let report = args
        .run
        .report
        .as_deref()
        .map(LineReport::create)
        .transpose()?;
    let opts = BatchOptions {
        engine,
        dest,
        jobs: args.run.jobs,
        force: args.force,
        concurrent_below: args.concurrent_below,
    };
    let tell = Tell::new(args, &inputs, report.as_ref());
    let summary = batch::run(&inputs, &opts, &|r| tell.done(r));
    tell.finish();
    if let Some(r) = &report {
        r.summary(&summary);
    }
    if !args.run.quiet {
        print_summary(&summary, shard, all);
    }
    let exit = Exit::of_batch(&summary);
    match report.and_then(LineReport::finish) {
        // A batch whose report is lost did not do all it was asked.
        Some(e) => {
            eprintln!("pdinject batch: {e}");
            Ok(if exit == Exit::Done {
                Exit::Failed
            } else {
                exit
            })
        }
        None => Ok(exit),
    }
}

/// Where outputs go, from `--out-dir`, `--suffix` and `--in-place`.
fn destination(args: &BatchArgs) -> Result<Dest> {
    if args.run.in_place {
        // Refused before any input is touched.
        args.run.engine.attrs_for().check_in_place()?;
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

/// The shard this task processes, from `--shard` and `--shard-count`.
fn shard(args: &BatchArgs) -> Result<Option<Shard>> {
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
    Ok(shard)
}

/// The paths named and those read from `--from` lists.
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

/// What is said as each input ends: its error or warning line, its summary with
/// `--verbose`, its report line, the progress bar.
struct Tell<'a> {
    verbose: bool,
    bar: Option<ProgressBar>,
    report: Option<&'a LineReport>,
    files: usize,
    files_done: AtomicUsize,
}

impl<'a> Tell<'a> {
    fn new(args: &BatchArgs, inputs: &[Input], report: Option<&'a LineReport>) -> Tell<'a> {
        let bytes = inputs.iter().map(|i| i.bytes).sum();
        let bar = super::progress::bar(
            args.run.quiet,
            bytes,
            "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
        );
        if let Some(b) = &bar {
            b.set_message(format!("0/{} files", inputs.len()));
        }
        Tell {
            verbose: args.run.verbose && !args.run.quiet,
            bar,
            report,
            files: inputs.len(),
            files_done: AtomicUsize::new(0),
        }
    }

    /// A line on stderr, above the bar when there is one.
    fn say(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn done(&self, r: &FileResult) {
        if let Some(e) = &r.error {
            self.say(&format!("pdinject batch: {e}"));
        } else if let Some(w) = &r.warning {
            self.say(&format!("pdinject batch: warning: {w}"));
        } else if self.verbose {
            let mut v = Vec::new();
            if r.status == Status::Skipped {
                let _ = writeln!(v, "pdinject: {}: up to date", r.report.output);
            } else {
                let _ = r.report.print_human(&mut v);
            }
            self.say(String::from_utf8_lossy(&v).trim_end());
        }
        if let Some(w) = self.report {
            w.input(r);
        }
        if let Some(b) = &self.bar {
            let n = self.files_done.fetch_add(1, Ordering::Relaxed) + 1;
            b.set_message(format!("{n}/{} files", self.files));
            b.inc(r.input_bytes);
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn print_summary(summary: &Summary, shard: Option<Shard>, all: usize) {
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
    if let Some(t) = &summary.store {
        eprintln!(
            "pdinject batch: symbol store {}: {} IDs added ({} bytes, {} debug files), {} found there; {} DSOs not stored",
            t.dir, t.added, t.bytes_added, t.debuginfo_added, t.present, t.not_stored
        );
        let shown = pdinject::cli_support::PRINTED_NOT_STORED;
        for n in t.not_stored_dsos.iter().take(shown) {
            eprintln!(
                "pdinject batch:   not stored {} ({}): {}",
                n.path, n.build_id, n.why
            );
        }
        if t.not_stored_dsos.len() > shown {
            eprintln!(
                "pdinject batch:   and {} more named in the report's summary",
                t.not_stored_dsos.len() - shown
            );
        }
    }
}
