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
pub mod write;

/// What the command line needs besides the API: its flags' defaults and checks, the
/// build-ID cache it names for `--archive`, debuginfod's settings, the signal handlers.
pub mod cli_support {
    pub use crate::{
        buildid::archive::write as write_archive,
        buildid::cache::BuildIdCache,
        buildid::debuginfod,
        buildid::store::PRINTED_NOT_STORED,
        buildid::vouch::{DPKG_ADMINDIR, Remember, Vouchers},
        engine::check_handles,
        limits::{DEFAULT_STREAM_MEMORY_ARG, check_jobs, check_stream_memory, parse_size},
        live::{DEFAULT_BUDGET_ARG, LiveChoice},
        report::{check_report_path, stage_json},
        signals::install as install_signal_handlers,
    };
}

/// The rooms' parts the tests, benches and fuzzers drive directly (their entry points
/// and the views they check), one namespace a room; not part of the API.
#[doc(hidden)]
pub mod testing {
    pub mod aslr {
        pub use crate::aslr::{
            layout::{Config, Event, Inherit, Layout, LayoutBuilder, MapClass},
            remap::{SampleCtx, Verdict, callchain_deferred, kind, ksymbol, mmap, record, sample},
        };
    }
    pub mod buildid {
        pub use crate::buildid::{
            LocalFiles, Reason, RecordingStart,
            cache::BuildIdCache,
            debuginfod::fetch,
            elf::{build_id_from_notes, build_id_of_image},
        };
    }
    pub mod driver {
        pub use crate::driver::{analyse, run_in_place, stream, validate, validate_bytes};
    }
    pub mod format {
        pub use crate::format::{
            Endian,
            attr::{Attr, read_attrs},
            buildid::{BuildId, parse_build_id_table},
            c_str,
            compressed::{InnerStream, payload},
            header::{FileHeader, pipe_header},
            jitdump::{Reader, Record, lines},
            record::{
                FileIdent, Fork, Mmap, PROT_EXEC, RecordHeader, TrailerLayout, misc,
                out_of_band_len, parse_mmap, rt,
            },
            sample::{SampleLayout, sample_id, sample_time, u64s},
        };
    }
    pub mod limits {
        pub use crate::limits::{
            DEFAULT_STREAM_MEMORY, MODEL_DSO_COST, MODEL_EVENT_COST, STREAM_ATTR_COST,
            STREAM_ID_COST, format_size,
        };
    }
    pub mod live {
        pub use crate::live::{Capture, LiveAnswer, LiveConfig, MapArrival, Offered, PerfClock};
    }
    pub mod model {
        pub use crate::model::{Key, Model, ModelBuilder};
    }
    pub mod resolve {
        pub use crate::resolve::{
            callchain::{Space, walk},
            unwind::{Arch, SampleStack, UnwindConfig, UnwindMode, UnwindTables, Worker, unwind},
        };
    }
    pub mod write {
        pub use crate::write::temp_name;
    }
}
