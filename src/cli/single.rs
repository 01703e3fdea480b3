//! `pdinject IN OUT`: one recording (a file, a directory, or `-` for a stream), its
//! output written beside and renamed, or the file rewritten in place.

use super::args::RunArgs;
use pdinject::options::{Options, ProgressFn};
use pdinject::report::Report;
use pdinject::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The flags of a single run.
#[derive(clap::Args, Debug)]
pub(crate) struct SingleArgs {
    /// The flags batches share.
    #[command(flatten)]
    pub run: RunArgs,
    /// Input perf.data (file or directory); perf's spelling of the first argument.
    #[arg(short = 'i', long = "input", value_name = "FILE")]
    pub input_flag: Option<PathBuf>,
    /// Output perf.data; perf's spelling of the second argument.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output_flag: Option<PathBuf>,
    /// Also write the cache entries of the output's DSOs as a tar to unpack into
    /// ~/.debug on another machine (what `perf archive` makes).
    #[arg(long = "archive", value_name = "FILE.tar")]
    pub archive: Option<PathBuf>,
    /// debuginfod servers (space-separated URLs) to fetch executables from whose ID
    /// is known but whose file is not on this machine; bare or `system`: the
    /// DEBUGINFOD_URLS variable. Without it: buildid-cache.debuginfod of perfconfig,
    /// else none (perf ignores DEBUGINFOD_URLS unless asked too).
    #[arg(long = "debuginfod", value_name = "URLS", num_args = 0..=1, default_missing_value = "system")]
    pub debuginfod: Option<String>,
    /// Input and output.
    #[arg(value_name = "IN OUT", num_args = 0..=2)]
    pub paths: Vec<PathBuf>,
}

/// Runs `pdinject [FLAGS] IN OUT` (or `--in-place FILE`).
pub(crate) fn execute(args: &SingleArgs) -> Result<()> {
    let mut paths = args.paths.iter();
    let input = args.input_flag.clone().or_else(|| paths.next().cloned());
    let output = args.output_flag.clone().or_else(|| paths.next().cloned());
    if paths.next().is_some() {
        return Err(Error::Usage("too many paths: give IN and OUT".into()));
    }
    if args.run.in_place {
        args.run.engine.attrs_for().check_in_place()?;
        let (Some(file), None) = (&input, &output) else {
            return Err(Error::Usage(
                "--in-place takes one file: pdinject --buildids --in-place FILE".into(),
            ));
        };
        return execute_with(args, file, None);
    }
    let (Some(input), Some(output)) = (input, output) else {
        return Err(Error::Usage(
            "give an input and an output: pdinject --buildids IN OUT".into(),
        ));
    };
    execute_with(args, &input, Some(&output))
}

/// Runs with `output`, or in place when it is `None`.
fn execute_with(args: &SingleArgs, input: &Path, output: Option<&PathBuf>) -> Result<()> {
    // A stream in or out: the streaming pipeline, quiet apart from the summary (a
    // pipeline's terminal belongs to perf record and perf report too).
    let dash = |p: &Path| p.as_os_str() == "-";
    let stream = dash(input) || output.is_some_and(|o| dash(o));
    args.run.check_jobs()?;
    let bar = super::progress::bar(
        args.run.quiet || stream,
        0,
        "{msg:8} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
    );
    let progress = bar.clone().map(|b| {
        Arc::new(move |stage: &str, done: u64, total: u64| {
            b.set_length(total);
            if b.message() != stage {
                b.set_message(stage.to_string());
            }
            b.set_position(done);
        }) as ProgressFn
    });
    if args.run.engine.files.no_buildid_cache && args.archive.is_some() {
        return Err(Error::Usage(
            "--archive is made from the build-ID cache; it cannot go with --no-buildid-cache"
                .into(),
        ));
    }
    let opts = Options {
        jobs: args.run.jobs,
        progress,
        ..args.run.engine.options(args.debuginfod.as_deref())?
    };
    let result = run(args, &opts, input, output);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let report = result?;
    if !args.run.quiet {
        let _ = report.print_human(&mut std::io::stderr().lock());
    }
    Ok(())
}

/// The run itself, its report committed with its output.
fn run(
    args: &SingleArgs,
    opts: &Options,
    input: &Path,
    output: Option<&PathBuf>,
) -> Result<Report> {
    let report_path = args.run.report.as_deref();
    // Cache totals and the archive go into the report before it is written: the
    // report is committed together with the output (one run, one outcome).
    let cache_dir = opts.cache.as_ref().map(|c| c.dir.clone());
    let mut finish = |report: &mut Report| -> Result<()> {
        report.run.verbose_timings = args.run.verbose;
        match &cache_dir {
            Some(dir) => report.add_cache(dir, args.archive.as_deref()),
            None => Ok(()),
        }
    };
    match output {
        Some(output) => pdinject::run_staged(input, output, opts, report_path, &mut finish),
        None => pdinject::run_in_place_staged(input, opts, report_path, &mut finish),
    }
}
