//! x86_64 unwind rules from `.eh_frame`, worked out once per FDE for every worker.
//!
//! framehop keeps the rule of each address it has unwound in a per-worker cache and,
//! on a miss, evaluates the address's FDE from its start up to the address. On a
//! DWARF recording most misses are compulsory (each return address is new to the
//! worker) and many fall in the same few large functions (an interpreter's eval loop
//! has hundreds of call sites): a fifth of an in-place run on dwarf-med was that
//! evaluation, from the start of the same FDEs again and again. Here all rows of an
//! FDE are evaluated once, turned into rules and shared by the workers.
//!
//! The rules are framehop's own (`UnwindRuleX86_64`), derived and executed as framehop
//! derives and executes them for a module with `.eh_frame` and `.eh_frame_hdr`, so
//! that unwinding gives what it gave before, frame for frame. A row framehop cannot
//! turn into a rule (a CFA expression, as in PLT entries) is left to framehop, which
//! evaluates it itself ([`Found::Framehop`]).

use super::unwind::Bytes;
use framehop::ExplicitModuleSectionInfo;
use framehop::x86_64::UnwindRegsX86_64;
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// framehop's x86_64 rules that `.eh_frame` rows and misses become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rule {
    /// No return address: the stack ends here.
    EndOfStack,
    /// In the first frame the return address is at the stack pointer; in any other,
    /// frame pointers (an address no FDE row covers).
    JustReturnIfFirstFrameOtherwiseFp,
    /// CFA = SP + 8 * n; the frame pointer stays.
    OffsetSp(u16),
    /// CFA = SP + 8 * n; the frame pointer was saved at SP + 8 * m.
    OffsetSpAndRestoreBp(u16, i16),
    /// Frame pointers (framehop's fallback for an address without an FDE).
    UseFramePointer,
}

/// What the CFI says of an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// This rule.
    Rule(Rule),
    /// A row framehop evaluates itself on every use (not cacheable there either).
    Framehop,
}

/// The rows of one FDE: `(start, end, what)`, sorted.
type Rows = Arc<[(u64, u64, Found)]>;

/// A DSO's `.eh_frame` with its `.eh_frame_hdr` index, and the rows of every FDE
/// looked up so far.
pub(super) struct EhFrameRules {
    eh_frame: Bytes,
    eh_frame_hdr: Bytes,
    bases: BaseAddresses,
    /// By FDE offset in `.eh_frame`. Bounded by the FDEs of the section.
    fdes: Mutex<HashMap<usize, Rows>>,
}

impl EhFrameRules {
    /// The rules of a module framehop would unwind through `.eh_frame_hdr` and
    /// `.eh_frame` (it uses nothing else when both are there); `None` otherwise.
    pub(super) fn new(info: &ExplicitModuleSectionInfo<Bytes>) -> Option<Self> {
        let start = |r: &Option<std::ops::Range<u64>>| r.as_ref().map_or(0, |r| r.start);
        // The base addresses framehop gives gimli for the module.
        let bases = BaseAddresses::default()
            .set_eh_frame(start(&info.eh_frame_svma))
            .set_eh_frame_hdr(start(&info.eh_frame_hdr_svma))
            .set_text(start(&info.text_svma))
            .set_got(start(&info.got_svma));
        Some(EhFrameRules {
            eh_frame: info.eh_frame.clone()?,
            eh_frame_hdr: info.eh_frame_hdr.clone()?,
            bases,
            fdes: Mutex::new(HashMap::new()),
        })
    }

    /// What the CFI says of the module address `svma`.
    pub(super) fn find(&self, svma: u64) -> Found {
        // framehop: no FDE for the address in the index, or an FDE that does not
        // parse, is an error, and an error is its fallback rule.
        let Some(fde) = self.fde_offset(svma) else {
            return Found::Rule(Rule::UseFramePointer);
        };
        let rows = match self.fdes.lock().ok().and_then(|m| m.get(&fde).cloned()) {
            Some(rows) => rows,
            None => {
                let Some(rows) = self.rows(fde) else {
                    return Found::Rule(Rule::UseFramePointer);
                };
                if let Ok(mut m) = self.fdes.lock() {
                    m.insert(fde, rows.clone());
                }
                rows
            }
        };
        let i = rows.partition_point(|r| r.1 <= svma);
        match rows.get(i) {
            Some(&(start, end, found)) if start <= svma && svma < end => found,
            // No row covers it (or the rows ended in an error before it).
            _ => Found::Rule(Rule::JustReturnIfFirstFrameOtherwiseFp),
        }
    }

    /// The offset in `.eh_frame` of the FDE the index gives for `svma`.
    fn fde_offset(&self, svma: u64) -> Option<usize> {
        let hdr = EhFrameHdr::new(&self.eh_frame_hdr, LittleEndian)
            .parse(&self.bases, 8)
            .ok()?;
        let table = hdr.table()?;
        let ptr = table.lookup(svma, &self.bases).ok()?;
        let offset = table.pointer_to_offset(ptr).ok()?;
        // framehop keeps FDE offsets in a u32.
        u32::try_from(offset.0).ok().map(|o| o as usize)
    }

    /// Every row of the FDE at `fde`, as framehop would translate it; `None` when the
    /// FDE does not parse.
    fn rows(&self, fde: usize) -> Option<Rows> {
        let mut eh_frame = EhFrame::new(&self.eh_frame, LittleEndian);
        eh_frame.set_address_size(8);
        let fde = eh_frame
            .fde_from_offset(
                &self.bases,
                gimli::EhFrameOffset(fde),
                EhFrame::cie_from_offset,
            )
            .ok()?;
        let mut ctx = UnwindContext::new();
        let mut rows = Vec::new();
        // An error part way leaves the addresses after it uncovered, as gimli's search
        // for one address would have failed there.
        if let Ok(mut table) = fde.rows(&eh_frame, &self.bases, &mut ctx) {
            while let Ok(Some(row)) = table.next_row() {
                let found = translate(
                    row.cfa(),
                    row.register(X86_64::RBP).as_ref(),
                    row.register(X86_64::RA).as_ref(),
                );
                rows.push((row.start_address(), row.end_address(), found));
            }
        }
        // Rows come in address order; a malformed FDE could say otherwise, and the
        // lookup bisects.
        if !rows.is_sorted_by_key(|r| r.0) {
            return None;
        }
        Some(rows.into())
    }
}

/// A row as framehop's x86_64 translation turns it into a rule; what it cannot
/// translate it evaluates itself on every use.
fn translate<T: gimli::ReaderOffset>(
    cfa: &CfaRule<T>,
    bp: Option<&RegisterRule<T>>,
    ra: Option<&RegisterRule<T>>,
) -> Found {
    match ra {
        None | Some(RegisterRule::Undefined) => return Found::Rule(Rule::EndOfStack),
        Some(RegisterRule::Offset(-8)) => {}
        _ => return Found::Framehop,
    }
    // Where the caller's frame pointer was saved, relative to the CFA (`None`: it
    // was not).
    let bp_at = match bp {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => Ok(None),
        Some(RegisterRule::Offset(o)) => Ok(Some(*o)),
        _ => Err(()),
    };
    let CfaRule::RegisterAndOffset { register, offset } = cfa else {
        return Found::Framehop;
    };
    let rule = match (*register, bp_at) {
        (X86_64::RSP, Ok(None)) => u16::try_from(offset / 8).ok().map(Rule::OffsetSp),
        (X86_64::RSP, Ok(Some(bp))) => u16::try_from(offset / 8)
            .ok()
            .zip(i16::try_from((offset + bp) / 8).ok())
            .map(|(sp, bp)| Rule::OffsetSpAndRestoreBp(sp, bp)),
        (X86_64::RBP, Ok(Some(-16))) if *offset == 16 => Some(Rule::UseFramePointer),
        _ => None,
    };
    rule.map_or(Found::Framehop, Found::Rule)
}

/// Executes `rule` on `regs` as framehop does: the caller's return address, `None`
/// at the end of the stack, `Err` where the walk cannot go on.
pub(super) fn exec<F>(
    rule: Rule,
    first: bool,
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut F,
) -> Result<Option<u64>, ()>
where
    F: FnMut(u64) -> Result<u64, ()>,
{
    let (sp, bp) = (regs.sp(), regs.bp());
    // From the caller's frame pointer chain: CFA = BP + 16, the saved BP at BP.
    let by_frame_pointer = |read_stack: &mut F| -> Result<(u64, u64), ()> {
        let new_sp = bp.checked_add(16).ok_or(())?;
        if new_sp <= sp {
            return Err(());
        }
        Ok((new_sp, read_stack(bp)?))
    };
    let (new_sp, new_bp) = match rule {
        Rule::EndOfStack => return Ok(None),
        Rule::JustReturnIfFirstFrameOtherwiseFp if first => (sp.checked_add(8).ok_or(())?, bp),
        Rule::JustReturnIfFirstFrameOtherwiseFp => by_frame_pointer(read_stack)?,
        Rule::OffsetSp(n) => (sp.checked_add(u64::from(n) * 8).ok_or(())?, bp),
        Rule::OffsetSpAndRestoreBp(n, m) => {
            let new_sp = sp.checked_add(u64::from(n) * 8).ok_or(())?;
            let at = sp.checked_add_signed(i64::from(m) * 8).ok_or(())?;
            let new_bp = match read_stack(at) {
                Ok(v) => v,
                // An epilogue's CFI may place it below SP, which the sample's stack
                // copy does not hold: in the first frame BP is then still the
                // caller's.
                Err(()) if first && at < sp => bp,
                Err(()) => return Err(()),
            };
            (new_sp, new_bp)
        }
        Rule::UseFramePointer if bp == 0 => return Ok(None),
        Rule::UseFramePointer => by_frame_pointer(read_stack)?,
    };
    let ra = read_stack(new_sp.checked_sub(8).ok_or(())?)?;
    if ra == 0 {
        return Ok(None);
    }
    if new_sp == sp && ra == regs.ip() {
        return Err(());
    }
    regs.set_ip(ra);
    regs.set_sp(new_sp);
    regs.set_bp(new_bp);
    Ok(Some(ra))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows framehop turns into rules, and those it evaluates itself.
    #[test]
    fn rows_become_framehop_rules() {
        type R = RegisterRule<usize>;
        let rsp = |offset| CfaRule::RegisterAndOffset {
            register: X86_64::RSP,
            offset,
        };
        let rbp = |offset| CfaRule::RegisterAndOffset {
            register: X86_64::RBP,
            offset,
        };
        let ra = Some(&R::Offset(-8));
        assert_eq!(translate(&rsp(8), None, ra), Found::Rule(Rule::OffsetSp(1)));
        assert_eq!(
            translate(&rsp(24), Some(&R::Offset(-16)), ra),
            Found::Rule(Rule::OffsetSpAndRestoreBp(3, 1))
        );
        assert_eq!(
            translate(&rbp(16), Some(&R::Offset(-16)), ra),
            Found::Rule(Rule::UseFramePointer)
        );
        assert_eq!(
            translate(&rsp(8), None, Some(&R::Undefined)),
            Found::Rule(Rule::EndOfStack)
        );
        assert_eq!(
            translate(&rsp(8), None, None),
            Found::Rule(Rule::EndOfStack)
        );
        // _ffi_call_unix64's CFA = RBP + 32, a return address elsewhere, a CFA below
        // the SP, a frame pointer kept in a register: framehop's own evaluation.
        assert_eq!(
            translate(&rbp(32), Some(&R::Offset(-16)), ra),
            Found::Framehop
        );
        assert_eq!(translate(&rbp(16), None, ra), Found::Framehop);
        assert_eq!(
            translate(&rsp(8), None, Some(&R::Offset(-16))),
            Found::Framehop
        );
        assert_eq!(translate(&rsp(-8), None, ra), Found::Framehop);
        assert_eq!(
            translate(&rsp(8), Some(&R::Register(X86_64::RBX)), ra),
            Found::Framehop
        );
    }
}
