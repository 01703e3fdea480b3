//! Typed errors. Parse errors carry the file offset so the binary can print
//! `pdinject: in.data: offset 0x1a2b40: MMAP2 record of size 12 is shorter than its header says`.

use std::path::PathBuf;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bytes of a perf.data file do not follow the format.
    #[error("{}offset {offset:#x}: {what}", file_prefix(.file))]
    Format {
        /// File the bytes came from (filled in by the stage that knows it).
        file: Option<PathBuf>,
        /// Byte offset in that file.
        offset: u64,
        /// What is wrong, in words.
        what: String,
    },
    /// An I/O operation on a named file failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Valid input that this version does not handle (said plainly, never guessed at).
    #[error("{}{what}", file_prefix(.file))]
    Unsupported {
        /// File concerned, if known.
        file: Option<PathBuf>,
        /// What is not supported.
        what: String,
    },
    /// Writing the output failed (disk full, permissions, ...); nothing is left behind.
    #[error("{}: cannot write the output: {source}", .path.display())]
    Output {
        /// The output the user asked for.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// Something inside pdinject failed (a worker pool that cannot start, a thread
    /// that panicked): not the input's fault, not the user's.
    #[error("internal error: {0}")]
    Internal(String),
    /// The stage stopped early because another part of the run failed (that part's
    /// error is the one to report).
    #[error("stopped: another part of the run failed")]
    Stopped,
}

fn file_prefix(file: &Option<PathBuf>) -> String {
    match file {
        Some(p) => format!("{}: ", p.display()),
        None => String::new(),
    }
}

impl Error {
    /// A format error at `offset` (file filled in later with [`Error::in_file`]).
    pub(crate) fn format(offset: u64, what: impl Into<String>) -> Self {
        Error::Format {
            file: None,
            offset,
            what: what.into(),
        }
    }

    /// An unsupported-input error (file filled in later).
    pub(crate) fn unsupported(what: impl Into<String>) -> Self {
        Error::Unsupported {
            file: None,
            what: what.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Attach the file name to errors that do not carry one yet.
    pub(crate) fn in_file(mut self, path: &std::path::Path) -> Self {
        match &mut self {
            Error::Format { file, .. } | Error::Unsupported { file, .. } if file.is_none() => {
                *file = Some(path.to_path_buf());
            }
            _ => {}
        }
        self
    }
}

impl Error {
    /// Reports I/O errors on the temp output `tmp` (or a file inside it) as errors
    /// writing `target`, the path the user knows.
    pub(crate) fn for_output(self, tmp: &std::path::Path, target: &std::path::Path) -> Self {
        match self {
            Error::Io { path, source } if path.starts_with(tmp) => Error::Output {
                path: target.to_path_buf(),
                source,
            },
            other => other,
        }
    }
}

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
