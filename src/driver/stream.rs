//! A stream (`perf record -o -`) into a sink: many batches, which the engine reads
//! and runs (`engine::stream::process_stream`); and how a stream is told from a file.

use super::output::Fed;
use crate::engine::Context;
use crate::error::Result;
use crate::format::header::pipe_header;
use crate::report::Report;
use crate::sink::Sink;

pub(crate) use crate::engine::stream::{BATCH_BYTES, StreamInput};

/// Runs a stream (`perf record -o -`) through the engine into `sink`, batch by batch.
/// Memory holds one batch, what the round rule carries to the next (at most two
/// batches) and the model; what it carries and keeps has a budget
/// ([`crate::limits::StreamKept`], `--stream-memory`).
pub(crate) fn run_stream(
    cx: Context<'_>,
    input: StreamInput<'_>,
    sink: &mut dyn Sink,
) -> Result<Report> {
    crate::engine::stream::process_stream(cx, input, &mut Fed(sink))
}

/// Whether `head` (the first bytes of an input) is a pipe-format header.
pub(crate) fn is_stream_header(head: &[u8]) -> bool {
    pipe_header(head).is_some()
}
