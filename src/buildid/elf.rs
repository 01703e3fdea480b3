//! Reading build IDs from ELF files and raw note streams, and proving that a file on
//! disk is the one a recording mapped.

use crate::format::feature::BuildId;
use crate::format::record::FileIdent;
use object::{Object, ObjectSegment};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file gives no ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The file changed since the recording (other inode/device/generation, modified).
    Stale,
    /// The path was mapped from two different files during the recording.
    Ambiguous,
    /// No file at the path.
    Missing,
    /// The file exists but cannot be read.
    Unreadable,
    /// The file has no build-ID note.
    NoNote,
    /// The recording was made on another host or kernel; no local file is trusted.
    OtherHost,
    /// Not a regular file.
    NotRegular,
    /// Nothing says when the recording was made (a replayed stream), so no local file
    /// can be shown unchanged since.
    Undated,
    /// The mapping was of a file already deleted at recording time.
    Deleted,
    /// Something pdinject does not handle (said in the detail).
    Unsupported,
}

/// A failed proof: the reason and a sentence for the user.
pub type Refusal = (Reason, String);

/// What the recording says about when it ran (wall-clock ns since the epoch).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordingTimes {
    /// Earliest moment the samples may have been taken; files modified after it are stale.
    pub start_ns: Option<i128>,
}

/// Reads the GNU build ID of an ELF image in memory.
pub fn build_id_of_image(data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let f = object::File::parse(data).map_err(|e| e.to_string())?;
    f.build_id()
        .map(|o| o.map(|b| b.to_vec()))
        .map_err(|e| e.to_string())
}

/// Finds the NT_GNU_BUILD_ID note in a raw note stream (`/sys/kernel/notes`,
/// `/sys/module/*/notes/.note.gnu.build-id`), written in the host's byte order.
pub fn build_id_from_notes(data: &[u8]) -> Option<BuildId> {
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

/// Filesystems whose stat() device differs from the device in mmap records.
fn device_may_differ(fd: &File) -> bool {
    use std::os::fd::AsRawFd;
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
    // SAFETY: statfs is a plain struct; fstatfs writes it fully on success.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    let t = st.f_type as i64;
    t == OVERLAYFS_SUPER_MAGIC || t == BTRFS_SUPER_MAGIC
}

/// The inode generation (ext4 and others answer FS_IOC_GETVERSION), if available.
fn generation(fd: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    const FS_IOC_GETVERSION: libc::c_ulong = 0x8008_7601;
    let mut g: libc::c_long = 0;
    // SAFETY: the ioctl writes one long into `g`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_GETVERSION as _, &mut g) };
    (r == 0).then_some(g as u32 as u64)
}

fn fmt_time(ns: i128) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    format!("{secs}.{:09}", ns.rem_euclid(1_000_000_000))
}

/// A local file proven to be the one a recording mapped, still open (so what is read
/// next comes from the file that was checked, not whatever the path names later).
pub struct Proven {
    /// Its build ID.
    pub build_id: BuildId,
    /// The open file.
    pub file: File,
    /// `(st_dev, st_ino)`: the same file reached by two paths is the same key.
    pub key: (u64, u64),
}

/// Opens `path` and proves it is the file the recording mapped, then reads its ID.
///
/// Evidence, strongest first: inode (and generation when both sides know it) and
/// device equal to the record's; not modified since the recording started; a PT_LOAD
/// segment at each recorded executable file offset. ctime alone does not make a file
/// stale when the file has other hard links (perf hard-links every hit DSO into
/// ~/.debug, which moves libc's ctime after every recording).
pub fn prove_and_read(
    path: &Path,
    ident: &FileIdent,
    exec_pgoffs: &[u64],
    times: &RecordingTimes,
) -> Result<Proven, Refusal> {
    if let Some(r) = super::memo::lookup(path, ident, exec_pgoffs, times) {
        return r;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => (Reason::Missing, "no file at this path".to_string()),
            _ => (Reason::Unreadable, e.to_string()),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| (Reason::Unreadable, e.to_string()))?;
    if !meta.is_file() {
        return Err((Reason::NotRegular, "not a regular file".into()));
    }
    if let FileIdent::Inode {
        maj,
        min,
        ino,
        generation: gen_rec,
    } = *ident
    {
        let (dmaj, dmin) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        if meta.ino() != ino {
            return Err((
                Reason::Stale,
                format!(
                    "the file at this path is another file (inode {} on {dmaj}:{dmin}; the recording mapped inode {ino} on {maj}:{min})",
                    meta.ino()
                ),
            ));
        }
        if (dmaj, dmin) != (maj, min) && !device_may_differ(&file) {
            return Err((
                Reason::Stale,
                format!(
                    "the file is on device {dmaj}:{dmin}, the recording mapped device {maj}:{min}"
                ),
            ));
        }
        if gen_rec != 0
            && let Some(g) = generation(&file)
            && g != gen_rec
        {
            return Err((
                Reason::Stale,
                format!("inode {ino} was reused (generation {g}, recorded {gen_rec})"),
            ));
        }
    }
    if let Some(start) = times.start_ns {
        let mtime = meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128;
        let ctime = meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128;
        if mtime > start {
            return Err((
                Reason::Stale,
                format!(
                    "modified at {} s, after the recording started ({} s)",
                    fmt_time(mtime),
                    fmt_time(start)
                ),
            ));
        }
        if ctime > start && meta.nlink() <= 1 {
            return Err((
                Reason::Stale,
                format!(
                    "changed at {} s (ctime), after the recording started ({} s), with an older mtime: rewritten with its times set back?",
                    fmt_time(ctime),
                    fmt_time(start)
                ),
            ));
        }
    }
    let key = (meta.dev(), meta.ino());
    let cache = object::read::ReadCache::new(&file);
    let obj = object::File::parse(&cache)
        .map_err(|e| (Reason::Unsupported, format!("not a readable ELF file: {e}")))?;
    if !exec_pgoffs.is_empty() {
        // A mapping's offset is its segment's offset rounded down to the page size
        // (4 KiB to 64 KiB).
        let offs: Vec<u64> = obj.segments().map(|s| s.file_range().0).collect();
        if !offs.is_empty() {
            for &pg in exec_pgoffs {
                if !offs.iter().any(|&o| o >= pg && o - pg < 64 << 10) {
                    return Err((
                        Reason::Stale,
                        format!(
                            "no loadable segment at the recorded file offset {pg:#x}: the layout differs"
                        ),
                    ));
                }
            }
        }
    }
    let build_id = match obj.build_id() {
        Ok(Some(raw)) => id_from_bytes(raw)?,
        Ok(None) => return Err((Reason::NoNote, "the ELF file has no build-ID note".into())),
        Err(e) => return Err((Reason::Unsupported, format!("cannot read the notes: {e}"))),
    };
    drop(obj);
    drop(cache);
    Ok(Proven {
        build_id,
        file,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
