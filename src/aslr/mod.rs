//! `--aslr` (issue 31): profiles that can leave the building. Every mapping moves to a
//! fixed, deterministic layout as perf 7.3's `perf inject --aslr` lays it out, and every
//! address that names a place in the recorded machine's memory follows or is removed.
//! docs/aslr.md has perf's exact semantics and where pdinject goes further.
//!
//! Two pure parts, ready for the engine's per-chunk record rewrite:
//! - [`layout`]: from the recording's mapping events (and forks), the new start of each
//!   mapping and the remapped value of any address at any time;
//! - [`remap`]: one record's bytes in, its rewritten bytes (or a drop with a reason)
//!   out, given a remapper.

pub mod layout;
pub mod remap;
