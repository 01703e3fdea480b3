//! The integration tests, as one test binary (one link, shared helpers in `common`).
//!
//! Every command a test runs (perf and pdinject) gets the test's own empty HOME, so
//! the build-ID cache (~/.debug) and perf's config start empty for each test and the
//! user's are never read or written (see `common::test_home`).

mod common;
mod convert;

mod aslr;
mod attrs;
mod batch;
mod budget;
mod cache;
mod demo;
mod docs;
mod engine;
mod errors;
mod hostile;
mod inplace;
mod jit;
mod large;
mod layers;
mod matrix;
mod mmap2;
mod mutation;
mod namespace;
mod perf73;
mod pipe;
mod quipper;
mod record;
mod slurm;
mod stale;
mod store;
mod trust;
mod unwind;
