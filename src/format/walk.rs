//! The walker that visits every record of a range, COMPRESSED contents included,
//! through windows of any byte source, each record framed by the `framing` module's one
//! primitive and size policy (named here too).

use super::Endian;
use super::compressed::{InnerError, InnerStream, payload};
pub(crate) use super::framing::frame;
use super::framing::{RecordHeader, rt};
use crate::error::{Error, Result};
use std::ops::{ControlFlow, Deref};

/// Bytes of a record stream readable in windows: a mapped file, a buffer.
pub(crate) trait Windows {
    /// A window's bytes.
    type Window: Deref<Target = [u8]>;
    /// `len` bytes at `offset` (the caller keeps the range inside the stream).
    fn window(&self, offset: u64, len: u64) -> Result<Self::Window>;
    /// The file the bytes are from, for messages (a directory's `data.N`); `None`
    /// when the caller knows better.
    fn file(&self) -> Option<&std::path::Path> {
        None
    }
}

/// Bytes of a stream in memory (a batch), from stream offset `base`, as windows.
pub(crate) struct InMemory<'b> {
    /// The bytes.
    pub bytes: &'b [u8],
    /// The stream offset of the first.
    pub base: u64,
}

impl<'b> Windows for InMemory<'b> {
    type Window = &'b [u8];
    fn window(&self, offset: u64, len: u64) -> Result<&'b [u8]> {
        offset
            .checked_sub(self.base)
            .and_then(|a| usize::try_from(a).ok())
            .and_then(|a| {
                self.bytes
                    .get(a..a.checked_add(usize::try_from(len).ok()?)?)
            })
            .ok_or_else(|| crate::error::Error::format(offset, "window outside the batch"))
    }
}

/// A record handed to a walker callback.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rec<'a> {
    /// File offset of the record (for inner records: of the COMPRESSED record).
    pub offset: u64,
    /// True for records decoded from compressed data.
    pub inner: bool,
    /// Sequential number of the record in the whole input.
    pub seq: u64,
    /// Its header.
    pub header: RecordHeader,
    /// Its bytes, header included.
    pub bytes: &'a [u8],
}

/// A contiguous range of one data file that a worker resolves on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// Index into the input's data files.
    pub file: usize,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// `seq` of the first record.
    pub first_seq: u64,
}

/// Walks records of a range in windows, decompressing COMPRESSED records.
pub(crate) struct Walker {
    e: Endian,
    inner: Option<InnerStream>,
    /// The `seq` the next record gets.
    pub seq: u64,
}

impl Walker {
    /// A walker whose first record gets `first_seq`.
    pub(crate) fn new(e: Endian, first_seq: u64) -> Self {
        Walker {
            e,
            inner: None,
            seq: first_seq,
        }
    }

    /// The byte order of the records walked.
    pub(crate) fn endian(&self) -> Endian {
        self.e
    }

    /// True when a chunk may begin at the next record (no compressed frame or inner
    /// record is half-way).
    pub(crate) fn is_clean(&self) -> bool {
        self.inner.as_ref().is_none_or(|i| i.is_clean())
    }

    /// Goes on in another data file of a directory: each is compressed by a zstd
    /// stream of its own (one per recording thread), so what was open is dropped;
    /// the records' numbers go on.
    pub(crate) fn begin_file(&mut self) {
        self.inner = None;
    }

    /// Calls `f` for every record (outer and inner) of `src[start..end)`, reading
    /// `window` bytes at a time; `after` is called after each outer record with the
    /// offset following it.
    pub(crate) fn walk<W: Windows + ?Sized>(
        &mut self,
        src: &W,
        start: u64,
        end: u64,
        window: u64,
        f: &mut dyn FnMut(&Rec<'_>) -> Result<()>,
        after: &mut dyn FnMut(&Walker, u64) -> Result<()>,
    ) -> Result<()> {
        self.walk_until(src, start, end, window, f, &mut |w, next| {
            after(w, next).map(|()| ControlFlow::<()>::Continue(()))
        })
        .map(|_| ())
    }

    /// [`Walker::walk`] whose `after` may end the walk early, after a record, with
    /// [`ControlFlow::Break`] (a pause the caller goes on from, not an error), whose
    /// value the walk returns.
    pub(crate) fn walk_until<W: Windows + ?Sized, B>(
        &mut self,
        src: &W,
        start: u64,
        end: u64,
        window: u64,
        f: &mut dyn FnMut(&Rec<'_>) -> Result<()>,
        after: &mut dyn FnMut(&Walker, u64) -> Result<ControlFlow<B>>,
    ) -> Result<ControlFlow<B>> {
        let e = self.e;
        let mut pos = start;
        while pos < end {
            let wlen = (end - pos).min(window.max(1 << 16));
            let win = src.window(pos, wlen)?;
            let buf: &[u8] = &win;
            let mut local = 0usize;
            loop {
                let off = pos + local as u64;
                if off >= end {
                    pos = off;
                    break;
                }
                let rest = &buf[local..];
                let Some(fr) = frame(rest, e, off)? else {
                    // The record does not fit in what is left of the window: the next
                    // window starts with it, unless the data ends first.
                    let what = match RecordHeader::parse(rest, e) {
                        Some(h) if off + h.size as u64 > end => format!(
                            "record of type {} and size {} runs past the end of the data ({end:#x})",
                            h.kind, h.size
                        ),
                        Some(_) => {
                            pos = off;
                            break;
                        }
                        None if off + 8 > end => format!(
                            "{} bytes of a truncated record header at the end of the data",
                            end - off
                        ),
                        None => {
                            pos = off;
                            break;
                        }
                    };
                    return Err(Error::format(off, what));
                };
                let bytes = &rest[..fr.size()];
                self.record(off, fr.header, bytes, f)?;
                let next = off
                    .checked_add(fr.total())
                    .filter(|&n| n <= end)
                    .ok_or_else(|| {
                        Error::format(
                            off,
                            format!(
                                "record of type {} announces {} payload bytes past the end of the data",
                                fr.header.kind, fr.oob
                            ),
                        )
                    })?;
                if let ControlFlow::Break(b) = after(self, next)? {
                    return Ok(ControlFlow::Break(b));
                }
                if next - pos >= buf.len() as u64 {
                    pos = next;
                    break;
                }
                local = (next - pos) as usize;
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    fn record(
        &mut self,
        off: u64,
        h: RecordHeader,
        bytes: &[u8],
        f: &mut dyn FnMut(&Rec<'_>) -> Result<()>,
    ) -> Result<()> {
        let seq = self.seq;
        self.seq += 1;
        f(&Rec {
            offset: off,
            inner: false,
            seq,
            header: h,
            bytes,
        })?;
        if h.kind != rt::COMPRESSED && h.kind != rt::COMPRESSED2 {
            return Ok(());
        }
        let data = payload(&h, bytes, self.e).ok_or_else(|| {
            Error::format(off, "COMPRESSED2 record's data size exceeds the record")
        })?;
        let inner = match &mut self.inner {
            Some(i) => i,
            slot => slot.insert(
                InnerStream::new(self.e).map_err(|e| Error::format(off, format!("zstd: {e}")))?,
            ),
        };
        let seqr = &mut self.seq;
        let mut err = None;
        let r = inner.feed(data, |ih, irec| {
            let s = *seqr;
            *seqr += 1;
            if ih.kind == rt::COMPRESSED || ih.kind == rt::COMPRESSED2 {
                return Err(InnerError::BadRecord(
                    "compressed record inside compressed data",
                ));
            }
            f(&Rec {
                offset: off,
                inner: true,
                seq: s,
                header: ih,
                bytes: irec,
            })
            .map_err(|e| {
                err = Some(e);
                InnerError::BadRecord("")
            })
        });
        if let Some(e) = err {
            return Err(e);
        }
        r.map_err(|e| match e {
            InnerError::Zstd(m) => Error::format(off, format!("compressed record: zstd: {m}")),
            InnerError::BadRecord(m) => Error::format(off, format!("compressed record: {m}")),
        })
    }
}

/// Offset of the first record in `bytes` that may hold a sample (a SAMPLE, a
/// deferred user callchain, or compressed data), or `bytes.len()`: records a sample
/// needs go before it.
pub(crate) fn first_sampleish(bytes: &[u8], e: Endian) -> usize {
    let mut at = 0usize;
    while let Ok(Some(fr)) = frame(&bytes[at..], e, at as u64) {
        if matches!(
            fr.header.kind,
            rt::SAMPLE | rt::CALLCHAIN_DEFERRED | rt::COMPRESSED | rt::COMPRESSED2
        ) {
            return at;
        }
        match usize::try_from(fr.total())
            .ok()
            .and_then(|n| at.checked_add(n))
        {
            Some(next) if next <= bytes.len() => at = next,
            _ => break,
        }
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::framing::MAX_PAYLOAD;

    fn rec(kind: u32, size: u16) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.resize(size as usize, 0);
        v
    }

    #[test]
    fn frames_need_the_whole_record_but_not_its_payload() {
        let e = Endian::Little;
        assert_eq!(frame(&[1, 0, 0], e, 0).unwrap(), None);
        let r = rec(rt::MMAP2, 24);
        assert_eq!(frame(&r[..16], e, 0).unwrap(), None);
        assert_eq!(frame(&r, e, 0).unwrap().map(|f| f.total()), Some(24));
        let mut aux = rec(rt::AUXTRACE, 48);
        aux[8..16].copy_from_slice(&4096u64.to_le_bytes());
        assert_eq!(
            frame(&aux, e, 0).unwrap().map(|f| f.total()),
            Some(48 + 4096)
        );
        aux[8..16].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(frame(&aux, e, 0).is_err(), "payload over the policy");
        let mut small = rec(rt::MMAP2, 8);
        small[6] = 4;
        assert!(frame(&small, e, 7).is_err(), "size under the header");
    }

    #[test]
    fn records_go_before_the_first_record_that_may_hold_samples() {
        let mut b = rec(rt::HEADER_ATTR, 16);
        b.extend(rec(rt::MMAP2, 24));
        let at = b.len();
        b.extend(rec(rt::COMPRESSED, 32));
        b.extend(rec(rt::SAMPLE, 16));
        assert_eq!(first_sampleish(&b, Endian::Little), at);
        let only_maps = rec(rt::MMAP2, 24);
        assert_eq!(first_sampleish(&only_maps, Endian::Little), only_maps.len());
        // A zero size ends the walk instead of looping.
        let mut bad = rec(rt::MMAP2, 24);
        bad.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(first_sampleish(&bad, Endian::Little), bad.len());
    }
}
