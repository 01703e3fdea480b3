//! Record framing, once: the header every record starts with (`struct
//! perf_event_header`, perf-format.md §1.4) with the record types and misc bits it
//! carries, where a record ends (its `header.size` plus the out-of-band payload of
//! TRACING_DATA and AUXTRACE), and the one size policy every reader applies. Its own
//! module, below the record bodies, the build-ID entries, the compressed stream and
//! the walker, so that each of them frames records without using the others.

use super::Endian;
use crate::error::{Error, Result};

/// Record types (kernel: < 64, perf tool: >= 64).
pub(crate) mod rt {
    pub(crate) const MMAP: u32 = 1;
    pub(crate) const COMM: u32 = 3;
    pub(crate) const EXIT: u32 = 4;
    pub(crate) const FORK: u32 = 7;
    pub(crate) const SAMPLE: u32 = 9;
    pub(crate) const MMAP2: u32 = 10;
    pub(crate) const AUX: u32 = 11;
    /// PERF_RECORD_CALLCHAIN_DEFERRED: the user part of earlier samples' callchains
    /// (see `CallchainDeferred` in the record module).
    pub(crate) const CALLCHAIN_DEFERRED: u32 = 22;
    pub(crate) const HEADER_ATTR: u32 = 64;
    pub(crate) const HEADER_EVENT_TYPE: u32 = 65;
    pub(crate) const HEADER_TRACING_DATA: u32 = 66;
    pub(crate) const HEADER_BUILD_ID: u32 = 67;
    pub(crate) const FINISHED_ROUND: u32 = 68;
    pub(crate) const AUXTRACE_INFO: u32 = 70;
    pub(crate) const AUXTRACE: u32 = 71;
    pub(crate) const HEADER_FEATURE: u32 = 80;
    pub(crate) const COMPRESSED: u32 = 81;
    pub(crate) const COMPRESSED2: u32 = 83;
    /// First perf-tool (user) record type; these carry no sample-id trailer.
    pub(crate) const USER_START: u32 = 64;
}

/// `header.misc` values and bits.
pub(crate) mod misc {
    pub(crate) const CPUMODE_MASK: u16 = 7;
    pub(crate) const KERNEL: u16 = 1;
    pub(crate) const USER: u16 = 2;
    pub(crate) const HYPERVISOR: u16 = 3;
    pub(crate) const GUEST_KERNEL: u16 = 4;
    pub(crate) const GUEST_USER: u16 = 5;
    /// COMM: the comm changed because of exec. MMAP*: a non-executable mapping.
    pub(crate) const COMM_EXEC: u16 = 0x2000;
    pub(crate) const MMAP_DATA: u16 = 0x2000;
    /// MMAP2 carries a build ID instead of device/inode.
    pub(crate) const MMAP_BUILD_ID: u16 = 0x4000;
    /// HEADER_BUILD_ID: byte 32 holds the build-ID length.
    pub(crate) const BUILD_ID_SIZE: u16 = 0x8000;
}

/// `struct perf_event_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// Record type.
    pub kind: u32,
    /// Misc bits (cpumode, flags).
    pub misc: u16,
    /// Total size including this header.
    pub size: u16,
}

impl RecordHeader {
    /// Parses the 8-byte header at the start of `data`.
    #[inline]
    pub(crate) fn parse(data: &[u8], e: Endian) -> Option<RecordHeader> {
        Some(RecordHeader {
            kind: e.u32(data, 0)?,
            misc: e.u16(data, 4)?,
            size: e.u16(data, 6)?,
        })
    }

    /// The cpumode value (`misc & 7`).
    #[inline]
    pub(crate) fn cpumode(&self) -> u16 {
        self.misc & misc::CPUMODE_MASK
    }
}

/// Bytes that follow a record outside its `header.size` (TRACING_DATA, AUXTRACE).
pub(super) fn out_of_band_len(h: &RecordHeader, body: &[u8], e: Endian) -> Option<u64> {
    match h.kind {
        rt::HEADER_TRACING_DATA => Some(e.u32(body, 8)? as u64),
        rt::AUXTRACE => e.u64(body, 8),
        _ => Some(0),
    }
}

/// Largest out-of-band payload (AUXTRACE, TRACING_DATA) one record may announce.
/// perf's AUX buffers are a few MB; a size beyond this is damage, not data.
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;

/// The framing of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Its header.
    pub header: RecordHeader,
    /// Bytes out of band after the record (AUXTRACE and TRACING_DATA payloads).
    pub oob: u64,
}

impl Frame {
    /// `header.size`: the bytes of the record proper.
    pub(crate) fn size(&self) -> usize {
        self.header.size as usize
    }

    /// The record and its payload: where the next record starts.
    pub(crate) fn total(&self) -> u64 {
        self.header.size as u64 + self.oob
    }
}

/// Frames the record at the start of `bytes` (at offset `at` of its file, for
/// messages). `Ok(None)` when `bytes` ends before the record proper does (more bytes
/// are needed); an error when no valid record can start here: a size smaller than
/// the header, an unreadable or oversized payload length. The payload itself need
/// not be in `bytes`.
pub(crate) fn frame(bytes: &[u8], e: Endian, at: u64) -> Result<Option<Frame>> {
    let Some(header) = RecordHeader::parse(bytes, e) else {
        return Ok(None);
    };
    let size = header.size as usize;
    if size < 8 {
        return Err(Error::format(
            at,
            format!(
                "record of type {} has size {size}, smaller than its header",
                header.kind
            ),
        ));
    }
    let Some(body) = bytes.get(..size) else {
        return Ok(None);
    };
    let oob = out_of_band_len(&header, body, e)
        .ok_or_else(|| Error::format(at, "truncated out-of-band size"))?;
    if oob > MAX_PAYLOAD {
        return Err(Error::format(
            at,
            format!(
                "record of type {} announces {oob} payload bytes (more than {MAX_PAYLOAD})",
                header.kind
            ),
        ));
    }
    Ok(Some(Frame { header, oob }))
}
