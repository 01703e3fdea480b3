//! The whole pipeline, file to file: `inject::run` with default options (pipe-format
//! inputs take the streaming pipeline). On error
//! the output must not exist; on success it must open again; the input must never
//! change; no temp file may be left behind either way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdinject::{Options, run};
use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = ["/dev/shm", "/run", "/tmp"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let d = base.join(format!("pdinject-fuzz-rewrite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create the fuzz scratch directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let d = dir();
    let input = d.join("in.data");
    let output = d.join("out.data");
    let _ = std::fs::remove_file(&output);
    std::fs::write(&input, data).expect("write the input");
    let r = run(&input, &output, &Options::default());
    let after = std::fs::read(&input).expect("read the input back");
    assert!(after == data, "the input file was modified");
    match &r {
        Err(e) => assert!(
            !output.exists(),
            "run failed ({e}) but left an output at {}",
            output.display()
        ),
        Ok(_) => {
            let reopened = pdinject::validate(&output);
            if let Err(e) = reopened {
                panic!("run succeeded but its output does not open again: {e}");
            }
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir(d)
        .expect("list the scratch directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "in.data" && n != "out.data")
        .collect();
    assert!(
        leftovers.is_empty(),
        "temp files left behind: {leftovers:?}"
    );
});
