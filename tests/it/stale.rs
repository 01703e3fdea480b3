//! The stale rule's false alarm (issue #16). A DSO whose ctime moved after the
//! recording started while its mtime did not was either only linked, unlinked,
//! chmod'ed or chown'ed (accept it) or rewritten in place with its times set back
//! (`cp -p`, `touch -d`: refuse it). The inode keeps no trace of which; the recorded
//! executable mappings (file offset and length) against the file's segments do, as
//! far as a change moves the page layout. Recorded with `perf record -B` (no build
//! IDs in the recording, no perf cache entries), so every ID comes from the files.

use super::common::*;
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
    record_prog(st, &["-B", "-g"], "rec.data")
}

/// Runs pdinject over `input` into `name`; returns the output's table and the report.
fn inject(
    st: &Setup,
    input: &Path,
    name: &str,
) -> (
    std::collections::BTreeMap<String, String>,
    serde_json::Value,
) {
    let output = st.dir.join(name);
    let (_, report) = pdinject_ok(input, &output, &[]);
    (buildid_list(&st.perf, &output), report)
}

/// The state the rule is about: `path` was changed (ctime) after the recording and
/// its mtime is older than it. The recording's file was written at its end, after
/// its start.
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

/// prog and libfix.so get their own IDs, read from the files, and every other hit
/// DSO gets the ID its file has.
fn assert_accepted(
    st: &Setup,
    rec: &Path,
    table: &std::collections::BTreeMap<String, String>,
    report: &serde_json::Value,
    ctx: &str,
) {
    for (path, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
        let d = report_dso(report, &s(path)).unwrap_or_else(|| {
            panic!("{ctx}: no report entry for {}", path.display());
        });
        assert_eq!(
            (d["build_id"].as_str(), d["source"].as_str()),
            (Some(id), Some("elf")),
            "{ctx}: {} must keep its ID; report:\n{}",
            path.display(),
            report_summary(report)
        );
        assert_eq!(table.get(&s(path)).map(String::as_str), Some(id), "{ctx}");
    }
    for dso in hit_dsos(&st.perf, rec).keys() {
        if let Some(want) = expected_build_id(dso) {
            assert_eq!(
                table.get(dso),
                Some(&want),
                "{ctx}: hit DSO {dso}; report:\n{}",
                report_summary(report)
            );
        }
    }
}

/// libfix.so gets no ID and is reported stale, with `evidence` in the words.
fn assert_stale(
    st: &Setup,
    table: &std::collections::BTreeMap<String, String>,
    report: &serde_json::Value,
    evidence: &[&str],
    ctx: &str,
) {
    let lib = s(&st.fx.libfix);
    let d = report_dso(report, &lib).unwrap_or_else(|| panic!("{ctx}: no entry for {lib}"));
    assert_eq!(
        (d["reason"].as_str(), d["build_id"].as_str()),
        (Some("stale"), None),
        "{ctx}: {lib} must be refused; report:\n{}",
        report_summary(report)
    );
    let detail = d["detail"].as_str().unwrap_or("");
    for e in evidence {
        assert!(detail.contains(e), "{ctx}: detail lacks {e:?}: {detail}");
    }
    assert!(
        table.get(&lib).is_none_or(String::is_empty),
        "{ctx}: {lib} has an ID in the output table: {:?}",
        table.get(&lib)
    );
    // prog was not touched.
    assert_eq!(
        table.get(&s(&st.fx.prog)).map(String::as_str),
        Some(PROG_ID),
        "{ctx}"
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

#[test]
fn link_and_unlink_after_the_recording_is_not_stale() -> Outcome {
    let st = setup("link_and_unlink_after_the_recording_is_not_stale")?;
    let rec = record(&st);
    for f in [&st.fx.prog, &st.fx.libfix] {
        // `ln lib.so x && rm x`: the link count is back to one.
        let x = st.dir.join("x");
        fs::hard_link(f, &x).unwrap();
        fs::remove_file(&x).unwrap();
        assert_eq!(fs::metadata(f).unwrap().nlink(), 1);
        assert_changed_after(f, &rec);
    }
    let (table, report) = inject(&st, &rec, "out.data");
    assert_accepted(&st, &rec, &table, &report, "ln + rm");
    Ok(())
}

#[test]
fn chmod_after_the_recording_is_not_stale() -> Outcome {
    let st = setup("chmod_after_the_recording_is_not_stale")?;
    let rec = record(&st);
    for f in [&st.fx.prog, &st.fx.libfix] {
        run_ok(Command::new("chmod").arg("0700").arg(f));
        assert_changed_after(f, &rec);
    }
    let (table, report) = inject(&st, &rec, "out.data");
    assert_accepted(&st, &rec, &table, &report, "chmod");
    Ok(())
}

#[test]
fn chown_after_the_recording_is_not_stale() -> Outcome {
    let st = setup("chown_after_the_recording_is_not_stale")?;
    let rec = record(&st);
    // root gives the files away; anyone else chowns them to themselves (which moves
    // the ctime all the same).
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (uid, gid) = if uid == 0 { (65534, 65534) } else { (uid, gid) };
    for f in [&st.fx.prog, &st.fx.libfix] {
        std::os::unix::fs::chown(f, Some(uid), Some(gid)).unwrap();
        assert_eq!(fs::metadata(f).unwrap().uid(), uid);
        assert_changed_after(f, &rec);
    }
    let (table, report) = inject(&st, &rec, "out.data");
    assert_accepted(&st, &rec, &table, &report, "chown");
    Ok(())
}

/// pdinject's cache hard-links the proven files into ~/.debug; the user empties the
/// cache; the next run over the same recording proves the same files.
#[test]
fn emptied_build_id_cache_is_not_stale() -> Outcome {
    let st = setup("emptied_build_id_cache_is_not_stale")?;
    let rec = record(&st);
    let (table, report) = inject(&st, &rec, "first.data");
    assert_accepted(&st, &rec, &table, &report, "first run");
    if fs::metadata(&st.fx.libfix).unwrap().nlink() < 2 {
        return skip("the build-ID cache is on another filesystem (copies, no hard links)");
    }
    fs::remove_dir_all(test_home().join(".debug")).unwrap();
    for f in [&st.fx.prog, &st.fx.libfix] {
        assert_eq!(fs::metadata(f).unwrap().nlink(), 1);
        assert_changed_after(f, &rec);
    }
    let (table, report) = inject(&st, &rec, "second.data");
    assert_accepted(&st, &rec, &table, &report, "after the cache was emptied");
    Ok(())
}

/// perf hard-links every hit DSO into ~/.debug at the end of a recording made
/// without -B; emptying that cache unlinks them again. A `-B` recording made before
/// keeps its IDs.
#[test]
fn emptied_perf_cache_is_not_stale() -> Outcome {
    let st = setup("emptied_perf_cache_is_not_stale")?;
    let rec = record(&st);
    let later = record_prog(&st, &[], "later.data");
    assert!(later.exists());
    if fs::metadata(&st.fx.libfix).unwrap().nlink() < 2 {
        return skip("perf linked nothing into the test's ~/.debug");
    }
    fs::remove_dir_all(test_home().join(".debug")).unwrap();
    for f in [&st.fx.prog, &st.fx.libfix] {
        assert_eq!(fs::metadata(f).unwrap().nlink(), 1);
        assert_changed_after(f, &rec);
    }
    let (table, report) = inject(&st, &rec, "out.data");
    assert_accepted(&st, &rec, &table, &report, "perf's cache emptied");
    Ok(())
}

/// `cp -p` of a rebuild with 8 KiB more code over the recorded library: the recorded
/// mapping of its code is one page, the file's code segment three.
#[test]
fn cp_p_of_a_bigger_rebuild_is_stale() -> Outcome {
    let st = setup("cp_p_of_a_bigger_rebuild_is_stale")?;
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let rec = record(&st);
    run_ok(Command::new("cp").arg("-p").arg(&big).arg(&st.fx.libfix));
    assert_changed_after(&st.fx.libfix, &rec);
    assert_eq!(fs::metadata(&st.fx.libfix).unwrap().nlink(), 1);
    let (table, report) = inject(&st, &rec, "out.data");
    assert_stale(
        &st,
        &table,
        &report,
        &[
            "(ctime)",
            "layout is not the recorded one",
            "0x1000 bytes at file offset 0x1000",
        ],
        "cp -p of a bigger rebuild",
    );
    Ok(())
}

/// The same over a file that has another link (pdinject's cache entry): the link
/// count excuses nothing.
#[test]
fn cp_p_over_a_file_linked_in_the_cache_is_stale() -> Outcome {
    let st = setup("cp_p_over_a_file_linked_in_the_cache_is_stale")?;
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let rec = record(&st);
    let (table, report) = inject(&st, &rec, "first.data");
    assert_accepted(&st, &rec, &table, &report, "first run");
    run_ok(Command::new("cp").arg("-p").arg(&big).arg(&st.fx.libfix));
    assert_changed_after(&st.fx.libfix, &rec);
    if fs::metadata(&st.fx.libfix).unwrap().nlink() < 2 {
        eprintln!("note: the cache is on another filesystem here (copies, no hard links)");
    }
    let (table, report) = inject(&st, &rec, "second.data");
    assert_stale(
        &st,
        &table,
        &report,
        &["(ctime)", "layout is not the recorded one"],
        "cp -p over a file with a link in ~/.debug",
    );
    Ok(())
}

/// Rewritten in place (new bytes, new mtime), then `touch -d` back to the old mtime.
#[test]
fn touch_d_after_a_rewrite_is_stale() -> Outcome {
    let st = setup("touch_d_after_a_rewrite_is_stale")?;
    let big = rebuild(&st, "-DBIG", LIB_ID_BIG);
    let rec = record(&st);
    let old = fs::metadata(&st.fx.libfix).unwrap();
    run_ok(Command::new("cp").arg(&big).arg(&st.fx.libfix));
    let when = format!("@{}.{:09}", old.mtime(), old.mtime_nsec());
    run_ok(
        Command::new("touch")
            .arg("-d")
            .arg(&when)
            .arg(&st.fx.libfix),
    );
    let now = fs::metadata(&st.fx.libfix).unwrap();
    assert_eq!((now.ino(), now.mtime()), (old.ino(), old.mtime()));
    assert_changed_after(&st.fx.libfix, &rec);
    let (table, report) = inject(&st, &rec, "out.data");
    assert_stale(
        &st,
        &table,
        &report,
        &["(ctime)", "layout is not the recorded one"],
        "rewrite + touch -d",
    );
    Ok(())
}

/// The documented limit: `cp -p` of a rebuild whose code changed but whose segments
/// keep their page layout (8 more bytes of code in a one-page code segment). The
/// inode keeps no trace of the rewrite and the recording's mappings are the new
/// file's too, so nothing tells it from a chmod: the file is accepted and its ID
/// (the rebuild's, not the one recorded) is written. This asserts that it is, so a
/// rule that starts refusing it shows here.
#[test]
fn cp_p_of_a_same_layout_rebuild_is_the_limit() -> Outcome {
    let st = setup("cp_p_of_a_same_layout_rebuild_is_the_limit")?;
    let variant = rebuild(&st, "-DVARIANT", LIB_ID_VARIANT);
    assert_ne!(
        fs::read(&variant).unwrap(),
        fs::read(&st.fx.libfix).unwrap()
    );
    assert_eq!(
        code_pages(&variant),
        code_pages(&st.fx.libfix),
        "the rebuild was meant to keep the page layout of libfix.so's code"
    );
    let rec = record(&st);
    run_ok(
        Command::new("cp")
            .arg("-p")
            .arg(&variant)
            .arg(&st.fx.libfix),
    );
    assert_changed_after(&st.fx.libfix, &rec);
    let (table, report) = inject(&st, &rec, "out.data");
    let d = report_dso(&report, &s(&st.fx.libfix)).unwrap();
    assert_eq!(
        (d["build_id"].as_str(), d["source"].as_str()),
        (Some(LIB_ID_VARIANT), Some("elf")),
        "same-layout rebuild: {}",
        report_summary(&report)
    );
    assert_eq!(
        table.get(&s(&st.fx.libfix)).map(String::as_str),
        Some(LIB_ID_VARIANT)
    );
    Ok(())
}
