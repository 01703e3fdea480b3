//! `perf_event_attr` entries of the attrs section (perf-format.md §1.3) and the
//! sample layout they imply. Attr bytes are only read here; `--attrs-for` cuts them
//! to an older perf's size ([`super::attr_compat`]), nothing else rewrites them.

use super::Endian;
use super::header::FileHeader;
use crate::error::{Error, Result};

/// `sample_type` bits (uapi `enum perf_event_sample_format`).
pub(crate) mod st {
    pub(crate) const IP: u64 = 1 << 0;
    pub(crate) const TID: u64 = 1 << 1;
    pub(crate) const TIME: u64 = 1 << 2;
    pub(crate) const ADDR: u64 = 1 << 3;
    pub(crate) const READ: u64 = 1 << 4;
    pub(crate) const CALLCHAIN: u64 = 1 << 5;
    pub(crate) const ID: u64 = 1 << 6;
    pub(crate) const CPU: u64 = 1 << 7;
    pub(crate) const PERIOD: u64 = 1 << 8;
    pub(crate) const STREAM_ID: u64 = 1 << 9;
    pub(crate) const RAW: u64 = 1 << 10;
    pub(crate) const BRANCH_STACK: u64 = 1 << 11;
    pub(crate) const REGS_USER: u64 = 1 << 12;
    pub(crate) const STACK_USER: u64 = 1 << 13;
    pub(crate) const IDENTIFIER: u64 = 1 << 16;
}

/// `read_format` bits.
pub(crate) mod rf {
    pub(crate) const TOTAL_TIME_ENABLED: u64 = 1;
    pub(crate) const TOTAL_TIME_RUNNING: u64 = 2;
    pub(crate) const ID: u64 = 4;
    pub(crate) const GROUP: u64 = 8;
    pub(crate) const LOST: u64 = 16;
}

/// `branch_sample_type` bits that change the sample layout or meaning.
pub(crate) mod bst {
    pub(crate) const HW_INDEX: u64 = 1 << 17;
    pub(crate) const COUNTERS: u64 = 1 << 19;
}

/// Attr flag bits (normalized to little-endian bit numbering).
pub(crate) mod flag {
    pub(crate) const SAMPLE_ID_ALL: u64 = 1 << 18;
}

/// The fields of one event's attr that pdinject needs.
#[derive(Clone, Debug)]
pub(crate) struct Attr {
    /// PMU type (`attr.type`).
    pub kind: u32,
    /// `attr.size` as written (0 is read as 64, like perf).
    pub size: u32,
    /// `attr.config`.
    pub config: u64,
    /// Which sample fields are present.
    pub sample_type: u64,
    /// Layout of PERF_SAMPLE_READ.
    pub read_format: u64,
    /// Flag bitfield, normalized so that bit n is attr flag n whatever the writer.
    pub flags: u64,
    /// `attr.branch_sample_type` (0 if beyond `attr.size`).
    pub branch_sample_type: u64,
    /// Mask of user registers in PERF_SAMPLE_REGS_USER.
    pub sample_regs_user: u64,
    /// Requested user stack dump size.
    pub sample_stack_user: u32,
    /// Mask of interrupt registers in PERF_SAMPLE_REGS_INTR.
    pub sample_regs_intr: u64,
    /// `attr.clockid` (0 if beyond `attr.size`): the clock of the times when the
    /// `use_clockid` flag is set.
    pub clockid: u32,
    /// The sample ids of this event (from its ids section).
    pub ids: Vec<u64>,
}

impl Attr {
    /// Parses one `perf_event_attr` (without the trailing ids section).
    pub(crate) fn parse(bytes: &[u8], e: Endian, big_endian_bitfield: bool) -> Option<Attr> {
        let get64 = |off: usize, size: u32| -> u64 {
            if off + 8 <= size as usize {
                e.u64(bytes, off).unwrap_or(0)
            } else {
                0
            }
        };
        let kind = e.u32(bytes, 0)?;
        let mut size = e.u32(bytes, 4)?;
        if size == 0 {
            size = 64;
        }
        let size = size.min(bytes.len() as u32);
        if size < 64 {
            return None;
        }
        let raw_flags: [u8; 8] = bytes.get(40..48)?.try_into().ok()?;
        // C bitfields are allocated from the most significant bit on big-endian
        // writers: the bytes stay in place and the bit order in each byte reverses
        // (perf's swap_bitfield).
        let flags = if big_endian_bitfield {
            u64::from_le_bytes(raw_flags.map(u8::reverse_bits))
        } else {
            u64::from_le_bytes(raw_flags)
        };
        Some(Attr {
            kind,
            size,
            config: get64(8, size),
            sample_type: get64(24, size),
            read_format: get64(32, size),
            flags,
            branch_sample_type: get64(72, size),
            sample_regs_user: get64(80, size),
            sample_stack_user: if size >= 92 {
                e.u32(bytes, 88).unwrap_or(0)
            } else {
                0
            },
            sample_regs_intr: get64(96, size),
            clockid: if size >= 96 {
                e.u32(bytes, 92).unwrap_or(0)
            } else {
                0
            },
            ids: Vec::new(),
        })
    }

    /// Whether non-sample kernel records carry a sample-id trailer.
    pub(crate) fn sample_id_all(&self) -> bool {
        self.flags & flag::SAMPLE_ID_ALL != 0
    }
}

/// Reads every attr and its ids from a file-mode perf.data.
pub(crate) fn read_attrs(
    header: &FileHeader,
    file: &[u8],
    ids_at: impl Fn(u64, u64) -> Result<Vec<u8>>,
) -> Result<Vec<Attr>> {
    let e = header.endian;
    let n = header.attrs.size / header.attr_size;
    if n > crate::limits::MAX_ATTRS {
        return Err(crate::limits::Exceeded {
            what: "number of event attributes",
            value: n,
            limit: crate::limits::MAX_ATTRS,
        }
        .at(32));
    }
    let mut out = Vec::with_capacity(n.min(4096) as usize);
    let base = header.attrs.offset;
    // Limits policy: no two ids sections share a byte (else 1,500 attrs whose ids
    // all cover the whole file are 1,500 copies of it, in memory and in the output).
    let attr_len = (header.attr_size - 16) as usize;
    let mut regions = Vec::new();
    for i in 0..n {
        let off = base + i * header.attr_size;
        let at = (off - base) as usize + attr_len;
        if let (Some(o), Some(sz)) = (e.u64(file, at), e.u64(file, at + 8)) {
            regions.push((
                format!("the ids section of attr {i}"),
                super::header::Section {
                    offset: o,
                    size: sz,
                },
                off + attr_len as u64,
            ));
        }
    }
    super::header::check_disjoint(regions, super::header::Aliases::Refused)?;
    for i in 0..n {
        let off = base + i * header.attr_size;
        let entry = file
            .get((off - base) as usize..(off - base + header.attr_size) as usize)
            .ok_or_else(|| Error::format(off, "attr entry is truncated"))?;
        let attr_len = (header.attr_size - 16) as usize;
        let mut attr = Attr::parse(&entry[..attr_len], e, e == Endian::Big)
            .ok_or_else(|| Error::format(off, "attr entry is shorter than 64 bytes"))?;
        let ids_off = e.u64(entry, attr_len).unwrap_or(0);
        let ids_size = e.u64(entry, attr_len + 8).unwrap_or(0);
        if !ids_size.is_multiple_of(8) {
            return Err(Error::format(
                off + attr_len as u64 + 8,
                format!("ids section size {ids_size} is not a multiple of 8"),
            ));
        }
        if ids_size > 0 {
            let raw = ids_at(ids_off, ids_size).map_err(|_| {
                Error::format(
                    off + attr_len as u64,
                    format!("ids section [{ids_off:#x}, +{ids_size:#x}) is outside the file"),
                )
            })?;
            attr.ids = raw.chunks_exact(8).filter_map(|c| e.u64(c, 0)).collect();
        }
        out.push(attr);
    }
    if out.is_empty() {
        return Err(Error::format(24, "the file has no event attributes"));
    }
    Ok(out)
}
