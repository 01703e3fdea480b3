//! (Symbols are left out of the `perf script` comparisons: once the table names
//! the vdso's ID, perf looks its image up in the test's empty build-ID cache and
//! prints `[unknown]` for vdso symbols, as it does for any injected file.)
//!
//! `--in-place`: the same table (and MMAP2 records) as an out-of-place run, only the
//! changed bytes written, the modification time kept, and a kill -9 at every step
//! (the `PDINJECT_CRASH_AT` test hook) leaves a file perf reads in the old or the
//! new state, or one the next run restores and finishes.

use super::common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

/// A copy of `src` with its modification time (pdinject dates a recording by it).
fn copy_of(src: &Path, dst: &Path) {
    std::fs::copy(src, dst).unwrap();
    run_ok(
        std::process::Command::new("touch")
            .arg("-r")
            .arg(src)
            .arg(dst),
    );
}

fn mtime(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

fn in_place(file: &Path, mode: &str, crash_at: Option<usize>) -> std::process::Output {
    let mut c = pdinject();
    c.args([mode, "--in-place", "-q"]).arg(file);
    if let Some(n) = crash_at {
        c.env("PDINJECT_CRASH_AT", n.to_string());
    }
    run(&mut c)
}

fn journal(file: &Path) -> PathBuf {
    file.with_file_name(format!(
        ".{}.pdinject-journal",
        file.file_name().unwrap().to_string_lossy()
    ))
}

#[test]
fn in_place_writes_what_a_new_file_gets() {
    let t = "in_place_writes_what_a_new_file_gets";
    let Some(st) = setup(t) else { return };
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    for mode in ["--buildids", "--mmap2-buildid-all"] {
        let out = st.dir.join("out.data");
        pdinject_ok(&b, &out, &[mode]);
        let f = st.dir.join("f.data");
        copy_of(&b, &f);
        let before = mtime(&f);
        let o = in_place(&f, mode, None);
        assert!(o.status.success(), "{mode}: {}", tail(&o.stderr));
        assert_eq!(
            buildid_list(&st.perf, &f),
            buildid_list(&st.perf, &out),
            "{mode}: in place and a new file list the same IDs"
        );
        assert_eq!(
            mmap2_build_ids(&st.perf, &f).get(&s(&st.fx.prog)),
            (mode != "--buildids").then(|| PROG_ID.to_string()).as_ref(),
            "{mode}: prog's MMAP2"
        );
        assert_same_script(&st.perf, &b, &f, &["-F", "comm,tid,time,event,ip,dso"]);
        assert_eq!(mtime(&f), before, "{mode}: the modification time is kept");
        assert_eq!(
            data_section(&f),
            data_section(&b),
            "{mode}: the data section keeps its place and size"
        );
        assert!(!journal(&f).exists());
        if let Some(p612) = perf612(t) {
            assert_eq!(
                buildid_list(&p612, &f),
                buildid_list(&p612, &out),
                "{mode}: perf 6.12"
            );
            assert_same_script(&p612, &b, &f, &["-F", "comm,tid,time,event,ip,dso"]);
        }
        // Again: nothing to change, nothing written.
        let len = std::fs::metadata(&f).unwrap().len();
        let o = in_place(&f, mode, None);
        assert!(o.status.success());
        assert_eq!(
            std::fs::metadata(&f).unwrap().len(),
            len,
            "{mode}: second run"
        );
    }
    // Refusals: a stream, two paths, an out-of-place run over a journal.
    let o = pdinject_run(["--in-place", "a", "b"]);
    assert_eq!(o.status.code(), Some(2));
    let f = st.dir.join("f.data");
    std::fs::write(journal(&f), b"junk").unwrap();
    let o = pdinject_run([f.as_os_str(), st.dir.join("x.data").as_os_str()]);
    assert_eq!(o.status.code(), Some(1), "{}", tail(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("journal"));
    // A torn journal (the run died writing it) is dropped by the next in-place run.
    let o = in_place(&f, "--buildids", None);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert!(!journal(&f).exists());
}

/// Kills pdinject at every step of an in-place run (and at the first steps of the
/// run that restores), for --buildids and --mmap2-buildid-all on a `-B` recording
/// (the table grows by an entry) and --buildid-all on a file that has a BUILD_ID
/// section (one 16-byte switch); each time perf must
/// read the file in the old or the new state, or the next run must restore and
/// finish it.
#[test]
fn in_place_survives_kill_at_every_step() {
    let t = "in_place_survives_kill_at_every_step";
    let Some(st) = setup(t) else { return };
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    let fields = ["-F", "comm,tid,time,event,ip,dso"];
    let old_script = perf_script(&st.perf, &b, &fields);
    // A file that already has a BUILD_ID section: --buildid-all adds libunused with
    // the one-write switch.
    let with_ids = st.dir.join("ids.data");
    copy_of(&b, &with_ids);
    assert!(in_place(&with_ids, "--buildids", None).status.success());
    let mut points = 0;
    let mut restored = 0;
    for (base, mode) in [
        (&b, "--buildids"),
        (&b, "--mmap2-buildid-all"),
        (&with_ids, "--buildid-all"),
    ] {
        let b = base;
        let old_ids = buildid_list(&st.perf, b);
        let reference = st.dir.join("ref.data");
        copy_of(b, &reference);
        assert!(in_place(&reference, mode, None).status.success());
        let new_ids = buildid_list(&st.perf, &reference);
        let new_mmaps = mmap2_build_ids(&st.perf, &reference);
        assert_ne!(old_ids, new_ids, "{mode}: the run must change the table");
        let states: [&BTreeMap<String, String>; 2] = [&old_ids, &new_ids];
        let f = st.dir.join("f.data");
        let mut finished = false;
        for n in 1..400 {
            copy_of(b, &f);
            let o = in_place(&f, mode, Some(n));
            if o.status.success() {
                finished = true;
                break;
            }
            assert_eq!(
                o.status.signal(),
                Some(9),
                "{mode} kill point {n}: {}",
                tail(&o.stderr)
            );
            points += 1;
            let readable = run(st.perf.cmd().args(["script", "-i"]).arg(&f).args(fields));
            let ids = run(st.perf.cmd().args(["buildid-list", "-i"]).arg(&f));
            let ok = readable.status.success()
                && String::from_utf8_lossy(&readable.stdout) == old_script
                && ids.status.success()
                && states.contains(&&parse_buildid_list(&String::from_utf8_lossy(&ids.stdout)));
            if !ok {
                assert!(
                    journal(&f).exists(),
                    "{mode} kill point {n}: perf does not read the file in the old or the new state, and there is no journal to restore it"
                );
            }
            if journal(&f).exists() {
                restored += 1;
                // A kill during the restore is undone by the run after it.
                for m in 1..3 {
                    let o = in_place(&f, mode, Some(m));
                    if o.status.success() {
                        break;
                    }
                    points += 1;
                }
            }
            let o = in_place(&f, mode, None);
            assert!(
                o.status.success(),
                "{mode} after kill point {n}: {}",
                tail(&o.stderr)
            );
            assert!(
                !journal(&f).exists(),
                "{mode} after kill point {n}: journal left"
            );
            assert_eq!(
                buildid_list(&st.perf, &f),
                new_ids,
                "{mode} after kill point {n}: the next run finishes the job"
            );
            assert_eq!(
                mmap2_build_ids(&st.perf, &f),
                new_mmaps,
                "{mode} after kill point {n}"
            );
            let now = perf_script(&st.perf, &f, &fields);
            assert!(
                now == old_script,
                "{mode} after kill point {n}: {}",
                first_diff(&old_script, &now)
            );
            assert_eq!(mtime(&f), mtime(b), "{mode} after kill point {n}: mtime");
        }
        assert!(finished, "{mode}: the run never finished");
    }
    eprintln!("{t}: {points} kill points, {restored} restored from the journal");
    assert!(points >= 40, "only {points} kill points");
}
