//! PERF_RECORD_COMPRESSED / COMPRESSED2: zstd frames whose content is more records.
//!
//! perf compresses each ring-buffer push as its own frame, and a push may end in the
//! middle of a record, so inner records can straddle compressed records. The
//! decompressor keeps a carry buffer for that and reports when it is "clean" (no
//! partial frame, no partial record): only there may a new chunk start.

use super::Endian;
use super::framing::{RecordHeader, frame, rt};
use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};

/// Largest decompressed slice handled at once; bounds memory whatever the ratio.
const OUT_STEP: usize = 1 << 20;

/// The zstd payload of a COMPRESSED or COMPRESSED2 record (`rec` is the whole record).
pub(crate) fn payload<'a>(h: &RecordHeader, rec: &'a [u8], e: Endian) -> Option<&'a [u8]> {
    match h.kind {
        rt::COMPRESSED => rec.get(8..),
        rt::COMPRESSED2 => {
            let n = e.u64(rec, 8)?;
            rec.get(16..16usize.checked_add(usize::try_from(n).ok()?)?)
        }
        _ => None,
    }
}

/// An inner record that no framing allows (its offset is the COMPRESSED record's).
fn bad_frame(_: crate::error::Error) -> InnerError {
    InnerError::BadRecord("inner record smaller than its header, or with an oversized payload")
}

/// Streaming decompressor of the inner record stream.
pub(crate) struct InnerStream {
    dec: Decoder<'static>,
    carry: Vec<u8>,
    out: Vec<u8>,
    /// Out-of-band bytes of an inner TRACING_DATA/AUXTRACE still to be skipped.
    skip: u64,
    frame_done: bool,
    e: Endian,
    bytes_in: u64,
    bytes_out: u64,
}

/// Problems inside compressed data.
#[derive(Debug)]
pub(crate) enum InnerError {
    /// zstd refused the bytes.
    Zstd(String),
    /// An inner record header is impossible.
    BadRecord(&'static str),
}

impl InnerStream {
    /// A fresh decompressor.
    pub(crate) fn new(e: Endian) -> std::io::Result<Self> {
        Ok(InnerStream {
            dec: Decoder::new()?,
            carry: Vec::new(),
            out: vec![0; OUT_STEP],
            skip: 0,
            frame_done: true,
            e,
            bytes_in: 0,
            bytes_out: 0,
        })
    }

    /// True when no frame or record is half-way: a chunk may start at the next record.
    pub(crate) fn is_clean(&self) -> bool {
        self.frame_done && self.carry.is_empty() && self.skip == 0
    }

    /// Decompresses `payload` and calls `f` with every complete inner record.
    pub(crate) fn feed(
        &mut self,
        payload: &[u8],
        mut f: impl FnMut(RecordHeader, &[u8]) -> Result<(), InnerError>,
    ) -> Result<(), InnerError> {
        let mut input = InBuffer::around(payload);
        loop {
            let before = input.pos();
            let mut output = OutBuffer::around(&mut self.out[..]);
            let hint = self
                .dec
                .run(&mut input, &mut output)
                .map_err(|err| InnerError::Zstd(err.to_string()))?;
            let produced = output.pos();
            self.frame_done = hint == 0;
            self.bytes_in += (input.pos() - before) as u64;
            self.bytes_out += produced as u64;
            // Limits policy: decompressed bytes per compressed byte (a zstd bomb would
            // otherwise cost minutes of CPU and fill memory with model events).
            crate::limits::check_decompressed(self.bytes_in, self.bytes_out).map_err(|l| {
                InnerError::Zstd(format!(
                    "{} compressed bytes expand further: {l}",
                    self.bytes_in
                ))
            })?;
            if produced > 0 {
                let out = std::mem::take(&mut self.out);
                let r = self.consume(&out[..produced], &mut f);
                self.out = out;
                r?;
            }
            if input.pos() >= payload.len() && produced < OUT_STEP {
                return Ok(());
            }
            if produced == 0 && input.pos() == before {
                return Err(InnerError::Zstd("zstd made no progress".into()));
            }
        }
    }

    fn consume(
        &mut self,
        mut data: &[u8],
        f: &mut impl FnMut(RecordHeader, &[u8]) -> Result<(), InnerError>,
    ) -> Result<(), InnerError> {
        if self.skip > 0 {
            let n = (self.skip.min(data.len() as u64)) as usize;
            self.skip -= n as u64;
            data = &data[n..];
        }
        if !self.carry.is_empty() {
            // Complete the straddling record first.
            let need = if self.carry.len() < 8 {
                8 - self.carry.len()
            } else {
                0
            };
            let take = need.min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() < 8 {
                return Ok(());
            }
            let size = RecordHeader::parse(&self.carry, self.e)
                .ok_or(InnerError::BadRecord("header"))?
                .size as usize;
            let more = size.saturating_sub(self.carry.len());
            let take = more.min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            let Some(fr) = frame(&self.carry, self.e, 0).map_err(bad_frame)? else {
                return Ok(());
            };
            let rec = std::mem::take(&mut self.carry);
            self.skip = fr.oob;
            f(fr.header, &rec)?;
            if self.skip > 0 {
                let n = (self.skip.min(data.len() as u64)) as usize;
                self.skip -= n as u64;
                data = &data[n..];
            }
        }
        while !data.is_empty() {
            if self.skip > 0 {
                let n = (self.skip.min(data.len() as u64)) as usize;
                self.skip -= n as u64;
                data = &data[n..];
                continue;
            }
            // The one framing primitive and its size policy, as for outer records.
            let Some(fr) = frame(data, self.e, 0).map_err(bad_frame)? else {
                self.carry.extend_from_slice(data);
                return Ok(());
            };
            let rec = &data[..fr.size()];
            self.skip = fr.oob;
            f(fr.header, rec)?;
            data = &data[fr.size()..];
        }
        Ok(())
    }
}
