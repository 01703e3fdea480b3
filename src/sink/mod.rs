//! Where the engine's results go. A sink gets the input's start, then each batch's
//! final bytes with the decisions those bytes need first, then the end; it writes
//! one output form:
//!
//! * [`table::TableSink`]: a file-format perf.data with the BUILD_ID table (from a
//!   file: the bytes are copied beside the stages and the feature tail rebuilt; from
//!   a stream: the records are written as the data section, attrs and features
//!   moved into the header);
//! * [`stream::StreamSink`]: a stream (`perf record -o -` format) with a
//!   HEADER_BUILD_ID record before the first sample that needs it (from a file: the
//!   header turned into HEADER_ATTR and HEADER_FEATURE records first);
//! * [`mmap2::Mmap2Sink`]: either of those with the mapping records of decided
//!   DSOs in build-ID form (`--mmap2-buildid-all`, `--mmap2-buildids`).
//!
//! The engine does not know which sink it feeds; a new output form is a new sink.

pub mod convert;
pub mod inplace;
pub mod mmap2;
pub mod stream;
pub mod table;

use crate::engine::{Decision, Engine};
use crate::format::Endian;
use crate::input::PerfInput;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// How the input starts.
pub enum Begin<'a> {
    /// A file-format input (the sink reads what it copies from the file itself).
    File(&'a PerfInput),
    /// A stream, whose pipe header is given.
    Stream {
        /// The 16 bytes of `struct perf_pipe_file_header`.
        header: &'a [u8],
        /// Its byte order.
        endian: Endian,
    },
}

/// Bytes the engine is done with, and the decisions they need first.
pub enum Batch<'a> {
    /// A file-format input, resolved whole (one batch).
    File {
        /// The input.
        input: &'a PerfInput,
        /// Every decision.
        new: &'a [Decision],
    },
    /// Bytes of a stream, final.
    Bytes {
        /// The records (whole ones, payloads included).
        bytes: &'a [u8],
        /// Their offset in the stream.
        offset: u64,
        /// The DSOs these bytes touch first: perf must know their IDs before them.
        new: &'a [Decision],
    },
}

/// What a sink tells the report.
#[derive(Debug, Default)]
pub struct SinkReport {
    /// IDs the output gained (table entries or records pdinject wrote).
    pub ids_new: usize,
    /// IDs decided that the output cannot hold (no table can be added to it).
    pub ids_lost: usize,
    /// Things the user should know about the output.
    pub notes: Vec<String>,
    /// Wall time of the sink's own stages.
    pub timings: BTreeMap<&'static str, Duration>,
    /// `--in-place`: how the file was changed.
    pub in_place: Option<crate::report::InPlaceReport>,
    /// `--convert-callchain`: what the conversion did.
    pub convert: Option<crate::convert::Counts>,
}

/// An output form.
pub trait Sink {
    /// Before the first batch. A sink may start work beside the stages (the copy of a
    /// file's data); when that work fails it sets `stop`, which ends the stages at
    /// their next chunk.
    fn begin(&mut self, begin: &Begin<'_>, stop: &Arc<AtomicBool>) -> Result<()>;
    /// One batch.
    fn batch(&mut self, batch: &Batch<'_>, engine: &Engine<'_>) -> Result<()>;
    /// After the last batch.
    fn finish(&mut self, engine: &Engine<'_>) -> Result<SinkReport>;
    /// Bytes of the input that work beside the stages keeps mapped at a time (the
    /// copy's window): the scan keeps less for the resolve, so the two stay within
    /// one bound of resident memory (`engine::source::KEEP_BYTES`).
    fn mapped_beside(&self) -> u64 {
        0
    }
    /// The run failed: stop what runs beside the stages. Returns that work's own
    /// error when it failed first (it explains why the stages stopped).
    fn abort(&mut self) -> Option<Error> {
        None
    }
}

/// Writes nothing: validation and fuzzing run the engine alone.
pub struct NullSink;

impl Sink for NullSink {
    fn begin(&mut self, _: &Begin<'_>, _: &Arc<AtomicBool>) -> Result<()> {
        Ok(())
    }
    fn batch(&mut self, _: &Batch<'_>, _: &Engine<'_>) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, _: &Engine<'_>) -> Result<SinkReport> {
        Ok(SinkReport::default())
    }
}
