//! Batch mode: many recordings in one process, with one memo of DSO build IDs
//! ([`crate::buildid::memo`]), per-file errors that never stop the batch, resumable
//! runs and stable sharding over job arrays.
//!
//! The steps, each usable on its own:
//! [`collect`] turns paths (files, `perf record --threads` directories, directories to
//! walk) into [`Input`]s named relative to their common parent folder;
//! [`Shard`] keeps the inputs one task of a job array owns;
//! [`run`] processes them and calls back once per input with a [`FileResult`] (the
//! single-file [`Report`](crate::report::Report) plus status, error and skip reason: one JSON line each).
//!
//! One file per idea: discovery ([`collect`]), sharding ([`Shard`]), where outputs go
//! ([`Dest`]), up-to-date markers and their [`Fingerprint`], execution ([`run`]), what
//! is told of each input and of the whole ([`FileResult`], [`Summary`]) and the
//! JSON-lines report ([`LineReport`]).

mod dest;
mod discover;
mod exec;
mod fingerprint;
mod marker;
mod report;
mod result;
mod shard;

pub use dest::Dest;
pub use discover::{Input, Listing, WalkSkip, collect, read_list};
pub use exec::{BatchOptions, CONCURRENT_BELOW, run};
pub use report::LineReport;
pub use result::{FileResult, Status, Summary};
pub use shard::{SHARD_COUNT_ENV, Shard};
