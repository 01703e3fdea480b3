//! Live capture (issue 32): the capture core on processes of its own (a child maps
//! a fixture library and sleeps; its mapping is offered as perf would record it),
//! then whole recordings piped through pdinject.
//!
//! The capture core needs no perf: the mapping record is made from
//! `/proc/PID/maps`, with this boot's monotonic clock as its time (perf's clock is
//! close to it; the capture ties the two by bounds, see src/live/mod.rs).

use super::common::*;
use pdinject::options::BuildIdCache;
use pdinject::testing::live::FileIdent;
use pdinject::testing::live::{Capture, LiveAnswer, LiveConfig, MapArrival, Offered, PerfClock};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Build ID of `liveprog`.
pub const LIVEPROG_ID: &str = "11ee000000000000000000000000000000000001";
/// Build IDs of the two builds of `livelib.so` (v2: `-DV2`, spinning in `v2_spin`).
pub const LIVELIB_V1: &str = "11ee000000000000000000000000000000000a01";
pub const LIVELIB_V2: &str = "11ee000000000000000000000000000000000b02";

fn live_src(f: &str) -> PathBuf {
    fixtures_src().join("live").join(f)
}

/// Build ID of `delprog`, liveprog built again (the binary deleted while it runs).
pub const DELPROG_ID: &str = "11ee000000000000000000000000000000000d01";

/// `liveprog` into `dir` (LIVEPROG_ID).
pub fn build_liveprog(dir: &Path) -> PathBuf {
    build_liveprog_as(dir, "liveprog", LIVEPROG_ID)
}

/// liveprog.c built as `dir/name` with build ID `id`.
pub fn build_liveprog_as(dir: &Path, name: &str, id: &str) -> PathBuf {
    let out = dir.join(name);
    let bid = format!("-Wl,--build-id=0x{id}");
    gcc(&[
        bid.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        live_src("liveprog.c").as_os_str(),
        "-ldl".as_ref(),
    ]);
    out
}

/// Build IDs of the program and library of the private mount namespace.
pub const NSPROG_ID: &str = "11ee000000000000000000000000000000000c01";
pub const NSLIB_ID: &str = "11ee000000000000000000000000000000000c02";

/// `livelib.so` as `out`, v1 or v2.
pub fn build_livelib(out: &Path, v2: bool) {
    build_livelib_as(out, if v2 { LIVELIB_V2 } else { LIVELIB_V1 }, v2)
}

/// livelib.c (v2 with `-DV2`) as `out` with build ID `id`.
pub fn build_livelib_as(out: &Path, id: &str, v2: bool) {
    let bid = format!("-Wl,--build-id=0x{id}");
    let src = live_src("livelib.c");
    let mut a: Vec<&std::ffi::OsStr> = vec![
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        bid.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
        src.as_os_str(),
    ];
    if v2 {
        a.push("-DV2".as_ref());
    }
    gcc(&a);
}

/// A child that runs `cmd` and has said `ready PID`; killed when dropped.
struct Live {
    child: Child,
    pid: u32,
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(cmd: &mut Command) -> Live {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{cmd:?} said {line:?}, not ready"));
    Live { child, pid }
}

fn liveprog(prog: &Path, lib: &Path) -> Live {
    spawn(Command::new(prog).arg(lib).args(["0", "30000"]))
}

/// A mapping of process `pid`, as a record has it.
#[derive(Clone, Debug)]
struct Mapping {
    pid: u32,
    start: u64,
    len: u64,
    pgoff: u64,
    ident: FileIdent,
    name: String,
}

/// The executable mapping of the file whose path ends with `suffix`, from
/// /proc/PID/maps.
fn exec_mapping(pid: u32, suffix: &str) -> Mapping {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_ascii_whitespace().collect();
        if f.len() < 6 || f[1] != "r-xp" || !f[5..].join(" ").ends_with(suffix) {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let (maj, min) = f[3].split_once(':').unwrap();
        return Mapping {
            pid,
            start: a,
            len: b - a,
            pgoff: u64::from_str_radix(f[2], 16).unwrap(),
            ident: FileIdent::Inode {
                maj: u32::from_str_radix(maj, 16).unwrap(),
                min: u32::from_str_radix(min, 16).unwrap(),
                ino: f[4].parse().unwrap(),
                generation: 0,
            },
            name: f[5..].join(" "),
        };
    }
    panic!("no executable mapping of *{suffix} in process {pid}:\n{maps}");
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn offer(c: &mut Capture, m: &Mapping, time: Option<u64>) -> Offered {
    c.offer(&MapArrival {
        pid: m.pid,
        tid: m.pid,
        start: m.start,
        len: m.len,
        pgoff: m.pgoff,
        ident: m.ident,
        prot: 5,
        flags: 2,
        filename: m.name.as_bytes(),
        time,
        cpumode: 2, // PERF_RECORD_MISC_USER
    })
}

fn proven(c: &Capture, m: &Mapping) -> String {
    assert!(
        c.settle(Duration::from_secs(10)),
        "the capture did not settle"
    );
    match c.lookup(&m.ident) {
        Some(LiveAnswer::Proven { build_id, .. }) => build_id.to_string(),
        other => panic!("{} not proven: {other:?}\n{:?}", m.name, c.summary()),
    }
}

fn refused(c: &Capture, m: &Mapping) -> String {
    assert!(
        c.settle(Duration::from_secs(10)),
        "the capture did not settle"
    );
    match c.lookup(&m.ident) {
        Some(LiveAnswer::Unproven((_, why))) => why,
        other => panic!("{} proven: {other:?}", m.name),
    }
}

/// The cache entry of `id` holds a file with that ID.
fn cached(cache: &Path, id: &str) -> bool {
    let e = cache
        .join(".build-id")
        .join(&id[..2])
        .join(&id[2..])
        .join("elf");
    elf_build_id(&e).as_deref() == Some(id)
}

fn built() -> Result<(tempfile::TempDir, PathBuf, PathBuf), Skip> {
    if run(Command::new("gcc").arg("--version")).status.code() != Some(0) {
        return skip("gcc not available");
    }
    let tmp = tempfile::tempdir().unwrap();
    let prog = build_liveprog(tmp.path());
    let lib = tmp.path().join("livelib.so");
    build_livelib(&lib, false);
    build_livelib(&tmp.path().join("v2.so"), true);
    // File times are compared with the mapping's time: a file written within the
    // slack before it is taken as written after it.
    std::thread::sleep(Duration::from_millis(60));
    Ok((tmp, prog, lib))
}

/// The capture these tests offer records to: their times are CLOCK_MONOTONIC's
/// (`mono_ns`), as in a recording made with `perf record -k mono`. With perf's default
/// clock the capture converts through the measured offset of the kernel's local clock,
/// which a machine restored from a snapshot moves away from the monotonic clock: a
/// process spawned a millisecond before its "record" then read as started after it.
fn mono_config() -> LiveConfig {
    LiveConfig {
        perf_clock: PerfClock::Monotonic,
        ..Default::default()
    }
}

fn config(cache: &Path) -> LiveConfig {
    LiveConfig {
        cache: Some(BuildIdCache {
            dir: cache.to_path_buf(),
            ..Default::default()
        }),
        ..mono_config()
    }
}

#[test]
fn live_capture_reads_the_mapped_inode_after_rename_and_delete() -> Outcome {
    let (tmp, prog, lib) = built()?;
    let cache = tmp.path().join("cache");
    let mut c = Capture::start(config(&cache)).unwrap();
    // v1 mapped and captured, then v2 renamed over it.
    let a = liveprog(&prog, &lib);
    let ma = exec_mapping(a.pid, "livelib.so");
    offer(&mut c, &ma, Some(mono_ns()));
    assert_eq!(proven(&c, &ma), LIVELIB_V1);
    std::fs::rename(tmp.path().join("v2.so"), &lib).unwrap();
    // A rename within a few ms before a mapping cannot be told from a change after
    // it (the file times are coarse, the mapping's time a lower bound): a deploy
    // well before the process starts is what proves.
    std::thread::sleep(Duration::from_millis(100));
    // v2 mapped and captured, then deleted.
    let b = liveprog(&prog, &lib);
    let mb = exec_mapping(b.pid, "livelib.so");
    offer(&mut c, &mb, Some(mono_ns()));
    assert_eq!(proven(&c, &mb), LIVELIB_V2);
    std::fs::remove_file(&lib).unwrap();
    // The program itself, deleted while it runs.
    let mp = exec_mapping(a.pid, "liveprog");
    offer(&mut c, &mp, Some(mono_ns()));
    assert_eq!(proven(&c, &mp), LIVEPROG_ID);
    std::fs::remove_file(&prog).unwrap();
    // Renamed over and deleted since: each keeps the ID its capture read.
    assert_eq!(proven(&c, &ma), LIVELIB_V1);
    assert_eq!(proven(&c, &mb), LIVELIB_V2);
    assert_eq!(proven(&c, &mp), LIVEPROG_ID);
    let s = c.finish();
    assert_eq!(
        (s.captured, s.files, s.filled.cache_added),
        (3, 3, 3),
        "{s:?}"
    );
    for id in [LIVELIB_V1, LIVELIB_V2, LIVEPROG_ID] {
        assert!(cached(&cache, id), "{id} not in the cache");
    }
    drop((a, b));
    Ok(())
}

#[test]
fn live_capture_refuses_a_file_renamed_over_or_deleted_before_its_record() -> Outcome {
    // A rename or an unlink moves the ctime as a rewrite with its times set back
    // does (issue 29): a record that arrives after either gets no ID.
    let (tmp, prog, lib) = built()?;
    let cache = tmp.path().join("cache");
    let mut c = Capture::start(config(&cache)).unwrap();
    let a = liveprog(&prog, &lib);
    let ma = exec_mapping(a.pid, "livelib.so");
    let ta = mono_ns();
    std::thread::sleep(Duration::from_millis(50));
    std::fs::rename(tmp.path().join("v2.so"), &lib).unwrap();
    let b = liveprog(&prog, &lib);
    let mb = exec_mapping(b.pid, "livelib.so");
    let tb = mono_ns();
    std::thread::sleep(Duration::from_millis(50));
    std::fs::remove_file(&lib).unwrap();
    offer(&mut c, &ma, Some(ta));
    offer(&mut c, &mb, Some(tb));
    for m in [&ma, &mb] {
        let why = refused(&c, m);
        assert!(why.contains("changed since"), "{why}");
    }
    let s = c.finish();
    assert_eq!(s.filled.cache_added, 0, "{s:?}");
    drop((a, b));
    Ok(())
}

#[test]
fn live_capture_of_a_file_cached_already_costs_a_stat() -> Outcome {
    let (tmp, prog, lib) = built()?;
    let cache = tmp.path().join("cache");
    let a = liveprog(&prog, &lib);
    let m = exec_mapping(a.pid, "livelib.so");
    let mut c = Capture::start(config(&cache)).unwrap();
    offer(&mut c, &m, Some(mono_ns()));
    assert_eq!(proven(&c, &m), LIVELIB_V1);
    let s = c.finish();
    // Present on the same filesystem: a hard link, no bytes.
    assert_eq!(
        (s.filled.cache_added, s.filled.bytes_copied),
        (1, 0),
        "{s:?}"
    );
    let mut c = Capture::start(config(&cache)).unwrap();
    offer(&mut c, &m, Some(mono_ns()));
    assert_eq!(proven(&c, &m), LIVELIB_V1);
    let s = c.finish();
    assert_eq!(
        (s.filled.cache_added, s.filled.cache_present),
        (0, 1),
        "{s:?}"
    );
    Ok(())
}

#[test]
fn live_capture_refuses_a_process_started_after_the_mapping() -> Outcome {
    let (_tmp, prog, lib) = built()?;
    let mut c = Capture::start(mono_config()).unwrap();
    let a = liveprog(&prog, &lib);
    let ma = exec_mapping(a.pid, "livelib.so");
    // A record on time ties perf's clock to this one's.
    offer(&mut c, &ma, Some(mono_ns()));
    assert_eq!(proven(&c, &ma), LIVELIB_V1);
    let before = mono_ns();
    std::thread::sleep(Duration::from_millis(100));
    // A record whose mapping is older than the process now at its pid: another
    // process had the pid then.
    let b = liveprog(&prog, &lib);
    let mb = exec_mapping(b.pid, "liveprog");
    offer(&mut c, &mb, Some(before));
    let why = refused(&c, &mb);
    assert!(why.contains("pid was reused"), "{why}");
    let s = c.finish();
    assert_eq!(s.refused.reused, 1, "{s:?}");
    Ok(())
}

#[test]
fn live_capture_refuses_a_file_written_after_the_mapping() -> Outcome {
    let (_tmp, prog, lib) = built()?;
    let mut c = Capture::start(mono_config()).unwrap();
    let a = liveprog(&prog, &lib);
    let m = exec_mapping(a.pid, "livelib.so");
    let t = mono_ns();
    std::thread::sleep(Duration::from_millis(50));
    // Rewritten in place (the same bytes: only the times say so).
    let bytes = std::fs::read(&lib).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&lib).unwrap();
        f.write_all(&bytes[..64]).unwrap();
    }
    offer(&mut c, &m, Some(t));
    let why = refused(&c, &m);
    assert!(why.contains("modified at"), "{why}");
    let s = c.finish();
    assert_eq!((s.captured, s.refused.changed), (1, 1), "{s:?}");
    Ok(())
}

#[test]
fn live_capture_without_map_files_reads_the_root_path_and_checks_it() -> Outcome {
    let (tmp, prog, lib) = built()?;
    let cfg = LiveConfig {
        root_only: true,
        ..mono_config()
    };
    let mut c = Capture::start(cfg).unwrap();
    let a = liveprog(&prog, &lib);
    let ma = exec_mapping(a.pid, "livelib.so");
    offer(&mut c, &ma, Some(mono_ns()));
    assert_eq!(proven(&c, &ma), LIVELIB_V1);
    // Renamed over: the path names another inode now, which is refused.
    let b = liveprog(&prog, &lib);
    let mb = exec_mapping(b.pid, "livelib.so");
    std::fs::rename(tmp.path().join("v2.so"), &lib).unwrap();
    let mut mb2 = mb.clone();
    mb2.ident = FileIdent::Inode {
        maj: 1,
        min: 2,
        ino: 3,
        generation: 0,
    };
    // The record of the first file arrives late: the path is v2's now.
    offer(&mut c, &mb2, Some(mono_ns()));
    let why = refused(&c, &mb2);
    assert!(why.contains("inode"), "{why}");
    let s = c.finish();
    assert_eq!((s.via, s.refused.mismatched), ("root", 1), "{s:?}");
    Ok(())
}

#[test]
fn live_capture_reaches_a_private_mount_namespace() -> Outcome {
    let (tmp, prog, lib) = built()?;
    if !run(Command::new("unshare").args(["-m", "true"]))
        .status
        .success()
    {
        part::<()>(skip("unshare -m is not permitted here"));
    }
    let ns = tmp.path().join("ns");
    std::fs::create_dir(&ns).unwrap();
    let script = format!(
        "mount -t tmpfs none {ns} && cp {prog} {lib} {ns}/ && sleep 0.1 && exec {ns}/liveprog {ns}/livelib.so 0 30000",
        ns = ns.display(),
        prog = prog.display(),
        lib = lib.display()
    );
    for root_only in [false, true] {
        let cache = tmp.path().join(format!("cache-{root_only}"));
        let mut c = Capture::start(LiveConfig {
            root_only,
            ..config(&cache)
        })
        .unwrap();
        let a = spawn(Command::new("unshare").args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ]));
        // The host does not see the files.
        assert!(!ns.join("livelib.so").exists());
        let m = exec_mapping(a.pid, "livelib.so");
        let mp = exec_mapping(a.pid, "liveprog");
        offer(&mut c, &m, Some(mono_ns()));
        offer(&mut c, &mp, Some(mono_ns()));
        assert_eq!(proven(&c, &m), LIVELIB_V1);
        assert_eq!(proven(&c, &mp), LIVEPROG_ID);
        drop(a);
        let s = c.finish();
        assert_eq!(s.filled.cache_added, 2, "{s:?}");
        assert!(cached(&cache, LIVELIB_V1) && cached(&cache, LIVEPROG_ID));
    }
    Ok(())
}

/// Per process, the functions of samples in the workload's own files (the sample's
/// IP: the first frame after its pid line), from `perf script`.
fn sampled_functions(perf: &Perf, file: &Path) -> std::collections::BTreeMap<u32, Vec<String>> {
    let text = perf_script(perf, file, &["-F", "pid,ip,sym,dso"]);
    let mut out: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    let mut pid = None;
    for l in text.lines() {
        let t = l.trim();
        if let Ok(p) = t.parse::<u32>() {
            pid = Some(p);
            continue;
        }
        if let Some(p) = pid.take()
            && ["liveprog", "delprog", "livelib", "nsprog", "nslib"]
                .iter()
                .any(|w| t.contains(w))
        {
            let f: Vec<&str> = t.split_ascii_whitespace().collect();
            out.entry(p)
                .or_default()
                .push(f.get(1).unwrap_or(&"?").to_string());
        }
    }
    out
}

/// The three scenarios of issue 32 in one live pipeline, `perf record -B -g
/// --no-buffering -o - | pdinject --mmap2-buildid-all - OUT`: a deploy by rename,
/// a binary deleted while it runs, a process in a private mount namespace that
/// exits before the recording ends. With every binary removed afterwards, perf
/// symbolises every sample of them from the cache, each process from its own build.
#[test]
fn live_pipeline_keeps_what_disappears() -> Outcome {
    let perf = can_record()?;
    let (tmp, _, _) = built()?;
    let dir = tmp.path();
    let ns_ok = run(Command::new("unshare").args(["-m", "true"]))
        .status
        .success();
    if !ns_ok {
        part::<()>(skip(
            "unshare -m is not permitted here: the namespace part is left out",
        ));
    }
    build_liveprog_as(dir, "delprog", DELPROG_ID);
    build_liveprog_as(dir, "nsprog", NSPROG_ID);
    build_livelib_as(&dir.join("nslib.so"), NSLIB_ID, false);
    std::fs::create_dir(dir.join("ns")).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let d = dir.display();
    let mut script = format!(
        "{d}/liveprog {d}/livelib.so 150 500 > {d}/v1.pid &
sleep 0.3
mv {d}/v2.so {d}/livelib.so
sleep 0.1
{d}/liveprog {d}/livelib.so 150 500 > {d}/v2.pid &
{d}/delprog - 150 600 > {d}/del.pid &
sleep 0.2
rm {d}/delprog
"
    );
    if ns_ok {
        script += &format!(
            "unshare -m --propagation private sh -c 'mount -t tmpfs none {d}/ns && cp {d}/nsprog {d}/nslib.so {d}/ns/ && sleep 0.1 && exec {d}/ns/nsprog {d}/ns/nslib.so 150 100' > {d}/ns.pid\n"
        );
    }
    script += "wait\nsleep 0.5\n";
    let mut rec = perf
        .cmd()
        .args([
            "record",
            "-q",
            "-B",
            "-g",
            "--no-buffering",
            "-o",
            "-",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = dir.join("out.data");
    let rep = dir.join("r.json");
    let o = run(pdinject()
        .args(["--mmap2-buildid-all", "--report"])
        .arg(&rep)
        .arg("-")
        .arg(&out)
        .stdin(rec.stdout.take().unwrap()));
    assert!(rec.wait().unwrap().success());
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let r = read_report(&rep);
    assert!(
        r["live"]["captured"].as_u64().unwrap_or(0) > 0,
        "nothing captured: {}\n{}",
        r["live"],
        tail(&o.stderr)
    );
    let pid = |f: &str| -> u32 {
        std::fs::read_to_string(dir.join(f)).unwrap()[6..]
            .trim()
            .parse()
            .unwrap()
    };
    // Every binary gone.
    for f in ["liveprog", "livelib.so", "nsprog", "nslib.so"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let mut readers = vec![perf.clone()];
    readers.extend(part(perf73()));
    let mut cases = vec![
        ("v1", pid("v1.pid")),
        ("v2", pid("v2.pid")),
        ("del", pid("del.pid")),
    ];
    if ns_ok {
        cases.push(("ns", pid("ns.pid")));
    }
    for p in &readers {
        let got = sampled_functions(p, &out);
        for (what, pid) in &cases {
            let f = got.get(pid).cloned().unwrap_or_default();
            assert!(
                !f.is_empty(),
                "{}: no sample of {what} ({pid}): {got:?}",
                p.name
            );
            let unknown = f.iter().filter(|s| s.contains("unknown")).count();
            assert_eq!(
                unknown,
                0,
                "{}: {what} has unsymbolised samples: {f:?}\n{}",
                p.name,
                tail(&o.stderr)
            );
            let v2 = f.iter().filter(|s| *s == "v2_spin").count();
            match *what {
                "v2" => assert!(v2 > 0, "{}: no v2_spin in the v2 process: {f:?}", p.name),
                _ => assert_eq!(v2, 0, "{}: v2_spin in {what}: {f:?}", p.name),
            }
        }
    }
    Ok(())
}
