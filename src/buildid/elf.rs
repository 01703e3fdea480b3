//! Proving that a file on disk is the one a recording mapped. What it reads of the
//! file (build IDs from ELF files and raw note streams) is the `elf_read` module's,
//! named here too.

use super::elf_read::{id_of, parse};
use crate::format::record::FileIdent;
use crate::model::ExecMaps;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

pub(crate) use super::elf_read::pread_new;
pub(crate) use super::elf_read::{Elf, Segment, open_regular, read_build_id, reader};
pub(crate) use super::elf_read::{build_id_from_notes, build_id_of_image};
pub(crate) use super::proof::{
    CtimeEvidence, FileTimes, Place, Proven, Reason, RecordingStart, Refusal,
};
pub(crate) use super::vouch::Vouchers;

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

/// `prove_and_read` (the memo's) for a file under a sysroot (`--symfs`): a copy of the
/// recorded machine's files, whose device and inode say nothing about the recorded
/// ones. The proof is the copy's modification time (not after the recording started:
/// `cp -a`, `rsync -t` and image extraction keep it) and the segment layout; ctime and
/// birth time are the copy's own and are not used. Without a recording time there is no
/// proof at all.
pub(crate) fn prove_in_sysroot(
    path: &Path,
    exec_maps: &ExecMaps,
    start: &RecordingStart,
) -> Result<Proven, Refusal> {
    // A copy's ctime is its own: nothing to excuse.
    prove(path, None, exec_maps, start, &Vouchers::none())
}

/// The rules on times that need nothing read from the file.
fn judge_times(t: &FileTimes, start: i128, place: Place) -> Result<(), Refusal> {
    if t.mtime > start {
        return Err((
            Reason::Stale,
            format!(
                "modified at {} s, after the recording started ({} s)",
                fmt_time(t.mtime),
                fmt_time(start)
            ),
        ));
    }
    if place != Place::Sysroot
        && let Some(b) = t.btime
        && b > start
    {
        // Its mtime was set back (`cp -p`/`rsync -t` of a new file, perhaps given a
        // freed inode number): the mapped file existed when it was mapped.
        return Err((
            Reason::Stale,
            format!(
                "created at {} s (birth time), after the recording started ({} s): another file with an older mtime",
                fmt_time(b),
                fmt_time(start)
            ),
        ));
    }
    Ok(())
}

/// The proof's rules on a file's times and layout, given what was read of it: its
/// times, its PT_LOAD segments, the recording's executable mappings of it and what
/// excuses a moved ctime (`ctime`, looked up only when the ctime is after the start).
/// The same rules decide whether unwind tables loaded early may stay.
///
/// A ctime after the recording started, with an older mtime, is left by a link,
/// unlink, rename, chmod or chown, and by a rewrite in place with the mtime set back;
/// the inode keeps no other trace. The recording's mappings cannot tell them apart
/// either: a rebuild from the same sources keeps every code segment in the same pages
/// (only the build-ID note differs), and then every recorded mapping is exactly one
/// of its segments as a loader maps it. So such a file is accepted only with a
/// voucher (a record made elsewhere: dpkg's, pdinject's cache link) that its bytes
/// are unchanged since before the start, or, under `--trust-same-layout`, when the
/// records named its inode and the layout is exactly the recorded one. Refused, it is
/// `stale` when the layout shows another file, else `ctime-moved` (it may be fine).
pub(crate) fn judge(
    t: &FileTimes,
    loads: &[Segment],
    maps: &ExecMaps,
    start: i128,
    place: Place,
    ctime: &CtimeEvidence,
) -> Result<(), Refusal> {
    judge_times(t, start, place)?;
    if place != Place::Sysroot && t.ctime > start {
        excuse_ctime(t, loads, maps, start, place, ctime)?;
    }
    // A loader's mapping's offset is its segment's offset rounded down to the page
    // size (4 KiB to 64 KiB: a sysroot's machine may have other pages than this one).
    // A process may also map part of its own code again, at a page inside an
    // executable segment (V8 under --perf-prof maps its builtins from node's file, at
    // an offset inside .text). Such a mapping is accepted only when it lies inside a
    // code segment and every code segment of the file has a recorded mapping at its
    // start: the loader's mappings show the layout is the recorded one (a longer
    // `.text` in a newer build would move the segments after it), the extra mapping
    // adds nothing to check.
    const MAX_PAGE: u64 = 64 << 10;
    if !loads.is_empty() && !maps.maps.is_empty() {
        let at_start = |pg: u64, s: &Segment| s.offset >= pg && s.offset - pg < MAX_PAGE;
        let inside = |pg: u64, len: u64| {
            loads.iter().any(|s| {
                let end = s
                    .offset
                    .checked_add(s.filesz)
                    .and_then(|e| e.checked_next_multiple_of(MAX_PAGE));
                s.exec
                    && pg >= s.offset
                    && pg.checked_add(len).zip(end).is_some_and(|(a, b)| a <= b)
            })
        };
        let loaded = !maps.more
            && loads
                .iter()
                .filter(|s| s.exec)
                .all(|s| maps.pgoffs().any(|pg| at_start(pg, s)));
        for &(pg, len) in &maps.maps {
            if loads.iter().any(|s| at_start(pg, s)) {
                continue;
            }
            let why = if !inside(pg, len) {
                format!(
                    "no loadable segment at the recorded file offset {pg:#x}: the layout differs"
                )
            } else if !loaded {
                format!(
                    "the recorded mapping at file offset {pg:#x} is inside a code segment, and not every code segment has a recorded mapping at its start to show the layout is the same"
                )
            } else {
                continue;
            };
            return Err((Reason::Stale, why));
        }
    }
    Ok(())
}

/// A ctime after the start (see [`judge`]): excused, or the refusal that says what
/// moved and what the user can do.
fn excuse_ctime(
    t: &FileTimes,
    loads: &[Segment],
    maps: &ExecMaps,
    start: i128,
    place: Place,
    ctime: &CtimeEvidence,
) -> Result<(), Refusal> {
    if ctime.voucher.as_ref().is_some_and(|v| v.since <= start) {
        return Ok(());
    }
    let layout = match place {
        Place::RecordedInode => exact_layout(loads, maps, page_size()),
        // A file renamed over the mapped one after being given its old mtime would
        // look the same.
        _ => Err(Layout::Unknown(
            "the records name no inode to show it is the file mapped".into(),
        )),
    };
    if ctime.same_layout && layout.is_ok() {
        return Ok(());
    }
    let changed = format!(
        "changed at {} s (ctime), after the recording started ({} s), with an older mtime ({} s)",
        fmt_time(t.ctime),
        fmt_time(start),
        fmt_time(t.mtime)
    );
    if let Err(Layout::Differs(why)) = layout {
        return Err((
            Reason::Stale,
            format!("{changed}, and {why}: rewritten in place with its times set back?"),
        ));
    }
    let late = match &ctime.voucher {
        Some(v) => format!(" ({}, after the recording started)", v.what),
        None => String::new(),
    };
    let no_inode = match layout {
        Err(Layout::Unknown(why)) if place != Place::RecordedInode => format!("; {why}"),
        _ => String::new(),
    };
    let opt_in = if place == Place::RecordedInode {
        ", or --trust-same-layout to take a file whose code is laid out as recorded"
    } else {
        ""
    };
    Err((
        Reason::CtimeMoved,
        format!(
            "{changed}: a link, chmod, chown or rename leaves that, and so does a rewrite in place with its times set back, and nothing shows which (no package record of these bytes, no build-ID cache link of pdinject's{late}){no_inode}. To prove such files: record with --buildid-mmap, run pdinject in the recording's pipeline while the files are mapped, give --known-build-ids{opt_in}"
        ),
    ))
}

/// This machine's page size.
fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// How a loader (ld.so, the kernel) maps a file's segments with pages of `page` bytes,
/// as `(file offset, length)`.
struct LoaderMaps {
    /// Each segment's file part, from its page-rounded offset to its page-rounded
    /// end, with whether the segment is executable.
    segments: Vec<((u64, u64), bool)>,
    /// The whole image, mapped with the first segment's offset and protection before
    /// the other segments are laid over it (ld.so and the kernel both do).
    whole: Option<(u64, u64)>,
    /// The first segment's own mapping (the part of `whole` it keeps).
    first: Option<(u64, u64)>,
}

fn loader_maps(loads: &[Segment], page: u64) -> LoaderMaps {
    let down = |x: u64| x & !(page - 1);
    let up = |x: u64| x.checked_add(page - 1).map(down);
    let map = |s: &Segment| {
        let end = up(s.vaddr.checked_add(s.filesz)?)?;
        Some((down(s.offset), end.checked_sub(down(s.vaddr))?))
    };
    let segments = loads
        .iter()
        .filter(|s| s.filesz > 0)
        .filter_map(|s| Some((map(s)?, s.exec)))
        .collect();
    let first = loads.iter().min_by_key(|s| s.vaddr);
    let end = loads
        .iter()
        .filter_map(|s| s.vaddr.checked_add(s.memsz))
        .max();
    let whole = first.zip(end).and_then(|(f, end)| {
        let len = up(end)?.checked_sub(down(f.vaddr))?;
        Some((down(f.offset), len))
    });
    LoaderMaps {
        segments,
        whole,
        first: first.and_then(map),
    }
}

/// Why the recording's executable mappings are not shown to be exactly a file's
/// segments (see [`exact_layout`]), in words.
#[derive(Debug, PartialEq, Eq)]
enum Layout {
    /// The recording has nothing to compare (no executable mapping, too many).
    Unknown(String),
    /// A recorded mapping is none of the file's segments, or a code segment of the
    /// file was never mapped: not the file the recording mapped.
    Differs(String),
}

impl Layout {
    #[cfg(test)]
    fn words(&self) -> &str {
        match self {
            Layout::Unknown(w) | Layout::Differs(w) => w,
        }
    }
}

/// Whether the recording's executable mappings are exactly a loader's mappings of
/// these segments (see [`judge`]); if not, what differs, in words.
fn exact_layout(loads: &[Segment], maps: &ExecMaps, page: u64) -> Result<(), Layout> {
    let fmt = |v: &mut dyn Iterator<Item = (u64, u64)>| {
        v.map(|(o, l)| format!("{l:#x} bytes at {o:#x}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if maps.maps.is_empty() {
        return Err(Layout::Unknown(
            "the recording maps none of it executable, so nothing shows its layout".into(),
        ));
    }
    if maps.more {
        return Err(Layout::Unknown(format!(
            "the recording maps it executable in more than {} ways, so not every mapping can be compared",
            ExecMaps::KEPT
        )));
    }
    let file = loader_maps(loads, page);
    let recorded = |m: &(u64, u64)| maps.maps.contains(m);
    for m in &maps.maps {
        if !file.segments.iter().any(|s| s.0 == *m) && file.whole.as_ref() != Some(m) {
            return Err(Layout::Differs(format!(
                "its layout is not the recorded one: the recorded mapping of {:#x} bytes at file offset {:#x} is none of its segments (which map {})",
                m.1,
                m.0,
                fmt(&mut file.segments.iter().map(|s| s.0).chain(file.whole))
            )));
        }
    }
    // Each executable segment was mapped (ld.so and the kernel map them all): one
    // the recording never saw holds code it did not run. The first segment may have
    // been mapped as part of the whole image.
    for &(m, exec) in &file.segments {
        let via_whole = file.first == Some(m) && file.whole.as_ref().is_some_and(recorded);
        if exec && !recorded(&m) && !via_whole {
            return Err(Layout::Differs(format!(
                "its layout is not the recorded one: its executable segment of {:#x} bytes at file offset {:#x} is none of the recorded mappings ({})",
                m.1,
                m.0,
                fmt(&mut maps.maps.iter().copied())
            )));
        }
    }
    Ok(())
}

pub(super) fn prove(
    path: &Path,
    ident: Option<&FileIdent>,
    exec_maps: &ExecMaps,
    start: &RecordingStart,
    vouchers: &Vouchers,
) -> Result<Proven, Refusal> {
    // An unknown start refuses before anything is opened: the proof is never skipped.
    let start = match start {
        RecordingStart::Known(ns) => *ns,
        RecordingStart::Unknown(why) => return Err((Reason::Undated, why.clone())),
    };
    let place = ident.map_or(Place::Sysroot, Place::of);
    let (file, meta) = open_regular(path)?;
    if let Some(&FileIdent::Inode {
        maj,
        min,
        ino,
        generation: gen_rec,
    }) = ident
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
    let times = FileTimes::of(&meta);
    // What needs no reading first; the ctime rule needs the segments.
    judge_times(&times, start, place)?;
    let key = (meta.dev(), meta.ino());
    let cache = reader(&file);
    let elf = parse(&cache)?;
    let id = id_of(&elf);
    // What may excuse a moved ctime is looked up only when it moved (a package's
    // digest means reading the whole file).
    let ctime = if place != Place::Sysroot && times.ctime > start {
        vouchers.evidence(&file, &meta, path, id.as_ref().ok().copied())
    } else {
        CtimeEvidence {
            voucher: None,
            same_layout: vouchers.same_layout,
        }
    };
    judge(&times, &elf.loads(), exec_maps, start, place, &ctime)?;
    let build_id = id?;
    // The reader borrows the file, which moves into the proof.
    drop(cache);
    Ok(Proven {
        build_id,
        file: Arc::new(file),
        key,
        ctime,
    })
}

#[cfg(test)]
mod proof_tests {
    use super::*;

    fn seg(offset: u64, vaddr: u64, filesz: u64, memsz: u64, exec: bool) -> Segment {
        Segment {
            offset,
            vaddr,
            filesz,
            memsz,
            exec,
        }
    }

    fn maps(m: &[(u64, u64)]) -> ExecMaps {
        let mut e = ExecMaps::default();
        for &(o, l) in m {
            e.add(o, l);
        }
        e
    }

    /// The loads of a small library built with separate code (as the test fixtures):
    /// its text is one page at 0x1000.
    fn separate() -> Vec<Segment> {
        vec![
            seg(0, 0, 0x490, 0x490, false),
            seg(0x1000, 0x1000, 0x189, 0x189, true),
            seg(0x2000, 0x2000, 0xc4, 0xc4, false),
            seg(0x2e30, 0x3e30, 0x1e0, 0x1f0, false),
        ]
    }

    /// The mappings ld.so and the kernel make, as perf records them (checked on this
    /// machine: libfix.so, libc.so.6, and `-z noseparate-code` builds), and nothing
    /// else.
    #[test]
    fn exact_layout_is_a_loaders_mappings() {
        let p = 0x1000;
        assert_eq!(
            exact_layout(&separate(), &maps(&[(0x1000, 0x1000)]), p),
            Ok(())
        );
        // libc.so.6 of Debian 12: text 0x1550fc bytes at 0x26000.
        let libc = [
            seg(0, 0, 0x25388, 0x25388, false),
            seg(0x26000, 0x26000, 0x1550fc, 0x1550fc, true),
            seg(0x17c000, 0x17c000, 0x52c31, 0x52c31, false),
            seg(0x1cf8d0, 0x1d08d0, 0x4f98, 0x12680, false),
        ];
        assert_eq!(
            exact_layout(&libc, &maps(&[(0x26000, 0x156000)]), p),
            Ok(())
        );
        // The text one page longer or shorter, or at another offset.
        for m in [
            (0x26000, 0x157000),
            (0x26000, 0x155000),
            (0x27000, 0x156000),
        ] {
            let e = exact_layout(&libc, &maps(&[m]), p).unwrap_err();
            assert!(matches!(e, Layout::Differs(_)), "{e:?}");
            assert!(e.words().contains("is none of its segments"), "{e:?}");
        }
        // `-z noseparate-code`: the first segment is code, mapped over the whole
        // image (0x203000 bytes here: the bss of the last one included).
        let one = [
            seg(0, 0, 0xb80, 0xb80, true),
            seg(0xda0, 0x1da0, 0x298, 0x2002c8, false),
        ];
        assert_eq!(exact_layout(&one, &maps(&[(0, 0x203000)]), p), Ok(()));
        assert_eq!(exact_layout(&one, &maps(&[(0, 0x1000)]), p), Ok(()));
        // A code segment the recording never saw mapped.
        let mut two = separate();
        two.push(seg(0x4000, 0x5000, 0x100, 0x100, true));
        let e = exact_layout(&two, &maps(&[(0x1000, 0x1000)]), p).unwrap_err();
        assert!(
            e.words()
                .contains("executable segment of 0x1000 bytes at file offset 0x4000"),
            "{e:?}"
        );
        // Nothing recorded, or more than was kept: no evidence.
        assert!(matches!(
            exact_layout(&separate(), &maps(&[]), p),
            Err(Layout::Unknown(_))
        ));
        let mut many = maps(&[(0x1000, 0x1000)]);
        for i in 0..ExecMaps::KEPT as u64 {
            many.add(0x1000, 0x2000 + i);
        }
        assert!(many.more);
        assert!(matches!(
            exact_layout(&separate(), &many, p),
            Err(Layout::Unknown(_))
        ));
    }

    /// A ctime after the start is excused only by a voucher from before the start, or
    /// under --trust-same-layout by an exact layout and a recorded inode; refused, it
    /// is `stale` when the layout shows another file, else `ctime-moved`. The mtime
    /// and birth time rules come first; a sysroot copy's ctime and birth time are its
    /// own.
    #[test]
    fn ctime_after_the_start_needs_a_voucher() {
        let times = |mtime, ctime, btime| FileTimes {
            mtime,
            ctime,
            btime,
        };
        let text = maps(&[(0x1000, 0x1000)]);
        let wrong = maps(&[(0x1000, 0x2000)]);
        let none = CtimeEvidence::default();
        let trust = CtimeEvidence {
            voucher: None,
            same_layout: true,
        };
        let vouched = |since| CtimeEvidence {
            voucher: Some(super::super::proof::Voucher {
                since,
                what: "a test's record".into(),
            }),
            same_layout: false,
        };
        let j = |t: FileTimes, m: &ExecMaps, place, c: &CtimeEvidence| {
            judge(&t, &separate(), m, 100, place, c)
        };
        let ok = |r: Result<(), Refusal>| r.is_ok();
        let reason = |r: Result<(), Refusal>| r.err().map(|e| e.0);
        let words = |r: Result<(), Refusal>| r.err().map(|e| e.1).unwrap_or_default();
        // No ctime after the start: nothing to excuse.
        assert!(ok(j(
            times(50, 60, Some(40)),
            &wrong,
            Place::RecordedInode,
            &none
        )));
        // The exact layout alone excuses nothing any more (a same-layout rebuild has
        // it): ctime-moved, with what the user can do.
        let r = j(times(50, 160, Some(40)), &text, Place::RecordedInode, &none);
        assert_eq!(reason(r.clone()), Some(Reason::CtimeMoved));
        let w = words(r);
        for e in [
            "(ctime)",
            "--buildid-mmap",
            "--known-build-ids",
            "--trust-same-layout",
        ] {
            assert!(w.contains(e), "{e}: {w}");
        }
        // A voucher from before the start excuses, one from after does not (and is
        // named); the opt-in excuses the exact layout of a recorded inode.
        for place in [Place::RecordedInode, Place::Local] {
            assert!(ok(j(times(50, 160, None), &text, place, &vouched(90))));
            let r = j(times(50, 160, None), &text, place, &vouched(110));
            assert_eq!(reason(r.clone()), Some(Reason::CtimeMoved));
            assert!(words(r).contains("a test's record"));
        }
        assert!(ok(j(
            times(50, 160, None),
            &text,
            Place::RecordedInode,
            &trust
        )));
        // Another layout: stale, whatever the opt-in.
        for c in [&none, &trust] {
            let r = j(times(50, 160, None), &wrong, Place::RecordedInode, c);
            assert_eq!(reason(r.clone()), Some(Reason::Stale));
            let e = words(r);
            assert!(
                e.contains("(ctime)") && e.contains("0x2000 bytes at file offset 0x1000"),
                "{e}"
            );
        }
        // No inode recorded: the opt-in does not apply.
        let r = j(times(50, 160, None), &text, Place::Local, &trust);
        assert_eq!(reason(r.clone()), Some(Reason::CtimeMoved));
        assert!(words(r).contains("name no inode"));
        let e = words(j(
            times(50, 160, Some(150)),
            &text,
            Place::RecordedInode,
            &vouched(0),
        ));
        assert!(e.contains("birth time"), "{e}");
        let e = words(j(
            times(150, 160, Some(40)),
            &text,
            Place::RecordedInode,
            &vouched(0),
        ));
        assert!(e.starts_with("modified at"), "{e}");
        // Under --symfs: the copy's times, only mtime counts (and the loose layout).
        assert!(ok(j(
            times(50, 160, Some(150)),
            &wrong,
            Place::Sysroot,
            &none
        )));
        assert!(!ok(j(times(150, 160, None), &text, Place::Sysroot, &none)));
        let far = maps(&[(0x9_0000, 0x1000)]);
        assert!(!ok(j(times(50, 160, None), &far, Place::Sysroot, &none)));
        assert!(!ok(j(
            times(50, 60, None),
            &far,
            Place::RecordedInode,
            &none
        )));
    }

    /// A process that maps part of its own code again (V8 under --perf-prof maps its
    /// builtins from node's file) keeps the ID when the mapping lies inside an
    /// executable segment and the loader's mapping is there too; not otherwise.
    #[test]
    fn a_second_mapping_inside_the_code_is_the_same_file() {
        // /usr/bin/node 20 of Debian 12 (readelf -l), and what perf recorded of it.
        let node = [
            seg(0, 0x400000, 0x76e5d8, 0x76e5d8, false),
            seg(0x76f000, 0xb6f000, 0x1e90, 0x1e90, true),
            seg(0x772000, 0xb72000, 0x1a8bca0, 0x1a8bca0, true),
            seg(0x2200000, 0x2600000, 0x1f1, 0x1f1, true),
            seg(0x2201000, 0x2601000, 0x3038cae, 0x3038cae, false),
        ];
        let t = FileTimes {
            mtime: 50,
            ctime: 50,
            btime: None,
        };
        let none = CtimeEvidence::default();
        let j =
            |m: &ExecMaps| judge(&t, &node, m, 100, Place::RecordedInode, &none).map_err(|e| e.1);
        let loader = [
            (0x76f000, 0x2000),
            (0x772000, 0x1a8c000),
            (0x2200000, 0x1000),
        ];
        let mut with_builtins = loader.to_vec();
        with_builtins.push((0x14c4000, 0x192000));
        assert_eq!(j(&maps(&with_builtins)), Ok(()));
        // Past the segment's end, or in a segment that is not code.
        for extra in [(0x21f0000, 0x20000), (0x2300000, 0x1000)] {
            let mut m = loader.to_vec();
            m.push(extra);
            let e = j(&maps(&m)).unwrap_err();
            assert!(e.contains("no loadable segment"), "{e}");
        }
        // Only the inside mapping: nothing shows the file was loaded as it is now.
        let e = j(&maps(&[(0x14c4000, 0x192000)])).unwrap_err();
        assert!(e.contains("every code segment"), "{e}");
        // A newer build with a longer .text (its last code segment moved from
        // 0x2200000 to 0x2300000): the recorded 0x2200000 is inside the new .text,
        // but the new last segment has no recorded mapping: stale, under --symfs too.
        let mut newer = node;
        newer[2].filesz += 0x100000;
        newer[3].offset += 0x100000;
        newer[4].offset += 0x100000;
        for place in [Place::RecordedInode, Place::Sysroot] {
            let r = judge(&t, &newer, &maps(&with_builtins), 100, place, &none);
            assert!(r.is_err(), "{place:?}: a longer .text passed");
            assert!(judge(&t, &newer, &maps(&loader), 100, place, &none).is_err());
        }
        // A segment whose end overflows is never "around" a mapping (no panic).
        let mut hostile = node;
        hostile[2].filesz = u64::MAX - 0x10;
        let _ = j(&maps(&with_builtins));
        let _ = judge(
            &t,
            &hostile,
            &maps(&with_builtins),
            100,
            Place::RecordedInode,
            &none,
        );
    }
}
