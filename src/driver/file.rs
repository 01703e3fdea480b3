//! A file-format input into a sink: one batch, which the engine runs whole
//! (`engine::file::process_file`: scan, resolve, the sink's copy beside the stages).

use super::output::Fed;
use crate::engine::Context;
use crate::error::Result;
use crate::input::PerfInput;
use crate::report::Report;
use crate::sink::Sink;

/// Runs a file-format input through the engine into `sink`: one batch.
pub(crate) fn run_file(cx: Context<'_>, input: &PerfInput, sink: &mut dyn Sink) -> Result<Report> {
    crate::engine::file::process_file(cx, input, &mut Fed(sink))
}
