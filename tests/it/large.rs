//! A data section above the direct-I/O threshold (32 MB): the copy takes the O_DIRECT
//! path on filesystems that do direct I/O, and the output must still match the input
//! byte for byte up to the end of the data.

use super::common::*;

#[test]
fn large_data_section_is_copied_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("big.data");
    let bytes = padded_demo(40 << 20);
    std::fs::write(&input, &bytes).unwrap();
    let output = tmp.path().join("out.data");
    let (_, report) = pdinject_ok(&input, &output, &[]);
    let out = std::fs::read(&output).unwrap();
    let data_end = (le64(&bytes, 40) + le64(&bytes, 48)) as usize;
    assert!(out.len() > data_end);
    // Everything up to the end of the data is the input's, but the feature bitmap.
    assert_eq!(out[..72], bytes[..72], "header differs");
    let first = out[104..data_end]
        .iter()
        .zip(&bytes[104..data_end])
        .position(|(a, b)| a != b);
    assert_eq!(
        first,
        None,
        "data differs at byte {:#x}",
        first.unwrap_or(0) + 104
    );
    let d = report_dso(&report, "/work/main/testdata/demo/demo").expect("demo DSO in the report");
    assert_eq!(
        d["build_id"],
        "deadbeefdeadbeefdeadbeefdeadbeefdeadbeef",
        "{}",
        report_summary(&report)
    );
    if let Some(perf) = part(perf()) {
        let t = buildid_list(&perf, &output);
        assert_eq!(
            t.get("/work/main/testdata/demo/demo").map(String::as_str),
            Some("deadbeefdeadbeefdeadbeefdeadbeefdeadbeef"),
            "{}",
            fmt_map(&t)
        );
        assert_same_script(&perf, &input, &output, &["-F", "comm,tid,time,ip,sym,dso"]);
    }
}
