//! Reading build IDs from ELF files and raw note streams: what the proof, the
//! vouchers and the stores read of a file, in a module below all of them (named
//! from outside by its old path, `buildid::elf`).

use super::proof::{Reason, Refusal};
use crate::format::buildid::BuildId;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The GNU build ID of an ELF image in memory (a vdso, a download, a decompressed
/// module), by the same rules as [`read_build_id`].
pub(crate) fn build_id_of_image(data: &[u8]) -> Result<BuildId, Refusal> {
    id_of(&parse(data)?)
}

/// The headers of the ELF file in `data`, or why it is not one.
pub(super) fn parse<'d, R: object::ReadRef<'d>>(data: R) -> Result<Elf<'d, R>, Refusal> {
    Elf::parse(data).map_err(|e| (Reason::Unsupported, format!("not a readable ELF file: {e}")))
}

/// What pdinject reads of an ELF file: its file header, program headers and section
/// headers, and the notes and sections asked for. object's `File::parse` also reads
/// `.symtab` and `.dynsym` whole, which pdinject never uses: for the DSOs of a DWARF
/// recording, parsed twice each (proof, unwind sections), that was two thirds of the
/// bytes read and a tenth of an in-place run's CPU (copies and fresh pages).
pub(crate) enum Elf<'d, R: object::ReadRef<'d>> {
    /// ELFCLASS32.
    E32(Headers<'d, object::elf::FileHeader32<object::Endianness>, R>),
    /// ELFCLASS64.
    E64(Headers<'d, object::elf::FileHeader64<object::Endianness>, R>),
}

/// The headers of one ELF class (see [`Elf`]).
pub(crate) struct Headers<'d, E: object::read::elf::FileHeader, R: object::ReadRef<'d>> {
    data: R,
    endian: E::Endian,
    segments: &'d [E::ProgramHeader],
    sections: object::read::elf::SectionTable<'d, E, R>,
}

/// Where a section is: its address range and where its bytes are.
pub(crate) struct SectionPlace {
    /// `sh_addr`.
    pub address: u64,
    /// `sh_size`.
    pub size: u64,
    /// File offset of its `size` bytes; `None` for a section without bytes in the file
    /// (SHT_NOBITS).
    pub offset: Option<u64>,
    /// SHF_COMPRESSED: its bytes are compressed (pdinject does not decompress them).
    pub compressed: bool,
}

/// A PT_LOAD segment: where its bytes are in the file and where they go in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Segment {
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_memsz`.
    pub memsz: u64,
    /// `PF_X`: a loader maps it executable.
    pub exec: bool,
}

impl<'d, E, R> Headers<'d, E, R>
where
    E: object::read::elf::FileHeader<Endian = object::Endianness>,
    R: object::ReadRef<'d>,
{
    fn parse(data: R) -> object::read::Result<Self> {
        let header = E::parse(data)?;
        let endian = header.endian()?;
        Ok(Headers {
            data,
            endian,
            segments: header.program_headers(endian, data)?,
            sections: header.sections(endian, data)?,
        })
    }

    fn load_segments(&self) -> Vec<(u64, u64)> {
        use object::read::elf::ProgramHeader;
        self.segments
            .iter()
            .filter(|p| p.p_type(self.endian) == object::elf::PT_LOAD)
            .map(|p| {
                (
                    p.p_offset(self.endian).into(),
                    p.p_vaddr(self.endian).into(),
                )
            })
            .collect()
    }

    fn loads(&self) -> Vec<Segment> {
        use object::read::elf::ProgramHeader;
        let e = self.endian;
        self.segments
            .iter()
            .filter(|p| p.p_type(e) == object::elf::PT_LOAD)
            .map(|p| Segment {
                offset: p.p_offset(e).into(),
                vaddr: p.p_vaddr(e).into(),
                filesz: p.p_filesz(e).into(),
                memsz: p.p_memsz(e).into(),
                exec: p.p_flags(e).contains(object::elf::PF_X),
            })
            .collect()
    }

    /// As object's `build_id`: the notes of the sections when there are section
    /// headers, else those of the segments.
    fn build_id(&self) -> object::read::Result<Option<&'d [u8]>> {
        use object::read::elf::{ProgramHeader, SectionHeader};
        let (e, data) = (self.endian, self.data);
        let is_id = |n: &object::read::elf::Note<'d, E>| {
            n.name() == object::elf::ELF_NOTE_GNU && n.n_type(e) == object::elf::NT_GNU_BUILD_ID
        };
        if !self.sections.is_empty() {
            for section in self.sections.iter() {
                if let Some(mut notes) = section.notes(e, data)? {
                    while let Some(note) = notes.next()? {
                        if is_id(&note) {
                            return Ok(Some(note.desc()));
                        }
                    }
                }
            }
        } else {
            for segment in self.segments {
                if let Some(mut notes) = segment.notes(e, data)? {
                    while let Some(note) = notes.next()? {
                        if is_id(&note) {
                            return Ok(Some(note.desc()));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    fn section(&self, name: &[u8]) -> Option<SectionPlace> {
        use object::read::elf::SectionHeader;
        let (_, s) = self.sections.section_by_name(self.endian, name)?;
        Some(SectionPlace {
            address: s.sh_addr(self.endian).into(),
            size: s.sh_size(self.endian).into(),
            offset: s.file_range(self.endian).map(|(o, _)| o),
            compressed: s
                .sh_flags(self.endian)
                .contains(object::elf::SHF_COMPRESSED),
        })
    }
}

impl<'d, R: object::ReadRef<'d>> Elf<'d, R> {
    /// The headers of the ELF file in `data`; an error (in words) for anything else.
    pub(crate) fn parse(data: R) -> Result<Self, String> {
        let r = match object::FileKind::parse(data).map_err(|e| e.to_string())? {
            object::FileKind::Elf32 => Headers::parse(data).map(Elf::E32),
            object::FileKind::Elf64 => Headers::parse(data).map(Elf::E64),
            _ => return Err("not an ELF file".into()),
        };
        r.map_err(|e| e.to_string())
    }

    /// Whether the file is little-endian.
    pub(crate) fn is_little_endian(&self) -> bool {
        match self {
            Elf::E32(h) => h.endian == object::Endianness::Little,
            Elf::E64(h) => h.endian == object::Endianness::Little,
        }
    }

    /// `(p_offset, p_vaddr)` of each PT_LOAD segment.
    pub(crate) fn load_segments(&self) -> Vec<(u64, u64)> {
        match self {
            Elf::E32(h) => h.load_segments(),
            Elf::E64(h) => h.load_segments(),
        }
    }

    /// Each PT_LOAD segment.
    pub(crate) fn loads(&self) -> Vec<Segment> {
        match self {
            Elf::E32(h) => h.loads(),
            Elf::E64(h) => h.loads(),
        }
    }

    /// The NT_GNU_BUILD_ID note's descriptor, if there is one.
    pub(crate) fn build_id(&self) -> Result<Option<&'d [u8]>, String> {
        match self {
            Elf::E32(h) => h.build_id(),
            Elf::E64(h) => h.build_id(),
        }
        .map_err(|e| e.to_string())
    }

    /// The section called `name`, if any.
    pub(crate) fn section(&self, name: &[u8]) -> Option<SectionPlace> {
        match self {
            Elf::E32(h) => h.section(name),
            Elf::E64(h) => h.section(name),
        }
    }
}

/// The build ID in a parsed ELF file's notes.
pub(super) fn id_of<'d, R: object::ReadRef<'d>>(elf: &Elf<'d, R>) -> Result<BuildId, Refusal> {
    match elf.build_id() {
        Ok(Some(raw)) => id_from_bytes(raw),
        Ok(None) => Err((Reason::NoNote, "the ELF file has no build-ID note".into())),
        Err(e) => Err((Reason::Unsupported, format!("cannot read the notes: {e}"))),
    }
}

/// Finds the NT_GNU_BUILD_ID note in a raw note stream (`/sys/kernel/notes`,
/// `/sys/module/*/notes/.note.gnu.build-id`), written in the host's byte order.
pub(crate) fn build_id_from_notes(data: &[u8]) -> Option<BuildId> {
    let mut off = 0usize;
    let rd = |o: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(data.get(o..o + 4)?.try_into().ok()?))
    };
    while off + 12 <= data.len() {
        let namesz = rd(off)? as usize;
        let descsz = rd(off + 4)? as usize;
        let kind = rd(off + 8)?;
        let name_at = off + 12;
        let desc_at = name_at.checked_add(namesz.next_multiple_of(4))?;
        let next = desc_at.checked_add(descsz.next_multiple_of(4))?;
        if next > data.len() {
            return None;
        }
        if kind == 3 && data.get(name_at..name_at + namesz)? == b"GNU\0" {
            return BuildId::new(&data[desc_at..desc_at + descsz], descsz.min(20))
                .filter(|_| descsz <= 20);
        }
        off = next;
    }
    None
}

fn id_from_bytes(raw: &[u8]) -> Result<BuildId, Refusal> {
    if raw.len() > 20 {
        return Err((
            Reason::Unsupported,
            format!(
                "build ID of {} bytes is longer than the 20 a perf.data table can hold",
                raw.len()
            ),
        ));
    }
    BuildId::new(raw, raw.len()).ok_or((Reason::NoNote, "the build-ID note is empty".into()))
}

/// Opens a regular file for reading without side effects. The path's type is checked
/// with stat() first, so a recording naming a device (`/dev/tty`), a FIFO or a socket
/// never gets it opened (opening a FIFO blocks, a tty may become our controlling
/// terminal); the open itself is non-blocking and never takes a terminal, and fstat()
/// after it proves the file opened is the one stat() saw.
pub(crate) fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), Refusal> {
    let io_refusal = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => (Reason::Missing, "no file at this path".to_string()),
        _ => (Reason::Unreadable, e.to_string()),
    };
    let before = std::fs::metadata(path).map_err(io_refusal)?;
    if !before.is_file() {
        return Err((Reason::NotRegular, "not a regular file".into()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io_refusal)?;
    let meta = file
        .metadata()
        .map_err(|e| (Reason::Unreadable, e.to_string()))?;
    if !meta.is_file() {
        return Err((Reason::NotRegular, "not a regular file".into()));
    }
    if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err((
            Reason::Stale,
            "the file at this path was replaced while it was being opened".into(),
        ));
    }
    Ok((file, meta))
}

/// Bytes of an ELF file read at once for [`reader`]. What is read through blocks is
/// headers at the two ends of the file (file and program headers, notes, section
/// headers and names): 16 KB holds each end, where 64 KB blocks read four times the
/// bytes for the same number of reads (dwarf-med in place: 12.4 MB -> 7.4 MB read).
const BLOCK: u64 = 16 << 10;

/// An ELF file as `object` reads it: in aligned blocks, by `pread`. object asks for
/// many small ranges (the header, each program and section header, each section
/// name); from a plain `File` each became a seek and a read, some 50 system calls
/// per file and a tenth of a DWARF recording's whole run. Each block is read once;
/// a range larger than a few blocks (a whole section) is read directly.
pub(crate) struct Blocks<'f> {
    file: &'f File,
    len: u64,
    pos: u64,
    blocks: Vec<(u64, Vec<u8>)>,
}

/// Blocks a [`Blocks`] keeps (the header's, the section headers', the names', the
/// notes'): ELF metadata is at the two ends of the file.
const MAX_BLOCKS: usize = 16;

impl<'f> Blocks<'f> {
    fn new(file: &'f File) -> Self {
        Blocks {
            file,
            len: file.metadata().map_or(0, |m| m.len()),
            pos: 0,
            blocks: Vec::new(),
        }
    }

    fn block(&mut self, n: u64) -> Result<&[u8], ()> {
        if let Some(i) = self.blocks.iter().position(|(b, _)| *b == n) {
            return Ok(&self.blocks[i].1);
        }
        let at = n.checked_mul(BLOCK).ok_or(())?;
        let want = BLOCK.min(self.len.saturating_sub(at)) as usize;
        let buf = pread_new(self.file, at, want).ok_or(())?;
        if self.blocks.len() >= MAX_BLOCKS {
            self.blocks.remove(0);
        }
        self.blocks.push((n, buf));
        Ok(&self.blocks[self.blocks.len() - 1].1)
    }
}

/// `len` bytes of `file` at `offset` in a new buffer, which is not zeroed first (a
/// block is read for a few hundred bytes of headers, and an unwind section of
/// megabytes is read whole: zeroing first cost more than either needs).
pub(crate) fn pread_new(file: &File, offset: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        let at = libc::off_t::try_from(offset.checked_add(done as u64)?).ok()?;
        // SAFETY: pread writes at most `len - done` bytes into the spare capacity
        // after the `done` bytes already read, and the length grows by what it wrote.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(done).cast(),
                len - done,
                at,
            )
        };
        match n {
            n if n > 0 => unsafe { buf.set_len(done + n as usize) },
            0 => return None,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return None,
        }
    }
    Some(buf)
}

impl object::read::ReadCacheOps for Blocks<'_> {
    fn len(&mut self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn seek(&mut self, pos: u64) -> Result<u64, ()> {
        self.pos = pos;
        Ok(pos)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, ()> {
        let n = (buf.len() as u64).min(self.len.saturating_sub(self.pos)) as usize;
        self.read_exact(&mut buf[..n])?;
        Ok(n)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ()> {
        use std::os::unix::fs::FileExt;
        let end = self.pos.checked_add(buf.len() as u64).ok_or(())?;
        if end > self.len {
            return Err(());
        }
        if buf.len() as u64 > 4 * BLOCK {
            self.file.read_exact_at(buf, self.pos).map_err(|_| ())?;
            self.pos = end;
            return Ok(());
        }
        let mut done = 0usize;
        while done < buf.len() {
            let at = self.pos + done as u64;
            let (n, off) = (at / BLOCK, (at % BLOCK) as usize);
            let b = self.block(n)?;
            let take = (buf.len() - done).min(b.len().saturating_sub(off));
            if take == 0 {
                return Err(());
            }
            buf[done..done + take].copy_from_slice(&b[off..off + take]);
            done += take;
        }
        self.pos = end;
        Ok(())
    }
}

/// `file` for [`Elf::parse`] (see [`Blocks`]).
pub(crate) fn reader(file: &File) -> object::read::ReadCache<Blocks<'_>> {
    object::read::ReadCache::new(Blocks::new(file))
}

/// The build ID in the notes of an open ELF file.
pub(crate) fn read_build_id(file: &File) -> Result<BuildId, Refusal> {
    let cache = reader(file);
    id_of(&parse(&cache)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened() {
        let d = std::env::temp_dir().join(format!("pdinject-elf-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for p in [Path::new("/dev/tty"), Path::new("/dev/null"), &fifo, &d] {
            let r = open_regular(p).map(|_| ()).map_err(|e| e.0);
            assert_eq!(r, Err(Reason::NotRegular), "{}", p.display());
        }
        let r = open_regular(&d.join("none")).map(|_| ()).map_err(|e| e.0);
        assert_eq!(r, Err(Reason::Missing));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn note_stream() {
        let mut n = Vec::new();
        // A non-GNU note first, then the build ID.
        for (name, kind, desc) in [
            (&b"Linux\0"[..], 6u32, &[1u8, 2, 3, 4][..]),
            (&b"GNU\0"[..], 3, &[0xab; 20][..]),
        ] {
            n.extend_from_slice(&(name.len() as u32).to_ne_bytes());
            n.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
            n.extend_from_slice(&kind.to_ne_bytes());
            n.extend_from_slice(name);
            n.resize(n.len().next_multiple_of(4), 0);
            n.extend_from_slice(desc);
            n.resize(n.len().next_multiple_of(4), 0);
        }
        assert_eq!(
            build_id_from_notes(&n).unwrap().to_string(),
            "ab".repeat(20)
        );
        assert!(build_id_from_notes(&n[..20]).is_none());
    }
}
