//! One record in, its `--aslr` form out: pure functions over a record's bytes, in the
//! writer's byte order, given where its mapping went ([`Placed`]) or a remapper of
//! addresses. What perf 7.3 does is the default; where it leaves an address behind
//! (docs/aslr.md, "Where perf leaks"), pdinject's extra step is named on the function.
//!
//! The remapper is `Fn(pid, space, addr) -> Option<u64>`: the caller binds it to the
//! record's time ([`super::layout::Layout::remap`] at the record's key, which also does
//! perf's fallback to the other space). `None` is written as 0, as perf writes it.

use super::layout::Placed;
use crate::format::Endian;
use crate::format::attr::{Attr, bst, rf, st};
use crate::format::record::{RecordHeader, TrailerLayout, misc, rt};
use crate::format::sample::SampleError;
use crate::resolve::callchain::{CONTEXT_MAX, Space};

/// Record types this module names beyond `format::record::rt`.
pub(crate) mod kind {
    pub(crate) const KSYMBOL: u32 = 17;
    #[cfg(test)]
    pub(crate) const BPF_EVENT: u32 = 18;
    pub(crate) const TEXT_POKE: u32 = 20;
    pub(crate) const CALLCHAIN_DEFERRED: u32 = 22;
    pub(crate) const AUXTRACE_ERROR: u32 = 72;
}

/// `sample_type` bits past those of `format::attr::st`.
pub(crate) mod st2 {
    pub(crate) const WEIGHT: u64 = 1 << 14;
    pub(crate) const DATA_SRC: u64 = 1 << 15;
    pub(crate) const TRANSACTION: u64 = 1 << 17;
    pub(crate) const REGS_INTR: u64 = 1 << 18;
    pub(crate) const PHYS_ADDR: u64 = 1 << 19;
    pub(crate) const AUX: u64 = 1 << 20;
    pub(crate) const CGROUP: u64 = 1 << 21;
    pub(crate) const DATA_PAGE_SIZE: u64 = 1 << 22;
    pub(crate) const CODE_PAGE_SIZE: u64 = 1 << 23;
    pub(crate) const WEIGHT_STRUCT: u64 = 1 << 24;
    pub(crate) const WEIGHT_TYPE: u64 = WEIGHT | WEIGHT_STRUCT;
}

/// perf's `ASLR_SUPPORTED_SAMPLE_TYPE`: every bit but REGS_USER and REGS_INTR (whose
/// fields are cut out of every sample) among those perf knows; bits past
/// CODE_PAGE_SIZE are cleared too (their fields are not copied).
pub(crate) const SUPPORTED_SAMPLE_TYPE: u64 = st::IDENTIFIER
    | st::IP
    | st::TID
    | st::TIME
    | st::ADDR
    | st::ID
    | st::STREAM_ID
    | st::CPU
    | st::PERIOD
    | st::READ
    | st::CALLCHAIN
    | st::RAW
    | st::BRANCH_STACK
    | st::STACK_USER
    | st2::WEIGHT_TYPE
    | st2::DATA_SRC
    | st2::TRANSACTION
    | st2::PHYS_ADDR
    | st2::CGROUP
    | st2::DATA_PAGE_SIZE
    | st2::CODE_PAGE_SIZE
    | st2::AUX;

/// Why a record is left out of the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// A sample with PERF_SAMPLE_RAW (tracepoint fields may hold addresses).
    Raw,
    /// A sample with a user stack dump (DWARF recordings: convert them first).
    StackUser,
    /// A sample with a physical address.
    PhysAddr,
    /// A sample with an AUX area snapshot.
    AuxSample,
    /// A sample of perf's off-CPU event (BPF output with raw stacks).
    OffCpu,
    /// A callchain with a context marker perf does not know.
    BadCallchainContext,
    /// A deferred-callchain marker with no cookie after it.
    TruncatedDeferredCookie,
    /// TEXT_POKE: the new instruction bytes may encode addresses.
    TextPoke,
    /// AUXTRACE, AUXTRACE_INFO, AUXTRACE_ERROR: hardware trace that cannot be remapped.
    AuxTrace,
    /// A HEADER_FEATURE record of BPF_PROG_INFO (JITed addresses; pdinject only).
    BpfProgInfo,
    /// Tracing data that cannot be read (its kernel addresses cannot be found).
    TracingData,
    /// A sample that cannot be read, or of an event not declared.
    Unreadable,
    /// A mapping record the layout placed nowhere (a guest machine's).
    Unplaced,
}

impl DropReason {
    /// What the summary says.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            DropReason::Raw => "samples with raw tracepoint data",
            DropReason::StackUser => "samples with a user stack dump",
            DropReason::PhysAddr => "samples with a physical address",
            DropReason::AuxSample => "samples with an AUX area snapshot",
            DropReason::OffCpu => "off-CPU samples",
            DropReason::BadCallchainContext => "samples whose callchain has an unknown context",
            DropReason::TruncatedDeferredCookie => {
                "samples whose deferred-callchain marker has no cookie"
            }
            DropReason::TextPoke => "TEXT_POKE records",
            DropReason::AuxTrace => "AUX trace records",
            DropReason::BpfProgInfo => "BPF program info (JITed addresses)",
            DropReason::TracingData => "tracing data that cannot be read (kernel addresses)",
            DropReason::Unreadable => "samples that cannot be read or name no event",
            DropReason::Unplaced => "mapping records of no layout (guest machines)",
        }
    }
}

/// What became of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Unchanged: copy it as it is.
    Keep,
    /// The rewritten record is in the output buffer (it may have another size).
    Rewritten,
    /// Left out.
    Drop(DropReason),
    /// A COMPRESSED or COMPRESSED2 record: perf 7.3 copies it as it is (its records,
    /// addresses and all, reach the output: the `-z` leak). pdinject must decompress
    /// it and pass each inner record through [`record`] instead.
    Inner,
}

/// What a sample rewrite needs to know of its event.
#[derive(Clone, Debug)]
pub(crate) struct SampleCtx {
    /// The event's `sample_type` as recorded.
    pub sample_type: u64,
    /// Its `read_format`.
    pub read_format: u64,
    /// Its `branch_sample_type`.
    pub branch_sample_type: u64,
    /// Registers in REGS_USER and REGS_INTR (their counts).
    pub regs_user: u32,
    /// Likewise.
    pub regs_intr: u32,
    /// A dummy event (perf passes its samples through untouched).
    pub dummy: bool,
    /// perf's off-CPU event (`offcpu-time`): its samples are dropped.
    pub offcpu: bool,
}

impl SampleCtx {
    /// The context of `attr`; `name` is the event's name (from the header's
    /// EVENT_DESC), which tells perf's off-CPU event.
    pub(crate) fn new(attr: &Attr, name: &str) -> SampleCtx {
        SampleCtx {
            sample_type: attr.sample_type,
            read_format: attr.read_format,
            branch_sample_type: attr.branch_sample_type,
            regs_user: attr.sample_regs_user.count_ones(),
            regs_intr: attr.sample_regs_intr.count_ones(),
            // PERF_TYPE_SOFTWARE, PERF_COUNT_SW_DUMMY
            dummy: attr.kind == 1 && attr.config == 9,
            offcpu: name == "offcpu-time",
        }
    }
}

/// How cpumode `m` (a header's or a callchain marker's) is looked up by perf.
fn space_of(m: u16) -> Option<Space> {
    match m {
        misc::KERNEL => Some(Space::Kernel),
        misc::USER => Some(Space::User),
        // Hypervisor, guest and unknown modes: perf finds no map (perf_guest is off in
        // perf inject), and writes 0.
        _ => None,
    }
}

/// The space a callchain marker switches to (perf's `aslr_tool__process_sample`).
fn marker_mode(v: u64) -> Option<u16> {
    const HV: u64 = (-32i64) as u64;
    const KERNEL: u64 = (-128i64) as u64;
    const USER: u64 = (-512i64) as u64;
    const GUEST: u64 = (-2048i64) as u64;
    const GUEST_KERNEL: u64 = (-2176i64) as u64;
    const GUEST_USER: u64 = (-2560i64) as u64;
    Some(match v {
        HV => misc::HYPERVISOR,
        KERNEL => misc::KERNEL,
        USER => misc::USER,
        GUEST | GUEST_KERNEL => misc::GUEST_KERNEL,
        GUEST_USER => misc::GUEST_USER,
        _ => return None,
    })
}

/// PERF_CONTEXT_USER_DEFERRED: a cookie follows it.
const USER_DEFERRED: u64 = (-640i64) as u64;

/// The remapper: `(pid, space, addr) -> new addr`.
pub(crate) type Remapper<'r> = &'r dyn Fn(u32, Space, u64) -> Option<u64>;

struct Walk<'a, 'o> {
    rec: &'a [u8],
    at: usize,
    e: Endian,
    out: &'o mut Vec<u8>,
}

impl Walk<'_, '_> {
    fn get(&mut self, what: &'static str) -> Result<u64, SampleError> {
        let v = self
            .e
            .u64(self.rec, self.at)
            .ok_or(SampleError { at: self.at, what })?;
        self.at += 8;
        Ok(v)
    }
    fn put(&mut self, v: u64) {
        self.out.extend_from_slice(&self.e.put_u64(v));
    }
    fn copy(&mut self, what: &'static str) -> Result<u64, SampleError> {
        let v = self.get(what)?;
        self.put(v);
        Ok(v)
    }
    fn copy_n(&mut self, n: u64, what: &'static str) -> Result<(), SampleError> {
        let end = n
            .checked_mul(8)
            .and_then(|b| (self.at as u64).checked_add(b))
            .filter(|&end| end <= self.rec.len() as u64)
            .ok_or(SampleError { at: self.at, what })? as usize;
        self.out.extend_from_slice(&self.rec[self.at..end]);
        self.at = end;
        Ok(())
    }
    fn skip_n(&mut self, n: u64, what: &'static str) -> Result<(), SampleError> {
        let end = n
            .checked_mul(8)
            .and_then(|b| (self.at as u64).checked_add(b))
            .filter(|&end| end <= self.rec.len() as u64)
            .ok_or(SampleError { at: self.at, what })? as usize;
        self.at = end;
        Ok(())
    }
}

/// Where a SAMPLE record of `sample_type` holds its pid and tid (after the header,
/// IDENTIFIER and IP).
fn tid_at(sample_type: u64) -> usize {
    8 + 8 * usize::from(sample_type & st::IDENTIFIER != 0)
        + 8 * usize::from(sample_type & st::IP != 0)
}

/// The pid and tid of a SAMPLE record of `sample_type` (`None` without TID).
pub(crate) fn sample_thread(rec: &[u8], e: Endian, sample_type: u64) -> Option<(u32, u32)> {
    if sample_type & st::TID == 0 {
        return None;
    }
    let at = tid_at(sample_type);
    Some((e.u32(rec, at)?, e.u32(rec, at + 4)?))
}

/// A SAMPLE record as perf 7.3's `--aslr` writes it, into `out` (cleared first): IP,
/// ADDR, callchain entries (markers kept, each entry looked up in the space its marker
/// names, from the sample's cpumode on) and branch from/to remapped; REGS_USER and
/// REGS_INTR cut out; every other field copied. Samples with RAW, STACK_USER,
/// PHYS_ADDR or AUX, off-CPU samples and samples whose callchain has an unknown
/// marker are dropped. The output's attr must carry [`out_sample_type`].
pub(crate) fn sample(
    rec: &[u8],
    e: Endian,
    ctx: &SampleCtx,
    remap: Remapper<'_>,
    out: &mut Vec<u8>,
) -> Result<Verdict, SampleError> {
    out.clear();
    if ctx.dummy {
        return Ok(Verdict::Keep);
    }
    let h = RecordHeader::parse(rec, e).ok_or(SampleError {
        at: 0,
        what: "truncated record header",
    })?;
    let rec = rec.get(..h.size as usize).unwrap_or(rec);
    let t = ctx.sample_type;
    let mode = h.cpumode();
    out.extend_from_slice(&rec[..8]);
    let mut w = Walk { rec, at: 8, e, out };
    let mut pid = u32::MAX;
    let map = |pid: u32, mode: u16, a: u64| -> u64 {
        space_of(mode).and_then(|s| remap(pid, s, a)).unwrap_or(0)
    };
    if t & st::IDENTIFIER != 0 {
        w.copy("truncated sample id")?;
    }
    // perf reads pid before it remaps the IP: the TID field comes after it.
    if t & st::TID != 0 {
        pid = e.u32(rec, tid_at(t)).ok_or(SampleError {
            at: tid_at(t),
            what: "truncated sample pid/tid",
        })?;
    }
    if t & st::IP != 0 {
        let ip = w.get("truncated sample ip")?;
        let v = map(pid, mode, ip);
        w.put(v);
    }
    if t & st::TID != 0 {
        w.copy("truncated sample pid/tid")?;
    }
    if t & st::TIME != 0 {
        w.copy("truncated sample time")?;
    }
    if t & st::ADDR != 0 {
        let a = w.get("truncated sample addr")?;
        let v = map(pid, mode, a);
        w.put(v);
    }
    for b in [st::ID, st::STREAM_ID, st::CPU, st::PERIOD] {
        if t & b != 0 {
            w.copy("truncated sample field")?;
        }
    }
    if t & st::READ != 0 {
        copy_read(&mut w, ctx.read_format)?;
    }
    if t & st::CALLCHAIN != 0
        && let Some(drop) = callchain(&mut w, mode, &|m, a| map(pid, m, a))?
    {
        return Ok(drop);
    }
    if t & st::RAW != 0 {
        return Ok(Verdict::Drop(DropReason::Raw));
    }
    if t & st::BRANCH_STACK != 0 {
        branch_stack(&mut w, ctx.branch_sample_type, &|a| map(pid, mode, a))?;
    }
    if let Some(drop) = after_branches(&mut w, ctx)? {
        return Ok(drop);
    }
    let size = u16::try_from(out.len()).map_err(|_| SampleError {
        at: 6,
        what: "rewritten sample larger than a record",
    })?;
    out[6..8].copy_from_slice(&e.put_u16(size));
    Ok(Verdict::Rewritten)
}

/// The fields after the branch stack: register dumps cut out, the rest copied; `Some`
/// verdict when the sample goes (a user stack, a physical address, AUX data, an
/// off-CPU sample).
fn after_branches(w: &mut Walk<'_, '_>, ctx: &SampleCtx) -> Result<Option<Verdict>, SampleError> {
    let t = ctx.sample_type;
    if t & st::REGS_USER != 0 && w.get("truncated user regs abi")? != 0 {
        w.skip_n(u64::from(ctx.regs_user), "user regs larger than the sample")?;
    }
    if t & st::STACK_USER != 0 {
        return Ok(Some(Verdict::Drop(DropReason::StackUser)));
    }
    for b in [st2::WEIGHT_TYPE, st2::DATA_SRC, st2::TRANSACTION] {
        if t & b != 0 {
            w.copy("truncated sample field")?;
        }
    }
    if t & st2::REGS_INTR != 0 && w.get("truncated intr regs abi")? != 0 {
        w.skip_n(u64::from(ctx.regs_intr), "intr regs larger than the sample")?;
    }
    if t & st2::PHYS_ADDR != 0 {
        return Ok(Some(Verdict::Drop(DropReason::PhysAddr)));
    }
    for b in [st2::CGROUP, st2::DATA_PAGE_SIZE, st2::CODE_PAGE_SIZE] {
        if t & b != 0 {
            w.copy("truncated sample field")?;
        }
    }
    if t & st2::AUX != 0 {
        return Ok(Some(Verdict::Drop(DropReason::AuxSample)));
    }
    if ctx.offcpu {
        return Ok(Some(Verdict::Drop(DropReason::OffCpu)));
    }
    Ok(None)
}

/// A READ field (one value or a group), copied.
fn copy_read(w: &mut Walk<'_, '_>, rfm: u64) -> Result<(), SampleError> {
    let (per, times) = crate::format::sample::read_words(rfm);
    if rfm & rf::GROUP != 0 {
        let nr = w.copy("truncated read group count")?;
        let n = nr
            .checked_mul(per)
            .and_then(|v| v.checked_add(times))
            .ok_or(SampleError {
                at: w.at,
                what: "read group count overflows",
            })?;
        w.copy_n(n, "read group larger than the sample")
    } else {
        w.copy_n(per + times, "truncated read value")
    }
}

/// A callchain, each entry remapped in the space its marker names (from the sample's
/// cpumode `mode` on; `map(mode, addr)`); `Some` verdict when the sample goes.
fn callchain(
    w: &mut Walk<'_, '_>,
    mode: u16,
    map: &dyn Fn(u16, u64) -> u64,
) -> Result<Option<Verdict>, SampleError> {
    let nr = w.copy("truncated callchain count")?;
    let mut cm = mode;
    let mut i = 0;
    while i < nr {
        let v = w.get("callchain larger than the sample")?;
        i += 1;
        if v >= CONTEXT_MAX {
            w.put(v);
            if v == USER_DEFERRED {
                if i >= nr {
                    return Ok(Some(Verdict::Drop(DropReason::TruncatedDeferredCookie)));
                }
                w.copy("callchain larger than the sample")?;
                i += 1;
                cm = misc::USER;
                continue;
            }
            match marker_mode(v) {
                Some(m) => cm = m,
                None => return Ok(Some(Verdict::Drop(DropReason::BadCallchainContext))),
            }
            continue;
        }
        w.put(map(cm, v));
    }
    Ok(None)
}

/// A branch stack, both ends of each entry remapped (`map(addr)`), flags, `hw_idx` and
/// counters copied.
fn branch_stack(
    w: &mut Walk<'_, '_>,
    branch_sample_type: u64,
    map: &dyn Fn(u64) -> u64,
) -> Result<(), SampleError> {
    let nr = w.copy("truncated branch stack count")?;
    if branch_sample_type & bst::HW_INDEX != 0 {
        w.copy("truncated branch hw_index")?;
    }
    if nr > (w.rec.len() as u64) / 24 {
        return Err(SampleError {
            at: w.at,
            what: "branch stack larger than the sample",
        });
    }
    for _ in 0..nr {
        let from = w.get("branch stack larger than the sample")?;
        let to = w.get("branch stack larger than the sample")?;
        w.put(map(from));
        w.put(map(to));
        w.copy("branch stack larger than the sample")?;
    }
    if branch_sample_type & bst::COUNTERS != 0 {
        w.copy_n(nr, "branch counters larger than the sample")?;
    }
    Ok(())
}

/// The `sample_type` the output's attr carries for a recorded one.
pub(crate) fn out_sample_type(sample_type: u64) -> u64 {
    sample_type & SUPPORTED_SAMPLE_TYPE
}

/// An attr (the bytes of `perf_event_attr`, as in the attrs section or a HEADER_ATTR
/// record) rewritten in place as perf 7.3 strips it: `sample_type` masked, the register
/// masks zeroed; a breakpoint's `bp_addr` and a kprobe's or uprobe's `config1` and
/// `config2` (function or path pointers, addresses, offsets) zeroed. `probe_pmu` says
/// whether the attr's PMU type is the recording's kprobe or uprobe PMU (perf asks the
/// machine it runs on; the recording's PMU_MAPPINGS feature is the truth).
pub(crate) fn strip_attr(attr: &mut [u8], e: Endian, probe_pmu: bool) {
    let size = match e.u32(attr, 4) {
        Some(0) | None => 64,
        Some(s) => s as usize,
    }
    .min(attr.len());
    let kind = e.u32(attr, 0).unwrap_or(0);
    let mut zero = |off: usize| {
        if off + 8 <= size {
            attr[off..off + 8].fill(0);
        }
    };
    zero(80); // sample_regs_user
    zero(96); // sample_regs_intr
    // PERF_TYPE_BREAKPOINT: bp_addr is config1's place.
    if kind == 5 || probe_pmu {
        zero(56);
    }
    if probe_pmu {
        zero(64);
    }
    if size >= 32
        && let Some(t) = e.u64(attr, 24)
    {
        attr[24..32].copy_from_slice(&e.put_u64(out_sample_type(t)));
    }
}

/// An MMAP or MMAP2 record with its new start and pgoff (same size; the name, the
/// identity union, prot, flags and the trailer are kept).
pub(crate) fn mmap(rec: &[u8], e: Endian, placed: Placed, out: &mut Vec<u8>) -> Verdict {
    out.clear();
    if rec.len() < 40 {
        return Verdict::Keep;
    }
    out.extend_from_slice(rec);
    out[16..24].copy_from_slice(&e.put_u64(placed.start));
    out[32..40].copy_from_slice(&e.put_u64(placed.pgoff));
    Verdict::Rewritten
}

/// A KSYMBOL record with its new address (the layout's place for it).
pub(crate) fn ksymbol(rec: &[u8], e: Endian, placed: Placed, out: &mut Vec<u8>) -> Verdict {
    out.clear();
    if rec.len() < 16 {
        return Verdict::Keep;
    }
    out.extend_from_slice(rec);
    out[8..16].copy_from_slice(&e.put_u64(placed.start));
    Verdict::Rewritten
}

/// A CALLCHAIN_DEFERRED record (the user part of a deferred callchain: `{cookie, nr,
/// ips[nr]}` then the sample-id trailer) with its ips remapped in the user space of the
/// trailer's pid. perf 7.3's `--aslr` does not rewrite it (pdinject does: its ips are
/// user addresses).
pub(crate) fn callchain_deferred(
    rec: &[u8],
    e: Endian,
    trailer: &TrailerLayout,
    remap: Remapper<'_>,
    out: &mut Vec<u8>,
) -> Result<Verdict, SampleError> {
    out.clear();
    let pid = trailer.read(rec, e).pid.unwrap_or(u32::MAX);
    let nr = e.u64(rec, 16).ok_or(SampleError {
        at: 16,
        what: "truncated deferred callchain count",
    })?;
    let end = nr
        .checked_mul(8)
        .and_then(|b| b.checked_add(24))
        .filter(|&end| end as usize + trailer.size <= rec.len())
        .ok_or(SampleError {
            at: 16,
            what: "deferred callchain larger than its record",
        })? as usize;
    out.extend_from_slice(rec);
    for at in (24..end).step_by(8) {
        let a = e.u64(rec, at).unwrap_or(0);
        let v = if a >= CONTEXT_MAX {
            a
        } else {
            remap(pid, Space::User, a).unwrap_or(0)
        };
        out[at..at + 8].copy_from_slice(&e.put_u64(v));
    }
    Ok(Verdict::Rewritten)
}

/// The verdict on a record of any kind, other than those whose rewrite needs more
/// than the bytes (SAMPLE: [`sample`]; MMAP, MMAP2, KSYMBOL: [`mmap`] and [`ksymbol`]
/// with the layout's place; CALLCHAIN_DEFERRED: [`callchain_deferred`]), for which it
/// answers `Rewritten` to say "call the rewrite". Records that hold no address of the
/// recorded machine's memory are kept: COMM, EXIT, FORK, LOST, THROTTLE, UNTHROTTLE,
/// READ (counter values), AUX (offsets in the AUX buffer), ITRACE_START, LOST_SAMPLES,
/// SWITCH*, NAMESPACES (device and inode numbers), BPF_EVENT (program id and tag),
/// CGROUP, AUX_OUTPUT_HW_ID and perf's own records (attrs are rewritten by
/// [`strip_attr`]; TRACING_DATA: see docs/aslr.md).
pub(crate) fn record(h: &RecordHeader, rec: &[u8], e: Endian) -> Verdict {
    const FEATURE_BPF_PROG_INFO: u64 = 25;
    match h.kind {
        rt::SAMPLE
        | rt::MMAP
        | rt::MMAP2
        | kind::KSYMBOL
        | kind::CALLCHAIN_DEFERRED
        | rt::HEADER_TRACING_DATA => Verdict::Rewritten,
        kind::TEXT_POKE => Verdict::Drop(DropReason::TextPoke),
        rt::AUXTRACE | rt::AUXTRACE_INFO | kind::AUXTRACE_ERROR => {
            Verdict::Drop(DropReason::AuxTrace)
        }
        rt::COMPRESSED | rt::COMPRESSED2 => Verdict::Inner,
        rt::HEADER_FEATURE if e.u64(rec, 8) == Some(FEATURE_BPF_PROG_INFO) => {
            Verdict::Drop(DropReason::BpfProgInfo)
        }
        _ => Verdict::Keep,
    }
}

/// A stream's HEADER_TRACING_DATA record (its header, the padded size, the tracing
/// data after it) with the data's kernel addresses left out
/// ([`super::tracing::without_kernel_addresses`]), its size padded again to 8 as perf
/// pads it.
pub(crate) fn tracing_data(rec: &[u8], e: Endian, out: &mut Vec<u8>) -> Verdict {
    let Some(data) = rec.get(16..) else {
        return Verdict::Drop(DropReason::TracingData);
    };
    let Some(t) = super::tracing::without_kernel_addresses(data) else {
        return Verdict::Drop(DropReason::TracingData);
    };
    let padded = t.len().next_multiple_of(8);
    let Ok(size) = u32::try_from(padded) else {
        return Verdict::Drop(DropReason::TracingData);
    };
    out.extend_from_slice(&rec[..8]);
    out.extend_from_slice(&e.put_u32(size));
    out.extend_from_slice(&rec[12..16]);
    out.extend_from_slice(&t);
    out.resize(out.len() + padded - t.len(), 0);
    Verdict::Rewritten
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(e: Endian, kind: u32, misc: u16, words: &[u64]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&e.put_u32(kind));
        r.extend_from_slice(&e.put_u16(misc));
        r.extend_from_slice(&e.put_u16((8 + 8 * words.len()) as u16));
        for w in words {
            r.extend_from_slice(&e.put_u64(*w));
        }
        r
    }

    fn words(r: &[u8], e: Endian) -> Vec<u64> {
        r[8..].chunks(8).map(|c| e.u64(c, 0).unwrap()).collect()
    }

    fn ctx(sample_type: u64) -> SampleCtx {
        SampleCtx {
            sample_type,
            read_format: 0,
            branch_sample_type: 0,
            regs_user: 0,
            regs_intr: 0,
            dummy: false,
            offcpu: false,
        }
    }

    /// User addresses below 0x1000_0000 move by +0x100, kernel ones (>= 0xffff...)
    /// by -0x1000; anything else is in no map.
    fn remapper(pid: u32, s: Space, a: u64) -> Option<u64> {
        assert_eq!(pid, 42);
        match s {
            Space::User if a < 0x1000_0000 => Some(a + 0x100),
            Space::Kernel if a >= 0xffff_0000_0000_0000 => Some(a - 0x1000),
            // perf's fallback to the other space is the remapper's.
            Space::User if a >= 0xffff_0000_0000_0000 => Some(a - 0x1000),
            Space::Kernel if a < 0x1000_0000 => Some(a + 0x100),
            _ => None,
        }
    }

    const KMARK: u64 = (-128i64) as u64;
    const UMARK: u64 = (-512i64) as u64;
    const HVMARK: u64 = (-32i64) as u64;

    #[test]
    fn ip_callchain_and_addr_follow_their_spaces_in_either_byte_order() {
        for e in [Endian::Little, Endian::Big] {
            let t = st::IP | st::TID | st::TIME | st::ADDR | st::CALLCHAIN | st::PERIOD;
            let tid = match e {
                Endian::Little => 42u64 | (43 << 32),
                Endian::Big => (42u64 << 32) | 43,
            };
            let r = rec(
                e,
                rt::SAMPLE,
                misc::KERNEL,
                &[
                    0xffff_ffff_8100_0010,
                    tid,
                    777,
                    0x5000,
                    1000,
                    7,
                    KMARK,
                    0xffff_ffff_8100_0020,
                    UMARK,
                    0x4000,
                    0x7fff_0000_0000,
                    HVMARK,
                    0x1234,
                ],
            );
            let mut out = Vec::new();
            let v = sample(&r, e, &ctx(t), &remapper, &mut out).unwrap();
            assert_eq!(v, Verdict::Rewritten);
            assert_eq!(out.len(), r.len());
            assert_eq!(
                words(&out, e),
                [
                    0xffff_ffff_80ff_f010,
                    tid,
                    777,
                    // ADDR is looked up with the sample's cpumode (kernel), then the
                    // other space: a user address found there.
                    0x5100,
                    1000,
                    7,
                    KMARK,
                    0xffff_ffff_80ff_f020,
                    UMARK,
                    0x4100,
                    0,
                    HVMARK,
                    0
                ]
            );
        }
    }

    #[test]
    fn regs_are_cut_and_the_size_follows() {
        let e = Endian::Little;
        let t = st::IP | st::TID | st::REGS_USER | st2::WEIGHT | st2::REGS_INTR | st2::CGROUP;
        let c = SampleCtx {
            regs_user: 2,
            regs_intr: 3,
            ..ctx(t)
        };
        let r = rec(
            e,
            rt::SAMPLE,
            misc::USER,
            &[0x10, 42, 2, 0xaa, 0xbb, 55, 2, 1, 2, 3, 99],
        );
        let mut out = Vec::new();
        assert_eq!(
            sample(&r, e, &c, &remapper, &mut out),
            Ok(Verdict::Rewritten)
        );
        assert_eq!(words(&out, e), [0x110, 42, 55, 99]);
        assert_eq!(e.u16(&out, 6), Some(8 + 32));
        // An ABI of 0 (no registers) is one word.
        let r = rec(e, rt::SAMPLE, misc::USER, &[0x10, 42, 0, 55, 0, 99]);
        sample(&r, e, &c, &remapper, &mut out).unwrap();
        assert_eq!(words(&out, e), [0x110, 42, 55, 99]);
        assert_eq!(
            out_sample_type(t),
            st::IP | st::TID | st2::WEIGHT | st2::CGROUP
        );
    }

    #[test]
    fn branches_read_groups_and_drops() {
        let e = Endian::Little;
        let t = st::IP | st::TID | st::READ | st::BRANCH_STACK;
        let c = SampleCtx {
            read_format: rf::GROUP | rf::ID,
            branch_sample_type: bst::HW_INDEX,
            ..ctx(t)
        };
        let r = rec(
            e,
            rt::SAMPLE,
            misc::USER,
            &[
                0x10,
                42,
                2,
                5,
                100,
                6,
                101,
                2,
                9,
                0x20,
                0x30,
                0xf1,
                0x40,
                0x9999_9999_9999,
                0xf2,
            ],
        );
        let mut out = Vec::new();
        sample(&r, e, &c, &remapper, &mut out).unwrap();
        assert_eq!(
            words(&out, e),
            [
                0x110, 42, 2, 5, 100, 6, 101, 2, 9, 0x120, 0x130, 0xf1, 0x140, 0, 0xf2
            ]
        );
        for (bit, why) in [
            (st::RAW, DropReason::Raw),
            (st::STACK_USER, DropReason::StackUser),
            (st2::PHYS_ADDR, DropReason::PhysAddr),
            (st2::AUX, DropReason::AuxSample),
        ] {
            let r = rec(e, rt::SAMPLE, misc::USER, &[0x10, 42, 8, 0, 0, 0]);
            let got = sample(&r, e, &ctx(st::IP | st::TID | bit), &remapper, &mut out);
            assert_eq!(got, Ok(Verdict::Drop(why)));
        }
        let r = rec(e, rt::SAMPLE, misc::USER, &[0x10, 42]);
        let off = SampleCtx {
            offcpu: true,
            ..ctx(st::IP | st::TID)
        };
        assert_eq!(
            sample(&r, e, &off, &remapper, &mut out),
            Ok(Verdict::Drop(DropReason::OffCpu))
        );
        let dummy = SampleCtx {
            dummy: true,
            ..ctx(st::IP | st::TID)
        };
        assert_eq!(
            sample(&r, e, &dummy, &remapper, &mut out),
            Ok(Verdict::Keep)
        );
    }

    #[test]
    fn unknown_markers_drop_and_deferred_cookies_are_kept() {
        let e = Endian::Little;
        let t = st::TID | st::CALLCHAIN;
        let mut out = Vec::new();
        // fp-med had two such chains: perf 7.3 dropped both samples.
        let r = rec(e, rt::SAMPLE, misc::USER, &[42, 2, 0x10, u64::MAX]);
        assert_eq!(
            sample(&r, e, &ctx(t), &remapper, &mut out),
            Ok(Verdict::Drop(DropReason::BadCallchainContext))
        );
        let r = rec(
            e,
            rt::SAMPLE,
            misc::KERNEL,
            &[42, 4, KMARK, 0xffff_ffff_8100_0000, USER_DEFERRED, 0x77],
        );
        sample(&r, e, &ctx(t), &remapper, &mut out).unwrap();
        assert_eq!(
            words(&out, e),
            [42, 4, KMARK, 0xffff_ffff_80ff_f000, USER_DEFERRED, 0x77]
        );
        let r = rec(e, rt::SAMPLE, misc::KERNEL, &[42, 2, KMARK, USER_DEFERRED]);
        assert_eq!(
            sample(&r, e, &ctx(t), &remapper, &mut out),
            Ok(Verdict::Drop(DropReason::TruncatedDeferredCookie))
        );
        // A count past the record is an error, not a drop.
        let r = rec(e, rt::SAMPLE, misc::USER, &[42, 9, 0x10]);
        assert!(sample(&r, e, &ctx(t), &remapper, &mut out).is_err());
    }

    #[test]
    fn mapping_records_keep_their_size_and_trailer() {
        for e in [Endian::Little, Endian::Big] {
            let mut r = rec(
                e,
                rt::MMAP2,
                misc::USER,
                &[
                    42 | (42 << 32),
                    0x7f00_0000_0000,
                    0x2000,
                    0x1000,
                    1,
                    2,
                    3,
                    5,
                ],
            );
            r.extend_from_slice(b"/usr/lib/libc.so.6\0\0\0\0\0\0");
            r.extend_from_slice(&e.put_u64(123)); // trailer
            let mut out = Vec::new();
            let p = Placed {
                start: 0x20_0000,
                pgoff: 0x1000,
            };
            assert_eq!(mmap(&r, e, p, &mut out), Verdict::Rewritten);
            assert_eq!(out.len(), r.len());
            assert_eq!(e.u64(&out, 16), Some(0x20_0000));
            assert_eq!(e.u64(&out, 32), Some(0x1000));
            assert_eq!(&out[40..], &r[40..]);
            let k = rec(e, kind::KSYMBOL, 0, &[0xffff_ffff_c000_0000, 0x100]);
            ksymbol(&k, e, p, &mut out);
            assert_eq!((e.u64(&out, 8), &out[16..]), (Some(0x20_0000), &k[16..]));
        }
    }

    #[test]
    fn attrs_are_stripped_like_perfs() {
        let e = Endian::Little;
        let mut a = vec![0u8; 136];
        a[0..4].copy_from_slice(&5u32.to_le_bytes());
        a[4..8].copy_from_slice(&136u32.to_le_bytes());
        a[24..32].copy_from_slice(&(st::IP | st::REGS_USER | st2::REGS_INTR).to_le_bytes());
        a[56..64].copy_from_slice(&0xffff_ffff_8123_4567u64.to_le_bytes());
        a[80..88].copy_from_slice(&0xffu64.to_le_bytes());
        a[96..104].copy_from_slice(&0xffu64.to_le_bytes());
        strip_attr(&mut a, e, false);
        assert_eq!(e.u64(&a, 24), Some(st::IP));
        assert_eq!(
            (e.u64(&a, 56), e.u64(&a, 80), e.u64(&a, 96)),
            (Some(0), Some(0), Some(0))
        );
    }

    #[test]
    fn deferred_callchains_follow_the_trailers_pid() {
        let e = Endian::Little;
        let tl = TrailerLayout::new(st::TID | st::TIME, true);
        let r = rec(
            e,
            kind::CALLCHAIN_DEFERRED,
            misc::USER,
            &[9, 2, 0x10, 0x7777_0000_0000, 42, 5],
        );
        let mut out = Vec::new();
        callchain_deferred(&r, e, &tl, &remapper, &mut out).unwrap();
        assert_eq!(words(&out, e), [9, 2, 0x110, 0, 42, 5]);
        let short = rec(
            e,
            kind::CALLCHAIN_DEFERRED,
            misc::USER,
            &[9, 5, 0x10, 42, 5],
        );
        assert!(callchain_deferred(&short, e, &tl, &remapper, &mut out).is_err());
    }

    #[test]
    fn verdicts_by_kind() {
        let e = Endian::Little;
        let h = |kind| RecordHeader {
            kind,
            misc: 0,
            size: 16,
        };
        let r = rec(e, 0, 0, &[25]);
        assert_eq!(
            record(&h(kind::TEXT_POKE), &r, e),
            Verdict::Drop(DropReason::TextPoke)
        );
        assert_eq!(record(&h(rt::COMPRESSED), &r, e), Verdict::Inner);
        assert_eq!(
            record(&h(rt::HEADER_FEATURE), &r, e),
            Verdict::Drop(DropReason::BpfProgInfo)
        );
        assert_eq!(record(&h(rt::COMM), &r, e), Verdict::Keep);
        assert_eq!(record(&h(kind::BPF_EVENT), &r, e), Verdict::Keep);
    }
}
