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
//! The engine does not know which sink it feeds, and a sink does not reach into the
//! engine: the driver (`driver`) hands it [`Facts`], what the engine has read
//! and decided, as a value. A new output form is a new sink.
//!
//! Imports: `format`, `input`, `model`, `buildid`, `write`, `options`, `report`, and the
//! engine's plain data (`engine::{Decision, MappingRecord}`); never the engine itself
//! or the driver.

pub(crate) mod edited;
pub(crate) mod inplace;
pub(crate) mod mmap2;
mod splice;
pub(crate) mod stream;
pub(crate) mod table;

use crate::engine::{Decision, MappingRecord};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::buildid::TableEntry;
use crate::input::PerfInput;
use crate::report::SinkReport;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How the input starts.
pub(crate) enum Begin<'a> {
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
pub(crate) enum Batch<'a> {
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

/// What the engine has read and decided, as a sink needs it: built by the driver
/// for each batch and for the end, borrowed from the engine for that call only.
pub(crate) struct Facts<'a> {
    /// The input's name in messages.
    pub name: &'a Path,
    /// The input's byte order.
    pub endian: Endian,
    /// The events so far.
    pub attrs: &'a [Attr],
    /// The bodies of a stream's HEADER_ATTR records (attr bytes, then u64 ids).
    pub attr_records: &'a [Vec<u8>],
    /// Feature payloads a stream carried in HEADER_FEATURE records, by bit.
    pub stream_features: &'a BTreeMap<u32, Vec<u8>>,
    /// Every decision so far, in table order (address space, then name).
    pub decided: &'a BTreeMap<(bool, String), Decision>,
    /// The mapping records outside compressed data not yet written, in input order.
    pub mapping_records: &'a [MappingRecord],
    /// Offsets of a stream's HEADER_ATTR, HEADER_FEATURE and HEADER_BUILD_ID records
    /// outside compressed data not yet written, ascending.
    pub user_records: &'a [u64],
    /// COMPRESSED records seen so far (their inner mapping records are not in
    /// `mapping_records`).
    pub compressed_records: u64,
    /// A stream's records whose size is not a multiple of 8, but HEADER_FEATURE and
    /// COMPRESSED ones (which perf 7.3 reads unaligned).
    pub unaligned_records: u64,
    /// Whether an entry of the input's table (or a HEADER_BUILD_ID record of the
    /// input) may be passed on: the engine's judgement of what the input claims.
    pub passes_on: &'a dyn Fn(&TableEntry) -> bool,
    /// A sink that keeps `bytes` of a stream's records for the end of its output
    /// checks them, with everything the stream keeps, against its budget; the second
    /// argument is the offset of the record that grew them.
    pub output_kept: &'a dyn Fn(u64, u64) -> Result<()>,
    /// What the stages beside the identify made of the records (conversion, JIT
    /// splices, the new layout, the live capture).
    pub stages: Staged<'a>,
    /// Whether records are ordered by time (else by number alone).
    pub time_mode: bool,
    /// The number of the first record of each data file (an editing sink walks a
    /// file's records by the numbers the scan gave them).
    pub first_seqs: &'a [u64],
}

/// What the stages beside the identify made of the records, each there when its mode
/// is on.
#[derive(Clone, Copy)]
pub(crate) struct Staged<'a> {
    /// `--convert-callchain`: the records as the resolve converted them.
    pub spill: Option<&'a crate::convert::Spill>,
    /// `--jit`: the records spliced into the data and those dropped from it.
    pub splices: Option<&'a crate::jit::Splices>,
    /// `--aslr`: the layout the addresses move to.
    pub layout: Option<&'a crate::aslr::layout::Layout>,
    /// live capture hook (issue 32): the files captured while mapped, whose IDs a
    /// mapping record can carry where a path-keyed table cannot (two files at one
    /// path).
    pub live: Option<&'a crate::live::Capture>,
}

impl<'a> Facts<'a> {
    /// Every decision so far, in table order.
    pub(crate) fn decisions(&self) -> impl Iterator<Item = &'a Decision> + use<'a> {
        self.decided.values()
    }

    /// See [`Facts::passes_on`](field@Facts::passes_on).
    pub(crate) fn passes_on(&self, e: &TableEntry) -> bool {
        (self.passes_on)(e)
    }

    /// See [`Facts::output_kept`](field@Facts::output_kept).
    pub(crate) fn check_output_kept(&self, bytes: u64, offset: u64) -> Result<()> {
        (self.output_kept)(bytes, offset)
    }

    /// Offsets in `[from, to)` of [`Facts::user_records`](field@Facts::user_records).
    pub(crate) fn user_records_in(&self, from: u64, to: u64) -> &'a [u64] {
        let a = self.user_records.partition_point(|&o| o < from);
        let b = self.user_records.partition_point(|&o| o < to);
        &self.user_records[a..b]
    }
}

/// An output form.
pub(crate) trait Sink {
    /// Before the first batch. A sink may start work beside the stages (the copy of a
    /// file's data); when that work fails it sets `stop`, which ends the stages at
    /// their next chunk.
    fn begin(&mut self, begin: &Begin<'_>, stop: &Arc<AtomicBool>) -> Result<()>;
    /// One batch.
    fn batch(&mut self, batch: &Batch<'_>, facts: &Facts<'_>) -> Result<()>;
    /// After the last batch.
    fn finish(&mut self, facts: &Facts<'_>) -> Result<SinkReport>;
    /// Bytes of the input that work beside the stages keeps mapped at a time (the
    /// copy's window): the scan keeps less for the resolve, so the two stay within
    /// one bound of resident memory (`driver::file::KEEP_BYTES`).
    fn mapped_beside(&self) -> u64 {
        0
    }
    /// Where a file input's `--convert-callchain` spill goes (the resolve converts
    /// into it, `convert::Spill`); `None` (the default): the sink does not
    /// convert.
    fn spill_dir(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// The run failed: stop what runs beside the stages. Returns that work's own
    /// error when it failed first (it explains why the stages stopped).
    fn abort(&mut self) -> Option<Error> {
        None
    }
}

/// Writes nothing: validation and fuzzing run the engine alone.
pub(crate) struct NullSink;

impl Sink for NullSink {
    fn begin(&mut self, _: &Begin<'_>, _: &Arc<AtomicBool>) -> Result<()> {
        Ok(())
    }
    fn batch(&mut self, _: &Batch<'_>, _: &Facts<'_>) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self, _: &Facts<'_>) -> Result<SinkReport> {
        Ok(SinkReport::default())
    }
}
