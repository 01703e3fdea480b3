//! The command line: one clap parser for `pdinject IN OUT` and `pdinject batch`, the
//! flags they share declared once ([`args::RunArgs`]), flags as perf inject spells
//! them, a progress bar on terminals, the summary, and the exit codes ([`exit::Exit`]).
//! Parsing and error context live here; the work is the library's.

pub(crate) mod args;
pub(crate) mod batch;
pub(crate) mod exit;
pub(crate) mod generate;
mod progress;
pub(crate) mod single;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use exit::Exit;

/// `pdinject --version`: the version and the commit it was built from (`build.rs`;
/// `unknown` when built from neither a git work tree nor a crate tarball that says).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PDINJECT_COMMIT"),
    ")"
);

/// Writes the build IDs of every DSO a perf.data file's samples touch into the file's
/// build-ID table, never a wrong one.
#[derive(Parser, Debug)]
#[command(
    name = "pdinject",
    version = VERSION,
    about,
    long_about = None,
    // `pdinject IN OUT` takes no subcommand: a word after a flag or a path is a path
    // (as before the subcommand, when only argv[1] could say `batch`), and `help` is
    // a file name, not a command.
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    subcommand_value_name = "COMMAND",
)]
pub(crate) struct Cli {
    /// A mode other than one recording.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// One recording: `pdinject [FLAGS] IN OUT`.
    #[command(flatten)]
    pub single: single::SingleArgs,
    /// Print a man page (man: pdinject.1, man-batch: pdinject-batch.1) or a shell's
    /// completions (complete-bash, complete-zsh, complete-fish) to stdout, made from
    /// this parser; see docs/install.md for where each goes.
    #[arg(long = "generate", value_name = "WHAT", exclusive = true)]
    pub generate: Option<generate::Generate>,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Writes build IDs into many perf.data files: one thread pool, one memo of DSO
    /// build IDs, per-file errors that never stop the batch.
    #[command(version = VERSION, display_name = "pdinject batch", after_help = batch::AFTER_HELP)]
    Batch(batch::BatchArgs),
}

/// `-j N`: before `-j` became perf's `--jit`, it was the worker count. A number after
/// `-j` (or `-jN`) is that old spelling: a usage error that says what to write, rather
/// than N taken as an input path.
pub(crate) fn jobs_hint(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
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

/// The command line as the binary parses it (and as `--generate` describes it).
pub(crate) fn command() -> clap::Command {
    Cli::command().mut_subcommand("batch", batch::help)
}

/// Runs the binary.
pub(crate) fn main() -> Exit {
    pdinject::cli_support::install_signal_handlers();
    if let Some(m) = jobs_hint(std::env::args_os().skip(1)) {
        eprintln!("pdinject: {m}");
        return Exit::Usage;
    }
    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Exit::of_clap(&e);
        }
    };
    if let Some(what) = cli.generate {
        let mut out = std::io::stdout().lock();
        return match generate::write(what, command(), &mut out).and_then(|()| {
            use std::io::Write;
            out.flush()
        }) {
            Ok(()) => Exit::Done,
            Err(e) => {
                eprintln!("pdinject: --generate: {e}");
                Exit::Failed
            }
        };
    }
    // Errors are named after the command that met them.
    let (command, result) = match &cli.command {
        None => (
            "pdinject",
            single::execute(&cli.single).map(|()| Exit::Done),
        ),
        Some(Command::Batch(b)) => ("pdinject batch", batch::execute(b)),
    };
    result.unwrap_or_else(|e| {
        eprintln!("{command}: {e}");
        Exit::of_error(&e)
    })
}
