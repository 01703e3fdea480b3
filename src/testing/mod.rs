//! What the integration tests, the benches and the fuzz targets reach besides the API
//! (`#[doc(hidden)]`, not part of it). The tests run pdinject as users do (the binary,
//! or the API) wherever that shows what they check; what is here is what cannot be
//! reached that way: the engine with no output and a stream from memory with a chosen
//! batch size, the live capture core driven with mappings of the test's own making,
//! the name of a temporary output, and one entry function per fuzz target.

pub mod fuzz;

/// The engine with no output, on a file or on bytes, and a stream from memory to
/// memory with a chosen batch size.
pub mod driver {
    pub use crate::driver::{analyse, stream_in_batches, validate_bytes};
}

/// The live capture core, offered mappings as perf would record them.
pub mod live {
    pub use crate::format::record::FileIdent;
    pub use crate::live::{Capture, LiveAnswer, LiveConfig, MapArrival, Offered, PerfClock};
}

/// The name a temporary output takes (batch's clean-up of a dead run's leftovers).
pub mod write {
    pub use crate::write::temp_name;
}
