//! pdinject: fast, parallel, truthful build-ID injection for Linux `perf.data` files.
//!
//! The library mirrors the pipeline described in the README:
//! [`format`](mod@format) (zero-copy, endian-aware views over perf.data bytes) →
//! [`scan`] (one sequential pass over record headers, chunk boundaries, model events) →
//! [`model`] (an immutable, time-versioned picture of every process's mappings) →
//! [`resolve`] (chunks of samples on a rayon pool mapped to DSOs) →
//! [`buildid`] (finding each hit DSO's build ID, with provenance or a reason) →
//! [`write`](mod@write) (layout-preserving output with the BUILD_ID feature merged in).
//! [`inject`] ties the stages together for files, [`pipe`] runs them as a stream
//! (`perf record -o - | pdinject - -`); [`cli`] is the command-line front end.

pub mod buildid;
pub mod cli;
pub mod error;
pub mod format;
pub mod inject;
pub mod input;
pub mod limits;
pub mod model;
pub mod pipe;
pub mod report;
pub mod resolve;
pub mod scan;
pub mod write;

pub use error::{Error, Result};
