//! Build IDs of 16 bytes (issue 29): `gcc -Wl,--build-id=md5` and `--build-id=uuid`
//! give them (perf's own test suite records such binaries and checks the build-ID
//! cache). Here prog is linked with a uuid ID, libfix.so with an md5 one, and libc
//! keeps its 20-byte sha1: every output form carries each with its own length, as
//! perf 6.1, 6.12 and 7.3 read it; the build-ID cache and the symbol store file them
//! under the 32 hex digits perf and debuginfod use.

use super::common::*;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// prog (uuid), libfix.so (md5) and libunused.so (sha1) built in `dir`.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let libfix = dir.join("libfix.so");
    let unused = dir.join("libunused.so");
    let prog = dir.join("prog");
    let src = fixtures_src();
    let os = OsStr::new;
    gcc(&[
        os("-shared"),
        os("-fPIC"),
        os("-Wl,--build-id=md5"),
        os("-o"),
        libfix.as_os_str(),
        src.join("libfix.c").as_os_str(),
    ]);
    gcc(&[
        os("-shared"),
        os("-fPIC"),
        os("-nostartfiles"),
        os("-Wl,--build-id=sha1"),
        os("-o"),
        unused.as_os_str(),
        src.join("unused.c").as_os_str(),
    ]);
    let libdir = format!("-L{}", dir.display());
    gcc(&[
        os("-Wl,--build-id=uuid"),
        os("-o"),
        prog.as_os_str(),
        src.join("prog.c").as_os_str(),
        os(&libdir),
        os("-Wl,--no-as-needed"),
        os("-lfix"),
        os("-lunused"),
        os("-Wl,-rpath,$ORIGIN"),
    ]);
    (prog, libfix)
}

#[test]
fn short_build_ids_in_every_form() -> Outcome {
    let perf = can_record()?;
    let tmp = tempfile::Builder::new()
        .prefix("pdinject-shortid-")
        .tempdir()
        .unwrap();
    let dir = tmp.path();
    let (prog, libfix) = build(dir);
    let want: BTreeMap<String, String> = [&prog, &libfix]
        .into_iter()
        .map(|p| (s(p), elf_build_id(p).unwrap()))
        .collect();
    for (p, id) in &want {
        assert_eq!(id.len(), 32, "{p}: {id} is not a 16-byte ID");
    }
    let libc = libc_path().and_then(|l| Some((l.clone(), elf_build_id(Path::new(&l))?)));
    let rec = dir.join("rec.data");
    record_in(&perf, dir, &rec, &["-B", "-g", "--", "./prog"]);

    let mut readers = vec![perf.clone()];
    readers.extend(part(perf612()));
    readers.extend(part(perf73()));
    let check = |ids: &BTreeMap<String, String>, ctx: &str| {
        for (p, id) in &want {
            assert_eq!(
                ids.get(p).map(String::as_str),
                Some(id.as_str()),
                "{ctx}: {p}:\n{}",
                fmt_map(ids)
            );
        }
        if let Some((l, id)) = &libc {
            assert_eq!(ids.get(l), Some(id), "{ctx}: libc keeps its 20 bytes");
        }
    };
    let cache = dir.join("cache");
    let store = dir.join("store");
    let cache_flag = format!("--buildid-dir={}", cache.display());
    let store_flag = format!("--symbol-store={}", store.display());
    // File outputs.
    for (form, flags) in [
        ("table", &[][..]),
        ("mmap2", &["--mmap2-buildids"][..]),
        ("mmap2-all", &["--mmap2-buildid-all"][..]),
    ] {
        let out = dir.join(format!("{form}.data"));
        let mut a = vec![cache_flag.as_str(), store_flag.as_str()];
        a.extend(flags);
        let (_, report) = pdinject_ok(&rec, &out, &a);
        for p in want.keys() {
            assert_eq!(
                report_dso(&report, p).unwrap()["source"],
                "elf",
                "{form}: {}",
                report_summary(&report)
            );
        }
        for r in &readers {
            check(&buildid_list(r, &out), &format!("{form}, {}", r.name));
        }
        if form != "table" {
            for r in &readers {
                let recs = mmap2_build_ids(r, &out);
                for (p, id) in &want {
                    assert_eq!(
                        recs.get(p),
                        Some(id),
                        "{form}, {}: the MMAP2 records:\n{}",
                        r.name,
                        fmt_map(&recs)
                    );
                }
            }
        }
    }
    // In place.
    let inplace = dir.join("inplace.data");
    fs::copy(&rec, &inplace).unwrap();
    let o = run(pdinject().arg(&cache_flag).arg("--in-place").arg(&inplace));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for r in &readers {
        check(&buildid_list(r, &inplace), &format!("in place, {}", r.name));
    }
    // A stream: HEADER_BUILD_ID records with the ID's size.
    let stream = dir.join("out.pdata");
    let o = run(pdinject()
        .arg(&cache_flag)
        .arg(&rec)
        .arg("-")
        .stdout(Stdio::from(fs::File::create(&stream).unwrap())));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for r in &readers {
        check(&received_ids(r, &stream), &format!("stream, {}", r.name));
    }
    // Batch.
    let bdir = dir.join("batch");
    let o = run(pdinject()
        .args(["batch", "--buildids", &cache_flag, "--out-dir"])
        .arg(&bdir)
        .arg(&rec));
    assert!(o.status.success(), "{}", tail(&o.stderr));
    for r in &readers {
        check(
            &buildid_list(r, &bdir.join("rec.data")),
            &format!("batch, {}", r.name),
        );
    }
    // The build-ID cache, laid out as perf lays it: `.build-id/xx/<30 more hex>` to
    // `PATH/<32 hex>`, and perf lists each with its 32 digits.
    for (p, id) in &want {
        let link = cache.join(".build-id").join(&id[..2]).join(&id[2..]);
        let target = fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
        assert!(
            target.ends_with(Path::new(p.trim_start_matches('/')).join(id)),
            "{} -> {}",
            link.display(),
            target.display()
        );
        assert_eq!(
            elf_build_id(&link.join("elf")).as_deref(),
            Some(id.as_str()),
            "{p}"
        );
        let st = store.join(".build-id").join(&id[..2]).join(&id[2..]);
        assert_eq!(
            elf_build_id(&st).as_deref(),
            Some(id.as_str()),
            "the symbol store's {}",
            st.display()
        );
    }
    for r in &readers {
        let o = run_ok(
            r.cmd()
                .arg("--buildid-dir")
                .arg(&cache)
                .args(["buildid-cache", "-l"]),
        );
        let listed = String::from_utf8_lossy(&o.stdout);
        for (p, id) in &want {
            assert!(
                listed
                    .lines()
                    .any(|l| l.starts_with(id.as_str()) && l.ends_with(p.as_str())),
                "{}: buildid-cache -l does not list {id} {p}:\n{listed}",
                r.name
            );
        }
    }
    Ok(())
}
