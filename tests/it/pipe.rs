//! Pipe mode end to end: `perf record -B -o - | pdinject --buildids - - | perf ...`,
//! pipe-format files given by path or on stdin, and what must be refused. Each test
//! is ignored, saying why, when perf, gcc or the right to record is missing.

use super::common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `sh -c SCRIPT` in `dir` with `$PERF` and `$PDINJECT` set; must succeed.
fn sh(st: &Setup, script: &str) -> std::process::Output {
    let mut c = Command::new("sh");
    c.current_dir(&st.dir)
        .arg("-c")
        .arg(script)
        .env("PERF", &st.perf.bin)
        .env("PDINJECT", env!("CARGO_BIN_EXE_pdinject"))
        .env("PERF_PAGER", "cat")
        .env("HOME", test_home());
    if let Some(l) = &st.perf.ld_library_path {
        c.env("LD_LIBRARY_PATH", l);
    }
    run_ok(&mut c)
}

/// `perf record -q -B -o - OPTS -- ./prog > NAME`: a pipe-format recording.
fn record_pipe(st: &Setup, opts: &str, name: &str) -> PathBuf {
    sh(
        st,
        &format!("\"$PERF\" record -q -B -o - {opts} -- ./prog > {name}"),
    );
    let p = st.dir.join(name);
    assert!(is_pipe_format(&p), "{} is not in pipe format", p.display());
    p
}

/// The IDs every pipe output must carry, checked with `perf buildid-list` (or, for
/// compressed streams, which perf's buildid-list cannot decompress in pipe mode, from
/// the records perf reports receiving).
fn assert_fixture_ids(perf: &Perf, st: &Setup, out: &Path, ctx: &str, compressed: bool) {
    let table = if compressed {
        received_ids(perf, out)
    } else {
        buildid_list(perf, out)
    };
    let want = [
        (s(&st.fx.prog), PROG_ID.to_string()),
        (s(&st.fx.libfix), LIB_ID.to_string()),
    ];
    for (path, id) in want {
        assert_eq!(
            table.get(&path).map(String::as_str),
            Some(id.as_str()),
            "{ctx} ({}): {path} in perf buildid-list of {}; got {table:?}",
            perf.name,
            out.display()
        );
    }
    let libc = table
        .keys()
        .find(|k| k.ends_with("/libc.so.6"))
        .cloned()
        .unwrap_or_else(|| panic!("{ctx}: no libc in {table:?}"));
    assert_eq!(
        table.get(&libc).cloned(),
        elf_build_id(Path::new(&libc)),
        "{ctx}: libc's ID"
    );
    assert!(
        table
            .get(&s(&st.fx.libunused))
            .is_none_or(|id| id.is_empty()),
        "{ctx}: libunused (never sampled) got an ID: {table:?}"
    );
}

/// The brief's pipeline, live: perf record into pdinject into a file (with a copy of
/// perf's stream kept by tee), for frame-pointer, compressed and DWARF recordings.
#[test]
fn live_pipeline_writes_ids_and_keeps_every_record() -> Outcome {
    let st = setup("live_pipeline_writes_ids_and_keeps_every_record")?;
    let p612 = part(perf612());
    for (name, opts) in [
        ("fp", "-g"),
        ("z", "-z -g"),
        ("dwarf", "--call-graph dwarf,4096"),
    ] {
        let input = st.dir.join(format!("{name}.in.pdata"));
        let output = st.dir.join(format!("{name}.out.pdata"));
        let report = st.dir.join(format!("{name}.json"));
        sh(
            &st,
            &format!(
                "set -e; \"$PERF\" record -q -B -o - {opts} -- ./prog | tee {} | \"$PDINJECT\" --buildids --report {} - - > {}",
                input.display(),
                report.display(),
                output.display()
            ),
        );
        assert!(is_pipe_format(&output), "{name}: output not in pipe format");
        let ctx = format!("live pipe ({name})");
        let z = name == "z";
        assert_fixture_ids(&st.perf, &st, &output, &ctx, z);
        assert_same_script(&st.perf, &input, &output, SCRIPT_ARGS);
        if let Some(p) = &p612 {
            assert_fixture_ids(p, &st, &output, &ctx, z);
            assert_same_script(p, &input, &output, SCRIPT_ARGS);
        }
        let r = read_report(&report);
        assert!(r["ids_new"].as_u64().unwrap_or(0) >= 3, "{ctx}: report {r}");
        if name == "dwarf" {
            assert!(
                r["unwound_samples"].as_u64().unwrap_or(0) > 0,
                "{ctx}: no stack was unwound: {r}"
            );
        }
        // Every input byte is in the output; only HEADER_BUILD_ID records were added.
        let (a, b) = (fs::read(&input).unwrap(), fs::read(&output).unwrap());
        assert!(b.len() > a.len(), "{ctx}: nothing was added");
    }
    Ok(())
}

/// A pipe-format file given by path, on stdin as a file, and replayed through a
/// pipe: a binary rewritten in place after the recording gets no ID in every case.
#[test]
fn pipe_file_inputs_and_a_stale_binary() -> Outcome {
    let st = setup("pipe_file_inputs_and_a_stale_binary")?;
    let input = record_pipe(&st, "-g", "in.pdata");
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Unchanged: a saved stream given with a file output becomes a file-format
    // perf.data with the IDs in its table.
    let out = st.dir.join("out.data");
    let (_, report) = pdinject_ok(&input, &out, &[]);
    assert!(
        !is_pipe_format(&out),
        "a file output must be in file format"
    );
    assert_fixture_ids(&st.perf, &st, &out, "pipe file by path", false);
    assert_same_script(&st.perf, &input, &out, SCRIPT_ARGS);
    assert_eq!(report["ids_missing"].as_u64(), Some(0), "report: {report}");
    // --buildid-all also names what was mapped and never sampled.
    let all = st.dir.join("all.data");
    pdinject_ok(&input, &all, &["--buildid-all"]);
    let got = buildid_list(&st.perf, &all);
    assert_eq!(
        got.get(&s(&st.fx.libunused)).map(String::as_str),
        Some(UNUSED_ID),
        "--buildid-all in pipe mode: {got:?}"
    );
    assert!(
        buildid_list(&st.perf, &out)
            .get(&s(&st.fx.libunused))
            .is_none_or(|id| id.is_empty()),
        "--buildids in pipe mode named the unsampled libunused"
    );

    // Rewrite prog in place (same inode, new content and mtime).
    let repl = st.dir.join("repl");
    fs::create_dir(&repl).unwrap();
    build_prog(&repl.join("prog"), PROG_ID_B, true, &st.dir);
    run_ok(Command::new("cp").arg(repl.join("prog")).arg(&st.fx.prog));
    let prog = s(&st.fx.prog);
    for (how, script) in [
        ("by path", "\"$PDINJECT\" in.pdata - > s1.pdata"),
        (
            "stdin is the file",
            "\"$PDINJECT\" - - < in.pdata > s2.pdata",
        ),
        (
            "replayed through a pipe",
            "cat in.pdata | \"$PDINJECT\" - - > s3.pdata",
        ),
    ] {
        let o = sh(&st, script);
        let name = script
            .split_whitespace()
            .find(|w| w.starts_with('s') && w.ends_with(".pdata"))
            .unwrap();
        let table = buildid_list(&st.perf, &st.dir.join(name));
        assert!(
            table.get(&prog).is_none_or(|id| id.is_empty()),
            "{how}: the rewritten {prog} got an ID: {table:?}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        // A replay is dated by perf's clock being this boot's monotonic clock; where
        // that does not hold, the replay is `undated` and no local file gets an ID.
        if how.starts_with("replayed") && err.contains("undated") {
            eprintln!("NOTE {how}: the stream was not dated here: {err}");
            continue;
        }
        assert_eq!(
            table.get(&s(&st.fx.libfix)).map(String::as_str),
            Some(LIB_ID),
            "{how}: libfix is unchanged and must keep its ID"
        );
        assert!(err.contains("stale"), "{how}: summary: {err}");
    }
    Ok(())
}

/// Any input reaches any sink: a file-format recording written to `-` becomes a
/// stream, a stream given with a file output becomes a file-format perf.data with
/// the table. perf 6.1 and 6.12 read both: `perf script` equal to the input's, the
/// IDs listed.
#[test]
fn file_to_stream_and_stream_to_file() -> Outcome {
    let st = setup("file_to_stream_and_stream_to_file")?;
    let p612 = part(perf612());
    let perfs: Vec<&Perf> = std::iter::once(&st.perf).chain(p612.as_ref()).collect();
    for (name, opts) in [
        ("fp", "-g"),
        ("z", "-z -g"),
        ("dwarf", "--call-graph dwarf,4096"),
    ] {
        let file = st.dir.join(format!("{name}.data"));
        let args: Vec<&str> = opts
            .split_whitespace()
            .chain(["-B", "--", "./prog"])
            .collect();
        record_in(&st.perf, &st.dir, &file, &args);
        let f2s = st.dir.join(format!("{name}.f2s.pdata"));
        sh(
            &st,
            &format!("\"$PDINJECT\" {} - > {}", file.display(), f2s.display()),
        );
        assert!(is_pipe_format(&f2s), "{name}: file to -: not a stream");
        let stream = record_pipe(&st, opts, &format!("{name}.pdata"));
        let s2f = st.dir.join(format!("{name}.s2f.data"));
        sh(
            &st,
            &format!(
                "cat {} | \"$PDINJECT\" - {}",
                stream.display(),
                s2f.display()
            ),
        );
        assert!(
            !is_pipe_format(&s2f),
            "{name}: stream to a file: not file format"
        );
        for p in &perfs {
            let ctx = format!("{name} file to stream");
            assert_same_script(p, &file, &f2s, SCRIPT_ARGS);
            let got = received_ids(p, &f2s);
            assert_eq!(
                got.get(&s(&st.fx.prog)).map(String::as_str),
                Some(PROG_ID),
                "{ctx} ({}): {got:?}",
                p.name
            );
            assert_eq!(
                got.get(&s(&st.fx.libfix)).map(String::as_str),
                Some(LIB_ID),
                "{ctx} ({}): {got:?}",
                p.name
            );
            assert_same_script(p, &stream, &s2f, SCRIPT_ARGS);
            assert_fixture_ids(p, &st, &s2f, &format!("{name} stream to file"), false);
        }
    }
    Ok(())
}

/// What pipe mode rejects: a truncated stream (clear error, no output left), a
/// stream that is not perf data.
#[test]
fn pipe_refusals_and_truncation() -> Outcome {
    let st = setup("pipe_refusals_and_truncation")?;
    let input = record_pipe(&st, "-g", "in.pdata");
    let bytes = fs::read(&input).unwrap();
    // Cut inside the body of the record that starts past two thirds of the stream
    // (a cut at a fixed fraction can fall on a record boundary: samples are often
    // all of one size, and a stream cut there is whole).
    let mut at = 16;
    while at < bytes.len() * 2 / 3 {
        at += u16::from_le_bytes([bytes[at + 6], bytes[at + 7]]) as usize;
    }
    assert!(at + 12 < bytes.len(), "the recording is too short to cut");
    let cut = st.dir.join("cut.pdata");
    fs::write(&cut, &bytes[..at + 12]).unwrap();
    let out = st.dir.join("cut-out.pdata");
    let o = run(pdinject().arg(&cut).arg(&out));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "truncated: {err}");
    assert!(
        err.starts_with(&format!("pdinject: {}: offset 0x", cut.display())),
        "truncated: the message must name the file and offset: {err}"
    );
    assert!(!out.exists(), "truncated input left an output");
    let left: Vec<_> = fs::read_dir(&st.dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "temp files left: {left:?}");

    let o = run(Command::new("sh")
        .arg("-c")
        .arg("echo not perf data | \"$PDINJECT\" - - > /dev/null")
        .env("PDINJECT", env!("CARGO_BIN_EXE_pdinject")));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "garbage on stdin: {err}");
    assert!(
        err.contains("<stdin>"),
        "the message must name stdin: {err}"
    );
    Ok(())
}

/// Many small batches (4 KiB, so every few records end a batch and the rest waits for
/// the next round) give the same stream and the same IDs as one big batch.
#[test]
fn small_batches_match_one_batch() -> Outcome {
    let st = setup("small_batches_match_one_batch")?;
    // Small buffers (-m 4) make perf write many FINISHED_ROUNDs.
    for (name, opts) in [
        ("fp", "-g -m 4"),
        ("z", "-z -g -m 4"),
        ("dwarf", "--call-graph dwarf,1024 -m 8"),
    ] {
        let input = record_pipe(&st, opts, &format!("{name}.pdata"));
        let bytes = fs::read(&input).unwrap();
        let run = |batch: usize, out: &str| -> PathBuf {
            let mut o = Vec::new();
            // The library fills no cache by default; this test's own (empty) one,
            // where perf script (same HOME) finds the vdso.
            let opts = pdinject::Options {
                cache: Some(pdinject::options::BuildIdCache {
                    dir: test_home().join(".debug"),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let r =
                pdinject::testing::driver::stream_in_batches(&mut &bytes[..], &mut o, &opts, batch)
                    .unwrap_or_else(|e| panic!("{name}: batch {batch}: {e}"));
            assert_eq!(r.ids.ids_missing, 0, "{name}: batch {batch}: {r:?}");
            let p = st.dir.join(out);
            fs::write(&p, o).unwrap();
            p
        };
        let big = run(64 << 20, &format!("{name}.big.pdata"));
        let small = run(4096, &format!("{name}.small.pdata"));
        assert_same_script(&st.perf, &input, &small, SCRIPT_ARGS);
        assert_same_script(&st.perf, &big, &small, SCRIPT_ARGS);
        let (a, b) = (received_ids(&st.perf, &big), received_ids(&st.perf, &small));
        assert!(a.len() >= 3, "{name}: one batch gave {a:?}");
        assert_eq!(
            a, b,
            "{name}: IDs differ between one batch and 4 KiB batches"
        );
    }
    Ok(())
}
