//! Helpers shared by the integration tests (tests/it/*.rs).
//!
//! Tools that may be missing (perf, perf 6.12 and 7.3, the right to record, the
//! shared corpus) are probed by functions that return `Result<_, Skip>`: `?` on one
//! ends the test as ignored, saying what is missing (see `harness`). Run by hand, a
//! missing tool never fails a test. Under `PDINJECT_TEST_STRICT=1` (what `.ci/run`
//! sets) it is a failure that names what is missing: a CI run in which a test could
//! not run its oracle or start its service does not pass.

pub use crate::harness::{Outcome, Skip, part, skip};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// Build id of `prog` (20 bytes).
pub const PROG_ID: &str = "c0ffee0123456789abcdef0123456789abcdef01";
/// Build id of the replacement `prog` used by the stale tests (20 bytes).
pub const PROG_ID_B: &str = "bad0000123456789abcdef0123456789abcdef02";
/// Build id of `libfix.so`: 16 bytes (md5 style), to test non-20-byte ids.
pub const LIB_ID: &str = "11223344556677889900aabbccddeeff";
/// Build id of `libunused.so` (linked, mapped, never called).
pub const UNUSED_ID: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";
/// Build id of `dlprog` (dlopen()s ./libx.so).
pub const DLPROG_ID: &str = "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1";
/// Build ids of the two builds of `libx.so`.
pub const LIBX_ID_A: &str = "aaaa0000000000000000000000000000000000a1";
pub const LIBX_ID_B: &str = "bbbb0000000000000000000000000000000000b2";

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixtures_src() -> PathBuf {
    manifest_dir().join("testdata/fixtures")
}

/// `../shared/testdata/quipper` relative to the crate root, if present.
pub fn shared_dir() -> Result<PathBuf, Skip> {
    let d = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/testdata/quipper"
    ));
    if d.is_dir() {
        Ok(d)
    } else {
        skip(format!("shared corpus {} not found", d.display()))
    }
}

/// A perf binary, plus the library path some side-installed copies need.
#[derive(Clone, Debug)]
pub struct Perf {
    pub bin: PathBuf,
    pub ld_library_path: Option<PathBuf>,
    pub name: &'static str,
}

impl Perf {
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        if let Some(l) = &self.ld_library_path {
            c.env("LD_LIBRARY_PATH", l);
        }
        // Keep perf's own cache and config out of the way of the tests.
        c.env("PERF_PAGER", "cat")
            .env("PAGER", "cat")
            .env("HOME", test_home());
        c
    }

    fn works(&self) -> bool {
        self.cmd()
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

fn find_perf() -> Option<Perf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("PDINJECT_TEST_PERF") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![PathBuf::from("perf"), PathBuf::from("/usr/bin/perf")],
    };
    candidates
        .into_iter()
        .map(|bin| Perf {
            bin,
            ld_library_path: None,
            name: "perf",
        })
        .find(|p| p.works())
}

/// The system perf (6.1 here). `PDINJECT_TEST_PERF` overrides the binary.
pub fn perf() -> Result<Perf, Skip> {
    static P: OnceLock<Option<Perf>> = OnceLock::new();
    match P.get_or_init(find_perf) {
        Some(p) => Ok(p.clone()),
        None => skip("perf not found or not working (install linux-perf)"),
    }
}

/// A perf unpacked beside the system one by a script of ../shared/tools: `bin` (and
/// its libraries, `lib`) under `root`, or under the root the variable `var` names.
/// A `Skip` naming the script when it does not run.
fn side_perf(
    found: &OnceLock<Option<Perf>>,
    (var, root, bin, lib): (&str, &str, &str, Option<&str>),
    (name, script): (&'static str, &str),
) -> Result<Perf, Skip> {
    let p = found
        .get_or_init(|| {
            let root = PathBuf::from(std::env::var_os(var).unwrap_or_else(|| root.into()));
            let p = Perf {
                bin: root.join(bin),
                ld_library_path: lib.map(|l| root.join(l)),
                name,
            };
            (p.bin.exists() && p.works()).then_some(p)
        })
        .clone();
    p.ok_or_else(|| {
        Skip::new(format!(
            "{name} not found at {root} (bash ../shared/tools/{script})"
        ))
    })
}

/// perf 6.12 unpacked at /tmp/p612 by ../shared/tools/perf612.sh;
/// `PDINJECT_TEST_PERF612` names another root.
pub fn perf612() -> Result<Perf, Skip> {
    static P: OnceLock<Option<Perf>> = OnceLock::new();
    side_perf(
        &P,
        (
            "PDINJECT_TEST_PERF612",
            "/tmp/p612",
            "usr/bin/perf",
            Some("usr/lib/x86_64-linux-gnu"),
        ),
        ("perf 6.12", "perf612.sh"),
    )
}

/// perf 7.3 unpacked at /tmp/p73 by ../shared/tools/perf73.sh (run through its own
/// loader by the `/tmp/p73/perf` wrapper); `PDINJECT_TEST_PERF73` names another root.
pub fn perf73() -> Result<Perf, Skip> {
    static P: OnceLock<Option<Perf>> = OnceLock::new();
    side_perf(
        &P,
        ("PDINJECT_TEST_PERF73", "/tmp/p73", "perf", None),
        ("perf 7.3", "perf73.sh"),
    )
}

/// `perf inject -b -i - -o -` of the stream `input` into `out`, as `perf` makes it.
pub fn inject_stream(perf: &Perf, input: &Path, out: &Path) {
    let o = run(perf
        .cmd()
        .args(["inject", "-b", "-i", "-", "-o", "-"])
        .stdin(fs::File::open(input).unwrap())
        .stdout(fs::File::create(out).unwrap()));
    assert!(
        o.status.success(),
        "{} inject -b of {} failed: {}",
        perf.name,
        input.display(),
        tail(&o.stderr)
    );
}

/// This test's own HOME: an empty directory made for the test's thread (the test
/// harness runs each test on a thread of its own). Every perf and pdinject command of
/// the test runs with it, so the build-ID cache (`~/.debug`) and `~/.perfconfig` are
/// the test's own, empty at its start.
///
/// The homes live until the test binary exits (an atexit handler removes them all):
/// a build-ID cache holds hard links to system libraries, and removing one moves the
/// library's ctime, which a test still running in parallel would read as "changed
/// since the recording" once the link count is back to one.
pub fn test_home() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let d = tempfile::Builder::new()
            .prefix("pdinject-homes-")
            .tempdir()
            .expect("cannot create the test homes' directory")
            .keep();
        extern "C" fn remove_homes() {
            if let Some(r) = ROOT.get() {
                let _ = fs::remove_dir_all(r);
            }
        }
        // SAFETY: registers a plain function without captures, run once at exit.
        unsafe { libc::atexit(remove_homes) };
        d
    });
    thread_local! {
        static HOME: PathBuf = tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(ROOT.get().expect("root made above"))
            .expect("cannot create a temp HOME for the test")
            .keep();
    }
    let _ = root;
    HOME.with(|h| h.clone())
}

/// Perf usable for recording: perf exists and `perf record -o tmp -- true` works.
pub fn can_record() -> Result<Perf, Skip> {
    static OK: OnceLock<Result<Perf, String>> = OnceLock::new();
    let r = OK.get_or_init(|| {
        let Some(p) = find_perf() else {
            return Err("perf not found or not working (install linux-perf)".into());
        };
        if Command::new("gcc")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return Err("gcc not available (needed to build the C fixtures)".into());
        }
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("probe.data");
        let o = p
            .cmd()
            .args(["record", "-q", "-B", "-o"])
            .arg(&out)
            .args(["--", "true"])
            .output();
        match o {
            Ok(o) if o.status.success() && out.exists() => Ok(p),
            Ok(o) => Err(format!(
                "perf record not available (needs root or perf_event_paranoid<=1): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("perf record not available: {e}")),
        }
    });
    match r {
        Ok(p) => Ok(p.clone()),
        Err(why) => skip(why.clone()),
    }
}

// ---------------------------------------------------------------------------
// Running commands

/// Runs a command, returning its output; panics only if it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command that must succeed; panics with its stderr otherwise.
pub fn run_ok(cmd: &mut Command) -> Output {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "command failed ({}): {cmd:?}\nstdout:\n{}\nstderr:\n{}",
        status_str(&o),
        tail(&o.stdout),
        tail(&o.stderr)
    );
    o
}

pub fn status_str(o: &Output) -> String {
    match (o.status.code(), o.status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{:?}", o.status),
    }
}

/// Last ~4 KB of a byte buffer as text (for failure messages).
pub fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 4000 {
        let mut i = s.len() - 4000;
        while !s.is_char_boundary(i) {
            i += 1;
        }
        format!("[...]{}", &s[i..])
    } else {
        s.into_owned()
    }
}

/// The binary under test.
pub fn pdinject() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pdinject"));
    c.env("HOME", test_home());
    c
}

/// Runs `pdinject ARGS`; returns the output (not checked).
pub fn pdinject_run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(pdinject().args(args))
}

/// Runs `pdinject --buildids IN OUT --report REPORT`, must exit 0; returns the report.
pub fn pdinject_ok(input: &Path, output: &Path, extra: &[&str]) -> (Output, serde_json::Value) {
    let report = output.with_extension("report.json");
    let mut c = pdinject();
    c.args(extra)
        .arg(input)
        .arg(output)
        .arg("--report")
        .arg(&report);
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "pdinject failed ({}): {c:?}\nstderr:\n{}",
        status_str(&o),
        tail(&o.stderr)
    );
    assert!(
        output.exists(),
        "pdinject exited 0 but wrote no {}",
        output.display()
    );
    (o, read_report(&report))
}

pub fn read_report(path: &Path) -> serde_json::Value {
    let s = fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read report {}: {e}", path.display()));
    serde_json::from_str(&s)
        .unwrap_or_else(|e| panic!("report {} is not JSON: {e}\n{s}", path.display()))
}

/// The `dsos[]` entry of a report for `path`, if any.
pub fn report_dso<'a>(report: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    report["dsos"]
        .as_array()?
        .iter()
        .find(|d| d["path"].as_str() == Some(path))
}

/// Short dump of a report's dsos for failure messages.
pub fn report_summary(report: &serde_json::Value) -> String {
    let mut s = String::new();
    if let Some(a) = report["dsos"].as_array() {
        for d in a {
            s += &format!(
                "  {} kind={} hits={} id={} source={} reason={} detail={}\n",
                d["path"],
                d["kind"],
                d["hits"],
                d["build_id"],
                d["source"],
                d["reason"],
                d["detail"]
            );
        }
    } else {
        s += &format!("  (no dsos array) {report}\n");
    }
    s
}

// ---------------------------------------------------------------------------
// Fixtures

pub struct Fixtures {
    /// `prog`, build id PROG_ID, links libfix.so and libunused.so (rpath $ORIGIN).
    pub prog: PathBuf,
    /// `libfix.so`, 16-byte build id LIB_ID.
    pub libfix: PathBuf,
    /// `libunused.so`, UNUSED_ID, mapped by prog but never called.
    pub libunused: PathBuf,
}

pub fn gcc(args: &[&OsStr]) {
    let mut c = Command::new("gcc");
    c.args(["-O1", "-fno-omit-frame-pointer", "-g0"]).args(args);
    run_ok(&mut c);
}

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// Compiles `prog` (with `-DBIG` when `big`) into `out` with build id `id`; links
/// against libfix.so/libunused.so in `libdir`.
pub fn build_prog(out: &Path, id: &str, big: bool, libdir: &Path) {
    let src = fixtures_src().join("prog.c");
    let bid = format!("-Wl,--build-id=0x{id}");
    let libdir_arg = format!("-L{}", libdir.display());
    let mut a: Vec<&OsStr> = vec![os(&bid), os("-o"), out.as_os_str(), src.as_os_str()];
    if big {
        a.push(os("-DBIG"));
    }
    a.extend([
        os(&libdir_arg),
        os("-Wl,--no-as-needed"),
        os("-lfix"),
        os("-lunused"),
        os("-Wl,-rpath,$ORIGIN"),
    ]);
    gcc(&a);
}

/// Compiles a shared library from `testdata/fixtures/<src>` with build id `id`.
pub fn build_lib(src: &str, out: &Path, id: &str) {
    build_lib_with(src, out, id, &[]);
}

pub fn build_lib_with(src: &str, out: &Path, id: &str, extra: &[&str]) {
    let src = fixtures_src().join(src);
    let bid = format!("-Wl,--build-id=0x{id}");
    let mut a: Vec<&OsStr> = vec![
        os("-shared"),
        os("-fPIC"),
        os(&bid),
        os("-o"),
        out.as_os_str(),
        src.as_os_str(),
    ];
    a.extend(extra.iter().map(os));
    gcc(&a);
}

/// Builds prog, libfix.so and libunused.so into `dir` with the fixed ids, and
/// checks the ids with our own ELF note reader.
pub fn build_fixtures(dir: &Path) -> Fixtures {
    let f = Fixtures {
        prog: dir.join("prog"),
        libfix: dir.join("libfix.so"),
        libunused: dir.join("libunused.so"),
    };
    build_lib("libfix.c", &f.libfix, LIB_ID);
    // Without crt files the library has no _init/_fini or destructor stubs, which
    // ld.so runs at load and exit: a sample could land there and hit it honestly.
    build_lib_with("unused.c", &f.libunused, UNUSED_ID, &["-nostartfiles"]);
    build_prog(&f.prog, PROG_ID, false, dir);
    for (p, id) in [
        (&f.prog, PROG_ID),
        (&f.libfix, LIB_ID),
        (&f.libunused, UNUSED_ID),
    ] {
        assert_eq!(
            elf_build_id(p).as_deref(),
            Some(id),
            "fixture {} was built with the wrong build id",
            p.display()
        );
    }
    f
}

/// Builds `dlprog` (DLPROG_ID) into `dir`.
pub fn build_dlprog(dir: &Path) -> PathBuf {
    let out = dir.join("dlprog");
    let src = fixtures_src().join("dlprog.c");
    let bid = format!("-Wl,--build-id=0x{DLPROG_ID}");
    gcc(&[
        os(&bid),
        os("-o"),
        out.as_os_str(),
        src.as_os_str(),
        os("-ldl"),
    ]);
    out
}

// ---------------------------------------------------------------------------
// perf wrappers

/// `perf record -q -o OUT ARGS` (ARGS = options, `--`, command), run in `cwd`.
pub fn record_in(perf: &Perf, cwd: &Path, out: &Path, args: &[&str]) {
    let mut c = perf.cmd();
    c.current_dir(cwd)
        .args(["record", "-q", "-o"])
        .arg(out)
        .args(args);
    c.stdout(Stdio::null());
    run_ok(&mut c);
    assert!(out.exists(), "perf record wrote no {}", out.display());
}

/// Parses `perf buildid-list -i FILE`: path -> hex id ("" when perf lists the
/// path without an id).
pub fn buildid_list(perf: &Perf, file: &Path) -> BTreeMap<String, String> {
    let o = run_ok(perf.cmd().args(["buildid-list", "-i"]).arg(file));
    parse_buildid_list(&String::from_utf8_lossy(&o.stdout))
}

pub fn parse_buildid_list(s: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in s.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            m.insert(line.trim().to_string(), String::new());
            continue;
        }
        match line.split_once(char::is_whitespace) {
            Some((id, path)) => m.insert(path.trim().to_string(), id.to_lowercase()),
            None => m.insert(line.to_string(), String::new()),
        };
    }
    m
}

/// `perf script -i FILE ARGS` stdout; panics if perf fails.
pub fn perf_script(perf: &Perf, file: &Path, args: &[&str]) -> String {
    let o = run_ok(perf.cmd().args(["script", "-i"]).arg(file).args(args));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The fields used to compare input and output with perf script.
pub const SCRIPT_ARGS: &[&str] = &["-F", "comm,tid,time,event,ip,sym,dso", "--show-mmap-events"];

/// Asserts that `perf script` prints the same for both files; on failure shows the
/// first differing lines.
pub fn assert_same_script(perf: &Perf, input: &Path, output: &Path, args: &[&str]) {
    let a = perf_script(perf, input, args);
    let b = perf_script(perf, output, args);
    if a != b {
        panic!(
            "{}: `perf script {}` differs between input {} and output {}:\n{}",
            perf.name,
            args.join(" "),
            input.display(),
            output.display(),
            first_diff(&a, &b)
        );
    }
    assert!(
        !a.is_empty(),
        "{}: perf script printed nothing for {}",
        perf.name,
        input.display()
    );
}

/// Describes the first difference between two texts (line based).
pub fn first_diff(a: &str, b: &str) -> String {
    let la: Vec<&str> = a.lines().collect();
    let lb: Vec<&str> = b.lines().collect();
    for i in 0..la.len().max(lb.len()) {
        let x = la.get(i);
        let y = lb.get(i);
        if x != y {
            let from = i.saturating_sub(2);
            let mut s = format!(
                "first difference at line {} (input {} lines, output {} lines)\n",
                i + 1,
                la.len(),
                lb.len()
            );
            for j in from..(i + 3) {
                s += &format!(
                    "  in [{}]: {}\n  out[{}]: {}\n",
                    j + 1,
                    la.get(j).unwrap_or(&"<eof>"),
                    j + 1,
                    lb.get(j).unwrap_or(&"<eof>")
                );
            }
            return s;
        }
    }
    "texts equal".into()
}

/// DSOs that samples touch (sample IP and callchain), per `perf script -F ip,dso`,
/// with counts. `[unknown]` is left out.
pub fn hit_dsos(perf: &Perf, file: &Path) -> BTreeMap<String, usize> {
    count_dsos(&perf_script(perf, file, &["-F", "ip,dso"]))
}

/// DSOs hit by the sample IP only (callchains hidden), with counts.
pub fn ip_hit_dsos(perf: &Perf, file: &Path) -> BTreeMap<String, usize> {
    count_dsos(&perf_script(
        perf,
        file,
        &["-F", "ip,dso", "--hide-call-graph"],
    ))
}

/// Counts the `(dso)` at the end of each `perf script` line.
fn count_dsos(script: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for line in script.lines() {
        let l = line.trim_end();
        if !l.ends_with(')') {
            continue;
        }
        let Some(open) = l.rfind(" (") else { continue };
        let dso = &l[open + 2..l.len() - 1];
        // "(inlined)" marks inlined frames in perf script's callchains
        if dso == "[unknown]" || dso == "inlined" || dso.is_empty() {
            continue;
        }
        *m.entry(dso.to_string()).or_insert(0) += 1;
    }
    m
}

/// Build ids that MMAP2 records carry (`perf record --buildid-mmap`), by path, as
/// printed by `perf script --show-mmap-events`. The kernel map `[kernel.kallsyms]_text`
/// is reported as `[kernel.kallsyms]`.
pub fn mmap2_build_ids(perf: &Perf, file: &Path) -> BTreeMap<String, String> {
    let s = perf_script(
        perf,
        file,
        &["--show-mmap-events", "-F", "comm,tid,time,ip"],
    );
    let mut m = BTreeMap::new();
    for line in s.lines() {
        if !line.contains("PERF_RECORD_MMAP2") {
            continue;
        }
        let (Some(lt), Some(gt)) = (line.find(" <"), line.find(">]: ")) else {
            continue;
        };
        let id = &line[lt + 2..gt];
        let rest = &line[gt + 4..];
        let path = rest.split_once(' ').map(|x| x.1).unwrap_or(rest).trim();
        let path = if path.starts_with("[kernel.kallsyms]") {
            "[kernel.kallsyms]"
        } else {
            path
        };
        m.insert(path.to_string(), id.to_lowercase());
    }
    m
}

// ---------------------------------------------------------------------------
// Independent build id readers (not the crate's code)

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Walks a raw note stream for NT_GNU_BUILD_ID ("GNU", type 3).
pub fn build_id_from_notes(mut n: &[u8], le: bool) -> Option<String> {
    let rd = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let al4 = |x: usize| (x + 3) & !3;
    while n.len() >= 12 {
        let namesz = rd(&n[0..]) as usize;
        let descsz = rd(&n[4..]) as usize;
        let typ = rd(&n[8..]);
        let name_end = 12 + al4(namesz);
        let desc_end = name_end.checked_add(al4(descsz))?;
        if desc_end > n.len() {
            return None;
        }
        if typ == 3 && namesz == 4 && &n[12..16] == b"GNU\0" {
            return Some(hex(&n[name_end..name_end + descsz]));
        }
        n = &n[desc_end..];
    }
    None
}

/// Build id of an ELF image in memory (file layout), from its PT_NOTE segments.
pub fn build_id_from_elf_bytes(d: &[u8]) -> Option<String> {
    if d.len() < 64 || &d[0..4] != b"\x7fELF" {
        return None;
    }
    let is64 = d[4] == 2;
    let le = d[5] == 1;
    let u16_ = |o: usize| {
        let a = [d[o], d[o + 1]];
        (if le {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }) as usize
    };
    let u32_ = |o: usize| {
        let a: [u8; 4] = d[o..o + 4].try_into().unwrap();
        (if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }) as u64
    };
    let u64_ = |o: usize| {
        let a: [u8; 8] = d[o..o + 8].try_into().unwrap();
        if le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let (phoff, phentsize, phnum) = if is64 {
        (u64_(0x20) as usize, u16_(0x36), u16_(0x38))
    } else {
        (u32_(0x1c) as usize, u16_(0x2a), u16_(0x2c))
    };
    for i in 0..phnum {
        let p = phoff + i * phentsize;
        if p + phentsize > d.len() {
            return None;
        }
        let typ = u32_(p);
        if typ != 4 {
            continue; // PT_NOTE
        }
        let (off, sz) = if is64 {
            (u64_(p + 8) as usize, u64_(p + 32) as usize)
        } else {
            (u32_(p + 4) as usize, u32_(p + 16) as usize)
        };
        if off.checked_add(sz)? > d.len() {
            continue;
        }
        if let Some(id) = build_id_from_notes(&d[off..off + sz], le) {
            return Some(id);
        }
    }
    None
}

/// Build id of an ELF file on disk (PT_NOTE walk).
pub fn elf_build_id(path: &Path) -> Option<String> {
    build_id_from_elf_bytes(&fs::read(path).ok()?)
}

/// Build id of the running kernel, from /sys/kernel/notes.
pub fn kernel_build_id() -> Option<String> {
    build_id_from_notes(
        &fs::read("/sys/kernel/notes").ok()?,
        cfg!(target_endian = "little"),
    )
}

/// Build id of this process's vdso (same kernel as the recordings), read from memory.
pub fn vdso_build_id() -> Option<String> {
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let range = line.split_whitespace().next()?;
    let (a, b) = range.split_once('-')?;
    let start = usize::from_str_radix(a, 16).ok()?;
    let end = usize::from_str_radix(b, 16).ok()?;
    // SAFETY: [vdso] is a readable mapping of this process for its whole life.
    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, end - start) };
    build_id_from_elf_bytes(bytes)
}

/// The build id we expect for a DSO name as perf prints it, computed without the
/// crate: ELF note of the file, /sys/kernel/notes, or our own vdso.
pub fn expected_build_id(dso: &str) -> Option<String> {
    match dso {
        "[kernel.kallsyms]" => kernel_build_id(),
        "[vdso]" => vdso_build_id(),
        p if p.starts_with('/') => elf_build_id(Path::new(p)),
        _ => None,
    }
}

/// The real libc path as perf names it in recordings of the fixtures.
pub fn libc_path() -> Option<String> {
    for p in [
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib64/libc.so.6",
        "/lib64/libc.so.6",
    ] {
        if let Ok(c) = fs::canonicalize(p) {
            return Some(c.to_string_lossy().into_owned());
        }
    }
    None
}

/// Reads the perf.data header's data section (offset, size).
pub fn data_section(file: &Path) -> (u64, u64) {
    let d = fs::read(file).unwrap();
    let off = u64::from_le_bytes(d[40..48].try_into().unwrap());
    let size = u64::from_le_bytes(d[48..56].try_into().unwrap());
    (off, size)
}

/// Formats a map for failure messages.
pub fn fmt_map(m: &BTreeMap<String, String>) -> String {
    m.iter().map(|(k, v)| format!("    {v:40} {k}\n")).collect()
}

/// Runs a command with a time limit; `None` (after killing it) when it takes longer.
pub fn run_timeout(cmd: &mut Command, limit: std::time::Duration) -> Option<Output> {
    use std::io::Read;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Drain the pipes on threads so a chatty child cannot block.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Some(Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    })
}

// ---------------------------------------------------------------------------
// Synthetic inputs

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// demo.data with `pad` bytes of FINISHED_ROUND records (8 bytes each, header only)
/// inserted before its records; feature offsets moved accordingly.
pub fn padded_demo(pad: usize) -> Vec<u8> {
    let d = std::fs::read(manifest_dir().join("testdata/demo/demo.data")).unwrap();
    let (off, size) = (le64(&d, 40) as usize, le64(&d, 48) as usize);
    let end = off + size;
    let nfeat: u32 = (0..4).map(|i| le64(&d, 72 + 8 * i).count_ones()).sum();
    let mut out = d[..off].to_vec();
    let round: [u8; 8] = [68, 0, 0, 0, 0, 0, 8, 0];
    out.reserve(pad + d.len());
    for _ in 0..pad / 8 {
        out.extend_from_slice(&round);
    }
    out.extend_from_slice(&d[off..end]);
    let table_at = out.len();
    out.extend_from_slice(&d[end..]);
    out[48..56].copy_from_slice(&((size + pad) as u64).to_le_bytes());
    for i in 0..nfeat as usize {
        let at = table_at + 16 * i;
        let o = le64(&out, at) + pad as u64;
        out[at..at + 8].copy_from_slice(&o.to_le_bytes());
    }
    out
}

// ---------------------------------------------------------------------------
// Recording tests

/// A temp dir with the fixtures built, and a perf that can record.
pub struct Setup {
    pub perf: Perf,
    pub _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub fx: Fixtures,
}

/// A `Skip` when perf cannot record here; `test` names the temp dir.
pub fn setup(test: &str) -> Result<Setup, Skip> {
    let perf = can_record()?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!("pdinject-{test}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    let fx = build_fixtures(&dir);
    Ok(Setup {
        perf,
        _tmp: tmp,
        dir,
        fx,
    })
}

pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------
// Streams

/// True for a pipe-format (`perf record -o -`) file.
pub fn is_pipe_format(p: &Path) -> bool {
    fs::read(p)
        .map(|b| b.len() >= 16 && &b[..8] == b"PERFILE2" && le64(&b, 8) == 16)
        .unwrap_or(false)
}

/// The IDs perf takes from a stream's HEADER_BUILD_ID records, as `perf buildid-list
/// -v` announces them while reading ("build id event received for PATH: ID").
pub fn received_ids(perf: &Perf, file: &Path) -> BTreeMap<String, String> {
    let o = run(perf.cmd().args(["buildid-list", "-v", "-i"]).arg(file));
    let mut m = BTreeMap::new();
    for l in String::from_utf8_lossy(&o.stderr).lines() {
        if let Some(rest) = l.strip_prefix("build id event received for ")
            && let Some((path, id)) = rest.rsplit_once(": ")
        {
            let id = id.split_whitespace().next().unwrap_or("");
            m.insert(path.to_string(), id.to_lowercase());
        }
    }
    m
}

/// Records `prog` (in the fixture dir) with `perf record -q OPTS -- ./prog`.
pub fn record_prog(st: &Setup, opts: &[&str], name: &str) -> PathBuf {
    let out = st.dir.join(name);
    let mut args: Vec<&str> = opts.to_vec();
    args.extend(["--", "./prog"]);
    record_in(&st.perf, &st.dir, &out, &args);
    out
}

/// Whether the debuginfod server at `url` (`http://HOST:PORT`) serves the executable
/// of build ID `id` (hex) now: one plain HTTP/1.0 GET, its status line read. Tests
/// poll this until a server they started has scanned what it serves; it shares no
/// code with pdinject's client, which the tests check.
pub fn debuginfod_serves(url: &str, id: &str) -> bool {
    use std::io::{Read, Write};
    let Some(addr) = url.strip_prefix("http://") else {
        panic!("{url}: only http:// is polled");
    };
    let Ok(mut c) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let req = format!("GET /buildid/{id}/executable HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if c.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}
