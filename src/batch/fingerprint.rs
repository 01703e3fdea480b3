//! The resume fingerprint: the options that change an output, stored in each marker
//! so a rerun with other options redoes the output.
//!
//! [`Fingerprint::of`] takes [`Options`] apart field by field with no `..`: a new
//! option does not compile until it is either carried here or said, beside its `_`,
//! not to change what is written. [`Fingerprint`]'s rendering destructures it the same
//! way, so a carried field cannot be left out of the string either.

use crate::format::buildid::BuildId;
use crate::options::{AttrsFor, Callchains, Form, Mode, Options, UnwindChoice, Unwinding};
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// Every option that changes an output.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fingerprint<'a> {
    mode: Mode,
    known: &'a [(BuildId, String)],
    unwind: UnwindChoice,
    unwind_budget: Duration,
    max_frames: usize,
    symfs: Option<&'a Path>,
    mmap2: bool,
    attrs_for: AttrsFor,
    callchains: Callchains,
    jit: crate::options::JitChoice,
    addresses: crate::options::Addresses,
    /// dpkg's database and --trust-same-layout (the cache's link record is the
    /// cache's state, as a file's times are: not an option).
    dpkg: Option<&'a Path>,
    same_layout: bool,
}

impl<'a> Fingerprint<'a> {
    /// The fingerprint of `o`.
    pub(crate) fn of(o: &'a Options) -> Fingerprint<'a> {
        let Options {
            mode,
            known,
            unwind:
                Unwinding {
                    how: unwind,
                    budget: unwind_budget,
                    max_frames,
                },
            symfs,
            form,
            attrs_for,
            callchains,
            jit,
            addresses,
            // How fast, not what: threads and progress.
            jobs: _,
            progress: _,
            // The cache is filled beside the output, never written into it.
            cache: _,
            // The symbol store too (docs/store.md: a store added to a rerun needs
            // --force to see the outputs already done).
            store: _,
            // The same results either way (engine::Beside); and a limit: a stream
            // over it fails and leaves no output.
            memory: _,
            vouchers,
            // live capture hook (issue 32): a batch reads saved recordings, which
            // are never captured live.
            live: _,
        } = o;
        Fingerprint {
            mode: *mode,
            known,
            unwind: *unwind,
            unwind_budget: *unwind_budget,
            max_frames: *max_frames,
            symfs: symfs.as_deref(),
            mmap2: *form == Form::Mmap2,
            attrs_for: *attrs_for,
            callchains: *callchains,
            jit: *jit,
            addresses: *addresses,
            dpkg: vouchers.dpkg.as_deref(),
            same_layout: vouchers.same_layout,
        }
    }
}

/// The marker's `options` string, as earlier versions wrote it (their markers still
/// match): an option added later is named only when it is not its default.
impl fmt::Display for Fingerprint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Fingerprint {
            mode,
            known,
            unwind,
            unwind_budget,
            max_frames,
            symfs,
            mmap2,
            attrs_for,
            callchains,
            jit,
            addresses,
            dpkg,
            same_layout,
        } = self;
        let known: Vec<String> = known.iter().map(|(id, p)| format!("{id} {p}")).collect();
        write!(
            f,
            "mode={mode:?};known={};unwind={unwind:?};unwind_budget_ns={};max_frames={max_frames};symfs={symfs:?};mmap2={mmap2}",
            known.join(","),
            unwind_budget.as_nanos(),
        )?;
        match attrs_for {
            AttrsFor::Verbatim => {}
            a => write!(f, ";attrs_for={}", a.perf())?,
        }
        match callchains {
            Callchains::AsRecorded => Ok(()),
            Callchains::Converted => write!(f, ";convert_callchain"),
        }?;
        match jit {
            crate::options::JitChoice::Off => Ok(()),
            crate::options::JitChoice::Inject(crate::options::JitMaps::Touched) => {
                write!(f, ";jit=touched")
            }
            crate::options::JitChoice::Inject(crate::options::JitMaps::Every) => {
                write!(f, ";jit=all")
            }
        }?;
        if *addresses == crate::options::Addresses::Remapped {
            write!(f, ";aslr")?;
        }
        if *dpkg != Some(Path::new(crate::buildid::vouch::DPKG_ADMINDIR)) {
            write!(f, ";dpkg_admindir={dpkg:?}")?;
        }
        if *same_layout {
            write!(f, ";trust_same_layout")?;
        }
        Ok(())
    }
}

/// The options that change an output, as one string (stored in each marker).
pub(crate) fn fingerprint(o: &Options) -> String {
    Fingerprint::of(o).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_markers_hold() {
        // Pinned: markers written by earlier versions must still match.
        assert_eq!(
            fingerprint(&Options::default()),
            "mode=Hit;known=;unwind=Auto;unwind_budget_ns=1000000;max_frames=512;symfs=None;mmap2=false"
        );
        let o = Options {
            symfs: Some("/sysroot".into()),
            attrs_for: AttrsFor::Perf6_1,
            jobs: Some(3),
            ..Options::default()
        };
        assert_eq!(
            fingerprint(&o),
            "mode=Hit;known=;unwind=Auto;unwind_budget_ns=1000000;max_frames=512;symfs=Some(\"/sysroot\");mmap2=false;attrs_for=6.1"
        );
    }
}
