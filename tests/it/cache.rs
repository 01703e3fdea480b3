//! perf's build-ID cache as pdinject fills it (issue 8): the tree perf inject makes,
//! the vdso on a machine with an empty cache, perf's own buildid.sh scenario, two
//! runs over one recording, --symfs, --archive and debuginfod. Every command runs
//! with the test's own empty HOME (common::test_home), so `~/.debug` starts empty.

use super::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `TYPE MODE PATH -> LINK` for every entry under `dir`, `[vdso]` ones apart.
fn tree(dir: &Path) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let (mut main, mut vdso) = (BTreeMap::new(), BTreeMap::new());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            // pdinject's record of the links it made (docs/cache.md), which perf
            // ignores: not part of perf's tree.
            if p == dir.join(".pdinject-links") {
                continue;
            }
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let what = if m.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", m.permissions().mode() & 0o777)
            } else {
                format!("file {:o}", m.permissions().mode() & 0o777)
            };
            let vd = rel.contains("[vdso]") || what.contains("[vdso]");
            if vd { &mut vdso } else { &mut main }.insert(rel, what);
        }
    }
    (main, vdso)
}

fn cache_dir() -> PathBuf {
    test_home().join(".debug")
}

/// `perf report --stdio` symbol column.
fn report_syms(perf: &Perf, file: &Path, home: &Path) -> String {
    let o = run_ok(
        perf.cmd()
            .env("HOME", home)
            .args(["report", "--stdio", "--sort", "dso,sym", "-i"])
            .arg(file),
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The cache pdinject fills has perf inject -b's layout, file for file (types, modes,
/// link targets); pdinject also caches the vdso, as perf record does.
#[test]
fn cache_tree_is_perf_injects() -> Outcome {
    let st = setup("cache_tree_is_perf_injects")?;
    let rec = record_prog(&st, &["-N"], "rec.data");
    let (perf_dir, ours) = (st.dir.join("perf-cache"), st.dir.join("our-cache"));
    run_ok(
        st.perf
            .cmd()
            .arg("--buildid-dir")
            .arg(&perf_dir)
            .args(["inject", "-b", "-i"])
            .arg(&rec)
            .arg("-o")
            .arg(st.dir.join("perf.data")),
    );
    let (_, r) = pdinject_ok(
        &rec,
        &st.dir.join("out.data"),
        &["--buildid-dir", &s(&ours)],
    );
    let (a, _) = tree(&perf_dir);
    let (mut b, vdso) = tree(&ours);
    let vid = vdso_build_id().unwrap();
    // The directory of the vdso's .build-id link, unless another ID shares it.
    let vdir = format!(".build-id/{}", &vid[..2]);
    if !a.contains_key(&vdir) {
        b.remove(&vdir);
    }
    assert_eq!(a, b, "perf inject's cache tree differs from pdinject's");
    assert!(a.keys().any(|k| k.ends_with("/elf")), "{a:?}");
    assert_eq!(
        vdso.get(&format!("[vdso]/{vid}/vdso")).map(String::as_str),
        Some("file 600"),
        "{vdso:?}"
    );
    // perf itself lists what pdinject cached.
    let list = |d: &Path| {
        let o = run_ok(
            st.perf
                .cmd()
                .arg("--buildid-dir")
                .arg(d)
                .args(["buildid-cache", "-l"]),
        );
        let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(String::from)
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&perf_dir), list(&ours));
    assert_eq!(r["cache"]["dir"].as_str(), Some(s(&ours).as_str()), "{r}");
    assert!(r["cache"]["added"].as_u64().unwrap() >= 3, "{r}");
    let prog = report_dso(&r, &s(&st.fx.prog)).unwrap();
    assert_eq!(prog["cached"], "added", "{}", report_summary(&r));
    assert_eq!(
        prog["cache_entry"].as_str(),
        Some(format!("{}/{PROG_ID}", s(&st.fx.prog).trim_start_matches('/')).as_str())
    );
    // The default is ~/.debug; -N fills nothing.
    pdinject_ok(&rec, &st.dir.join("out2.data"), &["-N"]);
    assert!(!cache_dir().exists(), "-N wrote a cache");
    pdinject_ok(&rec, &st.dir.join("out3.data"), &[]);
    assert!(cache_dir().join(".build-id/c0").is_dir());
    // buildid.dir of ~/.perfconfig.
    let cfg = st.dir.join("cfg-cache");
    fs::write(
        test_home().join(".perfconfig"),
        format!("[buildid]\n\tdir = {}\n", cfg.display()),
    )
    .unwrap();
    pdinject_ok(&rec, &st.dir.join("out4.data"), &[]);
    assert!(cfg.join(".build-id/c0").is_dir(), "buildid.dir not used");
    fs::remove_file(test_home().join(".perfconfig")).unwrap();
    Ok(())
}

/// The defect of issue 8: with an empty cache, perf names vdso frames of pdinject's
/// output as it names them in the input.
#[test]
fn empty_cache_vdso_frames_are_named() -> Outcome {
    let st = setup("empty_cache_vdso_frames_are_named")?;
    let src = st.dir.join("clock.c");
    fs::write(
        &src,
        "#include <time.h>\nint main(void){struct timespec t;volatile long s=0;\
         for(long i=0;i<4000000;i++){clock_gettime(CLOCK_MONOTONIC,&t);s+=t.tv_nsec;}return 0;}\n",
    )
    .unwrap();
    gcc(&[
        "-o".as_ref(),
        st.dir.join("clock").as_os_str(),
        src.as_os_str(),
    ]);
    let rec = st.dir.join("clock.data");
    // -B: no IDs and no cache, as on a fresh machine.
    record_in(&st.perf, &st.dir, &rec, &["-B", "--", "./clock"]);
    let before = perf_script(&st.perf, &rec, SCRIPT_ARGS);
    let vdso_named = before
        .lines()
        .filter(|l| l.contains("[vdso]") && !l.contains("[unknown]"))
        .count();
    if vdso_named == 0 {
        return skip("no sample fell in the vdso here");
    }
    assert!(!cache_dir().exists());
    let out = st.dir.join("out.data");
    let (_, r) = pdinject_ok(&rec, &out, &[]);
    assert!(
        cache_dir()
            .join(format!("[vdso]/{}/vdso", vdso_build_id().unwrap()))
            .is_file(),
        "{r}"
    );
    assert_same_script(&st.perf, &rec, &out, SCRIPT_ARGS);
    // Without the cache, the defect (what -N leaves).
    fs::remove_dir_all(cache_dir()).unwrap();
    let bare = st.dir.join("bare.data");
    pdinject_ok(&rec, &bare, &["-N"]);
    let after = perf_script(&st.perf, &bare, SCRIPT_ARGS);
    assert!(
        after.contains("[unknown] ([vdso])"),
        "perf named vdso frames without the cache: the test no longer shows the defect"
    );
    Ok(())
}

/// tools/perf/tests/shell/buildid.sh: record into an empty HOME, add the IDs, delete
/// the program: perf report still names its functions, from the cache.
#[test]
fn deleted_program_is_symbolised_from_the_cache() -> Outcome {
    let st = setup("deleted_program_is_symbolised_from_the_cache")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let out = st.dir.join("out.data");
    let (_, r) = pdinject_ok(&rec, &out, &[]);
    assert_eq!(
        report_dso(&r, &s(&st.fx.prog)).unwrap()["cached"],
        "added",
        "{}",
        report_summary(&r)
    );
    for f in [&st.fx.prog, &st.fx.libfix, &st.fx.libunused] {
        fs::remove_file(f).unwrap();
    }
    for perf in [Some(st.perf.clone()), part(perf612())]
        .into_iter()
        .flatten()
    {
        let rep = report_syms(&perf, &out, &test_home());
        assert!(
            rep.contains("prog_spin"),
            "{}: perf report:\n{rep}",
            perf.name
        );
        assert!(
            rep.contains("fix_spin"),
            "{}: perf report:\n{rep}",
            perf.name
        );
    }
    Ok(())
}

/// Hard links move the DSO's ctime; a second run over the same recording still
/// proves the files and finds the entries present.
#[test]
fn second_run_after_hard_links_keeps_every_id() -> Outcome {
    let st = setup("second_run_after_hard_links_keeps_every_id")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let (_, a) = pdinject_ok(&rec, &st.dir.join("a.data"), &[]);
    let nlink = {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&st.fx.prog).unwrap().nlink()
    };
    let (_, b) = pdinject_ok(&rec, &st.dir.join("b.data"), &[]);
    for (r, run) in [(&a, "first"), (&b, "second")] {
        assert_eq!(r["ids_missing"], 0, "{run} run:\n{}", report_summary(r));
    }
    let prog = |r: &serde_json::Value| report_dso(r, &s(&st.fx.prog)).unwrap().clone();
    assert_eq!(prog(&b)["build_id"], PROG_ID);
    assert_eq!(prog(&b)["source"], "elf");
    assert_eq!(prog(&a)["cached"], "added");
    assert_eq!(prog(&b)["cached"], "present", "{}", report_summary(&b));
    assert_eq!(b["cache"]["added"], 0, "{b}");
    if nlink < 2 {
        eprintln!("note: the cache is on another filesystem here (copies, no hard links)");
    }
    Ok(())
}

/// --symfs: IDs come from the sysroot's copies as they were when recorded, though
/// the host's files changed since.
#[test]
fn symfs_ids_are_the_recorded_ones() -> Outcome {
    let st = setup("symfs_ids_are_the_recorded_ones")?;
    let root = st.dir.join("sysroot");
    let inside = root.join(s(&st.dir).trim_start_matches('/'));
    fs::create_dir_all(&inside).unwrap();
    for f in [&st.fx.prog, &st.fx.libfix, &st.fx.libunused] {
        // cp -p keeps the modification time, as an image copy does.
        run_ok(Command::new("cp").arg("-p").arg(f).arg(&inside));
    }
    let rec = record_prog(&st, &["-B"], "rec.data");
    std::thread::sleep(Duration::from_millis(50));
    // The host's program is rebuilt after the recording.
    build_prog(&st.fx.prog, PROG_ID_B, true, &st.dir);
    let (_, plain) = pdinject_ok(&rec, &st.dir.join("plain.data"), &["-N"]);
    assert_eq!(
        report_dso(&plain, &s(&st.fx.prog)).unwrap()["reason"],
        "stale"
    );
    let (o, r) = pdinject_ok(&rec, &st.dir.join("out.data"), &["--symfs", &s(&root)]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("read under --symfs"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let prog = report_dso(&r, &s(&st.fx.prog)).unwrap();
    assert_eq!(prog["build_id"], PROG_ID, "{}", report_summary(&r));
    assert_eq!(prog["source"], "symfs");
    assert_eq!(
        report_dso(&r, &s(&st.fx.libfix)).unwrap()["build_id"],
        LIB_ID
    );
    let ids = buildid_list(&st.perf, &st.dir.join("out.data"));
    assert_eq!(ids.get(&s(&st.fx.prog)).map(String::as_str), Some(PROG_ID));
    // The cache holds the sysroot's copy.
    let elf = cache_dir().join(format!(
        "{}/{PROG_ID}/elf",
        s(&st.fx.prog).trim_start_matches('/')
    ));
    assert_eq!(elf_build_id(&elf).as_deref(), Some(PROG_ID));
    // A sysroot copy modified after the recording is stale.
    build_prog(&inside.join("prog"), PROG_ID_B, true, &st.dir);
    let (_, r) = pdinject_ok(
        &rec,
        &st.dir.join("out2.data"),
        &["-N", "--symfs", &s(&root)],
    );
    let prog = report_dso(&r, &s(&st.fx.prog)).unwrap();
    assert_eq!(prog["reason"], "stale", "{}", report_summary(&r));
    Ok(())
}

/// --archive: unpacked into another HOME's ~/.debug, with the program and the
/// original cache gone, perf report names the program's functions.
#[test]
fn archive_unpacked_elsewhere_symbolises() -> Outcome {
    let st = setup("archive_unpacked_elsewhere_symbolises")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let out = st.dir.join("out.data");
    let tar = st.dir.join("out.tar");
    pdinject_ok(&rec, &out, &["--archive", &s(&tar)]);
    let listing = run_ok(Command::new("tar").arg("tf").arg(&tar));
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.contains(&format!(".build-id/c0/{}", &PROG_ID[2..])),
        "{listing}"
    );
    let home2 = st.dir.join("home2");
    fs::create_dir_all(home2.join(".debug")).unwrap();
    run_ok(
        Command::new("tar")
            .arg("xf")
            .arg(&tar)
            .arg("-C")
            .arg(home2.join(".debug")),
    );
    fs::remove_dir_all(cache_dir()).unwrap();
    for f in [&st.fx.prog, &st.fx.libfix, &st.fx.libunused] {
        fs::remove_file(f).unwrap();
    }
    let rep = report_syms(&st.perf, &out, &home2);
    assert!(rep.contains("prog_spin"), "perf report:\n{rep}");
    assert!(rep.contains("fix_spin"), "perf report:\n{rep}");
    Ok(())
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// debuginfod: an ID known from --known-build-ids whose file is gone is fetched from
/// Debian's debuginfod (started here over a directory of the fixtures) into the
/// cache, and perf report names the program's functions.
#[test]
fn debuginfod_fetches_a_missing_program() -> Outcome {
    let test = "debuginfod_fetches_a_missing_program";
    if Command::new("debuginfod")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        return skip("debuginfod is not installed (apt install debuginfod)");
    }
    let st = setup(test)?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let served = st.dir.join("served");
    fs::create_dir_all(&served).unwrap();
    fs::copy(&st.fx.prog, served.join("prog")).unwrap();
    fs::remove_file(&st.fx.prog).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("debuginfod")
        .args(["-p", &port.to_string(), "-d"])
        .arg(st.dir.join("db.sqlite"))
        .arg("-F")
        .arg(&served)
        .env("HOME", test_home())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        return skip("debuginfod does not start");
    };
    let _server = Server(child);
    let url = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..300 {
        if debuginfod_serves(&url, PROG_ID) {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !ready {
        return skip("debuginfod did not serve the fixture within 30 s");
    }
    let out = st.dir.join("out.data");
    let known = format!("{PROG_ID} {}", s(&st.fx.prog));
    let (_, r) = pdinject_ok(
        &rec,
        &out,
        &["--known-build-ids", &known, "--debuginfod", &url],
    );
    let prog = report_dso(&r, &s(&st.fx.prog)).unwrap();
    assert_eq!(prog["source"], "known", "{}", report_summary(&r));
    assert_eq!(prog["cached"], "fetched", "{}", report_summary(&r));
    let rep = report_syms(&st.perf, &out, &test_home());
    assert!(rep.contains("prog_spin"), "perf report:\n{rep}");
    // DEBUGINFOD_URLS is read only when asked (bare --debuginfod), as perf does.
    for (extra, want) in [(&[][..], "not-cached"), (&["--debuginfod"][..], "fetched")] {
        let c = st.dir.join(format!("c{}", extra.len()));
        let rep = st.dir.join("r.json");
        let mut cmd = pdinject();
        cmd.env("DEBUGINFOD_URLS", &url)
            .args([
                "--known-build-ids",
                &known,
                "--buildid-dir",
                &s(&c),
                "--report",
                &s(&rep),
            ])
            .arg(&rec)
            .arg(st.dir.join("out2.data"))
            .args(extra);
        run_ok(&mut cmd);
        let r = read_report(&rep);
        assert_eq!(
            report_dso(&r, &s(&st.fx.prog)).unwrap()["cached"],
            want,
            "{extra:?}: {}",
            report_summary(&r)
        );
    }
    Ok(())
}

/// Every file name of the cache that perf reads is complete: each `.build-id` link
/// names a directory whose files carry the link's ID.
fn assert_consistent(dir: &Path, what: &str) {
    let ids = dir.join(".build-id");
    let Ok(heads) = fs::read_dir(&ids) else {
        return;
    };
    for h in heads.flatten() {
        for l in fs::read_dir(h.path()).unwrap().flatten() {
            let id = format!(
                "{}{}",
                h.file_name().to_string_lossy(),
                l.file_name().to_string_lossy()
            );
            if id.contains(".tmp") {
                continue;
            }
            let target = fs::read_link(l.path()).unwrap();
            let entry = h.path().join(&target);
            assert!(
                entry.is_dir(),
                "{what}: {} names no directory",
                l.path().display()
            );
            let files: Vec<String> = fs::read_dir(&entry)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect();
            for n in &files {
                let p = entry.join(n);
                match n.as_str() {
                    "elf" | "debug" | "vdso" => assert_eq!(
                        elf_build_id(&p).as_deref(),
                        Some(id.as_str()),
                        "{what}: {} is not complete",
                        p.display()
                    ),
                    "kallsyms" => {
                        let k = fs::read(&p).unwrap();
                        assert!(
                            k.ends_with(b"\n") && k.len() > 1000,
                            "{what}: short kallsyms"
                        );
                    }
                    _ => {}
                }
            }
            assert!(
                files
                    .iter()
                    .any(|n| ["elf", "vdso", "kallsyms"].contains(&n.as_str())),
                "{what}: {} has no file: {files:?}",
                entry.display()
            );
        }
    }
}

/// A run killed (SIGKILL) before any of its cache commits leaves only complete
/// entries; the next run completes the cache and perf reads it.
#[test]
fn killed_runs_leave_only_complete_entries() -> Outcome {
    let st = setup("killed_runs_leave_only_complete_entries")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let dir = st.dir.join("c");
    let mut killed = 0;
    for n in 1..=24 {
        let o = run(pdinject()
            .env("PDINJECT_TEST_CACHE_ABORT", n.to_string())
            .args(["-q", "--buildid-dir", &s(&dir)])
            .arg(&rec)
            .arg(st.dir.join(format!("k{n}.data"))));
        assert_consistent(
            &dir,
            &format!("killed before commit {n} ({})", status_str(&o)),
        );
        if o.status.success() {
            break;
        }
        killed += 1;
    }
    // The hook is built only with the test-hooks feature: a build without it would
    // pass this test without killing anything.
    assert!(killed > 0, "PDINJECT_TEST_CACHE_ABORT never killed a run");
    let out = st.dir.join("out.data");
    let (_, r) = pdinject_ok(&rec, &out, &["--buildid-dir", &s(&dir)]);
    assert_eq!(r["cache"]["not_cached"], 0, "{r}");
    assert_consistent(&dir, "after a full run");
    let o = run_ok(
        st.perf
            .cmd()
            .arg("--buildid-dir")
            .arg(&dir)
            .args(["buildid-cache", "-l"]),
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains(PROG_ID));
    Ok(())
}

/// Four runs filling one cache at once: every run succeeds, each entry is added by
/// exactly one of them, and the cache is complete.
#[test]
fn concurrent_runs_fill_one_cache() -> Outcome {
    let st = setup("concurrent_runs_fill_one_cache")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let dir = st.dir.join("c");
    let children: Vec<_> = (0..4)
        .map(|i| {
            pdinject()
                .args(["-q", "--buildid-dir", &s(&dir), "--report"])
                .arg(st.dir.join(format!("r{i}.json")))
                .arg(&rec)
                .arg(st.dir.join(format!("o{i}.data")))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let mut added = 0;
    for i in 0..4 {
        let r = read_report(&st.dir.join(format!("r{i}.json")));
        let p = report_dso(&r, &s(&st.fx.prog)).unwrap();
        assert!(p["cached"] == "added" || p["cached"] == "present", "{r}");
        added += (p["cached"] == "added") as u32;
    }
    assert_eq!(added, 1, "prog added by {added} runs");
    assert_consistent(&dir, "after concurrent runs");
    Ok(())
}

/// Recordings made on other machines (the quipper corpus) never put this machine's
/// kernel symbols or vdso into the cache, and what they do cache is complete.
#[test]
fn other_hosts_never_cache_this_kernel_or_vdso() -> Outcome {
    let dir = shared_dir()?;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("c");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("perf.data") && !n.ends_with(".buildids"))
        .collect();
    names.sort();
    for name in &names {
        let o = run(pdinject()
            .args(["-q", "--buildid-dir", &s(&cache)])
            .arg(dir.join(name))
            .arg(tmp.path().join("out")));
        let _ = o;
        assert_consistent(&cache, name);
    }
    for special in ["[kernel.kallsyms]", "[vdso]"] {
        assert!(
            !cache.join(special).exists(),
            "a recording of another machine cached this machine's {special}"
        );
    }
    Ok(())
}

/// Pipe mode fills the cache as it decides each DSO: a live pipeline into an empty
/// cache, then the program deleted, and perf report names its functions.
#[test]
fn pipe_mode_fills_the_cache() -> Outcome {
    let st = setup("pipe_mode_fills_the_cache")?;
    let out = st.dir.join("out.data");
    let mut rec = st
        .perf
        .cmd()
        .current_dir(&st.dir)
        .args(["record", "-q", "-B", "-o", "-", "--", "./prog"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = rec.stdout.take().unwrap();
    let rep = st.dir.join("r.json");
    let o = run(pdinject()
        .args(["--report", &s(&rep), "-"])
        .arg(&out)
        .stdin(stdin));
    assert!(rec.wait().unwrap().success());
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let r = read_report(&rep);
    assert_eq!(
        report_dso(&r, &s(&st.fx.prog)).unwrap()["cached"],
        "added",
        "{}",
        report_summary(&r)
    );
    fs::remove_file(&st.fx.prog).unwrap();
    let syms = report_syms(&st.perf, &out, &test_home());
    assert!(syms.contains("prog_spin"), "perf report:\n{syms}");
    Ok(())
}
