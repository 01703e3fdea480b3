//! The image address space: each worker unwinds in one address space where each
//! DSO's image lies at its own slot ([`Worker`]); a process's code addresses are moved
//! there ([`ToImage`]) so a rule found for libc serves every process.

use super::arch::{Arch, ArchState, ImageUnwinders};
use super::clock::CpuAnchor;
use super::types::{
    DsoUnwind, Frame, IMAGE_BASE, SampleStack, image_addr, image_dso, outside_images,
};
use super::{UnwindConfig, UnwindMode};
use crate::model::{DsoId, MapEntry, Model, lay_over};
use framehop::aarch64::{CacheAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwinderX86_64};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// A DSO as far as one worker's unwinder knows it.
#[derive(Clone)]
pub(super) enum Image {
    /// Not met yet.
    Unseen,
    /// No unwind tables (not provable, not a user file, or unreadable).
    None,
    /// Added to the unwinder at its slot.
    Known(Arc<DsoUnwind>),
}

/// Per-worker unwinding state.
///
/// The unwinder works in one address space shared by every process: each DSO's
/// image lies at its own slot, and a sample's code addresses (its IP, and each word
/// read from its stack that falls in an executable mapping of its process) are moved
/// there before framehop sees them. framehop caches unwind rules by address, so
/// unwinding in each process's own addresses (ASLR puts every library elsewhere)
/// started each process, and each new mapping of it, with a cold cache: on a
/// recording of many short processes a fifth of all frames missed and evaluated CFI
/// again. In image addresses the rule for a return address in libc is found once per
/// worker. Modules are added only when a DSO is first met, so the cache is
/// invalidated at most once per DSO.
pub(crate) struct Worker {
    pub(super) arch: ArchState,
    pub(super) images: Vec<Image>,
    /// What the workers of one run share.
    pub(super) shared: Arc<Shared>,
    /// A sample's frames with their process addresses (kept for its buffer).
    pub(super) frames: Vec<(Frame, u64)>,
    /// [`ToImage`]'s buffer.
    pub(super) shifts: Vec<Option<Option<u64>>>,
    pub(super) clock: CpuAnchor,
}

/// Process versions whose mappings the workers keep before they forget them all
/// (bounds memory on recordings of many short processes).
pub(super) const MAX_PROCESS_VERSIONS: usize = 4096;

/// What the unwinding workers of one resolve run share: the executable file
/// mappings of each process version met (see [`ToImage`]), listed once for all.
#[derive(Default)]
pub(crate) struct Shared {
    pub(super) exec_maps: Mutex<ExecMaps>,
}

#[derive(Default)]
pub(super) struct ExecMaps {
    /// By process and version.
    pub(super) versions: HashMap<(u32, usize), Arc<[MapEntry]>>,
    /// The newest version of each process listed so far.
    pub(super) newest: HashMap<u32, (usize, Arc<[MapEntry]>)>,
}

/// The executable file mappings of an address space.
pub(super) fn exec_only(maps: Vec<MapEntry>) -> Arc<[MapEntry]> {
    maps.into_iter()
        .filter(|m| m.exec && m.dso.is_some())
        .collect()
}

impl Worker {
    /// Fresh state for `arch` (the unit tests' and the unwind fuzzer's; a run's
    /// workers share one [`Worker::sharing`]).
    pub(crate) fn new(arch: Arch) -> Self {
        Worker::sharing(arch, Arc::default())
    }

    /// Fresh state for `arch`, sharing `shared` with the run's other workers.
    pub(crate) fn sharing(arch: Arch, shared: Arc<Shared>) -> Self {
        let arch = match arch {
            Arch::X86_64 => {
                ArchState::X86(ImageUnwinders::new(UnwinderX86_64::new, CacheX86_64::new))
            }
            Arch::Aarch64 => {
                ArchState::Arm(ImageUnwinders::new(UnwinderAarch64::new, CacheAarch64::new))
            }
        };
        Worker {
            arch,
            images: Vec::new(),
            shared,
            frames: Vec::new(),
            shifts: Vec::new(),
            clock: CpuAnchor::now(),
        }
    }

    pub(super) fn arch(&self) -> Arch {
        match self.arch {
            ArchState::X86(_) => Arch::X86_64,
            ArchState::Arm(_) => Arch::Aarch64,
        }
    }

    /// The executable file mappings of the sample's process as of the sample (none
    /// when unwinding by frame pointers only: addresses then stay the process's).
    pub(super) fn exec_maps(
        &self,
        cfg: &UnwindConfig,
        model: &Model,
        s: &SampleStack,
    ) -> Arc<[MapEntry]> {
        if cfg.mode != UnwindMode::Dwarf {
            return Arc::from([]);
        }
        let v = model.version(s.pid, s.key);
        let Ok(mut t) = self.shared.exec_maps.lock() else {
            return exec_only(model.address_space(s.pid, s.key));
        };
        if let Some(m) = t.versions.get(&(s.pid, v)) {
            return m.clone();
        }
        // The newest version listed before, with the mappings made since laid over
        // it: a process that maps one more library is not listed again whole.
        let maps: Arc<[MapEntry]> = match t.newest.get(&s.pid) {
            Some((v0, m0)) if *v0 < v => match model.mappings_between(s.pid, *v0, v) {
                Some(new) => {
                    let mut maps = m0.to_vec();
                    for m in new {
                        lay_over(&mut maps, m, |m| m.exec && m.dso.is_some());
                    }
                    maps.into()
                }
                None => exec_only(model.address_space(s.pid, s.key)),
            },
            _ => exec_only(model.address_space(s.pid, s.key)),
        };
        if t.versions.len() >= MAX_PROCESS_VERSIONS {
            t.versions.clear();
            t.newest.clear();
        }
        t.versions.insert((s.pid, v), maps.clone());
        if t.newest.get(&s.pid).is_none_or(|(v0, _)| *v0 < v) {
            t.newest.insert(s.pid, (v, maps.clone()));
        }
        maps
    }
}

/// Moves a process's code addresses into image addresses: the translation between
/// the sample's process and the worker's one address space.
pub(super) struct ToImage<'a> {
    /// The process's executable file mappings, sorted.
    pub(super) maps: &'a [MapEntry],
    pub(super) images: &'a [Image],
    /// The sample's stack copy: words pointing into it are not code, and are the most
    /// common words read (saved frame pointers).
    pub(super) stack: Range<u64>,
    /// The last mapping that answered, with the shift into its image (`None`: not
    /// moved).
    pub(super) last: Option<(u64, u64, Option<u64>)>,
    /// The shift of each mapping once worked out (by index in `maps`; the outer
    /// `None`: not yet). A walk reads a handful of mappings over and over.
    pub(super) shifts: &'a mut Vec<Option<Option<u64>>>,
    /// DSOs met in executable mappings that the worker has no image of yet.
    pub(super) unseen: Vec<DsoId>,
}

impl<'a> ToImage<'a> {
    /// Moves addresses of the process mapped as `maps` (sorted) with the images the
    /// worker has; `shifts` is a buffer to reuse.
    pub(super) fn new(
        maps: &'a [MapEntry],
        images: &'a [Image],
        stack: Range<u64>,
        shifts: &'a mut Vec<Option<Option<u64>>>,
    ) -> Self {
        shifts.clear();
        shifts.resize(maps.len(), None);
        ToImage {
            maps,
            images,
            stack,
            last: None,
            shifts,
            unseen: Vec::new(),
        }
    }

    /// The instruction pointer `ip` in image addresses.
    pub(super) fn ip(&mut self, ip: u64) -> u64 {
        self.moved(ip, ip)
    }

    /// A word that may be a return address, in image addresses. The mapping of the
    /// call instruction before it decides (framehop looks return addresses up one
    /// byte back): a return address at the very start of a mapping belongs to what
    /// lies before it.
    pub(super) fn word(&mut self, v: u64) -> u64 {
        self.moved(v, v.wrapping_sub(1))
    }

    /// `addr` moved by the shift of the mapping that holds `at`.
    pub(super) fn moved(&mut self, addr: u64, at: u64) -> u64 {
        if addr >= IMAGE_BASE {
            return outside_images(addr);
        }
        if self.stack.contains(&at) {
            return addr;
        }
        if let Some((start, end, shift)) = self.last
            && start <= at
            && at < end
        {
            return shift.map_or(addr, |s| addr.wrapping_add(s));
        }
        // Saved frame pointers into the stack beyond the copy are most of the words
        // read that are not code: above every mapping.
        if self.maps.last().is_none_or(|m| at >= m.end) {
            return addr;
        }
        let i = self.maps.partition_point(|m| m.start <= at);
        let Some(j) = i.checked_sub(1) else {
            return addr;
        };
        let Some(m) = self.maps.get(j).filter(|m| at < m.end) else {
            return addr;
        };
        let shift = match self.shifts.get(j) {
            Some(Some(shift)) => *shift,
            _ => {
                let shift = self.shift(m);
                if let Some(slot) = self.shifts.get_mut(j) {
                    *slot = Some(shift);
                }
                shift
            }
        };
        self.last = Some((m.start, m.end, shift));
        shift.map_or(addr, |s| addr.wrapping_add(s))
    }

    /// The process address of image address `at`: moved back by the shift of the
    /// mapping of its DSO that moved it (the shift of every mapping met is kept).
    pub(super) fn back(&self, at: u64) -> Option<u64> {
        let d = image_dso(at)?;
        self.maps
            .iter()
            .zip(self.shifts.iter())
            .filter(|(m, _)| m.dso == Some(d))
            .find_map(|(m, shift)| {
                let p = at.wrapping_sub((*shift)??);
                (m.start <= p && p < m.end).then_some(p)
            })
    }

    /// The shift that moves all of mapping `m` into its DSO's image slot, if the
    /// worker knows the image and the whole mapping fits the slot.
    pub(super) fn shift(&mut self, m: &MapEntry) -> Option<u64> {
        let d = m.dso?;
        let t = match self.images.get(d as usize) {
            Some(Image::Known(t)) => t,
            Some(Image::None) => return None,
            Some(Image::Unseen) | None => {
                if !self.unseen.contains(&d) {
                    self.unseen.push(d);
                }
                return None;
            }
        };
        let image_start = image_addr(d, m.start.wrapping_sub(t.bias(m)?))?;
        let shift = image_start.wrapping_sub(m.start);
        (image_dso(m.end.wrapping_sub(1).wrapping_add(shift)) == Some(d)).then_some(shift)
    }
}

#[cfg(test)]
mod tests {
    use super::super::types::NOWHERE;
    use super::*;
    use crate::buildid::FileTimes;
    use framehop::ExplicitModuleSectionInfo;
    use std::sync::OnceLock;

    fn exec_map(start: u64, end: u64, dso: DsoId) -> MapEntry {
        MapEntry {
            start,
            end,
            pgoff: 0,
            dso: Some(dso),
            exec: true,
        }
    }

    #[test]
    fn code_addresses_move_to_their_image_and_stray_words_nowhere() {
        let known = Image::Known(Arc::new(DsoUnwind {
            segments: vec![(0, 0)],
            info: ExplicitModuleSectionInfo::default(),
            rules: OnceLock::new(),
            proven: FileTimes::default(),
            loads: Vec::new(),
            by_id: false,
            ctime: Default::default(),
        }));
        // DSO 1 mapped at 0x1000..0x3000 (file offset 0 at address 0x1000), DSO 2
        // right after it, DSO 3 not met by the worker yet.
        let maps = [
            exec_map(0x1000, 0x3000, 1),
            exec_map(0x3000, 0x4000, 2),
            exec_map(0x8000, 0x9000, 3),
        ];
        let images = [Image::None, known.clone(), known, Image::Unseen];
        let mut shifts = Vec::new();
        let mut t = ToImage::new(&maps, &images, 0x7000..0x7100, &mut shifts);
        let image = |d, svma| image_addr(d, svma).unwrap();
        assert_eq!(t.ip(0x1010), image(1, 0x10));
        assert_eq!(image_dso(t.ip(0x2fff)), Some(1));
        // A return address is its call's: one at the start of DSO 2 returns into
        // code of DSO 1 (moved as DSO 1's, one past its end), one at its end into
        // DSO 2.
        assert_eq!(t.word(0x3000), image(1, 0x2000));
        assert_eq!(t.word(0x4000), image(2, 0x1000));
        // Stack words, unmapped words and words of unmet DSOs stay; an unmet DSO is
        // noted for the next walk.
        assert_eq!(t.word(0x7008), 0x7008);
        assert_eq!(t.word(0x5000), 0x5000);
        assert_eq!(t.word(0x8010), 0x8010);
        assert_eq!(t.unseen, vec![3]);
        // A word that is already in the slots (a stray value, a kernel address) is
        // never taken for code there.
        for stray in [image(1, 0x10), u64::MAX, 0xffff_ffff_8100_0000] {
            assert_eq!(t.word(stray), NOWHERE);
            assert_eq!(image_dso(NOWHERE), None);
        }
    }
}
