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

pub mod batch;
pub mod buildid;
pub mod convert;
pub mod driver;
pub mod engine;
pub mod error;
pub mod format;
pub mod input;
pub mod jit;
pub mod limits;
pub mod model;
pub mod options;
pub mod perfconfig;
pub mod report;
pub mod resolve;
pub mod signals;
pub mod sink;
pub mod write;

pub use driver::run;
pub use error::{Error, Result};
pub use options::Options;
