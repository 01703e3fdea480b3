//! What every part of the unwinder speaks of, below all of them: section bytes and
//! one DSO's unwind tables ([`DsoUnwind`]), the image slots each worker's one address
//! space is made of ([`image_addr`], [`image_dso`]), a sample's stack
//! ([`SampleStack`]) and the frames found in it ([`Frame`]).

use crate::buildid::elf::{CtimeEvidence, FileTimes, Segment};
use crate::format::Endian;
use crate::model::{DsoId, Key, MapEntry};
use crate::resolve::cfi::EhFrameRules;
use framehop::ExplicitModuleSectionInfo;
use std::ops::{Deref, Range};
use std::sync::{Arc, OnceLock};

/// Section data shared between modules: a range of a reference-counted buffer.
#[derive(Clone, Default)]
pub(crate) struct Bytes(Arc<Vec<u8>>, Range<usize>);

impl Bytes {
    /// All of `data`, shared.
    pub(super) fn whole(data: Vec<u8>) -> Bytes {
        let n = data.len();
        Bytes(Arc::new(data), 0..n)
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[self.1.clone()]
    }
}

/// The unwind sections of one DSO file and the segments that place them in memory.
pub(crate) struct DsoUnwind {
    /// `(p_offset, p_vaddr)` of each PT_LOAD segment.
    pub(super) segments: Vec<(u64, u64)>,
    pub(super) info: ExplicitModuleSectionInfo<Bytes>,
    /// x86_64 rules from `.eh_frame`, made when an x86_64 worker first meets the DSO
    /// and shared by all (see [`cfi`]).
    pub(super) rules: OnceLock<Option<Arc<EhFrameRules>>>,
    /// The file's times when it was proven and its PT_LOAD segments (see
    /// `UnwindTables::still_proven`).
    pub(super) proven: FileTimes,
    pub(super) loads: Vec<Segment>,
    /// Proven by its build ID alone (see `UnwindTables::load`): its times do not
    /// matter.
    pub(super) by_id: bool,
    /// What excused its ctime when it was proven (see `UnwindTables::still_proven`).
    pub(super) ctime: CtimeEvidence,
}

impl DsoUnwind {
    /// Load bias of mapping `m` of this file: its address minus the file's address.
    pub(super) fn bias(&self, m: &MapEntry) -> Option<u64> {
        // The segment holding the mapped file offset gives the load bias.
        let &(p_offset, p_vaddr) = self
            .segments
            .iter()
            .filter(|(o, _)| *o <= m.pgoff.saturating_add(0xffff))
            .min_by_key(|(o, _)| o.abs_diff(m.pgoff))?;
        let svma_at_start = p_vaddr.wrapping_add(m.pgoff).wrapping_sub(p_offset);
        Some(m.start.wrapping_sub(svma_at_start))
    }
}

/// Where each DSO's image lies in the one address space the unwinder sees (see
/// `Worker`): DSO `d` at `IMAGE_BASE + d * IMAGE_SLOT`, above any user address
/// (x86_64 with 5-level paging and aarch64 with 52-bit VAs stay below 2^57).
pub(super) const IMAGE_BASE: u64 = 1 << 62;
/// Room for one image; framehop looks addresses up as 32-bit offsets from a module's
/// base, so no image it can use is larger.
pub(super) const IMAGE_SLOT: u64 = 1 << 32;

/// The address of `svma` in DSO `d`'s image slot.
pub(super) fn image_addr(d: DsoId, svma: u64) -> Option<u64> {
    if svma >= IMAGE_SLOT {
        return None;
    }
    IMAGE_BASE
        .checked_add(u64::from(d).checked_mul(IMAGE_SLOT)?)?
        .checked_add(svma)
}

/// A word that no mapping moved, kept out of the image slots: a stray stack word (or
/// a kernel address) there would otherwise be taken for code of the DSO whose slot
/// it falls in. In its place is an address that is nothing in any process either,
/// as the word was.
pub(super) fn outside_images(word: u64) -> u64 {
    if word >= IMAGE_BASE { NOWHERE } else { word }
}

/// Where [`outside_images`] puts stray words: above every user address space and
/// below the slots.
pub(super) const NOWHERE: u64 = IMAGE_BASE - (1 << 20);

/// The DSO whose image slot holds `addr`, if any.
pub(super) fn image_dso(addr: u64) -> Option<DsoId> {
    DsoId::try_from(addr.checked_sub(IMAGE_BASE)? / IMAGE_SLOT).ok()
}

/// One frame an unwind found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Inside an executable mapping of this DSO (an image the unwinder knows).
    Dso(DsoId),
    /// An address of the process that no known image holds (anonymous or JIT code, a
    /// DSO without unwind tables, or nothing): to be looked up in the process.
    Address(u64),
}

/// The inputs of one sample's unwind.
pub(crate) struct SampleStack<'a> {
    /// Process.
    pub pid: u32,
    /// Model key of the sample.
    pub key: Key,
    /// `attr.sample_regs_user`.
    pub regs_mask: u64,
    /// Register values.
    pub regs: &'a [u8],
    /// The valid part of the stack copy, starting at the user SP.
    pub stack: &'a [u8],
    /// Byte order of the file.
    pub e: Endian,
}
