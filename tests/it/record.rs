//! End-to-end tests on recordings made here with `perf record` of the C fixtures in
//! testdata/fixtures. Each test is ignored, saying why, when perf, gcc or the right
//! to record is missing (a failure under PDINJECT_TEST_STRICT).

use super::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Lets the coarse file-time clock move past the end of the recording, so a change
/// made "after the recording" has a later timestamp than the perf.data file.
fn settle() {
    std::thread::sleep(Duration::from_millis(50));
}

/// The libc path as it appears among the hit DSOs (or the canonical path).
fn libc_of(hits: &BTreeMap<String, usize>) -> String {
    hits.keys()
        .find(|k| k.ends_with("/libc.so.6"))
        .cloned()
        .or_else(libc_path)
        .expect("no libc found")
}

/// Checks that the table `table` has, for every hit DSO not in `except`, the id we
/// compute independently, and that no table entry (`except` ones included) carries
/// an id other than the one of the file now on disk. Returns the list of problems.
fn table_problems(
    table: &BTreeMap<String, String>,
    hits: &BTreeMap<String, usize>,
    except: &[&str],
) -> Vec<String> {
    let mut p = Vec::new();
    for dso in hits.keys() {
        if except.contains(&dso.as_str()) {
            continue;
        }
        let Some(want) = expected_build_id(dso) else {
            eprintln!("note: no independent build id for hit DSO {dso}; not checked");
            continue;
        };
        match table.get(dso) {
            None => p.push(format!(
                "hit DSO {dso} missing from the table (expected {want})"
            )),
            Some(got) if got != &want => {
                p.push(format!("hit DSO {dso}: table has {got:?}, expected {want}"))
            }
            _ => {}
        }
    }
    for (path, got) in table {
        if got.is_empty() {
            continue;
        }
        if let Some(want) = expected_build_id(path)
            && &want != got
        {
            p.push(format!(
                "table entry {path} has WRONG id {got}, the file has {want}"
            ));
        }
    }
    p
}

fn assert_no_problems(
    what: &str,
    problems: &[String],
    table: &BTreeMap<String, String>,
    report: Option<&serde_json::Value>,
) {
    if !problems.is_empty() {
        panic!(
            "{what}:\n  {}\nbuildid-list of the output:\n{}report dsos:\n{}",
            problems.join("\n  "),
            fmt_map(table),
            report.map(report_summary).unwrap_or_default()
        );
    }
}

fn assert_id(table: &BTreeMap<String, String>, path: &str, want: &str, ctx: &str) {
    assert_eq!(
        table.get(path).map(String::as_str),
        Some(want),
        "{ctx}: expected build id {want} for {path} in perf buildid-list of the output; table:\n{}",
        fmt_map(table)
    );
}

fn assert_no_id(table: &BTreeMap<String, String>, path: &str, ctx: &str) {
    if let Some(id) = table.get(path) {
        assert!(
            id.is_empty(),
            "{ctx}: {path} must get NO build id, but the output table has {id}; table:\n{}",
            fmt_map(table)
        );
    }
}

fn assert_reason(report: &serde_json::Value, path: &str, reason: &str, ctx: &str) {
    let d = report_dso(report, path).unwrap_or_else(|| {
        panic!(
            "{ctx}: report has no dsos[] entry for {path}; dsos:\n{}",
            report_summary(report)
        )
    });
    assert_eq!(
        d["reason"].as_str(),
        Some(reason),
        "{ctx}: report reason for {path} (entry {d})"
    );
    assert!(
        d["build_id"].is_null(),
        "{ctx}: report gives {path} a build_id although reason is {reason}: {d}"
    );
}

fn assert_source(report: &serde_json::Value, path: &str, id: &str, source: &str, ctx: &str) {
    let d = report_dso(report, path).unwrap_or_else(|| {
        panic!(
            "{ctx}: report has no dsos[] entry for {path}; dsos:\n{}",
            report_summary(report)
        )
    });
    assert_eq!(
        d["build_id"].as_str(),
        Some(id),
        "{ctx}: report build_id of {path}: {d}"
    );
    assert_eq!(
        d["source"].as_str(),
        Some(source),
        "{ctx}: report source of {path}: {d}"
    );
    assert!(
        d["reason"].is_null(),
        "{ctx}: report reason of {path} should be null: {d}"
    );
}

// ---------------------------------------------------------------------------

/// Frame-pointer recording without build ids: every hit DSO gets exactly its id, perf
/// script sees the same events, and both perf versions read the table.
#[test]
fn fp_recording_gets_every_hit_id() -> Outcome {
    let st = setup("fp_recording_gets_every_hit_id")?;
    let input = record_prog(&st, &["-B", "-g"], "fp.data");
    let output = st.dir.join("fp-out.data");
    let (o, report) = pdinject_ok(&input, &output, &["--buildids"]);

    let hits = hit_dsos(&st.perf, &input);
    let prog = s(&st.fx.prog);
    let lib = s(&st.fx.libfix);
    let libc = libc_of(&hits);
    for must in [&prog, &lib, &libc] {
        assert!(
            hits.contains_key(must.as_str()),
            "fixture problem: {must} not hit by any sample of {}; hits: {hits:?}",
            input.display()
        );
    }
    let table = buildid_list(&st.perf, &output);
    assert_id(&table, &prog, PROG_ID, "fp");
    assert_id(&table, &lib, LIB_ID, "fp (16-byte id)");
    let libc_id = elf_build_id(Path::new(&libc)).expect("libc has no build id?");
    assert_id(&table, &libc, &libc_id, "fp (libc)");
    if hits.contains_key("[kernel.kallsyms]") {
        let k = kernel_build_id().expect("cannot read /sys/kernel/notes");
        assert_id(
            &table,
            "[kernel.kallsyms]",
            &k,
            "fp (kernel, from /sys/kernel/notes)",
        );
    }
    let problems = table_problems(&table, &hits, &[]);
    assert_no_problems("fp: table vs hit DSOs", &problems, &table, Some(&report));
    let unused = s(&st.fx.libunused);
    assert!(
        !hits.contains_key(&unused),
        "fixture problem: perf script shows a sample in {unused}, which runs no code"
    );
    assert_no_id(&table, &unused, "fp (libunused is mapped, never sampled)");

    // Report: consistent with what we know.
    assert_source(&report, &prog, PROG_ID, "elf", "fp report");
    for key in [
        "samples",
        "records",
        "dsos_hit",
        "ids_written",
        "ids_new",
        "ids_missing",
    ] {
        assert!(
            report[key].is_u64(),
            "report field {key} missing or not a count: {report}"
        );
    }
    let nsamples = perf_script(&st.perf, &input, &["-F", "tid"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count() as u64;
    assert_eq!(
        report["samples"].as_u64(),
        Some(nsamples),
        "report samples vs perf script sample count"
    );
    assert_eq!(
        report["dsos_hit"].as_u64(),
        Some(hits.len() as u64),
        "report dsos_hit vs DSOs perf script shows hit: {:?}\nreport dsos:\n{}",
        hits.keys().collect::<Vec<_>>(),
        report_summary(&report)
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("pdinject: ") && stderr.contains(" -> "),
        "no summary on stderr: {stderr}"
    );

    assert_same_script(&st.perf, &input, &output, SCRIPT_ARGS);
    if let Some(p612) = part(perf612()) {
        assert_same_script(&p612, &input, &output, SCRIPT_ARGS);
        let t612 = buildid_list(&p612, &output);
        assert_eq!(
            t612, table,
            "perf 6.12 buildid-list of the output differs from perf 6.1's"
        );
    }
    Ok(())
}

/// A recording written by perf 6.12 (other header/feature layout), read by both perfs.
#[test]
fn perf612_recording() -> Outcome {
    let test = "perf612_recording";
    let st = setup(test)?;
    let p612 = perf612()?;
    let input = st.dir.join("r612.data");
    record_in(&p612, &st.dir, &input, &["-B", "-g", "--", "./prog"]);
    let output = st.dir.join("r612-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let hits = hit_dsos(&p612, &input);
    for perf in [&st.perf, &p612] {
        let reads_input = run(perf.cmd().args(["script", "-i"]).arg(&input))
            .status
            .success();
        if !reads_input {
            eprintln!(
                "note: {} cannot read a 6.12 recording; not compared",
                perf.name
            );
            continue;
        }
        let table = buildid_list(perf, &output);
        let ctx = format!("6.12 recording, read by {}", perf.name);
        assert_id(&table, &s(&st.fx.prog), PROG_ID, &ctx);
        assert_id(&table, &s(&st.fx.libfix), LIB_ID, &ctx);
        let problems = table_problems(&table, &hits, &[]);
        assert_no_problems(&ctx, &problems, &table, Some(&report));
        assert_same_script(perf, &input, &output, SCRIPT_ARGS);
    }
    Ok(())
}

/// DWARF callchains (--call-graph dwarf): every DSO the sample IPs hit gets its id;
/// DSOs seen only by unwinding may be missing but never wrong.
#[test]
fn dwarf_recording() -> Outcome {
    let st = setup("dwarf_recording")?;
    let input = record_prog(&st, &["-B", "--call-graph", "dwarf,8192"], "dwarf.data");
    let output = st.dir.join("dwarf-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let table = buildid_list(&st.perf, &output);
    let ip_hits = ip_hit_dsos(&st.perf, &input);
    let all_hits = hit_dsos(&st.perf, &input);
    let unwound_only: Vec<&str> = all_hits
        .keys()
        .filter(|k| !ip_hits.contains_key(*k))
        .map(String::as_str)
        .collect();
    assert_id(&table, &s(&st.fx.prog), PROG_ID, "dwarf");
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, "dwarf");
    let problems = table_problems(&table, &all_hits, &unwound_only);
    assert_no_problems("dwarf", &problems, &table, Some(&report));
    for k in &unwound_only {
        if !table.contains_key(*k) {
            eprintln!("note: dwarf: {k} is only reached by unwinding and has no id");
        }
    }
    assert_same_script(&st.perf, &input, &output, SCRIPT_ARGS);
    Ok(())
}

/// Which way the binary is replaced after the recording.
#[derive(Debug, Clone, Copy)]
enum Replace {
    /// gcc -o over it, as make does (ext4 may hand out the same inode number again,
    /// with a new generation).
    Rebuild,
    /// gcc -o to a new name, then rename over it: certainly a new inode.
    RebuildRename,
    /// cp over it: same inode, new mtime, same layout.
    CpInPlace,
    /// cp -p of a bigger build made *before* the recording: same inode, old mtime,
    /// only ctime and the file layout tell.
    CpPreserve,
}

fn stale_case(test: &str, how: Replace) -> Outcome {
    let st = setup(test)?;
    let repl_dir = st.dir.join("repl");
    fs::create_dir(&repl_dir).unwrap();
    let repl = repl_dir.join("prog");
    // The replacement exists before the recording (realistic for cp -p / deploys).
    build_prog(
        &repl,
        PROG_ID_B,
        matches!(how, Replace::CpPreserve),
        &st.dir,
    );
    let input = record_prog(&st, &["-B", "-g"], "stale.data");
    settle();
    let ino_before = fs::metadata(&st.fx.prog).unwrap().ino();
    match how {
        Replace::Rebuild => build_prog(&st.fx.prog, PROG_ID_B, false, &st.dir),
        Replace::RebuildRename => {
            let tmp = st.dir.join("prog.new");
            build_prog(&tmp, PROG_ID_B, false, &st.dir);
            fs::rename(&tmp, &st.fx.prog).unwrap();
        }
        Replace::CpInPlace => {
            run_ok(Command::new("cp").arg(&repl).arg(&st.fx.prog));
        }
        Replace::CpPreserve => {
            run_ok(Command::new("cp").arg("-p").arg(&repl).arg(&st.fx.prog));
        }
    }
    let ino_after = fs::metadata(&st.fx.prog).unwrap().ino();
    match how {
        Replace::Rebuild if ino_before == ino_after => {
            eprintln!(
                "note: the rebuilt {} has the old inode number",
                st.fx.prog.display()
            )
        }
        Replace::RebuildRename => {
            assert_ne!(ino_before, ino_after, "rename should give a new inode")
        }
        Replace::CpInPlace | Replace::CpPreserve => {
            assert_eq!(ino_before, ino_after, "cp should keep the inode")
        }
        _ => {}
    }
    assert_eq!(elf_build_id(&st.fx.prog).as_deref(), Some(PROG_ID_B));

    let output = st.dir.join("stale-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let table = buildid_list(&st.perf, &output);
    let prog = s(&st.fx.prog);
    let ctx = format!("stale ({how:?})");
    assert_no_id(&table, &prog, &ctx);
    assert_reason(&report, &prog, "stale", &ctx);
    // Everything else still gets its id.
    let hits = hit_dsos(&st.perf, &input);
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, &ctx);
    let problems = table_problems(&table, &hits, &[prog.as_str()]);
    assert_no_problems(&ctx, &problems, &table, Some(&report));
    Ok(())
}

#[test]
fn stale_rebuilt_binary_gets_no_id() -> Outcome {
    stale_case("stale_rebuilt_binary_gets_no_id", Replace::Rebuild)
}

#[test]
fn stale_renamed_over_gets_no_id() -> Outcome {
    stale_case("stale_renamed_over_gets_no_id", Replace::RebuildRename)
}

#[test]
fn stale_cp_in_place_gets_no_id() -> Outcome {
    stale_case("stale_cp_in_place_gets_no_id", Replace::CpInPlace)
}

#[test]
fn stale_cp_preserving_times_gets_no_id() -> Outcome {
    stale_case("stale_cp_preserving_times_gets_no_id", Replace::CpPreserve)
}

/// ctime moves but content does not (hard link, chmod). Since issue 29 that alone is
/// no proof (a rewrite in place with its times set back leaves the same inode): no
/// ID, `ctime-moved`; with a package database of the test's own that lists both
/// files, their IDs.
#[test]
fn hard_link_and_chmod_need_evidence() -> Outcome {
    let st = setup("hard_link_and_chmod_need_evidence")?;
    let admin = st.dir.join("dpkg");
    fs::create_dir_all(admin.join("info")).unwrap();
    let mut sums = String::new();
    for f in [&st.fx.prog, &st.fx.libfix] {
        let o = run_ok(Command::new("md5sum").arg(f));
        let hex = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        sums += &format!("{hex}  {}\n", f.strip_prefix("/").unwrap().display());
    }
    fs::write(admin.join("info/fixture.md5sums"), sums).unwrap();
    fs::write(admin.join("info/fixture.list"), "").unwrap();
    let input = record_prog(&st, &["-B", "-g"], "link.data");
    settle();
    let links = st.dir.join("links");
    fs::create_dir(&links).unwrap();
    fs::hard_link(&st.fx.prog, links.join("prog")).unwrap();
    fs::hard_link(&st.fx.libfix, links.join("libfix.so")).unwrap();
    run_ok(Command::new("chmod").arg("0700").arg(&st.fx.libfix));
    let output = st.dir.join("link-out.data");
    let (_, report) = pdinject_ok(&input, &output, &["-N"]);
    let table = buildid_list(&st.perf, &output);
    let ctx = "hard link + chmod after the recording, no evidence";
    for p in [&st.fx.prog, &st.fx.libfix] {
        assert_no_id(&table, &s(p), ctx);
        assert_reason(&report, &s(p), "ctime-moved", ctx);
    }
    let output = st.dir.join("link-out-dpkg.data");
    let flag = format!("--dpkg-admindir={}", admin.display());
    let (_, report) = pdinject_ok(&input, &output, &["-N", &flag]);
    let table = buildid_list(&st.perf, &output);
    let ctx = "hard link + chmod after the recording, packaged";
    assert_id(&table, &s(&st.fx.prog), PROG_ID, ctx);
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, ctx);
    // The test's database replaces the machine's: a system library whose ctime a
    // cache link moved may go without an ID here, never with a wrong one.
    for dso in hit_dsos(&st.perf, &input).keys() {
        if let (Some(got), Some(want)) = (table.get(dso), expected_build_id(dso))
            && !got.is_empty()
        {
            assert_eq!(
                got,
                &want,
                "{ctx}: {dso}; report:\n{}",
                report_summary(&report)
            );
        }
    }
    Ok(())
}

#[test]
fn missing_binary_gets_no_id() -> Outcome {
    let st = setup("missing_binary_gets_no_id")?;
    let input = record_prog(&st, &["-B", "-g"], "missing.data");
    let hits = hit_dsos(&st.perf, &input);
    fs::remove_file(&st.fx.prog).unwrap();
    let output = st.dir.join("missing-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let table = buildid_list(&st.perf, &output);
    let prog = s(&st.fx.prog);
    assert_no_id(&table, &prog, "missing");
    assert_reason(&report, &prog, "missing", "missing");
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, "missing (other DSOs)");
    let problems = table_problems(&table, &hits, &[prog.as_str()]);
    assert_no_problems("missing", &problems, &table, Some(&report));
    assert!(
        report["ids_missing"].as_u64().unwrap_or(0) >= 1,
        "report ids_missing should count {prog}: {}",
        report["ids_missing"]
    );
    Ok(())
}

/// One path, two files within one recording (library replaced between two runs).
#[test]
fn replaced_library_is_ambiguous() -> Outcome {
    let st = setup("replaced_library_is_ambiguous")?;
    let dlprog = build_dlprog(&st.dir);
    build_lib("libx.c", &st.dir.join("libx.so"), LIBX_ID_A);
    build_lib("libx.c", &st.dir.join("libx_b.so"), LIBX_ID_B);
    let input = st.dir.join("amb.data");
    record_in(
        &st.perf,
        &st.dir,
        &input,
        &[
            "-B",
            "-g",
            "--",
            "sh",
            "-c",
            "./dlprog && cp libx_b.so libx.so.new && mv -f libx.so.new libx.so && ./dlprog",
        ],
    );
    let libx = s(&st.dir.join("libx.so"));
    let hits = hit_dsos(&st.perf, &input);
    for must in [&libx, &s(&dlprog)] {
        assert!(
            hits.contains_key(must),
            "fixture problem: {must} not hit: {hits:?}"
        );
    }
    let mmaps = perf_script(&st.perf, &input, &["--show-mmap-events", "-F", "comm"]);
    let inodes: std::collections::BTreeSet<&str> = mmaps
        .lines()
        .filter(|l| l.contains("PERF_RECORD_MMAP2") && l.ends_with(&libx))
        // "[0x..(0x..) @ PGOFF MAJ:MIN INO GEN]: ..." -> "MAJ:MIN INO GEN"
        .filter_map(|l| {
            l.split(" @ ")
                .nth(1)?
                .split(']')
                .next()?
                .split_once(' ')
                .map(|x| x.1)
        })
        .collect();
    assert!(
        inodes.len() >= 2,
        "fixture problem: expected libx.so mapped from two inodes, got {inodes:?}"
    );

    let output = st.dir.join("amb-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let table = buildid_list(&st.perf, &output);
    assert_no_id(&table, &libx, "ambiguous");
    assert_reason(&report, &libx, "ambiguous", "ambiguous");
    assert_id(&table, &s(&dlprog), DLPROG_ID, "ambiguous (dlprog itself)");
    let problems = table_problems(&table, &hits, &[libx.as_str()]);
    assert_no_problems("ambiguous", &problems, &table, Some(&report));
    Ok(())
}

/// The kernel's own ids (--buildid-mmap) are the oracle for what pdinject writes.
#[test]
fn buildid_mmap_oracle() -> Outcome {
    let st = setup("buildid_mmap_oracle")?;
    let bm = record_prog(&st, &["--buildid-mmap", "-g"], "bm.data");
    let kernel_ids = mmap2_build_ids(&st.perf, &bm);
    if kernel_ids.get(&s(&st.fx.prog)).map(String::as_str) != Some(PROG_ID) {
        return skip(format!(
            "kernel did not put build ids in MMAP2 (got {kernel_ids:?})"
        ));
    }
    assert_eq!(
        kernel_ids.get(&s(&st.fx.libfix)).map(String::as_str),
        Some(LIB_ID),
        "kernel MMAP2 id of libfix.so (sanity)"
    );

    // 1. a -B recording of the same binaries: pdinject must agree with the kernel.
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    let out = st.dir.join("b-out.data");
    let (_, report) = pdinject_ok(&b, &out, &[]);
    let table = buildid_list(&st.perf, &out);
    let hits = hit_dsos(&st.perf, &b);
    let mut problems = Vec::new();
    for dso in hits.keys() {
        let Some(want) = kernel_ids.get(dso).filter(|x| !x.is_empty()) else {
            continue;
        };
        match table.get(dso) {
            Some(got) if got == want => {}
            got => problems.push(format!("{dso}: kernel says {want}, pdinject wrote {got:?}")),
        }
    }
    for (dso, got) in &table {
        if let Some(want) = kernel_ids.get(dso).filter(|x| !x.is_empty())
            && want != got
        {
            problems.push(format!("{dso}: table has {got}, kernel says {want}"));
        }
    }
    assert_no_problems(
        "-B recording vs kernel MMAP2 ids",
        &problems,
        &table,
        Some(&report),
    );

    // 2. the --buildid-mmap recording itself: ids come from the records.
    let bm_out = st.dir.join("bm-out.data");
    let (_, bm_report) = pdinject_ok(&bm, &bm_out, &[]);
    let bm_table = buildid_list(&st.perf, &bm_out);
    let bm_hits = hit_dsos(&st.perf, &bm);
    let mut problems = Vec::new();
    for dso in bm_hits.keys() {
        let Some(want) = kernel_ids.get(dso).filter(|x| !x.is_empty()) else {
            continue;
        };
        match bm_table.get(dso) {
            Some(got) if got == want => {}
            got => problems.push(format!(
                "{dso}: kernel MMAP2 says {want}, pdinject wrote {got:?}"
            )),
        }
    }
    assert_no_problems(
        "--buildid-mmap recording",
        &problems,
        &bm_table,
        Some(&bm_report),
    );
    assert_source(
        &bm_report,
        &s(&st.fx.prog),
        PROG_ID,
        "mmap2",
        "--buildid-mmap report",
    );
    assert_same_script(&st.perf, &bm, &bm_out, SCRIPT_ARGS);
    Ok(())
}

#[test]
fn known_build_ids_for_deleted_binaries() -> Outcome {
    let st = setup("known_build_ids_for_deleted_binaries")?;
    let input = record_prog(&st, &["-B", "-g"], "known.data");
    fs::remove_file(&st.fx.prog).unwrap();
    fs::remove_file(&st.fx.libfix).unwrap();
    let prog = s(&st.fx.prog);
    let lib = s(&st.fx.libfix);
    let output = st.dir.join("known-out.data");
    let known = format!("--known-build-ids={PROG_ID} {prog},{LIB_ID} {lib}");
    let (_, report) = pdinject_ok(&input, &output, &[&known]);
    let table = buildid_list(&st.perf, &output);
    assert_id(&table, &prog, PROG_ID, "--known-build-ids");
    assert_id(&table, &lib, LIB_ID, "--known-build-ids (16-byte id)");
    assert_source(&report, &prog, PROG_ID, "known", "--known-build-ids report");
    assert_source(&report, &lib, LIB_ID, "known", "--known-build-ids report");
    Ok(())
}

#[test]
fn compressed_recording() -> Outcome {
    let st = setup("compressed_recording")?;
    let input = record_prog(&st, &["-z", "-B", "-g"], "z.data");
    let output = st.dir.join("z-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let table = buildid_list(&st.perf, &output);
    let hits = hit_dsos(&st.perf, &input);
    assert_id(&table, &s(&st.fx.prog), PROG_ID, "-z");
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, "-z");
    let libc = libc_of(&hits);
    assert_id(
        &table,
        &libc,
        &elf_build_id(Path::new(&libc)).unwrap(),
        "-z (libc)",
    );
    let problems = table_problems(&table, &hits, &[]);
    assert_no_problems("-z", &problems, &table, Some(&report));
    assert_same_script(&st.perf, &input, &output, SCRIPT_ARGS);

    // For the record: perf inject writes nothing for compressed input.
    let pi = st.dir.join("z-perf-inject.data");
    let o = run(st
        .perf
        .cmd()
        .args(["inject", "-b", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(&pi));
    if o.status.success() {
        eprintln!(
            "note: perf inject -b on -z input gives {} table entries, pdinject {}",
            buildid_list(&st.perf, &pi)
                .values()
                .filter(|v| !v.is_empty())
                .count(),
            table.len()
        );
    }
    Ok(())
}

#[test]
fn big_endian_input_stays_big_endian() -> Outcome {
    let test = "big_endian_input_stays_big_endian";
    let st = setup(test)?;
    let script = manifest_dir().join("../shared/tools/swap-endian.py");
    if !script.exists() {
        return skip(format!("{} not found", script.display()));
    }
    if Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return skip("python3 not available");
    }
    let le = record_prog(&st, &["-B", "-g"], "le.data");
    let be = st.dir.join("be.data");
    run_ok(Command::new("python3").arg(&script).arg(&le).arg(&be));
    assert_eq!(
        &fs::read(&be).unwrap()[..8],
        b"2ELIFREP",
        "swap-endian.py output is not big-endian"
    );

    let output = st.dir.join("be-out.data");
    let (_, report) = pdinject_ok(&be, &output, &[]);
    let head = fs::read(&output).unwrap();
    assert_eq!(
        &head[..8],
        b"2ELIFREP",
        "output of a big-endian input must stay big-endian; magic is {:?}",
        String::from_utf8_lossy(&head[..8])
    );
    let table = buildid_list(&st.perf, &output);
    let hits = hit_dsos(&st.perf, &be);
    assert_id(&table, &s(&st.fx.prog), PROG_ID, "big-endian");
    assert_id(&table, &s(&st.fx.libfix), LIB_ID, "big-endian (16-byte id)");
    // swap-endian.py keeps only the HOSTNAME and BUILD_ID features: without
    // OSRELEASE the kernel and vdso cannot be proven to be this host's, so they may
    // be left out (with a reason), but never get a wrong id.
    let problems = table_problems(&table, &hits, &["[kernel.kallsyms]", "[vdso]"]);
    assert_no_problems("big-endian", &problems, &table, Some(&report));
    for k in ["[kernel.kallsyms]", "[vdso]"] {
        if hits.contains_key(k) && !table.contains_key(k) {
            let d = report_dso(&report, k)
                .unwrap_or_else(|| panic!("big-endian: hit {k} has no report entry"));
            assert!(
                d["reason"].is_string(),
                "big-endian: {k} without id needs a reason: {d}"
            );
        }
    }
    assert_same_script(&st.perf, &be, &output, SCRIPT_ARGS);
    Ok(())
}

/// `perf record --threads`, plain and `-z`: a directory in, a directory out. With
/// `-z`, each data file is compressed by its recording thread's own zstd stream
/// (one decompressor per file; carried over from the header file's, the next file's
/// data read as corrupt).
#[test]
fn directory_format() -> Outcome {
    let test = "directory_format";
    let st = setup(test)?;
    for (name, opts) in [
        ("dir", &["--threads", "-B", "-g"][..]),
        ("dir-z", &["--threads", "-B", "-g", "-z"][..]),
    ] {
        let input = st.dir.join(format!("{name}.data"));
        let mut c = st.perf.cmd();
        c.current_dir(&st.dir)
            .args(["record", "-q"])
            .args(opts)
            .arg("-o")
            .arg(&input)
            // On two CPUs: two data files then hold compressed data of their own.
            .args([
                "--",
                "sh",
                "-c",
                "taskset -c 0 ./prog & taskset -c 1 ./prog & wait",
            ]);
        let o = run(&mut c);
        if !o.status.success() || !input.is_dir() {
            return skip(format!(
                "perf record --threads did not make a directory ({}): {}",
                status_str(&o),
                tail(&o.stderr)
            ));
        }
        if name == "dir-z" {
            let files = files_with_compressed_records(&input);
            assert!(
                files >= 2,
                "{name}: {files} data files hold compressed records; the test needs two (one zstd stream each)"
            );
        }
        let output = st.dir.join(format!("{name}-out.data"));
        let (_, report) = pdinject_ok(&input, &output, &[]);
        assert!(
            output.is_dir(),
            "output of a directory input must be a directory: {}",
            output.display()
        );
        let table = buildid_list(&st.perf, &output);
        let hits = hit_dsos(&st.perf, &input);
        assert_id(&table, &s(&st.fx.prog), PROG_ID, name);
        assert_id(&table, &s(&st.fx.libfix), LIB_ID, name);
        let problems = table_problems(&table, &hits, &[]);
        assert_no_problems(name, &problems, &table, Some(&report));
        assert_same_script(&st.perf, &input, &output, SCRIPT_ARGS);
        // An error in a data file names that file, not the header file.
        let bad = st.dir.join(format!("{name}-bad.data"));
        fs::create_dir(&bad).unwrap();
        for e in fs::read_dir(&input).unwrap().flatten() {
            fs::copy(e.path(), bad.join(e.file_name())).unwrap();
        }
        let mut b = fs::read(bad.join("data.1")).unwrap();
        // A record of type 1 whose size is smaller than its header.
        b[..8].copy_from_slice(&[1, 0, 0, 0, 0, 0, 4, 0]);
        fs::write(bad.join("data.1"), b).unwrap();
        let o = pdinject_run([
            bad.to_str().unwrap(),
            st.dir
                .join(format!("{name}-bad-out.data"))
                .to_str()
                .unwrap(),
        ]);
        assert_error(&o, 1, "data.1: offset 0x0", name);
    }
    Ok(())
}

/// The data.N files of directory recording `dir` that hold COMPRESSED records.
fn files_with_compressed_records(dir: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(dir).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with("data.") {
            continue;
        }
        let b = fs::read(e.path()).unwrap();
        let mut at = 0usize;
        let mut found = false;
        while at + 8 <= b.len() {
            let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            let size = u16::from_le_bytes(b[at + 6..at + 8].try_into().unwrap()) as usize;
            if size < 8 {
                break;
            }
            found |= kind == 81 || kind == 83;
            at += size;
        }
        n += usize::from(found);
    }
    n
}

// ---------------------------------------------------------------------------
// Errors

fn assert_error(o: &std::process::Output, code: i32, names: &str, ctx: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{ctx}: expected exit {code}, got {}; stderr:\n{err}",
        status_str(o)
    );
    assert!(
        err.starts_with("pdinject: "),
        "{ctx}: stderr must start with 'pdinject: ', got:\n{err}"
    );
    assert!(
        err.contains(names),
        "{ctx}: stderr must name {names}, got:\n{err}"
    );
}

#[test]
fn truncated_input_fails_cleanly() -> Outcome {
    let st = setup("truncated_input_fails_cleanly")?;
    let input = record_prog(&st, &["-B", "-g"], "full.data");
    let (doff, dsize) = data_section(&input);
    let bytes = fs::read(&input).unwrap();
    let cut = (doff + dsize / 2) as usize;
    assert!(cut < bytes.len());
    let trunc = st.dir.join("trunc.data");
    fs::write(&trunc, &bytes[..cut]).unwrap();
    let outdir = st.dir.join("out");
    fs::create_dir(&outdir).unwrap();
    let output = outdir.join("trunc-out.data");
    let o = pdinject_run([trunc.as_os_str(), output.as_os_str()]);
    assert_error(&o, 1, "trunc.data", "truncated input");
    assert!(
        !output.exists(),
        "truncated input: output {} left behind",
        output.display()
    );
    let left: Vec<_> = fs::read_dir(&outdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "truncated input: files left in the output directory: {left:?}"
    );
    Ok(())
}

#[test]
fn nonexistent_input_fails() -> Outcome {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("no-such.data");
    let output = tmp.path().join("out.data");
    let o = pdinject_run([input.as_os_str(), output.as_os_str()]);
    assert_error(&o, 1, "no-such.data", "nonexistent input");
    assert!(!output.exists(), "nonexistent input: output created");
    Ok(())
}

#[test]
fn usage_error_exits_2() -> Outcome {
    let o = pdinject_run(["--no-such-option-xyz"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "unknown option: {}; stderr:\n{}",
        status_str(&o),
        tail(&o.stderr)
    );
    Ok(())
}

#[test]
fn input_equal_output_is_refused() -> Outcome {
    let st = setup("input_equal_output_is_refused")?;
    let input = record_prog(&st, &["-B", "-g"], "same.data");
    let before = fs::read(&input).unwrap();
    let unchanged = |what: &str| match fs::read(&input) {
        Ok(now) => assert!(now == before, "{what} modified the input"),
        Err(e) => panic!("{what} destroyed the input: {e}"),
    };
    let o = pdinject_run([input.as_os_str(), input.as_os_str()]);
    unchanged("pdinject IN IN");
    assert!(
        !o.status.success(),
        "pdinject IN IN must fail, got {}",
        status_str(&o)
    );
    assert!(
        o.status.code().is_some(),
        "pdinject IN IN crashed: {}",
        status_str(&o)
    );

    // The same file under another spelling.
    fs::create_dir(st.dir.join("sub")).unwrap();
    let other = st.dir.join("sub/../same.data");
    let o = pdinject_run([input.as_os_str(), other.as_os_str()]);
    unchanged("pdinject IN sub/../IN");
    assert!(
        !o.status.success(),
        "pdinject IN sub/../IN (same file) must fail, got {}",
        status_str(&o)
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Flags

#[test]
fn flag_spellings_and_buildid_all() -> Outcome {
    let st = setup("flag_spellings_and_buildid_all")?;
    let input = record_prog(&st, &["-B", "-g"], "flags.data");
    let out = |n: &str| st.dir.join(n);
    let runs: Vec<(&str, Vec<std::ffi::OsString>)> = vec![
        (
            "positional",
            vec![input.clone().into(), out("a.data").into()],
        ),
        (
            "-b -i -o",
            vec![
                "-b".into(),
                "-i".into(),
                input.clone().into(),
                "-o".into(),
                out("b.data").into(),
            ],
        ),
        (
            "--build-ids",
            vec![
                "--build-ids".into(),
                input.clone().into(),
                out("c.data").into(),
            ],
        ),
        (
            "--buildids",
            vec![
                "--buildids".into(),
                input.clone().into(),
                out("d.data").into(),
            ],
        ),
        (
            "--buildid-all",
            vec![
                "--buildid-all".into(),
                input.clone().into(),
                out("all.data").into(),
            ],
        ),
    ];
    for (name, args) in &runs {
        let o = pdinject_run(args);
        assert!(
            o.status.success(),
            "pdinject {name} failed ({}): {}",
            status_str(&o),
            tail(&o.stderr)
        );
    }
    let a = buildid_list(&st.perf, &out("a.data"));
    for (n, f) in [
        ("-b -i -o", "b.data"),
        ("--build-ids", "c.data"),
        ("--buildids", "d.data"),
    ] {
        let t = buildid_list(&st.perf, &out(f));
        assert_eq!(t, a, "{n}: table differs from the default mode's");
    }
    let unused = s(&st.fx.libunused);
    // libunused runs no code, but frame-pointer callchains through code without
    // frame pointers can land anywhere: only when perf itself sees no sample
    // touching it must --buildids leave it out.
    if hit_dsos(&st.perf, &input).contains_key(&unused) {
        eprintln!(
            "NOTE flag_spellings_and_buildid_all: a sample touched {unused}; skipping the not-listed check"
        );
    } else {
        assert_no_id(
            &a,
            &unused,
            "--buildids must not list a DSO no sample touched",
        );
        assert!(
            !a.contains_key(&unused),
            "--buildids lists unsampled {unused}"
        );
    }
    let all = buildid_list(&st.perf, &out("all.data"));
    assert_id(
        &all,
        &unused,
        UNUSED_ID,
        "--buildid-all (mapped, never sampled)",
    );
    assert_id(&all, &s(&st.fx.prog), PROG_ID, "--buildid-all");
    for (k, v) in &a {
        if !v.is_empty() {
            assert_eq!(
                all.get(k),
                Some(v),
                "--buildid-all lost {k} that --buildids has"
            );
        }
    }
    Ok(())
}

#[test]
fn quiet_and_deterministic() -> Outcome {
    let st = setup("quiet_and_deterministic")?;
    let input = record_prog(&st, &["-B", "-g"], "det.data");
    let mut outs = Vec::new();
    for (i, extra) in [
        vec!["-q"],
        vec!["-q", "--jobs", "1"],
        vec!["-q", "--jobs", "2"],
        vec!["-q", "--jobs", "7"],
    ]
    .iter()
    .enumerate()
    {
        let out = st.dir.join(format!("det{i}.data"));
        let mut c = pdinject();
        c.args(extra).arg(&input).arg(&out);
        let o = run_ok(&mut c);
        assert!(
            o.stderr.is_empty(),
            "-q must print nothing on success, got: {}",
            tail(&o.stderr)
        );
        outs.push((extra.join(" "), fs::read(&out).unwrap()));
    }
    for (name, bytes) in &outs[1..] {
        assert!(
            bytes == &outs[0].1,
            "output with `{name}` differs from output with `{}` (must not depend on the thread count)",
            outs[0].0
        );
    }
    Ok(())
}
