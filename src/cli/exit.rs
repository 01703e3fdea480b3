//! The exit codes, decided here and nowhere else (documented in docs/guarantees.md
//! and docs/batch.md).

use pdinject::Error;
use pdinject::batch::Summary;

/// How the process ends. A run killed by a signal (SIGINT, SIGTERM, ...) does not end
/// here: its handler removes the temp files and dies of the signal (130 for Ctrl-C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: the output written (batch: every input done or up to date); `--help` and
    /// `--version`.
    Done = 0,
    /// 1: bad input or an I/O error, no output left behind (batch: every input failed,
    /// or none was found).
    Failed = 1,
    /// 2: a usage error: a flag, a value or a combination that cannot be.
    Usage = 2,
    /// 3 (batch): some inputs failed, the others are done or up to date.
    SomeFailed = 3,
}

impl Exit {
    /// The code the process returns.
    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    /// The exit of a run that ended with `e`.
    pub(crate) fn of_error(e: &Error) -> Exit {
        match e {
            Error::Usage(_) => Exit::Usage,
            _ => Exit::Failed,
        }
    }

    /// The exit of a command line clap did not take (or `--help`, `--version`).
    pub(crate) fn of_clap(e: &clap::Error) -> Exit {
        if e.use_stderr() {
            Exit::Usage
        } else {
            Exit::Done
        }
    }

    /// The exit of a batch that ran.
    pub(crate) fn of_batch(s: &Summary) -> Exit {
        if s.failed == 0 {
            Exit::Done
        } else if s.failed < s.inputs {
            Exit::SomeFailed
        } else {
            Exit::Failed
        }
    }
}
