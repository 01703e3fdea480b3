//! SIGINT, SIGTERM and SIGHUP in the middle of a run (issue 29): every temporary of
//! every output form is removed and the process ends by the signal (exit 130 for
//! Ctrl-C in a shell). The run is stopped at a named point by the test hook
//! `PDINJECT_TEST_PAUSE_AT` (src/signals.rs, `hooks`), which says so on stderr, so
//! the signal arrives at a known moment, not after a guessed delay.

use super::common::*;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SIGNALS: [(libc::c_int, &str); 3] = [
    (libc::SIGINT, "SIGINT"),
    (libc::SIGTERM, "SIGTERM"),
    (libc::SIGHUP, "SIGHUP"),
];

/// Runs `cmd` with the hook stopping it at `point`, sends `sig` once it says it is
/// there, and checks it ended by that signal. Returns its stderr.
fn signal_at(cmd: &mut Command, point: &str, sig: libc::c_int, ctx: &str) -> String {
    let mut child = cmd
        .env("PDINJECT_TEST_PAUSE_AT", point)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{ctx}: cannot run {cmd:?}: {e}"));
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let want = format!("pdinject: paused at {point}");
    loop {
        let mut line = String::new();
        // EOF: it ended without reaching the point.
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            let st = child.wait().unwrap();
            panic!("{ctx}: never paused at {point} ({st:?}):\n{seen}");
        }
        seen += &line;
        if line.trim_end() == want {
            break;
        }
    }
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    let st = child.wait().unwrap();
    seen += &rest;
    assert_eq!(
        st.signal(),
        Some(sig),
        "{ctx}: did not end by signal {sig} ({st:?}):\n{seen}"
    );
    seen
}

/// The names in `dir` that a run's temporaries have (`.pdi-PID-N.tmp`, and its
/// renamed-away `.gone` form), and the in-place journal.
fn temps_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".pdi-") || n.contains("pdinject"))
        .collect()
}

fn demo_copy(dir: &Path) -> PathBuf {
    let input = dir.join("demo.data");
    fs::copy(manifest_dir().join("testdata/demo/demo.data"), &input).unwrap();
    input
}

/// A file output and its `--report`, both written under temporary names and not yet
/// renamed: neither stays, and neither target appears.
#[test]
fn a_signal_removes_the_output_and_report_temps() -> Outcome {
    for (sig, name) in SIGNALS {
        let d = tempfile::tempdir().unwrap();
        let input = demo_copy(d.path());
        let out = d.path().join("out.data");
        let report = d.path().join("report.json");
        signal_at(
            pdinject()
                .args(["-N", "--report"])
                .arg(&report)
                .arg(&input)
                .arg(&out),
            "commit",
            sig,
            &format!("file output, {name}"),
        );
        assert!(
            !out.exists() && !report.exists(),
            "{name}: an output appeared"
        );
        assert_eq!(temps_in(d.path()), Vec::<String>::new(), "{name}");
    }
    Ok(())
}

/// In place: the signal waits for the journaled section (the file is then whole, in
/// its new state) and leaves no journal.
#[test]
fn a_signal_in_place_leaves_no_journal() -> Outcome {
    for (sig, name) in SIGNALS {
        let d = tempfile::tempdir().unwrap();
        let input = demo_copy(d.path());
        let before = fs::read(&input).unwrap();
        signal_at(
            pdinject().args(["-N", "--in-place"]).arg(&input),
            "in-place",
            sig,
            &format!("in place, {name}"),
        );
        assert_eq!(temps_in(d.path()), Vec::<String>::new(), "{name}");
        // The new state, whole: the table an out-of-place run writes, as perf reads
        // it.
        let fresh = d.path().join("fresh.data");
        fs::write(&fresh, &before).unwrap();
        let out = d.path().join("want.data");
        let o = run(pdinject().arg("-N").arg(&fresh).arg(&out));
        assert!(o.status.success(), "{}", tail(&o.stderr));
        assert_ne!(fs::read(&input).unwrap(), before, "{name}: unchanged");
        if let Some(perf) = part(perf()) {
            assert_eq!(
                buildid_list(&perf, &input),
                buildid_list(&perf, &out),
                "{name}: the file is not the finished in-place output"
            );
        }
    }
    Ok(())
}

/// A `perf record --threads` directory to a directory output: the copier creates the
/// `data.N` parts while the handler empties the temp directory. The hook makes a part
/// appear between the handler's listing and its rmdir, the interleaving that left
/// `.pdi-PID-N.tmp` behind.
#[test]
fn a_signal_removes_a_threads_directory_output() -> Outcome {
    const T: &str = "a_signal_removes_a_threads_directory_output";
    let st = setup(T)?;
    let input = st.dir.join("threads.data");
    record_in(
        &st.perf,
        &st.dir,
        &input,
        &["-B", "-g", "--threads", "--", "./prog"],
    );
    assert!(input.is_dir(), "perf record --threads wrote no directory");
    for (sig, name) in SIGNALS {
        let outdir = st.dir.join(format!("out-{name}"));
        fs::create_dir(&outdir).unwrap();
        let out = outdir.join("out.data");
        signal_at(
            pdinject().arg("-N").arg(&input).arg(&out),
            "dir-part",
            sig,
            &format!("--threads directory, {name}"),
        );
        assert!(!out.exists(), "{name}: the output appeared");
        assert_eq!(temps_in(&outdir), Vec::<String>::new(), "{name}");
    }
    Ok(())
}

/// A build-ID cache entry written under its temporary name (`.NAME.pdinject-PID-N.tmp`
/// beside it) when the signal comes: removed too.
#[test]
fn a_signal_removes_the_cache_temps() -> Outcome {
    const T: &str = "a_signal_removes_the_cache_temps";
    let st = setup(T)?;
    let input = record_prog(&st, &["-B", "-g"], "rec.data");
    for (sig, name) in SIGNALS {
        let cache = st.dir.join(format!("cache-{name}"));
        let out = st.dir.join(format!("out-{name}.data"));
        signal_at(
            pdinject()
                .arg("--buildid-dir")
                .arg(&cache)
                .arg(&input)
                .arg(&out),
            "cache",
            sig,
            &format!("cache, {name}"),
        );
        let mut left = Vec::new();
        let mut dirs = vec![cache.clone()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(p);
                } else if p.to_string_lossy().ends_with(".tmp") {
                    left.push(p);
                }
            }
        }
        assert_eq!(left, Vec::<PathBuf>::new(), "{name}: cache temps left");
        assert_eq!(temps_in(&st.dir), Vec::<String>::new(), "{name}");
    }
    Ok(())
}
