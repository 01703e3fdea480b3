//! `--aslr` (issue 31), run as users run it: `pdinject --aslr IN OUT`.
//!
//! - Against perf 7.3's own `perf inject --aslr`, record for record: every kernel
//!   record perf 7.3 writes is one pdinject writes, over recordings the tests make and
//!   the recordings of `record-corpus.sh`. The records are read by a small reader here
//!   that shares nothing with pdinject's.
//! - Against the checks issue 31 names (perf's `inject_aslr.sh`, perf 7.3 symbol for
//!   symbol, pipes, callchains, the kernel, determinism, the leak scan, DWARF
//!   recordings converted then remapped).

use super::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

// ---------------------------------------------------------------------------
// A small reader of its own: the kernel records (type < 64) of a file or stream.

/// The kernel records of a little-endian recording (file or stream) as a multiset of
/// their bytes: perf 7.3 writes them in time order, pdinject in the input's order.
fn kernel_records(path: &Path) -> BTreeMap<Vec<u8>, usize> {
    let b = fs::read(path).unwrap();
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    assert_eq!(
        &b[..8],
        b"PERFILE2",
        "{}: not a little-endian recording",
        path.display()
    );
    // A stream's header is 16 bytes; a file's names its data section at 40.
    let (mut at, end) = if u64_at(8) == 16 {
        (16, b.len())
    } else {
        (u64_at(40) as usize, (u64_at(40) + u64_at(48)) as usize)
    };
    let mut out = BTreeMap::new();
    while at + 8 <= end {
        let (kind, size) = (u32_at(at), usize::from(u16_at(at + 6)));
        assert!(
            size >= 8 && at + size <= end,
            "{}: bad record at {at}",
            path.display()
        );
        assert!(
            kind != 81 && kind != 83,
            "{}: COMPRESSED records are not read here",
            path.display()
        );
        if kind < 64 {
            *out.entry(b[at..at + size].to_vec()).or_default() += 1;
        }
        // Bytes out of band: TRACING_DATA (66, a u32 size) and AUXTRACE (71, a u64).
        let oob = match kind {
            66 => u64::from(u32_at(at + 8)),
            71 => u64_at(at + 8),
            _ => 0,
        };
        at += size + oob as usize;
    }
    out
}

/// A record's type, size and first words, for a failure message.
fn describe(r: &[u8]) -> String {
    let words: Vec<String> = r[8..]
        .chunks(8)
        .take(40)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            format!("{:x}", u64::from_le_bytes(w))
        })
        .collect();
    format!(
        "type {} misc {:#x} size {}: {}",
        u32::from_le_bytes(r[..4].try_into().unwrap()),
        u16::from_le_bytes([r[4], r[5]]),
        r.len(),
        words.join(" ")
    )
}

/// perf 7.3 `inject --aslr -i IN -o OUT`, must succeed.
fn perf73_aslr(p73: &Perf, input: &Path, out: &Path) {
    run_ok(
        p73.cmd()
            .args(["inject", "--aslr", "-i"])
            .arg(input)
            .arg("-o")
            .arg(out),
    );
}

/// `pdinject --aslr input` equals perf 7.3's `inject --aslr` output, record for
/// record (as multisets of the kernel records' bytes).
fn assert_aslr_equals_perf73(p73: &Perf, input: &Path, ctx: &str) {
    let theirs = input.with_extension("perf73-aslr");
    let ours = input.with_extension("pdinject-aslr");
    perf73_aslr(p73, input, &theirs);
    pdinject_aslr(input, &ours, &[]);
    let (a, b) = (kernel_records(&ours), kernel_records(&theirs));
    assert!(
        !a.is_empty(),
        "{ctx}: no kernel record in pdinject's output"
    );
    let differ = |x: &BTreeMap<Vec<u8>, usize>, y: &BTreeMap<Vec<u8>, usize>, who: &str| {
        x.iter()
            .filter(|(k, n)| y.get(*k) != Some(n))
            .take(6)
            .map(|(k, n)| {
                format!(
                    "  {who} x{n} (the other x{}): {}",
                    y.get(k).unwrap_or(&0),
                    describe(k)
                )
            })
            .collect::<Vec<_>>()
    };
    let (only_ours, only_theirs) = (differ(&a, &b, "pdinject's"), differ(&b, &a, "perf's"));
    assert!(
        only_ours.is_empty() && only_theirs.is_empty(),
        "{ctx}: pdinject --aslr differs from perf 7.3's ({} vs {} kernel records):\n{}\n{}",
        a.values().sum::<usize>(),
        b.values().sum::<usize>(),
        only_ours.join("\n"),
        only_theirs.join("\n")
    );
    eprintln!(
        "{ctx}: {} kernel records equal to perf 7.3's",
        a.values().sum::<usize>()
    );
    for f in [theirs, ours] {
        let _ = fs::remove_file(f);
    }
}

// ---------------------------------------------------------------------------
// Recordings made by the tests

const FORKER: &str = r#"
#include <unistd.h>
#include <sys/wait.h>
volatile long s;
__attribute__((noinline)) void spin(long n){for(long i=0;i<n;i++)s+=i;}
int main(int c,char**v){
  spin(30000000);
  if(c>1){pid_t p=fork(); if(p==0){spin(30000000);_exit(0);} waitpid(p,0,0); return 0;}
  execl("./spinner","spinner",(char*)0); return 1;}
"#;
const SPINNER: &str = r#"
volatile long s;
__attribute__((noinline)) void spinb(long n){for(long i=0;i<n;i++)s+=i;}
int main(){spinb(30000000);return 0;}
"#;

/// `forker` (exec'ing `spinner`, or forking a child with `forker fork`) built in `dir`.
fn build_forker(dir: &Path) {
    for (name, src) in [("forker", FORKER), ("spinner", SPINNER)] {
        let c = dir.join(format!("{name}.c"));
        fs::write(&c, src).unwrap();
        gcc(&[c.as_os_str(), "-o".as_ref(), dir.join(name).as_os_str()]);
    }
}

// ---------------------------------------------------------------------------
// Record for record against perf 7.3

/// Frame-pointer, exec, fork, two events, system-wide with the kernel: every
/// record perf 7.3's `inject --aslr` writes is one `pdinject --aslr` writes.
#[test]
fn aslr_equals_perf73_record_for_record() -> Outcome {
    const T: &str = "aslr_equals_perf73_record_for_record";
    let st = setup(T)?;
    let p73 = perf73()?;
    build_forker(&st.dir);
    let d = &st.dir;
    let rec = |name: &str, args: &[&str]| -> PathBuf {
        let out = d.join(name);
        record_in(&st.perf, d, &out, args);
        out
    };
    let cases = [
        (
            "prog -g",
            rec("fp.data", &["-g", "-F", "4000", "--", "./prog"]),
        ),
        (
            "exec",
            rec("exec.data", &["-g", "-F", "4000", "--", "./forker"]),
        ),
        (
            "fork",
            rec("fork.data", &["-g", "-F", "4000", "--", "./forker", "fork"]),
        ),
        (
            "two events",
            rec(
                "multi.data",
                &[
                    "-e",
                    "cpu-clock,task-clock",
                    "-g",
                    "-F",
                    "2000",
                    "--",
                    "./prog",
                ],
            ),
        ),
        (
            "-a",
            rec("sys.data", &["-a", "-g", "-F", "999", "--", "sleep", "0.5"]),
        ),
        ("pipe", {
            let out = d.join("pipe.data");
            let o = run(st
                .perf
                .cmd()
                .current_dir(d)
                .args([
                    "record", "-q", "-g", "-F", "4000", "-o", "-", "--", "./prog",
                ])
                .stdout(fs::File::create(&out).unwrap()));
            assert!(o.status.success());
            out
        }),
    ];
    for (ctx, input) in &cases {
        assert_aslr_equals_perf73(&p73, input, ctx);
    }
    Ok(())
}

/// The same over the recordings of `record-corpus.sh`: those in `$PDI_CORPUS`, or
/// a corpus the test records (about 40 s). `-z` recordings are left out: perf 7.3
/// copies their COMPRESSED records, pdinject reads inside them.
#[test]
fn aslr_equals_perf73_record_for_record_on_the_corpus() -> Outcome {
    const T: &str = "aslr_equals_perf73_record_for_record_on_the_corpus";
    let st = setup(T)?;
    let p73 = perf73()?;
    let dir = match std::env::var_os("PDI_CORPUS").map(PathBuf::from) {
        Some(d) => d,
        None => {
            let script = manifest_dir().join("../shared/tools/record-corpus.sh");
            if !script.exists() {
                return skip(format!("{} is missing", script.display()));
            }
            let d = st.dir.join("corpus");
            let o = run(Command::new("bash")
                .arg(&script)
                .arg(&d)
                .env("HOME", test_home()));
            assert!(o.status.success(), "record-corpus.sh: {}", tail(&o.stderr));
            d
        }
    };
    assert!(
        dir.join("fp-med.data").exists(),
        "no fp-med.data in {}",
        dir.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let names = [
        "fp-small",
        "fp-med",
        "sys",
        "multi",
        "tp",
        "bmmap",
        "pipe-fp",
        "stale",
        "missing",
        "dwarf-med",
    ];
    for n in names {
        let src = dir.join(format!("{n}.data"));
        if !src.exists() {
            continue;
        }
        let input = tmp.path().join(format!("{n}.data"));
        fs::copy(&src, &input).unwrap();
        assert_aslr_equals_perf73(&p73, &input, n);
    }
    Ok(())
}

/// A stream of the test's own making (little-endian; one software event with IP,
/// TID, TIME and PERIOD, and sample ids on every record), record by record.
struct Synth(Vec<u8>);

impl Synth {
    fn new() -> Synth {
        let mut s = Synth(b"PERFILE2".to_vec());
        s.0.extend_from_slice(&16u64.to_le_bytes());
        let mut a = vec![0u8; 128];
        a[0..4].copy_from_slice(&1u32.to_le_bytes()); // PERF_TYPE_SOFTWARE
        a[4..8].copy_from_slice(&128u32.to_le_bytes());
        a[16..24].copy_from_slice(&4000u64.to_le_bytes());
        a[24..32].copy_from_slice(&(0x1u64 | 0x2 | 0x4 | 0x100).to_le_bytes());
        // sample_id_all, exclude_kernel, exclude_hv
        a[40..48].copy_from_slice(&((1u64 << 18) | (1 << 5) | (1 << 6)).to_le_bytes());
        s.record(64, 0, &a); // HEADER_ATTR
        s
    }

    fn record(&mut self, kind: u32, misc: u16, body: &[u8]) {
        self.0.extend_from_slice(&kind.to_le_bytes());
        self.0.extend_from_slice(&misc.to_le_bytes());
        self.0
            .extend_from_slice(&u16::try_from(8 + body.len()).unwrap().to_le_bytes());
        self.0.extend_from_slice(body);
    }

    fn words(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn thread(pid: u32, tid: u32) -> u64 {
        (u64::from(tid) << 32) | u64::from(pid)
    }

    /// An executable MMAP2 of `name` (inode `ino`) at 0x400000 by `pid` at `t`.
    fn mmap2(&mut self, pid: u32, t: u64, ino: u64, name: &str) {
        let th = Synth::thread(pid, pid);
        let mut b = Synth::words(&[th, 0x40_0000, 0x1000, 0]);
        b.extend_from_slice(&8u32.to_le_bytes()); // maj
        b.extend_from_slice(&1u32.to_le_bytes()); // min
        b.extend_from_slice(&Synth::words(&[ino, 0]));
        b.extend_from_slice(&5u32.to_le_bytes()); // PROT_READ | PROT_EXEC
        b.extend_from_slice(&2u32.to_le_bytes()); // MAP_PRIVATE
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.resize(b.len().next_multiple_of(8), 0);
        b.extend_from_slice(&Synth::words(&[th, t])); // sample id: TID, TIME
        self.record(10, 2, &b);
    }

    /// A user sample of thread `tid` of `pid` at `t`, its IP in the mapping's page.
    fn sample(&mut self, pid: u32, tid: u32, t: u64) {
        let b = Synth::words(&[0x40_0010, Synth::thread(pid, tid), t, 1]);
        self.record(9, 2, &b);
    }

    /// The EXIT of thread `tid` of `pid` at `t`.
    fn exit(&mut self, pid: u32, tid: u32, t: u64) {
        let mut b = Vec::new();
        for v in [pid, pid, tid, tid] {
            b.extend_from_slice(&v.to_le_bytes()); // pid, ppid, tid, ptid
        }
        b.extend_from_slice(&Synth::words(&[t, Synth::thread(pid, tid), t]));
        self.record(4, 0, &b);
    }

    fn round(&mut self) {
        self.record(68, 0, &[]);
    }
}

/// The IPs `pdinject --aslr` wrote for the samples of `out`, by time.
fn sample_ips(out: &Path) -> BTreeMap<u64, u64> {
    kernel_records(out)
        .keys()
        .filter(|r| u32::from_le_bytes(r[..4].try_into().unwrap()) == 9)
        .map(|r| {
            let word = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().unwrap());
            (word(24), word(8))
        })
        .collect()
}

/// `stream` through both `--aslr`s, as a stream and as a file perf 7.3 made of it:
/// the same records. Returns pdinject's sample IPs by time.
fn synth_equals_perf73(p73: &Perf, stream: &Synth, name: &str) -> BTreeMap<u64, u64> {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join(format!("{name}-stream.data"));
    fs::write(&input, &stream.0).unwrap();
    let file = tmp.path().join(format!("{name}-file.data"));
    run_ok(
        p73.cmd()
            .args(["inject", "-i"])
            .arg(&input)
            .arg("-o")
            .arg(&file),
    );
    for (f, ctx) in [(&input, "stream"), (&file, "file")] {
        assert_aslr_equals_perf73(p73, f, &format!("{name} {ctx}"));
    }
    let ours = tmp.path().join("ours.data");
    pdinject_aslr(&input, &ours, &[]);
    sample_ips(&ours)
}

/// A sample written late, in a round after a mapping of a later time that replaced
/// the one holding its address. Rounds (FINISHED_ROUND records): A@10, S@20 | B@30
/// over A | S@35 | S@25, late |. In time order the late sample is in A; a reader that
/// flushed by rounds (perf's ordered events in `perf report`) would handle it after B.
/// perf 7.3's `inject --aslr` takes it in time order (measured here), and so must
/// pdinject: the late sample in A's place.
#[test]
fn aslr_takes_a_sample_written_late_in_time_order_as_perf73() -> Outcome {
    let p73 = perf73()?;
    let mut s = Synth::new();
    s.mmap2(4242, 10, 11, "/opt/pdi-late/a.so");
    s.sample(4242, 4242, 20);
    s.round();
    s.mmap2(4242, 30, 12, "/opt/pdi-late/b.so");
    s.round();
    s.sample(4242, 4242, 35);
    s.round();
    s.sample(4242, 4242, 25);
    s.round();
    let ip = synth_equals_perf73(&p73, &s, "late");
    assert!(
        ip.len() == 3 && ip[&25] == ip[&20] && ip[&25] != ip[&35],
        "the late sample (25) is in A's place (20's), not B's (35's): {ip:x?}"
    );
    Ok(())
}

/// A process's other thread sampled after its leader's EXIT (a multi-threaded
/// process's last moments, seen under load in `-a` recordings): perf keeps the maps
/// for the thread it already had, so its sample is remapped; the leader's own sample
/// after its EXIT is 0.
#[test]
fn aslr_keeps_the_maps_of_a_thread_past_its_leaders_exit_as_perf73() -> Outcome {
    let p73 = perf73()?;
    let mut s = Synth::new();
    s.mmap2(5151, 10, 21, "/opt/pdi-threads/a.so");
    s.sample(5151, 5153, 20);
    s.exit(5151, 5151, 30);
    s.sample(5151, 5153, 40);
    s.sample(5151, 5151, 50);
    s.round();
    let ip = synth_equals_perf73(&p73, &s, "threads");
    assert!(
        ip.len() == 3 && ip[&40] == ip[&20] && ip[&20] != 0 && ip[&50] == 0,
        "the thread's sample after the EXIT (40) as before it (20), the leader's (50) 0: {ip:x?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The command line

/// `pdinject --aslr ARGS IN OUT`, must succeed.
fn pdinject_aslr(input: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    run_ok(pdinject().arg("--aslr").args(extra).arg(input).arg(out))
}

/// perf's inject_aslr.sh comparison: `perf report --stdio` lines with a percentage,
/// headers and 8+-digit hex addresses left out, sorted; kernel DSOs named `[kernel]`
/// when `kernel` (a module may be read as the kernel on one side).
fn report_lines(perf: &Perf, file: &Path, kernel: bool) -> Vec<String> {
    report_lines_of(
        &run_ok(perf.cmd().args(["report", "--stdio", "-i"]).arg(file)),
        kernel,
    )
}

/// [`report_lines`] with `--no-children`, of a file or (`stdin`) of a stream read on
/// perf's stdin: perf 7.3 reports a stream on its stdin without the children column.
fn report_lines_no_children(perf: &Perf, input: &Path, stdin: bool) -> Vec<String> {
    let mut c = perf.cmd();
    c.args(["report", "--stdio", "--no-children", "-i"]);
    if stdin {
        c.arg("-").stdin(fs::File::open(input).unwrap());
    } else {
        c.arg(input);
    }
    report_lines_of(&run_ok(&mut c), false)
}

fn report_lines_of(o: &std::process::Output, kernel: bool) -> Vec<String> {
    let hex = |w: &str| {
        let w = w.trim_start_matches("0x");
        w.len() >= 8 && w.chars().all(|c| c.is_ascii_hexdigit())
    };
    let mut v: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains('%') && !l.starts_with('#'))
        .filter(|l| !l.contains("0000000000000000") && !l.split_whitespace().any(hex))
        .map(|l| {
            let l = l.split_whitespace().collect::<Vec<_>>().join(" ");
            if kernel {
                l.split(' ')
                    .map(|w| {
                        if w.starts_with('[')
                            && w.ends_with(']')
                            && w.len() > 3
                            && w != "[.]"
                            && w != "[k]"
                        {
                            "[kernel]".to_string()
                        } else {
                            w.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                l
            }
        })
        .collect();
    v.sort();
    v
}

/// Who makes the `--aslr --buildids` output of a check: pdinject, or perf 7.3 itself
/// (`perf inject -b --aslr`, to show that the check holds for perf's own output, so that
/// a failure with pdinject is pdinject's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Injector {
    Pdinject,
    Perf73,
}

fn inject_aslr_b(who: Injector, p73: &Perf, input: &Path, out: &Path) {
    match who {
        Injector::Pdinject => {
            pdinject_aslr(input, out, &["--buildids"]);
        }
        Injector::Perf73 => {
            run_ok(
                p73.cmd()
                    .args(["inject", "-b", "--aslr", "-i"])
                    .arg(input)
                    .arg("-o")
                    .arg(out),
            );
        }
    }
}

/// perf's inject_aslr.sh test_report_aslr and test_kernel_report_aslr: `perf report`
/// of the `--aslr -b` output equals `perf report` of `perf inject -b`'s output, for a
/// frame-pointer recording, two events, and system-wide with the kernel.
fn check_report_equals_inject_b(test: &str, who: Injector) -> Outcome {
    let st = setup(test)?;
    let p73 = perf73()?;
    let d = &st.dir;
    for (name, args, kernel) in [
        ("fp", &["-g", "-F", "4000", "--", "./prog"][..], false),
        (
            "multi",
            &["-e", "cpu-clock,task-clock", "-g", "--", "./prog"][..],
            false,
        ),
        (
            "kernel",
            &[
                "-e",
                "task-clock:k",
                "--",
                "dd",
                "if=/dev/urandom",
                "of=/dev/null",
                "bs=1M",
                "count=20",
            ][..],
            true,
        ),
    ] {
        let input = d.join(format!("{name}.data"));
        record_in(&st.perf, d, &input, args);
        let clean = d.join(format!("{name}.clean"));
        run_ok(
            p73.cmd()
                .args(["inject", "-b", "-i"])
                .arg(&input)
                .arg("-o")
                .arg(&clean),
        );
        let out = d.join(format!("{name}.aslr"));
        inject_aslr_b(who, &p73, &input, &out);
        let (want, got) = (
            report_lines(&p73, &clean, kernel),
            report_lines(&p73, &out, kernel),
        );
        assert!(!want.is_empty(), "{name}: no samples");
        assert!(
            want == got,
            "{who:?} {name}: reports differ:\n{}",
            first_diff(&want.join("\n"), &got.join("\n"))
        );
    }
    Ok(())
}

/// The report check holds for perf 7.3's own `inject -b --aslr` (runs now).
#[test]
fn perf73_own_aslr_passes_the_report_check() -> Outcome {
    check_report_equals_inject_b("perf73_own_aslr_passes_the_report_check", Injector::Perf73)?;
    Ok(())
}

/// The report check with pdinject's `--aslr --buildids`.
#[test]
fn aslr_report_equals_inject_b_report() -> Outcome {
    check_report_equals_inject_b("aslr_report_equals_inject_b_report", Injector::Pdinject)?;
    Ok(())
}

/// What perf 7.3 reads of pdinject's `--aslr` output is what it reads of its own
/// `inject --aslr` output, symbol for symbol: every mapping event and every sample's
/// IP, symbol and DSO with its callchain (`perf script`). perf 7.3 zeroes a forked
/// child's samples in inherited maps; pdinject's default layout is perf's.
#[test]
fn aslr_equals_perf73_symbol_for_symbol() -> Outcome {
    const T: &str = "aslr_equals_perf73_symbol_for_symbol";
    let st = setup(T)?;
    let p73 = perf73()?;
    let d = &st.dir;
    let input = d.join("fp.data");
    record_in(&st.perf, d, &input, &["-g", "-F", "4000", "--", "./prog"]);
    let theirs = d.join("fp.perf73");
    perf73_aslr(&p73, &input, &theirs);
    let ours = d.join("fp.aslr");
    pdinject_aslr(&input, &ours, &[]);
    let args = [
        "-F",
        "comm,pid,tid,time,event,ip,sym,dso",
        "--show-mmap-events",
        "--show-task-events",
    ];
    let (want, got) = (
        perf_script(&p73, &theirs, &args),
        perf_script(&p73, &ours, &args),
    );
    assert!(want == got, "{}", first_diff(&want, &got));
    Ok(())
}

/// Streams: pipe in (file out and stream out) and pipe out give what the file gives
/// (perf's test_pipe_report_aslr and test_pipe_out_report_aslr).
#[test]
fn aslr_streams_in_and_out() -> Outcome {
    const T: &str = "aslr_streams_in_and_out";
    let st = setup(T)?;
    let p73 = perf73()?;
    let d = &st.dir;
    let pipe = d.join("pipe.data");
    let o = run(st
        .perf
        .cmd()
        .current_dir(d)
        .args([
            "record", "-q", "-g", "-F", "4000", "-o", "-", "--", "./prog",
        ])
        .stdout(fs::File::create(&pipe).unwrap()));
    assert!(o.status.success());
    // The reference is perf 7.3's report of the stream itself, read on its stdin:
    // perf 7.3 cannot read what `perf inject -b` (its own or 6.1's) makes of a 6.1
    // stream as a file ("Invalid HEADER_CPU_DOMAIN_INFO: section too small", "Attributes
    // and data overlap"), and reads pdinject's.
    let want = report_lines_no_children(&p73, &pipe, true);
    assert!(!want.is_empty(), "perf 7.3 reads nothing of the stream");
    // pipe in, file out
    let f = d.join("pipe.aslr");
    pdinject_aslr(&pipe, &f, &["--buildids"]);
    assert_eq!(
        want,
        report_lines_no_children(&p73, &f, false),
        "pipe in, file out"
    );
    // pipe in, pipe out (stdin to stdout)
    let s = d.join("pipe.aslr.stream");
    let o = run(pdinject()
        .args(["--aslr", "--buildids", "-", "-"])
        .stdin(fs::File::open(&pipe).unwrap())
        .stdout(fs::File::create(&s).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(
        want,
        report_lines_no_children(&p73, &s, true),
        "pipe in, pipe out"
    );
    // file in, pipe out
    let file = d.join("fp.data");
    record_in(&st.perf, d, &file, &["-g", "-F", "4000", "--", "./prog"]);
    let out = d.join("fp.aslr.stream");
    let o = run(pdinject()
        .args(["--aslr", "--buildids"])
        .arg(&file)
        .arg("-")
        .stdout(fs::File::create(&out).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let theirs = d.join("fp.perf73");
    perf73_aslr(&p73, &file, &theirs);
    let args = ["-F", "pid,ip,sym,dso"];
    let a = perf_script(&p73, &theirs, &args);
    let b = String::from_utf8_lossy(
        &run_ok(
            p73.cmd()
                .args(["script", "-i", "-"])
                .args(args)
                .stdin(fs::File::open(&out).unwrap()),
        )
        .stdout,
    )
    .into_owned();
    assert!(a == b, "file in, pipe out:\n{}", first_diff(&a, &b));
    Ok(())
}

/// The same input gives the same bytes, whatever the thread count (a fleet dedups
/// and diffs shared profiles).
#[test]
fn aslr_output_is_deterministic() -> Outcome {
    const T: &str = "aslr_output_is_deterministic";
    let st = setup(T)?;
    let input = st.dir.join("fp.data");
    record_in(
        &st.perf,
        &st.dir,
        &input,
        &["-g", "-F", "4000", "--", "./prog"],
    );
    let mut outs = Vec::new();
    for threads in ["1", "2", "7"] {
        let out = st.dir.join(format!("fp.{threads}.aslr"));
        run_ok(
            pdinject()
                .env("RAYON_NUM_THREADS", threads)
                .arg("--aslr")
                .arg(&input)
                .arg(&out),
        );
        outs.push(fs::read(&out).unwrap());
    }
    assert!(
        outs.windows(2).all(|w| w[0] == w[1]),
        "outputs differ by thread count"
    );
    Ok(())
}

/// benches/leak-scan.py's JSON verdict on `input` and its remapped `out`.
fn leak_scan(input: &Path, out: &Path) -> serde_json::Value {
    let o = run(Command::new("python3")
        .arg(manifest_dir().join("benches/leak-scan.py"))
        .arg("--json")
        .arg(input)
        .arg(out));
    assert!(o.status.success(), "leak-scan failed: {}", tail(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The leak scan's controls, on perf 7.3's own `inject --aslr` (runs now): nothing
/// leaks from a frame-pointer recording, nearly everything from a `-z` one (perf copies
/// its COMPRESSED records: issue 31's 10,109 of 10,894).
#[test]
fn leak_scan_finds_perf73s_z_leak_and_nothing_else() -> Outcome {
    const T: &str = "leak_scan_finds_perf73s_z_leak_and_nothing_else";
    let st = setup(T)?;
    let p73 = perf73()?;
    let d = &st.dir;
    for (name, args) in [
        ("fp", &["-g", "-F", "4000", "--", "./prog"][..]),
        ("z", &["-z", "-g", "-F", "4000", "--", "./prog"][..]),
    ] {
        let input = d.join(format!("{name}.data"));
        record_in(&st.perf, d, &input, args);
        let out = d.join(format!("{name}.perf73"));
        perf73_aslr(&p73, &input, &out);
        let v = leak_scan(&input, &out);
        let (leaked, all) = (
            v["leaked_distinct"].as_u64().unwrap(),
            v["input_addresses"].as_u64().unwrap(),
        );
        assert!(all > 30, "{name}: too few addresses to tell: {v}");
        match name {
            "fp" => assert_eq!(leaked, 0, "{name}: {v}"),
            _ => assert!(
                leaked * 10 > all * 9,
                "{name}: perf 7.3 no longer leaks -z? {v}"
            ),
        }
        eprintln!("{name}: perf 7.3's --aslr leaks {leaked} of {all} addresses");
    }
    Ok(())
}

/// No input address survives in pdinject's output, on a frame-pointer recording, a
/// system-wide one and a `-z` one (perf 7.3 leaks the last one whole).
#[test]
fn aslr_leaves_no_input_address() -> Outcome {
    const T: &str = "aslr_leaves_no_input_address";
    let st = setup(T)?;
    let d = &st.dir;
    for (name, args) in [
        ("fp", &["-g", "-F", "4000", "--", "./prog"][..]),
        ("z", &["-z", "-g", "-F", "4000", "--", "./prog"][..]),
        ("sys", &["-a", "-g", "-F", "999", "--", "sleep", "0.5"][..]),
    ] {
        let input = d.join(format!("{name}.data"));
        record_in(&st.perf, d, &input, args);
        let out = d.join(format!("{name}.aslr"));
        pdinject_aslr(&input, &out, &[]);
        let v = leak_scan(&input, &out);
        assert_eq!(v["leaked_occurrences"], 0, "{name}: {v}");
        assert_eq!(v["kernel_addresses_as_text"], 0, "{name}: {v}");
    }
    Ok(())
}

/// Tracing data keeps the event formats and loses the kernel's addresses (its printk
/// formats and kallsyms list them as text: perf 7.3 copies them), from a file and from
/// a stream, into a file and into a stream: perf still reads the tracepoint's fields.
#[test]
fn aslr_tracing_data_keeps_the_formats_not_the_kernel_addresses() -> Outcome {
    const T: &str = "aslr_tracing_data_keeps_the_formats_not_the_kernel_addresses";
    let st = setup(T)?;
    let d = &st.dir;
    let args = ["-e", "sched:sched_switch", "-g", "--", "./prog"];
    let file = d.join("tp.data");
    record_in(&st.perf, d, &file, &args);
    let pipe = d.join("tp.pipe");
    let o = run(st
        .perf
        .cmd()
        .current_dir(d)
        .args(["record", "-q", "-o", "-"])
        .args(args)
        .stdout(fs::File::create(&pipe).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let kernel_text = |f: &Path| {
        let b = fs::read(f).unwrap();
        b.windows(11).filter(|w| w == b"0xffffffff8").count()
    };
    for input in [&file, &pipe] {
        assert!(
            kernel_text(input) > 10,
            "{}: no printk formats",
            input.display()
        );
        let out = input.with_extension("aslr");
        pdinject_aslr(input, &out, &[]);
        assert_eq!(kernel_text(&out), 0, "{}", out.display());
        let v = leak_scan(input, &out);
        assert_eq!(v["kernel_addresses_as_text"], 0, "{v}");
        let o = run_ok(
            st.perf
                .cmd()
                .args(["evlist", "--trace-fields", "-i"])
                .arg(&out),
        );
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("prev_comm"), "{}: {text}", out.display());
    }
    // A stream into a stream.
    let stream = d.join("tp.stream-stream");
    let o = run(pdinject()
        .args(["--aslr", "-", "-"])
        .stdin(fs::File::open(&pipe).unwrap())
        .stdout(fs::File::create(&stream).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(kernel_text(&stream), 0);
    // A file into a stream.
    let stream = d.join("tp.file-stream");
    let o = run(pdinject()
        .arg("--aslr")
        .arg(&file)
        .arg("-")
        .stdout(fs::File::create(&stream).unwrap()));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    assert_eq!(kernel_text(&stream), 0);
    Ok(())
}

/// `--jit --aslr`: the JIT images' mappings move with the code they map, so every
/// sample keeps its JIT symbol (perf 7.3 writes the images' records at the recorded
/// addresses and its samples in them read `[unknown]`), and nothing leaks.
#[test]
fn aslr_with_jit_keeps_the_jit_symbols() -> Outcome {
    const T: &str = "aslr_with_jit_keeps_the_jit_symbols";
    let st = setup(T)?;
    let p73 = perf73()?;
    let d = &st.dir;
    let bin = d.join("minijit");
    gcc(&[
        fixtures_src().join("minijit.c").as_os_str(),
        std::ffi::OsStr::new("-o"),
        bin.as_os_str(),
    ]);
    let input = d.join("m.data");
    record_in(&st.perf, d, &input, &["-k", "1", "-g", "--", "./minijit"]);
    let (plain, shared) = (d.join("m.jit"), d.join("m.jit-aslr"));
    run_ok(pdinject().arg("--jit").arg(&input).arg(&plain));
    pdinject_aslr(&input, &shared, &["--jit"]);
    let syms = |f: &Path| {
        // The IP (the first word) differs by design: the symbol and DSO must not.
        let mut v: Vec<String> = perf_script(&p73, f, &["-F", "ip,sym,dso", "-G"])
            .lines()
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect();
        v.sort();
        v
    };
    let (want, got) = (syms(&plain), syms(&shared));
    let jitted = got.iter().filter(|l| l.starts_with("fn")).count();
    assert!(jitted > 100, "{jitted} samples in fnA/fnB");
    assert!(
        want == got,
        "{}",
        first_diff(&want.join("\n"), &got.join("\n"))
    );
    let v = leak_scan(&input, &shared);
    assert_eq!(v["leaked_occurrences"], 0, "{v}");
    Ok(())
}

/// DWARF recordings: `--aslr --convert-callchain` keeps the stacks perf 7.3 drops,
/// and its chains are the conversion's chains with the addresses remapped (same
/// symbols and DSOs, frame for frame).
#[test]
fn aslr_after_convert_callchain_keeps_the_chains() -> Outcome {
    const T: &str = "aslr_after_convert_callchain_keeps_the_chains";
    let st = setup(T)?;
    let p73 = perf73()?;
    let d = &st.dir;
    let input = d.join("dwarf.data");
    record_in(
        &st.perf,
        d,
        &input,
        &["--call-graph", "dwarf", "-F", "2000", "--", "./prog"],
    );
    let conv = d.join("dwarf.conv");
    run_ok(pdinject().arg("--convert-callchain").arg(&input).arg(&conv));
    let ours = d.join("dwarf.aslr");
    pdinject_aslr(&input, &ours, &["--convert-callchain"]);
    let args = ["-F", "pid,tid,time,sym,dso", "--no-inline"];
    let (want, got) = (
        perf_script(&p73, &conv, &args),
        perf_script(&p73, &ours, &args),
    );
    assert!(!want.is_empty());
    assert!(want == got, "{}", first_diff(&want, &got));
    // perf 7.3 drops every sample of that recording.
    let theirs = d.join("dwarf.perf73");
    perf73_aslr(&p73, &input, &theirs);
    assert!(perf_script(&p73, &theirs, &["-F", "ip"]).trim().is_empty());
    Ok(())
}

/// The kernel moves (perf's test_kernel_aslr): kernel samples' IPs change, and the
/// kernel map starts at perf's base with its pgoff (the reference symbol) on it.
#[test]
fn aslr_moves_the_kernel() -> Outcome {
    const T: &str = "aslr_moves_the_kernel";
    let st = setup(T)?;
    let p73 = perf73()?;
    let input = st.dir.join("k.data");
    record_in(
        &st.perf,
        &st.dir,
        &input,
        &[
            "-e",
            "task-clock:k",
            "--",
            "dd",
            "if=/dev/urandom",
            "of=/dev/null",
            "bs=1M",
            "count=20",
        ],
    );
    let out = st.dir.join("k.aslr");
    pdinject_aslr(&input, &out, &[]);
    let s = perf_script(&p73, &out, &["--show-mmap-events", "-F", "event,ip"]);
    assert!(
        s.contains("[0xffff800010000000(") && s.contains("@ 0xffff800010000000]"),
        "the kernel map is not at perf's base:\n{}",
        &s[..s.len().min(2000)]
    );
    Ok(())
}
