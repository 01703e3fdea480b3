//! The integration tests, as one test binary (one link, shared helpers in `common`),
//! run by libtest-mimic (`harness = false`, see `harness`): a test that cannot run
//! its oracle is reported as ignored with the reason (a failure under
//! `PDINJECT_TEST_STRICT=1`), not as passed. How to add a test, and to skip one:
//! docs/testing.md.
//!
//! Every command a test runs (perf and pdinject) gets the test's own empty HOME, so
//! the build-ID cache (~/.debug) and perf's config start empty for each test and the
//! user's are never read or written (see `common::test_home`).

// `#[test]` in every module below is `it_macros::test` (the macro_use prelude comes
// before the built-in attribute): it registers the function with `harness`.
#[macro_use]
extern crate it_macros;

mod common;
mod convert;
mod harness;

mod aslr;
mod attrs;
mod batch;
mod budget;
mod cache;
mod deferred;
mod demo;
mod docs;
mod engine;
mod errors;
mod hostile;
mod inplace;
mod install;
mod jit;
mod large;
mod layers;
mod live;
mod matrix;
mod mmap2;
mod mutation;
mod namespace;
mod perf73;
mod pipe;
mod quipper;
mod record;
mod shortid;
mod signals;
mod slurm;
mod stale;
mod store;
mod trust;
mod unwind;

fn main() -> std::process::ExitCode {
    harness::main()
}
