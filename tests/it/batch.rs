//! `pdinject batch` on one machine: outputs equal single-file runs, a damaged input
//! among good ones, reruns that skip finished outputs, shards that split the inputs
//! exactly, lists from stdin, suffixed outputs and usage errors.

use super::common::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// A fleet of `n` hosts, each with a perf.data (copies of demo.data and of a few
/// quipper recordings when the shared corpus is there).
fn fleet(dir: &Path, n: usize) -> Vec<PathBuf> {
    let mut sources = vec![manifest_dir().join("testdata/demo/demo.data")];
    let q = manifest_dir().join("../shared/testdata/quipper");
    for name in [
        "perf.data.singleprocess-3.8",
        "perf.data.piped.target-3.8",
        "perf.data.group_desc-4.14",
    ] {
        if q.join(name).is_file() {
            sources.push(q.join(name));
        }
    }
    (0..n)
        .map(|i| {
            let rel = PathBuf::from(format!("host{i:03}/perf.data"));
            std::fs::create_dir_all(dir.join(&rel).parent().unwrap()).unwrap();
            std::fs::copy(&sources[i % sources.len()], dir.join(&rel)).unwrap();
            rel
        })
        .collect()
}

/// The report's input lines by input path.
fn report_lines(p: &Path) -> BTreeMap<String, serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("summary").is_none())
        .map(|v| (v["input"].as_str().unwrap().to_string(), v))
        .collect()
}

fn summary(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap();
    let last = text.lines().last().unwrap();
    serde_json::from_str::<serde_json::Value>(last).unwrap()["summary"].clone()
}

#[test]
fn batch_fleet_damaged_input_and_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let fl = tmp.path().join("fleet");
    let rels = fleet(&fl, 9);
    // A damaged recording among them: cut inside its data section.
    let bad_rel = PathBuf::from("host-bad/perf.data");
    std::fs::create_dir_all(fl.join("host-bad")).unwrap();
    let demo = std::fs::read(manifest_dir().join("testdata/demo/demo.data")).unwrap();
    std::fs::write(fl.join(&bad_rel), &demo[..demo.len() / 2]).unwrap();
    // Not a recording: the walk leaves it out.
    std::fs::write(fl.join("host000/notes.txt"), b"hello").unwrap();
    let out = tmp.path().join("out");
    // What an interrupted batch leaves: a temp file of a process that is gone.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    // The name is TempOutput's; the bytes begin as a perf.data does.
    let temp = pdinject::testing::write::temp_name(gone_pid, 0);
    let stale = out.join("host001").join(&temp);
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, &demo[..4096]).unwrap();
    // One left in the input tree too: the walk does not take it for a recording.
    std::fs::write(fl.join("host000").join(&temp), &demo[..4096]).unwrap();
    let report = tmp.path().join("r.jsonl");
    let o = pdinject_run([
        "batch".as_ref(),
        "--buildids".as_ref(),
        "--out-dir".as_ref(),
        out.as_os_str(),
        "--report".as_ref(),
        report.as_os_str(),
        fl.as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "some failed: {err}");
    let bad = fl.join(&bad_rel).display().to_string();
    let error_lines: Vec<&str> = err.lines().filter(|l| !l.contains(" inputs")).collect();
    assert_eq!(error_lines.len(), 1, "one error line: {err}");
    assert!(error_lines[0].contains(&bad), "names the file: {err}");
    assert!(
        !out.join(&bad_rel).exists(),
        "no output for the damaged file"
    );
    assert!(!stale.exists(), "the stale temp file is removed");
    let lines = report_lines(&report);
    assert_eq!(lines.len(), rels.len() + 1);
    assert_eq!(lines[&bad]["status"], "failed");
    let s = summary(&report);
    assert_eq!((s["ok"].as_u64(), s["failed"].as_u64()), (Some(9), Some(1)));
    for (n, rel) in rels.iter().enumerate() {
        assert_eq!(lines[&fl.join(rel).display().to_string()]["status"], "ok");
        let single = tmp.path().join(format!("single{n}.data"));
        run_ok(
            pdinject()
                .args(["--buildids", "-q"])
                .arg(fl.join(rel))
                .arg(&single),
        );
        assert!(
            std::fs::read(&single).unwrap() == std::fs::read(out.join(rel)).unwrap(),
            "{}: batch output differs from the single-file run's",
            rel.display()
        );
    }

    // Rerun: everything finished is skipped; the damaged file fails again.
    let o = pdinject_run([
        "batch".as_ref(),
        "-b".as_ref(),
        "--out-dir".as_ref(),
        out.as_os_str(),
        "--report".as_ref(),
        report.as_os_str(),
        fl.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(3));
    let s = summary(&report);
    assert_eq!(
        (
            s["skipped"].as_u64(),
            s["failed"].as_u64(),
            s["ok"].as_u64()
        ),
        (Some(9), Some(1), Some(0)),
        "{s}"
    );
    // A changed input, or other options, make it redone.
    let touched = fl.join(&rels[0]);
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&touched)
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let o = pdinject_run([
        "batch".as_ref(),
        "-b".as_ref(),
        "--out-dir".as_ref(),
        out.as_os_str(),
        "--report".as_ref(),
        report.as_os_str(),
        fl.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(3));
    let lines = report_lines(&report);
    assert_eq!(lines[&touched.display().to_string()]["status"], "ok");
    assert_eq!(summary(&report)["skipped"].as_u64(), Some(8));
    let o = pdinject_run([
        "batch".as_ref(),
        "--buildid-all".as_ref(),
        "--out-dir".as_ref(),
        out.as_os_str(),
        "--report".as_ref(),
        report.as_os_str(),
        fl.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(summary(&report)["skipped"].as_u64(), Some(0));
}

#[test]
fn batch_shards_split_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let fl = tmp.path().join("fleet");
    let rels = fleet(&fl, 40);
    let out = tmp.path().join("out");
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    for k in 1..=4 {
        let report = tmp.path().join(format!("r{k}.jsonl"));
        let o = pdinject_run([
            "batch".as_ref(),
            "-b".as_ref(),
            "--shard".as_ref(),
            format!("{k}/4").as_ref(),
            "--out-dir".as_ref(),
            out.as_os_str(),
            "--report".as_ref(),
            report.as_os_str(),
            fl.as_os_str(),
        ]);
        assert!(o.status.success(), "{}", tail(&o.stderr));
        for (input, v) in report_lines(&report) {
            assert_eq!(v["status"], "ok");
            *owners.entry(input).or_default() += 1;
        }
    }
    assert_eq!(owners.len(), rels.len());
    assert!(owners.values().all(|&n| n == 1), "{owners:?}");
    for rel in &rels {
        assert!(out.join(rel).is_file(), "{}", rel.display());
    }
    // --shard auto as a Slurm array task and as a Kubernetes Indexed Job pod.
    let report = tmp.path().join("auto.jsonl");
    let o = run(pdinject()
        .args(["batch", "-b", "--force", "--shard", "auto", "--out-dir"])
        .arg(&out)
        .arg("--report")
        .arg(&report)
        .arg(&fl)
        .env("SLURM_ARRAY_TASK_ID", "2")
        .env("SLURM_ARRAY_TASK_MIN", "1")
        .env("SLURM_ARRAY_TASK_MAX", "4"));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let slurm: Vec<String> = report_lines(&report).into_keys().collect();
    let o = run(pdinject()
        .args(["batch", "-b", "--force", "--shard", "auto", "--out-dir"])
        .arg(&out)
        .arg("--report")
        .arg(&report)
        .arg(&fl)
        .env("JOB_COMPLETION_INDEX", "1")
        .env("PDINJECT_SHARD_COUNT", "4"));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let k8s: Vec<String> = report_lines(&report).into_keys().collect();
    let second: Vec<String> = owners
        .keys()
        .filter(|i| report_lines(&tmp.path().join("r2.jsonl")).contains_key(*i))
        .cloned()
        .collect();
    assert_eq!(slurm, second);
    assert_eq!(k8s, second);
}

#[test]
fn batch_list_suffix_and_usage() {
    let tmp = tempfile::tempdir().unwrap();
    let fl = tmp.path().join("fleet");
    let rels = fleet(&fl, 3);
    // --from -: paths on stdin, outputs beside the inputs.
    let mut child = pdinject()
        .args(["batch", "-b", "--suffix", ".bid", "--from", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let list: String = rels
        .iter()
        .map(|r| format!("{}\n\n", fl.join(r).display()))
        .collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for rel in &rels {
        let mut bid = fl.join(rel).into_os_string();
        bid.push(".bid");
        assert!(Path::new(&bid).is_file());
    }
    // Walking the same folder again does not take the .bid outputs for inputs.
    let report = tmp.path().join("r.jsonl");
    let o = pdinject_run([
        "batch".as_ref(),
        "-b".as_ref(),
        "--suffix".as_ref(),
        ".bid".as_ref(),
        "--report".as_ref(),
        report.as_os_str(),
        fl.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let s = summary(&report);
    assert_eq!(
        (s["inputs"].as_u64(), s["skipped"].as_u64()),
        (Some(3), Some(3)),
        "{s}"
    );
    // Usage errors: exit 2, a clear message.
    for (args, says) in [
        (
            vec!["--in-place", "--out-dir", "x"],
            "neither --out-dir nor --suffix",
        ),
        (vec![], "--out-dir DIR or --suffix"),
        (vec!["--out-dir", "x", "--shard", "5/4"], "K/N"),
        (
            vec!["--out-dir", "x", "--shard", "auto"],
            "not in a Slurm job array",
        ),
    ] {
        let mut c = pdinject();
        c.arg("batch").args(&args).arg(&fl);
        c.env_remove("SLURM_ARRAY_TASK_ID")
            .env_remove("JOB_COMPLETION_INDEX");
        let o = run(&mut c);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A marker that cannot be written: the outputs stand, a warning says a rerun
    // will redo them.
    let out = tmp.path().join("o-nomarker");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(".pdinject"), b"in the way").unwrap();
    for _ in 0..2 {
        let o = pdinject_run([
            "batch".as_ref(),
            "-b".as_ref(),
            "--out-dir".as_ref(),
            out.as_os_str(),
            fl.as_os_str(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert_eq!(err.matches("warning:").count(), 3, "{err}");
        assert!(err.contains("3 done, 0 up to date"), "{err}");
    }
    // Only damaged inputs: exit 1.
    let junk = tmp.path().join("junk.data");
    std::fs::write(&junk, b"PERFILE2 but nothing else").unwrap();
    let o = pdinject_run([
        "batch".as_ref(),
        "--out-dir".as_ref(),
        tmp.path().join("o2").as_os_str(),
        junk.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", tail(&o.stderr));
}

/// The docs link the example files instead of pasting them: the Slurm test runs the
/// script, `k8s_job_pod_command` the Job's pod command (that the links resolve is
/// tests/it/docs.rs's).
#[test]
fn docs_link_the_examples() {
    let read = |f: &str| std::fs::read_to_string(manifest_dir().join(f)).unwrap();
    let (readme, guide) = (read("README.md"), read("docs/batch.md"));
    for f in ["examples/slurm-batch.sh", "examples/k8s-indexed-job.yaml"] {
        assert!(
            manifest_dir().join(f).is_file(),
            "{f} is gone: the docs link it"
        );
        assert!(
            readme.contains(&format!("]({f})")),
            "README.md does not link {f}"
        );
        assert!(
            guide.contains(&format!("](../{f})")),
            "docs/batch.md does not link {f}"
        );
    }
}

/// What a pod of examples/k8s-indexed-job.yaml runs, read from the file's text: the
/// folded (`>-`) third item of the container's `command` (YAML joins its lines with
/// spaces), `completions` and the `PDINJECT_SHARD_COUNT` value.
struct PodJob {
    command: Vec<String>,
    completions: usize,
    shard_count: String,
}

fn read_k8s_job(text: &str) -> PodJob {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.trim() == what)
            .unwrap_or_else(|| panic!("k8s example: no line `{what}`"))
    };
    let completions = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("completions:"))
        .expect("k8s example: no completions")
        .trim()
        .parse()
        .expect("k8s example: completions is a number");
    let env = at("- name: PDINJECT_SHARD_COUNT");
    let shard_count = lines[env + 1]
        .trim()
        .strip_prefix("value:")
        .expect("k8s example: PDINJECT_SHARD_COUNT has a value on the next line")
        .trim()
        .trim_matches('"')
        .to_string();
    // command: - sh, - -c, comments, then `- >-` and its more indented lines.
    let cmd = at("command:");
    let mut command = Vec::new();
    let mut i = cmd + 1;
    while i < lines.len() && indent(lines[i]) > indent(lines[cmd]) {
        let l = lines[i].trim();
        i += 1;
        if l.starts_with('#') {
            continue;
        }
        let item = l.strip_prefix("- ").expect("k8s example: a command item");
        if item == ">-" {
            let start = i;
            while i < lines.len() && indent(lines[i]) > indent(lines[start - 1]) {
                i += 1;
            }
            let folded: Vec<&str> = lines[start..i].iter().map(|l| l.trim()).collect();
            command.push(folded.join(" "));
        } else {
            command.push(item.to_string());
        }
    }
    PodJob {
        command,
        completions,
        shard_count,
    }
}

/// examples/k8s-indexed-job.yaml is a Job of that shape (when python3 has PyYAML, which
/// parses it as Kubernetes would read it), and its pod command, run here as each of
/// its pods over a fleet with a damaged recording (volumes as folders, pdinject on
/// PATH), writes every good output exactly once, and every pod exits 0 (exit 3,
/// some recordings failed, is reported in the pod's report, not retried).
#[test]
fn k8s_job_pod_command() {
    let yaml = manifest_dir().join("examples/k8s-indexed-job.yaml");
    let job = read_k8s_job(&std::fs::read_to_string(&yaml).unwrap());
    assert_eq!(job.command.len(), 3, "{:?}", job.command);
    assert_eq!(job.command[..2], ["sh", "-c"], "{:?}", job.command);
    assert_eq!(
        job.shard_count,
        job.completions.to_string(),
        "PDINJECT_SHARD_COUNT must equal completions"
    );
    // The YAML as a YAML parser reads it, where one is at hand (not the oracle of
    // the run below, so its absence is a note, not a skip).
    let parse = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             j = yaml.safe_load(open(sys.argv[1]))\n\
             s = j['spec']; c = s['template']['spec']['containers'][0]\n\
             print(json.dumps([j['apiVersion'], j['kind'], s['completionMode'], s['completions'],\n\
               s['parallelism'], c['command'], {e['name']: e['value'] for e in c['env']},\n\
               {m['name']: m['mountPath'] for m in c['volumeMounts']},\n\
               sorted(v['name'] for v in s['template']['spec']['volumes'])]))",
        ])
        .arg(&yaml)
        .output();
    match parse {
        Ok(o) if o.status.success() => {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v[0], "batch/v1");
            assert_eq!(v[1], "Job");
            assert_eq!(v[2], "Indexed");
            assert_eq!(v[3], job.completions);
            assert_eq!(v[4], job.completions, "parallelism: one pod per shard");
            assert_eq!(
                v[5],
                serde_json::json!(job.command),
                "the command as YAML reads it"
            );
            assert_eq!(v[6]["PDINJECT_SHARD_COUNT"], job.shard_count);
            assert_eq!(v[7], serde_json::json!({"fleet": "/fleet", "out": "/out"}));
            assert_eq!(v[8], serde_json::json!(["fleet", "out"]));
        }
        other => eprintln!(
            "note: k8s_job_pod_command: the YAML was not parsed by python3's yaml ({}); the pod command is still run",
            match other {
                Ok(o) => tail(&o.stderr),
                Err(e) => e.to_string(),
            }
        ),
    }

    let tmp = tempfile::tempdir().unwrap();
    let fl = tmp.path().join("fleet");
    // 24 over 8 pods: the damaged one's pod has good ones too (shards are a fixed
    // hash of the path, so this holds on every run; checked below).
    let rels = fleet(&fl, 24);
    std::fs::create_dir_all(fl.join("host-bad")).unwrap();
    std::fs::write(fl.join("host-bad/perf.data"), b"PERFILE2 cut short").unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // The volumes' mount paths become this test's folders.
    let script = &job.command[2];
    for from in [" /out", " /fleet"] {
        assert!(
            script.contains(from),
            "the pod command has no{from}: {script}"
        );
    }
    let script = script
        .replace(" /out", &format!(" {}", out.display()))
        .replace(" /fleet", &format!(" {}", fl.display()));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pdinject"));
    let path = std::env::join_paths(std::iter::once(bin.parent().unwrap().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let mut done: BTreeMap<String, usize> = BTreeMap::new();
    let mut failed = Vec::new();
    // Whether a pod had both (its batch exit 3, the pod's 0): the rule the YAML adds.
    let mut some_failed = false;
    for index in 0..job.completions {
        let o = run(std::process::Command::new(&job.command[0])
            .arg(&job.command[1])
            .arg(&script)
            .env("PATH", &path)
            .env("HOME", test_home())
            .env("JOB_COMPLETION_INDEX", index.to_string())
            .env("PDINJECT_SHARD_COUNT", &job.shard_count)
            .env_remove("SLURM_ARRAY_TASK_ID"));
        let report = out.join(format!("report-{index}.jsonl"));
        let (mut ok, mut bad) = (0, 0);
        for line in std::fs::read_to_string(&report).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v.get("summary").is_some() {
                continue;
            }
            let input = v["input"].as_str().unwrap().to_string();
            match v["status"].as_str() {
                Some("ok") => {
                    ok += 1;
                    *done.entry(input).or_default() += 1
                }
                Some("failed") => {
                    bad += 1;
                    failed.push((index, input))
                }
                s => panic!("pod {index}: {input}: status {s:?}"),
            }
        }
        // Exit 3 (some failed) becomes 0; a pod whose every recording failed exits 1
        // (batch's code) and Kubernetes retries it.
        let want = if bad > 0 && ok == 0 { 1 } else { 0 };
        assert_eq!(
            o.status.code(),
            Some(want),
            "pod {index} ({ok} done, {bad} failed): {}",
            tail(&o.stderr)
        );
        if bad > 0 && ok > 0 {
            some_failed = true;
        }
    }
    let want: BTreeMap<String, usize> = rels
        .iter()
        .map(|r| (fl.join(r).display().to_string(), 1))
        .collect();
    assert_eq!(done, want, "each good recording done by exactly one pod");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].1.ends_with("host-bad/perf.data"), "{failed:?}");
    assert!(
        some_failed,
        "the damaged recording's pod had no good one: exit 3 was not exercised"
    );
    for r in &rels {
        assert!(out.join(r).is_file(), "no output for {}", r.display());
    }
}

/// Six copies of one recording of this host: each DSO file is proven once for the
/// whole batch (as many files read as for one copy), the other five copies are
/// answered from the memo, and the outputs are those of single-file runs.
#[test]
fn batch_memo_reads_each_dso_once() -> Outcome {
    let st = setup("batch_memo_reads_each_dso_once")?;
    let rec = st.dir.join("rec.data");
    record_in(&st.perf, &st.dir, &rec, &["-B", "-g", "--", "./prog"]);
    let fl = st.dir.join("fleet");
    for i in 0..6 {
        std::fs::create_dir_all(fl.join(format!("h{i}"))).unwrap();
        std::fs::copy(&rec, fl.join(format!("h{i}/perf.data"))).unwrap();
    }
    let batch =
        |input: &Path, out: &str| -> (serde_json::Value, BTreeMap<String, serde_json::Value>) {
            let report = st.dir.join(format!("{out}.jsonl"));
            let o = pdinject_run([
                "batch".as_ref(),
                "-b".as_ref(),
                "--out-dir".as_ref(),
                st.dir.join(out).as_os_str(),
                "--report".as_ref(),
                report.as_os_str(),
                input.as_os_str(),
            ]);
            assert!(o.status.success(), "{}", tail(&o.stderr));
            (summary(&report), report_lines(&report))
        };
    let (one, lines) = batch(&fl.join("h0"), "one");
    let line = lines.values().next().unwrap();
    // The memo reads a file again when it changed (a new ctime): other tests running
    // beside this one hard-link the same system libraries into their own build-ID
    // caches. Changes during the six-copy batch are counted; only without any is the
    // count of files read exact.
    let proven: Vec<PathBuf> = line["dsos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["source"] == "elf")
        .filter_map(|d| d["path"].as_str().map(PathBuf::from))
        .collect();
    let ctimes = || -> Vec<Option<(i64, i64)>> {
        use std::os::unix::fs::MetadataExt;
        proven
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.ctime(), m.ctime_nsec()))
            })
            .collect()
    };
    let before = ctimes();
    let (six, _) = batch(&fl, "six");
    let changed = before
        .iter()
        .zip(ctimes())
        .filter(|(a, b)| **a != *b)
        .count() as u64;
    let elf = line["dsos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["source"] == "elf")
        .count();
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert!(elf >= 2, "prog and libfix proven from their files: {line}");
    assert!(n(&one, "dso_files_read") >= elf as u64, "{one}");
    let lookups = |v: &serde_json::Value| n(v, "proofs_run") + n(v, "memo_hits");
    assert_eq!(lookups(&six), 6 * lookups(&one), "{one} {six}");
    if changed == 0 {
        assert_eq!(
            n(&six, "dso_files_read"),
            n(&one, "dso_files_read"),
            "{six}"
        );
        assert_eq!(n(&six, "memo_hits"), 5 * lookups(&one), "{six}");
    } else {
        // At most one more read per copy for each file that changed.
        eprintln!(
            "batch_memo_reads_each_dso_once: {changed} DSO files changed during the batch (other tests); counts checked loosely"
        );
        assert!(
            n(&six, "dso_files_read") <= n(&one, "dso_files_read") + 6 * changed,
            "{six}"
        );
    }
    let single = st.dir.join("single.data");
    run_ok(pdinject().args(["-b", "-q"]).arg(&rec).arg(&single));
    for i in 0..6 {
        assert!(
            std::fs::read(st.dir.join(format!("six/h{i}/perf.data"))).unwrap()
                == std::fs::read(&single).unwrap(),
            "h{i}: the batch output differs from the single-file run's"
        );
    }
    Ok(())
}

/// `--in-place`: each recording rewritten itself (the crash-safe in-place writer);
/// its IDs read back from the file, the mtime kept, a rerun skips them all.
#[test]
fn batch_in_place() {
    let d = tempfile::tempdir().unwrap();
    let demo = manifest_dir().join("testdata/demo/demo.data");
    let mut files = Vec::new();
    for i in 0..3 {
        let f = d.path().join(format!("host{i}/perf.data"));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::copy(&demo, &f).unwrap();
        files.push(f);
    }
    let mtimes: Vec<_> = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().modified().unwrap())
        .collect();
    let report = d.path().join("r.jsonl");
    let o = pdinject_run([
        "batch".as_ref(),
        "--in-place".as_ref(),
        "--report".as_ref(),
        report.as_os_str(),
        d.path().as_os_str(),
    ]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for (f, m) in files.iter().zip(&mtimes) {
        let back = pdinject::validate(f).expect("rewritten in place, still valid");
        assert!(back.reading.samples > 100, "{}", f.display());
        assert_eq!(
            &std::fs::metadata(f).unwrap().modified().unwrap(),
            m,
            "mtime kept"
        );
        let lines = report_lines(&report);
        let line = &lines[&f.display().to_string()];
        assert!(line["ids_written"].as_u64().unwrap_or(0) >= 3, "{line}");
    }
    // The table is in the file: a later run finds every ID in the input's table.
    let out = d.path().join("again.data");
    let (_, r) = pdinject_ok(&files[0], &out, &["-N"]);
    assert_eq!(r["ids_new"].as_u64(), Some(0), "{r}");
    let o = pdinject_run([
        "batch".as_ref(),
        "--in-place".as_ref(),
        "--report".as_ref(),
        report.as_os_str(),
        d.path().join("host0").as_os_str(),
        d.path().join("host1").as_os_str(),
        d.path().join("host2").as_os_str(),
    ]);
    assert!(o.status.success(), "{}", tail(&o.stderr));
    let s = summary(&report);
    assert_eq!(s["skipped"].as_u64(), Some(3), "a rerun skips: {s}");
}

/// One parser for `pdinject IN OUT` and `pdinject batch`: `batch` is a subcommand
/// only as the first word (after a flag or a path it is a file name, as when argv[1]
/// alone could say batch), `help` is a file name, the shared flags are checked the same
/// in both, and the top-level help names the subcommand.
#[test]
fn one_parser_for_single_runs_and_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let expect = |args: &[&str], code: i32, says: &str| {
        let o = run(pdinject().current_dir(tmp.path()).args(args));
        let err = String::from_utf8_lossy(&o.stderr);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}{out}");
        assert!(
            err.contains(says) || out.contains(says),
            "{args:?}: wants {says:?}: {err}{out}"
        );
    };
    // A word after a flag is a path: the single run opens a file named batch.
    expect(&["-b", "batch", "out.data"], 1, "pdinject: batch:");
    expect(&["--", "batch", "out.data"], 1, "pdinject: batch:");
    // `help` is not a command: a single run missing its output.
    expect(&["help"], 2, "give an input and an output");
    expect(&["--help"], 0, "Commands:\n  batch");
    expect(&["batch", "--version"], 0, "pdinject batch ");
    // --jobs is checked the same way in both (a batch took any count before).
    for j in ["0", "100000"] {
        let says = if j == "0" {
            "at least 1"
        } else {
            "over the limit"
        };
        expect(&["--jobs", j, "in.data", "out.data"], 2, says);
        expect(&["batch", "--jobs", j, "--out-dir", "o", "."], 2, says);
    }
    expect(&["batch", "--archive", "a.tar"], 2, "unexpected argument");
}
