//! perf 7.3 at the reading end: it refuses a stream event whose size is not a
//! multiple of 8 and reads perf 6's end of features (HEADER_FEATURE 32) as an empty
//! CPU_DOMAIN_INFO section. Every stream pdinject writes, from any input, must be read
//! by perf 7.3 without either complaint, and say the same as the input.

use crate::common::*;
use std::fs;
use std::path::Path;

/// What perf 7.3 says on stderr that pdinject must never cause.
const COMPLAINTS: &[&str] = &["not 8-byte aligned", "HEADER_CPU_DOMAIN_INFO", "aborting"];

/// What is compared: every sample's IP and DSO, every mapping. Not symbols, not
/// callchains: the IDs pdinject adds let perf find symbols the input did not.
const ARGS: &[&str] = &[
    "-F",
    "comm,tid,time,event,ip,dso",
    "-G",
    "--show-mmap-events",
];

/// `perf script` of `file` read as a stream on stdin (`-i -`), stdout and stderr.
fn script_stdin(perf: &Perf, file: &Path, args: &[&str]) -> (bool, String, String) {
    let o = run(perf
        .cmd()
        .args(["script", "-i", "-"])
        .args(args)
        .stdin(fs::File::open(file).unwrap()));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// perf 7.3 reads `output` without a complaint, and prints what it prints for
/// `reference` (the input, or the stream the input was made from when perf 7.3
/// refuses the input itself).
fn assert_reads_clean(perf: &Perf, reference: &Path, output: &Path, ctx: &str) {
    let args = ARGS;
    let (ok, out, err) = script_stdin(perf, output, args);
    assert!(ok, "{ctx}: {} refuses pdinject's stream:\n{err}", perf.name);
    for c in COMPLAINTS {
        assert!(
            !err.contains(c),
            "{ctx}: {} complains about pdinject's stream ({c}):\n{err}",
            perf.name
        );
    }
    let (ok, want, err) = script_stdin(perf, reference, args);
    assert!(ok, "{ctx}: {} cannot read the reference:\n{err}", perf.name);
    assert!(
        !want.is_empty(),
        "{ctx}: perf printed nothing for the reference"
    );
    assert!(
        want == out,
        "{ctx}: {} prints other records for the output than for the input:\n{}",
        perf.name,
        first_diff(&want, &out)
    );
}

/// Streams pdinject writes from the shipped fixtures (a perf 6.1 stream, its `-z`
/// form, a file) and from perf 6.1's own `inject -b -o -` stream (HEADER_BUILD_ID
/// records of 100 bytes, which perf 7.3 refuses when it reads that stream directly).
#[test]
fn perf73_reads_every_stream_pdinject_writes() -> Outcome {
    let p73 = perf73()?;
    let p61 = perf()?;
    let d = tempfile::tempdir().unwrap();
    let pipe = manifest_dir().join("testdata/pipe/demo.pdata");
    // perf 6.1's inject -b stream: what a fleet's older post-processing left behind.
    let inj = d.path().join("inject61.pdata");
    inject_stream(&p61, &pipe, &inj);
    let (ok, _, err) = script_stdin(&p73, &inj, &[]);
    assert!(
        !ok || err.contains("not 8-byte aligned"),
        "perf 7.3 now reads perf 6.1's inject stream; this test's premise changed: {err}"
    );
    let z = manifest_dir().join("testdata/pipe/demo-z.pdata");
    let file = manifest_dir().join("testdata/demo/demo.data");
    let inputs = [
        ("pipe", &pipe, &pipe),
        ("pipe -z", &z, &z),
        ("file", &file, &file),
        ("perf 6.1 inject -b stream", &inj, &pipe),
    ];
    for (name, input, reference) in inputs {
        // The table modes only: build-ID MMAP2 records change what --show-mmap-events
        // prints (the matrix test covers them).
        for mode in ["--buildids", "--buildid-all"] {
            let out = d
                .path()
                .join(format!("out-{}.pdata", name.replace(' ', "_")));
            let o = run(pdinject()
                .args([mode, "-q"])
                .arg(input)
                .arg("-")
                .stdout(fs::File::create(&out).unwrap()));
            assert!(
                o.status.success(),
                "pdinject {mode} {name} -> stream failed: {}",
                tail(&o.stderr)
            );
            let ctx = format!("{name} {mode} -> stream");
            if name == "file" {
                // perf script reads a file and a stream alike; the reference is the
                // file itself, read with -i FILE.
                let want = perf_script(&p73, reference, ARGS);
                let (ok, got, err) = script_stdin(&p73, &out, ARGS);
                assert!(
                    ok && !COMPLAINTS.iter().any(|c| err.contains(c)),
                    "{ctx}: {err}"
                );
                assert!(want == got, "{ctx}:\n{}", first_diff(&want, &got));
            } else {
                assert_reads_clean(&p73, reference, &out, &ctx);
            }
            // The output is still read by perf 6.1 as well as the input is, by
            // `perf report` too (which stops at perf 7's end-of-features marker).
            let (ok, _, err) = script_stdin(&p61, &out, &[]);
            assert!(ok, "{ctx}: perf 6.1 refuses the output:\n{err}");
            let o = run(p61
                .cmd()
                .args(["report", "--stdio", "-i", "-"])
                .stdin(fs::File::open(&out).unwrap()));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                o.status.success() && !err.contains("wrong feature ID") && !o.stdout.is_empty(),
                "{ctx}: perf 6.1 report fails on the output:\n{err}"
            );
        }
    }
    // The repair is said: the summary names the padded records.
    let out = d.path().join("repaired.pdata");
    let o = run(pdinject()
        .arg("--buildids")
        .arg(&inj)
        .arg("-")
        .stdout(fs::File::create(&out).unwrap()));
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("HEADER_BUILD_ID record(s) of the input padded"),
        "the summary does not say the input's records were repaired:\n{err}"
    );
    Ok(())
}

/// perf 7.3's own recordings, as it makes them by default (build-ID MMAP2 records, no
/// BUILD_ID table, nothing cached at record time, CPU_DOMAIN_INFO): frame pointers,
/// `-z`, DWARF stacks, and a `-z` stream. pdinject's table then holds the fixtures'
/// IDs, perf 7.3 prints the same samples, and every perf that reads the input reads
/// the output.
#[test]
fn perf73_recordings_keep_working() -> Outcome {
    const T: &str = "perf73_recordings_keep_working";
    let st = setup(T)?;
    let p73 = perf73()?;
    let dir = &st.dir;
    let cases: [(&str, &[&str], bool); 4] = [
        ("fp", &["-g"], false),
        ("z", &["-g", "-z"], false),
        ("dwarf", &["--call-graph", "dwarf,8192"], false),
        ("z-stream", &["-g", "-z"], true),
    ];
    for (name, opts, stream) in cases {
        let input = dir.join(format!("r73-{name}.data"));
        if stream {
            let o = run(p73
                .cmd()
                .current_dir(dir)
                .args(["record", "-q", "-o", "-"])
                .args(opts)
                .args(["--", "./prog"])
                .stdout(fs::File::create(&input).unwrap()));
            assert!(
                o.status.success(),
                "perf 7.3 record {name}: {}",
                tail(&o.stderr)
            );
        } else {
            let mut args = opts.to_vec();
            args.extend(["--", "./prog"]);
            record_in(&p73, dir, &input, &args);
        }
        let out = dir.join(format!("r73-{name}.out.data"));
        let (_, report) = pdinject_ok(&input, &out, &["--buildids", "-q"]);
        let ids = buildid_list(&p73, &out);
        for (p, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
            assert_eq!(
                ids.get(p.to_str().unwrap()).map(String::as_str),
                Some(id),
                "{name}: perf 7.3 buildid-list of pdinject's output: {}\nreport: {}",
                fmt_map(&ids),
                report_summary(&report)
            );
        }
        // The IDs came from the recording's own MMAP2 records, not from files.
        let prog = report_dso(&report, st.fx.prog.to_str().unwrap())
            .unwrap_or_else(|| panic!("{name}: prog not in the report"));
        assert_eq!(prog["source"], "mmap2", "{name}: {prog}");
        let args = ["-F", "comm,tid,time,event,ip,dso", "-G"];
        let want = if stream {
            script_stdin(&p73, &input, &args).1
        } else {
            perf_script(&p73, &input, &args)
        };
        let got = perf_script(&p73, &out, &args);
        assert!(
            !want.is_empty(),
            "{name}: perf 7.3 printed nothing for the input"
        );
        assert!(
            want == got,
            "{name}: perf 7.3 script differs:\n{}",
            first_diff(&want, &got)
        );
    }
    Ok(())
}

/// A stream whose user mappings are MMAP records (perfs without `attr.mmap2`) and
/// whose HEADER_BUILD_ID records come after them, through `--mmap2-buildid-all` to a
/// stream: each MMAP grows into an MMAP2 (32 bytes), so the records after it are no
/// longer where the scan saw them, and the repairs (padding perf 6.1's 100-byte
/// HEADER_BUILD_ID records) must still find them.
#[test]
fn repairs_find_records_behind_grown_mappings() -> Outcome {
    let p61 = perf()?;
    let p73 = perf73()?;
    let d = tempfile::tempdir().unwrap();
    let pipe = manifest_dir().join("testdata/pipe/demo.pdata");
    let inj = d.path().join("inject61.pdata");
    inject_stream(&p61, &pipe, &inj);
    // User MMAP2 records (classic form) become MMAP records: pid, tid, start, len,
    // pgoff, then the name and the sample-id trailer (device, inode, prot and flags
    // dropped).
    let b = fs::read(&inj).unwrap();
    let mut out = b[..16].to_vec();
    let (mut at, mut converted, mut ids_after) = (16, 0, 0);
    while at + 8 <= b.len() {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let misc = u16::from_le_bytes([b[at + 4], b[at + 5]]);
        let size = u16::from_le_bytes([b[at + 6], b[at + 7]]) as usize;
        let rec = &b[at..at + size];
        if kind == 10 && misc & 0x4000 == 0 && misc & 7 == 2 {
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&misc.to_le_bytes());
            out.extend_from_slice(&((size - 32) as u16).to_le_bytes());
            out.extend_from_slice(&rec[8..40]);
            out.extend_from_slice(&rec[72..]);
            converted += 1;
        } else {
            ids_after += usize::from(kind == 67 && converted > 0);
            out.extend_from_slice(rec);
        }
        at += size;
    }
    assert!(
        converted > 0 && ids_after > 0,
        "{converted} MMAPs, {ids_after} IDs after"
    );
    let input = d.path().join("mmap.pdata");
    fs::write(&input, &out).unwrap();
    let output = d.path().join("out.pdata");
    let o = run(pdinject()
        .args(["--mmap2-buildid-all", "-q"])
        .arg(&input)
        .arg("-")
        .stdout(fs::File::create(&output).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let (ok, got, err) = script_stdin(&p73, &output, &["-F", "comm,tid,time,ip,dso", "-G"]);
    assert!(
        ok && !COMPLAINTS.iter().any(|c| err.contains(c)),
        "perf 7.3: {err}"
    );
    let (ok, want, err) = script_stdin(&p61, &input, &["-F", "comm,tid,time,ip,dso", "-G"]);
    assert!(ok, "perf 6.1 on the input: {err}");
    let (ok, got61, err) = script_stdin(&p61, &output, &["-F", "comm,tid,time,ip,dso", "-G"]);
    assert!(ok, "perf 6.1 on the output: {err}");
    assert!(want == got61, "perf 6.1:\n{}", first_diff(&want, &got61));
    assert_eq!(
        got.lines().count(),
        want.lines().count(),
        "perf 7.3 sees other samples"
    );
    Ok(())
}
