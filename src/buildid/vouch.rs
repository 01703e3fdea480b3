//! What may excuse a ctime that moved after a recording started (docs/guarantees.md,
//! "Never a wrong build ID").
//!
//! A file whose ctime is after the recording's start while its mtime is older was
//! linked, unlinked, renamed, chmod'ed or chown'ed since, or rewritten in place with
//! its times set back (`cp -p`, `rsync --inplace -t`, `cat new > f; touch -r old f`).
//! The inode keeps no other trace, and a rebuild from the same sources can keep every
//! code segment in the same pages (only the build-ID note differs), so nothing the
//! file or the recording holds tells the two apart. What can is a record made
//! elsewhere that a rewrite cannot forge, each giving a time since which the file's
//! bytes are known to be the ones they are now (a [`Voucher`]):
//!
//! * the package manager's: the file is byte for byte what dpkg installed
//!   (`ADMINDIR/info/PKG.md5sums`), and that package was unpacked before the
//!   recording started (see [`dpkg_voucher`] for which time says so);
//! * pdinject's own, kept with the build-ID cache: when it hard-links a proven file
//!   into the cache it appends a line (device, inode, the ID, the ctime seen before
//!   the link, the ctime the link left) to `CACHE/.pdinject-links`; a file that
//!   still has the ctime that link left has not changed since, and was what it is
//!   from the ctime seen before it (see [`record_link`]).
//!
//! `--trust-same-layout` ([`Vouchers::same_layout`]) restores the rule that took a
//! file whose code pages are laid out as recorded; it is off by default, because a
//! same-layout rebuild written over the file passes it.
//!
//! Everything here is read lazily, at most once per process (per admindir, per cache
//! directory), and only when a proof needs an excuse; the answer for a file is kept
//! per file state (device, inode, size, mtime, ctime), so an MD5 is computed once.

pub(crate) use super::proof::{CtimeEvidence, Voucher};
use crate::format::buildid::BuildId;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// dpkg's own default database (`dpkg --admindir`).
pub const DPKG_ADMINDIR: &str = "/var/lib/dpkg";

/// The name of pdinject's link record inside a build-ID cache directory.
pub(crate) const LINK_LOG: &str = ".pdinject-links";

/// Where the excuses for a moved ctime may come from: part of a run's options.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Vouchers {
    /// dpkg's database (`--dpkg-admindir`; default [`DPKG_ADMINDIR`]); `None`: not read.
    pub dpkg: Option<PathBuf>,
    /// The build-ID cache whose link record ([`LINK_LOG`]) is read (the run's cache,
    /// `-N` or not); `None`: none.
    pub cache: Option<PathBuf>,
    /// `--trust-same-layout`: a file whose recorded executable mappings are exactly
    /// its segments is taken as unchanged whatever its ctime (a same-layout rebuild
    /// written over it with its times set back passes too).
    pub same_layout: bool,
    /// Whether a file dpkg vouched for is noted in the link record, so that a later
    /// run takes it from there while its ctime stays, without reading it again.
    pub remember: Remember,
}

/// Whether what dpkg vouched for is noted in the cache's link record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Remember {
    /// Nothing is written (`-N`: the run writes nothing into the cache).
    #[default]
    Nothing,
    /// A line per file dpkg vouched for (its MD5 is the cost: 90 MB of libraries
    /// hashed is 450 M instructions, where a run is 40 M).
    InLinkRecord,
}

impl Default for Vouchers {
    fn default() -> Self {
        Vouchers {
            dpkg: Some(PathBuf::from(DPKG_ADMINDIR)),
            cache: None,
            same_layout: false,
            remember: Remember::Nothing,
        }
    }
}

impl Vouchers {
    /// None at all: no package database, no cache record, no opt-in.
    pub(crate) fn none() -> Vouchers {
        Vouchers {
            dpkg: None,
            cache: None,
            same_layout: false,
            remember: Remember::Nothing,
        }
    }
}

impl Vouchers {
    /// The evidence for the open `file` (`meta` its fstat, `id` the ID its note
    /// gives, if any), found at `path`. Looked up only when a proof needs it (its
    /// ctime is after a recording's start); kept per file state.
    pub(crate) fn evidence(
        &self,
        file: &File,
        meta: &std::fs::Metadata,
        path: &Path,
        id: Option<BuildId>,
    ) -> CtimeEvidence {
        type Key = (Vouchers, u64, u64, u64, i128, i128, Option<BuildId>);
        static KEPT: OnceLock<Mutex<HashMap<Key, Option<Voucher>>>> = OnceLock::new();
        let key: Key = (
            self.clone(),
            meta.dev(),
            meta.ino(),
            meta.len(),
            ns(meta.mtime(), meta.mtime_nsec()),
            ns(meta.ctime(), meta.ctime_nsec()),
            id,
        );
        let kept = KEPT.get_or_init(Default::default);
        let known = kept.lock().ok().and_then(|m| m.get(&key).cloned());
        let voucher = match known {
            Some(v) => v,
            None => {
                let v = self.find(file, meta, path, id);
                // Only what the link record says can change within a process, and
                // only by a link, which moves the ctime: a new key.
                if let Ok(mut m) = kept.lock() {
                    m.insert(key, v.clone());
                }
                v
            }
        };
        CtimeEvidence {
            voucher,
            same_layout: self.same_layout,
        }
    }

    fn find(
        &self,
        file: &File,
        meta: &std::fs::Metadata,
        path: &Path,
        id: Option<BuildId>,
    ) -> Option<Voucher> {
        // The database asked about this path, if any: only its own notes stand for it.
        let admin = self.dpkg.as_deref().filter(|a| dpkg_may_list(a, path));
        let db = admin.map(db_tag);
        // The cheaper first: a line of the link record needs no reading of the file.
        let linked = match (&self.cache, id) {
            (Some(dir), Some(id)) => LinkLog::for_cache(dir).voucher(meta, id, db),
            _ => None,
        };
        // A line noting dpkg's word gives dpkg's time already: the file is not read
        // again (its MD5 is what the line saves).
        let linked = match linked {
            Some((v, DpkgNoted::Yes)) => return Some(v),
            other => other.map(|(v, _)| v),
        };
        let packaged = || {
            let admin = admin?;
            let v = dpkg_voucher(admin, file, meta, path)?;
            if let (Remember::InLinkRecord, Some(dir), Some(id)) = (self.remember, &self.cache, id)
            {
                LinkLog::for_cache(dir).note_checked(meta, id, v.since, db_tag(admin));
            }
            Some(v)
        };
        // The earlier of the two proves the most recordings.
        match (linked, packaged()) {
            (Some(a), Some(b)) => Some(if a.since <= b.since { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

fn ns(s: i64, n: i64) -> i128 {
    s as i128 * 1_000_000_000 + n as i128
}

fn ctime_of(m: &std::fs::Metadata) -> i128 {
    ns(m.ctime(), m.ctime_nsec())
}

/// Seconds with nanoseconds, as the proof's words print times.
fn secs(t: i128) -> String {
    format!(
        "{}.{:09}",
        t.div_euclid(1_000_000_000),
        t.rem_euclid(1_000_000_000)
    )
}

// ---------------------------------------------------------------------------
// dpkg

/// Every `info/*.md5sums` of one dpkg database, indexed by the hash of each listed
/// file's name: `(hash, package)` pairs, sorted. A lookup reads the few packages
/// that list the name again. A Debian system lists some 90,000 files in 3,000
/// packages: this is about 1 MB and a quick parallel read, where keeping every line
/// was 30 MB and a noticeable part of a short run.
#[derive(Default)]
struct DpkgIndex {
    packages: Vec<String>,
    by_name: Vec<(u64, u32)>,
}

/// FNV-1a of a file name (the index's key; a collision only reads a package more).
fn name_hash(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The index of `admindir`, read once per process.
fn dpkg_index(admindir: &Path) -> Arc<DpkgIndex> {
    type Cell = Arc<OnceLock<Arc<DpkgIndex>>>;
    static INDEXES: OnceLock<Mutex<HashMap<PathBuf, Cell>>> = OnceLock::new();
    let cell = {
        let mut all = match INDEXES.get_or_init(Default::default).lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        all.entry(admindir.to_path_buf()).or_default().clone()
    };
    cell.get_or_init(|| Arc::new(read_dpkg(admindir))).clone()
}

/// A package's `.md5sums`, if it is not over the limit.
fn read_md5sums(path: &Path) -> Option<Vec<u8>> {
    // Limits policy: a package's list of digests is kilobytes (libc6's 3 KB, the
    // largest here 1.3 MB); a larger one is not read.
    let m = std::fs::metadata(path).ok()?;
    if m.len() > crate::limits::MAX_DPKG_MD5SUMS {
        return None;
    }
    std::fs::read(path).ok()
}

/// The lines of an `.md5sums`: `(md5 in hex, path relative to /)`. The hex is decoded
/// only for a line whose name is asked for: decoding every line while indexing was
/// 290 M of the 366 M instructions of `--buildid-all` on fp-med (768 packages).
fn md5sums_lines(text: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut at = 0;
    let lines = memchr::memchr_iter(b'\n', text)
        .chain(std::iter::once(text.len()))
        .map(move |end| {
            let line = text.get(at..end).unwrap_or_default();
            at = end + 1;
            line
        });
    lines.filter_map(|line| {
        // "d41d8cd98f00b204e9800998ecf8427e  usr/lib/x/libfoo.so.1"
        let (hex, rest) = line.split_at_checked(32)?;
        let rel = rest.trim_ascii_start();
        Some((hex, rel.strip_prefix(b"/").unwrap_or(rel)))
    })
}

fn base_name(rel: &[u8]) -> Option<&[u8]> {
    let name = memchr::memrchr(b'/', rel).map_or(rel, |i| &rel[i + 1..]);
    (!name.is_empty()).then_some(name)
}

fn read_dpkg(admindir: &Path) -> DpkgIndex {
    use rayon::prelude::*;
    let mut ix = DpkgIndex::default();
    let Ok(list) = std::fs::read_dir(admindir.join("info")) else {
        return ix;
    };
    let mut files: Vec<(String, PathBuf)> = list
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let pkg = name.to_str()?.strip_suffix(".md5sums")?.to_string();
            Some((pkg, e.path()))
        })
        .collect();
    files.sort();
    // Read on the run's pool (a few thousand small files).
    let names: Vec<Vec<u64>> = files
        .par_iter()
        .map(|(_, p)| {
            read_md5sums(p).map_or_else(Vec::new, |text| {
                md5sums_lines(&text)
                    .filter_map(|(_, rel)| Some(name_hash(base_name(rel)?)))
                    .collect()
            })
        })
        .collect();
    for ((pkg, _), hashes) in files.into_iter().zip(names) {
        let Ok(i) = u32::try_from(ix.packages.len()) else {
            break;
        };
        ix.packages.push(pkg);
        ix.by_name.extend(hashes.into_iter().map(|h| (h, i)));
    }
    ix.by_name.sort_unstable();
    ix.by_name.dedup();
    ix
}

/// Whether the system's dpkg may list `path`: Debian's packages install under
/// these directories only (policy 9.1: never /home, /root, /tmp, /usr/local, /srv),
/// so a ctime-moved file elsewhere (a user's own build, a pyenv library) does not cost
/// the database's read (20 ms a run). Another admindir (a chroot's, a test's) is
/// always asked.
fn dpkg_may_list(admindir: &Path, path: &Path) -> bool {
    // /opt: packages from outside Debian install there, and dpkg lists them.
    const SYSTEM: [&str; 11] = [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/etc", "/boot",
        "/var",
    ];
    let system = |p: &Path| SYSTEM.iter().any(|d| p.starts_with(d)) && !p.starts_with("/usr/local");
    admindir != Path::new(DPKG_ADMINDIR)
        || system(path)
        || std::fs::canonicalize(path).is_ok_and(|c| system(&c))
}

fn unhex16(hex: &[u8]) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    hex::decode_to_slice(hex, &mut out).ok()?;
    Some(out)
}

/// The MD5 of an open file's bytes, read at explicit offsets.
fn md5_of(file: &File, len: u64) -> Option<[u8; 16]> {
    use md5::Digest;
    let mut h = md5::Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        match file.read_at(&mut buf, off) {
            Ok(0) => return None,
            Ok(n) => {
                h.update(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(h.finalize().into())
}

/// dpkg's word for `file` (found at `path`): a voucher when a package lists a path
/// naming this very file (device and inode: `/lib` and `/usr/lib` are one directory
/// on a merged /usr, and dpkg lists either) with this file's MD5.
///
/// Since when: the time dpkg wrote the package's `info/PKG.list`, the later of its
/// mtime and ctime. dpkg writes that list itself, as a new file renamed into place,
/// when it unpacks the package, after the package's files are in place and the old
/// version's are gone (`process_archive`: "now we can write the updated
/// files-in-this package list"), and again whenever the package's list changes; so
/// it is never older than the files it lists. `PKG.md5sums` is no such time: it is
/// unpacked from the package's control archive with the package build's mtime
/// (checked on this machine: libc6's md5sums has the mtime of libc.so.6 itself). A
/// ctime cannot be set back; an mtime can, and the later of the two is used.
fn dpkg_voucher(
    admindir: &Path,
    file: &File,
    meta: &std::fs::Metadata,
    path: &Path,
) -> Option<Voucher> {
    let ix = dpkg_index(admindir);
    let mut names: Vec<Vec<u8>> = Vec::new();
    for p in [Some(path.to_path_buf()), std::fs::canonicalize(path).ok()]
        .into_iter()
        .flatten()
    {
        if let Some(n) = p.file_name().map(|n| n.as_bytes().to_vec())
            && !names.contains(&n)
        {
            names.push(n);
        }
    }
    let mut md5 = None;
    for n in names {
        let h = name_hash(&n);
        let first = ix.by_name.partition_point(|&(x, _)| x < h);
        for &(_, package) in ix.by_name[first..].iter().take_while(|&&(x, _)| x == h) {
            let Some(pkg) = ix.packages.get(package as usize) else {
                continue;
            };
            let sums = admindir.join("info").join(format!("{pkg}.md5sums"));
            let Some(text) = read_md5sums(&sums) else {
                continue;
            };
            for (hex, rel) in md5sums_lines(&text) {
                if base_name(rel) != Some(n.as_slice()) {
                    continue;
                }
                let Some(listed) = unhex16(hex) else {
                    continue;
                };
                let path = Path::new("/").join(std::ffi::OsStr::from_bytes(rel));
                let same = std::fs::metadata(&path)
                    .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()));
                if !same {
                    continue;
                }
                let sum = *md5.get_or_insert_with(|| md5_of(file, meta.len()));
                if sum != Some(listed) {
                    continue;
                }
                let list = admindir.join("info").join(format!("{pkg}.list"));
                let Ok(lm) = std::fs::metadata(&list) else {
                    continue;
                };
                let since = ns(lm.mtime(), lm.mtime_nsec()).max(ctime_of(&lm));
                return Some(Voucher {
                    since,
                    what: format!(
                        "dpkg lists {} with these bytes in package {pkg}, unpacked by {} s ({})",
                        path.display(),
                        secs(since),
                        list.display()
                    ),
                });
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------
// pdinject's link record

/// One line of a cache's link record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LinkRecord {
    /// What the line says happened between the two ctimes.
    kind: LinkKind,
    id: BuildId,
    /// The file's ctime before pdinject's link.
    before: i128,
    /// The ctime pdinject's link (and the renames and removals of its temporary
    /// names) left.
    after: i128,
}

/// What a line of the link record stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkKind {
    /// `v1`: pdinject's link into the cache, the only change between the two ctimes.
    Link,
    /// `d1`: the file's MD5 was the one dpkg database `db` ([`db_tag`]) lists when its
    /// ctime was the second one (or pdinject's link of it since left that ctime), and
    /// that database says it was unpacked by the first (its package list's time): a
    /// later run that asks the same database, whose file still has that ctime, takes
    /// it without reading it again. No other run takes it.
    Dpkg { db: u64 },
}

/// Names a dpkg database in the link record: FNV-1a of its canonical path (a
/// collision would only let another database's note stand, both vouching by digest).
fn db_tag(admindir: &Path) -> u64 {
    let p = std::fs::canonicalize(admindir).unwrap_or_else(|_| admindir.to_path_buf());
    name_hash(p.as_os_str().as_bytes())
}

/// Whether a line of the link record gives dpkg's word for a file state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DpkgNoted {
    Yes,
    No,
}

/// A link record's lines by `(st_dev, st_ino)`.
type Links = HashMap<(u64, u64), Vec<LinkRecord>>;

/// The link record of one cache directory: the file, and its lines by
/// `(st_dev, st_ino)`, read on first use and kept up to date with this process's
/// own links.
struct LinkLog {
    path: PathBuf,
    /// The lines read so far, and how many bytes of the file they came from.
    lines: Mutex<Option<(Links, u64)>>,
}

impl LinkLog {
    /// The one log of `dir` in this process (a batch's runs share it, so a later
    /// input sees the links an earlier one made).
    fn for_cache(dir: &Path) -> Arc<LinkLog> {
        static LOGS: OnceLock<Mutex<HashMap<PathBuf, Arc<LinkLog>>>> = OnceLock::new();
        let mut all = match LOGS.get_or_init(Default::default).lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        all.entry(dir.to_path_buf())
            .or_insert_with(|| {
                Arc::new(LinkLog {
                    path: dir.join(LINK_LOG),
                    lines: Mutex::new(None),
                })
            })
            .clone()
    }

    /// The lines, read from the file the first time.
    fn lines(&self) -> std::sync::MutexGuard<'_, Option<(Links, u64)>> {
        let mut g = match self.lines.lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        if g.is_none() {
            *g = Some(read_links(&self.path, 0));
        }
        g
    }

    /// The voucher of the lines that speak for this very ctime, and whether the word
    /// of dpkg database `db` (the one this run asks, if any) is among them: then dpkg
    /// has nothing earlier to give. Another database's lines are not taken.
    fn voucher(
        &self,
        meta: &std::fs::Metadata,
        id: BuildId,
        db: Option<u64>,
    ) -> Option<(Voucher, DpkgNoted)> {
        let mut g = self.lines();
        let ctime = ctime_of(meta);
        let key = (meta.dev(), meta.ino());
        let find = |links: &Links| {
            let lines = || {
                links
                    .get(&key)
                    .into_iter()
                    .flatten()
                    .filter(|r| r.after == ctime && r.id == id)
                    .filter(|r| match r.kind {
                        LinkKind::Link => true,
                        LinkKind::Dpkg { db: of } => Some(of) == db,
                    })
            };
            // The earliest "before" of the lines that left this very ctime.
            let r = lines().min_by_key(|r| r.before).copied()?;
            let dpkg = match lines().any(|r| r.kind != LinkKind::Link) {
                true => DpkgNoted::Yes,
                false => DpkgNoted::No,
            };
            Some((r, dpkg))
        };
        let (links, read) = g.as_mut()?;
        let (r, dpkg) = match find(links) {
            Some(found) => found,
            None => {
                // Another process (a batch's other shard, a concurrent run) may have
                // linked it since the record was read: read what it appended.
                let (more, len) = read_links(&self.path, *read);
                for (k, v) in more {
                    links.entry(k).or_default().extend(v);
                }
                *read = len.max(*read);
                find(links)?
            }
        };
        let what = match r.kind {
            LinkKind::Link => format!(
                "pdinject's link of it into the build-ID cache ({}) found it unchanged since {} s",
                self.path.display(),
                secs(r.before)
            ),
            LinkKind::Dpkg { .. } => format!(
                "an earlier run found these bytes to be dpkg's (the package unpacked by {} s), and the file's ctime has not moved since but by pdinject's links ({})",
                secs(r.before),
                self.path.display()
            ),
        };
        Some((
            Voucher {
                since: r.before,
                what,
            },
            dpkg,
        ))
    }

    /// Notes that the file `meta` describes (its note giving `id`) had dpkg's bytes
    /// with this ctime, unpacked by `since`; appended under the record's lock in one
    /// write, as [`record_link`] does. A record that cannot be written only costs the
    /// next run a digest.
    fn note_checked(&self, meta: &std::fs::Metadata, id: BuildId, since: i128, db: u64) {
        let rec = LinkRecord {
            kind: LinkKind::Dpkg { db },
            id,
            before: since,
            after: ctime_of(meta),
        };
        if rec.after <= rec.before {
            return;
        }
        let key = (meta.dev(), meta.ino());
        let mut g = self.lines();
        if let Some((m, _)) = g.as_mut() {
            if m.get(&key).is_some_and(|v| v.contains(&rec)) {
                return;
            }
            m.entry(key).or_default().push(rec);
        }
        let Some(f) = open_to_append(&self.path) else {
            return;
        };
        let _exclusive = Flock::new(&f, libc::LOCK_EX);
        let _ = (&f).write_all(format_link(key.0, key.1, &rec).as_bytes());
    }
}

/// The lines of the record at `path` from byte `from` on (0: all of it), and how
/// far the whole lines read reach.
fn read_links(path: &Path, from: u64) -> (Links, u64) {
    let mut map = Links::new();
    let Ok(f) = File::open(path) else {
        return (map, from);
    };
    // A link another process is making holds the record's lock from before the link
    // to after its line is written: a file whose ctime that link moved is read with
    // its line (see [`record_link`]).
    let _shared = Flock::new(&f, libc::LOCK_SH);
    let len = f.metadata().map_or(0, |m| m.len());
    // Limits policy: one line (about 100 bytes) per file pdinject ever linked into
    // this cache; a record past the limit is read from its newest end.
    let start = from.max(len.saturating_sub(crate::limits::MAX_LINK_LOG));
    let want = usize::try_from(len.saturating_sub(start)).unwrap_or(0);
    let mut buf = vec![0u8; want];
    if f.read_exact_at(&mut buf, start).is_err() {
        return (map, from);
    }
    // Only whole lines: a line being appended is read next time.
    let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut lines = buf[..whole].split(|&b| b == b'\n');
    if start > from {
        // The first line is cut.
        lines.next();
    }
    for line in lines {
        if let Some((k, r)) = parse_link(line) {
            map.entry(k).or_default().push(r);
        }
    }
    (map, start + whole as u64)
}

/// `v1 DEV INO ID BEFORE AFTER` (decimal device and inode numbers, the ID in hex,
/// both times in ns since the epoch); `d1 ... DB` for [`LinkKind::Dpkg`] (DB in hex;
/// pdinject before it skips those lines).
fn parse_link(line: &[u8]) -> Option<((u64, u64), LinkRecord)> {
    let s = std::str::from_utf8(line).ok()?;
    let mut w = s.split_ascii_whitespace();
    let dpkg = match w.next()? {
        "v1" => false,
        "d1" => true,
        _ => return None,
    };
    let dev = w.next()?.parse().ok()?;
    let ino = w.next()?.parse().ok()?;
    let id = BuildId::from_hex(w.next()?)?;
    let before = w.next()?.parse().ok()?;
    let after = w.next()?.parse().ok()?;
    let kind = match dpkg {
        false => LinkKind::Link,
        true => LinkKind::Dpkg {
            db: u64::from_str_radix(w.next()?, 16).ok()?,
        },
    };
    if w.next().is_some() || after <= before {
        return None;
    }
    Some((
        (dev, ino),
        LinkRecord {
            kind,
            id,
            before,
            after,
        },
    ))
}

fn format_link(dev: u64, ino: u64, r: &LinkRecord) -> String {
    let (id, before, after) = (r.id, r.before, r.after);
    match r.kind {
        LinkKind::Link => format!("v1 {dev} {ino} {id} {before} {after}\n"),
        LinkKind::Dpkg { db } => format!("d1 {dev} {ino} {id} {before} {after} {db:016x}\n"),
    }
}

/// Runs `link`, which hard-links the open `file` (whose note carries `id`) into the
/// build-ID cache `dir`, and records the link: the ctime before it and the one it
/// left. Every link into one cache is made under one lock of this process, so a
/// proof here that sees the new ctime finds the record too.
///
/// What the record claims: between the two ctimes the file changed only by this
/// link. That holds unless another process rewrote the file within the same
/// instants (between the first fstat and the second, a few system calls); and a
/// file whose ctime later equals the one recorded has not changed since, unless a
/// change fell within the same clock tick as the link (the kernel's ctime clock is
/// coarse). The note is read again after the link, so the record never names an ID
/// the file does not carry.
pub(crate) fn record_link<T>(
    dir: &Path,
    file: &File,
    id: BuildId,
    link: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    let log = LinkLog::for_cache(dir);
    let mut g = log.lines();
    // The record itself, locked from before the link until its line is written, so
    // another process that sees the ctime this link leaves reads the line too. A
    // record that cannot be opened only makes a later proof stricter.
    let rec_file = open_to_append(&log.path);
    let _exclusive = rec_file.as_ref().map(|f| Flock::new(f, libc::LOCK_EX));
    let Ok(before) = file.metadata() else {
        return link();
    };
    let r = link()?;
    let Ok(after) = file.metadata() else {
        return Ok(r);
    };
    let moved = (after.dev(), after.ino()) == (before.dev(), before.ino())
        && ctime_of(&after) > ctime_of(&before);
    if moved && super::elf_read::read_build_id(file).ok() == Some(id) {
        // The lines that vouched for the file as it was before the link (an earlier
        // link's, dpkg's word a proof just noted) still do after it: the link moved no
        // byte. Carried over, the next run finds them for the ctime the link left.
        let pre = ctime_of(&before);
        let mut vouched: Vec<LinkRecord> = g
            .as_ref()
            .and_then(|(m, _)| m.get(&(before.dev(), before.ino())))
            .map(|lines| {
                lines
                    .iter()
                    .filter(|r| r.after == pre && r.id == id && r.before < pre)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        vouched.sort_by_key(|r| r.before);
        let after = ctime_of(&after);
        // This link's own line, from the earliest an earlier link vouched (every
        // reader takes it, older pdinject too); then each database's word, once.
        let mut recs = vec![LinkRecord {
            kind: LinkKind::Link,
            id,
            before: vouched
                .iter()
                .find(|r| r.kind == LinkKind::Link)
                .map_or(pre, |r| r.before),
            after,
        }];
        for r in vouched {
            if !recs.iter().any(|x| x.kind == r.kind) {
                recs.push(LinkRecord { after, ..r });
            }
        }
        // Short lines in one write with O_APPEND: the writes of several processes
        // never interleave. A record that cannot be written only makes a later proof
        // stricter.
        let key = (before.dev(), before.ino());
        let text: String = recs.iter().map(|r| format_link(key.0, key.1, r)).collect();
        if let Some(mut f) = rec_file.as_ref() {
            let _ = f.write_all(text.as_bytes());
        }
        if let Some((m, _)) = g.as_mut() {
            m.entry(key).or_default().extend(recs);
        }
    }
    Ok(r)
}

/// The link record at `path`, opened to append (made if missing).
fn open_to_append(path: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)
        .ok()
}

/// An advisory lock (flock) on an open file, released when dropped. Where the
/// filesystem has none, nothing is locked (a proof may then miss a line another
/// process is writing, and refuse: stricter, never wrong).
struct Flock<'f>(&'f File);

impl<'f> Flock<'f> {
    fn new(f: &'f File, how: libc::c_int) -> Flock<'f> {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this process owns; an error leaves it
        // unlocked, which the caller tolerates.
        unsafe {
            while libc::flock(f.as_raw_fd(), how) != 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
        }
        Flock(f)
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in `new`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5sums_lines_give_names_and_hex_decodes_only_digests() {
        let text = b"0123456789abcdef0123456789ABCDEF  usr/lib/libx.so.1\n\
                     short\n\
                     0123456789abcdef0123456789abcdeg  /lib/liby.so\n\
                     0123456789abcdef0123456789abcdef  usr/bin/z";
        let lines: Vec<_> = md5sums_lines(text).collect();
        let names: Vec<_> = lines.iter().map(|(_, rel)| base_name(rel)).collect();
        assert_eq!(
            names,
            [
                Some(&b"libx.so.1"[..]),
                Some(&b"liby.so"[..]),
                Some(&b"z"[..])
            ]
        );
        assert_eq!(lines[1].1, b"lib/liby.so");
        let want = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(unhex16(lines[0].0), Some(want));
        assert_eq!(unhex16(lines[2].0), Some(want));
        // Not a digest: a letter past f, or the wrong length.
        assert_eq!(unhex16(lines[1].0), None);
        assert_eq!(unhex16(b"0123"), None);
        assert_eq!(base_name(b"usr/lib/"), None);
    }

    #[test]
    fn link_lines_round_trip_and_junk_is_skipped() {
        let id = BuildId::from_hex("11223344556677889900aabbccddeeff").unwrap();
        let r = LinkRecord {
            kind: LinkKind::Link,
            id,
            before: 1_700_000_000_123_456_789,
            after: 1_700_000_001_000_000_000,
        };
        let line = format_link(2049, 77, &r);
        assert_eq!(
            parse_link(line.trim_end().as_bytes()),
            Some(((2049, 77), r))
        );
        let d = LinkRecord {
            kind: LinkKind::Dpkg { db: 0xabc },
            ..r
        };
        let line = format_link(2049, 77, &d);
        assert!(
            line.starts_with("d1 2049 77 ") && line.ends_with(" 0000000000000abc\n"),
            "{line}"
        );
        assert_eq!(
            parse_link(line.trim_end().as_bytes()),
            Some(((2049, 77), d))
        );
        for bad in [
            "",
            "v2 1 2 aa 1 2",
            "v1 1 2 zz 1 2",
            "v1 1 2 aa 2 1",
            "v1 1 2 aa 1 2 3",
            "v1 x 2 aa 1 2",
        ] {
            assert_eq!(parse_link(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn a_link_is_recorded_and_vouches_for_the_ctime_it_left() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        let exe = File::open("/proc/self/exe").unwrap();
        let Ok(id) = super::super::elf_read::read_build_id(&exe) else {
            return; // a test binary linked without a build ID
        };
        // A copy of this test binary (its ID, a file of the test's own).
        let lib = d.path().join("lib.so");
        std::fs::copy("/proc/self/exe", &lib).unwrap();
        let f = File::open(&lib).unwrap();
        let before = f.metadata().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let linked = cache.join("elf");
        record_link(&cache, &f, id, || {
            std::fs::hard_link(&lib, &linked).map_err(|e| e.to_string())
        })
        .unwrap();
        let after = f.metadata().unwrap();
        assert!(ctime_of(&after) > ctime_of(&before));
        let text = std::fs::read_to_string(cache.join(LINK_LOG)).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v = Vouchers {
            dpkg: None,
            cache: Some(cache.clone()),
            same_layout: false,
            remember: Remember::Nothing,
        };
        let e = v.evidence(&f, &after, &lib, Some(id));
        assert_eq!(e.voucher.map(|v| v.since), Some(ctime_of(&before)));
        // Another ID, or a ctime moved again: no voucher.
        let other = BuildId::from_hex("abcdef").unwrap();
        assert!(v.evidence(&f, &after, &lib, Some(other)).voucher.is_none());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::remove_file(&linked).unwrap();
        let moved = f.metadata().unwrap();
        assert!(v.evidence(&f, &moved, &lib, Some(id)).voucher.is_none());
        // A fresh read of the file (another process) finds the same line.
        let (fresh, len) = read_links(&cache.join(LINK_LOG), 0);
        assert_eq!(fresh.values().flatten().count(), 1);
        assert_eq!(len, text.len() as u64);
        assert!(read_links(&cache.join(LINK_LOG), len).0.is_empty());
    }

    #[test]
    fn dpkg_lists_the_file_by_another_path_to_the_same_inode() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("usr/lib");
        std::fs::create_dir_all(&real).unwrap();
        let lib = real.join("libt.so.1");
        std::fs::write(&lib, b"not an ELF file, only bytes to sum").unwrap();
        // dpkg lists it under a symlinked directory (a merged /usr's /lib).
        std::os::unix::fs::symlink(&real, d.path().join("lib")).unwrap();
        let admin = d.path().join("dpkg");
        std::fs::create_dir_all(admin.join("info")).unwrap();
        let sum: [u8; 16] = {
            use md5::Digest;
            md5::Md5::digest(std::fs::read(&lib).unwrap()).into()
        };
        let hex: String = sum.iter().map(|b| format!("{b:02x}")).collect();
        let listed = d.path().join("lib/libt.so.1");
        let rel = listed.strip_prefix("/").unwrap().display().to_string();
        std::fs::write(
            admin.join("info/libt1:amd64.md5sums"),
            format!("{}  some/other/file\n{hex}  {rel}\n", "0".repeat(32)),
        )
        .unwrap();
        std::fs::write(admin.join("info/libt1:amd64.list"), format!("/{rel}\n")).unwrap();
        let f = File::open(&lib).unwrap();
        let meta = f.metadata().unwrap();
        let v = dpkg_voucher(&admin, &f, &meta, &lib).expect("a voucher");
        let list = std::fs::metadata(admin.join("info/libt1:amd64.list")).unwrap();
        assert_eq!(
            v.since,
            ctime_of(&list).max(ns(list.mtime(), list.mtime_nsec()))
        );
        assert!(v.what.contains("libt1:amd64"), "{}", v.what);
        // Other bytes (same inode, rewritten): no voucher.
        let admin2 = d.path().join("dpkg2");
        std::fs::create_dir_all(admin2.join("info")).unwrap();
        std::fs::write(
            admin2.join("info/libt1.md5sums"),
            format!("{}  {rel}\n", "1".repeat(32)),
        )
        .unwrap();
        std::fs::write(admin2.join("info/libt1.list"), "").unwrap();
        assert!(dpkg_voucher(&admin2, &f, &meta, &lib).is_none());
    }

    /// A dpkg database at `admin` whose package `pkg` lists `file` with the MD5 of
    /// its bytes now.
    fn package(admin: &Path, pkg: &str, file: &Path) {
        use md5::Digest;
        std::fs::create_dir_all(admin.join("info")).unwrap();
        let hex = hex::encode(md5::Md5::digest(std::fs::read(file).unwrap()));
        let rel = file.strip_prefix("/").unwrap().display().to_string();
        let info = admin.join("info");
        std::fs::write(
            info.join(format!("{pkg}.md5sums")),
            format!("{hex}  {rel}\n"),
        )
        .unwrap();
        std::fs::write(info.join(format!("{pkg}.list")), format!("/{rel}\n")).unwrap();
    }

    #[test]
    fn what_dpkg_vouched_for_is_noted_for_the_next_run_while_the_ctime_stays() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libn.so.1");
        std::fs::write(&lib, b"bytes dpkg unpacked").unwrap();
        let admin = d.path().join("dpkg");
        package(&admin, "libn", &lib);
        // The ctime moves after the package's list was written (perf's link into its
        // cache, a chmod): dpkg's digest is what vouches.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let chmod = |mode| std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(mode));
        chmod(0o755).unwrap();
        let f = File::open(&lib).unwrap();
        let meta = f.metadata().unwrap();
        let id = BuildId::from_hex("0badc0de0badc0de0badc0de0badc0de0badc0de").unwrap();
        let (cache, quiet) = (d.path().join("cache"), d.path().join("quiet"));
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::create_dir_all(&quiet).unwrap();
        let with = |dpkg: Option<&Path>, dir: &Path, remember| Vouchers {
            dpkg: dpkg.map(Path::to_path_buf),
            cache: Some(dir.to_path_buf()),
            same_layout: false,
            remember,
        };
        // -N: vouched for, nothing written.
        let v = with(Some(&admin), &quiet, Remember::Nothing).evidence(&f, &meta, &lib, Some(id));
        assert!(v.voucher.is_some());
        assert!(!quiet.join(LINK_LOG).exists());
        // A run that writes the cache notes it, once.
        let w = with(Some(&admin), &cache, Remember::InLinkRecord);
        let dpkg = w
            .evidence(&f, &meta, &lib, Some(id))
            .voucher
            .expect("dpkg's voucher");
        let text = std::fs::read_to_string(cache.join(LINK_LOG)).unwrap();
        assert!(
            text.starts_with("d1 ") && text.lines().count() == 1,
            "{text}"
        );
        // The next run that asks the same database: the line vouches, since the same
        // time, without the digests (gone now).
        let (lines, _) = read_links(&cache.join(LINK_LOG), 0);
        assert_eq!(lines.values().flatten().count(), 1);
        std::fs::remove_file(admin.join("info/libn.md5sums")).unwrap();
        let next = with(Some(&admin), &cache, Remember::Nothing);
        let noted = next
            .evidence(&f, &meta, &lib, Some(id))
            .voucher
            .expect("the line's voucher");
        assert_eq!(noted.since, dpkg.since);
        assert!(noted.what.contains("dpkg"), "{}", noted.what);
        // A run that asks no database, or another one (a chroot's, the system's), does
        // not take that database's word.
        let other_db = d.path().join("dpkg2");
        for v in [
            with(None, &cache, Remember::Nothing),
            with(Some(&other_db), &cache, Remember::Nothing),
        ] {
            assert!(v.evidence(&f, &meta, &lib, Some(id)).voucher.is_none());
        }
        // Another ID, or the ctime moved again: nothing.
        let other = BuildId::from_hex("abcdef").unwrap();
        assert!(
            next.evidence(&f, &meta, &lib, Some(other))
                .voucher
                .is_none()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        chmod(0o644).unwrap();
        let moved = f.metadata().unwrap();
        assert!(next.evidence(&f, &moved, &lib, Some(id)).voucher.is_none());
    }

    /// What neither a note nor dpkg can tell from a chmod is told by the bytes: a
    /// rewrite in place with the same length and its mtime set back, after dpkg's word
    /// was noted, gets no voucher from the note (its ctime moved) nor from dpkg (its
    /// MD5 is not the listed one).
    #[test]
    fn a_rewrite_with_its_times_set_back_after_a_note_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libr.so.1");
        std::fs::write(&lib, b"bytes dpkg unpacked").unwrap();
        let admin = d.path().join("dpkg");
        package(&admin, "libr", &lib);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = File::open(&lib).unwrap();
        let old = f.metadata().unwrap();
        let cache = d.path().join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let v = Vouchers {
            dpkg: Some(admin.clone()),
            cache: Some(cache.clone()),
            same_layout: false,
            remember: Remember::InLinkRecord,
        };
        let id = BuildId::from_hex("0badc0de0badc0de0badc0de0badc0de0badc0de").unwrap();
        // Touch the inode (ctime after the list) so dpkg's word is noted.
        std::fs::set_permissions(&lib, old.permissions()).unwrap();
        let meta = f.metadata().unwrap();
        assert!(v.evidence(&f, &meta, &lib, Some(id)).voucher.is_some());
        assert!(
            std::fs::read_to_string(cache.join(LINK_LOG))
                .unwrap()
                .starts_with("d1 ")
        );
        // The same length, other bytes, the old mtime back.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&lib, b"bytes rebuilt later").unwrap();
        let w = std::fs::OpenOptions::new().write(true).open(&lib).unwrap();
        w.set_modified(meta.modified().unwrap()).unwrap();
        let now = f.metadata().unwrap();
        assert_eq!(now.len(), meta.len());
        assert_eq!(now.modified().unwrap(), meta.modified().unwrap());
        assert!(ctime_of(&now) > ctime_of(&meta));
        assert!(v.evidence(&f, &now, &lib, Some(id)).voucher.is_none());
    }

    #[test]
    fn a_link_carries_over_the_line_that_vouched_before_it() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libc.so.t");
        std::fs::copy("/proc/self/exe", &lib).unwrap();
        let f = File::open(&lib).unwrap();
        // The test binary carries a build ID (rustc's default link on Linux).
        let id = super::super::elf_read::read_build_id(&f).expect("the test binary's ID");
        let cache = d.path().join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let meta = f.metadata().unwrap();
        let since = ctime_of(&meta) - 1_000_000_000_000;
        let admin = d.path().join("dpkg");
        LinkLog::for_cache(&cache).note_checked(&meta, id, since, db_tag(&admin));
        record_link(&cache, &f, id, || {
            std::fs::hard_link(&lib, cache.join("linked")).map_err(|e| e.to_string())
        })
        .unwrap();
        let after = f.metadata().unwrap();
        assert!(ctime_of(&after) > ctime_of(&meta));
        // The link's own line (from the ctime before it), and dpkg's word carried.
        let text = std::fs::read_to_string(cache.join(LINK_LOG)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let pre = ctime_of(&meta);
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("v1 ") && lines[1].contains(&format!(" {pre} ")),
            "{text}"
        );
        assert!(
            lines[2].starts_with("d1 ") && lines[2].contains(&format!(" {since} ")),
            "{text}"
        );
        let asking = |dpkg: Option<&Path>| {
            let v = Vouchers {
                dpkg: dpkg.map(Path::to_path_buf),
                cache: Some(cache.clone()),
                same_layout: false,
                remember: Remember::Nothing,
            };
            v.evidence(&f, &after, &lib, Some(id))
                .voucher
                .map(|v| v.since)
        };
        assert_eq!(asking(Some(&admin)), Some(since));
        // Without that database: the link's own line.
        assert_eq!(asking(None), Some(pre));
    }

    #[test]
    fn the_systems_dpkg_is_asked_about_system_paths_only() {
        let sys = Path::new(DPKG_ADMINDIR);
        for p in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "/opt/google/chrome/chrome",
            "/usr/bin/bash",
        ] {
            assert!(dpkg_may_list(sys, Path::new(p)), "{p}");
        }
        for p in [
            "/home/u/a.out",
            "/usr/local/bin/git",
            "/root/.pyenv/lib/libpython3.11.so",
            "/tmp/jit-1.so",
            "/library/x",
        ] {
            assert!(!dpkg_may_list(sys, Path::new(p)), "{p}");
        }
        // Another database (a chroot's, a test's) is asked about anything.
        assert!(dpkg_may_list(
            Path::new("/srv/chroot/var/lib/dpkg"),
            Path::new("/tmp/x")
        ));
    }
}
