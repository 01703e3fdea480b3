//! The few record bodies the model needs: MMAP, MMAP2, COMM, FORK/EXIT,
//! HEADER_BUILD_ID (perf-format.md §3). Their framing (`struct perf_event_header`,
//! perf-format.md §1.4) is the `framing` module's, named here too.

use super::buildid::BuildId;
pub(crate) use super::framing::{RecordHeader, misc, rt};
use super::{Endian, c_str};

/// What identifies the file behind a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileIdent {
    /// Nothing (plain MMAP record).
    None,
    /// Device and inode from a classic MMAP2; `generation` 0 means unknown
    /// (perf synthesizes MMAP2 for running processes with generation 0).
    Inode {
        /// Device major number.
        maj: u32,
        /// Device minor number.
        min: u32,
        /// Inode number.
        ino: u64,
        /// Inode generation (0 = unknown).
        generation: u64,
    },
    /// A build ID carried by a build-ID MMAP2 record.
    BuildId(BuildId),
}

/// A decoded MMAP or MMAP2 record.
#[derive(Clone, Debug)]
pub(crate) struct Mmap<'a> {
    /// Process id (`u32::MAX` for the kernel, i.e. -1).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start address.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// File offset of the mapping.
    pub pgoff: u64,
    /// Identity of the file.
    pub ident: FileIdent,
    /// Protection bits (MMAP2; MMAP records report PROT_EXEC unless MMAP_DATA).
    pub prot: u32,
    /// mmap flags (MMAP2 only).
    pub flags: u32,
    /// File name bytes (without the NUL).
    pub filename: &'a [u8],
}

/// Bytes before an MMAP record's file name: the header, pid, tid, start, len and
/// pgoff.
pub(crate) const MMAP_FIXED: usize = 40;
/// Bytes before an MMAP2 record's file name: an MMAP's, then the identity union
/// ([`MMAP2_UNION`] bytes: maj, min, ino, generation, or the build ID), prot and
/// flags.
pub(crate) const MMAP2_FIXED: usize = 72;
/// Bytes an MMAP record grows by when it is written as an MMAP2.
pub(crate) const MMAP_TO_MMAP2: usize = MMAP2_FIXED - MMAP_FIXED;

/// The fixed part of a mapping record of `kind` (MMAP, else MMAP2): its file name
/// follows.
pub(crate) fn mmap_fixed(kind: u32) -> usize {
    if kind == rt::MMAP {
        MMAP_FIXED
    } else {
        MMAP2_FIXED
    }
}

/// A COMM record's ids (its name follows them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Comm {
    /// Process id.
    pub pid: u32,
    /// Thread id (`None`: the record ends before it).
    pub tid: Option<u32>,
}

impl Comm {
    /// The ids of COMM record `rec` (header included); `None` when it holds no pid.
    pub(crate) fn parse(rec: &[u8], e: Endian) -> Option<Comm> {
        Some(Comm {
            pid: e.u32(rec, 8)?,
            tid: e.u32(rec, 12),
        })
    }
}

/// A FORK (or EXIT) record: pid, ppid, tid, ptid, time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fork {
    /// The new process.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// The new thread (`None`: the record ends before it; likewise below).
    pub tid: Option<u32>,
    /// The parent thread.
    pub ptid: Option<u32>,
    /// The record's own time field (the sample-id trailer may carry one too).
    pub time: Option<u64>,
}

impl Fork {
    /// FORK record `rec` (header included); `None` when it holds no pid and ppid.
    pub(crate) fn parse(rec: &[u8], e: Endian) -> Option<Fork> {
        Some(Fork {
            pid: e.u32(rec, 8)?,
            ppid: e.u32(rec, 12)?,
            tid: e.u32(rec, 16),
            ptid: e.u32(rec, 20),
            time: e.u64(rec, 24),
        })
    }
}

/// PERF_CONTEXT_USER_DEFERRED: a sample's callchain ends with this marker and a
/// cookie when its user part comes later, in a [`CallchainDeferred`] record (perf
/// 7.x `--call-graph fp,defer`, kernels after 6.18).
pub(crate) const CONTEXT_USER_DEFERRED: u64 = (-640i64) as u64;

/// A PERF_RECORD_CALLCHAIN_DEFERRED record (type 22): `{header (misc USER), u64
/// cookie, u64 nr, u64 ips[nr], sample_id}`, written by the kernel when a task whose
/// samples deferred their user callchain returns to user space
/// (`perf_callchain_deferred_output()`). The ips are user addresses of the task the
/// trailer names, at the record's own time, without a PERF_CONTEXT_USER marker. perf
/// 7.3 joins it to the waiting samples of the same tid whose cookie matches
/// (`evlist__deliver_deferred_callchain`); for what a DSO is, the record's own pid
/// and time name the right address space, whichever samples it joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CallchainDeferred<'a> {
    /// The cookie the samples' chains end with.
    pub cookie: u64,
    /// `nr` addresses, 8 bytes each in the record's byte order
    /// ([`super::sample::u64s`] reads them).
    pub ips: &'a [u8],
}

impl<'a> CallchainDeferred<'a> {
    /// Bytes before the addresses: the header, the cookie and `nr`.
    pub(crate) const FIXED: usize = 24;

    /// Record `rec` (header included), whose sample-id trailer is `trailer` bytes;
    /// `None` when `nr` addresses do not fit before the trailer.
    pub(crate) fn parse(rec: &'a [u8], e: Endian, trailer: usize) -> Option<CallchainDeferred<'a>> {
        let cookie = e.u64(rec, 8)?;
        let nr = usize::try_from(e.u64(rec, 16)?).ok()?;
        let end = Self::FIXED.checked_add(nr.checked_mul(8)?)?;
        if end > rec.len().checked_sub(trailer)? {
            return None;
        }
        Some(CallchainDeferred {
            cookie,
            ips: rec.get(Self::FIXED..end)?,
        })
    }
}

/// A HEADER_FEATURE record: the feature's bit and its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FeatureRecord<'a> {
    /// The feature bit.
    pub id: u64,
    /// Its payload (empty for perf's end-of-features marker).
    pub payload: &'a [u8],
}

impl<'a> FeatureRecord<'a> {
    /// HEADER_FEATURE record `rec` (header included); `None` when it holds no id.
    pub(crate) fn parse(rec: &'a [u8], e: Endian) -> Option<FeatureRecord<'a>> {
        Some(FeatureRecord {
            id: e.u64(rec, 8)?,
            payload: rec.get(16..).unwrap_or_default(),
        })
    }
}

/// PROT_EXEC.
pub(crate) const PROT_EXEC: u32 = 4;
/// MAP_HUGETLB.
pub(crate) const MAP_HUGETLB: u32 = 0x40000;

/// Parses an MMAP (`kind == MMAP`) or MMAP2 record; `body_end` excludes the trailer.
pub(crate) fn parse_mmap<'a>(
    h: &RecordHeader,
    rec: &'a [u8],
    body_end: usize,
    e: Endian,
) -> Option<Mmap<'a>> {
    let pid = e.u32(rec, 8)?;
    let tid = e.u32(rec, 12)?;
    let start = e.u64(rec, 16)?;
    let len = e.u64(rec, 24)?;
    let pgoff = e.u64(rec, 32)?;
    if h.kind == rt::MMAP {
        let name = rec.get(MMAP_FIXED..body_end)?;
        return Some(Mmap {
            pid,
            tid,
            start,
            len,
            pgoff,
            ident: FileIdent::None,
            prot: if h.misc & misc::MMAP_DATA != 0 {
                1
            } else {
                1 | PROT_EXEC
            },
            flags: 0,
            filename: c_str(name),
        });
    }
    let ident = if h.misc & misc::MMAP_BUILD_ID != 0 {
        let n = *rec.get(40)? as usize;
        match BuildId::new(rec.get(44..64)?, n) {
            Some(b) => FileIdent::BuildId(b),
            None => FileIdent::None,
        }
    } else {
        FileIdent::Inode {
            maj: e.u32(rec, 40)?,
            min: e.u32(rec, 44)?,
            ino: e.u64(rec, 48)?,
            generation: e.u64(rec, 56)?,
        }
    };
    let name = rec.get(MMAP2_FIXED..body_end)?;
    Some(Mmap {
        pid,
        tid,
        start,
        len,
        pgoff,
        ident,
        prot: e.u32(rec, 64)?,
        flags: e.u32(rec, 68)?,
        filename: c_str(name),
    })
}

/// The sample-id trailer of a non-sample record.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SampleId {
    /// pid from the trailer, if present.
    pub pid: Option<u32>,
    /// Time from the trailer, if present.
    pub time: Option<u64>,
}

/// Layout of the sample-id trailer (from the first attr, like perf).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TrailerLayout {
    /// Total trailer length.
    pub size: usize,
    /// Offset of `{pid, tid}` within the trailer.
    pub tid_at: Option<usize>,
    /// Offset of `time` within the trailer.
    pub time_at: Option<usize>,
}

impl TrailerLayout {
    /// Layout for a `sample_type` with `sample_id_all` set (size 0 when not set).
    pub(crate) fn new(sample_type: u64, sample_id_all: bool) -> Self {
        use super::attr::st;
        if !sample_id_all {
            return TrailerLayout::default();
        }
        let mut at = 0;
        let mut tid_at = None;
        let mut time_at = None;
        if sample_type & st::TID != 0 {
            tid_at = Some(at);
            at += 8;
        }
        if sample_type & st::TIME != 0 {
            time_at = Some(at);
            at += 8;
        }
        for b in [st::ID, st::STREAM_ID, st::CPU, st::IDENTIFIER] {
            if sample_type & b != 0 {
                at += 8;
            }
        }
        TrailerLayout {
            size: at,
            tid_at,
            time_at,
        }
    }

    /// Reads the trailer of a kernel record (`rec` is the whole record).
    pub(crate) fn read(&self, rec: &[u8], e: Endian) -> SampleId {
        if self.size == 0 || rec.len() < 8 + self.size {
            return SampleId::default();
        }
        let base = rec.len() - self.size;
        SampleId {
            pid: self.tid_at.and_then(|o| e.u32(rec, base + o)),
            time: self.time_at.and_then(|o| e.u64(rec, base + o)),
        }
    }
}

/// Size of the build-ID union of an MMAP2 record (maj/min/ino/generation in the
/// classic form; size, reserved bytes and 20 ID bytes in the build-ID form).
pub(crate) const MMAP2_UNION: usize = 24;

/// The build-ID form of the MMAP or MMAP2 record `rec` (the whole record, trailer
/// included): misc gains `MMAP_BUILD_ID`, bytes 40..64 hold the ID's size, three
/// reserved bytes and the ID zero-padded to 20 bytes (perf-format.md §3.2). An
/// MMAP2 keeps its size; an MMAP becomes an MMAP2 32 bytes longer, its name and
/// trailer bytes copied as they are, prot and flags as perf reads an MMAP (PROT_EXEC
/// unless MMAP_DATA; kernel-space maps 0, as `perf record --buildid-mmap` writes
/// them). `None` when the record is too short to be a mapping or would outgrow a
/// record's 64 KiB.
pub(crate) fn encode_build_id_mmap2(
    rec: &[u8],
    e: Endian,
    id: &BuildId,
    kernel_space: bool,
) -> Option<Vec<u8>> {
    let h = RecordHeader::parse(rec, e)?;
    if rec.len() != h.size as usize {
        return None;
    }
    let mut union = [0u8; MMAP2_UNION];
    let raw = id.as_bytes();
    union[0] = raw.len() as u8;
    union[4..4 + raw.len()].copy_from_slice(raw);
    match h.kind {
        rt::MMAP2 if rec.len() >= MMAP2_FIXED => {
            let mut out = rec.to_vec();
            out[4..6].copy_from_slice(&e.put_u16(h.misc | misc::MMAP_BUILD_ID));
            out[MMAP_FIXED..MMAP_FIXED + MMAP2_UNION].copy_from_slice(&union);
            Some(out)
        }
        rt::MMAP if rec.len() >= MMAP_FIXED => {
            let size = u16::try_from(rec.len() + MMAP_TO_MMAP2).ok()?;
            let prot = if kernel_space || h.misc & misc::MMAP_DATA != 0 {
                0
            } else {
                PROT_EXEC
            };
            let mut out = Vec::with_capacity(rec.len() + MMAP_TO_MMAP2);
            out.extend_from_slice(&e.put_u32(rt::MMAP2));
            out.extend_from_slice(&e.put_u16(h.misc | misc::MMAP_BUILD_ID));
            out.extend_from_slice(&e.put_u16(size));
            out.extend_from_slice(&rec[8..MMAP_FIXED]);
            out.extend_from_slice(&union);
            out.extend_from_slice(&e.put_u32(prot));
            out.extend_from_slice(&e.put_u32(0));
            out.extend_from_slice(&rec[MMAP_FIXED..]);
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod mmap2_tests {
    use super::*;

    fn mmap_v1(e: Endian, name: &[u8], trailer: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        let size = 40 + name.len() + trailer.len();
        r.extend_from_slice(&e.put_u32(rt::MMAP));
        r.extend_from_slice(&e.put_u16(misc::KERNEL));
        r.extend_from_slice(&e.put_u16(size as u16));
        for v in [u32::MAX, 0] {
            r.extend_from_slice(&e.put_u32(v));
        }
        for v in [0xffff_ffff_8100_0000u64, 0x120_0000, 0xffff_ffff_8100_0000] {
            r.extend_from_slice(&e.put_u64(v));
        }
        r.extend_from_slice(name);
        r.extend_from_slice(trailer);
        r
    }

    #[test]
    fn mmap_grows_by_32_and_parses_back_with_the_id() {
        for e in [Endian::Little, Endian::Big] {
            let id = BuildId::from_hex("0123456789abcdef0123456789abcdef01234567").unwrap();
            let name = b"[kernel.kallsyms]_text\0\0";
            let trailer = [7u8; 16];
            let v1 = mmap_v1(e, name, &trailer);
            let v2 = encode_build_id_mmap2(&v1, e, &id, true).unwrap();
            assert_eq!(v2.len(), v1.len() + 32);
            let h = RecordHeader::parse(&v2, e).unwrap();
            assert_eq!((h.kind, h.size as usize), (rt::MMAP2, v2.len()));
            assert_eq!(h.misc, misc::KERNEL | misc::MMAP_BUILD_ID);
            let m = parse_mmap(&h, &v2, v2.len() - 16, e).unwrap();
            assert_eq!(m.ident, FileIdent::BuildId(id));
            assert_eq!(m.filename, b"[kernel.kallsyms]_text");
            assert_eq!(m.pgoff, 0xffff_ffff_8100_0000);
            assert_eq!(&v2[v2.len() - 16..], &trailer);
        }
    }

    #[test]
    fn mmap2_keeps_its_size_and_a_short_id_is_padded() {
        let e = Endian::Little;
        let v1 = mmap_v1(e, b"/bin/x\0\0", &[]);
        let mut v2 =
            encode_build_id_mmap2(&v1, e, &BuildId::from_hex("aa").unwrap(), false).unwrap();
        // A classic MMAP2 with inode fields set: the union is replaced whole.
        v2[4..6].copy_from_slice(&e.put_u16(misc::USER));
        v2[40..64].copy_from_slice(&[0xee; 24]);
        let id = BuildId::from_hex("deadbeefdeadbeefdeadbeefdeadbeef").unwrap();
        let v3 = encode_build_id_mmap2(&v2, e, &id, false).unwrap();
        assert_eq!(v3.len(), v2.len());
        assert_eq!(v3[40], 16);
        assert_eq!(&v3[41..44], &[0, 0, 0]);
        assert_eq!(&v3[60..64], &[0, 0, 0, 0]);
        let h = RecordHeader::parse(&v3, e).unwrap();
        assert_eq!(
            parse_mmap(&h, &v3, v3.len(), e).unwrap().ident,
            FileIdent::BuildId(id)
        );
        assert_eq!(e.u32(&v3, 64), Some(PROT_EXEC), "an MMAP is executable");
        assert!(encode_build_id_mmap2(&v3[..50], e, &id, false).is_none());
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;

    /// The typed views read the fields where perf's layouts put them, in either
    /// byte order, and refuse a record too short for the fields they require.
    #[test]
    fn fork_comm_and_feature_records_by_their_layout() {
        for e in [Endian::Little, Endian::Big] {
            let mut fork = vec![0u8; 8];
            for v in [10u32, 20, 11, 21] {
                fork.extend_from_slice(&e.put_u32(v));
            }
            fork.extend_from_slice(&e.put_u64(99));
            let f = Fork::parse(&fork, e).expect("a whole FORK");
            assert_eq!(
                (f.pid, f.ppid, f.tid, f.ptid, f.time),
                (10, 20, Some(11), Some(21), Some(99))
            );
            let short = Fork::parse(&fork[..16], e).expect("pid and ppid");
            assert_eq!((short.tid, short.time), (None, None));
            assert_eq!(Fork::parse(&fork[..15], e), None);
            assert_eq!(
                Comm::parse(&fork, e),
                Some(Comm {
                    pid: 10,
                    tid: Some(20)
                })
            );
            assert_eq!(Comm::parse(&fork[..11], e), None);
            let mut feat = vec![0u8; 8];
            feat.extend_from_slice(&e.put_u64(7));
            assert_eq!(
                FeatureRecord::parse(&feat, e).map(|f| f.payload.len()),
                Some(0)
            );
            feat.extend_from_slice(b"abcd");
            let f = FeatureRecord::parse(&feat, e).expect("id and payload");
            assert_eq!((f.id, f.payload), (7, &b"abcd"[..]));
            assert_eq!(FeatureRecord::parse(&feat[..15], e), None);
        }
        assert_eq!(mmap_fixed(rt::MMAP), 40);
        assert_eq!(mmap_fixed(rt::MMAP2), 72);
        assert_eq!(MMAP_TO_MMAP2, 32);
    }
}

#[cfg(test)]
mod deferred_tests {
    use super::*;

    #[test]
    fn a_deferred_callchain_is_read_up_to_its_trailer() {
        let e = Endian::Little;
        let mut r = vec![0u8; 8];
        r.extend_from_slice(&7u64.to_le_bytes());
        r.extend_from_slice(&2u64.to_le_bytes());
        r.extend_from_slice(&0x401000u64.to_le_bytes());
        r.extend_from_slice(&0x402000u64.to_le_bytes());
        // A trailer of pid/tid and time.
        r.extend_from_slice(&[0u8; 16]);
        let d = CallchainDeferred::parse(&r, e, 16).unwrap();
        assert_eq!(d.cookie, 7);
        let ips: Vec<u64> = crate::format::sample::u64s(d.ips, e).collect();
        assert_eq!(ips, [0x401000, 0x402000]);
        // nr larger than the record, or reaching into the trailer.
        assert!(CallchainDeferred::parse(&r, e, 24).is_none());
        let mut big = r.clone();
        big[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(CallchainDeferred::parse(&big, e, 0).is_none());
        assert!(CallchainDeferred::parse(&r[..20], e, 0).is_none());
    }
}
