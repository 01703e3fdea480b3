//! `--convert-callchain`: DWARF stack dumps unwound into callchains. The oracle is
//! perf's own unwinding of the input: for each sample, the chain perf 6.1, 6.12 and
//! 7.3 print for the output (`perf script --no-inline`, frames as symbol+offset and
//! DSO) is the chain each prints for the input.

use super::common::*;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

const CVMAIN_ID: &str = "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e05";
const LIBCV_ID: &str = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f06";

struct Cv {
    dir: tempfile::TempDir,
    main: PathBuf,
}

fn build() -> Cv {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = |n: &str| fixtures_src().join("convert").join(n);
    let lib = d.join("libcv.so");
    let (s_lib, s_main) = (src("libcv.c"), src("cvmain.c"));
    let bid_lib = format!("-Wl,--build-id=0x{LIBCV_ID}");
    gcc(&[
        OsStr::new("-O2"),
        OsStr::new("-fomit-frame-pointer"),
        OsStr::new("-shared"),
        OsStr::new("-fPIC"),
        OsStr::new(&bid_lib),
        OsStr::new("-o"),
        lib.as_os_str(),
        s_lib.as_os_str(),
    ]);
    let main = d.join("cvmain");
    let bid_main = format!("-Wl,--build-id=0x{CVMAIN_ID}");
    let libdir = format!("-L{}", d.display());
    gcc(&[
        OsStr::new("-O2"),
        OsStr::new("-fomit-frame-pointer"),
        OsStr::new(&bid_main),
        OsStr::new("-o"),
        main.as_os_str(),
        s_main.as_os_str(),
        OsStr::new(&libdir),
        OsStr::new("-lcv"),
        OsStr::new("-Wl,-rpath,$ORIGIN"),
    ]);
    assert_eq!(elf_build_id(&main).as_deref(), Some(CVMAIN_ID));
    assert_eq!(elf_build_id(&lib).as_deref(), Some(LIBCV_ID));
    Cv { dir, main }
}

/// A `--call-graph dwarf` recording of the fixture.
fn record(perf: &Perf, cv: &Cv, name: &str, extra: &[&str]) -> PathBuf {
    let out = cv.dir.path().join(name);
    let mut a = vec!["--call-graph", "dwarf", "-F", "4000"];
    a.extend_from_slice(extra);
    a.extend(["--", cv.main.to_str().unwrap()]);
    record_in(perf, cv.dir.path(), &out, &a);
    out
}

/// Each sample's chain as `perf script` prints it: frames as `sym+off (dso)` (the
/// address column left out: perf 6.1 prints callchain entries relative to their map
/// and unwound ones absolute).
fn chains(perf: &Perf, file: &Path) -> Vec<Vec<String>> {
    let s = perf_script(perf, file, &["-F", "ip,sym,symoff,dso", "--no-inline"]);
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for line in s.lines() {
        let l = line.trim();
        if l.is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        cur.push(l.split_once(' ').map_or(l, |(_, r)| r).to_string());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Asserts that `perf` prints the same chains for `output` as its own unwinding of
/// `input` for at least 99 % of the samples (framehop and perf's unwinder disagree
/// on a few), and that the chains reach the fixture's callers.
fn assert_chains_match(perf: &Perf, input: &Path, output: &Path) {
    let a = chains(perf, input);
    let b = chains(perf, output);
    assert_eq!(a.len(), b.len(), "{}: sample count", perf.name);
    assert!(a.len() > 50, "{}: only {} samples", perf.name, a.len());
    let equal = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    let first = a.iter().zip(&b).find(|(x, y)| x != y);
    assert!(
        equal * 100 >= a.len() * 99,
        "{}: {equal} of {} chains equal; first difference:\n{first:#?}",
        perf.name,
        a.len()
    );
    let deep = b.iter().filter(|c| {
        ["cv_leaf", "cv_mid", "cv_top", "run", "main"]
            .iter()
            .all(|f| c.iter().any(|l| l.starts_with(&format!("{f}+"))))
    });
    assert!(
        deep.count() * 2 > b.len(),
        "{}: most chains should reach main through libcv",
        perf.name
    );
}

/// `perf evlist -v` of a file.
fn evlist(perf: &Perf, file: &Path) -> String {
    let o = run_ok(perf.cmd().args(["evlist", "-v", "-i"]).arg(file));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `pdinject ARGS IN -` into the file `out` (a stream).
fn to_stream(input: &Path, out: &Path, args: &[&str]) {
    let o = run(pdinject()
        .args(args)
        .arg(input)
        .arg("-")
        .stdout(std::fs::File::create(out).unwrap()));
    assert!(
        o.status.success(),
        "{}: {}",
        status_str(&o),
        tail(&o.stderr)
    );
    assert!(is_pipe_format(out));
}

fn convert(input: &Path, output: &Path, extra: &[&str]) -> serde_json::Value {
    let mut a = vec!["--convert-callchain"];
    a.extend_from_slice(extra);
    pdinject_ok(input, output, &a).1
}

#[test]
fn converted_chains_are_perfs_unwinding_for_perf_6_1_6_12_and_7_3() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let input = record(&perf, &cv, "in.data", &[]);
    let out = cv.dir.path().join("out.data");
    let report = convert(&input, &out, &[]);
    let c = &report["convert"];
    assert!(c["samples"].as_u64().unwrap() > 50, "{report}");
    assert_eq!(c["lost_unproven_dso"], 0, "{report}");
    // The dumps are gone: the attr carries callchains instead, at the input's size.
    let ev = evlist(&perf, &out);
    assert!(ev.contains("CALLCHAIN"), "{ev}");
    assert!(
        !ev.contains("STACK_USER") && !ev.contains("REGS_USER"),
        "{ev}"
    );
    assert!(!ev.contains("exclude_callchain_user"), "{ev}");
    assert!(
        evlist(&perf, &input).contains("size: 128") == ev.contains("size: 128"),
        "the attr size changed: {ev}"
    );
    // Much smaller, and the table names the fixture's DSOs the chains reach.
    let (isz, osz) = (
        std::fs::metadata(&input).unwrap().len(),
        std::fs::metadata(&out).unwrap().len(),
    );
    assert!(osz * 4 < isz, "output {osz} bytes, input {isz}");
    let ids = buildid_list(&perf, &out);
    assert_eq!(
        ids.get(cv.main.to_str().unwrap()).map(String::as_str),
        Some(CVMAIN_ID),
        "{ids:?}"
    );
    let lib = cv.dir.path().join("libcv.so");
    assert_eq!(
        ids.get(lib.to_str().unwrap()).map(String::as_str),
        Some(LIBCV_ID),
        "{ids:?}"
    );
    assert_chains_match(&perf, &input, &out);
    if let Some(p) = part(perf612()) {
        assert_chains_match(&p, &input, &out);
    }
    if let Some(p) = part(perf73()) {
        assert_chains_match(&p, &input, &out);
    }
    Ok(())
}

#[test]
fn conversion_is_the_same_for_every_thread_count_and_form() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let d = cv.dir.path();
    let input = record(&perf, &cv, "in.data", &[]);
    let (j1, j2) = (d.join("j1.data"), d.join("j2.data"));
    convert(&input, &j1, &["--jobs", "1"]);
    convert(&input, &j2, &["--jobs", "2"]);
    assert!(
        std::fs::read(&j1).unwrap() == std::fs::read(&j2).unwrap(),
        "--jobs 1 and --jobs 2 wrote different bytes"
    );
    let want = chains(&perf, &j1);
    // A file to a stream.
    let fs_ = d.join("fs.pipe");
    to_stream(&input, &fs_, &["--convert-callchain"]);
    assert_eq!(chains(&perf, &fs_), want, "file -> stream");
    // A stream (the input as `perf record -o -` writes it), to a stream and a file.
    let stream = d.join("in.pipe");
    to_stream(&input, &stream, &["-N"]);
    for jobs in ["1", "2"] {
        let o = d.join(format!("ss{jobs}.pipe"));
        to_stream(&stream, &o, &["--convert-callchain", "--jobs", jobs]);
        assert_eq!(chains(&perf, &o), want, "stream -> stream, -j {jobs}");
    }
    let sf = d.join("sf.data");
    convert(&stream, &sf, &[]);
    assert_eq!(chains(&perf, &sf), want, "stream -> file");
    assert!(
        std::fs::read(d.join("ss1.pipe")).unwrap() == std::fs::read(d.join("ss2.pipe")).unwrap(),
        "a stream converted with --jobs 1 and --jobs 2 differs"
    );
    // With build-ID MMAP2 records: the same chains, the IDs in the mapping records.
    let m = d.join("mmap2.data");
    convert(&input, &m, &["-B"]);
    assert_eq!(chains(&perf, &m), want, "--mmap2-buildids");
    let ids = mmap2_build_ids(&perf, &m);
    assert_eq!(
        ids.get(cv.main.to_str().unwrap()).map(String::as_str),
        Some(CVMAIN_ID),
        "{ids:?}"
    );
    Ok(())
}

#[test]
fn conversion_in_place_is_refused_and_leaves_the_file() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let input = record(&perf, &cv, "in.data", &[]);
    let before = std::fs::read(&input).unwrap();
    let o = run(pdinject()
        .args(["--convert-callchain", "--in-place"])
        .arg(&input));
    assert!(!o.status.success(), "{}", status_str(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot rewrite a file in place"), "{err}");
    assert!(std::fs::read(&input).unwrap() == before, "the file changed");
    Ok(())
}

#[test]
fn samples_without_stack_dumps_pass_through_byte_for_byte() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let d = cv.dir.path();
    let input = d.join("fp.data");
    record_in(
        &perf,
        d,
        &input,
        &["-g", "-F", "4000", "--", cv.main.to_str().unwrap(), "300"],
    );
    let (plain, conv) = (d.join("plain.data"), d.join("conv.data"));
    pdinject_ok(&input, &plain, &[]);
    let r = convert(&input, &conv, &[]);
    assert_eq!(r["convert"]["samples"], 0, "{r}");
    assert!(
        std::fs::read(&plain).unwrap() == std::fs::read(&conv).unwrap(),
        "a recording without DWARF samples changed"
    );
    Ok(())
}

#[test]
fn linux_perf_data_reads_the_converted_file() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let input = record(&perf, &cv, "in.data", &[]);
    let out = cv.dir.path().join("out.data");
    convert(&input, &out, &[]);
    let count = |p: &Path, chains: bool| -> u64 {
        use linux_perf_data::linux_perf_event_reader::EventRecord;
        use linux_perf_data::{PerfFileReader, PerfFileRecord};
        let f = std::io::BufReader::new(std::fs::File::open(p).unwrap());
        let PerfFileReader {
            mut perf_file,
            mut record_iter,
        } = PerfFileReader::parse_file(f).unwrap();
        let mut n = 0;
        while let Some(r) = record_iter.next_record(&mut perf_file).unwrap() {
            if let PerfFileRecord::EventRecord { record, .. } = r
                && let EventRecord::Sample(s) = record.parse().unwrap()
            {
                n += 1;
                // The user part of the chain is there, after its context marker.
                if chains {
                    let cc = s.callchain.expect("a converted sample has a callchain");
                    assert!(cc.len() > 1, "a chain of {} entries", cc.len());
                }
            }
        }
        n
    };
    let n_in = count(&input, false);
    assert_eq!(count(&out, true), n_in);
    Ok(())
}

#[test]
fn batch_converts_as_a_single_run_does() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let d = cv.dir.path();
    let input = record(&perf, &cv, "in.data", &[]);
    let single = d.join("single.data");
    convert(&input, &single, &["-N"]);
    let out_dir = d.join("out");
    let o = run(pdinject()
        .args(["batch", "--convert-callchain", "-N", "--out-dir"])
        .arg(&out_dir)
        .arg(&input));
    assert!(
        o.status.success(),
        "{}: {}",
        status_str(&o),
        tail(&o.stderr)
    );
    assert!(
        std::fs::read(out_dir.join("in.data")).unwrap() == std::fs::read(&single).unwrap(),
        "batch and single run differ"
    );
    // In place, a batch refuses it too.
    let o = run(pdinject()
        .args(["batch", "--convert-callchain", "--in-place"])
        .arg(&input));
    assert!(!o.status.success(), "{}", status_str(&o));
    Ok(())
}

#[test]
fn a_perf_7_3_recording_unwinds_through_files_named_by_build_id() -> Outcome {
    can_record()?;
    let p73 = perf73()?;
    let cv = build();
    let d = cv.dir.path();
    // perf 7.3 names each mapping by its build ID (no inode in the record).
    let input = record(&p73, &cv, "in73.data", &[]);
    // The library's inode changes after the recording (a chmod, or a hard link into
    // a build-ID cache): its times can no longer prove it, its build ID still does.
    let lib = d.join("libcv.so");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let c = std::ffi::CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o755) }, 0);
    let out = d.join("out.data");
    let r = convert(&input, &out, &["-N"]);
    assert_eq!(r["convert"]["lost_unproven_dso"], 0, "{r}");
    assert_chains_match(&p73, &input, &out);
    Ok(())
}

/// `src` as if recorded on another host: its HOSTNAME feature's string, same length,
/// every character changed (as tests/it/trust.rs makes it).
fn other_host(src: &Path, dst: &Path) {
    const FEAT_HOSTNAME: usize = 3;
    let mut d = std::fs::read(src).unwrap();
    let end = (le64(&d, 40) + le64(&d, 48)) as usize;
    let bit = |b: usize| le64(&d, 72 + 8 * (b / 64)) >> (b % 64) & 1 == 1;
    assert!(bit(FEAT_HOSTNAME), "the recording has no HOSTNAME feature");
    let idx = (0..FEAT_HOSTNAME).filter(|&b| bit(b)).count();
    let off = le64(&d, end + 16 * idx) as usize;
    let len = u32::from_le_bytes(d[off..off + 4].try_into().unwrap()) as usize;
    let text = d[off + 4..off + 4 + len]
        .iter()
        .position(|&b| b == 0)
        .unwrap();
    for b in &mut d[off + 4..off + 4 + text] {
        *b = if *b == b'x' { b'y' } else { b'x' };
    }
    std::fs::write(dst, d).unwrap();
}

#[test]
fn a_recording_this_host_cannot_unwind_is_refused_with_no_output() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let d = cv.dir.path();
    let input = record(&perf, &cv, "in.data", &[]);
    let other = d.join("other.data");
    other_host(&input, &other);
    for out in ["out.data", "-"] {
        let path = d.join(out);
        let o = run(pdinject()
            .args(["--convert-callchain", "-N"])
            .arg(&other)
            .arg(if out == "-" { Path::new("-") } else { &path })
            .stdout(std::process::Stdio::piped()));
        assert!(!o.status.success(), "{out}: {}", status_str(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("this host cannot unwind the recording"),
            "{err}"
        );
        assert!(
            o.stdout.is_empty(),
            "{out}: {} bytes written",
            o.stdout.len()
        );
        assert!(!path.exists() || out == "-", "{out} left behind");
    }
    // Without the conversion, the same file is injected (its files get no ID).
    pdinject_ok(&other, &d.join("plain.data"), &["-N"]);
    Ok(())
}

#[test]
fn a_live_pipeline_is_converted() -> Outcome {
    let perf = can_record()?;
    let cv = build();
    let d = cv.dir.path();
    let out = d.join("live.pipe");
    // perf record -o - | pdinject --convert-callchain - - > out: dated by this boot's
    // clock as it arrives, as a live stream is.
    let pdi = pdinject().get_program().to_owned();
    let script = format!(
        "{} record -q --call-graph dwarf -F 4000 -o - -- {} 300 | {} --convert-callchain -N - - > {}",
        perf.bin.display(),
        cv.main.display(),
        Path::new(&pdi).display(),
        out.display()
    );
    let mut c = std::process::Command::new("sh");
    c.arg("-c")
        .arg(&script)
        .current_dir(d)
        .env("HOME", test_home());
    if let Some(l) = &perf.ld_library_path {
        c.env("LD_LIBRARY_PATH", l);
    }
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "{}: {}",
        status_str(&o),
        tail(&o.stderr)
    );
    assert!(is_pipe_format(&out));
    let ch = chains(&perf, &out);
    assert!(ch.len() > 20, "{} samples", ch.len());
    assert!(
        ch.iter().any(|c| ["cv_leaf+", "cv_mid+", "main+"]
            .iter()
            .all(|f| c.iter().any(|l| l.starts_with(f)))),
        "no chain reaches main through libcv: {:?}",
        ch.first()
    );
    Ok(())
}
