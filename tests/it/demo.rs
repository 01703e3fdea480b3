//! The README's first command: testdata/demo/demo.data carries its build ids in
//! MMAP2 records (perf record --buildid-mmap), so pdinject must write them on any
//! machine, without the binaries.

use super::common::*;

const DEMO_PATH: &str = "/work/main/testdata/demo/demo";
const DEMO_ID: &str = "deadbeefdeadbeefdeadbeefdeadbeefdeadbeef";
const DEMO_LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const DEMO_LIBC_ID: &str = "93ac61ec5a8eb1396f9fbd350e3169a558528a40";
const DEMO_KERNEL_ID: &str = "24a3598fd700114d0a1b1a4871badcee75d0acac";

#[test]
fn demo_recording() -> Outcome {
    let input = manifest_dir().join("testdata/demo/demo.data");
    let tmp = tempfile::tempdir().unwrap();
    let output = tmp.path().join("demo-out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    for (path, id) in [
        (DEMO_PATH, DEMO_ID),
        (DEMO_LIBC, DEMO_LIBC_ID),
        ("[kernel.kallsyms]", DEMO_KERNEL_ID),
    ] {
        let d = report_dso(&report, path).unwrap_or_else(|| {
            panic!(
                "demo: no report entry for {path}; dsos:\n{}",
                report_summary(&report)
            )
        });
        assert_eq!(d["build_id"].as_str(), Some(id), "demo: report entry {d}");
        assert_eq!(
            d["source"].as_str(),
            Some("mmap2"),
            "demo: report entry {d}"
        );
    }
    let perf = perf()?;
    let table = buildid_list(&perf, &output);
    for (path, id) in [
        (DEMO_PATH, DEMO_ID),
        (DEMO_LIBC, DEMO_LIBC_ID),
        ("[kernel.kallsyms]", DEMO_KERNEL_ID),
    ] {
        assert_eq!(
            table.get(path).map(String::as_str),
            Some(id),
            "demo: perf buildid-list of the output, {path}; table:\n{}",
            fmt_map(&table)
        );
    }
    // No symbols: on other machines local files of the same paths may differ.
    assert_same_script(
        &perf,
        &input,
        &output,
        &["-F", "comm,tid,time,event,ip,dso", "--show-mmap-events"],
    );
    Ok(())
}
