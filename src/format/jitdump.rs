//! The jitdump format (`jit-PID.dump`, tools/perf/Documentation/jitdump-specification.txt):
//! what a JIT (V8 `--perf-prof`, CPython `-X perf_jit`, perf's JVMTI agent) writes
//! about the code it generates, read one record at a time from any reader, so that a
//! dump of any size is read in one record's memory.
//!
//! A file header (magic `JiTD`, version 1, its size, the ELF machine, the pid, a
//! timestamp, flags), then records, each a 16-byte prefix (id, total size, timestamp)
//! and a body: CODE_LOAD (pid, tid, vma, code address and size, an index, a
//! NUL-terminated name, the code), CODE_MOVE, DEBUG_INFO (source lines of the next
//! load), CLOSE, UNWINDING_INFO (`.eh_frame` and `.eh_frame_hdr` of the next load).
//! Byte order follows the magic (a dump written on the other endianness reads back
//! swapped, as perf reads it).

use std::io::Read;

/// `JiTD` as the writer's u32.
pub(crate) const MAGIC: u32 = 0x4A69_5444;
/// [`MAGIC`] byte-swapped: the dump was written in the other byte order.
pub(crate) const MAGIC_SWAPPED: u32 = 0x4454_694A;
/// Flag: timestamps are the architecture's counter (TSC), not CLOCK_MONOTONIC.
pub(crate) const FLAG_ARCH_TIMESTAMP: u64 = 1;
/// Size of the file header perf's version 1 knows.
pub(crate) const HEADER_SIZE: usize = 40;
/// Size of a record's prefix.
pub(crate) const PREFIX_SIZE: usize = 16;
/// Largest record read (a single function's code and its tables): a record that
/// claims more is taken as damage, so a bad size cannot make pdinject allocate
/// gigabytes. V8's and CPython's largest loads are below 1 MB.
pub(crate) const MAX_RECORD: u32 = 64 << 20;

/// Record ids.
pub(crate) mod id {
    /// Code loaded.
    pub(crate) const CODE_LOAD: u32 = 0;
    /// Code moved.
    pub(crate) const CODE_MOVE: u32 = 1;
    /// Source lines of the next code load.
    pub(crate) const DEBUG_INFO: u32 = 2;
    /// The JIT closed the dump.
    pub(crate) const CLOSE: u32 = 3;
    /// Unwinding tables of the next code load.
    pub(crate) const UNWINDING_INFO: u32 = 4;
}

/// Why a jitdump cannot be read (any of these makes the dump unusable, or ends it).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub(crate) enum JitdumpError {
    /// Not a jitdump (no magic).
    #[error("not a jitdump (no JiTD magic)")]
    NotJitdump,
    /// The header is shorter than version 1's.
    #[error("the header is cut short ({0} bytes)")]
    ShortHeader(usize),
    /// A version this reader does not know.
    #[error("jitdump version {0}, only version 1 is known")]
    Version(u32),
    /// Flags this reader does not know.
    #[error("unknown header flags {0:#x}")]
    Flags(u64),
    /// A header or record size that cannot be.
    #[error("offset {offset:#x}: {what}")]
    Bad {
        /// Offset in the dump.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The dump ends inside a record (the JIT was killed while writing, or the file
    /// was copied while it was written).
    #[error("offset {offset:#x}: the dump ends inside a record{}", .time.map(|t| format!(" (written at {t})")).unwrap_or_default())]
    Truncated {
        /// Where the cut record starts.
        offset: u64,
        /// Its timestamp, when its prefix is whole.
        time: Option<u64>,
    },
    /// Reading failed.
    #[error("read error: {0}")]
    Io(String),
}

/// The file header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    /// Format version.
    pub version: u32,
    /// Header size (records start there).
    pub total_size: u32,
    /// ELF machine of the code (`e_machine`; CPython writes 0).
    pub elf_mach: u32,
    /// The JIT's process id.
    pub pid: u32,
    /// When the dump was opened.
    pub timestamp: u64,
    /// Flags ([`FLAG_ARCH_TIMESTAMP`]).
    pub flags: u64,
    /// The dump is in the other byte order.
    pub swapped: bool,
}

/// A code load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CodeLoad<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Virtual address of the code.
    pub vma: u64,
    /// Address of the code (where samples land).
    pub code_addr: u64,
    /// The code's index (unique per load; moves name it).
    pub code_index: u64,
    /// The function's name (without its NUL).
    pub name: &'a [u8],
    /// The code.
    pub code: &'a [u8],
}

/// A code move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CodeMove {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Virtual address.
    pub vma: u64,
    /// Where the code was.
    pub old_code_addr: u64,
    /// Where it is now.
    pub new_code_addr: u64,
    /// Its size.
    pub code_size: u64,
    /// The index of the load that made it.
    pub code_index: u64,
}

/// One source line of a DEBUG_INFO record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LineEntry<'a> {
    /// Address of the first instruction of the line.
    pub addr: u64,
    /// Line number.
    pub lineno: u32,
    /// Discriminator.
    pub discrim: u32,
    /// Source file name; `None` for the spec's "same as before" marker (0xff 0x00).
    pub name: Option<&'a [u8]>,
}

/// Unwinding tables of the next load: `.eh_frame` then `.eh_frame_hdr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unwinding<'a> {
    /// Size of `.eh_frame_hdr` (the tail of `data`).
    pub eh_frame_hdr_size: u64,
    /// Bytes of the tables the JIT maps after the code (0: not mapped).
    pub mapped_size: u64,
    /// `.eh_frame` and `.eh_frame_hdr`.
    pub data: &'a [u8],
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// CODE_LOAD.
    Load(CodeLoad<'a>),
    /// CODE_MOVE.
    Move(CodeMove),
    /// DEBUG_INFO: `code_addr` and the raw entries (read with [`lines`]).
    Debug {
        /// The code the lines describe.
        code_addr: u64,
        /// Number of entries.
        count: u64,
        /// The entries' bytes.
        raw: &'a [u8],
    },
    /// CLOSE.
    Close,
    /// UNWINDING_INFO.
    Unwinding(Unwinding<'a>),
    /// A record id this reader does not know (skipped, as perf skips it).
    Unknown(u32),
}

/// A record with its prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    /// Offset of the record in the dump.
    pub offset: u64,
    /// Its size, prefix included.
    pub size: u64,
    /// Its timestamp.
    pub time: u64,
    /// The record.
    pub record: Record<'a>,
}

#[derive(Clone, Copy)]
struct Order(bool);

impl Order {
    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let v = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
        Some(if self.0 { v.swap_bytes() } else { v })
    }
    fn u64(self, b: &[u8], at: usize) -> Option<u64> {
        let v = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
        Some(if self.0 { v.swap_bytes() } else { v })
    }
    /// `N` u64 words from `at` on (their bytes checked at once: no word is then missing).
    fn u64s<const N: usize>(self, b: &[u8], at: usize) -> Option<[u64; N]> {
        let w = b.get(at..at + 8 * N)?;
        Some(std::array::from_fn(|i| self.u64(w, 8 * i).unwrap_or(0)))
    }
    /// Two u32 words (a prefix's id and size, a body's pid and tid), then `N` u64 words.
    fn head<const N: usize>(self, b: &[u8]) -> Option<(u32, u32, [u64; N])> {
        Some((self.u32(b, 0)?, self.u32(b, 4)?, self.u64s(b, 8)?))
    }
}

/// Parses the file header from the dump's first bytes.
pub(crate) fn parse_header(b: &[u8]) -> Result<Header, JitdumpError> {
    let swapped = match Order(false).u32(b, 0) {
        Some(MAGIC) => false,
        Some(MAGIC_SWAPPED) => true,
        Some(_) => return Err(JitdumpError::NotJitdump),
        None => return Err(JitdumpError::ShortHeader(b.len())),
    };
    if b.len() < HEADER_SIZE {
        return Err(JitdumpError::ShortHeader(b.len()));
    }
    let o = Order(swapped);
    let h = Header {
        version: o.u32(b, 4).unwrap_or(0),
        total_size: o.u32(b, 8).unwrap_or(0),
        elf_mach: o.u32(b, 12).unwrap_or(0),
        pid: o.u32(b, 20).unwrap_or(0),
        timestamp: o.u64(b, 24).unwrap_or(0),
        flags: o.u64(b, 32).unwrap_or(0),
        swapped,
    };
    if h.version != 1 {
        return Err(JitdumpError::Version(h.version));
    }
    if h.flags & !FLAG_ARCH_TIMESTAMP != 0 {
        return Err(JitdumpError::Flags(h.flags));
    }
    if (h.total_size as usize) < HEADER_SIZE || h.total_size > MAX_RECORD {
        return Err(JitdumpError::Bad {
            offset: 8,
            what: format!("header size {} (at least {HEADER_SIZE})", h.total_size),
        });
    }
    Ok(h)
}

/// A jitdump read record by record.
pub(crate) struct Reader<R: Read> {
    r: R,
    /// Or a thread that reads the file ahead, whose blocks become the buffer.
    ahead: Option<Ahead>,
    /// The header.
    pub header: Header,
    at: u64,
    /// Bytes read and not yet handed out are `buf[pos..end]`: records are parsed in
    /// place, each byte copied once from the reader (a buffered reader underneath and
    /// a copy per record were a fifth of a `--jit` run on a 43 MB dump).
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    /// Its first buffer's size.
    first: usize,
}

/// What the reader asks of the input at once, at most.
const READ_AHEAD: usize = 256 << 10;
/// Its first buffer.
const FIRST_READ: usize = 64 << 10;

impl<R: Read> Reader<R> {
    /// Reads the header (and skips what a newer writer added to it).
    pub(crate) fn new(r: R) -> Result<Self, JitdumpError> {
        Self::start(r, None)
    }

    /// [`Reader::new`] with the reader `ahead` instead of `r`.
    fn start(r: R, ahead: Option<Ahead>) -> Result<Self, JitdumpError> {
        let mut me = Reader {
            ahead,
            first: FIRST_READ,
            ..Self::records(r, Header::default(), 0, 0)
        };
        let got = me.fill(HEADER_SIZE)?;
        let header = parse_header(&me.buf[me.pos..me.pos + got])?;
        let size = header.total_size as usize;
        if me.fill(size)? < size {
            return Err(JitdumpError::ShortHeader(size));
        }
        me.pos += size;
        me.header = header;
        me.at = size as u64;
        Ok(me)
    }

    /// Makes `n` bytes (or as many as the input has left) available at `pos`;
    /// returns how many are. The buffer grows to a record's size as its bytes
    /// arrive, so a record that claims megabytes in a dump cut short costs what
    /// the dump holds, not the claim.
    fn fill(&mut self, n: usize) -> Result<usize, JitdumpError> {
        if self.end - self.pos >= n || self.eof {
            return Ok((self.end - self.pos).min(n));
        }
        if self.ahead.is_some() {
            return self.fill_ahead(n);
        }
        // Move what is left to the front, then read in large pieces: the buffer
        // doubles at each refill up to a read-ahead (a small dump costs a small one).
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        if self.buf.len() < READ_AHEAD {
            let len = (self.buf.len() * 2).clamp(self.first, READ_AHEAD.max(self.first));
            self.buf.resize(len, 0);
        }
        while self.end < n && !self.eof {
            if self.buf.len() == self.end {
                // A record larger than the buffer: it grows as the record's bytes
                // arrive, not by what the record claims.
                let step = self.buf.len().clamp(self.first, READ_AHEAD.max(self.first));
                self.buf.resize(self.end + step, 0);
            }
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(JitdumpError::Io(e.to_string())),
            }
        }
        Ok((self.end - self.pos).min(n))
    }

    /// [`Reader::fill`] from the blocks of a reader ahead: what is left of the last
    /// block (the start of a record) goes into the headroom before the next block's
    /// bytes, and the block becomes the buffer; nothing else is copied. A record
    /// longer than the headroom grows by copies, as from a plain reader.
    fn fill_ahead(&mut self, n: usize) -> Result<usize, JitdumpError> {
        while self.end - self.pos < n && !self.eof {
            let Some(ahead) = self.ahead.as_mut() else {
                break;
            };
            let Some((mut block, valid)) = ahead.next()? else {
                self.eof = true;
                break;
            };
            let left = self.end - self.pos;
            if left <= AHEAD_ROOM {
                block[AHEAD_ROOM - left..AHEAD_ROOM].copy_from_slice(&self.buf[self.pos..self.end]);
                ahead.recycle(std::mem::replace(&mut self.buf, block));
                self.pos = AHEAD_ROOM - left;
                self.end = valid;
            } else {
                if self.pos > 0 {
                    self.buf.copy_within(self.pos..self.end, 0);
                }
                self.buf.truncate(left);
                self.buf.extend_from_slice(&block[AHEAD_ROOM..valid]);
                self.pos = 0;
                self.end = self.buf.len();
                ahead.recycle(block);
            }
        }
        Ok((self.end - self.pos).min(n))
    }

    /// The next record; `Ok(None)` at a clean end. A record cut short is
    /// Whether entries are byte-swapped (the fuzzer skips what the reader refuses).
    pub(crate) fn swapped(&self) -> bool {
        self.header.swapped
    }

    /// [`JitdumpError::Truncated`]; what came before it stands.
    pub(crate) fn next_entry(&mut self) -> Result<Option<Entry<'_>>, JitdumpError> {
        let o = Order(self.header.swapped);
        let offset = self.at;
        let cut = |time| JitdumpError::Truncated { offset, time };
        let got = self.fill(PREFIX_SIZE)?;
        // The prefix's words read whole exactly when the prefix is.
        let Some((kind, size, [time])) = o.head(&self.buf[self.pos..self.pos + got]) else {
            return if got == 0 { Ok(None) } else { Err(cut(None)) };
        };
        if (size as usize) < PREFIX_SIZE || size > MAX_RECORD {
            return Err(JitdumpError::Bad {
                offset,
                what: format!("record of id {kind} claims {size} bytes"),
            });
        }
        if self.fill(size as usize)? < size as usize {
            return Err(cut(Some(time)));
        }
        let body = self.pos + PREFIX_SIZE..self.pos + size as usize;
        self.pos += size as usize;
        self.at += size as u64;
        let bad = |what: &str| JitdumpError::Bad {
            offset,
            what: format!("record of id {kind} and size {size}: {what}"),
        };
        let record = parse_record(o, kind, &self.buf[body], bad)?;
        Ok(Some(Entry {
            offset,
            size: u64::from(size),
            time,
            record,
        }))
    }

    /// A reader of records alone: `r` holds `len` bytes of records of a dump with
    /// `header` from its offset `at` on (a second read of some of them).
    pub(crate) fn records(r: R, header: Header, at: u64, len: usize) -> Self {
        Reader {
            r,
            ahead: None,
            header,
            at,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            eof: false,
            first: len.max(PREFIX_SIZE),
        }
    }

    /// Offset of the next record (after the last one handed out).
    pub(crate) fn offset(&self) -> u64 {
        self.at
    }
}

/// The body `b` of a record of id `kind`; `bad` words why it cannot be one.
fn parse_record(
    o: Order,
    kind: u32,
    b: &[u8],
    bad: impl Fn(&str) -> JitdumpError,
) -> Result<Record<'_>, JitdumpError> {
    Ok(match kind {
        id::CODE_LOAD => {
            let (pid, tid, [vma, code_addr, code_size, code_index]) =
                o.head(b).ok_or_else(|| bad("shorter than a code load"))?;
            let rest = &b[40..];
            let (name_part, code) = usize::try_from(code_size)
                .ok()
                .and_then(|c| rest.split_at_checked(rest.len().checked_sub(c)?))
                .ok_or_else(|| bad("its code is larger than the record"))?;
            let name = name_part.split(|&c| c == 0).next().unwrap_or(&[]);
            Record::Load(CodeLoad {
                pid,
                tid,
                vma,
                code_addr,
                code_index,
                name,
                code,
            })
        }
        id::CODE_MOVE => {
            let (pid, tid, [vma, old_code_addr, new_code_addr, code_size, code_index]) =
                o.head(b).ok_or_else(|| bad("shorter than a code move"))?;
            Record::Move(CodeMove {
                pid,
                tid,
                vma,
                old_code_addr,
                new_code_addr,
                code_size,
                code_index,
            })
        }
        id::DEBUG_INFO => {
            let [code_addr, count] = o
                .u64s(b, 0)
                .ok_or_else(|| bad("shorter than a debug-info header"))?;
            Record::Debug {
                code_addr,
                count,
                raw: &b[16..],
            }
        }
        id::CLOSE => Record::Close,
        id::UNWINDING_INFO => {
            let [usz, hdr, mapped] = o
                .u64s(b, 0)
                .ok_or_else(|| bad("shorter than an unwinding-info header"))?;
            let data = usize::try_from(usz)
                .ok()
                .and_then(|u| b.get(24..24 + u))
                .filter(|d| hdr <= d.len() as u64)
                .ok_or_else(|| bad("its tables are larger than the record"))?;
            Record::Unwinding(Unwinding {
                eh_frame_hdr_size: hdr,
                mapped_size: mapped,
                data,
            })
        }
        other => Record::Unknown(other),
    })
}

impl Reader<std::fs::File> {
    /// A reader of the dump `f` that a thread of its own reads ahead, a block at a
    /// time: the copy out of the page cache (40 % of a 51 MB dump's first read)
    /// goes to another core while this one parses. Without a thread (none could be
    /// started), `f` is read as by [`Reader::new`].
    pub(crate) fn read_ahead(f: std::fs::File) -> Result<Self, JitdumpError> {
        // The thread reads through a duplicate, which shares the file's offset:
        // `f` itself is then never read.
        let ahead = f.try_clone().ok().and_then(|c| Ahead::spawn(c).ok());
        Self::start(f, ahead)
    }
}

/// Bytes a reader ahead reads at once.
const AHEAD_BLOCK: usize = 256 << 10;
/// Room kept before each block's bytes for the start of a record the last block
/// ended in.
const AHEAD_ROOM: usize = 64 << 10;
/// Blocks read and not yet parsed, at most.
const AHEAD_BLOCKS: usize = 2;

/// A thread reading a file ahead into blocks of [`AHEAD_ROOM`] and [`AHEAD_BLOCK`]
/// bytes; the blocks parsed come back to it, so that its memory is a few blocks
/// whatever the file's size (and fresh pages are not faulted in for each).
struct Ahead {
    /// A block, and the end of its bytes (past the room); `(_, ROOM)` at the end.
    rx: std::sync::mpsc::Receiver<std::io::Result<(Vec<u8>, usize)>>,
    back: std::sync::mpsc::SyncSender<Vec<u8>>,
}

impl Ahead {
    fn spawn(mut f: std::fs::File) -> std::io::Result<Ahead> {
        use std::sync::mpsc::sync_channel;
        let (tx, rx) = sync_channel(AHEAD_BLOCKS);
        let (back, spare) = sync_channel::<Vec<u8>>(AHEAD_BLOCKS + 2);
        std::thread::Builder::new()
            .name("pdinject-jit-read".into())
            .spawn(move || {
                loop {
                    let mut b = spare
                        .try_recv()
                        .unwrap_or_else(|_| vec![0; AHEAD_ROOM + AHEAD_BLOCK]);
                    let mut n = AHEAD_ROOM;
                    let err = loop {
                        match f.read(&mut b[n..]) {
                            Ok(0) => break None,
                            Ok(k) => n += k,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => break Some(e),
                        }
                        if n == b.len() {
                            break None;
                        }
                    };
                    // The bytes read before an error are handed out first, as a
                    // plain reader hands out the records before it.
                    let got = (err.is_none() || n > AHEAD_ROOM).then_some((b, n));
                    let last = n == AHEAD_ROOM || err.is_some();
                    // The reader gone (done, or stopped at an error), the thread ends.
                    if got.is_some_and(|g| tx.send(Ok(g)).is_err()) {
                        return;
                    }
                    if let Some(e) = err {
                        let _ = tx.send(Err(e));
                    }
                    if last {
                        return;
                    }
                }
            })?;
        Ok(Ahead { rx, back })
    }

    /// The next block and the end of its bytes; `None` at the file's end.
    fn next(&mut self) -> Result<Option<(Vec<u8>, usize)>, JitdumpError> {
        match self.rx.recv() {
            Ok(Ok((b, n))) if n > AHEAD_ROOM => Ok(Some((b, n))),
            Ok(Ok(_)) => Ok(None),
            Ok(Err(e)) => Err(JitdumpError::Io(e.to_string())),
            // Never after the end's empty block: a thread that ended otherwise (a
            // panic) must not make the rest of the dump look absent.
            Err(_) => Err(JitdumpError::Io("its read-ahead thread ended".into())),
        }
    }

    /// Gives a parsed block back to be read into again.
    fn recycle(&self, b: Vec<u8>) {
        if b.len() == AHEAD_ROOM + AHEAD_BLOCK && b.capacity() == b.len() {
            let _ = self.back.try_send(b);
        }
    }
}

/// The entries of a DEBUG_INFO record: at most `count`, each 16 bytes and a
/// NUL-terminated name; stops at the first that does not fit.
pub(crate) fn lines(raw: &[u8], count: u64, swapped: bool) -> impl Iterator<Item = LineEntry<'_>> {
    let o = Order(swapped);
    let mut at = 0usize;
    let mut left = count;
    std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        left -= 1;
        let addr = o.u64(raw, at)?;
        let lineno = o.u32(raw, at + 8)?;
        let discrim = o.u32(raw, at + 12)?;
        let rest = raw.get(at + 16..)?;
        // CStr's search for the NUL goes a word at a time: every entry of the
        // hundreds of thousands a JIT writes repeats its file name.
        let name = std::ffi::CStr::from_bytes_until_nul(rest).ok()?.to_bytes();
        at += 16 + name.len() + 1;
        Some(LineEntry {
            addr,
            lineno,
            discrim,
            name: (name != [0xff]).then_some(name),
        })
    })
}

/// The pid in a jitdump's file name (`jit-PID.dump`, perf's `jit_detect`), or None.
pub(crate) fn marker_pid(path: &[u8]) -> Option<u32> {
    let base = path.rsplit(|&c| c == b'/').next()?;
    let rest = base.strip_prefix(b"jit-")?;
    let digits = rest.strip_suffix(b".dump")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: u32) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&40u32.to_le_bytes());
        h.extend_from_slice(&62u32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&pid.to_le_bytes());
        h.extend_from_slice(&5u64.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h
    }

    fn load(t: u64, addr: u64, name: &str, code: &[u8]) -> Vec<u8> {
        let size = 16 + 40 + name.len() + 1 + code.len();
        let mut r = Vec::new();
        r.extend_from_slice(&id::CODE_LOAD.to_le_bytes());
        r.extend_from_slice(&(size as u32).to_le_bytes());
        r.extend_from_slice(&t.to_le_bytes());
        r.extend_from_slice(&7u32.to_le_bytes());
        r.extend_from_slice(&7u32.to_le_bytes());
        r.extend_from_slice(&addr.to_le_bytes());
        r.extend_from_slice(&addr.to_le_bytes());
        r.extend_from_slice(&(code.len() as u64).to_le_bytes());
        r.extend_from_slice(&3u64.to_le_bytes());
        r.extend_from_slice(name.as_bytes());
        r.push(0);
        r.extend_from_slice(code);
        r
    }

    #[test]
    fn reads_loads_and_notices_a_cut() {
        let mut d = header(7);
        d.extend(load(10, 0x1000, "f", &[0x90, 0xc3]));
        let whole = d.len();
        d.extend(load(11, 0x2000, "g", &[0xc3]));
        let mut r = Reader::new(&d[..]).unwrap();
        assert_eq!(r.header.pid, 7);
        match r.next_entry().unwrap().unwrap().record {
            Record::Load(l) => {
                assert_eq!(
                    (l.code_addr, l.name, l.code),
                    (0x1000, &b"f"[..], &[0x90, 0xc3][..])
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            r.next_entry().unwrap().unwrap().record,
            Record::Load(_)
        ));
        assert_eq!(r.next_entry().unwrap(), None);
        let cut = &d[..whole + 20];
        let mut r = Reader::new(cut).unwrap();
        assert!(r.next_entry().unwrap().is_some());
        assert_eq!(
            r.next_entry().unwrap_err(),
            JitdumpError::Truncated {
                offset: whole as u64,
                time: Some(11)
            }
        );
    }

    /// Entries owned: (offset, size, time, the record as the reader located it).
    type Owned = Vec<(u64, u64, u64, String)>;

    /// Each entry of a reader, up to its end or error.
    fn entries<R: Read>(mut r: Reader<R>) -> (Owned, Option<JitdumpError>) {
        let mut v = Vec::new();
        loop {
            match r.next_entry() {
                Ok(Some(e)) => v.push((e.offset, e.size, e.time, format!("{:?}", e.record))),
                Ok(None) => return (v, None),
                Err(e) => return (v, Some(e)),
            }
        }
    }

    /// A reader ahead gives what a plain one does: records across its blocks, records
    /// longer than its headroom and than a block, a dump cut short.
    #[test]
    fn read_ahead_reads_as_a_plain_reader() {
        let mut d = header(7);
        let mut seed = 12345u64;
        for i in 0..400u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = match i % 50 {
                7 => 70 << 10,
                19 => 300 << 10,
                _ => (seed >> 33) as usize % 4000,
            };
            let code: Vec<u8> = (0..len).map(|k| (k as u64 ^ i) as u8).collect();
            d.extend(load(10 + i, 0x1000 * (i + 1), &format!("f{i}"), &code));
        }
        let dir = tempfile::tempdir().unwrap();
        // Cuts: whole, mid-record, at block ends (the file's bytes fill whole
        // blocks), inside the header.
        for cut in [
            d.len(),
            d.len() - 100,
            300 << 10,
            (256 + 64) << 10,
            256 << 10,
            512 << 10,
            41,
        ] {
            let p = dir.path().join("jit-7.dump");
            std::fs::write(&p, &d[..cut]).unwrap();
            let plain = Reader::new(&d[..cut]).map(entries);
            let ahead = Reader::read_ahead(std::fs::File::open(&p).unwrap()).map(entries);
            assert_eq!(plain, ahead, "cut at {cut}");
            if cut == d.len() {
                assert_eq!(plain.unwrap().0.len(), 400);
            }
        }
        // A record ending exactly at a block's end; one starting exactly a room's
        // length before it and running past it.
        for first_end in [256 << 10, 192 << 10] {
            let mut e = header(7);
            let pad = first_end - e.len() - (16 + 40 + 1 + 1);
            e.extend(load(1, 0x1000, "a", &vec![0x90; pad]));
            assert_eq!(e.len(), first_end);
            e.extend(load(2, 0x2000, "b", &vec![0xc3; 100 << 10]));
            e.extend(load(3, 0x3000, "c", &[0xc3]));
            let p = dir.path().join("jit-8.dump");
            std::fs::write(&p, &e).unwrap();
            let plain = Reader::new(&e[..]).map(entries);
            let ahead = Reader::read_ahead(std::fs::File::open(&p).unwrap()).map(entries);
            assert_eq!(plain, ahead, "first record ends at {first_end}");
            assert_eq!(plain.unwrap().0.len(), 3);
        }
    }

    #[test]
    fn marker_names() {
        assert_eq!(marker_pid(b"/tmp/jit-123.dump"), Some(123));
        assert_eq!(marker_pid(b"jit-1.dump"), Some(1));
        assert_eq!(marker_pid(b"/tmp/jit-.dump"), None);
        assert_eq!(marker_pid(b"/tmp/jit-12x.dump"), None);
        assert_eq!(marker_pid(b"/tmp/xjit-12.dump"), None);
    }
}
