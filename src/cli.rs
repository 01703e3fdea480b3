//! The command line: flags as perf inject spells them, a progress bar on terminals,
//! the summary, the JSON report, and exit codes (0 done, 1 error, 2 usage).

pub mod batch;

use clap::Parser;
use pdinject::options::{
    AttrsFor, DEFAULT_MAX_FRAMES, Mode, Options, ProgressFn, UnwindChoice, parse_known,
};
use pdinject::{Error, Result};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Writes the build IDs of every DSO a perf.data file's samples touch into the file's
/// build-ID table, never a wrong one.
#[derive(Parser, Debug)]
#[command(name = "pdinject", version, about, long_about = None)]
pub struct Args {
    /// What the engine is asked (shared with `pdinject batch`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Rewrite IN itself (only what changes, crash-safe); no OUT.
    #[arg(long = "in-place")]
    pub in_place: bool,
    /// Input perf.data (file or directory); perf's spelling of the first argument.
    #[arg(short = 'i', long = "input", value_name = "FILE")]
    pub input_flag: Option<PathBuf>,
    /// Output perf.data; perf's spelling of the second argument.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output_flag: Option<PathBuf>,
    /// Worker threads (default: all cores). Long form only: `-j` is perf's --jit.
    #[arg(long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Also write the summary as JSON to FILE.
    #[arg(long = "report", value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Also print how long each stage took.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// No summary on stderr.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
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

/// Values of `--unwind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnwindArg {
    /// DWARF when samples carry user stacks, else nothing.
    Auto,
    /// Never unwind.
    None,
    /// Frame pointers only.
    Fp,
    /// DWARF CFI, frame pointers where CFI is missing.
    Dwarf,
}

/// Values of `--attrs-for`: a perf version, since what a user knows is which perf
/// refuses the file ("incompatible file format"), not the size of its attr struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttrsForArg {
    /// 128-byte attrs (PERF_ATTR_SIZE_VER7), what perf 6.1 reads.
    #[value(name = "6.1")]
    Perf6_1,
    /// 136-byte attrs (PERF_ATTR_SIZE_VER8, with config3), what perf 6.12 reads.
    #[value(name = "6.12")]
    Perf6_12,
}

/// The flags of a run that single-file and batch runs share.
#[derive(clap::Args, Debug)]
pub struct EngineArgs {
    /// Table entries for every DSO a sample touches (the default).
    #[arg(short = 'b', long = "buildids", visible_alias = "build-ids")]
    pub buildids: bool,
    /// Table entries for every mapped DSO, hit or not.
    #[arg(long = "buildid-all")]
    pub buildid_all: bool,
    /// Every mapping record of a DSO mapped as code, in build-ID MMAP2 form (as perf
    /// 6.12's --mmap2-buildid-all), and its ID in the table.
    #[arg(long = "mmap2-buildid-all")]
    pub mmap2_buildid_all: bool,
    /// Mapping records of the DSOs samples touch, in build-ID MMAP2 form (perf 7.3's
    /// `-B, --mmap2-buildids`).
    #[arg(short = 'B', long = "mmap2-buildids")]
    pub mmap2_buildids: bool,
    /// Build IDs to use for paths: 'HEX PATH,HEX PATH' (as perf inject).
    #[arg(long = "known-build-ids", value_name = "LIST")]
    pub known_build_ids: Option<String>,
    /// How user stacks of `--call-graph dwarf` samples are walked.
    #[arg(long = "unwind", value_enum, default_value = "auto")]
    pub unwind: UnwindArg,
    /// Time allowed to unwind one sample (e.g. 500us, 1ms, 2s); a sample over it keeps
    /// the DSOs found so far and is counted in the summary.
    #[arg(long = "unwind-budget", value_name = "DURATION", value_parser = parse_duration, default_value = "1ms")]
    pub unwind_budget: Duration,
    /// Frames walked at most per sample.
    #[arg(long = "unwind-max-frames", value_name = "N", default_value_t = DEFAULT_MAX_FRAMES)]
    pub unwind_max_frames: usize,
    /// perf's build-ID cache directory to fill (default: buildid.dir of perfconfig,
    /// else ~/.debug).
    #[arg(long = "buildid-dir", value_name = "DIR")]
    pub buildid_dir: Option<PathBuf>,
    /// Do not add the DSOs to perf's build-ID cache.
    #[arg(short = 'N', long = "no-buildid-cache")]
    pub no_buildid_cache: bool,
    /// Look user DSOs up under this sysroot (a copy of the recorded machine's files).
    #[arg(long = "symfs", value_name = "DIR")]
    pub symfs: Option<PathBuf>,
    /// Memory a stream input may keep across its batches: the process model, the
    /// build-ID records it carries, its events and features (e.g. 512M, 2G; see
    /// "Limits" in docs/guarantees.md). A stream that needs more stops with an error.
    #[arg(long = "stream-memory", value_name = "SIZE", value_parser = pdinject::limits::parse_size, default_value = pdinject::limits::DEFAULT_STREAM_MEMORY_ARG)]
    pub stream_memory: u64,
    /// Write the event attributes at the size this perf reads (an older perf refuses
    /// larger ones); refused when a field that size has no room for is not zero.
    /// Default: the input's attrs as they are.
    #[arg(long = "attrs-for", value_name = "PERF", value_enum)]
    pub attrs_for: Option<AttrsForArg>,
    /// JIT code as DSOs (perf inject's -j, --jit): each jitdump a process mapped
    /// (jit-PID.dump) becomes one ELF image beside it and an MMAP2 record per code
    /// load, at its time (see docs/jit.md). Record with perf record -k 1.
    #[arg(short = 'j', long = "jit")]
    pub jit: bool,
}

impl EngineArgs {
    /// `--attrs-for` as the library takes it.
    pub fn attrs_for(&self) -> AttrsFor {
        match self.attrs_for {
            None => AttrsFor::Verbatim,
            Some(AttrsForArg::Perf6_1) => AttrsFor::Perf6_1,
            Some(AttrsForArg::Perf6_12) => AttrsFor::Perf6_12,
        }
    }

    /// The engine's options; `debuginfod` as `--debuginfod` gave it (single runs).
    pub fn options(&self, debuginfod: Option<&str>) -> Result<Options> {
        if self.unwind_max_frames == 0 {
            return Err(Error::Usage(
                "--unwind-max-frames must be at least 1".into(),
            ));
        }
        pdinject::limits::check_stream_memory(self.stream_memory)?;
        if let Some(root) = &self.symfs
            && !root.is_dir()
        {
            return Err(Error::Usage(format!(
                "--symfs {}: not a directory",
                root.display()
            )));
        }
        let cache = if self.no_buildid_cache {
            None
        } else {
            let dir = pdinject::buildid::cache::BuildIdCache::locate(self.buildid_dir.as_deref())
                .map_err(Error::Usage)?;
            Some(pdinject::buildid::cache::BuildIdCache {
                dir,
                symfs: self.symfs.clone(),
                debuginfod: pdinject::buildid::debuginfod::urls(debuginfod)
                    .map_err(Error::Usage)?,
            })
        };
        Ok(Options {
            mode: if self.buildid_all || self.mmap2_buildid_all {
                Mode::All
            } else {
                Mode::Hit
            },
            known: match &self.known_build_ids {
                Some(s) => parse_known(s)?,
                None => Vec::new(),
            },
            unwind: match self.unwind {
                UnwindArg::Auto => UnwindChoice::Auto,
                UnwindArg::None => UnwindChoice::None,
                UnwindArg::Fp => UnwindChoice::Fp,
                UnwindArg::Dwarf => UnwindChoice::Dwarf,
            },
            unwind_budget: self.unwind_budget,
            max_frames: self.unwind_max_frames,
            mmap2: self.mmap2_buildid_all || self.mmap2_buildids,
            attrs_for: self.attrs_for(),
            cache,
            symfs: self.symfs.clone(),
            stream_memory: self.stream_memory,
            jit: if self.jit {
                pdinject::jit::JitChoice::Inject
            } else {
                pdinject::jit::JitChoice::Off
            },
            ..Options::default()
        })
    }
}

/// Parses `500us`, `1ms`, `2s`, `100ns` (a bare number is milliseconds).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration like 500us, 1ms or 2s"))?;
    let ns = match unit.trim() {
        "ns" => v,
        "us" | "µs" => v * 1e3,
        "" | "ms" => v * 1e6,
        "s" => v * 1e9,
        u => return Err(format!("unknown duration unit '{u}' (ns, us, ms, s)")),
    };
    if !ns.is_finite() || !(0.0..=3.6e12).contains(&ns) {
        return Err(format!("'{s}' is out of range"));
    }
    Ok(Duration::from_nanos(ns as u64))
}

/// `-j N`: before `-j` became perf's `--jit`, it was the worker count. A number after
/// `-j` (or `-jN`) is that old spelling: a usage error that says what to write, rather
/// than N taken as an input path.
pub fn jobs_hint(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let args: Vec<std::ffi::OsString> = args.collect();
    let number = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    for (i, a) in args.iter().enumerate() {
        let b = a.as_encoded_bytes();
        if b == b"--" {
            break;
        }
        let n = if b == b"-j" {
            args.get(i + 1)
                .map(|n| n.as_encoded_bytes())
                .filter(|n| number(n) && !std::path::Path::new(args[i + 1].as_os_str()).exists())
        } else {
            b.strip_prefix(b"-j").filter(|n| number(n))
        };
        if let Some(n) = n {
            let n = String::from_utf8_lossy(n);
            return Some(format!(
                "-j is --jit now (as in perf inject); for {n} worker threads write --jobs {n}"
            ));
        }
    }
    None
}

/// Runs the binary; returns the exit code.
pub fn main() -> i32 {
    pdinject::write::interrupt::install();
    if let Some(m) = jobs_hint(std::env::args_os().skip(1)) {
        eprintln!("pdinject: {m}");
        return 2;
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "batch") {
        return batch::main(std::env::args_os().skip(1));
    }
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match execute(&args) {
        Ok(()) => 0,
        Err(Error::Usage(m)) => {
            eprintln!("pdinject: {m}");
            2
        }
        Err(e) => {
            eprintln!("pdinject: {e}");
            1
        }
    }
}

fn execute(args: &Args) -> Result<()> {
    let mut paths = args.paths.iter();
    let input = args.input_flag.clone().or_else(|| paths.next().cloned());
    let output = args.output_flag.clone().or_else(|| paths.next().cloned());
    if paths.next().is_some() {
        return Err(Error::Usage("too many paths: give IN and OUT".into()));
    }
    if args.in_place {
        args.engine.attrs_for().check_in_place()?;
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
fn execute_with(args: &Args, input: &PathBuf, output: Option<&PathBuf>) -> Result<()> {
    // A stream in or out: the streaming pipeline, quiet apart from the summary (a
    // pipeline's terminal belongs to perf record and perf report too).
    let dash = |p: &PathBuf| p.as_os_str() == "-";
    let stream = dash(input) || output.is_some_and(dash);
    if let Some(j) = args.jobs {
        pdinject::limits::check_jobs(j)?;
    }
    let bar = (!args.quiet && !stream && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:8} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    });
    let progress = bar.clone().map(|b| {
        Arc::new(move |stage: &str, done: u64, total: u64| {
            b.set_length(total);
            if b.message() != stage {
                b.set_message(stage.to_string());
            }
            b.set_position(done);
        }) as ProgressFn
    });
    if args.engine.no_buildid_cache && args.archive.is_some() {
        return Err(Error::Usage(
            "--archive is made from the build-ID cache; it cannot go with --no-buildid-cache"
                .into(),
        ));
    }
    let opts = Options {
        jobs: args.jobs,
        progress,
        in_place: output.is_none(),
        ..args.engine.options(args.debuginfod.as_deref())?
    };
    // One proof per DSO file: the unwind tables and the identify stage both prove the
    // files they read, and the memo (exact: keyed by what the file is now and what
    // the recording says of it) answers the second from the first.
    let _memo = pdinject::buildid::memo::install(Arc::new(pdinject::buildid::memo::Memo::new()));
    // Cache totals and the archive go into the report before it is written: the
    // report is committed together with the output (one run, one outcome).
    let cache_dir = opts.cache.as_ref().map(|c| c.dir.clone());
    let mut finish = |report: &mut pdinject::report::Report| -> Result<()> {
        report.verbose_timings = args.verbose;
        let Some(dir) = &cache_dir else {
            return Ok(());
        };
        pdinject::buildid::cache::totals(report, dir);
        if let Some(a) = &args.archive {
            let sum = pdinject::buildid::archive::write(report, dir, a)?;
            report.notes.push(format!(
                "archive {}: {} cache entries, {} bytes (unpack with: tar xf {} -C ~/.debug)",
                a.display(),
                sum.entries,
                sum.bytes,
                a.display()
            ));
        }
        Ok(())
    };
    let result = match output {
        Some(output) => {
            pdinject::run::run_staged(input, output, &opts, args.report.as_deref(), &mut finish)
        }
        // In place, the file itself is the output, already in its new state: the
        // report follows it.
        None => (|| {
            if let Some(r) = &args.report {
                pdinject::report::check_report_path(r, input, input)?;
            }
            let mut report = pdinject::run::run_in_place(input, &opts)?;
            finish(&mut report)?;
            if let Some(r) = &args.report {
                pdinject::report::stage_json(&report, r)?.commit()?;
            }
            Ok(report)
        })(),
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let report = result?;
    if !args.quiet {
        let _ = report.print_human(&mut std::io::stderr().lock());
    }
    Ok(())
}
