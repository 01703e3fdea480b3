//! Architecture dispatch: the recording's architecture, framehop's unwinder and rule
//! caches per architecture over the worker's images ([`ImageUnwinders`]), the rules
//! [`cfi`] works out itself (x86_64), and a sample's registers by perf's numbers.

use super::types::{Bytes, image_addr, image_dso};
use crate::format::Endian;
use crate::model::DsoId;
use crate::resolve::cfi::{self, EhFrameRules};
use framehop::aarch64::{UnwindRegsAarch64, UnwinderAarch64};
use framehop::x86_64::{UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Module, Unwinder};
use std::sync::Arc;

/// CPU architecture of the recording (from the ARCH feature).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arch {
    /// x86_64.
    X86_64,
    /// aarch64 / arm64.
    Aarch64,
}

impl Arch {
    /// Maps perf's ARCH string (`uname -m`).
    pub(crate) fn from_perf(s: &str) -> Option<Arch> {
        match s {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" | "arm64" => Some(Arch::Aarch64),
            _ => None,
        }
    }
}

/// The unwinders and rule caches of one architecture.
///
/// One unwinder per image, each with that one module: framehop empties its caches
/// (a new "modules generation") whenever a module is added to an unwinder, and a
/// frame's rule depends only on the module holding its address, so images added one
/// at a time would otherwise throw away every rule found so far each time.
pub(super) struct ImageUnwinders<U: Unwinder> {
    pub(super) new: fn() -> U,
    /// By DSO; `None` where no image was added.
    pub(super) images: Vec<Option<U>>,
    /// For addresses outside every image: no module, so framehop's fallback (frame
    /// pointers on x86_64, the frame record on aarch64).
    pub(super) outside: U,
    /// framehop's rule cache is direct-mapped with 509 entries, which the return
    /// addresses of a busy recording overflow. Each frame's lookup address picks one
    /// of [`CACHES`] caches by its bits above the slot, which makes one direct-mapped
    /// cache of `CACHES * 509` entries.
    pub(super) caches: Box<[U::Cache]>,
    /// By DSO: the rules [`cfi`] works out for its image (x86_64 only; `None`: framehop
    /// does all), and what they said of the addresses met, direct-mapped.
    pub(super) rules: Vec<Option<Arc<EhFrameRules>>>,
    pub(super) found: Box<[(u64, cfi::Found)]>,
}

/// Rule caches per worker (see [`ImageUnwinders`]); about 8 KB each.
pub(super) const CACHES: u64 = 16;
/// Entries of one framehop rule cache.
pub(super) const CACHE_ENTRIES: u64 = 509;

impl<U: Unwinder<Module = Module<Bytes>>> ImageUnwinders<U> {
    pub(super) fn new(new: fn() -> U, cache: fn() -> U::Cache) -> Self {
        ImageUnwinders {
            new,
            images: Vec::new(),
            outside: new(),
            caches: (0..CACHES).map(|_| cache()).collect(),
            rules: Vec::new(),
            // Address 0 is in no image: an empty slot.
            found: vec![(0, cfi::Found::Framehop); (CACHES * CACHE_ENTRIES) as usize].into(),
        }
    }

    /// Adds the image of DSO `d` at its slot, with the rules of its CFI when this
    /// architecture has them.
    pub(super) fn add(
        &mut self,
        d: DsoId,
        module: Module<Bytes>,
        rules: Option<Arc<EhFrameRules>>,
    ) {
        let i = d as usize;
        if self.images.len() <= i {
            self.images.resize_with(i + 1, || None);
            self.rules.resize_with(i + 1, || None);
        }
        let mut u = (self.new)();
        u.add_module(module);
        self.images[i] = Some(u);
        self.rules[i] = rules;
    }

    /// Unwinds one frame: by the rule [`cfi`] works out for its address where there is
    /// one, else with the unwinder of its image and the cache that holds the rule for
    /// its address. Returns the caller's return address; `None` at the end of the stack or where
    /// the walk cannot go on.
    pub(super) fn step<F>(
        &mut self,
        frame: FrameAddress,
        regs: &mut U::UnwindRegs,
        read_stack: &mut F,
    ) -> Option<u64>
    where
        F: FnMut(u64) -> Result<u64, ()>,
        U::UnwindRegs: OwnRules,
    {
        let at = frame.address_for_lookup();
        let d = image_dso(at);
        if let Some(d) = d
            && let Some(Some(rules)) = self.rules.get(d as usize)
        {
            let slot = (at % self.found.len() as u64) as usize;
            let found = match self.found.get(slot) {
                Some(&(a, f)) if a == at => f,
                _ => {
                    let f =
                        image_addr(d, 0).map_or(cfi::Found::Framehop, |base| rules.find(at - base));
                    if let Some(e) = self.found.get_mut(slot) {
                        *e = (at, f);
                    }
                    f
                }
            };
            if let cfi::Found::Rule(rule) = found
                && let Some(r) =
                    U::UnwindRegs::exec(rule, !frame.is_return_address(), regs, read_stack)
            {
                return r.ok().flatten();
            }
        }
        let u = d
            .and_then(|d| self.images.get(d as usize)?.as_ref())
            .unwrap_or(&self.outside);
        let i = (at / CACHE_ENTRIES % CACHES) as usize;
        u.unwind_frame(frame, regs, &mut self.caches[i], read_stack)
            .ok()
            .flatten()
    }
}

/// Registers of an architecture whose rules [`cfi`] works out and executes (x86_64);
/// framehop does all the work for the others.
pub(super) trait OwnRules: Sized {
    /// [`cfi::exec`], or `None` for an architecture without rules of its own.
    fn exec<F>(
        _rule: cfi::Rule,
        _first: bool,
        _regs: &mut Self,
        _read_stack: &mut F,
    ) -> Option<Result<Option<u64>, ()>>
    where
        F: FnMut(u64) -> Result<u64, ()>,
    {
        None
    }
}

impl OwnRules for UnwindRegsX86_64 {
    fn exec<F>(
        rule: cfi::Rule,
        first: bool,
        regs: &mut Self,
        read_stack: &mut F,
    ) -> Option<Result<Option<u64>, ()>>
    where
        F: FnMut(u64) -> Result<u64, ()>,
    {
        Some(cfi::exec(rule, first, regs, read_stack))
    }
}

impl OwnRules for UnwindRegsAarch64 {}

pub(super) enum ArchState {
    X86(ImageUnwinders<UnwinderX86_64<Bytes>>),
    Arm(ImageUnwinders<UnwinderAarch64<Bytes>>),
}

/// Perf register numbers (arch/*/include/uapi/asm/perf_regs.h).
pub(super) const X86_BP: u32 = 6;
pub(super) const X86_SP: u32 = 7;
pub(super) const X86_IP: u32 = 8;
pub(super) const ARM_FP: u32 = 29;
pub(super) const ARM_LR: u32 = 30;
pub(super) const ARM_SP: u32 = 31;
pub(super) const ARM_PC: u32 = 32;

/// Reads register `reg` from a sample's user registers (stored in mask-bit order).
pub(super) fn reg(regs: &[u8], mask: u64, reg: u32, e: Endian) -> Option<u64> {
    if mask & (1 << reg) == 0 {
        return None;
    }
    let idx = (mask & ((1u64 << reg) - 1)).count_ones() as usize;
    e.u64(regs, idx * 8)
}

#[cfg(test)]
mod tests {
    use super::super::tables::load_sections;
    use super::super::types::IMAGE_SLOT;
    use super::*;
    use crate::buildid::FileTimes;
    use framehop::x86_64::CacheX86_64;

    /// The rules [`cfi`] works out and executes unwind every address of real
    /// libraries as framehop does on its own: the same return address (or end) and
    /// the same registers after, for the first frame and for return addresses, on
    /// stacks of varied words. framehop is the oracle.
    #[test]
    fn own_rules_unwind_as_framehop_does() {
        let files = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/proc/self/exe",
        ];
        let (mut checked, mut own) = (0u64, 0u64);
        for path in files {
            let Ok(f) = std::fs::File::open(path) else {
                continue;
            };
            let Some(t) = load_sections(&f, FileTimes::default()) else {
                continue;
            };
            let Some(rules) = EhFrameRules::new(&t.info) else {
                continue;
            };
            let text = t.info.text_svma.clone().expect("a library has .text");
            let base = 0x10_0000_0000u64;
            let module = Module::new(
                path.to_string(),
                base..base + IMAGE_SLOT,
                base,
                t.info.clone(),
            );
            let mut u: UnwinderX86_64<Bytes> = UnwinderX86_64::new();
            u.add_module(module);
            let mut cache = CacheX86_64::new();
            let sp = 0x7ff0_0000_1000u64;
            // Stack words: return-address-like, frame-pointer-like and zero.
            let word = |a: u64| -> u64 {
                match (a / 8) % 5 {
                    0 => base + text.start + (a % 4093),
                    1 => a + 0x40,
                    2 => 0,
                    3 => a.wrapping_sub(0x30),
                    _ => base + text.start + (a % 97),
                }
            };
            let read = |a: u64| -> Result<u64, ()> {
                if (sp..sp + 2048).contains(&a) && a.is_multiple_of(8) {
                    Ok(word(a))
                } else {
                    Err(())
                }
            };
            let step = ((text.end - text.start) / 20_000).max(1) | 1;
            for svma in (text.start..text.end).step_by(step as usize) {
                for (first, bp) in [
                    (true, sp + 0x40),
                    (false, sp + 0x40),
                    (false, sp - 8),
                    (true, 0),
                ] {
                    let frame = if first {
                        FrameAddress::from_instruction_pointer(base + svma)
                    } else {
                        FrameAddress::from_return_address(base + svma + 1).expect("nonzero")
                    };
                    let mut theirs = UnwindRegsX86_64::new(base + svma, sp, bp);
                    let expected = u
                        .unwind_frame(frame, &mut theirs, &mut cache, &mut read.clone())
                        .ok()
                        .flatten();
                    let mut ours = UnwindRegsX86_64::new(base + svma, sp, bp);
                    let got = match rules.find(frame.address_for_lookup() - base) {
                        cfi::Found::Rule(r) => {
                            own += 1;
                            cfi::exec(r, first, &mut ours, &mut read.clone())
                                .ok()
                                .flatten()
                        }
                        cfi::Found::Framehop => u
                            .unwind_frame(frame, &mut ours, &mut cache, &mut read.clone())
                            .ok()
                            .flatten(),
                    };
                    assert_eq!(got, expected, "{path} {svma:#x} first={first} bp={bp:#x}");
                    if expected.is_some() {
                        assert_eq!(
                            (ours.ip(), ours.sp(), ours.bp()),
                            (theirs.ip(), theirs.sp(), theirs.bp()),
                            "{path} {svma:#x} first={first} bp={bp:#x}"
                        );
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000, "only {checked} frames compared");
        assert!(
            own * 10 > checked * 9,
            "only {own} of {checked} by the own rules"
        );
    }

    #[test]
    fn registers_by_mask_position() {
        let mask = (1 << X86_BP) | (1 << X86_SP) | (1 << X86_IP);
        let regs: Vec<u8> = [10u64, 20, 30]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(reg(&regs, mask, X86_BP, Endian::Little), Some(10));
        assert_eq!(reg(&regs, mask, X86_IP, Endian::Little), Some(30));
        assert_eq!(reg(&regs, mask, 0, Endian::Little), None);
    }
}
