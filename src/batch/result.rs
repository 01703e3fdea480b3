//! What a batch tells of each input ([`FileResult`], one JSON line each) and of the
//! whole ([`Summary`]).

use super::dest::{Dest, output_path};
use super::discover::Input;
use crate::buildid::memo::MemoStats;
use crate::report::Report;
use serde::Serialize;

/// How an input ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Output written.
    Ok,
    /// Not processed: see `error`.
    Failed,
    /// Output already up to date: see `skipped`.
    Skipped,
}

/// One line of the batch report.
#[derive(Clone, Debug, Serialize)]
pub struct FileResult {
    /// How it ended.
    pub status: Status,
    /// Why it failed.
    pub error: Option<String>,
    /// Why it was skipped.
    pub skipped: Option<String>,
    /// Something the user should know about a done input (its up-to-date marker could
    /// not be written).
    pub warning: Option<String>,
    /// Input bytes.
    pub input_bytes: u64,
    /// Wall time of this input in seconds.
    pub seconds: f64,
    /// The single-file report (only input and output set unless status is ok).
    #[serde(flatten)]
    pub report: Report,
}

impl FileResult {
    /// `input` not done (yet): failed, with `error` when there is one.
    pub(super) fn failed(input: &Input, dest: &Dest, error: Option<String>) -> FileResult {
        FileResult {
            status: Status::Failed,
            error,
            skipped: None,
            warning: None,
            input_bytes: input.bytes,
            seconds: 0.0,
            report: Report {
                input: input.path.display().to_string(),
                output: output_path(dest, input).display().to_string(),
                ..Report::default()
            },
        }
    }
}

/// Totals of a batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Inputs handled (this shard's).
    pub inputs: usize,
    /// Written.
    pub ok: usize,
    /// Failed.
    pub failed: usize,
    /// Up to date, skipped.
    pub skipped: usize,
    /// Input bytes of this shard.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Worker threads.
    pub jobs: usize,
    /// DSO files read, proofs run, memo hits.
    #[serde(flatten)]
    pub memo: MemoStats,
}
