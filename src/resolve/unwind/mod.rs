//! DWARF unwinding of the user stacks that `perf record --call-graph dwarf` copies into
//! samples (PERF_SAMPLE_REGS_USER + PERF_SAMPLE_STACK_USER), with framehop.
//!
//! Why framehop rather than a hand-written gimli loop: it already evaluates CFI from
//! `.eh_frame` (indexed by `.eh_frame_hdr`) and `.debug_frame`, caches the rule per
//! address (a direct-mapped cache that makes repeated return addresses nearly free),
//! analyses x86_64 epilogues and falls back to frame pointers where CFI is missing,
//! while recovering only the registers return addresses need. A gimli loop would redo
//! all of that for no measurable gain.
//!
//! Unwind sections are loaded once per DSO (keyed by its model identity), when a walk
//! first reaches it, and shared by every process and worker. Each worker unwinds in
//! one address space of DSO images shared by all processes (see [`Worker`]), so the
//! rule found for a return address in libc serves every process that maps libc.
//! Section data is read into memory (not mapped), so a file changing under us cannot
//! fault the process.
//!
//! One file per idea, each using only those named before it: [`types`] (what they all
//! speak of: section bytes, a DSO's tables, the image slots, a sample's stack, a
//! frame), [`clock`] (the CPU-budget clock), [`arch`] (architecture dispatch and
//! registers), [`image`] (the image address space a worker unwinds in), [`tables`]
//! (loading and proving unwind tables, and handing them to the workers), [`walk`] (the
//! walk: [`unwind`] is the entry point, handing out each [`Frame`]).

mod arch;
mod clock;
mod image;
mod tables;
mod types;
mod walk;

pub(crate) use arch::Arch;
pub(crate) use image::Worker;
pub(crate) use tables::UnwindTables;
pub(crate) use tables::WorkerSlots;
pub(crate) use types::SampleStack;
pub(crate) use types::{Bytes, Frame};
pub(crate) use walk::unwind;
pub(crate) use walk::{Outcome, unwind_at};

use std::time::Duration;

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum UnwindMode {
    /// Not at all.
    None,
    /// Frame pointers only (no unwind tables are read).
    Fp,
    /// DWARF CFI, frame pointers where CFI is missing.
    #[default]
    Dwarf,
}

/// Unwinding settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UnwindConfig {
    /// Mode.
    pub mode: UnwindMode,
    /// Architecture.
    pub arch: Arch,
    /// Time allowed per sample.
    pub budget: Duration,
    /// Frames walked at most per sample.
    pub max_frames: usize,
}
