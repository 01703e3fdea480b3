//! Runs pdinject over every perf.data file of the external quipper corpus
//! (`../shared/testdata/quipper`, written by perf 3.2 .. 6.12 on other machines) and
//! checks that outputs stay readable and faithful (piped files go through pipe mode).
//! All failures are collected and reported together.

use super::common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

const CORRUPTED: &str = "perf.data.piped.corrupted.zero_size_sample-3.2";
const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn quipper_corpus() -> Outcome {
    let dir = shared_dir()?;
    // Without perf, the comparison with perf is left out.
    let perf = part(perf());
    let tmp = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("perf.data") && !n.ends_with(".buildids"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no perf.data files in {}", dir.display());

    let mut failures: Vec<String> = Vec::new();
    let mut checked = 0;
    for name in &names {
        let input = dir.join(name);
        let output = tmp.path().join(format!("{name}.out"));
        let report = tmp.path().join(format!("{name}.json"));
        let mut cmd = pdinject();
        cmd.arg(&input).arg(&output).arg("--report").arg(&report);
        let Some(o) = run_timeout(&mut cmd, LIMIT) else {
            failures.push(format!("{name}: pdinject did not finish within {LIMIT:?}"));
            continue;
        };
        let err = String::from_utf8_lossy(&o.stderr);
        let code = o.status.code();
        let piped = name.starts_with("perf.data.piped.");

        if name == CORRUPTED {
            if code != Some(1) {
                failures.push(format!(
                    "{name}: corrupted input must exit 1, got {}; stderr: {}",
                    status_str(&o),
                    tail(&o.stderr)
                ));
            } else if !err.starts_with("pdinject: ") {
                failures.push(format!(
                    "{name}: corrupted input: stderr must start with 'pdinject: ', got: {err}"
                ));
            }
            if output.exists() {
                failures.push(format!(
                    "{name}: corrupted input left output {}",
                    output.display()
                ));
            }
            continue;
        }
        if code != Some(0) {
            failures.push(format!(
                "{name}: pdinject {} (expected exit 0{}); stderr: {}",
                status_str(&o),
                if piped { ", pipe mode" } else { "" },
                tail(&o.stderr).trim()
            ));
            continue;
        }
        if !output.exists() {
            failures.push(format!("{name}: exit 0 but no output written"));
            continue;
        }
        if let Err(e) = fs::read_to_string(&report)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).map_err(|e| e.to_string()))
        {
            failures.push(format!("{name}: --report not readable JSON: {e}"));
        }
        let Some(perf) = &perf else { continue };
        checked += 1;
        check_with_perf(perf, name, &input, &output, &dir, &mut failures);
    }
    eprintln!(
        "quipper: {} files, {} compared with perf",
        names.len(),
        checked
    );
    assert!(
        failures.is_empty(),
        "{} of {} quipper files failed:\n  {}",
        failures.len(),
        names.len(),
        failures.join("\n  ")
    );
    Ok(())
}

fn check_with_perf(
    perf: &Perf,
    name: &str,
    input: &Path,
    output: &Path,
    dir: &Path,
    failures: &mut Vec<String>,
) {
    let script = |f: &Path| run_timeout(perf.cmd().args(["script", "-i"]).arg(f), LIMIT);
    if let Some(a) = script(input).filter(|a| a.status.success()) {
        match script(output) {
            None => failures.push(format!("{name}: perf script of the output timed out")),
            Some(b) if !b.status.success() => failures.push(format!(
                "{name}: perf script reads the input but fails on the output ({}): {}",
                status_str(&b),
                tail(&b.stderr).trim()
            )),
            Some(b) if a.stdout != b.stdout => failures.push(format!(
                "{name}: perf script output differs between input and output: {}",
                first_diff(
                    &String::from_utf8_lossy(&a.stdout),
                    &String::from_utf8_lossy(&b.stdout)
                )
            )),
            _ => {}
        }
    }
    let expected = dir.join(format!("{name}.buildids"));
    if let Ok(want) = fs::read_to_string(&expected) {
        let o = run_timeout(perf.cmd().args(["buildid-list", "-i"]).arg(output), LIMIT);
        match o {
            Some(o) if o.status.success() => {
                let got = String::from_utf8_lossy(&o.stdout);
                let got_lines: std::collections::HashSet<&str> = got.lines().collect();
                let lost: Vec<&str> = want
                    .lines()
                    .filter(|l| !l.trim().is_empty() && !got_lines.contains(l))
                    .collect();
                if !lost.is_empty() {
                    failures.push(format!(
                        "{name}: {} of {} entries of {name}.buildids missing from buildid-list of the output, e.g. {:?}",
                        lost.len(),
                        want.lines().count(),
                        &lost[..lost.len().min(3)]
                    ));
                }
            }
            Some(o) => failures.push(format!(
                "{name}: perf buildid-list fails on the output: {}",
                tail(&o.stderr).trim()
            )),
            None => failures.push(format!("{name}: perf buildid-list of the output timed out")),
        }
    }
}
