//! The command line: one clap parser for `pdinject IN OUT` and `pdinject batch`, the
//! flags they share declared once ([`args::RunArgs`]), flags as perf inject spells
//! them, a progress bar on terminals, the summary, and the exit codes ([`exit::Exit`]).
//! Parsing and error context live here; the work is the library's.

pub mod args;
pub mod batch;
pub mod exit;
mod progress;
pub mod single;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use exit::Exit;

/// Writes the build IDs of every DSO a perf.data file's samples touch into the file's
/// build-ID table, never a wrong one.
#[derive(Parser, Debug)]
#[command(
    name = "pdinject",
    version,
    about,
    long_about = None,
    // `pdinject IN OUT` takes no subcommand: a word after a flag or a path is a path
    // (as before the subcommand, when only argv[1] could say `batch`), and `help` is
    // a file name, not a command.
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    subcommand_value_name = "COMMAND",
)]
pub struct Cli {
    /// A mode other than one recording.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// One recording: `pdinject [FLAGS] IN OUT`.
    #[command(flatten)]
    pub single: single::SingleArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Writes build IDs into many perf.data files: one thread pool, one memo of DSO
    /// build IDs, per-file errors that never stop the batch.
    #[command(version, display_name = "pdinject batch", after_help = batch::AFTER_HELP)]
    Batch(batch::BatchArgs),
}

/// Runs the binary.
pub fn main() -> Exit {
    pdinject::signals::install();
    let parsed = Cli::command()
        .mut_subcommand("batch", batch::help)
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Exit::of_clap(&e);
        }
    };
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
