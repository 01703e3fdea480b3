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
pub use driver::{run, run_in_place, run_staged, validate};
pub use error::{Error, Result};
pub use options::{AttrsFor, Callchains, Form, JitChoice, Mode, Options, UnwindChoice};
pub use report::Report;

pub mod batch;
pub mod driver;
pub mod error;
pub mod options;
pub mod report;

// Rooms the tests, benches and fuzzers drive directly (their entry points and the
// views they check); not part of the API.
#[doc(hidden)]
pub mod aslr;
#[doc(hidden)]
pub mod buildid;
#[doc(hidden)]
pub mod format;
#[doc(hidden)]
pub mod limits;
#[doc(hidden)]
pub mod live;
#[doc(hidden)]
pub mod model;
#[doc(hidden)]
pub mod resolve;
#[doc(hidden)]
pub mod signals;
#[doc(hidden)]
pub mod write;

// Rooms only the library itself uses.
pub(crate) mod convert;
pub(crate) mod engine;
pub(crate) mod input;
pub(crate) mod jit;
pub(crate) mod perfconfig;
pub(crate) mod sink;
