//! A process in another mount namespace maps a different file at a path the host also
//! has: the host file's ID must never be written for it.

use super::common::*;

const OTHER_LIB_ID: &str = "99887766554433221100ffeeddccbbaa";

#[test]
fn other_mount_namespace_never_gets_the_host_files_id() -> Outcome {
    let perf = can_record()?;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fx = build_fixtures(dir);
    // Same source, another build ID, at another path: bind-mounted over libfix.so
    // inside a private mount namespace, so only the recorded process sees it.
    std::fs::create_dir(dir.join("alt")).unwrap();
    let alt = dir.join("alt/libfix.so");
    build_lib("libfix.c", &alt, OTHER_LIB_ID);
    let probe = run(std::process::Command::new("unshare").args(["-m", "true"]));
    if !probe.status.success() {
        return skip("unshare -m is not permitted here");
    }
    let script = format!(
        "mount --bind {} {} && exec ./prog",
        alt.display(),
        fx.libfix.display()
    );
    let data = dir.join("ns.data");
    record_in(
        &perf,
        dir,
        &data,
        &["-B", "-g", "--", "unshare", "-m", "sh", "-c", &script],
    );
    // The recording really mapped the other file (perf's view by inode is not
    // available, so check that samples hit the path at all).
    let hits = hit_dsos(&perf, &data);
    let lib = fx.libfix.to_str().unwrap().to_string();
    assert!(hits.contains_key(&lib), "no sample hit {lib}: {hits:?}");

    let out = dir.join("out.data");
    let (_, report) = pdinject_ok(&data, &out, &[]);
    let table = buildid_list(&perf, &out);
    if let Some(id) = table.get(&lib) {
        assert!(
            id.is_empty(),
            "{lib} got {id}: the host file's ID for a file the process never mapped\n{}",
            report_summary(&report)
        );
    }
    let d = report_dso(&report, &lib).expect("libfix.so missing from the report");
    assert_eq!(d["reason"], "stale", "{}", report_summary(&report));
    // The program itself is the same file in both namespaces and keeps its ID.
    assert_eq!(
        table.get(fx.prog.to_str().unwrap()).map(String::as_str),
        Some(PROG_ID)
    );
    Ok(())
}
