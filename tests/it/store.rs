//! `--symbol-store DIR` (issue 19), with the real parts started here on 127.0.0.1: a
//! fleet of recordings of small C programs with fixed build IDs (unstripped; stripped
//! with a `.gnu_debuglink` file beside them or in `.debug/`; stripped of debug info
//! only) and a shared library, processed by a one-node Slurm array
//! (examples/slurm-batch.sh with SYMBOL_STORE) into one store; stock elfutils
//! debuginfod started on the store; then, as another machine would (an empty HOME,
//! another hostname where `unshare -u` works, the programs renamed away):
//! `debuginfod-find` returns each stored file byte for byte, `pdinject --debuginfod`
//! fills the cache from it, and `perf script` names the same symbol for every sample
//! as on the recording host. Also: writers killed at every crash point leave no final
//! name that is not whole, and concurrent writers add each ID exactly once.

use super::common::*;
use super::slurm::{Cluster, log_tail};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Programs of the fleet, by how their debug info is kept.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kept {
    /// `-g`, not stripped: the file is its own debug info.
    InFile,
    /// `strip --strip-all` + `.gnu_debuglink` to `NAME.debug` beside it.
    LinkBeside,
    /// The same with the debug file in `.debug/NAME.debug`.
    LinkInDotFolder,
    /// `strip --strip-debug`: symbols, no debug info anywhere.
    None,
}

const KINDS: [Kept; 4] = [
    Kept::InFile,
    Kept::LinkBeside,
    Kept::LinkInDotFolder,
    Kept::None,
];

fn prog_id(k: usize) -> String {
    format!("5707e{k:035x}")
}

const FLEETLIB_ID: &str = "5707e1b0000000000000000000000000000000f1";

const PROG_C: &str = r#"
#include <time.h>
unsigned long fleet_lib_work(unsigned long n);
static volatile unsigned long sink;
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
__attribute__((noinline)) unsigned long FN(unsigned long n)
{
    unsigned long x = 7;
    for (unsigned long i = 0; i < n; i++)
        x = (x ^ (x << 13)) + (x >> 7) + i;
    sink = x;
    return x;
}
int main(void)
{
    double t0 = now_ms();
    while (now_ms() - t0 < 60)
        FN(100000);
    t0 = now_ms();
    while (now_ms() - t0 < 30)
        sink += fleet_lib_work(100000);
    return 0;
}
"#;

const LIB_C: &str = r#"
__attribute__((noinline)) unsigned long fleet_lib_work(unsigned long n)
{
    unsigned long x = 3;
    for (unsigned long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + i;
    return x;
}
"#;

fn sh(cmd: &mut Command) {
    run_ok(cmd);
}

/// Builds the programs and the library into `bin`; returns (name, path, id) of each
/// ELF file a recording maps from `bin`, and the separate debug files by ID.
/// (name, path, build ID) of a file of the fleet.
type FleetFile = (String, PathBuf, String);

fn build_fleet(bin: &Path) -> (Vec<FleetFile>, BTreeMap<String, PathBuf>) {
    fs::create_dir_all(bin.join(".debug")).unwrap();
    fs::write(bin.join("prog.c"), PROG_C).unwrap();
    fs::write(bin.join("lib.c"), LIB_C).unwrap();
    let lib = bin.join("libfleet.so");
    sh(Command::new("gcc")
        .args(["-O1", "-g", "-shared", "-fPIC", "-fno-omit-frame-pointer"])
        .arg(format!("-Wl,--build-id=0x{FLEETLIB_ID}"))
        .arg("-o")
        .arg(&lib)
        .arg(bin.join("lib.c")));
    let mut files = vec![("libfleet.so".to_string(), lib, FLEETLIB_ID.to_string())];
    let mut debug = BTreeMap::new();
    for (k, kind) in KINDS.iter().enumerate() {
        let name = format!("prog{k}");
        let p = bin.join(&name);
        let id = prog_id(k);
        sh(Command::new("gcc")
            .args(["-O1", "-g", "-fno-omit-frame-pointer"])
            .arg(format!("-DFN=fleet_fn_{k}"))
            .arg(format!("-Wl,--build-id=0x{id}"))
            .arg("-o")
            .arg(&p)
            .arg(bin.join("prog.c"))
            .arg(format!("-L{}", bin.display()))
            .args(["-lfleet", "-Wl,-rpath,$ORIGIN"]));
        let dbg_name = format!("{name}.debug");
        let dbg = match kind {
            Kept::LinkBeside => Some(bin.join(&dbg_name)),
            Kept::LinkInDotFolder => Some(bin.join(".debug").join(&dbg_name)),
            _ => None,
        };
        if let Some(d) = &dbg {
            sh(Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(&p)
                .arg(d));
            // objcopy finds the file by the name given; the link holds its base name.
            sh(Command::new("objcopy")
                .arg("--strip-all")
                .arg(format!("--add-gnu-debuglink={}", d.display()))
                .arg(&p));
            debug.insert(id.clone(), d.clone());
        }
        if *kind == Kept::None {
            sh(Command::new("strip").arg("--strip-debug").arg(&p));
        }
        assert_eq!(elf_build_id(&p).as_deref(), Some(id.as_str()), "{name}");
        files.push((name, p, id));
    }
    (files, debug)
}

/// Every file under `store/.build-id`: name (`xx/rest[.debug]`) -> bytes.
fn store_files(store: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    let Ok(heads) = fs::read_dir(store.join(".build-id")) else {
        return m;
    };
    for h in heads.flatten() {
        for f in fs::read_dir(h.path()).unwrap().flatten() {
            m.insert(
                format!(
                    "{}/{}",
                    h.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                ),
                fs::read(f.path()).unwrap(),
            );
        }
    }
    m
}

/// Every final name in the store is whole: its ELF note carries the ID its name
/// says, and it equals the source file it was made from (`sources`: ID -> bytes, for
/// the executables known to the test; `.debug` files by their own note).
fn assert_whole(store: &Path, sources: &BTreeMap<String, Vec<u8>>, what: &str) {
    for (name, bytes) in store_files(store) {
        assert!(
            !name.contains(".tmp"),
            "{what}: a temp file under a final folder: {name}"
        );
        let id = name.replace('/', "");
        let id = id.trim_end_matches(".debug");
        assert_eq!(
            build_id_from_elf_bytes(&bytes).as_deref(),
            Some(id),
            "{what}: {name} is not whole ({} bytes)",
            bytes.len()
        );
        if !name.ends_with(".debug")
            && let Some(src) = sources.get(id)
        {
            assert!(src == &bytes, "{what}: {name} differs from its source");
        }
    }
}

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn have(bin: &str) -> bool {
    Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `debuginfod-find KIND ID` against `url`, with its own client cache; the file's
/// bytes.
fn debuginfod_find(url: &str, cache: &Path, kind: &str, id: &str) -> Option<Vec<u8>> {
    let o = Command::new("debuginfod-find")
        .args([kind, id])
        .env("DEBUGINFOD_URLS", url)
        .env("DEBUGINFOD_CACHE_PATH", cache)
        .env("DEBUGINFOD_TIMEOUT", "10")
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
    fs::read(p).ok()
}

/// `perf script` lines of the samples: time, ip, symbol and DSO of each.
fn samples(perf: &Perf, file: &Path, home: &Path) -> Vec<String> {
    let o = run_ok(
        perf.cmd()
            .env("HOME", home)
            .args(["script", "-F", "time,ip,sym,dso", "-i"])
            .arg(file),
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// `unshare -u` with another hostname, where it works (root): pdinject then sees a
/// recording of another host, as an analysis machine does.
fn other_host(cmd: &Path) -> Command {
    let ok = Command::new("unshare")
        .args(["-u", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Command::new(cmd);
    }
    let mut c = Command::new("unshare");
    c.args([
        "-u",
        "sh",
        "-c",
        "hostname analysis-host && exec \"$0\" \"$@\"",
    ])
    .arg(cmd);
    c
}

#[test]
fn fleet_store_served_by_debuginfod_symbolises_elsewhere() -> Outcome {
    for b in ["debuginfod", "debuginfod-find", "objcopy", "strip"] {
        if !have(b) {
            return skip(format!(
                "{b} not installed (apt install debuginfod binutils)"
            ));
        }
    }
    let perf = can_record()?;
    let tmp = tempfile::Builder::new()
        .prefix("pdinject-store-")
        .tempdir()
        .unwrap();
    let t = tmp.path();
    // Slurm's daemons and munged need to walk into it.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(t, fs::Permissions::from_mode(0o755)).unwrap();
    let bin = t.join("bin");
    let (files, debug) = build_fleet(&bin);

    // The fleet: three recordings of each program, every one called perf.data.
    let fleet = t.join("fleet");
    let mut rels = Vec::new();
    for i in 0..3 * KINDS.len() {
        let k = i % KINDS.len();
        let rel = PathBuf::from(format!("host{i:02}/perf.data"));
        let out = fleet.join(&rel);
        fs::create_dir_all(out.parent().unwrap()).unwrap();
        record_in(&perf, &bin, &out, &["-B", "--", &format!("./prog{k}")]);
        rels.push((rel, k));
    }

    fs::create_dir(t.join("slurm")).unwrap();
    let cluster = Cluster::start(&t.join("slurm"))?;
    let store = t.join("store");
    let out = t.join("out");
    let home = t.join("home");
    fs::create_dir_all(&home).unwrap();
    cluster.run_array(
        4,
        &manifest_dir().join("examples/slurm-batch.sh"),
        &[&fleet, &out],
        &[
            ("PDINJECT", env!("CARGO_BIN_EXE_pdinject").as_ref()),
            ("HOME", home.as_os_str()),
            ("SYMBOL_STORE", store.as_os_str()),
        ],
    );
    drop(cluster);

    // Each ID added by exactly one task, found present by the others; every DSO with
    // an ID stored, or named with its reason.
    let mut added: BTreeMap<String, usize> = BTreeMap::new();
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    let mut dso_ids: BTreeMap<String, String> = BTreeMap::new();
    let mut inputs = 0;
    for k in 0..4 {
        let r = out.join(format!("report-{k}.jsonl"));
        let text = fs::read_to_string(&r).unwrap_or_else(|e| {
            panic!(
                "{}: {e}\n{}",
                r.display(),
                log_tail(&t.join(format!("slurm/task-{k}.out")))
            )
        });
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(sum) = v.get("summary") {
                // The batch's store totals, with each DSO not stored named.
                assert_eq!(sum["store"]["dir"], s(&store), "task {k}: {line}");
                let named = sum["store"]["not_stored_dsos"].as_array().unwrap().len();
                assert!(
                    (named == 0) == (sum["store"]["not_stored"] == 0),
                    "task {k}: {line}"
                );
                continue;
            }
            inputs += 1;
            assert_eq!(v["status"], "ok", "task {k}: {line}");
            let st = &v["store"];
            assert!(st.is_object(), "no store totals: {line}");
            for d in v["dsos"].as_array().unwrap() {
                let Some(id) = d["build_id"].as_str() else {
                    continue;
                };
                let path = d["path"].as_str().unwrap().to_string();
                dso_ids.insert(path.clone(), id.to_string());
                match d["stored"].as_str() {
                    Some("added") => *added.entry(id.to_string()).or_default() += 1,
                    Some("present") => {}
                    Some("not-stored") => {
                        let why = d["store_detail"].as_str().unwrap_or("");
                        assert!(!why.is_empty(), "{path}: not stored without a reason");
                        assert!(
                            st["not_stored_dsos"]
                                .as_array()
                                .unwrap()
                                .iter()
                                .any(|n| n["path"] == path.as_str()),
                            "{path} not named in the totals: {st}"
                        );
                        assert!(
                            !path.starts_with(&*bin.to_string_lossy()),
                            "{path} (one of the fleet's files) not stored: {why}"
                        );
                    }
                    other => panic!("{path}: stored = {other:?}"),
                }
            }
        }
    }
    assert_eq!(inputs, rels.len(), "inputs reported by the array tasks");
    let in_store: BTreeSet<String> = store_files(&store)
        .keys()
        .filter(|n| !n.ends_with(".debug"))
        .map(|n| n.replace('/', ""))
        .collect();
    for (id, n) in &added {
        assert_eq!(*n, 1, "{id} added {n} times");
        assert!(
            in_store.contains(id),
            "{id} reported added, not in the store"
        );
    }
    assert_eq!(
        added.keys().cloned().collect::<BTreeSet<_>>(),
        in_store,
        "IDs added against IDs in the store"
    );
    for (_, _, id) in &files {
        assert!(in_store.contains(id), "{id} not in the store");
    }

    // The store holds each distinct file once, whole, equal to its source.
    let mut sources: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (path, id) in &dso_ids {
        if path.starts_with('/') {
            sources.insert(id.clone(), fs::read(path).unwrap());
        }
    }
    assert_whole(&store, &sources, "after the array");
    for (name, bytes) in store_files(&store) {
        let id = name.replace('/', "");
        *sizes.entry(id).or_default() += bytes.len() as u64;
    }
    let total: u64 = sizes.values().sum();
    let mut distinct: u64 = in_store
        .iter()
        .filter_map(|id| sources.get(id))
        .map(|b| b.len() as u64)
        .sum();
    for name in store_files(&store).keys().filter(|n| n.ends_with(".debug")) {
        distinct += fs::metadata(store.join(".build-id").join(name))
            .unwrap()
            .len();
    }
    // The vdso image is the one ID without a source path.
    let vdso = dso_ids.get("[vdso]").filter(|id| in_store.contains(*id));
    if let Some(id) = vdso {
        distinct += sizes[id];
    }
    assert_eq!(
        total, distinct,
        "store size against the distinct files' sum"
    );
    for (id, d) in &debug {
        let name = format!("{}/{}.debug", &id[..2], &id[2..]);
        assert!(
            store_files(&store).get(&name) == Some(&fs::read(d).unwrap()),
            "{name}: the .gnu_debuglink file {} is not stored as it is",
            d.display()
        );
    }
    assert!(
        !store.join(".tmp").exists() || fs::read_dir(store.join(".tmp")).unwrap().count() == 0,
        "temp files left"
    );

    // The recording host's view, with the programs in place, by each perf there is.
    let perfs: Vec<Perf> = [Some(perf.clone()), part(perf612()), part(perf73())]
        .into_iter()
        .flatten()
        .collect();
    let host_view: Vec<Vec<Vec<String>>> = perfs
        .iter()
        .map(|pf| {
            rels.iter()
                .map(|(rel, _)| samples(pf, &out.join(rel), &home))
                .collect()
        })
        .collect();
    for (pf, view) in perfs.iter().zip(&host_view) {
        for (i, (rel, k)) in rels.iter().enumerate() {
            let want = format!("fleet_fn_{k}");
            assert!(
                view[i].iter().any(|l| l.contains(&want)),
                "{} {}: no sample in {want} on the recording host:\n{}",
                pf.name,
                rel.display(),
                view[i].join("\n")
            );
        }
    }

    // debuginfod on the store.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("debuginfod")
        .args(["-p", &port.to_string(), "-d"])
        .arg(t.join("db.sqlite"))
        .arg("-F")
        .arg(&store)
        .env("HOME", &home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        return skip("debuginfod does not start");
    };
    let _server = Server(child);
    let url = format!("http://127.0.0.1:{port}");
    let client = t.join("client-cache");
    // Polled without debuginfod-find, whose client cache would remember a miss.
    let ready = (0..300).any(|_| {
        let ok = in_store.iter().all(|id| debuginfod_serves(&url, id));
        if !ok {
            std::thread::sleep(Duration::from_millis(100));
        }
        ok
    });
    if !ready {
        return skip("debuginfod did not serve the store within 30 s");
    }

    // Another machine: the programs gone, an empty HOME.
    let away = t.join("bin.away");
    fs::rename(&bin, &away).unwrap();
    let moved = |p: &Path| away.join(p.strip_prefix(&bin).unwrap());
    for (name, p, id) in &files {
        let served = debuginfod_find(&url, &client, "executable", id);
        assert!(
            served == Some(fs::read(moved(p)).unwrap()),
            "{name}: debuginfod-find executable {id} is not the file byte for byte"
        );
        let want_debug = match debug.get(id) {
            Some(d) => Some(fs::read(moved(d)).unwrap()),
            // Unstripped: the file is its own debug info.
            None if *name == "prog0" || *name == "libfleet.so" => Some(fs::read(moved(p)).unwrap()),
            None => None,
        };
        assert!(
            debuginfod_find(&url, &client, "debuginfo", id) == want_debug,
            "{name}: debuginfod-find debuginfo {id}"
        );
    }
    for (id, src) in &sources {
        assert!(
            debuginfod_find(&url, &client, "executable", id).as_ref() == Some(src),
            "{id}: not served byte for byte"
        );
    }
    let home2 = t.join("home2");
    fs::create_dir_all(&home2).unwrap();
    let ana = t.join("analysis");
    fs::create_dir_all(&ana).unwrap();
    let mut fetched = BTreeSet::new();
    for (i, (rel, _)) in rels.iter().enumerate() {
        let a = ana.join(format!("{i}.data"));
        let rep = ana.join(format!("{i}.json"));
        let o = run(other_host(Path::new(env!("CARGO_BIN_EXE_pdinject")))
            .env("HOME", &home2)
            .args(["-q", "--debuginfod", &url, "--report"])
            .arg(&rep)
            .arg(out.join(rel))
            .arg(&a));
        assert!(o.status.success(), "{}: {}", rel.display(), tail(&o.stderr));
        let r = read_report(&rep);
        for (name, p, _) in &files {
            if let Some(d) = report_dso(&r, &s(p)) {
                // Fetched by the first recording that maps it, then in the cache.
                match d["cached"].as_str() {
                    Some("fetched") => {
                        assert!(fetched.insert(name.clone()), "{name} fetched twice")
                    }
                    Some("present") => assert!(
                        fetched.contains(name),
                        "{name} present before it was fetched"
                    ),
                    other => panic!("{name}: cached {other:?}: {}", report_summary(&r)),
                }
            }
        }
        for (pf, view) in perfs.iter().zip(&host_view) {
            let got = samples(pf, &a, &home2);
            assert_eq!(
                got.len(),
                view[i].len(),
                "{} {}: sample count",
                pf.name,
                rel.display()
            );
            for (g, h) in got.iter().zip(&view[i]) {
                assert_eq!(
                    g,
                    h,
                    "{} {}: a sample symbolised differently on the analysis machine",
                    pf.name,
                    rel.display()
                );
            }
        }
    }
    Ok(())
}

/// A run killed (SIGKILL) at each of its store crash points in turn (half a file
/// copied; a file whole and synced, not linked), with unnamed and with named temp
/// files: no final name is ever a partial or wrong file, and the next run completes
/// the store. Named temp files older than an hour are removed, younger ones kept.
#[test]
fn killed_writers_leave_only_whole_files() -> Outcome {
    let st = setup("killed_writers_leave_only_whole_files")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let mut sources = BTreeMap::new();
    for (p, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
        sources.insert(id.to_string(), fs::read(p).unwrap());
    }
    for named in [false, true] {
        let store = st.dir.join(format!("store-{named}"));
        let mut killed = 0;
        for n in 1..=40 {
            let mut c = pdinject();
            c.env("PDINJECT_TEST_STORE_ABORT", n.to_string())
                .args(["-q", "-N", "--symbol-store", &s(&store)])
                .arg(&rec)
                .arg(st.dir.join("k.data"));
            if named {
                c.env("PDINJECT_TEST_STORE_NAMED_TEMPS", "1");
            }
            let o = run(&mut c);
            assert_whole(
                &store,
                &sources,
                &format!("killed at point {n} ({})", status_str(&o)),
            );
            if o.status.success() {
                break;
            }
            killed += 1;
        }
        assert!(killed >= 4, "only {killed} crash points reached");
        // Named temp files of killed writers are there (young), none under a final name.
        let tmp = store.join(".tmp");
        let left = fs::read_dir(&tmp).map_or(0, |d| d.count());
        if named {
            assert!(left > 0, "killed writers left no named temp file");
            let old = tmp.join("oldhost-1-1.pdinject.tmp");
            fs::write(&old, b"partial").unwrap();
            run_ok(Command::new("touch").args(["-d", "2 hours ago"]).arg(&old));
            let young = tmp.join("younghost-1-1.pdinject.tmp");
            fs::write(&young, b"partial").unwrap();
            fs::remove_dir_all(store.join(".build-id")).unwrap();
            let mut c = pdinject();
            c.env("PDINJECT_TEST_STORE_NAMED_TEMPS", "1")
                .args(["-q", "-N", "--symbol-store", &s(&store)])
                .arg(&rec)
                .arg(st.dir.join("k.data"));
            run_ok(&mut c);
            assert!(!old.exists(), "a temp file two hours old was kept");
            assert!(young.exists(), "a young temp file was removed");
        } else {
            assert_eq!(left, 0, "unnamed temp files left names");
        }
        let (_, r) = pdinject_ok(
            &rec,
            &st.dir.join("done.data"),
            &["-N", "--symbol-store", &s(&store)],
        );
        assert_whole(&store, &sources, "after a full run");
        for (path, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
            let d = report_dso(&r, &s(path)).unwrap();
            assert_eq!(d["stored"], "present", "{}", report_summary(&r));
            let f = store.join(".build-id").join(&id[..2]).join(&id[2..]);
            assert!(fs::read(f).unwrap() == fs::read(path).unwrap(), "{id}");
        }
    }
    Ok(())
}

/// Four runs filling one store at once (named temp files, as on NFS): each ID is
/// added by exactly one of them, every file is whole, and the second run of each
/// costs no write.
#[test]
fn concurrent_writers_add_each_id_once() -> Outcome {
    let st = setup("concurrent_writers_add_each_id_once")?;
    let rec = record_prog(&st, &["-B"], "rec.data");
    let store = st.dir.join("store");
    for named in [true, false] {
        let _ = fs::remove_dir_all(&store);
        let children: Vec<_> = (0..4)
            .map(|i| {
                let mut c = pdinject();
                if named {
                    c.env("PDINJECT_TEST_STORE_NAMED_TEMPS", "1");
                }
                c.args(["-q", "-N", "--symbol-store", &s(&store), "--report"])
                    .arg(st.dir.join(format!("r{i}.json")))
                    .arg(&rec)
                    .arg(st.dir.join(format!("o{i}.data")))
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success());
        }
        let mut added: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..4 {
            let r = read_report(&st.dir.join(format!("r{i}.json")));
            for d in r["dsos"].as_array().unwrap() {
                if d["stored"] == "added" {
                    *added
                        .entry(d["build_id"].as_str().unwrap().to_string())
                        .or_default() += 1;
                }
            }
        }
        for id in [PROG_ID, LIB_ID] {
            assert_eq!(added.get(id), Some(&1), "{id} (named temps: {named})");
        }
        let mut sources = BTreeMap::new();
        for (p, id) in [(&st.fx.prog, PROG_ID), (&st.fx.libfix, LIB_ID)] {
            sources.insert(id.to_string(), fs::read(p).unwrap());
        }
        assert_whole(&store, &sources, "after four writers");
        let (_, r) = pdinject_ok(
            &rec,
            &st.dir.join("again.data"),
            &["-N", "--symbol-store", &s(&store)],
        );
        assert_eq!(r["store"]["added"], 0, "{}", report_summary(&r));
        assert_eq!(r["store"]["bytes_added"], 0);
    }
    Ok(())
}
