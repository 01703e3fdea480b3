//! `--jit` (issue 20): jitdumps become images and MMAP2 records. The oracle is
//! `perf inject --jit` read by perf 6.1, 6.12 and 7.3: the same symbol for every
//! sample and callchain entry (dso names and dso-relative addresses differ by design:
//! one image per process instead of one per code load), the same source lines. A
//! tiny C JIT (testdata/fixtures/minijit.c) reuses an address and cuts its dump; node
//! and python3.13 are the real JITs (skipped when missing).

use crate::common::{self, Perf};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The perfs to read outputs with: 6.1, 6.12 and 7.3. One that is missing is a part
/// of the test left out (`common::part`).
fn readers() -> Vec<Perf> {
    let mut v = Vec::new();
    v.extend(common::part(common::perf()));
    v.extend(common::part(common::perf612()));
    v.extend(common::part(common::perf73()));
    v
}

/// Per line of `perf script -F ip,sym` (callchain entries included): the symbol,
/// without the address (callchain addresses are dso-relative, and the dsos differ).
fn symbols(perf: &Perf, file: &Path, extra: &[&str]) -> Vec<String> {
    common::perf_script(perf, file, &[&["-F", "ip,sym"], extra].concat())
        .lines()
        .map(|l| {
            let t = l.trim();
            match t.split_once(char::is_whitespace) {
                Some((_, sym)) => sym.trim().to_string(),
                None => t.to_string(),
            }
        })
        .collect()
}

/// `perf script -F ip,sym,srcline` restricted to `dsos`: (symbol, line) per sample,
/// where perf's "no line" spellings (`??:0`, `DSO[ADDR]`) become "-".
fn srclines(perf: &Perf, file: &Path, dsos: &str) -> Vec<(String, String)> {
    srclines_at(perf, file, dsos)
        .into_iter()
        .map(|(sym, line, _)| (sym, line))
        .collect()
}

/// [`srclines`] with each sample's IP.
fn srclines_at(perf: &Perf, file: &Path, dsos: &str) -> Vec<(String, String, u64)> {
    let out = common::perf_script(perf, file, &["-F", "ip,sym,srcline", "--dsos", dsos]);
    let mut v: Vec<(String, String, u64)> = Vec::new();
    for l in out.lines() {
        if l.starts_with("  ") && !l.starts_with("   ") {
            let s = l.trim();
            let none = s == "??:0" || (s.ends_with(']') && s.contains(".so["));
            if let Some(last) = v.last_mut() {
                last.1 = if none { "-".into() } else { s.to_string() };
            }
        } else if let Some((ip, sym)) = l.trim().split_once(char::is_whitespace) {
            let ip = u64::from_str_radix(ip, 16).unwrap_or(u64::MAX);
            v.push((sym.trim().to_string(), "-".into(), ip));
        }
    }
    v
}

/// Whether perf printed a file name that is not text (`���:0`, `ռ1#:2`): the
/// workloads' file names are ASCII.
fn garbled(line: &str) -> bool {
    !line.chars().all(|c| (' '..='~').contains(&c))
}

/// The `jitted-*.so` images samples hit on perf inject --jit's output `file`, as a
/// `--dsos` list (there must be some: the workloads spend their time in JIT code).
fn jitted_hit(perf: &Perf, file: &Path) -> String {
    // perf script prints no dso without an ip beside it.
    let hit: BTreeMap<String, ()> = common::perf_script(perf, file, &["-F", "ip,dso"])
        .lines()
        .filter_map(|l| {
            Some(
                l.trim()
                    .split_once(' ')?
                    .1
                    .trim_matches(['(', ')'])
                    .to_string(),
            )
        })
        .filter(|d| d.contains("/jitted-"))
        .map(|d| (d, ()))
        .collect();
    assert!(
        !hit.is_empty(),
        "no sample in a jitted-*.so image on {}",
        file.display()
    );
    hit.keys().cloned().collect::<Vec<_>>().join(",")
}

/// Asserts that `ours` and `theirs` (from [`srclines`]) are equal, naming the first
/// samples where they differ, but for the samples whose lines differ where
/// `excused` says why (the callers': perf's file names that are not text on the
/// Java workload, perf's lines from V8's malformed DEBUG_INFO records on node's);
/// returns how many were excused. Such samples are few.
fn same_srclines(
    perf: &Perf,
    ours: &[(String, String)],
    theirs: &[(String, String)],
    excused: &dyn Fn(usize) -> bool,
) -> usize {
    let differ: Vec<_> = ours
        .iter()
        .zip(theirs)
        .enumerate()
        .filter(|&(i, (a, b))| a.0 != b.0 || (a.1 != b.1 && !excused(i)))
        .collect();
    assert!(
        ours.len() == theirs.len() && differ.is_empty(),
        "{}: {} of {} samples' source lines differ from perf inject --jit's ({} there); first ones: {:?}",
        perf.name,
        differ.len(),
        ours.len(),
        theirs.len(),
        &differ[..differ.len().min(10)]
    );
    // The comparison is not empty: most samples are compared (perf's garbage came
    // to 0.1 to 1.1 % of them), and some of those have a line.
    let skipped = (0..ours.len())
        .filter(|&i| ours[i].1 != theirs[i].1 && excused(i))
        .count();
    let lined = (0..ours.len())
        .filter(|&i| ours[i].1 != "-" && !excused(i))
        .count();
    assert!(
        skipped * 10 <= theirs.len() && lined > 0,
        "{}: {skipped} of {} of perf's source lines excused, {lined} compared lines",
        perf.name,
        theirs.len()
    );
    skipped
}

/// The code loads of the jitdumps in `dir` and whether their DEBUG_INFO records
/// read as they say, read here as perf's jitdump specification says (not with
/// pdinject's reader): the oracle for perf inject's lines from malformed records.
///
/// node 20's V8 writes, for the baseline code of a script's top level (`JS:^
/// /tmp/.../w.js:1:1`, one load a run), the bytes of a freed buffer where the
/// script's name goes (malloc's free-list pointer and key, then the name's last
/// bytes: `O|.5\0\0\0\0C<..js`): read as a C string the name is the pointer's few
/// bytes, and every later entry of the record is read from the middle of others
/// (addresses far outside the code): its 40 entries end at byte 707 of its 1,400.
/// perf inject turns them into lines anyway: the one entry inside the code (+0x40,
/// line 2, the pointer's bytes as its file) is stretched by the garbage entries'
/// rows over the code after it, so that samples past the record's last real entry
/// (+0x16e; the samples seen were at +0x432 to +0x556) get `O|.5:2` (text when the
/// pointer's four bytes are printable; `d\u{97}\u{7f}\u{1e}:2` when not), and perf
/// 6.1 (addr2line reading a newline in such a name as the end of a frame) unwinds
/// the load's frame as `(inlined)` frames of those names. pdinject gives such a load
/// no lines (src/jit/image.rs, `Lines::add`).
#[derive(Default)]
struct DumpLines {
    /// Each load: name, code address, code size, and whether the DEBUG_INFO record
    /// before it is malformed.
    loads: Vec<(String, u64, u64, bool)>,
    /// The base names of the files the well-formed records name.
    files: BTreeSet<String>,
}

impl DumpLines {
    fn read(dir: &Path) -> DumpLines {
        let mut d = DumpLines::default();
        let dumps = fs::read_dir(dir).unwrap().filter_map(|e| {
            let p = e.ok()?.path();
            let n = p.file_name()?.to_str()?;
            (n.starts_with("jit-") && n.ends_with(".dump")).then_some(p)
        });
        for p in dumps {
            let b = fs::read(&p).unwrap();
            let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
            let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
            let mut at = u32_at(8) as usize;
            let mut debug = None;
            while at + 16 <= b.len() {
                let size = u32_at(at + 4) as usize;
                if size < 16 || at + size > b.len() {
                    break;
                }
                let body = at + 16..at + size;
                match u32_at(at) {
                    // CODE_LOAD: pid, tid, vma, code_addr, code_size, code_index, name.
                    0 if body.len() > 40 => {
                        let name = &b[body.start + 40..body.end];
                        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(0)];
                        d.loads.push((
                            String::from_utf8_lossy(name).into_owned(),
                            u64_at(body.start + 16),
                            u64_at(body.start + 24),
                            debug.take() == Some(false),
                        ));
                    }
                    // DEBUG_INFO: code_addr, count, entries.
                    2 if body.len() >= 16 => debug = Some(d.record(&b[body])),
                    _ => {}
                }
                at += size;
            }
        }
        d
    }

    /// Whether a DEBUG_INFO record's entries (16 bytes and a NUL-terminated name
    /// each) end where it ends, up to 7 bytes of zeros; the names of one that does
    /// go into `files`.
    fn record(&mut self, body: &[u8]) -> bool {
        let count = u64::from_le_bytes(body[8..16].try_into().unwrap());
        let (mut at, mut names) = (16, Vec::new());
        for _ in 0..count {
            let Some(len) = body
                .get(at + 16..)
                .and_then(|r| r.iter().position(|&c| c == 0))
            else {
                return false;
            };
            names.push(&body[at + 16..at + 16 + len]);
            at += 16 + len + 1;
        }
        let rest = &body[at..];
        if rest.len() >= 8 || rest.iter().any(|&c| c != 0) {
            return false;
        }
        for n in names.into_iter().filter(|n| n != b"\xff") {
            let base = n.rsplit(|&c| c == b'/').next().unwrap_or(n);
            self.files
                .insert(String::from_utf8_lossy(base).into_owned());
        }
        true
    }

    /// Whether the code at `ip` named `sym` is of loads with a malformed record
    /// only (and of one at least).
    fn malformed_at(&self, sym: &str, ip: u64) -> bool {
        let mut at = self
            .loads
            .iter()
            .filter(|l| l.0 == sym && (l.1..l.1 + l.2).contains(&ip))
            .peekable();
        at.peek().is_some() && at.all(|l| l.3)
    }

    /// Whether the code at `ip` named `sym` is of a load with a malformed record,
    /// among others of that name at that address (a JIT may load code of one name at
    /// one address again): perf's line there may come from the malformed one's
    /// garbage. Seen once in CI: perf 6.1 gave `<unknown>:6` where ours gave none.
    fn malformed_among(&self, sym: &str, ip: u64) -> bool {
        self.loads
            .iter()
            .any(|l| l.0 == sym && (l.1..l.1 + l.2).contains(&ip) && l.3)
    }

    /// Whether every load named `sym` has a malformed record (and one does).
    fn malformed_name(&self, sym: &str) -> bool {
        let mut named = self.loads.iter().filter(|l| l.0 == sym).peekable();
        named.peek().is_some() && named.all(|l| l.3)
    }

    /// Whether `line` (perf's `FILE:LINE`) names a file of a well-formed record.
    fn names_file(&self, line: &str) -> bool {
        let file = line.rsplit_once(':').map_or(line, |x| x.0);
        self.files.contains(file)
    }
}

/// `perf annotate --stdio -s SYM` on `file`: (percent, mnemonic) per instruction
/// (addresses and branch targets differ by design: the code sits at its own offset
/// in one image instead of at 0x80 in a file of its own).
fn annotated(perf: &Perf, file: &Path, sym: &str) -> Option<Vec<(String, String)>> {
    let o = perf
        .cmd()
        .args(["annotate", "--stdio", "-i"])
        .arg(file)
        .args(["-s", sym])
        .output()
        .expect("perf annotate runs");
    // None: perf failed (perf 6.12's annotate crashes on JIT functions of perf
    // inject's output as of pdinject's).
    o.status.success().then(|| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let (pct, rest) = l.split_once(" : ")?;
                let pct = pct.trim();
                pct.parse::<f64>().ok()?;
                let insn = rest.split_once(':')?.1.split_whitespace().next()?;
                Some((pct.to_string(), insn.to_string()))
            })
            .collect()
    })
}

fn perf_inject_jit(perf: &Perf, input: &Path, out: &Path) {
    common::run_ok(
        perf.cmd()
            .args(["inject", "--jit", "-i"])
            .arg(input)
            .arg("-o")
            .arg(out),
    );
}

/// `pdinject --jit IN OUT` with a JSON report; returns the report.
fn pdinject_jit(input: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    common::pdinject_ok(input, out, &[&["--jit"], extra].concat()).1
}

fn notes(report: &serde_json::Value) -> String {
    report["notes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Files in `dir` whose name starts with `prefix` and ends with `.so`.
fn images(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(OsStr::to_str)
                        .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".so"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Builds minijit and records it in `dir` (with `env`); returns the recording and
/// the boundary time (ns) after which samples ran fnB.
fn record_minijit(perf: &Perf, dir: &Path, env: &[(&str, &str)]) -> (PathBuf, u64) {
    record_minijit_with(perf, dir, env, &[])
}

/// [`record_minijit`] with more `perf record` options.
fn record_minijit_with(
    perf: &Perf,
    dir: &Path,
    env: &[(&str, &str)],
    opts: &[&str],
) -> (PathBuf, u64) {
    let bin = dir.join("minijit");
    common::gcc(&[
        common::fixtures_src().join("minijit.c").as_os_str(),
        OsStr::new("-o"),
        bin.as_os_str(),
    ]);
    let data = dir.join("m.data");
    let mut c = perf.cmd();
    c.current_dir(dir)
        .args(["record", "-q", "-k", "1"])
        .args(opts)
        .arg("-o")
        .arg(&data)
        .arg("--")
        .arg(&bin);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = common::run_ok(&mut c);
    let out = String::from_utf8_lossy(&o.stdout);
    let boundary = out
        .lines()
        .find_map(|l| l.strip_prefix("boundary ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("minijit printed no boundary: {out}"));
    (data, boundary)
}

/// (time ns, symbol) of the samples in fnA/fnB's code or [unknown] user memory.
fn timed_jit_samples(perf: &Perf, file: &Path) -> Vec<(u64, String)> {
    common::perf_script(perf, file, &["-F", "time,ip,sym", "--ns"])
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let t = it.next()?.trim_end_matches(':');
            let (s, ns) = t.split_once('.')?;
            let time = s.parse::<u64>().ok()? * 1_000_000_000 + ns.parse::<u64>().ok()?;
            let ip = it.next()?;
            let sym = it.collect::<Vec<_>>().join(" ");
            (ip.len() < 16).then_some((time, sym))
        })
        .filter(|(_, s)| s == "fnA" || s == "fnB" || s == "[unknown]")
        .collect()
}

#[test]
fn jit_minijit_address_reuse_lines_streams_and_reruns() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, boundary) = record_minijit(&perf, dir.path(), &[("MINIJIT_LINES", "1")]);
    let theirs = dir.path().join("perf-jit.data");
    perf_inject_jit(&perf, &data, &theirs);
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&data, &ours, &[]);
    // One image for the process, beside its dump.
    let mine = images(dir.path(), "jit-");
    assert_eq!(mine.len(), 1, "one image per process: {mine:?}");
    let image = &mine[0];
    assert!(
        notes(&report).contains("2 code loads"),
        "{}",
        notes(&report)
    );
    // Address reuse: every sample in the JIT code names the code that was there at
    // its time, as in perf inject's output.
    let samples = timed_jit_samples(&perf, &ours);
    let a = samples.iter().filter(|(_, s)| s == "fnA").count();
    let b = samples.iter().filter(|(_, s)| s == "fnB").count();
    assert!(a > 50 && b > 50, "fnA {a}, fnB {b} samples");
    for (time, sym) in &samples {
        let want = if *time < boundary { "fnA" } else { "fnB" };
        assert_eq!(
            sym, want,
            "sample at {time} ns (fnB loaded after {boundary})"
        );
    }
    for p in readers() {
        assert_eq!(
            symbols(&p, &ours, &[]),
            symbols(&p, &theirs, &[]),
            "{}: per-sample symbols differ from perf inject --jit's",
            p.name
        );
        let jitted: Vec<String> = images(dir.path(), "jitted-")
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let ours_lines = srclines(&p, &ours, &image.display().to_string());
        assert_eq!(
            ours_lines,
            srclines(&p, &theirs, &jitted.join(",")),
            "{}: source lines differ from perf inject --jit's",
            p.name
        );
        assert!(
            ours_lines
                .iter()
                .any(|(s, l)| s == "fnA" && l == "minijit.js:10")
                && ours_lines
                    .iter()
                    .any(|(s, l)| s == "fnB" && l == "minijit.js:20"),
            "{}: {ours_lines:?}",
            p.name
        );
    }
    // The image's ID: in the table, in the build-ID cache, a function of its bytes.
    let id = common::elf_build_id(image).expect("the image has a build ID");
    let listed = common::buildid_list(&perf, &ours);
    assert_eq!(
        listed.get(&image.display().to_string()),
        Some(&id),
        "{listed:?}"
    );
    let cached = common::test_home()
        .join(".debug/.build-id")
        .join(&id[..2])
        .join(&id[2..]);
    assert!(
        cached.exists(),
        "{} is not in the build-ID cache",
        cached.display()
    );
    let bytes = fs::read(image).unwrap();
    fs::remove_file(image).unwrap();
    let again = dir.path().join("again.data");
    pdinject_jit(&data, &again, &["-N"]);
    assert_eq!(fs::read(image).unwrap(), bytes, "a rerun wrote other bytes");
    // Stream forms: a stream in, a file out; a stream in and out.
    let stream = dir.path().join("m.pipe");
    common::run_ok(
        perf.cmd()
            .args(["inject", "-i"])
            .arg(&data)
            .args(["-o", "-"])
            .stdout(fs::File::create(&stream).unwrap()),
    );
    let from_stream = dir.path().join("from-stream.data");
    pdinject_jit(&stream, &from_stream, &["-N"]);
    let piped = dir.path().join("piped.data");
    let o = common::run(
        common::pdinject()
            .args(["--jit", "-q", "-N", "-", "-"])
            .stdin(fs::File::open(&stream).unwrap())
            .stdout(fs::File::create(&piped).unwrap()),
    );
    assert!(o.status.success(), "{}", common::tail(&o.stderr));
    let want = symbols(&perf, &theirs, &[]);
    assert_eq!(symbols(&perf, &from_stream, &[]), want, "stream to file");
    assert_eq!(symbols(&perf, &piped, &[]), want, "stream to stream");
    assert_eq!(
        fs::read(image).unwrap(),
        bytes,
        "the stream runs wrote other bytes"
    );
    Ok(())
}

/// COMPRESSED and COMPRESSED2 records in the data of a file or a stream
/// (little-endian), counted by walking its record headers.
fn compressed_records(f: &Path) -> usize {
    // COMPRESSED and COMPRESSED2, by number: this reader shares nothing with pdinject's.
    const COMPRESSED: [u32; 2] = [81, 83];
    let b = fs::read(f).unwrap();
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (mut at, end) = if u64_at(8) == 16 {
        (16, b.len())
    } else {
        (u64_at(40) as usize, (u64_at(40) + u64_at(48)) as usize)
    };
    let mut n = 0;
    while at + 8 <= end {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let size = u16::from_le_bytes(b[at + 6..at + 8].try_into().unwrap()) as usize;
        if COMPRESSED.contains(&kind) {
            n += 1;
        }
        if size < 8 {
            break;
        }
        at += size;
    }
    n
}

/// `perf record -z`: the compressed records are written expanded with the JIT records
/// between them by time. Every sample of the recording is there (same time and IP)
/// and names the code at its address at its time (the program's own boundary), in
/// perf 6.1, 6.12 and 7.3, for a file and a stream. (perf inject --jit, 6.1 and 7.3,
/// leaves every JIT sample of such a recording `[unknown]`.)
#[test]
fn jit_minijit_compressed_recording() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, boundary) = record_minijit_with(&perf, dir.path(), &[], &["-z"]);
    let has_compressed = |f: &Path| compressed_records(f) > 0;
    assert!(
        has_compressed(&data),
        "perf record -z wrote no compressed record"
    );
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&data, &ours, &[]);
    assert!(
        notes(&report).contains("2 code loads") && notes(&report).contains("written expanded"),
        "{}",
        notes(&report)
    );
    assert!(
        !has_compressed(&ours),
        "compressed records left in the output"
    );
    let samples = timed_jit_samples(&perf, &ours);
    let a = samples.iter().filter(|(_, s)| s == "fnA").count();
    let b = samples.iter().filter(|(_, s)| s == "fnB").count();
    assert!(a > 50 && b > 50, "fnA {a}, fnB {b} samples");
    for (time, sym) in &samples {
        let want = if *time < boundary { "fnA" } else { "fnB" };
        assert_eq!(
            sym, want,
            "sample at {time} ns (fnB loaded after {boundary})"
        );
    }
    let timed = |f: &Path| common::perf_script(&perf, f, &["-F", "time,ip", "--ns"]);
    assert_eq!(timed(&ours), timed(&data), "the samples changed");
    let want = symbols(&perf, &ours, &[]);
    for p in readers() {
        assert_eq!(symbols(&p, &ours, &[]), want, "{}", p.name);
    }
    // A compressed stream in, a file out.
    let stream = dir.path().join("z.pipe");
    common::run_ok(
        perf.cmd()
            .args(["inject", "-i"])
            .arg(&data)
            .args(["-o", "-"])
            .stdout(fs::File::create(&stream).unwrap()),
    );
    assert!(
        has_compressed(&stream),
        "perf inject's stream lost the compression"
    );
    let from_stream = dir.path().join("from-stream.data");
    pdinject_jit(&stream, &from_stream, &["-N"]);
    assert_eq!(symbols(&perf, &from_stream, &[]), want, "stream to file");
    Ok(())
}

#[test]
fn jit_minijit_cut_dump_gives_no_wrong_symbol() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, boundary) = record_minijit(&perf, dir.path(), &[("MINIJIT_CUT", "1")]);
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&data, &ours, &[]);
    assert!(
        notes(&report).contains("is cut short"),
        "no note on the cut dump: {}",
        notes(&report)
    );
    let samples = timed_jit_samples(&perf, &ours);
    let before = samples
        .iter()
        .filter(|(t, s)| *t < boundary && s == "fnA")
        .count();
    assert!(before > 50, "fnA lost its samples before the cut: {before}");
    // fnB's record is cut: its code must not take fnA's name.
    let wrong: Vec<_> = samples
        .iter()
        .filter(|(t, s)| *t >= boundary && s == "fnA")
        .collect();
    assert!(
        wrong.is_empty(),
        "{} samples after fnB replaced fnA are named fnA, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(
        samples
            .iter()
            .any(|(t, s)| *t >= boundary && s == "[unknown]"),
        "the samples after the cut should show as [unknown]"
    );
    Ok(())
}

/// Appends to the jitdump at `path` a copy of its last code load, named `name`,
/// written `later` ns after it (as a JIT that goes on after the recording writes).
fn append_later_load(path: &Path, name: &str, later: u64) {
    let b = fs::read(path).unwrap();
    let u32at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let mut at = u32at(8) as usize;
    let mut last = None;
    while at + 16 <= b.len() {
        let (id, size) = (u32at(at), u32at(at + 4) as usize);
        if id == 0 {
            last = Some(at);
        }
        at += size;
    }
    let l = last.expect("a code load in the dump");
    let body = &b[l + 16..l + u32at(l + 4) as usize];
    // pid, tid, vma, code_addr, code_size, code_index, name NUL, code
    let code_size = u64at(l + 16 + 24) as usize;
    let code = &body[body.len() - code_size..];
    let mut rec = Vec::new();
    rec.extend_from_slice(&0u32.to_le_bytes());
    let size = 16 + 40 + name.len() + 1 + code.len();
    rec.extend_from_slice(&(size as u32).to_le_bytes());
    rec.extend_from_slice(&(u64at(l + 8) + later).to_le_bytes());
    rec.extend_from_slice(&body[..32]);
    rec.extend_from_slice(&(u64at(l + 16 + 32) + 1).to_le_bytes());
    rec.extend_from_slice(name.as_bytes());
    rec.push(0);
    rec.extend_from_slice(code);
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
    std::io::Write::write_all(&mut f, &rec).unwrap();
}

/// A JIT that goes on after the recording (the recording of a server that keeps
/// running) writes records the recording never sees: they are left out with a
/// note, and the loads of the recording's time are used (the dump was left out).
#[test]
fn jit_minijit_dump_written_on_after_the_recording() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, boundary) = record_minijit(&perf, dir.path(), &[]);
    let dump = fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| p.extension().is_some_and(|x| x == "dump"))
        .expect("minijit's dump");
    // fnLate replaces fnB at its address an hour after fnB was loaded.
    append_later_load(&dump, "fnLate", 3_600_000_000_000);
    for maps in ["touched", "all"] {
        let ours = dir.path().join(format!("ours-{maps}.data"));
        let report = pdinject_jit(&data, &ours, &["--jit-maps", maps]);
        let n = notes(&report);
        assert!(
            n.contains("1 records written after the recording's end left out"),
            "{maps}: {n}"
        );
        assert!(n.contains("2 code loads"), "{maps}: {n}");
        let samples = timed_jit_samples(&perf, &ours);
        let named = samples.iter().filter(|(_, s)| s != "[unknown]").count();
        assert!(named > 100, "{maps}: {named} samples named");
        for (time, sym) in &samples {
            let want = if *time < boundary { "fnA" } else { "fnB" };
            assert_eq!(sym, want, "{maps}: sample at {time} ns");
        }
    }
    Ok(())
}

#[test]
fn jit_minijit_dump_of_another_process_is_left_out() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = record_minijit(&perf, dir.path(), &[("MINIJIT_BADPID", "1")]);
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&data, &ours, &[]);
    assert!(
        notes(&report).contains("written by process"),
        "{}",
        notes(&report)
    );
    assert!(
        images(dir.path(), "jit-").is_empty(),
        "an image was written"
    );
    let syms = symbols(&perf, &ours, &[]);
    assert!(!syms.iter().any(|s| s == "fnA" || s == "fnB"));
    Ok(())
}

#[test]
fn jit_minijit_recording_of_another_host_is_left_out() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = record_minijit(&perf, dir.path(), &[]);
    // The HOSTNAME feature (`u32 len; name, NUL-padded`) after the data: the same
    // length, another name.
    let host = String::from_utf8_lossy(&common::run_ok(Command::new("uname").arg("-n")).stdout)
        .trim()
        .to_string();
    let mut bytes = fs::read(&data).unwrap();
    let (_, data_end) = {
        let (off, size) = common::data_section(&data);
        (off, off + size)
    };
    let mut needle = host.as_bytes().to_vec();
    needle.push(0);
    let at = bytes[data_end as usize..]
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .map(|p| p + data_end as usize)
        .expect("the HOSTNAME feature");
    for b in &mut bytes[at..at + host.len()] {
        *b = if *b == b'x' { b'y' } else { b'x' };
    }
    let other = dir.path().join("other-host.data");
    fs::write(&other, &bytes).unwrap();
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&other, &ours, &[]);
    assert!(
        notes(&report).contains("was made on host"),
        "{}",
        notes(&report)
    );
    assert!(
        images(dir.path(), "jit-").is_empty(),
        "an image was written"
    );
    let syms = symbols(&perf, &ours, &[]);
    assert!(!syms.iter().any(|s| s == "fnA" || s == "fnB"));
    Ok(())
}

#[test]
fn jit_dash_j_with_a_number_says_jobs() {
    let o = common::pdinject_run(["-j", "4", "in.data", "out.data"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::tail(&o.stderr));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--jobs 4"), "{e}");
}

/// A node workload: `new Function` bodies compiled by V8 (--perf-prof).
const NODE_JS: &str = include_str!("../../testdata/fixtures/jit/node-work.js");

fn runtime(names: &[&str]) -> Option<PathBuf> {
    for n in names {
        let p = Path::new(n);
        if p.is_absolute() && p.exists() {
            return Some(p.to_path_buf());
        }
        if Command::new(n)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Some(PathBuf::from(n));
        }
    }
    None
}

/// pdinject --jit against perf inject --jit on `data`: the same symbols with every
/// perf.
fn compare_with_perf(perf: &Perf, data: &Path, dir: &Path) {
    let theirs = dir.join("perf-jit.data");
    perf_inject_jit(perf, data, &theirs);
    let ours = dir.join("ours.data");
    let report = pdinject_jit(data, &ours, &[]);
    assert!(
        notes(&report).contains(" code loads into "),
        "no image: {}",
        notes(&report)
    );
    for p in readers() {
        let a = symbols(&p, &ours, &[]);
        let b = symbols(&p, &theirs, &[]);
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(
            a.len() == b.len() && differ == 0,
            "{}: {} of {} lines differ from perf inject --jit's; first: {:?}",
            p.name,
            differ,
            a.len(),
            a.iter().zip(&b).find(|(x, y)| x != y)
        );
    }
}

/// node and a perf that can record (a `Skip` saying which is missing).
fn node_and_perf() -> Result<(PathBuf, Perf), common::Skip> {
    let Some(node) = runtime(&["node"]) else {
        return common::skip("node not found (apt-get install nodejs)");
    };
    Ok((node, common::can_record()?))
}

/// Records NODE_JS (`w.js ARGS`: functions, milliseconds) under `node --perf-prof`
/// in `dir` with `perf record -k 1 OPTS`; returns the recording.
fn record_node(perf: &Perf, dir: &Path, node: &Path, opts: &[&str], args: &[&str]) -> PathBuf {
    fs::write(dir.join("w.js"), NODE_JS).unwrap();
    let data = dir.join("n.data");
    let node = node.to_str().unwrap();
    let cmd = [
        &["-k", "1"],
        opts,
        &["--", node, "--perf-prof", "w.js"],
        args,
    ]
    .concat();
    common::record_in(perf, dir, &data, &cmd);
    data
}

#[test]
fn jit_node_matches_perf_inject() -> common::Outcome {
    let (node, perf) = node_and_perf()?;
    let dir = tempfile::tempdir().unwrap();
    let data = record_node(&perf, dir.path(), &node, &[], &["200", "800"]);
    compare_with_perf(&perf, &data, dir.path());
    // One image for the process, and the same source lines as perf inject's.
    let mine = images(dir.path(), "jit-");
    assert_eq!(mine.len(), 1, "{mine:?}");
    // Readable as perf's images are (0644 less the umask), not a temp file's 0600.
    {
        use std::os::unix::fs::PermissionsExt;
        let probe = dir.path().join("umask-probe");
        fs::write(&probe, b"").unwrap();
        let want = fs::metadata(&probe).unwrap().permissions().mode() & 0o644;
        let mode = fs::metadata(&mine[0]).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, want, "the image's mode {mode:o}");
    }
    let theirs = dir.path().join("perf-jit.data");
    let ours = dir.path().join("ours.data");
    // --jit-maps: the default writes records for the loads samples touch, `all` one
    // per load as perf inject does; every sample names the same code either way.
    let every = dir.path().join("every.data");
    // The image holds the touched loads alone (their code, symbols and lines).
    let touched_image = fs::metadata(&mine[0]).unwrap().len();
    let report = pdinject_jit(&data, &every, &["-N", "--jit-maps", "all"]);
    let all_image = fs::metadata(&mine[0]).unwrap().len();
    assert!(
        touched_image * 2 < all_image,
        "the image of the touched loads is {touched_image} bytes, of every load {all_image}"
    );
    let image = mine[0].display().to_string();
    let records = |f: &Path| {
        common::perf_script(&perf, f, &["--show-mmap-events", "-F", "ip"])
            .lines()
            .filter(|l| l.contains("PERF_RECORD_MMAP2") && l.contains(&image))
            .count()
    };
    let loads: usize = notes(&report)
        .split_once(" code loads into ")
        .and_then(|(a, _)| a.rsplit(' ').next()?.parse().ok())
        .expect("the load count in the notes");
    let (touched, all) = (records(&ours), records(&every));
    assert_eq!(all, loads, "--jit-maps all: one record per load");
    assert!(
        touched > 0 && touched * 2 < all,
        "--jit-maps touched wrote {touched} of {all} records"
    );
    for p in readers() {
        assert_eq!(
            symbols(&p, &ours, &[]),
            symbols(&p, &every, &[]),
            "{}: --jit-maps touched and all name samples differently",
            p.name
        );
    }
    let list = jitted_hit(&perf, &theirs);
    let dump = DumpLines::read(dir.path());
    for p in readers() {
        let a = srclines_at(&p, &ours, &mine[0].display().to_string());
        let b = srclines_at(&p, &theirs, &list);
        // A load whose DEBUG_INFO record V8 wrote malformed has no line on ours.
        let lined: Vec<_> = a
            .iter()
            .filter(|x| x.1 != "-" && dump.malformed_at(&x.0, x.2))
            .collect();
        assert!(
            lined.is_empty(),
            "{}: lines in loads with a malformed DEBUG_INFO record: {lined:?}",
            p.name
        );
        // Where the lines differ, the one perf defect (see DumpLines): the sample is in
        // such a load, ours has no line, perf's names no file of a well-formed record.
        let excused = |i: usize| {
            let (x, y) = (&a[i], &b[i]);
            x.1 == "-" && x.2 == y.2 && dump.malformed_among(&x.0, x.2) && !dump.names_file(&y.1)
        };
        let strip = |v: &[(String, String, u64)]| -> Vec<(String, String)> {
            v.iter().map(|x| (x.0.clone(), x.1.clone())).collect()
        };
        let n = same_srclines(&p, &strip(&a), &strip(&b), &excused);
        if n > 0 {
            let shown: Vec<_> = (0..a.len().min(b.len()))
                .filter(|&i| a[i].1 != b[i].1)
                .map(|i| format!("{:#x} {}: {:?}", b[i].2, b[i].0, b[i].1))
                .collect();
            eprintln!(
                "{}: {n} samples in loads whose DEBUG_INFO record V8 wrote malformed: no line on ours, perf inject's: {shown:?}",
                p.name
            );
        }
    }
    // perf annotate of the hottest optimized JS function: the same instructions with
    // the same share of its samples.
    let report = common::run_ok(
        perf.cmd()
            .args(["report", "--stdio", "--sort", "sym", "-i"])
            .arg(&ours),
    );
    let syms: Vec<String> = String::from_utf8_lossy(&report.stdout)
        .lines()
        .filter_map(|l| Some(l.split_once("[.] ")?.1.trim().to_string()))
        .collect();
    let hottest = ["JS:*", "JS:", "Builtin"]
        .iter()
        .find_map(|pre| syms.iter().find(|s| s.starts_with(pre)).cloned())
        .expect("no JIT function in perf report of pdinject's output");
    let mut annotated_by = 0;
    for p in readers() {
        let (a, b) = match (
            annotated(&p, &ours, &hottest),
            annotated(&p, &theirs, &hottest),
        ) {
            (None, None) => continue,
            (a, b) => (a.unwrap_or_default(), b.unwrap_or_default()),
        };
        assert!(
            !a.is_empty() && a == b,
            "{}: perf annotate of {hottest} differs from perf inject --jit's ({} and {} instructions; first difference {:?})",
            p.name,
            a.len(),
            b.len(),
            a.iter().zip(&b).find(|(x, y)| x != y)
        );
        annotated_by += 1;
    }
    assert!(annotated_by > 0, "no perf could annotate {hottest}");
    Ok(())
}

/// Two node processes at once: their dumps are made on two cores, each into its own
/// image; the output's bytes do not depend on `--jobs`, and every sample's symbol is
/// perf inject --jit's.
#[test]
fn jit_two_processes_on_two_cores() -> common::Outcome {
    let (node, perf) = node_and_perf()?;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("w.js"), NODE_JS).unwrap();
    let node = node.display().to_string();
    let data = d.join("two.data");
    common::record_in(
        &perf,
        d,
        &data,
        &[
            "-k",
            "1",
            "--",
            "sh",
            "-c",
            &format!("{node} --perf-prof w.js 100 400 & {node} --perf-prof w.js 100 400; wait"),
        ],
    );
    compare_with_perf(&perf, &data, d);
    assert_eq!(images(d, "jit-").len(), 2, "{:?}", images(d, "jit-"));
    let one = d.join("one.data");
    common::pdinject_ok(&data, &one, &["--jit", "--jobs", "1"]);
    assert!(
        fs::read(&one).unwrap() == fs::read(d.join("ours.data")).unwrap(),
        "--jit --jobs 1 and the default (every core) wrote different bytes"
    );
    Ok(())
}

/// A `perf record --threads` directory, plain and `-z`, recorded with `-B`: pdinject
/// --jit writes one file whose samples are the directory's (perf script of both,
/// sorted: the same lines) and whose JIT symbols are those perf inject --jit gives
/// the same records in one file (its own output of a directory has no samples:
/// measured with perf 6.1 and 7.3). With no table to pass on, node's ID is proved:
/// its second mapping of its own code (V8's builtins under --perf-prof, inside
/// .text) is not a sign of a changed file.
#[test]
fn jit_threads_directory() -> common::Outcome {
    let (node, perf) = node_and_perf()?;
    for (name, opts) in [
        ("plain", &["--threads", "-B"][..]),
        ("-z", &["--threads", "-B", "-z"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let data = record_node(&perf, d, &node, opts, &["200", "500"]);
        assert!(
            data.is_dir(),
            "{name}: perf record --threads wrote no directory"
        );
        let ours = d.join("ours.data");
        let report = pdinject_jit(&data, &ours, &[]);
        assert!(
            ours.is_dir(),
            "{name}: the output is not a directory as the input"
        );
        let n = notes(&report);
        assert!(n.contains(" code loads into "), "{name}: {n}");
        let node_id = report["dsos"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["path"].as_str().is_some_and(|p| p.ends_with("/node")));
        assert!(
            node_id.is_some_and(|x| x["build_id"].is_string()),
            "{name}: node has no ID: {node_id:?}"
        );
        for p in readers() {
            let lines = |f: &Path| {
                let mut v: Vec<String> = common::perf_script(&p, f, &["-F", "tid,time,ip,event"])
                    .lines()
                    .map(String::from)
                    .collect();
                v.sort();
                v
            };
            let (a, b) = (lines(&data), lines(&ours));
            assert!(
                !a.is_empty() && a == b,
                "{name}: {}: {} samples in the directory, {} in pdinject's file",
                p.name,
                a.len(),
                b.len()
            );
        }
        if name == "-z" {
            // perf's stream of a -z directory joins the files' zstd streams into one
            // that cannot be read: the loads every record maps give the same symbols.
            let all = d.join("all.data");
            pdinject_jit(&data, &all, &["--jit-maps", "all"]);
            for p in readers() {
                let (a, b) = (symbols(&p, &ours, &[]), symbols(&p, &all, &[]));
                assert!(
                    a == b && a.iter().any(|s| s.starts_with("JS:")),
                    "{name}: {}",
                    p.name
                );
            }
            continue;
        }
        // The same records in one file, which perf inject --jit reads (its own output
        // of a directory has no samples): perf's stream of the directory, written as
        // a file by pdinject without --jit.
        let pipe = d.join("flat.pipe");
        common::run_ok(
            perf.cmd()
                .args(["inject", "-i"])
                .arg(&data)
                .args(["-o", "-"])
                .stdout(fs::File::create(&pipe).unwrap()),
        );
        let flat = d.join("flat.data");
        common::pdinject_ok(&pipe, &flat, &["-N"]);
        // Every record of the directory, mappings and task events included, with the
        // same symbol and dso, in the one file.
        for p in readers() {
            let all = |f: &Path| {
                let mut v: Vec<String> = common::perf_script(
                    &p,
                    f,
                    &[
                        "--show-mmap-events",
                        "--show-task-events",
                        "-F",
                        "tid,time,ip,sym,dso,event",
                    ],
                )
                .lines()
                .map(String::from)
                .collect();
                v.sort();
                v
            };
            let (a, b) = (all(&data), all(&flat));
            assert!(
                a.len() > 100 && a == b,
                "{name}: {}: the directory's {} lines and the file's {} differ; first: {:?}",
                p.name,
                a.len(),
                b.len(),
                a.iter().zip(&b).find(|(x, y)| x != y)
            );
        }
        let theirs = d.join("perf-jit.data");
        perf_inject_jit(&perf, &flat, &theirs);
        for p in readers() {
            let timed = |f: &Path| {
                let mut v: Vec<String> = common::perf_script(&p, f, &["-F", "tid,time,ip,sym"])
                    .lines()
                    .map(String::from)
                    .collect();
                v.sort();
                v
            };
            let (a, b) = (timed(&ours), timed(&theirs));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            assert!(
                a.len() == b.len() && differ == 0,
                "{name}: {}: {differ} of {} lines differ from perf inject --jit's; first: {:?}",
                p.name,
                a.len(),
                a.iter().zip(&b).find(|(x, y)| x != y)
            );
        }
    }
    Ok(())
}

/// Whether chain `theirs` is `ours` with some frames that `bad` names (loads whose
/// DEBUG_INFO record V8 wrote malformed, see [`DumpLines`]) each replaced by one or
/// more `(inlined)` frames, and nothing else changed.
fn inlined_in_place(ours: &[String], theirs: &[String], bad: &dyn Fn(&str) -> bool) -> bool {
    let Some((frame, rest)) = ours.split_first() else {
        return theirs.is_empty();
    };
    let inlined = theirs
        .iter()
        .take_while(|f| f.ends_with(" (inlined)"))
        .count();
    (theirs.first() == Some(frame) && inlined_in_place(rest, &theirs[1..], bad))
        || (bad(frame) && (1..=inlined).any(|k| inlined_in_place(rest, &theirs[k..], bad)))
}

/// node recorded with DWARF stacks: every load gets an image of its own, as perf's
/// libdw unwinder needs (one shared image would be reported to libdw at as many
/// overlapping places, and the chains would stop at the first JIT frame); each
/// sample's whole chain, unwound by perf 6.1, 6.12 and 7.3 at report time, equals the
/// one on perf inject --jit's output, but where perf turns a frame of a load whose
/// DEBUG_INFO record V8 wrote malformed into `(inlined)` frames of garbage names
/// (see [`DumpLines`]).
#[test]
fn jit_node_dwarf_chains_match_perf_inject() -> common::Outcome {
    let (node, perf) = node_and_perf()?;
    let dir = tempfile::tempdir().unwrap();
    // Few samples: perf unwinds each at report time, through thousands of images.
    let data = record_node(
        &perf,
        dir.path(),
        &node,
        &["-F", "200", "--call-graph", "dwarf,8192"],
        &["20", "300"],
    );
    // Each sample's frames (perf's garbage names may hold any character).
    let chains = |p: &Perf, f: &Path| -> Vec<Vec<String>> {
        common::perf_script(p, f, &["-F", "ip,sym"])
            .split("\n\n")
            .map(|s| {
                s.lines()
                    .map(|l| {
                        l.trim()
                            .split_once(' ')
                            .map_or(l.trim(), |x| x.1)
                            .to_string()
                    })
                    .collect()
            })
            .collect()
    };
    // pdinject's images and perf inject's have perf's names, beside the dump: each
    // output is read while its own images are there.
    let ours = dir.path().join("ours.data");
    let report = pdinject_jit(&data, &ours, &[]);
    assert!(
        notes(&report).contains("images of one load each"),
        "{}",
        notes(&report)
    );
    let readers = readers();
    let mine: Vec<Vec<Vec<String>>> = readers.iter().map(|p| chains(p, &ours)).collect();
    let theirs = dir.path().join("perf-jit.data");
    perf_inject_jit(&perf, &data, &theirs);
    let dump = DumpLines::read(dir.path());
    let bad = |frame: &str| dump.malformed_name(frame);
    for (p, a) in readers.iter().zip(&mine) {
        let b = chains(p, &theirs);
        // perf's one defect (see DumpLines): a frame of a load whose DEBUG_INFO
        // record V8 wrote malformed unwound as `(inlined)` frames of garbage names
        // (perf 6.1's addr2line reading a newline in such a name); every other
        // difference fails.
        let (excused, differ): (Vec<_>, Vec<_>) = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x != y)
            .partition(|(x, y)| inlined_in_place(x, y, &bad));
        assert!(
            a.len() == b.len() && differ.is_empty(),
            "{}: {} of {} chains differ from perf inject --jit's; first: {:?}",
            p.name,
            differ.len(),
            a.len(),
            differ.first().map(|(x, y)| (x.join("|"), y.join("|")))
        );
        if !excused.is_empty() {
            let shown: Vec<_> = excused.iter().map(|(_, y)| y.join("|")).collect();
            eprintln!(
                "{}: {} chains with a frame of a load whose DEBUG_INFO record V8 wrote malformed as (inlined) frames on perf inject's output: {shown:?}",
                p.name,
                excused.len()
            );
        }
    }
    // perf 6.1 unwinds through the JIT frames to node's main (perf 7.3 stops at the
    // first JIT frame on both outputs).
    let deep = mine[0]
        .iter()
        .filter(|c| {
            c.iter().any(|f| f.contains("Builtin:")) && c.iter().any(|f| f.contains("node::Start"))
        })
        .count();
    assert!(
        deep > 0,
        "{}: no chain goes through JIT code to node::Start",
        readers[0].name
    );
    Ok(())
}

#[test]
fn jit_python_matches_perf_inject() -> common::Outcome {
    let home = std::env::var("HOME").unwrap_or_default();
    let pyenv = fs::read_dir(Path::new(&home).join(".pyenv/versions"))
        .ok()
        .and_then(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/python3.13"))
                .find(|p| p.exists())
        });
    let mut names: Vec<String> = vec!["python3.13".into()];
    if let Some(p) = pyenv {
        names.insert(0, p.display().to_string());
    }
    // .ci/run finds it before the tests' HOME hides pyenv's shims (PDINJECT_PYTHON313).
    if let Some(p) = std::env::var_os("PDINJECT_PYTHON313") {
        names.insert(0, p.to_string_lossy().into_owned());
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let Some(py) = runtime(&names) else {
        return common::skip(
            "python3.13 not found (PDINJECT_PYTHON313, python3.13 on PATH or ~/.pyenv/versions/3.13*; .ci/run looks for it)",
        );
    };
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("w.py");
    fs::write(
        &script,
        include_str!("../../testdata/fixtures/jit/python-work.py"),
    )
    .unwrap();
    for (mode, cg) in [("fp", "fp"), ("dwarf", "dwarf")] {
        let data = dir.path().join(format!("py-{mode}.data"));
        let sub = dir.path().join(mode);
        fs::create_dir_all(&sub).unwrap();
        common::record_in(
            &perf,
            dir.path(),
            &data,
            &[
                "-k",
                "1",
                "--call-graph",
                cg,
                "--",
                py.to_str().unwrap(),
                "-X",
                "perf_jit",
                script.to_str().unwrap(),
            ],
        );
        // CPython writes /tmp/jit-PID.dump; the images go beside it.
        let pid = common::perf_script(&perf, &data, &["--show-mmap-events"])
            .lines()
            .find(|l| l.contains("/jit-") && l.contains(".dump"))
            .and_then(|l| {
                l.rsplit("/jit-")
                    .next()?
                    .strip_suffix(".dump")
                    .map(String::from)
            });
        compare_with_perf(&perf, &data, &sub);
        if mode == "fp" {
            // Without DWARF stacks, every load goes into one image.
            let r = common::read_report(&sub.join("ours.report.json"));
            assert!(!notes(&r).contains("of one load each"), "{}", notes(&r));
        }
        if let Some(pid) = pid {
            for f in fs::read_dir("/tmp").into_iter().flatten().flatten() {
                let n = f.file_name().to_string_lossy().into_owned();
                if n == format!("jit-{pid}.dump")
                    || n == format!("jit-{pid}.so")
                    || n.starts_with(&format!("jit-{pid}-"))
                    || n.starts_with(&format!("jitted-{pid}-"))
                {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
    }
    Ok(())
}

/// The JDK the Java test builds its agent and workload with: `PDINJECT_JAVA_HOME`,
/// `JAVA_HOME`, or the directory above `javac`'s real path; it must have `jvmti.h`.
fn jdk() -> Option<PathBuf> {
    let from_javac = || {
        let javac = runtime(&["javac"])?;
        let path = if javac.is_absolute() {
            javac
        } else {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join(&javac))
                .find(|p| p.exists())?
        };
        Some(
            fs::canonicalize(path)
                .ok()?
                .parent()?
                .parent()?
                .to_path_buf(),
        )
    };
    ["PDINJECT_JAVA_HOME", "JAVA_HOME"]
        .iter()
        .filter_map(|k| std::env::var_os(k).map(PathBuf::from))
        .chain(from_javac())
        .find(|h| h.join("include/jvmti.h").exists() && h.join("bin/java").exists())
}

/// Java: HotSpot's compiled methods, named by a JVMTI agent of the tests' own
/// (testdata/fixtures/jvmti/pdi_jvmti.c, a jitdump writer like perf's
/// libperf-jvmti.so) with source lines from its inlining records: the same symbol
/// for every sample as on perf inject --jit's output with perf 6.1, 6.12 and 7.3,
/// the same source lines, and one image for the process.
#[test]
fn jit_java_matches_perf_inject() -> common::Outcome {
    let Some(jdk) = jdk() else {
        return common::skip(
            "no JDK with jvmti.h (PDINJECT_JAVA_HOME, JAVA_HOME or javac on PATH; .ci/run installs openjdk-17-jdk-headless)",
        );
    };
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = common::fixtures_src().join("jvmti");
    let agent = d.join("libpdijvmti.so");
    let inc = jdk.join("include");
    common::gcc(&[
        OsStr::new("-shared"),
        OsStr::new("-fPIC"),
        OsStr::new("-O2"),
        OsStr::new("-I"),
        inc.as_os_str(),
        OsStr::new("-I"),
        inc.join("linux").as_os_str(),
        src.join("pdi_jvmti.c").as_os_str(),
        OsStr::new("-o"),
        agent.as_os_str(),
    ]);
    common::run_ok(
        Command::new(jdk.join("bin/javac"))
            .arg("-d")
            .arg(d)
            .arg(src.join("Hot.java")),
    );
    let data = d.join("j.data");
    let mut c = perf.cmd();
    c.current_dir(d)
        .env("JITDUMPDIR", d)
        .args(["record", "-q", "-k", "1", "-o"])
        .arg(&data)
        .arg("--")
        .arg(jdk.join("bin/java"))
        .arg("-XX:+PreserveFramePointer")
        .arg(format!("-agentpath:{}", agent.display()))
        .arg("-cp")
        .arg(d)
        .args(["Hot", "1500"]);
    c.stdout(Stdio::null());
    common::run_ok(&mut c);
    compare_with_perf(&perf, &data, d);
    let mine = images(d, "jit-");
    assert_eq!(mine.len(), 1, "{mine:?}");
    let ours = d.join("ours.data");
    let theirs = d.join("perf-jit.data");
    // The hot methods are named, with their lines (perf demangles the agent's
    // `LHot;harmonic(I)D` to `Hot.harmonic(int)`).
    let hot = symbols(&perf, &ours, &[])
        .iter()
        .filter(|s| s.contains("Hot.harmonic"))
        .count();
    assert!(hot > 0, "no sample in Hot.harmonic on pdinject's output");
    let list = jitted_hit(&perf, &theirs);
    for p in readers() {
        let a = srclines(&p, &ours, &mine[0].display().to_string());
        let b = srclines(&p, &theirs, &list);
        same_srclines(&p, &a, &b, &|i| garbled(&b[i].1));
        assert!(
            a.iter()
                .any(|(s, l)| s.contains("Hot.") && l.contains("Hot.java:")),
            "{}: no Hot.java line on pdinject's output",
            p.name
        );
    }
    Ok(())
}

/// A stream read in small batches: the dump is read on from batch to batch, the
/// records every batch touched go at the stream's end (its rounds dropped, so perf
/// sorts them in), and every sample is named after the code at its address at its
/// time, as from a file.
#[test]
fn jit_minijit_stream_in_small_batches() -> common::Outcome {
    let perf = common::can_record()?;
    let dir = tempfile::tempdir().unwrap();
    let (data, boundary) = record_minijit(&perf, dir.path(), &[]);
    let pipe = dir.path().join("m.pipe");
    common::run_ok(
        perf.cmd()
            .args(["inject", "-i"])
            .arg(&data)
            .args(["-o", "-"])
            .stdout(fs::File::create(&pipe).unwrap()),
    );
    let bytes = fs::read(&pipe).unwrap();
    let opts = pdinject::options::Options {
        jit: pdinject::options::JitChoice::Inject(pdinject::options::JitMaps::Touched),
        ..pdinject::options::Options::default()
    };
    for batch in [4096, 1 << 20] {
        let mut out = Vec::new();
        let r =
            pdinject::testing::driver::stream_in_batches(&mut &bytes[..], &mut out, &opts, batch)
                .unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        assert!(
            r.notes.iter().any(|n| n.contains("2 code loads")),
            "{:?}",
            r.notes
        );
        let ours = dir.path().join(format!("ours-{batch}.pipe"));
        fs::write(&ours, &out).unwrap();
        let samples = timed_jit_samples(&perf, &ours);
        let named = samples.iter().filter(|(_, s)| s != "[unknown]").count();
        let dsos: Vec<String> = r
            .dsos
            .iter()
            .map(|d| format!("{} {:?} {}", d.path, d.build_id, d.hits))
            .collect();
        assert!(
            named > 100,
            "batch {batch}: {named} samples named; {:?} {dsos:?}",
            r.notes
        );
        for (time, sym) in &samples {
            let want = if *time < boundary { "fnA" } else { "fnB" };
            assert_eq!(sym, want, "batch {batch}: sample at {time} ns");
        }
    }
    Ok(())
}
