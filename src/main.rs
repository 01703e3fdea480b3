//! The `pdinject` command: a thin front end over the library (flags, progress bars,
//! the printed summary, exit codes); see `cli`.

mod cli;

fn main() {
    std::process::exit(cli::main().code());
}
