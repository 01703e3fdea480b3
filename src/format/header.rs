//! `struct perf_file_header` (perf-format.md §1.2) and the feature bitmap.

use super::Endian;
use crate::error::{Error, Result};

/// Size of the modern file header.
pub(crate) const FILE_HEADER_SIZE: u64 = 104;
/// Header size of files written before the feature bitmap existed.
pub(crate) const OLD_FILE_HEADER_SIZE: u64 = 72;
/// Header size that marks the pipe format.
pub(crate) const PIPE_HEADER_SIZE: u64 = 16;

/// `{offset, size}` of a region of the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Section {
    /// Byte offset from the start of the file.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

impl Section {
    /// One past the last byte, `None` on overflow.
    pub(crate) fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.size)
    }
}

/// How the 256-bit feature bitmap is stored; needed to write it back the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BitmapWords {
    /// Four u64 words (every little-endian writer and 64-bit big-endian ones).
    U64,
    /// Eight u32 words (32-bit big-endian writers; perf's fallback in `perf_file_header__read`).
    U32,
}

/// The parsed file header.
#[derive(Clone, Debug)]
pub(crate) struct FileHeader {
    /// Byte order of every scalar in the file.
    pub endian: Endian,
    /// The `size` field: 104, or 72 for files without a feature bitmap.
    pub header_size: u64,
    /// Size of one entry of the attrs section (perf_event_attr + ids section).
    pub attr_size: u64,
    /// The attrs section.
    pub attrs: Section,
    /// The data section (record stream). Repaired to run to the end of the file when
    /// the recorder was killed and left `size == 0`, as perf itself does.
    pub data: Section,
    /// True when `data.size` was 0 on disk and has been repaired.
    pub data_size_repaired: bool,
    /// Feature bits, normalized to bit n = bit n%64 of word n/64.
    pub features: [u64; 4],
    /// How the bitmap is stored on disk.
    pub bitmap_words: BitmapWords,
}

/// Feature bit of the build-ID table.
pub(crate) const FEAT_BUILD_ID: u32 = 2;
/// Feature bit of the recording host's name.
pub(crate) const FEAT_HOSTNAME: u32 = 3;
/// Feature bit of the recording host's kernel release.
pub(crate) const FEAT_OSRELEASE: u32 = 4;
/// Feature bit of perf's version string.
pub(crate) const FEAT_VERSION: u32 = 5;
/// Feature bit of the CPU architecture string.
pub(crate) const FEAT_ARCH: u32 = 6;
/// Feature bit of the CPU description string.
pub(crate) const FEAT_CPUDESC: u32 = 8;
/// Feature bit of the CPU identification string.
pub(crate) const FEAT_CPUID: u32 = 9;
/// Feature bit of perf's command line (`u32 nr`, then `nr` strings).
pub(crate) const FEAT_CMDLINE: u32 = 11;
/// Feature bit of the directory format marker.
pub(crate) const FEAT_DIR_FORMAT: u32 = 24;
/// Feature bit of the clock conversion data.
pub(crate) const FEAT_CLOCK_DATA: u32 = 29;

impl FileHeader {
    /// Parses the header from the first bytes of a file of length `file_len`.
    pub(crate) fn parse(buf: &[u8], file_len: u64) -> Result<Self> {
        let endian = magic_order(buf)?;
        let e = endian;
        let rd = |off: usize| {
            e.u64(buf, off)
                .ok_or_else(|| Error::format(off as u64, "file header is truncated"))
        };
        let header_size = rd(8)?;
        if header_size == PIPE_HEADER_SIZE {
            return Err(Error::format(
                8,
                "pipe-format data (perf record -o -) where a file-format header is expected",
            ));
        }
        if header_size != FILE_HEADER_SIZE && header_size != OLD_FILE_HEADER_SIZE {
            return Err(Error::format(
                8,
                format!("unexpected file header size {header_size} (expected 104 or 72)"),
            ));
        }
        let attr_size = rd(16)?;
        let attrs = Section {
            offset: rd(24)?,
            size: rd(32)?,
        };
        let mut data = Section {
            offset: rd(40)?,
            size: rd(48)?,
        };
        let (features, bitmap_words) = if header_size == FILE_HEADER_SIZE {
            read_bitmap(buf, e)?
        } else {
            ([0; 4], BitmapWords::U64)
        };
        if !(16 + 64..=4096).contains(&attr_size) {
            return Err(Error::format(
                16,
                format!("attr entry size {attr_size} is outside 80..=4096"),
            ));
        }
        let mut data_size_repaired = false;
        if data.size == 0 && data.offset >= header_size && data.offset <= file_len {
            // perf: "The file's data size field is 0 which is unexpected. Was the
            // 'perf record' command properly terminated?" — it reads to the end.
            data.size = file_len - data.offset;
            data_size_repaired = data.size != 0;
        }
        check_sections(&attrs, &data, header_size, attr_size, file_len)?;
        Ok(FileHeader {
            endian,
            header_size,
            attr_size,
            attrs,
            data,
            data_size_repaired,
            features,
            bitmap_words,
        })
    }

    /// Whether feature bit `bit` is set.
    pub(crate) fn has_feature(&self, bit: u32) -> bool {
        bit < 256 && self.features[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    /// The set feature bits in ascending order (the order of the feature table).
    pub(crate) fn feature_bits(&self) -> impl Iterator<Item = u32> + '_ {
        (0..256u32).filter(|&b| self.has_feature(b))
    }

    /// Where the feature table starts: right after the data section (perf's rule).
    pub(crate) fn feature_table_offset(&self) -> u64 {
        self.data.offset + self.data.size
    }

    /// Encodes a feature bitmap in this file's byte order and word layout.
    pub(crate) fn encode_bitmap(&self, features: &[u64; 4]) -> [u8; 32] {
        let mut out = [0u8; 32];
        match self.bitmap_words {
            BitmapWords::U64 => {
                for (i, w) in features.iter().enumerate() {
                    out[i * 8..i * 8 + 8].copy_from_slice(&self.endian.put_u64(*w));
                }
            }
            BitmapWords::U32 => {
                for i in 0..8 {
                    let w = (features[i / 2] >> ((i % 2) * 32)) as u32;
                    out[i * 4..i * 4 + 4].copy_from_slice(&self.endian.put_u32(w));
                }
            }
        }
        out
    }
}

/// The byte order the magic at the start of `buf` says.
fn magic_order(buf: &[u8]) -> Result<Endian> {
    let magic = buf
        .get(0..8)
        .ok_or_else(|| Error::format(0, "file is shorter than a perf.data magic"))?;
    match magic {
        b"PERFILE2" => Ok(Endian::Little),
        b"2ELIFREP" => Ok(Endian::Big),
        b"PERFFILE" => Err(Error::unsupported(
            "legacy perf.data version 1 (magic PERFFILE) is not supported",
        )),
        _ => Err(Error::format(0, "not a perf.data file (bad magic)")),
    }
}

/// The attrs and data sections (the data's size repaired) checked against the file's
/// length, the header and each other.
fn check_sections(
    attrs: &Section,
    data: &Section,
    header_size: u64,
    attr_size: u64,
    file_len: u64,
) -> Result<()> {
    let check = |s: &Section, name: &str, off: u64| -> Result<()> {
        match s.end() {
            Some(end) if end <= file_len => Ok(()),
            _ => Err(Error::format(
                off,
                format!(
                    "{name} section [{:#x}, +{:#x}) extends past the end of the file ({file_len:#x} bytes)",
                    s.offset, s.size
                ),
            )),
        }
    };
    check(attrs, "attrs", 24)?;
    check(data, "data", 40)?;
    if data.offset < header_size || (attrs.size != 0 && attrs.offset < header_size) {
        return Err(Error::format(8, "sections overlap the file header"));
    }
    if !attrs.size.is_multiple_of(attr_size) {
        return Err(Error::format(
            32,
            format!(
                "attrs section size {} is not a multiple of the attr entry size {attr_size}",
                attrs.size
            ),
        ));
    }
    let (a0, a1, d0, d1) = (
        attrs.offset,
        attrs.offset + attrs.size,
        data.offset,
        data.offset + data.size,
    );
    if attrs.size != 0 && data.size != 0 && a0 < d1 && d0 < a1 {
        return Err(Error::format(24, "attrs and data sections overlap"));
    }
    Ok(())
}

fn read_bitmap(buf: &[u8], e: Endian) -> Result<([u64; 4], BitmapWords)> {
    let bytes = buf
        .get(72..104)
        .ok_or_else(|| Error::format(72, "file header is truncated (feature bitmap)"))?;
    let mut w64 = [0u64; 4];
    for (i, w) in w64.iter_mut().enumerate() {
        *w = e.u64(bytes, i * 8).unwrap_or(0);
    }
    if e == Endian::Little || w64[0] & (1 << FEAT_HOSTNAME) != 0 {
        return Ok((w64, BitmapWords::U64));
    }
    // A 32-bit big-endian writer stored the bitmap as unsigned longs of 32 bits.
    let mut w32 = [0u64; 4];
    for i in 0..8 {
        let w = e.u32(bytes, i * 4).unwrap_or(0) as u64;
        w32[i / 2] |= w << ((i % 2) * 32);
    }
    if w32[0] & (1 << FEAT_HOSTNAME) != 0 {
        Ok((w32, BitmapWords::U32))
    } else {
        Ok((w64, BitmapWords::U64))
    }
}

/// The byte order of a pipe header (`struct perf_pipe_file_header`), or None when
/// `head` is not one: perf decides by the header's size field being 16.
pub(crate) fn pipe_header(head: &[u8]) -> Option<Endian> {
    let e = match head.get(..8)? {
        b"PERFILE2" => Endian::Little,
        b"2ELIFREP" => Endian::Big,
        _ => return None,
    };
    (e.u64(head, 8)? == PIPE_HEADER_SIZE).then_some(e)
}

/// A pipe header in byte order `e`.
pub(crate) fn encode_pipe_header(e: Endian) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..8].copy_from_slice(match e {
        Endian::Little => b"PERFILE2",
        Endian::Big => b"2ELIFREP",
    });
    h[8..].copy_from_slice(&e.put_u64(PIPE_HEADER_SIZE));
    h
}

/// Whether two regions may be the very same bytes (exact aliases of one section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Aliases {
    /// Feature sections: exact aliases are read once and written once.
    Allowed,
    /// Ids sections: every region owns its bytes.
    Refused,
}

/// A region of the file that must not share bytes with another: `(what, section,
/// offset of the field that points at it)`.
pub(crate) type Region = (String, Section, u64);

/// The section overlap rule: the regions given (ids sections of the attrs, feature
/// sections) must not share a byte. Identical aliases are allowed with
/// [`Aliases::Allowed`] (they are read and written once). perf never writes overlapping sections; without
/// this rule 1,500 attrs whose ids all cover the whole file make 1,500 copies of it.
pub(crate) fn check_disjoint(mut regions: Vec<Region>, aliases: Aliases) -> Result<()> {
    // Empty sections own no bytes.
    regions.retain(|(_, s, _)| s.size > 0);
    regions.sort_by_key(|(_, s, _)| (s.offset, s.size));
    // Furthest end so far and who reached it.
    let mut reach: Option<(u64, usize)> = None;
    for i in 0..regions.len() {
        let (_, s, _) = &regions[i];
        if let Some((end, j)) = reach {
            let prev = &regions[j].1;
            let alias = aliases == Aliases::Allowed && prev == s;
            if s.offset < end && !alias {
                let (what, _, at) = &regions[i];
                return Err(Error::format(
                    *at,
                    format!(
                        "{what} [{:#x}, +{:#x}) overlaps {} [{:#x}, +{:#x}): sections must not share bytes (see \"Limits\" in docs/guarantees.md)",
                        s.offset, s.size, regions[j].0, prev.offset, prev.size
                    ),
                ));
            }
        }
        let end = s.offset.saturating_add(s.size);
        if reach.is_none_or(|(e, _)| end > e) {
            reach = Some((end, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod disjoint_tests {
    use super::*;

    fn r(name: &str, offset: u64, size: u64) -> Region {
        (name.to_string(), Section { offset, size }, 0)
    }

    #[test]
    fn disjoint_rules() {
        assert!(check_disjoint(vec![r("a", 0, 8), r("b", 8, 8)], Aliases::Refused).is_ok());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 8, 8)], Aliases::Refused).is_err());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 16)], Aliases::Refused).is_err());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 16)], Aliases::Allowed).is_ok());
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 0, 8)], Aliases::Allowed).is_err());
        // Empty sections own no bytes.
        assert!(check_disjoint(vec![r("a", 0, 16), r("b", 4, 0)], Aliases::Refused).is_ok());
    }
}
