//! Every way a mapped file can change after the recording (issue 29), and what each
//! output form writes for it: never the new file's ID.
//!
//! A DSO whose ctime moved after the recording started while its mtime did not was
//! either only linked, unlinked, renamed, chmod'ed or chown'ed, or rewritten in place
//! with its times set back (`cp -p`, `touch -d`, `rsync --inplace -t`). The inode keeps
//! no trace of which, and a rebuild that keeps every code segment in its pages leaves
//! the recording's mappings matching too; so such a file gets no ID (`ctime-moved`)
//! unless a record made elsewhere vouches for its bytes: the package database
//! (`--dpkg-admindir`, here one of the test's own naming its library) or pdinject's
//! own cache link. Each change is checked in the table, `--mmap2-buildids` and
//! `--in-place` forms; the outcomes are the table in docs/guarantees.md.
//! Recorded with `perf record -B` (no build IDs in the recording, no perf cache
//! entries), so every ID comes from the files.

use super::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// libfix.so rebuilt with `-DVARIANT`: other code, the same page layout.
const LIB_ID_VARIANT: &str = "7a7a7a7a000000000000000000000000000000a1";
/// libfix.so rebuilt with `-DBIG`: 8 KiB more code.
const LIB_ID_BIG: &str = "b1b1b1b1000000000000000000000000000000b2";

/// Records prog (which maps libfix.so and libc) with frame-pointer callchains.
fn record(st: &Setup) -> PathBuf {
    record_named(st, "rec.data")
}

fn record_named(st: &Setup, name: &str) -> PathBuf {
    let rec = record_prog(st, &["-B", "-g"], name);
    // The changes below come after the recording's end (its file's mtime) on the
    // kernel's coarse ctime clock.
    std::thread::sleep(std::time::Duration::from_millis(50));
    rec
}

/// What one output form wrote for libfix.so.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    /// This ID, read back from the output as perf reads it.
    Id(String),
    /// No ID, for this reason (the report's word).
    Refused(String),
}

/// The forms every change is checked in.
const FORMS: [&str; 3] = ["table", "mmap2", "in-place"];

/// Runs pdinject over `rec` in every form (with `extra` flags), checks that no form
/// writes `never` for libfix.so anywhere perf reads an ID (table, build-ID MMAP2
/// records) and that prog keeps its own ID, and returns what each form gave libfix.so
/// with the report's detail.
fn outcomes(
    st: &Setup,
    rec: &Path,
    extra: &[&str],
    never: &str,
    tag: &str,
) -> BTreeMap<&'static str, (Got, String)> {
    let lib = s(&st.fx.libfix);
    let prog = s(&st.fx.prog);
    let mut all = BTreeMap::new();
    for form in FORMS {
        let ctx = format!("{tag}, {form}");
        let out = st.dir.join(format!("{tag}-{form}.data"));
        let report = match form {
            "in-place" => {
                // A copy keeping the recording's mtime (what dates an undated file).
                run_ok(Command::new("cp").arg("-p").arg(rec).arg(&out));
                let rep = out.with_extension("report.json");
                let o = run(pdinject()
                    .args(extra)
                    .arg("--in-place")
                    .arg(&out)
                    .arg("--report")
                    .arg(&rep));
                assert!(o.status.success(), "{ctx}: {}", tail(&o.stderr));
                read_report(&rep)
            }
            "mmap2" => {
                let mut a = extra.to_vec();
                a.push("--mmap2-buildids");
                pdinject_ok(rec, &out, &a).1
            }
            _ => pdinject_ok(rec, &out, extra).1,
        };
        let table = buildid_list(&st.perf, &out);
        let records = mmap2_build_ids(&st.perf, &out);
        for (what, ids) in [("table", &table), ("MMAP2 records", &records)] {
            assert_ne!(
                ids.get(&lib).map(String::as_str),
                Some(never),
                "{ctx}: the {what} carry the new file's ID for {lib}:\n{}",
                fmt_map(ids)
            );
        }
        // prog is not changed here, but earlier runs of a test may have linked it
        // into a cache emptied since: its own ID or none.
        assert!(
            matches!(
                table.get(&prog).map(String::as_str),
                None | Some("") | Some(PROG_ID)
            ),
            "{ctx}: prog's ID; report:\n{}",
            report_summary(&report)
        );
        let d =
            report_dso(&report, &lib).unwrap_or_else(|| panic!("{ctx}: no report entry for {lib}"));
        let detail = d["detail"].as_str().unwrap_or("").to_string();
        let got = match (d["build_id"].as_str(), d["reason"].as_str()) {
            (Some(id), _) => {
                assert_eq!(d["source"], "elf", "{ctx}");
                assert_eq!(
                    table.get(&lib).map(String::as_str),
                    Some(id),
                    "{ctx}: the table"
                );
                if form == "mmap2" {
                    assert_eq!(
                        records.get(&lib).map(String::as_str),
                        Some(id),
                        "{ctx}: the MMAP2 records"
                    );
                }
                Got::Id(id.to_string())
            }
            (None, Some(r)) => {
                assert!(
                    table.get(&lib).is_none_or(String::is_empty),
                    "{ctx}: {lib} refused ({r}) but in the table"
                );
                Got::Refused(r.to_string())
            }
            _ => panic!("{ctx}: neither ID nor reason: {d}"),
        };
        all.insert(form, (got, detail));
    }
    all
}

/// Every form gave `want`, with every one of `words` in the detail.
fn assert_all(all: &BTreeMap<&'static str, (Got, String)>, want: &Got, words: &[&str], ctx: &str) {
    for (form, (got, detail)) in all {
        assert_eq!(got, want, "{ctx}, {form}: {detail}");
        for w in words {
            assert!(
                detail.contains(w),
                "{ctx}, {form}: detail lacks {w:?}: {detail}"
            );
        }
    }
}

fn refused(r: &str) -> Got {
    Got::Refused(r.into())
}

fn id(i: &str) -> Got {
    Got::Id(i.into())
}

/// The state the ctime rule is about: `path` was changed (ctime) after the recording
/// and its mtime is older than it. The recording's file was written at its end,
/// after its start.
fn assert_changed_after(path: &Path, rec: &Path) {
    let (m, r) = (fs::metadata(path).unwrap(), fs::metadata(rec).unwrap());
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    let end = ns(r.mtime(), r.mtime_nsec());
    assert!(
        ns(m.ctime(), m.ctime_nsec()) >= end && ns(m.mtime(), m.mtime_nsec()) < end,
        "{}: ctime {}.{} mtime {}.{}, the recording ended at {}.{}",
        path.display(),
        m.ctime(),
        m.ctime_nsec(),
        m.mtime(),
        m.mtime_nsec(),
        r.mtime(),
        r.mtime_nsec()
    );
}

/// A rebuild of libfix.so with `flag` and build ID `id`, made before the recording
/// (as a deploy has it ready), in a directory of its own.
fn rebuild(st: &Setup, flag: &str, id: &str) -> PathBuf {
    let dir = st.dir.join(format!("rebuild{flag}"));
    fs::create_dir(&dir).unwrap();
    let out = dir.join("libfix.so");
    build_lib_with("libfix.c", &out, id, &[flag]);
    assert_eq!(elf_build_id(&out).as_deref(), Some(id));
    out
}

/// The same-layout rebuild, checked to keep libfix.so's code pages.
fn same_layout_rebuild(st: &Setup) -> PathBuf {
    let variant = rebuild(st, "-DVARIANT", LIB_ID_VARIANT);
    assert_ne!(
        fs::read(&variant).unwrap(),
        fs::read(&st.fx.libfix).unwrap()
    );
    assert_eq!(
        code_pages(&variant),
        code_pages(&st.fx.libfix),
        "the rebuild was meant to keep the page layout of libfix.so's code"
    );
    variant
}

/// The mappings a loader makes of a file's executable segments with 4 KiB pages:
/// `(page-rounded offset, page-rounded length)`, read from the program headers of a
/// little-endian ELF64 file (not with the crate's reader).
fn code_pages(path: &Path) -> Vec<(u64, u64)> {
    let d = fs::read(path).unwrap();
    assert_eq!((&d[..4], d[4], d[5]), (&b"\x7fELF"[..], 2, 1), "ELF64 LE");
    let u16_at = |o: usize| u16::from_le_bytes(d[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
    let (phoff, phentsize, phnum) = (le64(&d, 32) as usize, u16_at(54), u16_at(56));
    let down = |x: u64| x & !0xfff;
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        // PT_LOAD with PF_X.
        .filter(|&p| u32_at(p) == 1 && u32_at(p + 4) & 1 != 0)
        .map(|p| {
            let (offset, vaddr, filesz) = (le64(&d, p + 8), le64(&d, p + 16), le64(&d, p + 32));
            (down(offset), down(vaddr + filesz + 0xfff) - down(vaddr))
        })
        .collect()
}

/// `new`'s bytes written over `path` in place (same inode), its times set back to
/// what they were when `set_back`.
fn rewrite_in_place(path: &Path, new: &Path, set_back: bool) {
    let old = fs::metadata(path).unwrap();
    fs::write(path, fs::read(new).unwrap()).unwrap();
    if set_back {
        let when = format!("@{}.{:09}", old.mtime(), old.mtime_nsec());
        run_ok(Command::new("touch").arg("-d").arg(&when).arg(path));
    }
    assert_eq!(fs::metadata(path).unwrap().ino(), old.ino());
}

/// A dpkg database of the test's own (`--dpkg-admindir`) with one package,
/// `pdinject-fixture`, listing `files` with their MD5 as they are now; made before
/// the recording, as an installed package is.
fn package_db(st: &Setup, files: &[&Path]) -> PathBuf {
    let admin = st.dir.join("dpkg");
    fs::create_dir_all(admin.join("info")).unwrap();
    let mut sums = String::new();
    let mut list = String::new();
    for f in files {
        let o = run_ok(Command::new("md5sum").arg(f));
        let out = String::from_utf8_lossy(&o.stdout);
        let hex = out.split_whitespace().next().unwrap();
        let rel = f.strip_prefix("/").unwrap().display().to_string();
        sums += &format!("{hex}  {rel}\n");
        list += &format!("/{rel}\n");
    }
    fs::write(admin.join("info/pdinject-fixture.md5sums"), sums).unwrap();
    fs::write(admin.join("info/pdinject-fixture.list"), list).unwrap();
    admin
}

fn admindir_flag(admin: &Path) -> String {
    format!("--dpkg-admindir={}", admin.display())
}

// ---------------------------------------------------------------------------
// Rewritten in place

/// A same-layout rebuild written over the recorded library, its times set back
/// (`rsync --inplace -t`, `cat new > lib.so; touch -r`): the inode, the mtime and the
/// recording's mappings are all as before; only the ctime tells. No ID.
#[test]
fn rewrite_same_layout_times_set_back_gets_no_id() -> Outcome {
    let st = setup("rewrite_same_layout_times_set_back_gets_no_id")?;
    let variant = same_layout_rebuild(&st);
    let rec = record(&st);
    rewrite_in_place(&st.fx.libfix, &variant, true);
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &[], LIB_ID_VARIANT, "same-layout");
    assert_all(
        &all,
        &refused("ctime-moved"),
        &["(ctime)", "--buildid-mmap", "--known-build-ids"],
        "same layout, times set back",
    );
    Ok(())
}

/// The same rewrite without setting the times back: modified after the start.
#[test]
fn rewrite_same_layout_is_stale() -> Outcome {
    let st = setup("rewrite_same_layout_is_stale")?;
    let variant = same_layout_rebuild(&st);
    let rec = record(&st);
    rewrite_in_place(&st.fx.libfix, &variant, false);
    let all = outcomes(&st, &rec, &[], LIB_ID_VARIANT, "same-layout-mtime");
    assert_all(&all, &refused("stale"), &["modified at"], "same layout");
    Ok(())
}

/// A rebuild with 8 KiB more code written over it, times set back: the recorded
/// mapping of its code is one page, the file's code segment three.
#[test]
fn rewrite_other_layout_times_set_back_is_stale() -> Outcome {
    let st = setup("rewrite_other_layout_times_set_back_is_stale")?;
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let rec = record(&st);
    rewrite_in_place(&st.fx.libfix, &big, true);
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &[], LIB_ID_BIG, "other-layout");
    assert_all(
        &all,
        &refused("stale"),
        &["(ctime)", "layout is not the recorded one"],
        "other layout, times set back",
    );
    Ok(())
}

#[test]
fn rewrite_other_layout_is_stale() -> Outcome {
    let st = setup("rewrite_other_layout_is_stale")?;
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let rec = record(&st);
    rewrite_in_place(&st.fx.libfix, &big, false);
    let all = outcomes(&st, &rec, &[], LIB_ID_BIG, "other-layout-mtime");
    assert_all(&all, &refused("stale"), &["modified at"], "other layout");
    Ok(())
}

/// `cp -p` of a rebuild over the recorded library (cp writes into the existing
/// inode and sets the rebuild's times, which are older than the recording): the
/// same-layout one gets no ID, the other one is stale.
#[test]
fn cp_p_of_a_rebuild_gets_no_id() -> Outcome {
    let st = setup("cp_p_of_a_rebuild_gets_no_id")?;
    let variant = same_layout_rebuild(&st);
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let keep = st.dir.join("libfix.orig");
    run_ok(Command::new("cp").arg("-p").arg(&st.fx.libfix).arg(&keep));
    let rec = record(&st);
    let ino = fs::metadata(&st.fx.libfix).unwrap().ino();
    for (new, never, want, words, tag) in [
        (
            &variant,
            LIB_ID_VARIANT,
            "ctime-moved",
            "(ctime)",
            "cp-p-same",
        ),
        (
            &big,
            LIB_ID_BIG,
            "stale",
            "layout is not the recorded one",
            "cp-p-big",
        ),
    ] {
        run_ok(Command::new("cp").arg("-p").arg(new).arg(&st.fx.libfix));
        assert_eq!(fs::metadata(&st.fx.libfix).unwrap().ino(), ino);
        assert_changed_after(&st.fx.libfix, &rec);
        let all = outcomes(&st, &rec, &[], never, tag);
        assert_all(&all, &refused(want), &[words], tag);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Only the inode changed

/// `ln lib.so x && rm x`: the link count is back to one, the ctime moved. Nothing
/// tells it from a same-layout rewrite: no ID. With the package database naming the
/// library, its old (right) ID.
#[test]
fn link_and_unlink_needs_evidence() -> Outcome {
    let st = setup("link_and_unlink_needs_evidence")?;
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    let x = st.dir.join("x");
    fs::hard_link(&st.fx.libfix, &x).unwrap();
    fs::remove_file(&x).unwrap();
    assert_eq!(fs::metadata(&st.fx.libfix).unwrap().nlink(), 1);
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &["-N"], LIB_ID_VARIANT, "ln-rm");
    assert_all(&all, &refused("ctime-moved"), &["(ctime)"], "ln + rm");
    let flag = admindir_flag(&admin);
    let all = outcomes(&st, &rec, &["-N", &flag], LIB_ID_VARIANT, "ln-rm-dpkg");
    assert_all(&all, &id(LIB_ID), &[], "ln + rm, packaged");
    Ok(())
}

#[test]
fn chmod_needs_evidence() -> Outcome {
    let st = setup("chmod_needs_evidence")?;
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    run_ok(Command::new("chmod").arg("0700").arg(&st.fx.libfix));
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &["-N"], LIB_ID_VARIANT, "chmod");
    assert_all(&all, &refused("ctime-moved"), &["(ctime)"], "chmod");
    let flag = admindir_flag(&admin);
    let all = outcomes(&st, &rec, &["-N", &flag], LIB_ID_VARIANT, "chmod-dpkg");
    assert_all(&all, &id(LIB_ID), &[], "chmod, packaged");
    // The opt-in takes it too (its layout is the recorded one).
    let all = outcomes(
        &st,
        &rec,
        &["-N", "--trust-same-layout"],
        LIB_ID_VARIANT,
        "chmod-trust",
    );
    assert_all(&all, &id(LIB_ID), &[], "chmod, --trust-same-layout");
    Ok(())
}

#[test]
fn chown_needs_evidence() -> Outcome {
    let st = setup("chown_needs_evidence")?;
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    // root gives the file away; anyone else chowns it to themselves (which moves the
    // ctime all the same).
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (uid, gid) = if uid == 0 { (65534, 65534) } else { (uid, gid) };
    std::os::unix::fs::chown(&st.fx.libfix, Some(uid), Some(gid)).unwrap();
    assert_eq!(fs::metadata(&st.fx.libfix).unwrap().uid(), uid);
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &["-N"], LIB_ID_VARIANT, "chown");
    assert_all(&all, &refused("ctime-moved"), &["(ctime)"], "chown");
    let flag = admindir_flag(&admin);
    let all = outcomes(&st, &rec, &["-N", &flag], LIB_ID_VARIANT, "chown-dpkg");
    assert_all(&all, &id(LIB_ID), &[], "chown, packaged");
    Ok(())
}

/// A rebuild renamed over the recorded library (`mv`, as a deploy does), its times
/// set back or not: another inode, stale.
#[test]
fn renamed_over_is_stale() -> Outcome {
    let st = setup("renamed_over_is_stale")?;
    let variant = same_layout_rebuild(&st);
    let rec = record(&st);
    let old = fs::metadata(&st.fx.libfix).unwrap();
    for (set_back, tag) in [(true, "mv-set-back"), (false, "mv")] {
        let new = st.dir.join(format!("libfix.{tag}"));
        fs::copy(&variant, &new).unwrap();
        if set_back {
            let when = format!("@{}.{:09}", old.mtime(), old.mtime_nsec());
            run_ok(Command::new("touch").arg("-d").arg(&when).arg(&new));
        }
        fs::rename(&new, &st.fx.libfix).unwrap();
        assert_ne!(fs::metadata(&st.fx.libfix).unwrap().ino(), old.ino());
        let all = outcomes(&st, &rec, &[], LIB_ID_VARIANT, tag);
        assert_all(&all, &refused("stale"), &[], tag);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Build-ID caches

/// pdinject's cache hard-links the proven files into ~/.debug and records each link:
/// a second run over the same recording proves them by that record. Once the user
/// empties the cache (unlinking them again), nothing but a package's record tells
/// an unlink from a rewrite.
#[test]
fn pdinject_cache_links_and_an_emptied_cache() -> Outcome {
    let st = setup("pdinject_cache_links_and_an_emptied_cache")?;
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    let all = outcomes(&st, &rec, &[], LIB_ID_VARIANT, "first");
    assert_all(&all, &id(LIB_ID), &[], "first run");
    if fs::metadata(&st.fx.libfix).unwrap().nlink() < 2 {
        return skip("the build-ID cache is on another filesystem (copies, no hard links)");
    }
    assert_changed_after(&st.fx.libfix, &rec);
    let log = test_home().join(".debug/.pdinject-links");
    let lines = fs::read_to_string(&log).unwrap_or_default();
    let ino = fs::metadata(&st.fx.libfix).unwrap().ino();
    assert!(
        lines
            .lines()
            .any(|l| l.contains(&format!(" {ino} {LIB_ID} "))),
        "{} has no line for libfix.so (inode {ino}):\n{lines}",
        log.display()
    );
    // The rerun: the link record proves what the link moved.
    let all = outcomes(&st, &rec, &[], LIB_ID_VARIANT, "rerun");
    assert_all(
        &all,
        &id(LIB_ID),
        &[],
        "second run, the cache as the first left it",
    );
    // The cache emptied.
    fs::remove_dir_all(test_home().join(".debug")).unwrap();
    assert_eq!(fs::metadata(&st.fx.libfix).unwrap().nlink(), 1);
    let all = outcomes(&st, &rec, &["-N"], LIB_ID_VARIANT, "emptied");
    assert_all(&all, &refused("ctime-moved"), &["(ctime)"], "cache emptied");
    let flag = admindir_flag(&admin);
    let all = outcomes(&st, &rec, &["-N", &flag], LIB_ID_VARIANT, "emptied-dpkg");
    assert_all(&all, &id(LIB_ID), &[], "cache emptied, packaged");
    Ok(())
}

/// perf hard-links every hit DSO into ~/.debug at the end of a recording made without
/// -B; emptying that cache unlinks them again. The test's package database keeps the
/// library's ID; libc keeps its own through the machine's dpkg database (where there
/// is one).
#[test]
fn emptied_perf_cache_needs_evidence() -> Outcome {
    let st = setup("emptied_perf_cache_needs_evidence")?;
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    let later = record_prog(&st, &[], "later.data");
    assert!(later.exists());
    if fs::metadata(&st.fx.libfix).unwrap().nlink() < 2 {
        return skip("perf linked nothing into the test's ~/.debug");
    }
    fs::remove_dir_all(test_home().join(".debug")).unwrap();
    assert_changed_after(&st.fx.libfix, &rec);
    let all = outcomes(&st, &rec, &["-N"], LIB_ID_VARIANT, "perf-emptied");
    assert_all(&all, &refused("ctime-moved"), &[], "perf's cache emptied");
    let flag = admindir_flag(&admin);
    let all = outcomes(
        &st,
        &rec,
        &["-N", &flag],
        LIB_ID_VARIANT,
        "perf-emptied-dpkg",
    );
    assert_all(&all, &id(LIB_ID), &[], "perf's cache emptied, packaged");
    // Every other hit DSO: its right ID or none, never another.
    let out = st.dir.join("perf-emptied-dpkg-table.data");
    let table = buildid_list(&st.perf, &out);
    for dso in hit_dsos(&st.perf, &rec).keys() {
        if let (Some(got), Some(want)) = (table.get(dso), expected_build_id(dso))
            && !got.is_empty()
        {
            assert_eq!(got, &want, "{dso}");
        }
    }
    Ok(())
}

/// A batch of two recordings: the first input's run links libfix.so into the cache
/// (moving its ctime); the second recording, made before that, is still proven (the
/// batch sees the links it made).
#[test]
fn batch_proves_what_its_own_links_moved() -> Outcome {
    let st = setup("batch_proves_what_its_own_links_moved")?;
    let a = record_named(&st, "a.data");
    let b = record_named(&st, "b.data");
    let out = st.dir.join("out");
    let o = run(pdinject()
        .args(["batch", "--buildids", "--jobs", "1", "--out-dir"])
        .arg(&out)
        .arg(&a)
        .arg(&b));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for name in ["a.data", "b.data"] {
        let table = buildid_list(&st.perf, &out.join(name));
        assert_eq!(
            table.get(&s(&st.fx.libfix)).map(String::as_str),
            Some(LIB_ID),
            "{name}:\n{}\n{}",
            fmt_map(&table),
            tail(&o.stderr)
        );
    }
    Ok(())
}

/// `--trust-same-layout` restores the layout rule for those who know their deploys
/// never rewrite in place: a same-layout rewrite with its times set back then gets
/// the rebuild's ID, as documented (this is why it is off by default). A package's
/// record of the old bytes does not vouch for the new ones.
#[test]
fn trust_same_layout_takes_what_it_trusts() -> Outcome {
    let st = setup("trust_same_layout_takes_what_it_trusts")?;
    let variant = same_layout_rebuild(&st);
    let admin = package_db(&st, &[&st.fx.libfix]);
    let rec = record(&st);
    rewrite_in_place(&st.fx.libfix, &variant, true);
    assert_changed_after(&st.fx.libfix, &rec);
    let out = st.dir.join("trust.data");
    let (_, report) = pdinject_ok(&rec, &out, &["-N", "--trust-same-layout"]);
    let d = report_dso(&report, &s(&st.fx.libfix)).unwrap();
    assert_eq!(d["build_id"], LIB_ID_VARIANT, "{}", report_summary(&report));
    let flag = admindir_flag(&admin);
    let all = outcomes(&st, &rec, &["-N", &flag], LIB_ID_VARIANT, "dpkg-old-bytes");
    assert_all(&all, &refused("ctime-moved"), &[], "packaged, other bytes");
    Ok(())
}
