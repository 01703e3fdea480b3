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

/// An in-place run with `--report`; must succeed. Returns stderr and the report.
fn in_place_report(file: &Path, mode: &str) -> (String, serde_json::Value) {
    let report = file.with_extension("report.json");
    let mut c = pdinject();
    c.args([mode, "--in-place"])
        .arg(file)
        .arg("--report")
        .arg(&report);
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "{mode} --in-place {}: {}",
        file.display(),
        tail(&o.stderr)
    );
    (
        String::from_utf8_lossy(&o.stderr).into_owned(),
        read_report(&report),
    )
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

/// `perf report --header-only -I`, without the one line a BUILD_ID section changes
/// ("missing features").
fn header_info(perf: &Perf, f: &Path) -> String {
    let o = run_ok(
        perf.cmd()
            .args(["report", "--header-only", "-I", "-i"])
            .arg(f),
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("# missing features"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The mmap2 in-place checks against a new file `out` of the same input: every ID
/// the new file's table lists is in the in-place table or in a build-ID MMAP2
/// record; the table holds only what no record carries (the kernel, whose MMAP
/// record stays, and the vdso); the samples (`perf script`, `perf report`) and the
/// header's other features read the same. Returns the table.
fn check_mmap2_in_place(
    perf: &Perf,
    input: &Path,
    f: &Path,
    out: &Path,
    ctx: &str,
) -> BTreeMap<String, String> {
    let table = buildid_list(perf, f);
    let records = mmap2_build_ids(perf, f);
    let full = buildid_list(perf, out);
    for (path, id) in &full {
        assert!(
            table.get(path) == Some(id) || records.get(path) == Some(id),
            "{ctx}: {path} {id} is neither in the table nor in a record:\n{}{}",
            fmt_map(&table),
            fmt_map(&records)
        );
    }
    for (path, id) in &table {
        assert_eq!(full.get(path), Some(id), "{ctx}: {path}");
        assert!(
            path.starts_with('['),
            "{ctx}: {path} is carried by its records, not the table"
        );
    }
    for k in ["[kernel.kallsyms]", "[vdso]"] {
        assert_eq!(table.get(k), full.get(k), "{ctx}: {k} is in the table");
    }
    assert_same_script(perf, input, f, &["-F", "comm,tid,time,event,ip,dso"]);
    let report = |file: &Path| {
        let o = run_ok(
            perf.cmd()
                .args(["report", "--stdio", "-q", "--sort", "comm,dso", "-i"])
                .arg(file),
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(
        report(input),
        report(f),
        "{ctx}: {}: perf report",
        perf.name
    );
    assert_eq!(
        header_info(perf, input),
        header_info(perf, f),
        "{ctx}: {}: the header's features read the same",
        perf.name
    );
    table
}

fn journal(file: &Path) -> PathBuf {
    file.with_file_name(format!(
        ".{}.pdinject-journal",
        file.file_name().unwrap().to_string_lossy()
    ))
}

#[test]
fn in_place_writes_what_a_new_file_gets() -> Outcome {
    let t = "in_place_writes_what_a_new_file_gets";
    let st = setup(t)?;
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    for mode in ["--buildids", "--mmap2-buildid-all"] {
        let out = st.dir.join("out.data");
        pdinject_ok(&b, &out, &[mode]);
        let f = st.dir.join("f.data");
        copy_of(&b, &f);
        let before = mtime(&f);
        let (_, report) = in_place_report(&f, mode);
        if mode == "--buildids" {
            assert_eq!(
                buildid_list(&st.perf, &f),
                buildid_list(&st.perf, &out),
                "{mode}: in place and a new file list the same IDs"
            );
            assert_eq!(report["in_place"]["table"], "appended", "{report}");
            assert_eq!(report["in_place"]["grew"], true, "{report}");
            assert_eq!(
                report["in_place"]["grew_bytes"].as_u64(),
                Some(size(&f) - size(&b))
            );
        } else {
            // The table holds what no record carries, over the old tail.
            check_mmap2_in_place(&st.perf, &b, &f, &out, mode);
            assert_eq!(size(&f), size(&b), "{mode}: the file keeps its size");
            assert_eq!(report["in_place"]["table"], "rewritten", "{report}");
            assert_eq!(report["in_place"]["grew"], false, "{report}");
        }
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
        if let Some(p612) = part(perf612()) {
            if mode == "--buildids" {
                assert_eq!(
                    buildid_list(&p612, &f),
                    buildid_list(&p612, &out),
                    "{mode}: perf 6.12"
                );
                assert_same_script(&p612, &b, &f, &["-F", "comm,tid,time,event,ip,dso"]);
            } else {
                check_mmap2_in_place(&p612, &b, &f, &out, "perf 6.12");
            }
        }
        // Again: nothing to change, nothing written.
        let bytes = std::fs::read(&f).unwrap();
        let (_, report) = in_place_report(&f, mode);
        assert!(
            std::fs::read(&f).unwrap() == bytes,
            "{mode}: a second run changes nothing"
        );
        assert_eq!(report["in_place"]["table"], "unchanged", "{report}");
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
    Ok(())
}

/// `file` with every string of the string features (HOSTNAME, OSRELEASE, VERSION,
/// ARCH, CPUDESC, CPUID, CMDLINE) written padded to 8 bytes instead of perf's 64
/// and the sections laid end to end (done here independently of pdinject): a
/// feature tail with no room left for a table.
fn squeeze_strings(src: &Path, dst: &Path) {
    let mut d = std::fs::read(src).unwrap();
    let end = (le64(&d, 40) + le64(&d, 48)) as usize;
    let bits: Vec<usize> = (0..256)
        .filter(|b| le64(&d, 72 + 8 * (b / 64)) >> (b % 64) & 1 == 1)
        .collect();
    let tight = |p: &[u8], at: usize, out: &mut Vec<u8>| -> usize {
        let len = u32::from_le_bytes(p[at..at + 4].try_into().unwrap()) as usize;
        let text = p[at + 4..at + 4 + len]
            .iter()
            .position(|&b| b == 0)
            .unwrap();
        let n = (text + 1).next_multiple_of(8);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        out.extend_from_slice(&p[at + 4..at + 4 + text]);
        out.resize(out.len() + n - text, 0);
        at + 4 + len
    };
    let mut payloads = Vec::new();
    for (i, bit) in bits.iter().enumerate() {
        let o = le64(&d, end + 16 * i) as usize;
        let p = d[o..o + le64(&d, end + 16 * i + 8) as usize].to_vec();
        let mut q = Vec::new();
        match bit {
            3..=6 | 8 | 9 => {
                tight(&p, 0, &mut q);
            }
            11 => {
                q.extend_from_slice(&p[..4]);
                let mut at = 4;
                for _ in 0..u32::from_le_bytes(p[..4].try_into().unwrap()) {
                    at = tight(&p, at, &mut q);
                }
            }
            _ => q = p,
        }
        payloads.push(q);
    }
    d.truncate(end);
    let mut pos = end + 16 * bits.len();
    for p in &payloads {
        d.extend_from_slice(&(pos as u64).to_le_bytes());
        d.extend_from_slice(&(p.len() as u64).to_le_bytes());
        pos += p.len();
    }
    for p in &payloads {
        d.extend_from_slice(p);
    }
    std::fs::write(dst, &d).unwrap();
    run_ok(
        std::process::Command::new("touch")
            .arg("-r")
            .arg(src)
            .arg(dst),
    );
}

/// The issue's figure: `--mmap2-buildid-all --in-place` and `--mmap2-buildids
/// --in-place` leave the size of a `perf record -B -g` recording as it was (perf
/// 6.1's, and perf 6.12's when it can record here); the table goes over the old
/// feature tail. A `-z` recording (every ID in the table), and a tail with no room
/// (strings already tight): the table is appended and the report says by how much
/// the file grew.
#[test]
fn in_place_mmap2_keeps_the_size() -> Outcome {
    let t = "in_place_mmap2_keeps_the_size";
    let st = setup(t)?;
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    let (prog, libfix, unused) = (s(&st.fx.prog), s(&st.fx.libfix), s(&st.fx.libunused));
    for mode in ["--mmap2-buildid-all", "--mmap2-buildids"] {
        let out = st.dir.join("out.data");
        pdinject_ok(&b, &out, &[mode]);
        let f = st.dir.join("f.data");
        copy_of(&b, &f);
        let (stderr, report) = in_place_report(&f, mode);
        assert_eq!(size(&f), size(&b), "{mode}: stat -c %s is the same");
        assert_eq!(report["in_place"]["grew"], false, "{report}");
        assert_eq!(report["in_place"]["grew_bytes"], 0, "{report}");
        assert!(stderr.contains("the file keeps its size"), "{stderr}");
        let table = check_mmap2_in_place(&st.perf, &b, &f, &out, mode);
        assert!(table.contains_key("[kernel.kallsyms]"), "{table:?}");
        let records = mmap2_build_ids(&st.perf, &f);
        assert_eq!(records.get(&prog).map(String::as_str), Some(PROG_ID));
        assert_eq!(records.get(&libfix).map(String::as_str), Some(LIB_ID));
        assert_eq!(
            records.get(&unused).map(String::as_str),
            (mode == "--mmap2-buildid-all").then_some(UNUSED_ID)
        );
        assert_eq!(mtime(&f), mtime(&b), "{mode}: mtime");
        // pdinject reads its own output back the same.
        let again = st.dir.join("again.data");
        let (_, r) = pdinject_ok(&f, &again, &["-N"]);
        assert_eq!(r["samples"], report["samples"]);
    }

    // Compressed data: records stay, every ID goes to the table.
    let z = record_prog(&st, &["-z", "-B", "-g"], "z.data");
    let f = st.dir.join("fz.data");
    copy_of(&z, &f);
    let (_, report) = in_place_report(&f, "--mmap2-buildid-all");
    let table = buildid_list(&st.perf, &f);
    for (p, id) in [(&prog, PROG_ID), (&libfix, LIB_ID)] {
        assert_eq!(table.get(p).map(String::as_str), Some(id), "{table:?}");
    }
    assert_eq!(
        report["in_place"]["grew_bytes"].as_u64(),
        Some(size(&f) - size(&z)),
        "{report}"
    );
    assert_same_script(&st.perf, &z, &f, &["-F", "comm,tid,time,event,ip,dso"]);

    // No room: every string already tight. Appended, and said so.
    let sq = st.dir.join("squeezed.data");
    squeeze_strings(&b, &sq);
    assert_same_script(&st.perf, &b, &sq, &["-F", "comm,tid,time,event,ip,dso"]);
    assert_eq!(header_info(&st.perf, &b), header_info(&st.perf, &sq));
    let out = st.dir.join("out.data");
    pdinject_ok(&sq, &out, &["--mmap2-buildid-all"]);
    let before = size(&sq);
    let (stderr, report) = in_place_report(&sq, "--mmap2-buildid-all");
    assert_eq!(report["in_place"]["table"], "appended", "{report}");
    assert_eq!(report["in_place"]["grew"], true, "{report}");
    assert_eq!(
        report["in_place"]["grew_bytes"].as_u64(),
        Some(size(&sq) - before)
    );
    assert!(report["in_place"]["no_room"].is_string(), "{report}");
    assert!(
        stderr.contains("appended instead: the file grew by"),
        "{stderr}"
    );
    check_mmap2_in_place(&st.perf, &b, &sq, &out, "no room");

    // perf 6.12's own recording, read by perf 6.12.
    let p612 = perf612()?;
    let c = st.dir.join("c612.data");
    let rec = run(p612
        .cmd()
        .current_dir(&st.dir)
        .args(["record", "-q", "-B", "-g", "-o"])
        .arg(&c)
        .args(["--", "./prog"])
        .stdout(std::process::Stdio::null()));
    if !rec.status.success() {
        return skip("perf 6.12 cannot record here");
    }
    let out = st.dir.join("out612.data");
    pdinject_ok(&c, &out, &["--mmap2-buildid-all"]);
    let f = st.dir.join("f612.data");
    copy_of(&c, &f);
    let (_, report) = in_place_report(&f, "--mmap2-buildid-all");
    assert_eq!(
        size(&f),
        size(&c),
        "perf 6.12 recording: stat -c %s is the same"
    );
    assert_eq!(report["in_place"]["table"], "rewritten", "{report}");
    check_mmap2_in_place(&p612, &c, &f, &out, "perf 6.12 recording");
    Ok(())
}

/// Kills pdinject at every step of an in-place run (and at the first steps of the
/// run that restores), for --buildids and --mmap2-buildid-all on a `-B` recording
/// (the table grows by an entry) and --buildid-all on a file that has a BUILD_ID
/// section (one 16-byte switch); each time perf must
/// read the file in the old or the new state, or the next run must restore and
/// finish it.
#[test]
fn in_place_survives_kill_at_every_step() -> Outcome {
    let t = "in_place_survives_kill_at_every_step";
    let st = setup(t)?;
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
    let mut fit_points = 0;
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
        // --mmap2-buildid-all on the -B recording writes the table over the old
        // feature tail: the file never changes size, whatever the kill point.
        let fits = mode == "--mmap2-buildid-all";
        assert_eq!(fits, size(&reference) == size(b), "{mode}");
        let points_before = points;
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
            if fits {
                assert_eq!(size(&f), size(b), "{mode} kill point {n}: size");
            }
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
            if fits {
                assert_eq!(size(&f), size(b), "{mode} after kill point {n}: size");
            }
        }
        assert!(finished, "{mode}: the run never finished");
        if fits {
            fit_points = points - points_before;
        }
    }
    eprintln!(
        "{t}: {points} kill points ({fit_points} writing the table over the old tail), {restored} restored from the journal"
    );
    assert!(points >= 40, "only {points} kill points");
    assert!(
        fit_points >= 40,
        "only {fit_points} kill points on the overwrite path"
    );
    Ok(())
}

/// Mutants of a real recording's feature tail (string lengths, CMDLINE's count, the
/// feature table's words, bit flips, truncations) through `--mmap2-buildid-all
/// --in-place`, in process: no panic; a run that fails leaves the file as it was
/// and no journal; one that succeeds leaves a file that opens again, of the same
/// size unless the report says by how much it grew.
#[test]
fn in_place_fit_mutants_never_panic() -> Outcome {
    let t = "in_place_fit_mutants_never_panic";
    let st = setup(t)?;
    let b = record_prog(&st, &["-B", "-g"], "b.data");
    let orig = std::fs::read(&b).unwrap();
    let end = (le64(&orig, 40) + le64(&orig, 48)) as usize;
    let bits: Vec<usize> = (0..256)
        .filter(|b| le64(&orig, 72 + 8 * (b / 64)) >> (b % 64) & 1 == 1)
        .collect();
    let put32 =
        |m: &mut Vec<u8>, at: usize, v: u32| m[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let mut mutants: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, bit) in bits.iter().enumerate() {
        let at = end + 16 * i;
        let (off, size) = (le64(&orig, at) as usize, le64(&orig, at + 8) as usize);
        for (w, v) in [
            (0, off as u64 + 1),
            (0, off as u64 - 1),
            (0, 0),
            (0, u64::MAX),
            (8, size as u64 + 1),
            (8, size.saturating_sub(1) as u64),
            (8, 0),
            (8, u64::MAX),
        ] {
            let mut m = orig.clone();
            m[at + w..at + w + 8].copy_from_slice(&v.to_le_bytes());
            mutants.push((format!("feature {bit} word {w} = {v:#x}"), m));
        }
        // Strings: their len fields, and CMDLINE's count.
        let mut strings = Vec::new();
        match bit {
            3..=6 | 8 | 9 => strings.push(off),
            11 => {
                let nr = u32::from_le_bytes(orig[off..off + 4].try_into().unwrap());
                for v in [0, 1, nr - 1, nr + 1, u32::MAX] {
                    let mut m = orig.clone();
                    put32(&mut m, off, v);
                    mutants.push((format!("CMDLINE nr = {v}"), m));
                }
                let mut p = off + 4;
                for _ in 0..nr {
                    strings.push(p);
                    p += 4 + u32::from_le_bytes(orig[p..p + 4].try_into().unwrap()) as usize;
                }
            }
            _ => {}
        }
        for s in strings {
            let len = u32::from_le_bytes(orig[s..s + 4].try_into().unwrap());
            for v in [0, 1, 2, len - 1, len + 1, u32::MAX] {
                let mut m = orig.clone();
                put32(&mut m, s, v);
                mutants.push((format!("feature {bit}: string at {s:#x} len = {v}"), m));
            }
            // No NUL inside len bytes.
            let mut m = orig.clone();
            m[s + 4..s + 4 + len as usize].fill(b'x');
            mutants.push((format!("feature {bit}: string at {s:#x} without a NUL"), m));
        }
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: usize| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    };
    let tail_len = orig.len() - end;
    for _ in 0..200 {
        let at = end + rnd(tail_len);
        let bit = rnd(8);
        let mut m = orig.clone();
        m[at] ^= 1 << bit;
        mutants.push((format!("flip bit {bit} of {at:#x}"), m));
    }
    for _ in 0..30 {
        let at = end + rnd(tail_len);
        mutants.push((format!("truncate at {at:#x}"), orig[..at].to_vec()));
    }
    let opts = pdinject::Options {
        mode: pdinject::options::Mode::All,
        form: pdinject::options::Form::Mmap2,
        jobs: Some(1),
        ..Default::default()
    };
    let f = st.dir.join("m.data");
    let (mut ok, mut fit, mut failed) = (0, 0, 0);
    let mut problems = Vec::new();
    for (what, bytes) in &mutants {
        std::fs::write(&f, bytes).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pdinject::run_in_place(&f, &opts)
        }));
        let after = std::fs::read(&f).unwrap();
        match r {
            Err(_) => problems.push(format!("{what}: panicked")),
            Ok(Err(_)) => {
                failed += 1;
                if &after != bytes {
                    problems.push(format!("{what}: failed and changed the file"));
                }
            }
            Ok(Ok(report)) => {
                ok += 1;
                let grew = report.modes.in_place.as_ref().map_or(0, |p| p.grew_bytes);
                if report.modes.in_place.as_ref().map(|p| p.table)
                    == Some(pdinject::report::TableWrite::Rewritten)
                {
                    fit += 1;
                }
                if after.len() as u64 != bytes.len() as u64 + grew {
                    problems.push(format!(
                        "{what}: {} bytes, was {}, the report says it grew by {grew}",
                        after.len(),
                        bytes.len()
                    ));
                }
                if let Err(e) = pdinject::validate(&f) {
                    problems.push(format!("{what}: the result does not open: {e}"));
                }
            }
        }
        if journal(&f).exists() {
            problems.push(format!("{what}: journal left"));
            let _ = std::fs::remove_file(journal(&f));
        }
    }
    eprintln!(
        "{t}: {} mutants: {ok} written ({fit} over the old tail), {failed} refused",
        mutants.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(fit > 0, "no mutant went through the overwrite path");
    Ok(())
}
