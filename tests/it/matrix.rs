//! The compatibility matrix: writers (perf 6.1, 6.12 and 7.3: `record` files and
//! streams, and `inject -b -o -` streams) x every output form pdinject has (table
//! file, stream, build-ID MMAP2, in place, batch) x readers (perf 6.1, 6.12 and 7.3,
//! linux-perf-data, samply).
//!
//! What each reader must say of an output, given what it says of the input:
//! * perf: when it reads the input, it reads the output, `perf script` prints the same
//!   samples and mappings, `perf buildid-list` lists the fixtures' IDs, and neither
//!   `perf script` nor `perf report --header-only` prints a warning it did not print
//!   for the input. When it refuses the input (perf 6.1 and 6.12 refuse perf 7.3's
//!   144-byte attrs: "incompatible file format"), the cell says so and nothing more
//!   is asked: attrs are copied verbatim.
//! * linux-perf-data: every record of the output parses, with as many samples as the
//!   input, and the fixtures' IDs are in its table, HEADER_BUILD_ID records or MMAP2
//!   records.
//! * samply (files only: it does not import streams): the same libraries with the same
//!   code IDs as the input's, the fixtures' among them. A stream input's reference is
//!   the same writer's file recording of the same program, another run: the libraries
//!   both show have the same code IDs, and every library the output shows has one.
//!
//! The test prints the matrix (as docs/compatibility.md shows it) and fails on any cell
//! that is not as expected.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The fields `perf script` is compared on: samples' IP and DSO (not symbols: the IDs
/// pdinject adds let perf find symbols it could not before).
const SCRIPT: &[&str] = &["-F", "comm,tid,time,event,ip,dso", "-G"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `perf record -o FILE`.
    File,
    /// `perf record -o -`.
    Stream,
    /// `perf inject -b -i - -o -` of that stream.
    Inject,
}

impl Form {
    fn is_stream(self) -> bool {
        self != Form::File
    }
    fn name(self) -> &'static str {
        match self {
            Form::File => "record file",
            Form::Stream => "record stream",
            Form::Inject => "inject -b stream",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    Table,
    /// A table file with `--attrs-for 6.1`: what a fleet that records with a newer
    /// perf gives an older one.
    TableFor61,
    Stream,
    Mmap2,
    InPlace,
    Batch,
}

impl Out {
    const ALL: [Out; 6] = [
        Out::Table,
        Out::TableFor61,
        Out::Stream,
        Out::Mmap2,
        Out::InPlace,
        Out::Batch,
    ];
    fn name(self) -> &'static str {
        match self {
            Out::Table => "table file",
            Out::TableFor61 => "table file, --attrs-for 6.1",
            Out::Stream => "stream",
            Out::Mmap2 => "MMAP2 file",
            Out::InPlace => "in place",
            Out::Batch => "batch",
        }
    }
    /// Whether the output is a stream (what perf must read on stdin). Batch writes
    /// files (a stream input becomes a file with its table); in place takes files.
    fn is_stream(self) -> bool {
        self == Out::Stream
    }
}

struct Input {
    writer: &'static str,
    form: Form,
    path: PathBuf,
    /// The same writer's file recording (samply's reference for a stream).
    file_twin: PathBuf,
}

/// A perf run on a file or, for a stream, on stdin.
fn perf_on(
    perf: &Perf,
    sub: &[&str],
    file: &Path,
    stream: bool,
    extra: &[&str],
) -> std::process::Output {
    let mut c = perf.cmd();
    c.args(sub);
    if stream {
        c.args(["-i", "-"]).stdin(fs::File::open(file).unwrap());
    } else {
        c.arg("-i").arg(file);
    }
    c.args(extra);
    run(&mut c)
}

/// stderr lines that say something about the file (not about this machine's
/// missing symbol files, which IDs make perf look for, and not temp names).
fn complaints(stderr: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            !l.starts_with("No kallsyms or vmlinux with build-id")
                && !l.contains("perf-vdso.so")
                && !l.starts_with("Warning:\nKernel address maps")
        })
        .map(str::to_string)
        .collect()
}

/// What a perf says of one file: whether `perf script` reads it, what it prints, its
/// warnings, `perf report --header-only`'s warnings, and `perf buildid-list`.
struct PerfView {
    ok: bool,
    script: String,
    warnings: BTreeSet<String>,
    header_warnings: BTreeSet<String>,
    ids: BTreeMap<String, String>,
    error: String,
}

fn perf_view(perf: &Perf, file: &Path, stream: bool, mmap_events: bool) -> PerfView {
    let mut args = SCRIPT.to_vec();
    if mmap_events {
        args.push("--show-mmap-events");
    }
    let o = perf_on(perf, &["script"], file, stream, &args);
    let h = perf_on(perf, &["report", "--header-only"], file, stream, &[]);
    let b = perf_on(perf, &["buildid-list"], file, stream, &[]);
    PerfView {
        ok: o.status.success() && !o.stdout.is_empty(),
        script: String::from_utf8_lossy(&o.stdout).into_owned(),
        warnings: complaints(&o.stderr),
        header_warnings: complaints(&h.stderr),
        ids: parse_buildid_list(&String::from_utf8_lossy(&b.stdout)),
        error: tail(&o.stderr),
    }
}

/// What linux-perf-data reads of a file or stream: samples, and every build ID it
/// carries (table, HEADER_BUILD_ID records, build-ID MMAP2 records), by path.
fn lpd_view(file: &Path, stream: bool) -> Result<(u64, BTreeMap<String, String>), String> {
    use linux_perf_data::linux_perf_event_reader::{EventRecord, Mmap2FileId};
    use linux_perf_data::{PerfFileReader, PerfFileRecord};
    let f = std::io::BufReader::new(fs::File::open(file).map_err(|e| e.to_string())?);
    let linux_perf_data::PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = if stream {
        PerfFileReader::parse_pipe(f).map_err(|e| format!("parse_pipe: {e}"))?
    } else {
        PerfFileReader::parse_file(f).map_err(|e| format!("parse_file: {e}"))?
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut ids = BTreeMap::new();
    let mut samples = 0u64;
    while let Some(r) = record_iter
        .next_record(&mut perf_file)
        .map_err(|e| format!("record: {e}"))?
    {
        match r {
            PerfFileRecord::EventRecord { record, .. } => {
                match record.parse().map_err(|e| format!("event: {e}"))? {
                    EventRecord::Sample(_) => samples += 1,
                    EventRecord::Mmap2(m) => {
                        if let Mmap2FileId::BuildId(id) = &m.file_id {
                            ids.insert(
                                String::from_utf8_lossy(&m.path.as_slice()).into_owned(),
                                hex(id),
                            );
                        }
                    }
                    _ => {}
                }
            }
            PerfFileRecord::UserRecord(u) => {
                // HEADER_BUILD_ID (67): pid at 0, ID at 4..24, its length at 24, name
                // from 28 (offsets after the 8-byte header).
                if u.record_type == linux_perf_data::UserRecordType::PERF_HEADER_BUILD_ID {
                    let d = u.data.as_slice();
                    if d.len() > 28 {
                        let len = if u.misc & 0x8000 != 0 {
                            (d[24] as usize).min(20)
                        } else {
                            20
                        };
                        let name = d[28..].split(|&b| b == 0).next().unwrap_or_default();
                        ids.insert(
                            String::from_utf8_lossy(name).into_owned(),
                            hex(&d[4..4 + len]),
                        );
                    }
                }
            }
        }
    }
    for (_, info) in perf_file
        .build_ids()
        .map_err(|e| format!("build_ids: {e}"))?
    {
        ids.insert(
            String::from_utf8_lossy(&info.path).into_owned(),
            hex(&info.build_id),
        );
    }
    Ok((samples, ids))
}

/// samply's libraries (path -> code ID) for a file, or why it has none.
fn samply_libs(samply: &Path, file: &Path, dir: &Path) -> Result<BTreeMap<String, String>, String> {
    let out = dir.join(format!(
        "{}.samply.json.gz",
        file.file_name().unwrap().to_string_lossy()
    ));
    let o = run(Command::new(samply)
        .args(["import", "-s", "-o"])
        .arg(&out)
        .arg(file)
        .env("HOME", test_home())
        .stdin(Stdio::null()));
    if !o.status.success() || !out.exists() {
        return Err(format!("samply import failed: {}", tail(&o.stderr)));
    }
    let gz = run(Command::new("gzip").arg("-dc").arg(&out));
    let v: serde_json::Value =
        serde_json::from_slice(&gz.stdout).map_err(|e| format!("samply json: {e}"))?;
    let mut libs = BTreeMap::new();
    for l in v["libs"].as_array().into_iter().flatten() {
        // samply names the kernel after its mapping ("[kernel.kallsyms]_text") or
        // its table entry ("[kernel.kallsyms]"): the same library.
        let path = l["path"].as_str().unwrap_or_default();
        libs.insert(
            path.strip_suffix("_text").unwrap_or(path).to_string(),
            l["codeId"].as_str().unwrap_or_default().to_string(),
        );
    }
    Ok(libs)
}

fn find_samply() -> Option<PathBuf> {
    let mut cands = vec![PathBuf::from("samply")];
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        cands.push(PathBuf::from(h).join("bin/samply"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        cands.push(PathBuf::from(h).join(".cargo/bin/samply"));
    }
    cands.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Makes one output of `input`; returns its path.
/// What pdinject's report (beside `output`, when the run wrote one) says of `dso`:
/// its ID, or why it has none.
fn why_missing(output: &Path, dso: &str) -> String {
    let Ok(text) = fs::read_to_string(output.with_extension("json")) else {
        return "no report".into();
    };
    let r: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    match report_dso(&r, dso) {
        Some(d) => format!(
            "pdinject: id {}, reason {}, {}",
            d["build_id"], d["reason"], d["detail"]
        ),
        None => "not in pdinject's report".into(),
    }
}

fn make_output(input: &Input, out: Out, dir: &Path) -> Option<PathBuf> {
    let stem = format!(
        "{}-{}-{}",
        input.writer.replace('.', ""),
        input.form.name().replace([' ', '-'], "_"),
        out.name().replace(' ', "_")
    );
    let q = ["-q", "--report"];
    let report = dir.join(format!("{stem}.json"));
    let o = match out {
        Out::Table | Out::TableFor61 | Out::Mmap2 => {
            let p = dir.join(format!("{stem}.data"));
            let mode: &[&str] = match out {
                Out::Mmap2 => &["--mmap2-buildid-all"],
                Out::TableFor61 => &["--buildids", "--attrs-for", "6.1"],
                _ => &["--buildids"],
            };
            let o = run(pdinject()
                .args(mode)
                .args(q)
                .arg(&report)
                .arg(&input.path)
                .arg(&p));
            (o, p)
        }
        Out::Stream => {
            let p = dir.join(format!("{stem}.pdata"));
            let o = run(pdinject()
                .arg("--buildids")
                .args(q)
                .arg(&report)
                .arg(&input.path)
                .arg("-")
                .stdout(fs::File::create(&p).unwrap()));
            (o, p)
        }
        Out::InPlace => {
            if input.form.is_stream() {
                return None;
            }
            let p = dir.join(format!("{stem}.data"));
            fs::copy(&input.path, &p).unwrap();
            let o = run(pdinject()
                .args(["--buildids", "--in-place"])
                .args(q)
                .arg(&report)
                .arg(&p));
            (o, p)
        }
        Out::Batch => {
            let src = dir.join(format!("{stem}.in"));
            fs::copy(&input.path, &src).unwrap();
            let o = run(pdinject()
                .args(["batch", "--buildids", "-q", "--suffix", ".bid"])
                .arg(&src));
            (o, dir.join(format!("{stem}.in.bid")))
        }
    };
    let (o, p) = o;
    assert!(
        o.status.success() && p.exists(),
        "pdinject {} of {} {} failed ({}):\n{}",
        out.name(),
        input.writer,
        input.form.name(),
        status_str(&o),
        tail(&o.stderr)
    );
    Some(p)
}

#[test]
fn compatibility_matrix() -> Outcome {
    const T: &str = "compatibility_matrix";
    let st = setup(T)?;
    let p612 = perf612()?;
    let p73 = perf73()?;
    // Without samply its column is left out, and the test ends ignored naming it.
    let samply = part(find_samply().ok_or_else(|| {
        Skip::new("samply not found (cargo install samply --locked --version 0.13.1)")
    }));
    let readers = [st.perf.clone(), p612.clone(), p73.clone()];
    let writers = [("6.1", &st.perf), ("6.12", &p612), ("7.3", &p73)];
    let dir = &st.dir;

    // The inputs: each writer records the fixture program to a file and to a stream,
    // and injects build IDs into that stream with its own `inject -b`.
    let mut inputs = Vec::new();
    for (w, perf) in writers {
        let tag = w.replace('.', "");
        let file = dir.join(format!("rec{tag}.data"));
        record_in(perf, dir, &file, &["-B", "-g", "--", "./prog"]);
        let stream = dir.join(format!("rec{tag}.pdata"));
        let o = run(perf
            .cmd()
            .current_dir(dir)
            .args(["record", "-q", "-B", "-g", "-o", "-", "--", "./prog"])
            .stdout(fs::File::create(&stream).unwrap()));
        assert!(
            o.status.success(),
            "perf {w} record -o - failed: {}",
            tail(&o.stderr)
        );
        let inj = dir.join(format!("inj{tag}.pdata"));
        inject_stream(perf, &stream, &inj);
        for (form, path) in [
            (Form::File, &file),
            (Form::Stream, &stream),
            (Form::Inject, &inj),
        ] {
            inputs.push(Input {
                writer: w,
                form,
                path: path.clone(),
                file_twin: file.clone(),
            });
        }
    }

    let want = [
        (st.fx.prog.to_string_lossy().into_owned(), PROG_ID),
        (st.fx.libfix.to_string_lossy().into_owned(), LIB_ID),
    ];
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for input in &inputs {
        let in_stream = input.form.is_stream();
        let in_views: Vec<PerfView> = readers
            .iter()
            .map(|r| perf_view(r, &input.path, in_stream, true))
            .collect();
        let in_lpd = lpd_view(&input.path, in_stream);
        let in_samply = samply
            .as_ref()
            .map(|s| samply_libs(s, &input.file_twin, dir));
        for out in Out::ALL {
            let Some(path) = make_output(input, out, dir) else {
                continue;
            };
            let out_stream = out.is_stream();
            let cell = format!("{} {} -> {}", input.writer, input.form.name(), out.name());
            let mut row = vec![
                format!("perf {} {}", input.writer, input.form.name()),
                out.name().to_string(),
            ];
            let mut fail = |what: String| failures.push(format!("{cell}: {what}"));
            // perf 6.1, 6.12, 7.3.
            for (r, inv) in readers.iter().zip(&in_views) {
                // Build-ID MMAP2 records print differently with --show-mmap-events.
                let mmap_events = out != Out::Mmap2;
                let o = perf_view(r, &path, out_stream, mmap_events);
                if !inv.ok && out == Out::TableFor61 {
                    // The point of the option: the output is read where the input
                    // is not (the samples are compared in tests/it/attrs.rs).
                    let mut ok = o.ok;
                    if !o.ok {
                        fail(format!(
                            "{} refuses the --attrs-for 6.1 output: {}",
                            r.name, o.error
                        ));
                    }
                    for (p, id) in &want {
                        if o.ids.get(p).map(String::as_str) != Some(*id) {
                            fail(format!(
                                "{}: buildid-list has no {id} for {p} ({})",
                                r.name,
                                why_missing(&path, p)
                            ));
                            ok = false;
                        }
                    }
                    row.push(if ok {
                        "ok (input refused)".into()
                    } else {
                        "FAIL".into()
                    });
                    continue;
                }
                if !inv.ok {
                    row.push(if o.ok {
                        "reads (input refused)".into()
                    } else {
                        "input refused too".into()
                    });
                    continue;
                }
                let mut ok = true;
                if !o.ok {
                    fail(format!("{} refuses the output: {}", r.name, o.error));
                    ok = false;
                } else {
                    let in_script = if mmap_events {
                        inv.script.clone()
                    } else {
                        perf_view(r, &input.path, in_stream, false).script
                    };
                    if o.script != in_script {
                        fail(format!(
                            "{}: perf script differs from the input's:\n{}",
                            r.name,
                            first_diff(&in_script, &o.script)
                        ));
                        ok = false;
                    }
                    let new: Vec<_> = o.warnings.difference(&inv.warnings).collect();
                    let new_h: Vec<_> =
                        o.header_warnings.difference(&inv.header_warnings).collect();
                    if !new.is_empty() || !new_h.is_empty() {
                        fail(format!(
                            "{}: warnings the input does not cause: {new:?} {new_h:?}",
                            r.name
                        ));
                        ok = false;
                    }
                    for (p, id) in &want {
                        if o.ids.get(p).map(String::as_str) != Some(*id) {
                            fail(format!(
                                "{}: buildid-list has no {id} for {p} ({}): {}",
                                r.name,
                                why_missing(&path, p),
                                fmt_map(&o.ids)
                            ));
                            ok = false;
                        }
                    }
                }
                row.push(if ok { "ok".into() } else { "FAIL".into() });
            }
            // linux-perf-data.
            match (&in_lpd, lpd_view(&path, out_stream)) {
                (Ok((n_in, _)), Ok((n_out, ids))) => {
                    let mut ok = n_in == &n_out;
                    if !ok {
                        fail(format!(
                            "linux-perf-data: {n_out} samples, the input has {n_in}"
                        ));
                    }
                    for (p, id) in &want {
                        if ids.get(p).map(String::as_str) != Some(*id) {
                            fail(format!(
                                "linux-perf-data: no {id} for {p}: {}",
                                fmt_map(&ids)
                            ));
                            ok = false;
                        }
                    }
                    row.push(if ok { "ok".into() } else { "FAIL".into() });
                }
                (Err(e), _) => row.push(format!("input refused too ({e})")),
                (Ok(_), Err(e)) => {
                    fail(format!("linux-perf-data refuses the output: {e}"));
                    row.push("FAIL".into());
                }
            }
            // samply: files only.
            match (&samply, &in_samply) {
                (Some(_), _) if out_stream => row.push("n/a (stream)".into()),
                (Some(s), Some(Ok(libs_in))) => match samply_libs(s, &path, dir) {
                    Ok(libs) => {
                        let mut ok = true;
                        for (p, id) in &want[..1] {
                            if libs.get(p).map(String::as_str) != Some(*id) {
                                fail(format!("samply: no code ID {id} for {p}: {libs:?}"));
                                ok = false;
                            }
                        }
                        // A stream's reference is another run of the program, whose
                        // samples may touch other libraries (the vdso in one run and not
                        // the next): every library both show has the same code ID, and
                        // every library the output shows has one.
                        let same = if in_stream {
                            libs.iter().all(|(p, id)| {
                                !id.is_empty() && libs_in.get(p).is_none_or(|i| i == id)
                            })
                        } else {
                            &libs == libs_in
                        };
                        if !same {
                            fail(format!(
                                "samply: libraries {libs:?}, the input's {libs_in:?}"
                            ));
                            ok = false;
                        }
                        row.push(if ok { "ok".into() } else { "FAIL".into() });
                    }
                    Err(e) => {
                        fail(format!("samply refuses the output: {e}"));
                        row.push("FAIL".into());
                    }
                },
                (Some(_), Some(Err(e))) => row.push(format!("input refused too ({e})")),
                _ => row.push("not run".into()),
            }
            table.push(row);
        }
    }
    let mut s = String::from(
        "| input | output | perf 6.1 | perf 6.12 | perf 7.3 | linux-perf-data | samply |\n|---|---|---|---|---|---|---|\n",
    );
    for r in &table {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\ncompatibility matrix:\n{s}");
    assert!(
        failures.is_empty(),
        "{} cells fail:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    Ok(())
}
