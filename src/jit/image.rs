//! The ELF images `--jit` writes: one per process holding the code loads that
//! mapping records map, each at its own offset (a record maps its own slice of the
//! one file: perf resolves a sample by file offset = ip - start + pgoff, then the
//! symbol at that offset, since `.text`'s address equals its offset; docs/jit.md),
//! or, where perf's DWARF unwinder needs it, one per load in perf's own layout.
//!
//! Layout (object's ELF writer): the ELF header, a PT_LOAD over `.text` (and a PT_NOTE
//! over the build-ID note in a shared image), `.text` at [`TEXT_OFFSET`] (a single
//! load's at perf's GEN_ELF_TEXT_OFFSET, [`SINGLE_TEXT_OFFSET`], its unwinding tables
//! behind the code as `.eh_frame` and `.eh_frame_hdr`); each load 16-byte aligned,
//! its code, zeros to 8 bytes and the tables the JIT maps behind it, so a record's
//! length is perf's. Then `.symtab` (one global function per load), `.strtab`, the
//! build-ID note, `.comment` naming the image and, where the dump has DEBUG_INFO,
//! `.debug_line` (one sequence per load, ended at its last row as perf's
//! genelf_debug ends it; files in the header's table), `.debug_abbrev` and
//! `.debug_info` (one unit naming the line program and nothing else: a unit with an
//! address range made perf 6.12 and 7.3 give lines outside a load's rows).
//!
//! An image is built in memory (it holds what samples touch, 1.6 MB for a node
//! workload of 55,000 loads; with `--jit-maps all`, every load's code), and its build
//! ID is the SHA-1 of its bytes with the ID zeroed: the same loads give the same bytes
//! and the same ID, and two processes' images differ by their names in `.comment`.

use crate::format::buildid::BuildId;
use object::elf;
use object::write::elf::{FileHeader, ProgramHeader, SectionHeader, Sym, Writer};
use sha1::Digest;
use std::path::Path;

/// Where `.text` starts in a shared image (after the ELF header and two program
/// headers, 64-byte aligned).
pub(crate) const TEXT_OFFSET: u64 = 0xc0;
/// Where it starts in a single-load image: perf's GEN_ELF_TEXT_OFFSET. perf 7.3's
/// DWARF unwinder (libdw) lost the frames of JIT code in single-load images with the
/// shared layout; with perf's own it unwinds them as through perf's images.
pub(crate) const SINGLE_TEXT_OFFSET: u64 = 0x80;
/// Alignment of each load in `.text`.
const LOAD_ALIGN: u64 = 16;
/// Bytes of symbol names and line programs an image holds (their offsets are 32-bit):
/// past it a load keeps its code but loses its name or lines, with a note.
const MAX_TABLE: u64 = u32::MAX as u64 - (1 << 20);

#[cfg(target_arch = "aarch64")]
const EM_HOST: u16 = 183;
#[cfg(target_arch = "x86")]
const EM_HOST: u16 = 3;
#[cfg(not(any(target_arch = "aarch64", target_arch = "x86")))]
const EM_HOST: u16 = 62;

/// Where one load went in the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// File offset (and address) of the code: the MMAP2's pgoff.
    pub offset: u64,
    /// Bytes perf maps for it: the code, or the code to 8 bytes and the unwinding
    /// tables the JIT maps behind it (perf's `ALIGN_8(csize) + mapped_size`).
    pub len: u64,
}

/// Where an image puts each load, without writing it: the rule [`Image::add`] places
/// loads by. A dump's loads are placed on a shelf of every load when it is read (the
/// model maps them there); the image written after the choice holds only the loads
/// kept, and the records are given their offsets in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shelf {
    end: u64,
}

impl Default for Shelf {
    fn default() -> Self {
        Shelf { end: TEXT_OFFSET }
    }
}

impl Shelf {
    /// The place of a load of `csize` bytes of code with `mapped` bytes of tables
    /// mapped behind it (0: none).
    pub(crate) fn place(&mut self, csize: u64, mapped: u64) -> Placed {
        let offset = self.end.next_multiple_of(LOAD_ALIGN);
        let len = if mapped > 0 {
            csize.next_multiple_of(8) + mapped
        } else {
            csize
        };
        self.end = offset + len;
        Placed { offset, len }
    }
}

/// Unwinding tables of a load, as the jitdump gives them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tables<'a> {
    /// `.eh_frame` then `.eh_frame_hdr`.
    pub data: &'a [u8],
    /// Size of `.eh_frame_hdr` (the tail of `data`).
    pub hdr_size: u64,
    /// Bytes the JIT maps behind the code (0: none).
    pub mapped: u64,
}

impl Tables<'_> {
    /// Bytes mapped behind the code that the image holds: what the JIT says it maps,
    /// at most the tables it gave (a dump claiming more would have the image written
    /// with zeros without end; V8 maps exactly its tables).
    pub(crate) fn mapped(&self) -> u64 {
        self.mapped.min(self.data.len() as u64)
    }
}

/// What an image holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Loads of a dump, each at its own offset.
    Shared,
    /// One load with its unwinding tables as sections (`.eh_frame`, `.eh_frame_hdr`
    /// behind the code), perf's own layout: perf's DWARF unwinder finds a DSO's
    /// `.eh_frame_hdr` once per DSO and reads its table through the sample's map,
    /// so only an image of one load can carry a load's tables.
    Single,
}

/// A load's source lines as the dump gives them: the entries of the DEBUG_INFO
/// record before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DebugLines<'a> {
    /// The entries.
    pub raw: &'a [u8],
    /// How many the record says there are.
    pub count: u64,
    /// Written in the other byte order.
    pub swapped: bool,
    /// The load's address (entries give absolute addresses).
    pub code_addr: u64,
}

/// One load for [`Image::add`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Load<'a> {
    /// Its symbol's name.
    pub name: &'a [u8],
    /// Its code.
    pub code: &'a [u8],
    /// The unwinding tables the JIT wrote before it.
    pub tables: Option<Tables<'a>>,
    /// The source lines the JIT wrote before it.
    pub lines: Option<DebugLines<'a>>,
}

/// An image being built.
pub(crate) struct Image {
    kind: Kind,
    /// `.text` from its start.
    text: Vec<u8>,
    /// End of the last load's code (a single image's `.text` ends there).
    code_end: u64,
    /// Each load's symbol: name range in `names`, value, size.
    syms: Vec<(u32, u32, u64, u64)>,
    names: Vec<u8>,
    lines: Lines,
    /// `.eh_frame` and `.eh_frame_hdr` of a single image: offset and size, in `.text`
    /// behind the code (perf reads them through the load's map).
    eh: Option<[(u64, u64); 2]>,
    /// Loads whose name or lines no longer fit the 32-bit tables.
    dropped: u64,
    /// Loads whose DEBUG_INFO record does not read as it says ([`Lines::add`]).
    malformed: u64,
}

/// A finished image.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    /// Its build ID.
    pub id: BuildId,
    /// Loads whose name or lines no longer fit the 32-bit tables.
    pub dropped_tables: u64,
    /// Loads left without lines because their DEBUG_INFO record does not read as it
    /// says (its entries do not end where it ends: V8's freed script names).
    pub malformed_lines: u64,
}

impl Image {
    /// An empty image.
    pub(crate) fn new(kind: Kind) -> Self {
        Image {
            kind,
            text: Vec::new(),
            code_end: 0,
            syms: Vec::new(),
            names: Vec::new(),
            lines: Lines::default(),
            eh: None,
            dropped: 0,
            malformed: 0,
        }
    }

    fn text_at(&self) -> u64 {
        match self.kind {
            Kind::Shared => TEXT_OFFSET,
            Kind::Single => SINGLE_TEXT_OFFSET,
        }
    }

    /// Adds a load where the shelf's rule puts it; returns where.
    pub(crate) fn add(&mut self, l: Load<'_>) -> Placed {
        let text_at = self.text_at();
        let mapped = l.tables.map_or(0, |t| t.mapped());
        let placed = Shelf {
            end: text_at + self.text.len() as u64,
        }
        .place(l.code.len() as u64, mapped);
        self.text.resize((placed.offset - text_at) as usize, 0);
        self.text.extend_from_slice(l.code);
        self.code_end = placed.offset + l.code.len() as u64;
        let single = self.kind == Kind::Single;
        if let Some(t) = l.tables.filter(|_| mapped > 0 || single) {
            let aligned = placed.offset - text_at + (l.code.len() as u64).next_multiple_of(8);
            self.text.resize(aligned as usize, 0);
            // A shared image keeps what the JIT maps behind the code (the bytes a
            // record covers); a single one the whole tables, as sections there.
            let take = if single {
                t.data.len()
            } else {
                mapped as usize
            };
            let eh_at = text_at + self.text.len() as u64;
            self.text.extend_from_slice(&t.data[..take]);
            if single {
                let hdr = t.hdr_size.min(take as u64);
                let eh_size = take as u64 - hdr;
                self.eh = Some([(eh_at, eh_size), (eh_at + eh_size, hdr)]);
            }
        }
        let name = if l.name.is_empty() { b"[jit]" } else { l.name };
        let fits = (self.names.len() + name.len()) as u64 + self.lines.len() < MAX_TABLE;
        let at = self.names.len() as u32;
        if fits {
            self.names.extend_from_slice(name);
        } else {
            self.dropped += 1;
        }
        let len = if fits { name.len() as u32 } else { 0 };
        self.syms
            .push((at, len, placed.offset, l.code.len() as u64));
        if let Some(lines) = l.lines {
            if (self.names.len() as u64) + self.lines.len() < MAX_TABLE {
                if !self.lines.add(placed.offset, l.code.len() as u64, lines) {
                    self.malformed += 1;
                }
            } else {
                self.dropped += 1;
            }
        }
        placed
    }

    /// Writes the image to `path` (a temp name beside it, renamed over it).
    pub(crate) fn write(self, path: &Path) -> crate::error::Result<Done> {
        let bytes = self
            .bytes(path)
            .map_err(|e| crate::error::Error::Internal(format!("a JIT image: {e}")))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        // 0644 less the umask, as perf's images (genelf) and this room before the
        // temp name: perf run by another user reads them (tempfile's own is 0600).
        let mut tmp = tempfile::Builder::new()
            .prefix(".pdinject-jit-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(dir.unwrap_or(Path::new(".")))
            .map_err(|e| crate::error::Error::io(path, e))?;
        // Removed on a signal too, as every temporary is (src/signals.rs).
        let slot = crate::signals::watch(tmp.path(), false);
        let r = std::io::Write::write_all(&mut tmp, &bytes.0)
            .map_err(|e| crate::error::Error::io(path, e))
            // An image already at the path (a rerun, an older process with this pid)
            // is replaced: if it was needed, it is in the build-ID cache.
            .and_then(|()| {
                tmp.persist(path)
                    .map(drop)
                    .map_err(|e| crate::error::Error::io(path, e.error))
            });
        if let Some(s) = slot {
            crate::signals::unwatch(s);
        }
        r?;
        Ok(Done {
            id: bytes.1,
            dropped_tables: self.dropped,
            malformed_lines: self.malformed,
        })
    }

    /// The image's bytes and build ID; its name goes into `.comment`.
    fn bytes(&self, path: &Path) -> Result<(Vec<u8>, BuildId), String> {
        let mut comment = b"pdinject --jit: ".to_vec();
        comment.extend_from_slice(
            path.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        comment.push(0);
        let debug = self.lines.sections();
        let mut buf = Vec::new();
        let mut w = Writer::new(object::Endianness::Little, true, &mut buf);
        let layout = self.reserve(&mut w, &comment, debug.as_ref())?;
        self.write_all(&mut w, &layout, &comment, debug.as_ref())
            .map_err(|e| e.to_string())?;
        // The ID: the SHA-1 of the image with its ID zeroed (as written), laid in.
        let id: [u8; 20] = sha1::Sha1::digest(&buf).into();
        let at = layout.note as usize + 16;
        buf[at..at + 20].copy_from_slice(&id);
        let id = BuildId::new(&id, 20).ok_or("a 20-byte build ID")?;
        Ok((buf, id))
    }
}

/// Where the writer put things (the first phase's answers, for the second).
struct Laid {
    text: u64,
    note: u64,
    comment: u64,
    debug: Option<[u64; 3]>,
    sections: Sections,
    /// Each symbol's name in the string table.
    name_ids: Vec<Option<object::write::StringId>>,
}

/// The section indexes and names.
struct Sections {
    text: object::write::StringId,
    note: object::write::StringId,
    comment: object::write::StringId,
    eh: Option<[object::write::StringId; 2]>,
    debug: Option<[object::write::StringId; 3]>,
    text_index: u32,
}

/// Names of the debug sections, in the order they are written.
const DEBUG_NAMES: [&[u8]; 3] = [b".debug_line", b".debug_abbrev", b".debug_info"];

/// `.debug_abbrev`: one compile unit with a DW_AT_stmt_list (data4), no children.
const ABBREV: [u8; 8] = [1, 0x11, 0, 0x10, 0x06, 0, 0, 0];
/// `.debug_info`: a DWARF 2 unit of that abbreviation, its line program at 0.
const INFO: [u8; 16] = [12, 0, 0, 0, 2, 0, 0, 0, 0, 0, 8, 1, 0, 0, 0, 0];

impl Image {
    fn reserve<'a>(
        &'a self,
        w: &mut Writer<'a>,
        comment: &[u8],
        debug: Option<&Vec<u8>>,
    ) -> Result<Laid, String> {
        let phnum = match self.kind {
            Kind::Shared => 2,
            Kind::Single => 1,
        };
        w.reserve_file_header();
        w.reserve_program_headers(phnum);
        w.reserve_until(self.text_at());
        let text = w.reserve(self.text.len() as u64, 1);
        let _ = w.reserve_null_section_index();
        let text_index = w.reserve_section_index().0;
        let names = Sections {
            text: w.add_section_name(b".text"),
            eh: self.eh.map(|_| {
                let a = w.add_section_name(b".eh_frame");
                let b = w.add_section_name(b".eh_frame_hdr");
                let _ = (w.reserve_section_index(), w.reserve_section_index());
                [a, b]
            }),
            note: w.add_section_name(b".note.gnu.build-id"),
            comment: w.add_section_name(b".comment"),
            debug: debug.map(|_| DEBUG_NAMES.map(|n| w.add_section_name(n))),
            text_index,
        };
        let _ = w.reserve_section_index(); // .note.gnu.build-id
        let _ = w.reserve_section_index(); // .comment
        if debug.is_some() {
            for _ in DEBUG_NAMES {
                let _ = w.reserve_section_index();
            }
        }
        w.reserve_symtab_section_index();
        w.reserve_strtab_section_index();
        w.reserve_shstrtab_section_index();
        let name_ids = self
            .syms
            .iter()
            .map(|&(at, len, _, _)| {
                let _ = w.reserve_symbol_index(Some(object::write::elf::SectionIndex(text_index)));
                // A name is a C string: it ends at its first NUL.
                let name = &self.names[at as usize..(at + len) as usize];
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                (!name.is_empty()).then(|| w.add_string(name))
            })
            .collect();
        w.reserve_symtab();
        w.reserve_strtab().map_err(|e| e.to_string())?;
        let note = w.reserve(36, 4);
        let comment = w.reserve(comment.len() as u64, 1);
        let debug = debug.map(|line| {
            [
                w.reserve(line.len() as u64, 1),
                w.reserve(ABBREV.len() as u64, 1),
                w.reserve(INFO.len() as u64, 1),
            ]
        });
        w.reserve_shstrtab().map_err(|e| e.to_string())?;
        w.reserve_section_headers();
        Ok(Laid {
            text,
            note,
            comment,
            debug,
            sections: names,
            name_ids,
        })
    }
}

impl Image {
    /// The second phase: every byte, in the order [`Image::reserve`] laid them.
    fn write_all(
        &self,
        w: &mut Writer<'_>,
        l: &Laid,
        comment: &[u8],
        debug: Option<&Vec<u8>>,
    ) -> object::write::Result<()> {
        let text_at = self.text_at();
        let text_size = match self.kind {
            Kind::Single => self.code_end.saturating_sub(text_at),
            Kind::Shared => self.text.len() as u64,
        };
        w.write_file_header(&FileHeader {
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            e_type: elf::ET_DYN,
            e_machine: elf::Machine(EM_HOST),
            e_entry: text_at,
            e_flags: elf::FileFlags(0),
        })?;
        w.write_align_program_headers();
        let rx = elf::ProgramFlags(elf::PF_R.0 | elf::PF_X.0);
        w.write_program_header(&ProgramHeader {
            p_type: elf::PT_LOAD,
            p_flags: rx,
            p_offset: text_at,
            p_vaddr: text_at,
            p_paddr: text_at,
            p_filesz: text_size,
            p_memsz: text_size,
            p_align: 8,
        });
        if self.kind == Kind::Shared {
            w.write_program_header(&ProgramHeader {
                p_type: elf::PT_NOTE,
                p_flags: elf::ProgramFlags(elf::PF_R.0),
                p_offset: l.note,
                p_vaddr: l.note,
                p_paddr: l.note,
                p_filesz: 36,
                p_memsz: 36,
                p_align: 4,
            });
        }
        w.pad_until(l.text);
        w.write(&self.text);
        w.write_null_symbol();
        for (i, &(_, _, value, size)) in self.syms.iter().enumerate() {
            w.write_symbol(&Sym {
                st_name: w.string_offset(l.name_ids.get(i).copied().flatten()),
                section: Some(l.sections.text_index),
                st_info: elf::SymbolInfo::new(elf::STB_GLOBAL, elf::STT_FUNC),
                st_other: elf::SymbolOther(0),
                st_shndx: elf::SymbolSection(0),
                st_value: value,
                st_size: size,
            });
        }
        w.write_strtab();
        w.pad_until(l.note);
        // The build-ID note, its ID zeroed until the image is hashed.
        w.write(&[4, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0]);
        w.write(&[0; 20]);
        w.write(comment);
        if let (Some(line), Some(_)) = (debug, l.debug) {
            w.write(line);
            w.write(&ABBREV);
            w.write(&INFO);
        }
        w.write_shstrtab();
        self.write_section_headers(w, l, comment.len() as u64, text_size, debug);
        Ok(())
    }

    fn write_section_headers(
        &self,
        w: &mut Writer<'_>,
        l: &Laid,
        comment_len: u64,
        text_size: u64,
        debug: Option<&Vec<u8>>,
    ) {
        let s = &l.sections;
        let text_at = self.text_at();
        let section = |w: &mut Writer<'_>, name, kind, flags: u64, addr, off, size, align| {
            let sh_name = w.section_name_offset(Some(name));
            w.write_section_header(&SectionHeader {
                sh_name,
                sh_type: kind,
                sh_flags: elf::SectionFlags(flags),
                sh_addr: addr,
                sh_offset: off,
                sh_size: size,
                sh_link: 0,
                sh_info: 0,
                sh_addralign: align,
                sh_entsize: 0,
            });
        };
        w.write_null_section_header();
        let (alloc, exec) = (elf::SHF_ALLOC.0, elf::SHF_EXECINSTR.0);
        // .text: address = offset, so a symbol's value is its file offset.
        section(
            w,
            s.text,
            elf::SHT_PROGBITS,
            alloc | exec,
            text_at,
            text_at,
            text_size,
            16,
        );
        if let (Some([f, h]), Some([(f_at, f_len), (h_at, h_len)])) = (s.eh, self.eh) {
            section(w, f, elf::SHT_PROGBITS, alloc, f_at, f_at, f_len, 8);
            section(w, h, elf::SHT_PROGBITS, alloc, h_at, h_at, h_len, 4);
        }
        section(w, s.note, elf::SHT_NOTE, alloc, 0, l.note, 36, 4);
        section(
            w,
            s.comment,
            elf::SHT_PROGBITS,
            0x30,
            0,
            l.comment,
            comment_len,
            1,
        );
        if let (Some(names), Some(at), Some(line)) = (s.debug, l.debug, debug) {
            let sizes = [line.len() as u64, ABBREV.len() as u64, INFO.len() as u64];
            for ((name, at), size) in names.into_iter().zip(at).zip(sizes) {
                section(w, name, elf::SHT_PROGBITS, 0, 0, at, size, 1);
            }
        }
        w.write_symtab_section_header(1);
        w.write_strtab_section_header();
        w.write_shstrtab_section_header();
    }
}

/// The line programs of an image's loads, and the file table they share.
#[derive(Default)]
struct Lines {
    prog: Vec<u8>,
    /// Source files by name, numbered from 1 in the program's header.
    files: std::collections::HashMap<Vec<u8>, u64>,
    /// The header's file table (name, NUL, directory, time and size 0).
    file_names: Vec<u8>,
}

impl Lines {
    fn len(&self) -> u64 {
        (self.prog.len() + self.file_names.len()) as u64
    }

    /// One sequence for the load at `offset` (as genelf_debug writes it: the address
    /// set once, then line and address advances, the file set where the name
    /// changes). Files go into the header's table, each name once: defining them in
    /// the program (DW_LNE_define_file, as genelf_debug does) gave binutils' reader
    /// garbage names once a program defined thousands.
    ///
    /// A record whose entries do not read as it says gives no lines (false): its
    /// `count` entries (16 bytes and a NUL-terminated name each) must end where the
    /// record ends, up to 7 bytes of zeros (the padding JITs align records with).
    /// node 20's V8 writes, for some loads (the baseline code of a script's top
    /// level), the bytes of a freed buffer where the script's name goes: malloc's
    /// free-list pointer and key, with a NUL a few bytes in, so the name reads as a
    /// few bytes of garbage and every entry after it is read from the middle of
    /// others (addresses far outside the code, names of pointer bytes). perf
    /// inject's image turns them into lines (`O|.5:2` for code past the record's
    /// one entry in the code); none of them is a line of the load.
    fn add(&mut self, offset: u64, csize: u64, l: DebugLines<'_>) -> bool {
        let start = self.prog.len();
        let (files_before, names_before) = (self.files.len() as u64, self.file_names.len());
        let (mut last_at, mut last_line, mut file, mut rows) = (0u64, 1i64, 0u64, 0);
        let (mut used, mut read) = (0usize, 0u64);
        let entries = crate::format::jitdump::lines(l.raw, l.count, l.swapped);
        for x in entries {
            // The entry's bytes: its 16, its name (the marker 0xff for "as before")
            // and the NUL.
            used += 16 + x.name.map_or(1, <[u8]>::len) + 1;
            read += 1;
            let Some(at) = x.addr.checked_sub(l.code_addr) else {
                continue;
            };
            // Rows go forward in a sequence and stay inside the code.
            if at >= csize || (rows > 0 && at < last_at) {
                continue;
            }
            if rows == 0 {
                self.prog.extend_from_slice(&[0, 9, 2]);
                self.prog.extend_from_slice(&offset.to_le_bytes());
            }
            if let Some(name) = x.name {
                let n = self.file(name);
                if n != file {
                    self.prog.push(4);
                    uleb(&mut self.prog, n);
                    file = n;
                }
            }
            if file == 0 {
                // Lines with no file yet name none perf could show.
                continue;
            }
            if i64::from(x.lineno) != last_line {
                self.prog.push(3);
                sleb(&mut self.prog, i64::from(x.lineno) - last_line);
                last_line = i64::from(x.lineno);
            }
            if at != last_at {
                self.prog.push(2);
                uleb(&mut self.prog, at - last_at);
                last_at = at;
            }
            self.prog.push(1); // DW_LNS_copy
            rows += 1;
        }
        let padding = l.raw.get(used..).unwrap_or_default();
        let whole = read == l.count && used <= l.raw.len();
        let well_formed = whole && padding.len() < 8 && padding.iter().all(|&b| b == 0);
        if !well_formed {
            // No row of it, and no file only it named.
            self.prog.truncate(start);
            if self.files.len() as u64 > files_before {
                self.files.retain(|_, n| *n <= files_before);
                self.file_names.truncate(names_before);
            }
            return false;
        }
        if rows == 0 {
            self.prog.truncate(start);
        } else {
            // The sequence ends at its last row, as genelf_debug ends it: code after
            // the last line the JIT gave has no line (perf shows none there either).
            self.prog.extend_from_slice(&[0, 1, 1]);
        }
        true
    }

    fn file(&mut self, name: &[u8]) -> u64 {
        if let Some(&n) = self.files.get(name) {
            return n;
        }
        self.file_names.extend_from_slice(name);
        self.file_names.extend_from_slice(&[0, 0, 0, 0]);
        let n = self.files.len() as u64 + 1;
        self.files.insert(name.to_vec(), n);
        n
    }

    /// `.debug_line`: the header (DWARF 2, perf's parameters, the file table) and
    /// the sequences; `None` when no load had lines.
    fn sections(&self) -> Option<Vec<u8>> {
        if self.prog.is_empty() {
            return None;
        }
        let header_len = 19 + self.file_names.len() as u64;
        let mut h = Vec::with_capacity(self.prog.len() + header_len as usize + 10);
        h.extend_from_slice(&((6 + header_len + self.prog.len() as u64) as u32).to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&(header_len as u32).to_le_bytes());
        // min_inst_length, default_is_stmt, line_base, line_range, opcode_base.
        h.extend_from_slice(&[1, 1, (-5i8) as u8, 14, 13]);
        h.extend_from_slice(&[0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1]);
        // No include directories; the files.
        h.push(0);
        h.extend_from_slice(&self.file_names);
        h.push(0);
        h.extend_from_slice(&self.prog);
        Some(h)
    }
}

fn uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if (v == 0 && b & 0x40 == 0) || (v == -1 && b & 0x40 != 0) {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(out: &mut Vec<u8>, addr: u64, line: u32, name: &[u8]) {
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&line.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(name);
        out.push(0);
    }

    /// A DEBUG_INFO record whose entries end where it ends (up to 7 bytes of zeros)
    /// gives its rows; one whose entries do not (node 20's V8 writing a freed buffer
    /// as the script's name: a NUL 4 bytes into the name's 18, the rest read from the
    /// middle of entries) gives none, and leaves no file in the table; a record with
    /// fewer entries than it says, or bytes after them that are not padding, neither.
    #[test]
    fn a_record_that_does_not_read_as_it_says_gives_no_lines() {
        let code_addr = 0x7f00_0000_1000u64;
        let name: &[u8] = b"/tmp/repro/r1/w.js";
        let good = |pad: usize| {
            let mut raw = Vec::new();
            for (i, line) in [(0x40u64, 2u32), (0x80, 3), (0x100, 7)] {
                entry(&mut raw, code_addr + i, line, name);
            }
            raw.resize(raw.len() + pad, 0);
            raw
        };
        fn lines(raw: &[u8], count: u64) -> DebugLines<'_> {
            DebugLines {
                raw,
                count,
                swapped: false,
                code_addr: 0x7f00_0000_1000,
            }
        }
        let mut l = Lines::default();
        for pad in [0, 3, 7] {
            assert!(l.add(0xc0, 0x200, lines(&good(pad), 3)), "padding {pad}");
        }
        let kept = (l.prog.len(), l.file_names.clone());
        assert!(kept.0 > 0 && l.files.len() == 1);
        // The freed buffer: free-list pointer (a NUL in its fifth byte), key, "js".
        let freed: &[u8] = b"d\x97\x7f\x1e\0\0\0\0\x99\xd7\x9a\xc5\xaa\xbc\x47\x7fjs";
        let mut raw = Vec::new();
        for (i, line) in [(0x40u64, 2u32), (0x80, 3), (0x100, 7), (0x140, 9)] {
            entry(&mut raw, code_addr + i, line, freed);
        }
        let mut bad = vec![(raw, 4)];
        bad.push((good(8), 3)); // eight bytes more than padding
        let mut junk = good(0);
        junk.push(1);
        bad.push((junk, 3));
        bad.push((good(0), 4)); // one entry more than the bytes hold
        for (i, (raw, count)) in bad.iter().enumerate() {
            assert!(!l.add(0x400, 0x200, lines(raw, *count)), "record {i}");
            assert_eq!(
                (l.prog.len(), &l.file_names),
                (kept.0, &kept.1),
                "record {i}"
            );
            assert_eq!(l.files.len(), 1, "record {i}");
        }
        // A later record's file is numbered after the kept ones.
        let mut raw = Vec::new();
        entry(&mut raw, code_addr + 0x10, 4, b"b.js");
        entry(&mut raw, code_addr + 0x20, 5, b"b.js");
        assert!(l.add(0x600, 0x40, lines(&raw, 2)));
        assert_eq!(l.files.get(&b"b.js"[..]), Some(&2));
    }

    /// A shelf puts each load where the image puts it, with and without tables
    /// mapped behind the code (and with more claimed mapped than given), and the
    /// image reads back through object with a symbol per load and the build ID of
    /// its bytes.
    #[test]
    fn a_shelf_places_loads_as_the_image_does_and_the_image_reads_back() {
        use object::Object;
        let mut img = Image::new(Kind::Shared);
        let mut shelf = Shelf::default();
        let code = [0x90u8; 100];
        let data = [1u8; 64];
        let mut x = 7u64;
        for i in 0..200u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let csize = 1 + (x >> 40) as usize % code.len();
            let tables = match i % 4 {
                0 => None,
                1 => Some(0),
                2 => Some(24 + (x >> 50) % 40),
                _ => Some(1 << 40),
            }
            .map(|m| Tables {
                data: &data,
                hdr_size: 8,
                mapped: m,
            });
            let want = shelf.place(csize as u64, tables.map_or(0, |t| t.mapped()));
            let got = img.add(Load {
                name: b"f",
                code: &code[..csize],
                tables,
                lines: None,
            });
            assert_eq!(got, want, "load {i}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jit-1.so");
        let done = img.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let f = object::File::parse(&*bytes).unwrap();
        assert_eq!(f.symbols().count(), 200);
        assert_eq!(
            crate::buildid::elf::build_id_of_image(&bytes).unwrap(),
            done.id
        );
        let mut zeroed = bytes.clone();
        let at = zeroed.windows(4).position(|w| w == b"GNU\0").unwrap() + 4;
        zeroed[at..at + 20].fill(0);
        let id: [u8; 20] = sha1::Sha1::digest(&zeroed).into();
        assert_eq!(&id[..], done.id.as_bytes());
    }
}
