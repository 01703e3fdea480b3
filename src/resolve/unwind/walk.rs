//! The walk: one sample's stack walked frame by frame ([`unwind`], the entry point),
//! handing out each frame ([`Frame`]) and saying how it ended ([`Outcome`]).

use super::arch::{
    ARM_FP, ARM_LR, ARM_PC, ARM_SP, ArchState, ImageUnwinders, OwnRules, X86_BP, X86_IP, X86_SP,
    reg,
};
use super::clock::CpuAnchor;
use super::image::{ToImage, Worker};
use super::tables::UnwindTables;
use super::types::{Bytes, Frame, SampleStack, image_dso, outside_images};
use super::{UnwindConfig, UnwindMode};
use crate::model::{DsoId, MapEntry, Model};
use framehop::aarch64::UnwindRegsAarch64;
use framehop::x86_64::UnwindRegsX86_64;
use framehop::{FrameAddress, Module, Unwinder};
use std::time::{Duration, Instant};

/// What unwinding one sample did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outcome {
    /// Return addresses found.
    pub frames: usize,
    /// The time budget ran out before the stack did.
    pub over_budget: bool,
    /// The frame cap was reached.
    pub frame_capped: bool,
}

/// The lowest user stack pointer unwound: Linux never maps the first page
/// (`vm.mmap_min_addr` is at least 4096), and user space ends below 2^57 (x86_64
/// with 5-level paging; aarch64 stops at 2^52). A sample saying its stack is
/// elsewhere says nothing true, and framehop computes `cfa - 8` unchecked: fuzzing
/// found the overflow with SP 0 and with SP 2^64 - 1 (`rsp + 8` wrapping to 7).
pub(super) const MIN_USER_SP: u64 = 4096;
/// One past the highest user stack pointer unwound (see [`MIN_USER_SP`]).
pub(super) const END_USER_SP: u64 = 1 << 57;

/// Unwinds one sample; `on_frame` gets the user IP's frame and then each return
/// address's (minus one: the address inside the call instruction, which is the
/// caller's).
pub(crate) fn unwind(
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    w: &mut Worker,
    s: &SampleStack<'_>,
    on_frame: &mut dyn FnMut(Frame),
) -> Outcome {
    unwind_at(cfg, model, tables, w, s, &mut |f, _| on_frame(f))
}

/// [`unwind`], each frame with its address in the process (the IP; a return address
/// minus one), as `--convert-callchain` writes it: the image address the unwinder
/// worked in moved back by the shift of the mapping it came from.
pub(crate) fn unwind_at(
    cfg: &UnwindConfig,
    model: &Model,
    tables: &UnwindTables,
    w: &mut Worker,
    s: &SampleStack<'_>,
    on_frame: &mut dyn FnMut(Frame, u64),
) -> Outcome {
    w.clock.tick();
    let maps = w.exec_maps(cfg, model, s);
    // DSOs are given to the unwinder when a walk first reaches one of them; the walk
    // is then done again with their images (at most once per DSO and worker).
    // Frames are held until the last walk, so a walk done again counts nothing twice.
    let mut frames = std::mem::take(&mut w.frames);
    loop {
        frames.clear();
        let (o, unseen) = walk_sample(cfg, w, s, &maps, &mut |f, a| frames.push((f, a)));
        if unseen.is_empty() || cfg.mode != UnwindMode::Dwarf {
            for &(f, a) in &frames {
                on_frame(f, a);
            }
            w.frames = frames;
            return o;
        }
        for d in unseen {
            w.meet(model, tables, d);
        }
    }
}

/// One walk of a sample's stack with the images the worker has; also returns the
/// DSOs it met that have no image yet.
pub(super) fn walk_sample(
    cfg: &UnwindConfig,
    w: &mut Worker,
    s: &SampleStack<'_>,
    maps: &[MapEntry],
    on_frame: &mut dyn FnMut(Frame, u64),
) -> (Outcome, Vec<DsoId>) {
    let e = s.e;
    let r = |n| reg(s.regs, s.regs_mask, n, e);
    let Worker {
        arch,
        images,
        clock,
        shifts,
        ..
    } = w;
    let mut to_image = ToImage::new(maps, images, 0..0, shifts);
    let mut on_address = |a: u64, p: u64| {
        on_frame(
            match image_dso(a) {
                Some(d) => Frame::Dso(d),
                None => Frame::Address(a),
            },
            p,
        )
    };
    let o = match arch {
        ArchState::X86(a) => {
            let (Some(ip), Some(sp @ MIN_USER_SP..END_USER_SP), Some(bp)) =
                (r(X86_IP), r(X86_SP), r(X86_BP))
            else {
                return (Outcome::default(), Vec::new());
            };
            to_image.stack = sp..sp.saturating_add(s.stack.len() as u64);
            let ip = to_image.ip(ip);
            // Like every stack word: a frame pointer in the slots is nothing (and
            // cannot wrap a CFA computed from it below zero).
            let regs = UnwindRegsX86_64::new(ip, sp, outside_images(bp));
            walk(
                a,
                ip,
                regs,
                sp,
                s,
                cfg,
                clock,
                &mut to_image,
                &mut on_address,
            )
        }
        ArchState::Arm(a) => {
            let (Some(pc), Some(lr), Some(sp @ MIN_USER_SP..END_USER_SP), Some(fp)) =
                (r(ARM_PC), r(ARM_LR), r(ARM_SP), r(ARM_FP))
            else {
                return (Outcome::default(), Vec::new());
            };
            to_image.stack = sp..sp.saturating_add(s.stack.len() as u64);
            let (pc, lr) = (to_image.ip(pc), to_image.word(lr));
            let regs = UnwindRegsAarch64::new(lr, sp, outside_images(fp));
            walk(
                a,
                pc,
                regs,
                sp,
                s,
                cfg,
                clock,
                &mut to_image,
                &mut on_address,
            )
        }
    };
    (o, to_image.unseen)
}

/// How often the clock is read, in frames.
pub(super) const CLOCK_EVERY: usize = 8;

#[allow(clippy::too_many_arguments)]
pub(super) fn walk<U: Unwinder<Module = Module<Bytes>>>(
    a: &mut ImageUnwinders<U>,
    pc: u64,
    regs: U::UnwindRegs,
    sp: u64,
    s: &SampleStack<'_>,
    cfg: &UnwindConfig,
    clock: &CpuAnchor,
    to_image: &mut ToImage<'_>,
    on_return: &mut dyn FnMut(u64, u64),
) -> Outcome
where
    U::UnwindRegs: OwnRules,
{
    let (stack, e) = (s.stack, s.e);
    // No budget (a conversion, whose chains must not depend on load): no clock.
    let start = (cfg.budget != Duration::MAX).then(Instant::now);
    let mut out = Outcome::default();
    let mut regs = regs;
    let mut frame = FrameAddress::InstructionPointer(pc);
    let mut n = 0usize;
    let mut first_check = None;
    // framehop's UnwindIterator, with the cache picked per frame. Errors are normal
    // at the end of a stack: keep what was found.
    loop {
        n += 1;
        // The first frame is the user IP from the registers: for samples taken in the
        // kernel it is the only record of where user space was.
        let at = frame.address_for_lookup();
        // An address no image holds was never moved; one in an image goes back by
        // its mapping's shift (0 where that cannot be told: no such frame is written).
        on_return(
            at,
            if image_dso(at).is_some() {
                to_image.back(at).unwrap_or(0)
            } else {
                at
            },
        );
        if let FrameAddress::ReturnAddress(_) = frame {
            out.frames += 1;
        }
        if n >= cfg.max_frames {
            out.frame_capped = true;
            break;
        }
        // The wall clock is cheap (vDSO); only when it says the budget is spent is the
        // thread's CPU time asked, so a worker preempted by another process is not
        // charged for the time it did not run.
        if let Some(start) = start
            && n.is_multiple_of(CLOCK_EVERY)
            && start.elapsed() > cfg.budget
            && clock.spent(start, &mut first_check, cfg.budget)
        {
            out.over_budget = true;
            break;
        }
        // Every word read may be a return address: moved to its image like the IP.
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())?;
            let off = usize::try_from(off).map_err(|_| ())?;
            e.u64(stack, off).map(|v| to_image.word(v)).ok_or(())
        };
        match a
            .step(frame, &mut regs, &mut read_stack)
            .and_then(FrameAddress::from_return_address)
        {
            Some(ra) => frame = ra,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::Arch;
    use super::*;
    use crate::format::Endian;
    use crate::model::Key;
    use std::time::Duration;

    #[test]
    fn a_stack_outside_user_space_is_not_walked() {
        // What fuzzing found: SP 0 or 2^64 - 1 let framehop compute `cfa - 8` below
        // zero.
        let mask: u64 = (1 << X86_BP) | (1 << X86_SP) | (1 << X86_IP);
        let (model, tables) = (Model::default(), UnwindTables::default());
        let cfg = UnwindConfig {
            mode: UnwindMode::Dwarf,
            arch: Arch::X86_64,
            budget: Duration::from_millis(1),
            max_frames: 512,
        };
        let mut w = Worker::new(Arch::X86_64);
        for (sp, walked) in [
            (0u64, false),
            (4088, false),
            (u64::MAX, false),
            (1 << 57, false),
            (0x7ffc_0000, true),
        ] {
            let regs: Vec<u8> = [0u64, sp, 0x40_1000]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let s = SampleStack {
                pid: 1,
                key: Key::default(),
                regs_mask: mask,
                regs: &regs,
                stack: &[0; 16],
                e: Endian::Little,
            };
            let mut frames = 0;
            unwind(&cfg, &model, &tables, &mut w, &s, &mut |_| frames += 1);
            assert_eq!(frames > 0, walked, "sp {sp:#x}");
        }
    }
}
