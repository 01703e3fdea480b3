//! The one engine: the same answers whatever the batches and whatever the sink, and
//! the disagreements the two old drivers had (each test failed on them).

use super::common::*;
use pdinject::Options;
use std::fs;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("testdata/pipe").join(name)
}

/// One stream through the engine in batches of `batch` bytes: the output and the
/// report's DSO lines.
fn stream(bytes: &[u8], batch: usize) -> (Vec<u8>, Vec<String>, u64) {
    let mut out = Vec::new();
    let r = pdinject::testing::driver::stream_in_batches(
        &mut &bytes[..],
        &mut out,
        &Options::default(),
        batch,
    )
    .unwrap_or_else(|e| panic!("batch {batch}: {e}"));
    let dsos = r
        .dsos
        .iter()
        .map(|d| format!("{} {:?} {:?} {}", d.path, d.build_id, d.reason, d.hits))
        .collect();
    (out, dsos, r.reading.samples)
}

/// Batches of a few hundred bytes end between rounds, inside compressed frames and
/// inside records: output and report are those of one batch. No perf needed.
#[test]
fn stream_fixture_batches_agree() {
    for name in ["demo.pdata", "demo-z.pdata"] {
        let bytes = fs::read(fixture(name)).expect("testdata/pipe fixture");
        let (one, dsos, samples) = stream(&bytes, 64 << 20);
        assert!(samples > 500, "{name}: {samples} samples");
        // Every record is passed on but the end-of-features marker (16 bytes; see
        // sink::stream::is_end_marker).
        assert!(
            one.len() + 16 >= bytes.len(),
            "{name}: output shorter than input less its end marker"
        );
        assert_eq!(&one[..16], &bytes[..16], "{name}: the pipe header is kept");
        for batch in [300, 4096, 20_000] {
            let (out, d, s) = stream(&bytes, batch);
            assert_eq!(s, samples, "{name}: batch {batch}: samples");
            assert_eq!(d, dsos, "{name}: batch {batch}: DSOs");
            assert!(
                out == one,
                "{name}: batch {batch}: the output differs from one batch's"
            );
        }
        // What was written reads back through the engine, samples decoded.
        let back = pdinject::testing::driver::validate_bytes(&one).expect("the output validates");
        assert_eq!(
            back.reading.samples, samples,
            "{name}: samples in the output"
        );
    }
}

/// Offset of the first SAMPLE record of a little-endian stream.
fn first_sample(b: &[u8]) -> (usize, usize) {
    let mut at = 16;
    loop {
        let kind = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let size = u16::from_le_bytes([b[at + 6], b[at + 7]]) as usize;
        if kind == 9 {
            return (at, size);
        }
        at += size;
    }
}

/// Validation decodes sample bodies (the old stream validator only framed records):
/// a sample whose fields run past its record is an error that names its offset.
#[test]
fn validation_decodes_sample_bodies() {
    let mut bytes = fs::read(fixture("demo.pdata")).expect("fixture");
    pdinject::testing::driver::validate_bytes(&bytes).expect("the fixture validates");
    let (at, size) = first_sample(&bytes);
    // Every field 0xff: the callchain announces more entries than the record holds.
    bytes[at + 8..at + size].fill(0xff);
    let err = pdinject::testing::driver::validate_bytes(&bytes)
        .expect_err("a sample that does not decode")
        .to_string();
    assert!(
        err.contains(&format!("offset {at:#x}")) && err.contains("SAMPLE"),
        "{err}"
    );
}

/// A file-format recording written as a stream, and back: both validate, and the
/// stream carries every record of the file's data section.
#[test]
fn any_input_reaches_any_sink_without_perf() {
    let d = tempfile::tempdir().unwrap();
    let stream_in = fixture("demo.pdata");
    let file = d.path().join("s2f.data");
    let back = d.path().join("f2s.pdata");
    let o = pdinject_run([stream_in.as_os_str(), file.as_os_str()]);
    assert!(o.status.success(), "stream to file: {}", tail(&o.stderr));
    assert!(!is_pipe_format(&file), "a file output is in file format");
    let o = run(pdinject()
        .arg(&file)
        .arg("-")
        .stdout(fs::File::create(&back).unwrap()));
    assert!(o.status.success(), "file to stream: {}", tail(&o.stderr));
    assert!(is_pipe_format(&back), "`-` is a stream");
    let a = pdinject::validate(&stream_in).unwrap();
    let b = pdinject::validate(&file).unwrap();
    let c = pdinject::validate(&back).unwrap();
    assert_eq!(
        (a.reading.samples, a.reading.samples),
        (b.reading.samples, c.reading.samples)
    );
    assert!(a.reading.samples > 500);
}

/// perf lists the vdso even when no sample hit it. The old file driver wrote that
/// entry without counting it (the summary's "N build IDs" and `ids_written` missed
/// it) and the stream driver wrote none: now both list it, count it, and say so.
#[test]
fn vdso_mapped_but_not_hit_is_listed_and_counted() -> Outcome {
    let perf = can_record()?;
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("true.data");
    // `true` exits before the first sample at 10 Hz: its vdso is mapped, not hit.
    record_in(&perf, d.path(), &data, &["-B", "-F", "10", "--", "true"]);
    let out = d.path().join("out.data");
    let (_, report) = pdinject_ok(&data, &out, &[]);
    let vdso = report_dso(&report, "[vdso]").unwrap_or_else(|| panic!("no [vdso] line: {report}"));
    assert_eq!(vdso["hits"].as_u64(), Some(0), "{report}");
    let table = buildid_list(&perf, &out);
    let with_id = table.values().filter(|id| !id.is_empty()).count() as u64;
    assert_eq!(
        report["ids_written"].as_u64(),
        Some(with_id),
        "every entry of the table is counted: {table:?} vs {report}"
    );
    if let Some(id) = vdso["build_id"].as_str() {
        assert_eq!(
            table.get("[vdso]").map(String::as_str),
            Some(id),
            "{table:?}"
        );
        // The stream sink says the same.
        let s = d.path().join("out.pdata");
        let o = run(pdinject()
            .arg(&data)
            .arg("-")
            .stdout(fs::File::create(&s).unwrap()));
        assert!(o.status.success(), "{}", tail(&o.stderr));
        let got = received_ids(&perf, &s);
        assert_eq!(got.get("[vdso]").map(String::as_str), Some(id), "{got:?}");
    }
    Ok(())
}

/// The input is classified once: a pipe-format file given where a file-format
/// header is expected (the `data` file of a directory) is named as what it is.
#[test]
fn a_stream_as_a_directory_header_is_named() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("rec.data");
    fs::create_dir(&dir).unwrap();
    fs::copy(fixture("demo.pdata"), dir.join("data")).unwrap();
    let out = d.path().join("out.data");
    let o = pdinject_run([dir.as_os_str(), out.as_os_str()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("not supported yet"), "{err}");
    assert!(err.contains("pipe-format"), "{err}");
    assert!(!Path::new(&out).exists());
}
