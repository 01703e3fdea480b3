//! Batch mode on a real Slurm cluster: munged, slurmctld and slurmd (Debian's munge and
//! slurm-wlm) started by the test on this machine, every file of theirs in a temp dir
//! (config through SLURM_CONF and `-f`, munged's socket, key, log and pid through its
//! flags: /etc is not touched), ports on 127.0.0.1 found free. The README's script
//! (examples/slurm-batch.sh) runs as `sbatch --array=0-3 --wait` over a fleet of
//! copies; each output must exist exactly once, written by exactly one array task, and
//! equal a single-file run's output byte for byte. Every daemon is stopped after, also
//! when the test fails (a Drop guard). Where Slurm cannot start, the test ends
//! ignored saying why (a failure under PDINJECT_TEST_STRICT).

use super::common::*;
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The daemons started, stopped (SIGTERM, then SIGKILL) in reverse order on drop.
pub(super) struct Daemons {
    children: Vec<(&'static str, Child)>,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        while let Some((_, mut c)) = self.children.pop() {
            // SAFETY: kill with a pid of a child this test started and has not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Daemons {
    fn start(&mut self, name: &'static str, cmd: &mut Command, log: &Path) -> Result<(), Skip> {
        let out = std::fs::File::create(log).ok();
        let err = out.as_ref().and_then(|f| f.try_clone().ok());
        match cmd
            .stdin(Stdio::null())
            .stdout(out.map_or(Stdio::null(), Stdio::from))
            .stderr(err.map_or(Stdio::null(), Stdio::from))
            .spawn()
        {
            Ok(c) => {
                self.children.push((name, c));
                Ok(())
            }
            Err(e) => skip(format!("cannot start {name}: {e}")),
        }
    }

    /// Names of daemons that have exited.
    fn dead(&mut self) -> Vec<&'static str> {
        self.children
            .iter_mut()
            .filter_map(|(n, c)| (!matches!(c.try_wait(), Ok(None))).then_some(*n))
            .collect()
    }
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

fn user_ids(name: &str) -> Option<(u32, u32)> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam returns NULL or a pointer to static storage, read at once.
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: non-null result of getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn free_port() -> Option<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    l.local_addr().ok().map(|a| a.port())
}

fn hostname() -> String {
    let o = Command::new("hostname").output();
    o.ok()
        .map(|o| {
            // slurmd goes by the short name.
            let h = String::from_utf8_lossy(&o.stdout);
            h.trim().split('.').next().unwrap_or("").to_string()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub(super) fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Waits until `ok()` or `limit`; false on timeout.
fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The recordings of the fleet: demo.data and, when present, some of the shared
/// quipper corpus (copied into the test's temp dir only).
fn fleet_sources() -> Vec<PathBuf> {
    let mut v = vec![manifest_dir().join("testdata/demo/demo.data")];
    let q = manifest_dir().join("../shared/testdata/quipper");
    for n in [
        "perf.data.singleprocess-3.8",
        "perf.data.callgraph-3.8",
        "perf.data.systemwide.0-3.8",
        "perf.data.branch-4.14",
        "perf.data.group_desc-4.14",
        "perf.data.piped.target-3.8",
        "perf.data.lost_samples-4.4",
    ] {
        if q.join(n).is_file() {
            v.push(q.join(n));
        }
    }
    v
}

/// A one-node Slurm cluster running in `t` (see the module's comment).
pub(super) struct Cluster {
    /// Stopped when the cluster is dropped.
    _daemons: Daemons,
    conf: PathBuf,
    dir: PathBuf,
    bins: BTreeMap<&'static str, PathBuf>,
}

impl Cluster {
    /// A Slurm command (`sbatch`, `sinfo`) talking to this cluster.
    pub(super) fn cmd(&self, bin: &str) -> Command {
        let mut c = Command::new(&self.bins[bin]);
        c.env("SLURM_CONF", &self.conf).current_dir(&self.dir);
        c
    }

    /// `sbatch --wait --array=0-(tasks-1) --cpus-per-task=1 SCRIPT ARGS` with `envs`;
    /// panics with the tasks' and daemons' logs when it fails. Task K's output is
    /// `DIR/task-K.out`.
    pub(super) fn run_array(
        &self,
        tasks: usize,
        script: &Path,
        args: &[&Path],
        envs: &[(&str, &std::ffi::OsStr)],
    ) {
        let t = &self.dir;
        let mut c = self.cmd("sbatch");
        c.arg("--wait")
            .arg(format!("--array=0-{}", tasks - 1))
            .arg("--cpus-per-task=1")
            .arg(format!("--output={}/task-%a.out", t.display()))
            .arg(script)
            .args(args);
        for (k, v) in envs {
            c.env(k, v);
        }
        let o = run_timeout(&mut c, Duration::from_secs(300));
        let tasks_out: String = (0..tasks)
            .map(|k| {
                format!(
                    "task {k}:\n{}\n",
                    log_tail(&t.join(format!("task-{k}.out")))
                )
            })
            .collect();
        let o = o.unwrap_or_else(|| {
            panic!(
                "sbatch --wait did not finish in 300 s\n{tasks_out}slurmctld:\n{}",
                log_tail(&t.join("slurmctld.log"))
            )
        });
        assert!(
            o.status.success(),
            "sbatch --wait --array=0-{} failed ({}): {}\n{tasks_out}slurmctld:\n{}\nslurmd:\n{}",
            tasks - 1,
            status_str(&o),
            tail(&o.stderr),
            log_tail(&t.join("slurmctld.log")),
            log_tail(&t.join("slurmd.log"))
        );
    }

    /// Starts munged, slurmctld and slurmd with every file in `t`; a `Skip` saying
    /// why where they cannot run.
    pub(super) fn start(t: &Path) -> Result<Cluster, Skip> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return skip("needs root (munged runs as user munge, slurmd as root)");
        }
        let mut bins = BTreeMap::new();
        for b in [
            "munged",
            "slurmctld",
            "slurmd",
            "sbatch",
            "sinfo",
            "hostname",
        ] {
            match which(b) {
                Some(p) => {
                    bins.insert(b, p);
                }
                None => {
                    return skip(format!("{b} not found (apt-get install slurm-wlm munge)"));
                }
            }
        }
        let Some((munge_uid, munge_gid)) = user_ids("munge") else {
            return skip("no user munge (apt-get install munge)");
        };

        // munged checks every directory on the way to its socket: readable and executable
        // for all, not writable by others.
        let chmod = |p: &Path, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        chmod(t, 0o755);
        let metc = t.join("munge-etc");
        let mrun = t.join("munge-run");
        for (d, mode) in [(&metc, 0o700), (&mrun, 0o755)] {
            std::fs::create_dir(d).unwrap();
            chmod(d, mode);
            std::os::unix::fs::chown(d, Some(munge_uid), Some(munge_gid)).unwrap();
        }
        let key = metc.join("munge.key");
        let mut kbytes = vec![0u8; 1024];
        let mut f = std::fs::File::open("/dev/urandom").unwrap();
        std::io::Read::read_exact(&mut f, &mut kbytes).unwrap();
        std::fs::write(&key, &kbytes).unwrap();
        chmod(&key, 0o600);
        std::os::unix::fs::chown(&key, Some(munge_uid), Some(munge_gid)).unwrap();
        let socket = mrun.join("munge.socket");

        let mut daemons = Daemons {
            children: Vec::new(),
        };
        let mut munged = Command::new(&bins["munged"]);
        munged
            .arg("--foreground")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--log-file={}", metc.join("munged.log").display()))
            .arg(format!("--pid-file={}", mrun.join("munged.pid").display()))
            .arg(format!(
                "--seed-file={}",
                metc.join("munged.seed").display()
            ))
            .uid(munge_uid)
            .gid(munge_gid);
        let munged_log = t.join("munged.out");
        daemons.start("munged", &mut munged, &munged_log)?;
        if !wait_for(Duration::from_secs(15), || socket.exists()) {
            return skip(format!(
                "munged did not start (no socket after 15 s):\n{}",
                log_tail(&munged_log)
            ));
        }

        let (Some(p_ctld), Some(p_d)) = (free_port(), free_port()) else {
            return skip("no free TCP port on 127.0.0.1");
        };
        let host = hostname();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for d in ["state", "spool"] {
            std::fs::create_dir(t.join(d)).unwrap();
        }
        let conf = t.join("slurm.conf");
        let td = t.display();
        // MinJobAge=4 keeps `sbatch --wait` polling every 2 s (it backs off to 32 s
        // while the wait is below half the age); CR_CPU schedules CPUs only (with memory
        // as a resource each task asks for the whole node's and the tasks run one after
        // another, 3 s apart): the test takes ~8 s instead of ~42 s.
        std::fs::write(
            &conf,
            format!(
                "ClusterName=pdinject
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={p_ctld}
SlurmdPort={p_d}
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={td}/state
SlurmdSpoolDir={td}/spool
SlurmctldPidFile={td}/slurmctld.pid
SlurmdPidFile={td}/slurmd.pid
SlurmctldLogFile={td}/slurmctld.log
SlurmdLogFile={td}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=4
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=pdinject Nodes=ALL Default=YES MaxTime=INFINITE State=UP
",
                socket = socket.display()
            ),
        )
        .unwrap();
        let slurm = |bin: &str| {
            let mut c = Command::new(&bins[bin]);
            c.env("SLURM_CONF", &conf).current_dir(t);
            c
        };
        let ctld_log = t.join("slurmctld.out");
        let d_log = t.join("slurmd.out");
        daemons.start(
            "slurmctld",
            slurm("slurmctld").arg("-D").arg("-f").arg(&conf),
            &ctld_log,
        )?;
        daemons.start(
            "slurmd",
            slurm("slurmd")
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .arg("-N")
                .arg(&host),
            &d_log,
        )?;
        let idle = wait_for(Duration::from_secs(30), || {
            let o = slurm("sinfo").args(["-h", "-o", "%T"]).output();
            o.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        if !idle {
            return skip(format!(
                "Slurm did not come up (dead: {:?}); slurmctld:\n{}\n{}\nslurmd:\n{}\n{}",
                daemons.dead(),
                log_tail(&ctld_log),
                log_tail(&t.join("slurmctld.log")),
                log_tail(&d_log),
                log_tail(&t.join("slurmd.log"))
            ));
        }
        Ok(Cluster {
            _daemons: daemons,
            conf,
            dir: t.to_path_buf(),
            bins,
        })
    }
}

#[test]
fn slurm_array_batch() -> Outcome {
    let tmp = tempfile::Builder::new()
        .prefix("pdinject-slurm-")
        .tempdir()
        .unwrap();
    let t = tmp.path();
    let cluster = Cluster::start(t)?;
    // The fleet: every host's recording is called perf.data.
    let fleet = t.join("fleet");
    let sources = fleet_sources();
    let mut rels = Vec::new();
    for i in 0..12 {
        let rel = PathBuf::from(format!("host{i:02}/perf.data"));
        std::fs::create_dir_all(fleet.join(&rel).parent().unwrap()).unwrap();
        std::fs::copy(&sources[i % sources.len()], fleet.join(&rel)).unwrap();
        rels.push(rel);
    }
    let out = t.join("out");
    let script = manifest_dir().join("examples/slurm-batch.sh");
    cluster.run_array(
        4,
        &script,
        &[&fleet, &out],
        &[
            ("PDINJECT", env!("CARGO_BIN_EXE_pdinject").as_ref()),
            ("HOME", test_home().as_os_str()),
        ],
    );
    let tasks_out: String = (0..4)
        .map(|k| {
            format!(
                "task {k}:\n{}\n",
                log_tail(&t.join(format!("task-{k}.out")))
            )
        })
        .collect();

    // Every input in exactly one task's report, done there.
    let mut owner: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for k in 0..4 {
        let r = out.join(format!("report-{k}.jsonl"));
        let text = std::fs::read_to_string(&r)
            .unwrap_or_else(|e| panic!("{}: {e}\n{tasks_out}", r.display()));
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v.get("summary").is_some() {
                continue;
            }
            assert_eq!(v["status"], "ok", "task {k}: {line}");
            owner
                .entry(v["input"].as_str().unwrap().to_string())
                .or_default()
                .push(k);
        }
    }
    let expected: BTreeMap<String, Vec<usize>> = rels
        .iter()
        .map(|r| (fleet.join(r).display().to_string(), Vec::new()))
        .collect();
    assert_eq!(
        owner.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "inputs reported by the array tasks"
    );
    for (input, tasks) in &owner {
        assert_eq!(tasks.len(), 1, "{input} processed by tasks {tasks:?}");
    }
    let used: std::collections::BTreeSet<_> = owner.values().flatten().collect();
    assert!(
        used.len() > 1,
        "all inputs went to one task ({used:?}): the shards do not split"
    );

    // The output tree holds exactly the expected outputs, each equal to a
    // single-file run's.
    let mut found = Vec::new();
    collect_files(&out, &out, &mut found);
    found.retain(|r| !r.starts_with(".pdinject") && !r.to_string_lossy().starts_with("report-"));
    found.sort();
    assert_eq!(found, rels, "files under {}", out.display());
    let single = t.join("single");
    std::fs::create_dir(&single).unwrap();
    for (n, rel) in rels.iter().enumerate() {
        let s = single.join(format!("{n}.data"));
        run_ok(
            pdinject()
                .args(["--buildids", "-q"])
                .arg(fleet.join(rel))
                .arg(&s),
        );
        assert!(
            std::fs::read(&s).unwrap() == std::fs::read(out.join(rel)).unwrap(),
            "{}: the array's output differs from a single-file run's",
            rel.display()
        );
    }
    drop(cluster);
    Ok(())
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_files(root, &p, out);
        } else {
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}
