//! Build-ID MMAP2 output (`--mmap2-buildid-all`, `--mmap2-buildids`) against the
//! kernel's own build-ID MMAP2 records (`perf record --buildid-mmap` of the same
//! binaries), and `--buildid-mmap` recordings as input.

use super::common::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// The kernel's IDs for the fixtures, or a `Skip` when it writes none here.
fn kernel_oracle(st: &Setup) -> Result<BTreeMap<String, String>, Skip> {
    let bm = record_prog(st, &["--buildid-mmap", "-g"], "oracle.data");
    let ids = mmap2_build_ids(&st.perf, &bm);
    if ids.get(&s(&st.fx.prog)).map(String::as_str) != Some(PROG_ID) {
        return skip(format!(
            "kernel did not put build ids in MMAP2 (got {ids:?})"
        ));
    }
    Ok(ids)
}

/// `perf script` of the samples (mapping events aside) is the same for both files.
/// vdso symbols are left out: once the table names the vdso's ID, perf looks its
/// image up in the test's empty build-ID cache and prints `[unknown]` (streams print
/// callchain symbols whatever `-F` says).
fn same_samples(perf: &Perf, a: &Path, b: &Path) {
    let args = ["-F", "comm,tid,time,event,ip,dso"];
    let norm = |f: &Path| -> String {
        perf_script(perf, f, &args)
            .lines()
            .map(
                |l| match (l.contains("([vdso])"), l.trim_start().split_once(' ')) {
                    (true, Some((ip, _))) => format!("{ip} [vdso]"),
                    _ => l.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (x, y) = (norm(a), norm(b));
    assert!(
        x == y,
        "{}: samples differ between {} and {}:\n{}",
        perf.name,
        a.display(),
        b.display(),
        first_diff(&x, &y)
    );
    assert!(!x.is_empty());
}

fn mmap_lines(perf: &Perf, f: &Path) -> usize {
    perf_script(perf, f, &["--show-mmap-events", "-F", "comm,tid,time,ip"])
        .lines()
        .filter(|l| l.contains("PERF_RECORD_MMAP"))
        .count()
}

/// Checks an output's MMAP2 IDs: the kernel's for every path in `want`, none for
/// the paths in `none`.
fn check_ids(perf: &Perf, out: &Path, want: &BTreeMap<String, String>, none: &[String], ctx: &str) {
    let got = mmap2_build_ids(perf, out);
    for (path, id) in want {
        assert_eq!(
            got.get(path),
            Some(id),
            "{ctx}: MMAP2 of {path} should carry the kernel's {id}; MMAP2 IDs of the output:\n{}",
            fmt_map(&got)
        );
    }
    for path in none {
        assert!(
            !got.contains_key(path),
            "{ctx}: {path} must stay in the classic form; got {:?}",
            got.get(path)
        );
    }
}

#[test]
fn mmap2_buildid_all_writes_the_kernels_ids() -> Outcome {
    let t = "mmap2_buildid_all_writes_the_kernels_ids";
    let st = setup(t)?;
    let kernel = kernel_oracle(&st)?;
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    let (prog, libfix, unused) = (s(&st.fx.prog), s(&st.fx.libfix), s(&st.fx.libunused));
    let user: BTreeMap<String, String> = kernel
        .iter()
        .filter(|(p, _)| [&prog, &libfix, &unused].contains(p))
        .map(|(p, i)| (p.clone(), i.clone()))
        .collect();
    assert_eq!(user.len(), 3, "kernel IDs of the fixtures: {kernel:?}");

    // --mmap2-buildid-all: every mapped code DSO, libunused (never called) included.
    let all = st.dir.join("all.data");
    let (_, report) = pdinject_ok(&b, &all, &["--mmap2-buildid-all"]);
    check_ids(&st.perf, &all, &user, &[], "--mmap2-buildid-all");
    // The kernel's MMAP stays as it is (as perf 6.12 leaves it; samply reads the
    // kernel from MMAP records only), its ID in the table when this host's kernel is
    // proven to be the recorded one.
    if let Some(k) = kernel.get("[kernel.kallsyms]")
        && report_dso(&report, "[kernel.kallsyms]").is_some_and(|d| d["build_id"].is_string())
    {
        let got = mmap2_build_ids(&st.perf, &all);
        assert_eq!(got.get("[kernel.kallsyms]"), None, "kernel map converted");
        let table = buildid_list(&st.perf, &all);
        assert_eq!(table.get("[kernel.kallsyms]"), Some(k), "{table:?}");
    }
    same_samples(&st.perf, &b, &all);
    assert_eq!(mmap_lines(&st.perf, &b), mmap_lines(&st.perf, &all));
    let table = buildid_list(&st.perf, &all);
    assert_eq!(
        table.get(&prog).map(String::as_str),
        Some(PROG_ID),
        "table: {table:?}"
    );
    assert!(
        report["notes"]
            .to_string()
            .contains("mapping records written in build-ID form"),
        "{report}"
    );

    // --mmap2-buildids: only what samples touch; libunused stays classic.
    let lazy = st.dir.join("lazy.data");
    pdinject_ok(&b, &lazy, &["--mmap2-buildids"]);
    let hit: BTreeMap<String, String> = user
        .iter()
        .filter(|(p, _)| **p != unused)
        .map(|(p, i)| (p.clone(), i.clone()))
        .collect();
    check_ids(
        &st.perf,
        &lazy,
        &hit,
        std::slice::from_ref(&unused),
        "--mmap2-buildids",
    );
    same_samples(&st.perf, &b, &lazy);

    // perf 6.12 reads both the same way.
    if let Some(p612) = part(perf612()) {
        check_ids(&p612, &all, &user, &[], "perf 6.12 on --mmap2-buildid-all");
        same_samples(&p612, &b, &all);
    }

    // Streams: file to stream, saved stream to stream and to file.
    let out = st.dir.join("all.pdata");
    pdinject_to_stream(&b, &out, &["--mmap2-buildid-all"]);
    check_ids(&st.perf, &out, &user, &[], "file to stream");
    let piped = st.dir.join("piped.pdata");
    let mut c = st.perf.cmd();
    c.current_dir(&st.dir)
        .args(["record", "-q", "-B", "-g", "-o", "-", "--", "./prog"])
        .stdout(std::fs::File::create(&piped).unwrap());
    run_ok(&mut c);
    let s2s = st.dir.join("s2s.pdata");
    pdinject_to_stream(&piped, &s2s, &["--mmap2-buildid-all"]);
    check_ids(&st.perf, &s2s, &user, &[], "stream to stream");
    same_samples(&st.perf, &piped, &s2s);
    let s2f = st.dir.join("s2f.data");
    pdinject_ok(&piped, &s2f, &["--mmap2-buildid-all"]);
    check_ids(&st.perf, &s2f, &user, &[], "stream to file");
    assert!(!is_pipe_format(&s2f));
    Ok(())
}

fn pdinject_to_stream(input: &Path, out: &Path, extra: &[&str]) {
    let mut c = pdinject();
    c.args(extra)
        .arg(input)
        .arg("-")
        .arg("-q")
        .stdout(std::fs::File::create(out).unwrap());
    run_ok(&mut c);
}

/// A binary rebuilt after the recording: its records stay as they were (no ID, the
/// file on disk is another one); the others are converted.
#[test]
fn mmap2_leaves_stale_records_alone() -> Outcome {
    let t = "mmap2_leaves_stale_records_alone";
    let st = setup(t)?;
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let tmp = st.dir.join("prog.new");
    build_prog(&tmp, PROG_ID_B, false, &st.dir);
    std::fs::rename(&tmp, &st.fx.prog).unwrap();
    let out = st.dir.join("out.data");
    let (_, report) = pdinject_ok(&b, &out, &["--mmap2-buildid-all"]);
    let prog = s(&st.fx.prog);
    let d = report_dso(&report, &prog).expect("prog in the report");
    assert_eq!(d["reason"].as_str(), Some("stale"), "{d}");
    let want: BTreeMap<String, String> = [(s(&st.fx.libfix), LIB_ID.to_string())].into();
    check_ids(&st.perf, &out, &want, &[prog], "stale prog");
    same_samples(&st.perf, &b, &out);
    Ok(())
}

/// A `--buildid-mmap` recording: the IDs come from its records, and no DSO file is
/// opened, even though the binary on disk was rebuilt and the library removed.
#[test]
fn buildid_mmap_input_opens_no_dso() -> Outcome {
    let t = "buildid_mmap_input_opens_no_dso";
    let st = setup(t)?;
    kernel_oracle(&st)?;
    let bm = st.dir.join("oracle.data");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let tmp = st.dir.join("prog.new");
    build_prog(&tmp, PROG_ID_B, false, &st.dir);
    std::fs::rename(&tmp, &st.fx.prog).unwrap();
    let out = st.dir.join("out.data");
    let report = out.with_extension("report.json");
    let trace = st.dir.join("trace");
    let strace = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=open,openat,openat2", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_pdinject"))
        .env("HOME", test_home())
        .arg(&bm)
        .arg(&out)
        .arg("--report")
        .arg(&report)
        // Identification opens nothing; filling the build-ID cache (not asked here)
        // opens a file only to copy it when its note carries the recorded ID.
        .arg("-N")
        .output();
    // Without strace the check that pdinject opens no file is a part left out.
    let traced = part(match &strace {
        Ok(o) if o.status.success() && trace.exists() => Ok(()),
        _ => skip("strace cannot trace pdinject here (apt-get install strace)"),
    })
    .is_some();
    if !traced {
        pdinject_ok(&bm, &out, &[]);
    }
    let r = read_report(&report);
    for (path, id) in [(s(&st.fx.prog), PROG_ID), (s(&st.fx.libfix), LIB_ID)] {
        let d = report_dso(&r, &path).expect("in the report");
        assert_eq!(d["build_id"].as_str(), Some(id), "{d}");
        assert_eq!(d["source"].as_str(), Some("mmap2"), "{d}");
    }
    assert_eq!(
        buildid_list(&st.perf, &out)
            .get(&s(&st.fx.prog))
            .map(String::as_str),
        Some(PROG_ID),
        "the recorded ID, not the rebuilt file's"
    );
    if traced {
        let log = std::fs::read_to_string(&trace).unwrap();
        for f in [&st.fx.prog, &st.fx.libfix, &st.fx.libunused] {
            assert!(
                !log.contains(&format!("\"{}\"", f.display())),
                "pdinject opened {} although the recording names its ID:\n{log}",
                f.display()
            );
        }
    }
    Ok(())
}

/// `perf record -z`: mapping records inside COMPRESSED data stay as they are (one
/// zstd frame runs through the whole recording); their IDs are in the table.
#[test]
fn mmap2_compressed_records_stay_and_ids_go_to_the_table() -> Outcome {
    let t = "mmap2_compressed_records_stay_and_ids_go_to_the_table";
    let st = setup(t)?;
    let z = record_prog(&st, &["-z", "-B", "-g"], "z.data");
    let out = st.dir.join("out.data");
    pdinject_ok(&z, &out, &["--mmap2-buildid-all"]);
    let table = buildid_list(&st.perf, &out);
    for (p, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
        assert_eq!(table.get(&s(p)).map(String::as_str), Some(id), "{table:?}");
    }
    check_ids(
        &st.perf,
        &out,
        &BTreeMap::new(),
        &[s(&st.fx.prog), s(&st.fx.libfix)],
        "compressed",
    );
    same_samples(&st.perf, &z, &out);
    Ok(())
}
