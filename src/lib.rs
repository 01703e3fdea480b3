//! pdinject: fast, parallel, truthful build-ID injection for Linux `perf.data` files.
//!
//! The library mirrors the pipeline described in docs/architecture.md:
//! [`format`](mod@format) (zero-copy, endian-aware views over perf.data bytes and the
//! one record-framing primitive) → [`engine`] (scan into the [`model`], [`resolve`]
//! on a rayon pool, [`buildid`] identification with provenance or a reason, over one
//! batch for a file or many for a stream) → a [`sink`] (a file-format perf.data with
//! the BUILD_ID table, or a stream with HEADER_BUILD_ID records). The [`driver`]
//! classifies the input, picks the sink by the output, drives the engine and hands
//! the sink what the engine decided ([`sink::Facts`]); [`options`] is
//! what a run is asked to do; [`report`] what it says it did. The command line lives
//! in the binary (`src/main.rs`), not here.

#![warn(unreachable_pub)]

// The library's API: a run from an input to an output (or in place), what it is asked
// to do, what it says it did, and batch mode. Everything a caller needs is named
// here; the rooms below are reached only by the command line, the tests, the
// benches and the fuzzers.
pub use driver::{run, run_in_place, run_in_place_staged, run_staged, validate};
pub use error::{Error, Result};
pub use options::{AttrsFor, Callchains, Form, JitChoice, Mode, Options, UnwindChoice};
pub use report::Report;

pub mod batch;
pub mod error;
pub mod options;
pub mod report;

pub(crate) mod aslr;
pub(crate) mod buildid;
pub(crate) mod convert;
pub(crate) mod driver;
pub(crate) mod engine;
pub(crate) mod format;
pub(crate) mod input;
pub(crate) mod jit;
pub(crate) mod limits;
pub(crate) mod live;
pub(crate) mod model;
pub(crate) mod perfconfig;
pub(crate) mod resolve;
pub(crate) mod signals;
pub(crate) mod sink;
pub(crate) mod write;

/// What the command line needs besides the API: its flags' defaults and checks,
/// debuginfod's server list, the signal handlers.
pub mod cli_support {
    pub use crate::{
        buildid::debuginfod::servers as debuginfod_servers,
        buildid::store::PRINTED_NOT_STORED,
        buildid::vouch::DPKG_ADMINDIR,
        engine::check_handles,
        limits::{DEFAULT_STREAM_MEMORY_ARG, check_jobs, check_stream_memory, parse_size},
        live::DEFAULT_BUDGET_ARG,
        signals::install as install_signal_handlers,
    };
}

/// What the tests, benches and fuzzers reach besides the API: the fuzz targets'
/// bodies and a few of the rooms' entry points. Not part of the API.
#[doc(hidden)]
pub mod testing;
