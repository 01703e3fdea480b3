//! Output that cannot be written: a full disk and a read-only directory give a clear
//! error, exit 1, no output and no temp file left behind, and the input untouched.

use super::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for the test, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn new(opts: &str) -> Result<(tempfile::TempDir, Mount), Skip> {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let o = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(&mnt));
        if !o.status.success() {
            return skip("cannot mount a tmpfs here (needs root)");
        }
        Ok((dir, Mount(mnt)))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn demo() -> PathBuf {
    manifest_dir().join("testdata/demo/demo.data")
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn check_failure(input: &Path, before: &[u8], out: &Path, o: &std::process::Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "exit status {}; stderr: {err}",
        status_str(o)
    );
    assert!(err.starts_with("pdinject: "), "stderr: {err}");
    assert!(
        err.contains(&out.display().to_string()),
        "the message does not name the output: {err}"
    );
    assert!(
        err.contains(want),
        "the message does not say '{want}': {err}"
    );
    assert!(!out.exists(), "{} exists after a failed run", out.display());
    let left = entries(out.parent().unwrap());
    assert!(left.is_empty(), "files left behind: {left:?}");
    assert_eq!(std::fs::read(input).unwrap(), before, "the input changed");
}

#[test]
fn disk_full_leaves_nothing_behind() -> Outcome {
    let (_d, m) = Mount::new("size=8k")?;
    let input = demo();
    let before = std::fs::read(&input).unwrap();
    assert!(
        before.len() > 8192,
        "the demo recording is too small to fill the tmpfs"
    );
    let out = m.0.join("out.data");
    let o = run(pdinject().arg(&input).arg(&out));
    check_failure(&input, &before, &out, &o, "No space left on device");
    Ok(())
}

/// The copy fails at once on a tiny tmpfs while the scan still has 64 MB of records to
/// walk: the analysis stops at its next chunk, and the user sees the copy's error
/// (not that a stage was stopped).
#[test]
fn disk_full_during_a_long_scan_reports_the_disk() -> Outcome {
    let (_d, m) = Mount::new("size=64k")?;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("padded.data");
    std::fs::write(&input, padded_demo(64 << 20)).unwrap();
    let before = std::fs::read(&input).unwrap();
    let out = m.0.join("out.data");
    let o = run(pdinject().arg(&input).arg(&out));
    check_failure(&input, &before, &out, &o, "No space left on device");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("stopped"), "stderr: {err}");
    Ok(())
}

#[test]
fn read_only_output_directory() -> Outcome {
    let (_d, m) = Mount::new("ro,size=64k")?;
    let input = demo();
    let before = std::fs::read(&input).unwrap();
    let out = m.0.join("out.data");
    let o = run(pdinject().arg(&input).arg(&out));
    check_failure(&input, &before, &out, &o, "Read-only file system");
    Ok(())
}

#[test]
fn output_directory_missing() {
    let input = demo();
    let out = std::env::temp_dir().join("pdinject-no-such-dir/sub/out.data");
    let o = run(pdinject().arg(&input).arg(&out));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("cannot write the output"), "stderr: {err}");
    assert!(!out.exists());
}
