//! Outputs older perfs read (`--attrs-for`), and what `--mmap2-buildid-all` does with
//! the kernel's map (samply reads it).
//!
//! perf 7.3 writes attrs of 144 bytes; perf 6.1 (128) and 6.12 (136) refuse a file
//! whose attrs are larger than their own ("incompatible file format"). pdinject
//! copies attrs verbatim unless `--attrs-for` asks for an older size, which it writes
//! only when the bytes cut off are zero.

use crate::common::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// What is compared between perf 7.3 on the input and an older perf on the output:
/// the fields every perf prints, callchains hidden, blanks collapsed (perfs pad
/// columns differently).
fn samples(perf: &Perf, file: &Path) -> String {
    let mut c = perf.cmd();
    c.args([
        "script",
        "-F",
        "comm,tid,time,period,event,ip,dso",
        "-G",
        "-i",
    ]);
    // A stream on stdin, as a pipeline gives it; a file by its path.
    if is_pipe_format(file) {
        c.arg("-").stdin(fs::File::open(file).unwrap());
    } else {
        c.arg(file);
    }
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "{} cannot read {}:\n{}",
        perf.name,
        file.display(),
        tail(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `perf script` refuses `file` with "incompatible file format".
fn refused(perf: &Perf, file: &Path) -> bool {
    let o = run(perf.cmd().args(["script", "-i"]).arg(file));
    !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("incompatible file format")
}

/// The attr entry size of a file-format perf.data (header bytes 16..24).
fn attr_entry_size(file: &Path) -> u64 {
    le64(&fs::read(file).unwrap(), 16)
}

/// `attr.size` of every HEADER_ATTR record of a stream.
fn stream_attr_sizes(file: &Path) -> Vec<u32> {
    let b = fs::read(file).unwrap();
    let mut at = 16;
    let mut out = Vec::new();
    while at + 8 <= b.len() {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let size = u16::from_le_bytes(b[at + 6..at + 8].try_into().unwrap()) as usize;
        if size < 8 {
            break;
        }
        if kind == 64 {
            out.push(u32::from_le_bytes(b[at + 12..at + 16].try_into().unwrap()));
        }
        at += size;
    }
    out
}

/// `pdinject ARGS IN -` into `out`; the process output.
fn to_stream(input: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    run(pdinject()
        .args(["-N", "-q"])
        .args(args)
        .arg(input)
        .arg("-")
        .stdout(fs::File::create(out).unwrap()))
}

/// A perf 7.3 recording (file and stream) converted with `--attrs-for 6.1` is read by
/// perf 6.1 with the samples perf 7.3 prints for the input and the IDs in its table;
/// without the option perf 6.1 still refuses it (the default keeps attrs verbatim).
/// `--attrs-for 6.12` does the same for perf 6.12.
#[test]
fn attrs_for_makes_perf73_recordings_readable_by_older_perfs() -> Outcome {
    const T: &str = "attrs_for_makes_perf73_recordings_readable_by_older_perfs";
    let p73 = perf73()?;
    let st = setup(T)?;
    let p61 = st.perf.clone();
    let file = st.dir.join("f73.data");
    record_in(&p73, &st.dir, &file, &["-g", "--", "./prog"]);
    let stream = st.dir.join("s73.pdata");
    run_ok(
        p73.cmd()
            .current_dir(&st.dir)
            .args(["record", "-q", "-g", "-o", "-", "--", "./prog"])
            .stdout(fs::File::create(&stream).unwrap()),
    );
    assert_eq!(
        attr_entry_size(&file),
        144 + 16,
        "perf 7.3 is expected to write 144-byte attrs"
    );
    assert!(refused(&p61, &file), "perf 6.1 reads perf 7.3's file");
    let want_file = samples(&p73, &file);
    let want_stream = samples(&p73, &stream);
    assert!(!want_file.is_empty() && !want_stream.is_empty());

    // The default: attrs verbatim, which perf 6.1 refuses.
    let verbatim = st.dir.join("verbatim.data");
    pdinject_ok(&file, &verbatim, &["-N"]);
    assert_eq!(attr_entry_size(&verbatim), 160);
    assert!(
        refused(&p61, &verbatim),
        "the default must keep attrs verbatim"
    );

    let table_ok = |perf: &Perf, out: &Path, ctx: &str| {
        let t = buildid_list(perf, out);
        assert_eq!(
            t.get(&s(&st.fx.prog)).map(String::as_str),
            Some(PROG_ID),
            "{ctx}: {t:?}"
        );
        assert_eq!(
            t.get(&s(&st.fx.libfix)).map(String::as_str),
            Some(LIB_ID),
            "{ctx}: {t:?}"
        );
    };

    // File to file, stream to file.
    for (input, want, name) in [
        (&file, &want_file, "f2f.data"),
        (&stream, &want_stream, "s2f.data"),
    ] {
        let out = st.dir.join(name);
        let (_, report) = pdinject_ok(input, &out, &["-N", "--attrs-for", "6.1"]);
        assert_eq!(attr_entry_size(&out), 128 + 16, "{name}");
        assert_eq!(samples(&p61, &out), *want, "{name}: perf 6.1 on the output");
        assert_eq!(samples(&p73, &out), *want, "{name}: perf 7.3 on the output");
        table_ok(&p61, &out, name);
        if name == "f2f.data" {
            assert!(
                report["notes"].to_string().contains("cut from 144 to 128"),
                "{report}"
            );
        }
    }
    // File to stream, stream to stream: HEADER_ATTR records of 128 bytes.
    for (input, want, name) in [
        (&file, &want_file, "f2s.pdata"),
        (&stream, &want_stream, "s2s.pdata"),
    ] {
        let out = st.dir.join(name);
        let o = to_stream(input, &out, &["--attrs-for", "6.1"]);
        assert!(o.status.success(), "{name}: {}", tail(&o.stderr));
        let sizes = stream_attr_sizes(&out);
        assert!(
            !sizes.is_empty() && sizes.iter().all(|&n| n == 128),
            "{name}: {sizes:?}"
        );
        assert_eq!(samples(&p61, &out), *want, "{name}: perf 6.1 on the output");
        assert_eq!(samples(&p73, &out), *want, "{name}: perf 7.3 on the output");
    }
    // perf 6.12: 136 bytes.
    if let Some(p612) = part(perf612()) {
        assert!(refused(&p612, &file), "perf 6.12 reads perf 7.3's file");
        let out = st.dir.join("f2f612.data");
        pdinject_ok(&file, &out, &["-N", "--attrs-for", "6.12"]);
        assert_eq!(attr_entry_size(&out), 136 + 16);
        assert_eq!(samples(&p612, &out), want_file, "perf 6.12 on the output");
        table_ok(&p612, &out, "--attrs-for 6.12");
        assert!(
            refused(&p61, &out),
            "136-byte attrs are still too large for 6.1"
        );
    }
    Ok(())
}

/// `testdata/pipe/demo.pdata` (perf 6.1, 128-byte attrs) with every HEADER_ATTR's
/// attr grown to 144 bytes, `config3` and `config4` set as given: what perf 7.3 would
/// send for such an event.
fn stream_with_144_byte_attrs(dir: &Path, config3: u64, config4: u64, name: &str) -> PathBuf {
    let b = fs::read(manifest_dir().join("testdata/pipe/demo.pdata")).unwrap();
    let mut out = b[..16].to_vec();
    let mut at = 16;
    while at + 8 <= b.len() {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let size = u16::from_le_bytes(b[at + 6..at + 8].try_into().unwrap()) as usize;
        assert!(size >= 8 && at + size <= b.len(), "demo.pdata frames");
        let rec = &b[at..at + size];
        if kind == 64 {
            let asz = u32::from_le_bytes(rec[12..16].try_into().unwrap()) as usize;
            assert_eq!(asz, 128, "demo.pdata's attrs are perf 6.1's");
            let mut r = rec[..8 + asz].to_vec();
            r.extend_from_slice(&config3.to_le_bytes());
            r.extend_from_slice(&config4.to_le_bytes());
            r.extend_from_slice(&rec[8 + asz..]);
            let n = r.len() as u16;
            r[6..8].copy_from_slice(&n.to_le_bytes());
            r[12..16].copy_from_slice(&144u32.to_le_bytes());
            out.extend_from_slice(&r);
        } else {
            out.extend_from_slice(rec);
        }
        at += size;
    }
    let p = dir.join(name);
    fs::write(&p, out).unwrap();
    p
}

/// Nothing but `keep` in `dir` (no output, no temp file left behind).
fn only(dir: &Path, keep: &[&Path]) {
    let keep: BTreeSet<PathBuf> = keep.iter().map(|p| p.to_path_buf()).collect();
    let extra: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !keep.contains(p))
        .collect();
    assert!(extra.is_empty(), "left behind: {extra:?}");
}

/// An attr whose field beyond the older size is not zero is refused, naming the event
/// and the field, exit 1, nothing written; in every output form. `--in-place` with
/// the option is a usage error that leaves the file as it was.
#[test]
fn attrs_for_refuses_a_non_zero_newer_field() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let c3 = stream_with_144_byte_attrs(dir, 0x5, 0, "c3.pdata");
    // A file with 144-byte attrs (non-zero bytes are never cut by default).
    let c3file = dir.join("c3.data");
    let o = run(pdinject().args(["-N", "-q"]).arg(&c3).arg(&c3file));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(attr_entry_size(&c3file), 160);
    let check = |o: &std::process::Output, field: &str, perf: &str, ctx: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{ctx}: {err}");
        assert!(
            err.contains("event 0 (")
                && err.contains(&format!("{field} = 0x5 is not zero"))
                && err.contains(&format!("perf {perf}'s attr has no {field}")),
            "{ctx}: {err}"
        );
    };
    for input in [&c3, &c3file] {
        let out = dir.join("out.data");
        let o = run(pdinject()
            .args(["-N", "--attrs-for", "6.1"])
            .arg(input)
            .arg(&out));
        check(&o, "config3", "6.1", "to a file");
        only(dir, &[&c3, &c3file]);
        let s = dir.join("out.pdata");
        let o = to_stream(input, &s, &["--attrs-for", "6.1"]);
        check(&o, "config3", "6.1", "to a stream");
        assert_eq!(fs::metadata(&s).unwrap().len(), 0, "stream bytes written");
        fs::remove_file(&s).unwrap();
    }
    // perf 6.12 has config3: written at 136 bytes.
    let out = dir.join("c3-612.data");
    let o = run(pdinject()
        .args(["-N", "-q", "--attrs-for", "6.12"])
        .arg(&c3file)
        .arg(&out));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(attr_entry_size(&out), 152);
    if let Some(p612) = part(perf612()) {
        run_ok(
            p612.cmd()
                .args(["script", "-i"])
                .arg(&out)
                .stdout(Stdio::null()),
        );
    }
    fs::remove_file(&out).unwrap();
    // Batch mode takes the option too (and its marker tells the runs apart).
    let bdir = tempfile::tempdir().unwrap();
    let o = run(pdinject()
        .args(["batch", "-N", "-q", "--attrs-for", "6.12", "--out-dir"])
        .arg(bdir.path())
        .arg(&c3file));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(attr_entry_size(&bdir.path().join("c3.data")), 152);
    let o = run(pdinject()
        .args(["batch", "-N", "-q", "--attrs-for", "6.1", "--out-dir"])
        .arg(bdir.path())
        .arg(&c3file));
    assert_eq!(o.status.code(), Some(1), "{}", tail(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("config3 = 0x5"));
    // ... but not config4.
    let c4 = stream_with_144_byte_attrs(dir, 0, 0x5, "c4.pdata");
    let o = run(pdinject()
        .args(["-N", "--attrs-for", "6.12"])
        .arg(&c4)
        .arg(dir.join("c4.data")));
    check(&o, "config4", "6.12", "config4 for 6.12");
    only(dir, &[&c3, &c3file, &c4]);
    // In place: a usage error, the file untouched.
    let before = fs::read(&c3file).unwrap();
    let o = run(pdinject()
        .args(["-N", "--attrs-for", "6.1", "--in-place"])
        .arg(&c3file));
    assert_eq!(o.status.code(), Some(2), "{}", tail(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("in place"));
    assert_eq!(fs::read(&c3file).unwrap(), before);
}

/// Zeros beyond 128 bytes: `--attrs-for 6.1` writes 128-byte attrs in every form, and
/// perf 6.1 reads what it wrote (a perf 7.3 stream, without perf 7.3).
#[test]
fn attrs_for_cuts_zero_tails_in_every_form() -> Outcome {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let zero = stream_with_144_byte_attrs(dir, 0, 0, "z.pdata");
    let file = dir.join("z.data");
    let o = run(pdinject()
        .args(["-N", "-q", "--attrs-for", "6.1"])
        .arg(&zero)
        .arg(&file));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(attr_entry_size(&file), 144);
    let s2s = dir.join("z2.pdata");
    let o = to_stream(&zero, &s2s, &["--attrs-for", "6.1"]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(
        stream_attr_sizes(&s2s),
        vec![128; stream_attr_sizes(&zero).len()]
    );
    let f2s = dir.join("z3.pdata");
    let o = to_stream(&file, &f2s, &["--attrs-for", "6.1"]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert!(stream_attr_sizes(&f2s).iter().all(|&n| n == 128));
    let p61 = perf()?;
    let want = samples(&p61, &manifest_dir().join("testdata/pipe/demo.pdata"));
    for out in [&file, &s2s, &f2s] {
        assert_eq!(samples(&p61, out), want, "{}", out.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// --mmap2-buildid-all and the kernel's map

/// samply, if installed (`cargo install samply --locked`).
fn samply() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("samply"))
                .collect()
        })
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        c.push(PathBuf::from(h).join("bin/samply"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        c.push(PathBuf::from(h).join(".cargo/bin/samply"));
    }
    c.into_iter().find(|p| p.is_file())
}

/// samply's library list of `file`: "name codeId" of each lib.
fn samply_libs(samply: &Path, file: &Path, dir: &Path) -> BTreeSet<String> {
    let json = dir.join(format!(
        "{}.json.gz",
        file.file_name().unwrap().to_string_lossy()
    ));
    let o = run(std::process::Command::new(samply)
        .env("HOME", test_home())
        .args(["import", "-s", "-n", "-o"])
        .arg(&json)
        .arg(file)
        .stdin(Stdio::null()));
    assert!(
        o.status.success(),
        "samply import {}: {}",
        file.display(),
        tail(&o.stderr)
    );
    let gz = fs::File::open(&json).unwrap();
    let o = run(std::process::Command::new("gzip").args(["-dc"]).stdin(gz));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("samply's JSON");
    v["libs"]
        .as_array()
        .expect("libs")
        .iter()
        .map(|l| {
            format!(
                "{} {}",
                l["name"].as_str().unwrap_or(""),
                l["codeId"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The kernel's mapping lines of `perf script --show-mmap-events`.
fn kernel_maps(perf: &Perf, file: &Path) -> Vec<String> {
    perf_script(
        perf,
        file,
        &["--show-mmap-events", "-F", "comm,tid,time,ip"],
    )
    .lines()
    .filter(|l| l.contains("PERF_RECORD_MMAP") && l.contains("[kernel.kallsyms]"))
    .map(str::to_string)
    .collect()
}

/// `--mmap2-buildid-all` leaves the kernel's MMAP record as it was, with the kernel's
/// ID in the table (as perf 6.12's and 7.3's `inject --mmap2-buildid-all` do): samply
/// takes the kernel from MMAP records and drops MMAP2 records without PROT_EXEC, so
/// a kernel map in build-ID MMAP2 form lost the kernel from its library list.
#[test]
fn mmap2_buildid_all_keeps_the_kernels_map() -> Outcome {
    const T: &str = "mmap2_buildid_all_keeps_the_kernels_map";
    let st = setup(T)?;
    // Without -B: perf writes the table, the kernel's ID included.
    let input = record_prog(&st, &["-g"], "fp.data");
    let maps = kernel_maps(&st.perf, &input);
    let table = buildid_list(&st.perf, &input);
    let Some(kid) = table
        .get("[kernel.kallsyms]")
        .filter(|i| !i.is_empty())
        .cloned()
    else {
        return skip(format!("perf wrote no kernel ID here: {table:?}"));
    };
    assert!(
        maps.iter().any(|l| l.contains("PERF_RECORD_MMAP ")),
        "no kernel MMAP record in the input: {maps:?}"
    );
    let out = st.dir.join("m2.data");
    pdinject_ok(&input, &out, &["-N", "--mmap2-buildid-all"]);
    assert_eq!(
        kernel_maps(&st.perf, &out),
        maps,
        "the kernel's record changed"
    );
    let t = buildid_list(&st.perf, &out);
    assert_eq!(t.get("[kernel.kallsyms]"), Some(&kid), "{t:?}");
    // The user DSOs are still converted.
    let m2 = mmap2_build_ids(&st.perf, &out);
    assert_eq!(
        m2.get(&s(&st.fx.prog)).map(String::as_str),
        Some(PROG_ID),
        "{m2:?}"
    );
    // Streams keep it too: file to stream, and back to a file.
    let s = st.dir.join("m2.pdata");
    let o = to_stream(&input, &s, &["--mmap2-buildid-all"]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(
        kernel_maps(&st.perf, &s),
        maps,
        "stream: the kernel's record changed"
    );
    let s2f = st.dir.join("s2f.data");
    pdinject_ok(&s, &s2f, &["-N", "--mmap2-buildid-all"]);
    assert_eq!(kernel_maps(&st.perf, &s2f), maps);
    assert_eq!(
        buildid_list(&st.perf, &s2f).get("[kernel.kallsyms]"),
        Some(&kid)
    );

    let Some(samply) = samply() else {
        return skip("samply not found (cargo install samply --locked --version 0.13.1)");
    };
    let want = samply_libs(&samply, &input, &st.dir);
    assert!(
        want.iter().any(|l| l.starts_with("[kernel.kallsyms] ")),
        "samply lists no kernel for the input: {want:?}"
    );
    for f in [&out, &s2f] {
        let got = samply_libs(&samply, f, &st.dir);
        assert_eq!(got, want, "samply's libraries of {}", f.display());
    }
    Ok(())
}
