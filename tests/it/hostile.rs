//! Hostile input, round two (issue 11): structurally valid files with hostile meaning,
//! special files as paths, and outputs perf must still read. Every input is made here
//! by a small perf.data writer ([`PerfFile`]); every run is measured (wall time and peak
//! RSS from wait4) and must end within the limits policy: at most 256 MB, no hang (a
//! generous guard, not a timing assertion), no file but OUT created, and perf reads
//! every output pdinject writes.

use crate::common::{self, pdinject};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const IP_TID_TIME_PERIOD: u64 = 0x1 | 0x2 | 0x4 | 0x100;
const REGS_USER: u64 = 1 << 12;
const STACK_USER: u64 = 1 << 13;
const SAMPLE_ID_ALL: u64 = 1 << 18;
const MISC_USER: u16 = 2;
const MISC_MMAP_BUILD_ID: u16 = 1 << 14;
const FEAT_BUILD_ID: u32 = 2;
const FEAT_HOSTNAME: u32 = 3;
const FEAT_ARCH: u32 = 6;
const FEAT_DIR_FORMAT: u32 = 24;
/// Peak RSS allowed for any run here (issue 11: "at most 256 MB").
const MAX_RSS_KB: u64 = 256 * 1024;
/// A run longer than this is a hang (the fixed inputs end in well under 2 s).
const HANG: Duration = Duration::from_secs(30);

/// A little-endian perf.data under construction: attrs, records, features.
#[derive(Clone)]
struct PerfFile {
    sample_type: u64,
    regs_user: u64,
    stack_user: u32,
    /// Extra attrs (raw entries appended after the first one's) and their ids sections.
    extra_attrs: usize,
    data: Vec<u8>,
    features: Vec<(u32, Vec<u8>)>,
}

fn pad8(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(8) {
        v.push(0);
    }
}

impl PerfFile {
    fn new() -> Self {
        PerfFile {
            sample_type: IP_TID_TIME_PERIOD,
            regs_user: 0,
            stack_user: 0,
            extra_attrs: 0,
            data: Vec::new(),
            features: Vec::new(),
        }
    }

    /// The sample-id trailer of non-sample records (TID, TIME).
    fn trailer(&mut self, pid: u32, time: u64) {
        self.data.extend_from_slice(&pid.to_le_bytes());
        self.data.extend_from_slice(&pid.to_le_bytes());
        self.data.extend_from_slice(&time.to_le_bytes());
    }

    fn record(&mut self, kind: u32, misc: u16, body: &[u8], pid: u32, time: u64) {
        let size = 8 + body.len() + 16;
        self.data.extend_from_slice(&kind.to_le_bytes());
        self.data.extend_from_slice(&misc.to_le_bytes());
        self.data.extend_from_slice(&(size as u16).to_le_bytes());
        self.data.extend_from_slice(body);
        self.trailer(pid, time);
    }

    fn fork(&mut self, pid: u32, ppid: u32, time: u64) {
        let mut b = Vec::new();
        for v in [pid, ppid, pid, ppid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&time.to_le_bytes());
        self.record(7, 0, &b, pid, time);
    }

    /// An MMAP2 record (executable, private), with a build ID when `id` is given.
    fn mmap2(&mut self, pid: u32, start: u64, len: u64, name: &[u8], id: Option<&[u8]>, time: u64) {
        let mut b = Vec::new();
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // pgoff
        let mut misc = MISC_USER;
        match id {
            Some(id) => {
                misc |= MISC_MMAP_BUILD_ID;
                b.push(id.len() as u8);
                b.extend_from_slice(&[0; 3]);
                let mut raw = [0u8; 20];
                raw[..id.len()].copy_from_slice(id);
                b.extend_from_slice(&raw);
            }
            None => {
                b.extend_from_slice(&8u32.to_le_bytes()); // maj
                b.extend_from_slice(&1u32.to_le_bytes()); // min
                b.extend_from_slice(&(start / 4096).to_le_bytes()); // ino
                b.extend_from_slice(&0u64.to_le_bytes()); // ino_generation
            }
        }
        b.extend_from_slice(&5u32.to_le_bytes()); // prot r-x
        b.extend_from_slice(&2u32.to_le_bytes()); // flags MAP_PRIVATE
        b.extend_from_slice(name);
        b.push(0);
        pad8(&mut b);
        self.record(10, misc, &b, pid, time);
    }

    /// A SAMPLE at `ip` in `pid` (with an empty user stack when the attr asks for one).
    fn sample(&mut self, pid: u32, ip: u64, time: u64) {
        let mut b = Vec::new();
        b.extend_from_slice(&ip.to_le_bytes());
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&time.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes()); // period
        if self.sample_type & REGS_USER != 0 {
            b.extend_from_slice(&2u64.to_le_bytes()); // abi 64
            for i in 0..self.regs_user.count_ones() {
                // ip, sp, bp: point at the sample's ip and a small stack.
                b.extend_from_slice(&(if i == 0 { 0x7ffc_0000u64 } else { ip }).to_le_bytes());
            }
        }
        if self.sample_type & STACK_USER != 0 {
            let n = 64u64;
            b.extend_from_slice(&n.to_le_bytes());
            for i in 0..n / 8 {
                b.extend_from_slice(&(ip + i).to_le_bytes());
            }
            b.extend_from_slice(&n.to_le_bytes()); // dyn_size
        }
        let size = 8 + b.len();
        self.data.extend_from_slice(&9u32.to_le_bytes());
        self.data.extend_from_slice(&MISC_USER.to_le_bytes());
        self.data.extend_from_slice(&(size as u16).to_le_bytes());
        self.data.extend_from_slice(&b);
    }

    fn feature(&mut self, bit: u32, payload: Vec<u8>) {
        self.features.push((bit, payload));
        self.features.sort_by_key(|f| f.0);
    }

    fn string_feature(&mut self, bit: u32, s: &str) {
        let mut p = Vec::new();
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        pad8(&mut b);
        p.extend_from_slice(&(b.len() as u32).to_le_bytes());
        p.extend_from_slice(&b);
        self.feature(bit, p);
    }

    fn attr_bytes(&self) -> Vec<u8> {
        let mut a = vec![0u8; 128];
        a[0..4].copy_from_slice(&1u32.to_le_bytes()); // PERF_TYPE_SOFTWARE
        a[4..8].copy_from_slice(&128u32.to_le_bytes());
        a[16..24].copy_from_slice(&4000u64.to_le_bytes());
        a[24..32].copy_from_slice(&self.sample_type.to_le_bytes());
        a[40..48].copy_from_slice(&(SAMPLE_ID_ALL | (1 << 5) | (1 << 6)).to_le_bytes());
        a[80..88].copy_from_slice(&self.regs_user.to_le_bytes());
        a[88..92].copy_from_slice(&self.stack_user.to_le_bytes());
        a
    }

    /// The file: header, attrs (+ ids), data, feature table, payloads. `ids` gives
    /// every attr entry's ids section.
    fn bytes_with(&self, ids: impl Fn(usize, u64) -> (u64, u64)) -> Vec<u8> {
        let nattrs = 1 + self.extra_attrs;
        let attr_size = 128 + 16;
        let attrs_off = 104u64;
        let data_off = attrs_off + (nattrs * attr_size) as u64;
        let data_end = data_off + self.data.len() as u64;
        let mut f = Vec::new();
        f.extend_from_slice(b"PERFILE2");
        f.extend_from_slice(&104u64.to_le_bytes());
        f.extend_from_slice(&(attr_size as u64).to_le_bytes());
        f.extend_from_slice(&attrs_off.to_le_bytes());
        f.extend_from_slice(&((nattrs * attr_size) as u64).to_le_bytes());
        f.extend_from_slice(&data_off.to_le_bytes());
        f.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        f.extend_from_slice(&[0; 16]); // event_types
        let mut bitmap = [0u64; 4];
        for (bit, _) in &self.features {
            bitmap[(*bit / 64) as usize] |= 1 << (bit % 64);
        }
        for w in bitmap {
            f.extend_from_slice(&w.to_le_bytes());
        }
        for i in 0..nattrs {
            f.extend_from_slice(&self.attr_bytes());
            let (o, s) = ids(i, data_end);
            f.extend_from_slice(&o.to_le_bytes());
            f.extend_from_slice(&s.to_le_bytes());
        }
        f.extend_from_slice(&self.data);
        let mut pos = data_end + 16 * self.features.len() as u64;
        for (_, p) in &self.features {
            f.extend_from_slice(&pos.to_le_bytes());
            f.extend_from_slice(&(p.len() as u64).to_le_bytes());
            pos += p.len() as u64;
        }
        for (_, p) in &self.features {
            f.extend_from_slice(p);
        }
        f
    }

    fn bytes(&self) -> Vec<u8> {
        self.bytes_with(|_, _| (0, 0))
    }
}

/// One measured run of pdinject.
struct Run {
    out: Output,
    secs: f64,
    rss_kb: u64,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn ok(&self) -> bool {
        self.out.status.success()
    }
}

/// Runs pdinject with `args` (HOME is the test's), measures wall time and peak RSS
/// with wait4, kills it past [`HANG`]; asserts the limits every run must meet.
fn measured(args: &[&std::ffi::OsStr]) -> Run {
    measured_cmd(pdinject().args(args))
}

fn measured_cmd(cmd: &mut Command) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (so, se, tf) = (
        dir.path().join("out"),
        dir.path().join("err"),
        dir.path().join("time"),
    );
    // Peak RSS from /usr/bin/time, whose child is forked from a small process: a
    // child forked from this (large) test process would count the test's pages too
    // (ru_maxrss keeps the pre-exec high-water mark). Without it, wait4's figure is
    // an upper bound.
    let time = Path::new("/usr/bin/time");
    let mut wrapped;
    let c: &mut Command = if time.is_file() {
        wrapped = Command::new(time);
        wrapped
            .arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(&tf)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        &mut wrapped
    } else {
        cmd
    };
    let start = Instant::now();
    use std::os::unix::process::CommandExt;
    // Reaped with wait4 below (for its rusage), not through `Child::wait`.
    #[allow(clippy::zombie_processes)]
    let child = c
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage filled by wait4 on our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: as above; WNOHANG so the hang guard can act.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 failed");
        if start.elapsed() > HANG {
            // SAFETY: killing our own child's process group (time and pdinject).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            panic!("pdinject {cmd:?} still running after {HANG:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    use std::os::unix::process::ExitStatusExt;
    let mut stderr = std::fs::read(&se).unwrap_or_default();
    let rss_kb = std::fs::read_to_string(&tf)
        .ok()
        .and_then(|t| t.lines().last()?.trim().parse().ok())
        .unwrap_or(ru.ru_maxrss as u64);
    let mut status = std::process::ExitStatus::from_raw(status);
    if let Ok(t) = std::fs::read_to_string(&tf) {
        // time writes "Command terminated by signal N" / "exited with non-zero status".
        if let Some(sig) = t
            .lines()
            .find_map(|l| l.strip_prefix("Command terminated by signal "))
            .and_then(|n| n.trim().parse::<i32>().ok())
        {
            status = std::process::ExitStatus::from_raw(sig);
            stderr.extend_from_slice(t.as_bytes());
        }
    }
    let run = Run {
        out: Output {
            status,
            stdout: std::fs::read(&so).unwrap_or_default(),
            stderr,
        },
        secs: start.elapsed().as_secs_f64(),
        rss_kb,
    };
    eprintln!(
        "pdinject {:?}: {:.2} s, {} KB, {}\n{}",
        cmd.get_args().collect::<Vec<_>>(),
        run.secs,
        run.rss_kb,
        common::status_str(&run.out),
        common::tail(&run.out.stderr)
    );
    assert!(
        run.rss_kb <= MAX_RSS_KB,
        "peak RSS {} KB is over {MAX_RSS_KB} KB\n{}",
        run.rss_kb,
        run.stderr()
    );
    assert!(
        run.out.status.code().is_some(),
        "pdinject died of a signal: {}",
        run.stderr()
    );
    run
}

/// The names in `dir` (temp files included).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn os(p: &Path) -> &std::ffi::OsStr {
    p.as_os_str()
}

/// Writes `f` to `dir/in.data`, runs pdinject into `dir/out.data` (+ `extra` args),
/// and checks that nothing but the output (and the report) was created.
fn run_file(dir: &Path, bytes: &[u8], extra: &[&str]) -> Run {
    let input = dir.join("in.data");
    std::fs::write(&input, bytes).unwrap();
    let before = listing(dir);
    let out = dir.join("out.data");
    let mut args: Vec<&std::ffi::OsStr> = extra.iter().map(|s| std::ffi::OsStr::new(*s)).collect();
    args.push(os(&input));
    args.push(os(&out));
    let r = measured(&args);
    let mut after = listing(dir);
    after.retain(|n| !before.contains(n));
    let allowed: Vec<&str> = if r.ok() {
        vec!["out.data", "report.json"]
    } else {
        vec![]
    };
    assert!(
        after.iter().all(|n| allowed.contains(&n.as_str())),
        "files left behind: {after:?}\n{}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read(&input).unwrap(),
        bytes,
        "the input was changed"
    );
    r
}

/// perf 6.1 and 6.12 read `file`: `perf script` and `perf buildid-list` exit 0.
/// Returns buildid-list's output of the first perf. A perf that is missing is a
/// part of the test left out (`common::part`).
fn perf_reads(file: &Path) -> Option<String> {
    let perfs: Vec<common::Perf> = [
        common::part(common::perf()),
        common::part(common::perf612()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut first = None;
    for p in &perfs {
        for args in [&["script", "-i"][..], &["buildid-list", "-i"][..]] {
            let o = common::run_timeout(p.cmd().args(args).arg(file), HANG)
                .unwrap_or_else(|| panic!("{} {args:?} hangs on {}", p.name, file.display()));
            assert!(
                o.status.success(),
                "{} {args:?} {} fails: {}\n{}",
                p.name,
                file.display(),
                common::status_str(&o),
                common::tail(&o.stderr)
            );
            if args[0] == "buildid-list" && first.is_none() {
                first = Some(String::from_utf8_lossy(&o.stdout).into_owned());
            }
        }
    }
    first
}

/// A file whose one sample hits `/tmp/pdi-hostile/libx.so` (build ID in its MMAP2).
fn simple() -> PerfFile {
    let mut f = PerfFile::new();
    f.mmap2(
        42,
        0x40_0000,
        0x1000,
        b"/tmp/pdi-hostile/libx.so",
        Some(&[0xab; 20]),
        10,
    );
    f.sample(42, 0x40_0100, 20);
    f
}

// ---------------------------------------------------------------------------
// Time and memory

/// Two pids that fork from each other `n` times, then one `--call-graph dwarf`
/// sample whose address space is built through the whole chain.
fn fork_chain(n: u64) -> PerfFile {
    let mut f = PerfFile::new();
    f.sample_type |= REGS_USER | STACK_USER;
    f.regs_user = (1 << 6) | (1 << 7) | (1 << 8); // bp, sp, ip (x86_64)
    f.stack_user = 64;
    f.string_feature(FEAT_ARCH, "x86_64");
    let (a, b) = (100u32, 101u32);
    f.mmap2(a, 0x40_0000, 0x1000, b"/tmp/pdi-hostile/a", None, 1);
    f.mmap2(b, 0x50_0000, 0x1000, b"/tmp/pdi-hostile/b", None, 2);
    for i in 0..n {
        let (child, parent) = if i % 2 == 0 { (a, b) } else { (b, a) };
        f.fork(child, parent, 10 + i);
    }
    // Each fork replaces the child's space with its parent's: b's mapping is what is
    // left, found through the whole chain.
    f.sample(a, 0x50_0100, 10 + n);
    // Later mappings keep the sample off each process's final checkpoint, so its
    // address space is built from the fork events themselves.
    f.mmap2(a, 0x70_0000, 0x1000, b"/tmp/pdi-hostile/late", None, 20 + n);
    f.mmap2(b, 0x70_0000, 0x1000, b"/tmp/pdi-hostile/late", None, 21 + n);
    f
}

/// One process with 2,000 mappings forked `forks` times, a sample in every
/// thousandth child.
fn fork_fanout(forks: u32) -> PerfFile {
    let mut f = PerfFile::new();
    for i in 0..2000u64 {
        f.mmap2(
            1,
            0x1000_0000 + i * 0x2000,
            0x1000,
            b"/tmp/pdi-hostile/lib.so",
            Some(&[0x77; 20]),
            1,
        );
    }
    for c in 0..forks {
        f.fork(1000 + c, 1, 10 + c as u64);
        if c % 1000 == 0 {
            f.sample(1000 + c, 0x1000_0100, 20 + c as u64);
        }
    }
    f
}

#[test]
fn fork_chain_then_dwarf_sample_is_linear() {
    // Two pids fork from each other n times; one --call-graph dwarf sample at the
    // end builds the address space through the whole chain. The old lookup recursed
    // per FORK in the window: 26 forks each took over 60 s. 30 each here (the chain
    // stays within the 64 forks followed).
    let dir = tempfile::tempdir().unwrap();
    let f = fork_chain(60);
    let report = dir.path().join("report.json");
    let r = run_file(
        dir.path(),
        &f.bytes(),
        &["--unwind", "dwarf", "--report", report.to_str().unwrap()],
    );
    assert!(r.ok(), "{}", r.stderr());
    let rep = common::read_report(&report);
    assert_eq!(rep["unwound_samples"], 1, "{rep}");
    assert!(
        common::report_dso(&rep, "/tmp/pdi-hostile/b").is_some(),
        "{rep}"
    );
}

#[test]
fn fork_amplification_stays_proportional() {
    // One process with 2,000 mappings forked 12,000 times (0.6 MB of FORK records):
    // a copy of the parent per fork was 1.3 GB.
    let dir = tempfile::tempdir().unwrap();
    let r = run_file(dir.path(), &fork_fanout(12_000).bytes(), &[]);
    assert!(r.ok(), "{}", r.stderr());
}

#[test]
fn aliased_ids_sections_are_refused() {
    // 1,500 attrs whose ids sections all cover the whole file (before the data, and
    // after it: that used to write 1,500 copies).
    let dir = tempfile::tempdir().unwrap();
    let mut f = simple();
    f.extra_attrs = 1499;
    let len = f.bytes().len() as u64;
    for (name, bytes) in [
        ("whole file", f.bytes_with(|_, _| (0, len & !7))),
        ("after the data", f.bytes_with(|_, end| (end - 64, 64))),
    ] {
        let r = run_file(dir.path(), &bytes, &[]);
        assert!(!r.ok(), "{name}: accepted");
        let e = r.stderr();
        assert!(
            e.contains("in.data") && e.contains("offset") && e.contains("overlaps"),
            "{name}: {e}"
        );
    }
}

#[test]
fn aliased_feature_sections_are_written_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = simple();
    f.string_feature(FEAT_HOSTNAME, "pdi-hostile-host");
    // 200 more features, every one the same section as HOSTNAME: patched after.
    for bit in 100..250 {
        f.feature(bit, Vec::new());
    }
    let mut bytes = f.bytes();
    let data_end = 104 + 144 + f.data.len();
    let nfeat = f.features.len();
    let host_at = f
        .features
        .iter()
        .position(|(b, _)| *b == FEAT_HOSTNAME)
        .unwrap();
    let host: [u8; 16] = bytes[data_end + host_at * 16..][..16].try_into().unwrap();
    for i in 0..nfeat {
        bytes[data_end + i * 16..][..16].copy_from_slice(&host);
    }
    let r = run_file(dir.path(), &bytes, &[]);
    assert!(r.ok(), "{}", r.stderr());
    let out = std::fs::metadata(dir.path().join("out.data"))
        .unwrap()
        .len();
    // Input plus the new table (one entry) at most.
    assert!(
        out <= bytes.len() as u64 + 16 + 128,
        "output {out} bytes from {} bytes of input",
        bytes.len()
    );
    perf_reads(&dir.path().join("out.data"));
    // A partial overlap is refused.
    let mut partial = bytes.clone();
    let at = data_end + (nfeat - 1) * 16;
    let size = u64::from_le_bytes(partial[at + 8..at + 16].try_into().unwrap());
    partial[at + 8..at + 16].copy_from_slice(&(size - 4).to_le_bytes());
    let r = run_file(dir.path(), &partial, &[]);
    assert!(!r.ok() && r.stderr().contains("overlaps"), "{}", r.stderr());
    // Every feature pointing at the whole file (header and data included): refused,
    // since those bytes would be written twice.
    let mut whole = bytes.clone();
    let len = whole.len() as u64;
    for i in 0..nfeat {
        whole[data_end + i * 16..][..8].copy_from_slice(&0u64.to_le_bytes());
        whole[data_end + i * 16 + 8..][..8].copy_from_slice(&len.to_le_bytes());
    }
    let r = run_file(dir.path(), &whole, &[]);
    assert!(
        !r.ok() && r.stderr().contains("before the end of the feature table"),
        "{}",
        r.stderr()
    );
}

/// COMPRESSED2 records holding one zstd frame of `unit` repeated `times` times
/// (streamed: the test never holds the decompressed bytes); `finish` false leaves the
/// frame open.
fn compressed(f: &mut PerfFile, unit: &[u8], times: usize, level: i32, finish: bool) {
    use std::io::Write;
    let mut z = zstd::stream::write::Encoder::new(Vec::new(), level).unwrap();
    let block: Vec<u8> = unit.repeat((1 << 20) / unit.len().max(1) + 1);
    let mut left = times;
    while left > 0 {
        let n = left.min(block.len() / unit.len());
        z.write_all(&block[..n * unit.len()]).unwrap();
        left -= n;
    }
    let frame = if finish {
        z.finish().unwrap()
    } else {
        z.flush().unwrap();
        z.get_ref().clone()
    };
    for chunk in frame.chunks(60_000) {
        let size = 16 + chunk.len();
        let padded = size.next_multiple_of(8);
        f.data.extend_from_slice(&83u32.to_le_bytes()); // COMPRESSED2
        f.data.extend_from_slice(&0u16.to_le_bytes());
        f.data.extend_from_slice(&(padded as u16).to_le_bytes());
        f.data
            .extend_from_slice(&(chunk.len() as u64).to_le_bytes());
        f.data.extend_from_slice(chunk);
        f.data.resize(f.data.len() + padded - size, 0);
    }
}

#[test]
fn decompression_bombs_end_quickly() {
    let dir = tempfile::tempdir().unwrap();
    // (a) zstd MMAP2 records that would be 2 GB of model events.
    let mut one = PerfFile::new();
    one.mmap2(7, 0x1000_0000, 0x1000, b"/tmp/pdi-hostile/z.so", None, 1);
    let mut f = simple();
    compressed(&mut f, &one.data, 20_000_000, 19, true);
    let r = run_file(dir.path(), &f.bytes(), &[]);
    assert!(!r.ok(), "a zstd bomb of mapping records was accepted");
    assert!(r.stderr().contains("limit"), "{}", r.stderr());
    // (b) records the model ignores (FINISHED_ROUND), at a ratio in the thousands.
    let mut f = simple();
    compressed(&mut f, &[68, 0, 0, 0, 0, 0, 8, 0], 400_000_000, 19, true);
    let r = run_file(dir.path(), &f.bytes(), &[]);
    assert!(!r.ok(), "3 GB from a tiny frame was accepted");
    assert!(
        r.stderr().contains("decompressed data") && r.stderr().contains("offset"),
        "{}",
        r.stderr()
    );
    // (c) a frame that never ends, followed by ordinary records: one chunk, read in
    // bounded windows (memory does not follow the file size).
    let mut f = simple();
    let mut few = PerfFile::new();
    few.mmap2(8, 0x60_0000, 0x1000, b"/tmp/pdi-hostile/y.so", None, 1);
    compressed(&mut f, &few.data, 1, 3, false);
    for i in 0..20_000u64 {
        f.sample(42, 0x40_0100, 30 + i);
    }
    let r = run_file(dir.path(), &f.bytes(), &[]);
    assert!(r.ok(), "{}", r.stderr());
}

#[test]
fn huge_jobs_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_file(dir.path(), &simple().bytes(), &["--jobs", "100000"]);
    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    assert!(r.stderr().contains("--jobs 100000"), "{}", r.stderr());
}

#[test]
fn threads_directory_skips_special_data_files() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("rec.data");
    std::fs::create_dir(&rec).unwrap();
    let mut head = PerfFile::new();
    head.mmap2(
        42,
        0x40_0000,
        0x1000,
        b"/tmp/pdi-hostile/libx.so",
        Some(&[0xab; 20]),
        10,
    );
    head.feature(FEAT_DIR_FORMAT, 1u64.to_le_bytes().to_vec());
    std::fs::write(rec.join("data"), head.bytes()).unwrap();
    let mut d2 = PerfFile::new();
    d2.sample(42, 0x40_0100, 20);
    std::fs::write(rec.join("data.2"), &d2.data).unwrap();
    let fifo = std::ffi::CString::new(rec.join("data.0").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir(rec.join("data.1")).unwrap();
    let out = dir.path().join("out.data");
    let report = dir.path().join("report.json");
    let r = measured(&[os(&rec), os(&out), "--report".as_ref(), os(&report)]);
    assert!(r.ok(), "{}", r.stderr());
    let rep = common::read_report(&report);
    assert_eq!(rep["samples"], 1, "{rep}");
    let notes = rep["notes"].to_string();
    assert!(notes.contains("skipped 2 data.N"), "{notes}");
    assert_eq!(listing(&out), ["data", "data.2"]);
    perf_reads(&out);
}

// ---------------------------------------------------------------------------
// Paths

#[test]
fn special_outputs_are_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.data");
    std::fs::write(&input, simple().bytes()).unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let null = dir.path().join("null");
    std::os::unix::fs::symlink("/dev/null", &null).unwrap();
    for out in [&fifo, &null] {
        let before = listing(dir.path());
        let r = measured(&[os(&input), os(out)]);
        assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
        assert!(r.stderr().contains("not replacing it"), "{}", r.stderr());
        assert_eq!(listing(dir.path()), before);
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(
        std::fs::symlink_metadata(&null)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn report_is_never_the_input_or_output_and_commits_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.data");
    let bytes = simple().bytes();
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("out.data");
    let dotted = dir.path().join(".").join("out.data");
    let alias = dir.path().join("alias.data");
    std::fs::hard_link(&input, &alias).unwrap();
    for report in [&input, &alias, &out, &dotted] {
        let r = measured(&[os(&input), os(&out), "--report".as_ref(), os(report)]);
        assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
        assert!(r.stderr().contains("--report"), "{}", r.stderr());
        assert!(!out.exists());
    }
    assert_eq!(std::fs::read(&input).unwrap(), bytes);
    // A report that cannot be written: no output, no report, no temp file.
    let before = listing(dir.path());
    for report in [
        dir.path().join("no/such/dir/r.json"),
        PathBuf::from("/dev/full"),
    ] {
        let r = measured(&[os(&input), os(&out), "--report".as_ref(), os(&report)]);
        assert!(!r.ok(), "{}", r.stderr());
        assert_eq!(listing(dir.path()), before, "{}", r.stderr());
    }
}

#[test]
fn long_output_names_and_modes() -> common::Outcome {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.data");
    std::fs::write(&input, simple().bytes()).unwrap();
    let long = dir.path().join("o".repeat(240));
    let r = measured(&[os(&input), os(&long)]);
    assert!(r.ok(), "{}", r.stderr());
    for mode in [0o600, 0o640] {
        std::fs::set_permissions(&input, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = dir.path().join(format!("out-{mode:o}.data"));
        let r = measured(&[os(&input), os(&out)]);
        assert!(r.ok(), "{}", r.stderr());
        let got = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(got, mode, "output mode {got:o} from input mode {mode:o}");
    }
    // Pipe mode into a file: the same rule.
    let q = common::shared_dir()?;
    let piped = dir.path().join("in.piped");
    std::fs::copy(q.join("perf.data.piped.header_features-4.16"), &piped).unwrap();
    std::fs::set_permissions(&piped, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = dir.path().join("out.piped");
    let r = measured(&[os(&piped), os(&out)]);
    assert!(r.ok(), "{}", r.stderr());
    let got = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        got, 0o600,
        "pipe-mode output mode {got:o} from a 0600 input"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Output perf cannot read, and words that lie

#[test]
fn names_perf_cannot_read_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = simple();
    let mut name = b"/tmp/pdi-hostile/".to_vec();
    name.resize(5000, b'x');
    f.mmap2(42, 0x80_0000, 0x1000, &name, Some(&[0xcd; 20]), 30);
    f.sample(42, 0x80_0100, 40);
    let report = dir.path().join("report.json");
    let r = run_file(
        dir.path(),
        &f.bytes(),
        &["--report", report.to_str().unwrap()],
    );
    assert!(r.ok(), "{}", r.stderr());
    let rep = common::read_report(&report);
    let d = common::report_dso(&rep, &String::from_utf8_lossy(&name)).expect("long DSO listed");
    assert_eq!(d["reason"], "unsupported", "{d}");
    assert!(d["detail"].as_str().unwrap().contains("PATH_MAX"), "{d}");
    if let Some(list) = perf_reads(&dir.path().join("out.data")) {
        assert!(list.contains("abababab"), "{list}");
        assert!(!list.contains("cdcdcdcd"), "{list}");
    }
}

/// A stream's HEADER_BUILD_ID record with a name longer than PATH_MAX: perf reads a
/// stream record whole, but a table entry's name into a PATH_MAX buffer (perf 6.1
/// aborts, "stack smashing detected"), so a file output's table leaves it out.
#[test]
fn long_stream_names_stay_out_of_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = std::fs::read(common::manifest_dir().join("testdata/pipe/demo.pdata")).unwrap();
    let mut name = b"/tmp/pdi-hostile/".to_vec();
    name.resize(5000, b'x');
    let size = (36 + name.len() + 1).next_multiple_of(8);
    let mut rec = Vec::new();
    rec.extend_from_slice(&67u32.to_le_bytes());
    rec.extend_from_slice(&(MISC_USER | (1 << 15)).to_le_bytes());
    rec.extend_from_slice(&(size as u16).to_le_bytes());
    rec.extend_from_slice(&(-1i32).to_le_bytes());
    rec.extend_from_slice(&[0xcd; 20]);
    rec.extend_from_slice(&[20, 0, 0, 0]);
    rec.extend_from_slice(&name);
    rec.resize(size, 0);
    let mut stream = pipe[..16].to_vec();
    stream.extend_from_slice(&rec);
    stream.extend_from_slice(&pipe[16..]);
    let input = dir.path().join("in.pdata");
    std::fs::write(&input, &stream).unwrap();
    let out = dir.path().join("out.data");
    let o = common::run(common::pdinject().arg(&input).arg(&out));
    assert!(o.status.success(), "{}", common::tail(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("left out of the table"),
        "{}",
        common::tail(&o.stderr)
    );
    if let Some(list) = perf_reads(&out) {
        assert!(!list.contains("cdcdcdcd"), "{list}");
    }
}

#[test]
fn new_ids_after_a_damaged_table_are_seen_by_perf() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = simple();
    // One good entry, then 9 bytes of a broken one.
    let mut t = Vec::new();
    t.extend_from_slice(&0u32.to_le_bytes());
    t.extend_from_slice(&(MISC_USER | (1 << 15)).to_le_bytes());
    t.extend_from_slice(&(36u16 + 24).to_le_bytes());
    t.extend_from_slice(&(-1i32).to_le_bytes());
    t.extend_from_slice(&[0x11; 20]);
    t.extend_from_slice(&[20, 0, 0, 0]);
    t.extend_from_slice(b"/tmp/pdi-hostile/old\0\0\0\0");
    t.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 0xff, 0xff]);
    f.feature(FEAT_BUILD_ID, t);
    let report = dir.path().join("report.json");
    let r = run_file(
        dir.path(),
        &f.bytes(),
        &["--report", report.to_str().unwrap()],
    );
    assert!(r.ok(), "{}", r.stderr());
    let rep = common::read_report(&report);
    assert_eq!(rep["ids_new"], 1, "{rep}");
    if let Some(list) = perf_reads(&dir.path().join("out.data")) {
        assert!(
            list.contains(&"ab".repeat(20)),
            "perf does not see the new ID:\n{list}"
        );
        assert!(
            list.contains(&"11".repeat(20)),
            "perf lost the old ID:\n{list}"
        );
    }
}

#[test]
fn names_cannot_forge_summary_lines_and_groups_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = simple();
    f.string_feature(FEAT_HOSTNAME, "pdi-hostile-other-host");
    f.mmap2(
        42,
        0x90_0000,
        0x1000,
        b"/tmp/x\npdinject: forged\x1b[31m",
        None,
        30,
    );
    f.sample(42, 0x90_0100, 40);
    for i in 0..12u64 {
        let name = format!("/tmp/pdi-hostile/missing{i}.so");
        f.mmap2(
            42,
            0xa0_0000 + i * 0x1000,
            0x1000,
            name.as_bytes(),
            None,
            50,
        );
        f.sample(42, 0xa0_0100 + i * 0x1000, 60 + i);
    }
    let r = run_file(dir.path(), &f.bytes(), &[]);
    assert!(r.ok(), "{}", r.stderr());
    let e = r.stderr();
    assert!(!e.contains('\x1b'), "ESC reached the terminal: {e:?}");
    assert!(
        e.lines().all(|l| !l.starts_with("pdinject: forged")),
        "a name forged a line: {e}"
    );
    let lines = e.lines().filter(|l| l.contains("missing")).count();
    assert!(lines <= 2, "12 DSOs of one reason are not grouped:\n{e}");
    assert!(e.contains("13 DSOs") || e.contains("12 DSOs"), "{e}");
    // -v lists them all.
    let out = dir.path().join("out.data");
    let r = measured(&["-v".as_ref(), os(&dir.path().join("in.data")), os(&out)]);
    let e = r.stderr();
    let n = e.lines().filter(|l| l.contains("/missing")).count();
    assert_eq!(n, 12, "{e}");
    assert!(e.contains("/tmp/x\\npdinject: forged\\e[31m"), "{e}");
    assert!(!e.contains('\x1b'), "ESC reached the terminal: {e:?}");
}

/// Writes the hostile structures into testdata/mutation/ (the mutation test mutates
/// them; fuzz/seed.sh seeds the fuzzers with them). Run by hand after changing the
/// writer: `cargo test --release --test it write_mutation_seeds -- --ignored`.
#[test]
#[ignore]
fn write_mutation_seeds() {
    let dir = common::manifest_dir().join("testdata/mutation");
    // A fork chain ending in a DWARF sample.
    let mut f = PerfFile::new();
    f.sample_type |= REGS_USER | STACK_USER;
    f.regs_user = (1 << 6) | (1 << 7) | (1 << 8);
    f.stack_user = 64;
    f.string_feature(FEAT_ARCH, "x86_64");
    f.mmap2(100, 0x40_0000, 0x1000, b"/tmp/pdi-hostile/a", None, 1);
    f.mmap2(
        101,
        0x50_0000,
        0x1000,
        b"/tmp/pdi-hostile/b",
        Some(&[0xbb; 20]),
        2,
    );
    for i in 0..40u64 {
        let (c, p) = if i % 2 == 0 { (100, 101) } else { (101, 100) };
        f.fork(c, p, 10 + i);
    }
    f.sample(100, 0x50_0100, 60);
    f.mmap2(100, 0x70_0000, 0x1000, b"/tmp/pdi-hostile/late", None, 70);
    f.mmap2(101, 0x70_0000, 0x1000, b"/tmp/pdi-hostile/late", None, 71);
    std::fs::write(dir.join("hostile-forks.data"), f.bytes()).unwrap();
    // Feature sections aliasing one another exactly, and a damaged build-ID table.
    let mut f = simple();
    f.string_feature(FEAT_HOSTNAME, "pdi-hostile-host");
    let mut t = vec![0u8, 0, 0, 0, 2, 0x80, 60, 0, 0xff, 0xff, 0xff, 0xff];
    t.extend_from_slice(&[0x11; 20]);
    t.extend_from_slice(&[20, 0, 0, 0]);
    t.extend_from_slice(b"/tmp/pdi-hostile/old\0\0\0\0");
    t.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 0xff, 0xff]);
    f.feature(FEAT_BUILD_ID, t);
    for bit in 100..104 {
        f.feature(bit, Vec::new());
    }
    let mut bytes = f.bytes();
    let data_end = 104 + 144 + f.data.len();
    let host_at = f
        .features
        .iter()
        .position(|(b, _)| *b == FEAT_HOSTNAME)
        .unwrap();
    let host: [u8; 16] = bytes[data_end + host_at * 16..][..16].try_into().unwrap();
    for i in host_at + 1..f.features.len() {
        bytes[data_end + i * 16..][..16].copy_from_slice(&host);
    }
    std::fs::write(dir.join("hostile-aliases.data"), bytes).unwrap();
    // A name perf cannot read, and names with control characters.
    let mut f = simple();
    let mut name = b"/tmp/pdi-hostile/".to_vec();
    name.resize(4200, b'x');
    f.mmap2(42, 0x80_0000, 0x1000, &name, Some(&[0xcd; 20]), 30);
    f.sample(42, 0x80_0100, 40);
    f.mmap2(
        42,
        0x90_0000,
        0x1000,
        b"/tmp/x\npdinject: forged\x1b[31m",
        None,
        50,
    );
    f.sample(42, 0x90_0100, 60);
    std::fs::write(dir.join("hostile-names.data"), f.bytes()).unwrap();
    // Four attrs whose ids sections overlap.
    let mut f = simple();
    f.extra_attrs = 3;
    let bytes = f.bytes_with(|i, end| (end - 32 + 8 * (i as u64 % 2), 16));
    std::fs::write(dir.join("hostile-ids.data"), bytes).unwrap();
}

/// Writes the issue's inputs at the issue's sizes into /tmp/pdi-issue11/ for
/// measuring by hand (`/usr/bin/time -f '%e s %M KB' pdinject IN OUT`):
/// `cargo test --release --test it write_issue_inputs -- --ignored`.
#[test]
#[ignore]
fn write_issue_inputs() {
    let dir = Path::new("/tmp/pdi-issue11");
    std::fs::create_dir_all(dir).unwrap();
    // Fork chain: each of two pids forks from the other 26 times; a dwarf sample.
    std::fs::write(dir.join("forkchain26.data"), fork_chain(52).bytes()).unwrap();
    // Fork amplification: 2,000 maps, 15,000 forks (0.6 MB of FORK records).
    let f = fork_fanout(15_000);
    std::fs::write(dir.join("forkamp.data"), f.bytes()).unwrap();
    // 1,500 attrs, ids covering the whole 1.2 MB file; and after the data.
    let mut f = simple();
    for i in 0..9000u64 {
        f.sample(42, 0x40_0100, 30 + i);
    }
    f.extra_attrs = 1499;
    let len = f.bytes().len() as u64;
    std::fs::write(
        dir.join("ids-whole.data"),
        f.bytes_with(|_, _| (0, len & !7)),
    )
    .unwrap();
    std::fs::write(
        dir.join("ids-after.data"),
        f.bytes_with(|_, end| (end - 64, 64)),
    )
    .unwrap();
    // 256 feature sections all pointing at the whole 8.4 MB file.
    let mut f = simple();
    for i in 0..230_000u64 {
        f.sample(42, 0x40_0100, 30 + i);
    }
    for bit in 0..256 {
        if bit != FEAT_BUILD_ID {
            f.feature(bit, Vec::new());
        }
    }
    let mut bytes = f.bytes();
    let data_end = 104 + 144 + f.data.len();
    let whole = bytes.len() as u64;
    for i in 0..f.features.len() {
        bytes[data_end + i * 16..][..8].copy_from_slice(&0u64.to_le_bytes());
        bytes[data_end + i * 16 + 8..][..8].copy_from_slice(&whole.to_le_bytes());
    }
    std::fs::write(dir.join("features-whole.data"), bytes).unwrap();
    // zstd MMAP2 records (2 GB of events), FINISHED_ROUNDs at ratio ~3,500 (10 GiB).
    let mut one = PerfFile::new();
    one.mmap2(7, 0x1000_0000, 0x1000, b"/tmp/pdi-hostile/z.so", None, 1);
    let mut f = simple();
    compressed(&mut f, &one.data, 20_000_000, 3, true);
    std::fs::write(dir.join("zstd-mmap2.data"), f.bytes()).unwrap();
    let mut f = simple();
    compressed(&mut f, &[68, 0, 0, 0, 0, 0, 8, 0], 1_300_000_000, 1, true);
    std::fs::write(dir.join("zstd-ratio.data"), f.bytes()).unwrap();
    // An open frame, then 300 MB of samples.
    let mut f = simple();
    let mut few = PerfFile::new();
    few.mmap2(8, 0x60_0000, 0x1000, b"/tmp/pdi-hostile/y.so", None, 1);
    compressed(&mut f, &few.data, 1, 3, false);
    for i in 0..6_000_000u64 {
        f.sample(42, 0x40_0100, 30 + i);
    }
    std::fs::write(dir.join("zstd-open.data"), f.bytes()).unwrap();
}

impl PerfFile {
    /// The same records as a stream: pipe header, one HEADER_ATTR, then the data.
    fn stream_bytes(&self) -> Vec<u8> {
        let mut s = b"PERFILE2".to_vec();
        s.extend_from_slice(&16u64.to_le_bytes());
        let attr = self.attr_bytes();
        s.extend_from_slice(&64u32.to_le_bytes()); // HEADER_ATTR
        s.extend_from_slice(&0u16.to_le_bytes());
        s.extend_from_slice(&((8 + attr.len()) as u16).to_le_bytes());
        s.extend_from_slice(&attr);
        s.extend_from_slice(&self.data);
        s
    }
}

/// A perf-tool record (no sample-id trailer): type, misc, body.
fn tool_record(out: &mut Vec<u8>, kind: u32, misc: u16, body: &[u8]) {
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&misc.to_le_bytes());
    out.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
    out.extend_from_slice(body);
}

/// A stream through a pipe on stdin (no first pass over a file), written to stdout:
/// measured like every run here.
fn run_stream(dir: &Path, bytes: &[u8]) -> Run {
    let input = dir.join("in.pdata");
    std::fs::write(&input, bytes).unwrap();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("cat \"$IN\" | \"$PDINJECT\" - - > /dev/null")
        .env("PDINJECT", env!("CARGO_BIN_EXE_pdinject"))
        .env("IN", &input)
        .env("HOME", common::test_home());
    measured_cmd(&mut c)
}

/// Pipe mode holds one batch and the model, whatever the stream holds: endless
/// HEADER_BUILD_ID records (repeats dropped, distinct ones capped), endless
/// HEADER_ATTR records, an AUXTRACE payload larger than a stream may hold (refused
/// before it is read), and a zstd frame that never ends over 100 MB of samples
/// (resolved through one decompressor as it goes, never held).
#[test]
fn streams_are_bounded_by_their_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut entry = Vec::new();
    let id_record = |out: &mut Vec<u8>, n: u32| {
        let mut b = Vec::new();
        b.extend_from_slice(&(-1i32).to_le_bytes());
        let mut id = [0x5au8; 20];
        id[..4].copy_from_slice(&n.to_le_bytes());
        b.extend_from_slice(&id);
        b.extend_from_slice(&[20, 0, 0, 0]);
        let mut name = format!("/usr/lib/hostile-{n}.so").into_bytes();
        name.push(0);
        b.extend_from_slice(&name);
        pad8(&mut b);
        tool_record(out, 67, MISC_USER | 0x8000, &b);
    };
    // (a) 300,000 copies of one HEADER_BUILD_ID record: one entry kept.
    let f = simple();
    let mut s = f.stream_bytes();
    id_record(&mut entry, 1);
    for _ in 0..300_000 {
        s.extend_from_slice(&entry);
    }
    let r = run_stream(dir.path(), &s);
    assert!(r.ok(), "repeated build-ID records: {}", r.stderr());
    // (b) 100,000 distinct ones: over the limit, refused with the offset.
    let mut s = f.stream_bytes();
    for n in 0..100_000 {
        id_record(&mut s, n);
    }
    let r = run_stream(dir.path(), &s);
    assert!(!r.ok(), "endless distinct build-ID records were accepted");
    assert!(
        r.stderr().contains("HEADER_BUILD_ID") && r.stderr().contains("offset"),
        "{}",
        r.stderr()
    );
    // (c) endless HEADER_ATTR records.
    let mut s = f.stream_bytes();
    let attr = f.attr_bytes();
    for _ in 0..5_000 {
        tool_record(&mut s, 64, 0, &attr);
    }
    let r = run_stream(dir.path(), &s);
    assert!(!r.ok(), "endless HEADER_ATTR records were accepted");
    assert!(r.stderr().contains("HEADER_ATTR"), "{}", r.stderr());
    // (d) an AUXTRACE record announcing a 512 MiB payload: refused from its header.
    let mut s = f.stream_bytes();
    let mut aux = Vec::new();
    aux.extend_from_slice(&(512u64 << 20).to_le_bytes()); // size
    aux.extend_from_slice(&[0u8; 32]); // offset, reference, idx, tid, cpu, reserved
    tool_record(&mut s, 71, 0, &aux);
    s.extend_from_slice(&[0u8; 4096]);
    let r = run_stream(dir.path(), &s);
    assert!(!r.ok(), "a 512 MiB AUXTRACE payload was held");
    assert!(r.stderr().contains("pipe mode holds"), "{}", r.stderr());
    // (e) one zstd frame that never ends around 1.5 M samples (60 MB decompressed,
    // fields varied so that they compress as real samples do).
    let mut many = PerfFile::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for t in 0..1_500_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        many.sample(42 + (x % 7) as u32, 0x40_0000 + (x >> 40), 30 + t * 997);
    }
    let mut f = simple();
    compressed(&mut f, &many.data, 1, 1, false);
    let r = run_stream(dir.path(), &f.stream_bytes());
    assert!(r.ok(), "a frame that never ends: {}", r.stderr());
    assert!(
        r.stderr().contains("1500001 samples") || r.stderr().contains("1500000 samples"),
        "every sample in the frame was resolved: {}",
        r.stderr()
    );
}

// ---------------------------------------------------------------------------
// Files resolved beside their scan

/// A file in 24 rounds, eight samples each in one library, with 1 MB of records of
/// an unknown type per round so the scan passes many chunk boundaries. In round 12 a
/// second library is mapped over the first: after that round's samples, or (`late`)
/// older than every sample, which breaks perf's round rule (a record after a
/// FINISHED_ROUND older than what came before the previous one).
fn in_rounds(late: bool) -> Vec<u8> {
    let mut f = PerfFile::new();
    let round = |f: &mut PerfFile| tool_record(&mut f.data, 68, 0, &[]);
    f.mmap2(
        42,
        0x40_0000,
        0x1000,
        b"/tmp/pdi-ahead/liba.so",
        Some(&[0xaa; 20]),
        10,
    );
    round(&mut f);
    for r in 0..24u64 {
        for i in 0..8 {
            f.sample(42, 0x40_0100 + i, 1_000 + r * 100 + i);
        }
        if r == 12 {
            let t = if late { 20 } else { 1_000 + r * 100 + 50 };
            f.mmap2(
                42,
                0x40_0000,
                0x1000,
                b"/tmp/pdi-ahead/libb.so",
                Some(&[0xbb; 20]),
                t,
            );
        }
        for _ in 0..16 {
            tool_record(&mut f.data, 60, 0, &[0u8; 65_520]);
        }
        round(&mut f);
    }
    f.bytes()
}

/// A file is resolved while its scan goes on, a batch at a time, as a stream is:
/// what it finds is what one resolve after the scan finds, and a file that breaks
/// the round rule (so a batch saw a model that later records change) is resolved
/// again whole.
#[test]
fn resolving_beside_the_scan_finds_what_one_resolve_finds() {
    let d = tempfile::tempdir().unwrap();
    for late in [false, true] {
        let path = d.path().join(format!("rounds-{late}.data"));
        std::fs::write(&path, in_rounds(late)).unwrap();
        let hits = |ahead: Option<u64>| {
            let opts = pdinject::Options {
                memory: pdinject::options::Memory {
                    resolve_ahead: ahead,
                    ..Default::default()
                },
                ..Default::default()
            };
            let r = pdinject::testing::driver::analyse(&path, &opts).unwrap();
            let dsos: Vec<(String, u64)> =
                r.dsos.iter().map(|d| (d.path.clone(), d.hits)).collect();
            (
                dsos,
                r.reading.samples,
                r.reading.unmapped_addresses,
                r.run.resolved_beside_scan,
                r.run.resolved_again,
            )
        };
        let once = hits(None);
        let beside = hits(Some(1));
        assert_eq!(
            (once.3, once.4),
            (0, false),
            "no batch beside the scan when off"
        );
        assert_eq!(
            (&beside.0, beside.1, beside.2),
            (&once.0, once.1, once.2),
            "late={late}"
        );
        // Every sample comes after the late mapping in time: all hit libb.
        let libb = once
            .0
            .iter()
            .find(|(n, _)| n.ends_with("libb.so"))
            .map(|d| d.1);
        assert_eq!(libb, Some(if late { 192 } else { 88 }), "{:?}", once.0);
        if late {
            assert!(beside.4, "a file breaking the round rule is resolved again");
        } else {
            assert!(
                beside.3 > 0 && !beside.4,
                "batches were resolved beside the scan and kept: {beside:?}"
            );
        }
    }
}
