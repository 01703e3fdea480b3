//! Issue 33: pdinject reached and installed as perf users' tools are. The man pages
//! and the completions `--generate` prints name every flag `--help` lists (rendered
//! by man, completed by bash and fish, parsed by zsh); `--version` names the commit;
//! `cargo install --path . --locked` works in a clean HOME; the Debian package
//! (`pkg/build-deb.sh`) installs with `dpkg -i`, then `man pdinject`, completion and
//! the README's demo work with what it installed, and `dpkg -r` takes it away.
//! debuginfod over https is in `install/https.rs`.

mod https;

use super::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `BIN [SUB] --help`'s flags: each `-x` and `--long` of the lines that list options.
fn help_flags(bin: &Path, sub: &[&str]) -> Vec<String> {
    let o = run_ok(
        Command::new(bin)
            .args(sub)
            .arg("--help")
            .env("HOME", test_home()),
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut flags = Vec::new();
    for line in text.lines() {
        // Options are indented; the text after them (after_help) is not.
        let l = line.trim_start();
        if !l.starts_with('-') || l.len() == line.len() {
            continue;
        }
        // The option column ends at the first run of two spaces (or the line's end).
        let spec = l.split("  ").next().unwrap_or("");
        for w in spec.split([',', ' ']) {
            let w = w.split(['=', '[', '<']).next().unwrap_or("");
            if w.len() > 1 && w.starts_with('-') && w != "--" {
                flags.push(w.to_string());
            }
        }
    }
    flags.sort();
    flags.dedup();
    assert!(
        flags.len() > 20 || !sub.is_empty() && flags.len() > 10,
        "too few flags found in --help:\n{text}"
    );
    flags
}

/// `flag` in `text` as a word of its own (`-b` is not found in `--buildids`).
fn has_flag(text: &str, flag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    text.match_indices(flag).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + flag.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

fn missing<'a>(flags: &'a [String], text: &str) -> Vec<&'a str> {
    flags
        .iter()
        .map(String::as_str)
        .filter(|f| !has_flag(text, f))
        .collect()
}

/// True when `tool --version` (or `tool -V`) runs.
fn have(tool: &str) -> bool {
    ["--version", "-V"].iter().any(|v| {
        Command::new(tool)
            .arg(v)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A man page as man renders it for a reader: `man ARGS` (`-l FILE`, or a page name)
/// in the C locale (plain `-`, no typographic hyphen), lines wide enough that no flag
/// is hyphenated, no pager, overstrikes (bold) removed.
fn man_text(args: &[&str]) -> String {
    let o = run_ok(
        Command::new("man")
            .args(args)
            .env("HOME", test_home())
            .env("LC_ALL", "C")
            .env("MANWIDTH", "250")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env_remove("MAN_KEEP_FORMATTING"),
    );
    let raw = String::from_utf8_lossy(&o.stdout);
    let mut text = String::with_capacity(raw.len());
    for c in raw.chars() {
        if c == '\u{8}' {
            text.pop();
        } else {
            text.push(c);
        }
    }
    text
}

/// The words bash offers for the command line `words` (the last one being completed),
/// after `setup` (a `source` of the script, or bash-completion's loader).
fn bash_complete(setup: &str, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        r#"{setup}
f=$(complete -p pdinject 2>/dev/null | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
[ -n "$f" ] || {{ echo "no completion for pdinject" >&2; exit 3; }}
COMP_WORDS=({words})
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
"$f" pdinject "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        words = quoted.join(" ")
    );
    let o = run_ok(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &script])
            .env("HOME", test_home()),
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// What fish offers for `line` (`complete -C`), after `setup`. With its config read
/// (the test's empty HOME, the system's): `--no-config` would also empty
/// `$fish_complete_path`, where fish finds the package's completions.
fn fish_complete(setup: &str, line: &str) -> Vec<String> {
    let o = run_ok(
        Command::new("fish")
            .arg("-c")
            .arg(format!("{setup}; complete -C '{line}'"))
            .env("HOME", test_home()),
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").to_string())
        .collect()
}

/// The completion checks every way of installing shares: `pdinject --mm<TAB>` offers
/// both MMAP2 flags and `pdinject batch --sha<TAB>` both shard flags.
fn assert_completes(what: &str, bash_setup: &str, fish_setup: &str) {
    let mm = bash_complete(bash_setup, &["pdinject", "--mm"]);
    assert_eq!(
        mm,
        ["--mmap2-buildid-all", "--mmap2-buildids"],
        "{what}: bash completion of pdinject --mm"
    );
    let sh = bash_complete(bash_setup, &["pdinject", "batch", "--sha"]);
    assert_eq!(
        sh,
        ["--shard", "--shard-count"],
        "{what}: bash completion of pdinject batch --sha"
    );
    let mut fish = fish_complete(fish_setup, "pdinject --mm");
    fish.sort();
    assert_eq!(
        fish,
        ["--mmap2-buildid-all", "--mmap2-buildids"],
        "{what}: fish completion of pdinject --mm"
    );
}

/// The tools the man and completion tests run, or a SKIP naming what is missing.
fn shells_and_man() -> Outcome {
    for (tool, pkg) in [
        ("man", "man-db"),
        ("bash", "bash"),
        ("fish", "fish"),
        ("zsh", "zsh"),
    ] {
        if !have(tool) {
            return skip(format!("{tool} is not installed (apt install {pkg})"));
        }
    }
    Ok(())
}

/// The man pages `--generate` prints list every flag of `--help`, as man renders them.
#[test]
fn generated_man_pages_name_every_flag() -> Outcome {
    if !have("man") {
        return skip("man is not installed (apt install man-db)");
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_pdinject"));
    for (sub, what, name) in [
        (&[][..], "man", "pdinject"),
        (&["batch"][..], "man-batch", "pdinject-batch"),
    ] {
        let page = tmp.path().join(format!("{name}.1"));
        let o = run_ok(pdinject().args(["--generate", what]));
        std::fs::write(&page, &o.stdout).unwrap();
        let text = man_text(&["-l", &s(&page)]);
        let flags = help_flags(bin, sub);
        assert!(
            missing(&flags, &text).is_empty(),
            "{name}.1 lacks {:?} of --help; rendered:\n{text}",
            missing(&flags, &text)
        );
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(name)),
            "{name}.1 has no NAME line for {name}:\n{text}"
        );
    }
    // A flag the parser does not have is not found: the check can fail.
    assert!(!has_flag("--mmap2-buildids --buildids", "--mmap2"));
    assert!(!has_flag("--buildids", "-b"));
    Ok(())
}

/// The completion scripts list every flag of `--help`; bash and fish really complete
/// `pdinject --mm` with the MMAP2 flags; zsh reads its script without an error.
#[test]
fn generated_completions_offer_the_flags() -> Outcome {
    shells_and_man()?;
    let tmp = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_pdinject"));
    let mut flags = help_flags(bin, &[]);
    flags.extend(help_flags(bin, &["batch"]));
    let mut scripts = Vec::new();
    for (what, file) in [
        ("complete-bash", "pdinject.bash"),
        ("complete-zsh", "_pdinject"),
        ("complete-fish", "pdinject.fish"),
    ] {
        let path = tmp.path().join(file);
        let o = run_ok(pdinject().args(["--generate", what]));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        // fish names long flags without their dashes (`-l mmap2-buildids`).
        let fish_text = text.replace(" -l ", " --").replace(" -s ", " -");
        let lacking = missing(
            &flags,
            if file.ends_with("fish") {
                &fish_text
            } else {
                &text
            },
        );
        assert!(lacking.is_empty(), "{file} lacks {lacking:?}");
        std::fs::write(&path, &o.stdout).unwrap();
        scripts.push(path);
    }
    let z = run(Command::new("zsh").arg("-n").arg(&scripts[1]));
    assert!(z.status.success(), "zsh -n _pdinject: {}", tail(&z.stderr));
    assert_completes(
        "generated",
        &format!("source '{}'", s(&scripts[0])),
        &format!("source '{}'", s(&scripts[2])),
    );
    Ok(())
}

/// `--version` says the version and the commit built from (`build.rs`).
#[test]
fn version_names_the_commit() -> Outcome {
    let o = run_ok(pdinject().arg("--version"));
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let want_commit = Command::new("git")
        .args(["-C", &s(&manifest_dir()), "rev-parse", "--show-toplevel"])
        .output()
        .ok()
        .filter(|o| {
            o.status.success()
                && Path::new(String::from_utf8_lossy(&o.stdout).trim())
                    .canonicalize()
                    .ok()
                    == manifest_dir().canonicalize().ok()
        })
        .and_then(|_| {
            let o = Command::new("git")
                .args(["-C", &s(&manifest_dir()), "rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        v,
        format!(
            "pdinject {} (commit {want_commit})",
            env!("CARGO_PKG_VERSION")
        )
    );
    let o = run_ok(pdinject().args(["batch", "--version"]));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("pdinject batch {}", v.trim_start_matches("pdinject "))
    );
    Ok(())
}

/// The target folder the install and package tests build in: beside the test build's
/// own (whose `release/pdinject` has the test hooks and must not be replaced while
/// other tests run it), and kept, so the dependencies compile once per checkout.
fn install_target_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_pdinject"));
    bin.parent()
        .and_then(Path::parent)
        .expect("the binary is in TARGET/PROFILE/")
        .join("install-test")
}

/// A clean HOME for cargo: a new, empty HOME, and a CARGO_HOME with no config, no
/// credentials and no installed binaries, only a link to the registry already
/// downloaded (the builds run `--offline`). That CARGO_HOME is kept beside the target
/// folder: the dependencies' sources are found under it, and a new path for them each
/// run would compile every one of them again. The toolchain's cargo and rustc are
/// named directly (rustup's proxies would look for their toolchains under the new
/// HOME).
struct CleanCargo {
    _home: tempfile::TempDir,
    home: PathBuf,
    cargo_home: PathBuf,
    cargo: PathBuf,
    rustc: Option<PathBuf>,
}

impl CleanCargo {
    fn new() -> Result<CleanCargo, Skip> {
        let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        let registry = real_cargo_home().map(|h| h.join("registry"));
        let Some(registry) = registry.filter(|r| r.is_dir()) else {
            return skip("no cargo registry downloaded to build offline from");
        };
        let cargo_home = install_target_dir().join("cargo-home");
        std::fs::create_dir_all(&cargo_home).unwrap();
        let link = cargo_home.join("registry");
        let linked = || std::fs::read_link(&link).ok().as_deref() == Some(registry.as_path());
        if !linked() {
            let _ = std::fs::remove_file(&link);
            // The other test may have made it meanwhile.
            if let Err(e) = std::os::unix::fs::symlink(&registry, &link)
                && !linked()
            {
                panic!(
                    "cannot link {} to {}: {e}",
                    link.display(),
                    registry.display()
                );
            }
        }
        let home = tempfile::Builder::new()
            .prefix("pdinject-clean-home-")
            .tempdir()
            .unwrap();
        let rustc = cargo
            .parent()
            .map(|d| d.join("rustc"))
            .filter(|r| r.is_file());
        Ok(CleanCargo {
            home: home.path().to_path_buf(),
            _home: home,
            cargo_home,
            cargo,
            rustc,
        })
    }

    /// A command in the clean HOME: no CARGO* variable of the test run's cargo, the
    /// toolchain's folder (and `more` folders) first on PATH.
    fn cmd(&self, program: &Path, more: &[&Path]) -> Command {
        let mut c = Command::new(program);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CARGO") || k == "RUSTUP_TOOLCHAIN" {
                c.env_remove(k);
            }
        }
        let mut path: Vec<PathBuf> = more.iter().map(|p| p.to_path_buf()).collect();
        if let Some(d) = self.cargo.parent().filter(|d| !d.as_os_str().is_empty()) {
            path.push(d.to_path_buf());
        }
        path.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        c.env("HOME", &self.home)
            .env("CARGO_HOME", &self.cargo_home)
            .env("CARGO_NET_OFFLINE", "true")
            .env("PATH", std::env::join_paths(path).unwrap())
            .current_dir(manifest_dir());
        if let Some(r) = &self.rustc {
            c.env("RUSTC", r);
        }
        c
    }
}

/// The CARGO_HOME of the user running the tests.
fn real_cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
}

/// The README's demo with `bin`: the three IDs the recording carries, from its MMAP2
/// records, and the same output bytes as the binary under test writes.
fn assert_demo(bin: &Path, what: &str) {
    let input = manifest_dir().join("testdata/demo/demo.data");
    let tmp = tempfile::tempdir().unwrap();
    let (got, want) = (tmp.path().join("got.data"), tmp.path().join("want.data"));
    let report = tmp.path().join("got.json");
    run_ok(
        Command::new(bin)
            .args(["--buildids"])
            .arg(&input)
            .arg(&got)
            .arg("--report")
            .arg(&report)
            .env("HOME", test_home()),
    );
    let r = read_report(&report);
    for (path, id) in [
        (
            "/work/main/testdata/demo/demo",
            "deadbeefdeadbeefdeadbeefdeadbeefdeadbeef",
        ),
        (
            "[kernel.kallsyms]",
            "24a3598fd700114d0a1b1a4871badcee75d0acac",
        ),
    ] {
        let d = report_dso(&r, path)
            .unwrap_or_else(|| panic!("{what}: no {path} in the report: {}", report_summary(&r)));
        assert_eq!(d["build_id"], id, "{what}: {d}");
        assert_eq!(d["source"], "mmap2", "{what}: {d}");
    }
    run_ok(pdinject().args(["-N", "--buildids"]).arg(&input).arg(&want));
    assert!(
        std::fs::read(&got).unwrap() == std::fs::read(&want).unwrap(),
        "{what}: the demo's output differs from the tested binary's"
    );
}

/// `cargo install --path . --locked` in a clean HOME (offline, from the registry
/// already downloaded), then the installed binary runs the README's demo and says the
/// same version and commit. Cost: the first run in a checkout compiles every
/// dependency once more in release mode (about 3 CPU-minutes here, 2-6 minutes of
/// wall time on 2 cores), into TARGET/install-test, which it keeps: later runs, and
/// the package test, rebuild only what changed (seconds when nothing did).
#[test]
fn cargo_install_in_a_clean_home() -> Outcome {
    let cc = CleanCargo::new()?;
    let root = cc.home.join("root");
    let t = std::time::Instant::now();
    let o = run(cc
        .cmd(&cc.cargo, &[])
        .args(["install", "--locked", "--offline", "--path", "."])
        .arg("--root")
        .arg(&root)
        .arg("--target-dir")
        .arg(install_target_dir()));
    assert!(
        o.status.success(),
        "cargo install --path . --locked failed ({}):\n{}",
        status_str(&o),
        tail(&o.stderr)
    );
    eprintln!("cargo install took {:.1} s", t.elapsed().as_secs_f64());
    let bin = root.join("bin/pdinject");
    let v = run_ok(Command::new(&bin).arg("--version"));
    let want = run_ok(pdinject().arg("--version"));
    assert_eq!(v.stdout, want.stdout, "the installed binary's --version");
    assert_demo(&bin, "cargo install");
    Ok(())
}

/// `dpkg -r pdinject` when dropped: the test leaves no package installed, whatever
/// fails after `dpkg -i`.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let o = Command::new("dpkg").args(["-r", "pdinject"]).output();
        if !o.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("dpkg -r pdinject failed: {o:?}");
        }
    }
}

/// The Debian package: built by `pkg/build-deb.sh` (cargo-deb), installed by `dpkg -i`
/// with the man and doc paths that slim images exclude put back (docs/install.md);
/// then `man pdinject` and `man pdinject-batch` render every flag of `--help`, bash's
/// completion loader and fish find the completions, zsh's fpath has its function,
/// the docs and examples are there, and `/usr/bin/pdinject` runs the README's demo.
/// `dpkg -r` after, whatever happens.
#[test]
fn debian_package_installs_and_works() -> Outcome {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("dpkg -i needs root");
    }
    for (tool, pkg) in [("dpkg", "dpkg"), ("dpkg-shlibdeps", "dpkg-dev")] {
        if !have(tool) && !Path::new(&format!("/usr/bin/{tool}")).exists() {
            return skip(format!("{tool} is not installed (apt install {pkg})"));
        }
    }
    shells_and_man()?;
    let loader = Path::new("/usr/share/bash-completion/bash_completion");
    if !loader.exists() {
        return skip("bash-completion is not installed (apt install bash-completion)");
    }
    let cc = CleanCargo::new()?;
    let cargo_deb = real_cargo_home()
        .map(|h| h.join("bin/cargo-deb"))
        .filter(|p| p.is_file())
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join("cargo-deb"))
                .find(|p| p.is_file())
        });
    let Some(cargo_deb) = cargo_deb else {
        return skip("cargo-deb is not installed (cargo install cargo-deb --locked)");
    };
    let listed = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}", "pdinject"])
        .output();
    if listed.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("installed")) {
        return skip("a pdinject package is installed on this machine already: not replacing it");
    }
    // The documented command, in the clean HOME, with cargo-deb on PATH.
    let mut c = cc.cmd(Path::new("bash"), &[cargo_deb.parent().unwrap()]);
    c.arg("pkg/build-deb.sh")
        .env("CARGO_TARGET_DIR", install_target_dir());
    let t = std::time::Instant::now();
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "pkg/build-deb.sh failed ({}):\n{}\n{}",
        status_str(&o),
        tail(&o.stdout),
        tail(&o.stderr)
    );
    eprintln!("pkg/build-deb.sh took {:.1} s", t.elapsed().as_secs_f64());
    let stdout = String::from_utf8_lossy(&o.stdout);
    let deb = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    assert!(
        deb.extension().is_some_and(|e| e == "deb") && deb.is_file(),
        "pkg/build-deb.sh printed no .deb path last:\n{stdout}"
    );
    // As on a slim image that excludes man pages and docs, then the documented
    // --path-include options that bring pdinject's back (later options win).
    let _installed = Installed;
    run_ok(
        Command::new("dpkg")
            .args([
                "--path-exclude=/usr/share/man/*",
                "--path-exclude=/usr/share/doc/*",
                "--path-include=/usr/share/man/man1/pdinject*",
                "--path-include=/usr/share/doc/pdinject/*",
                "-i",
            ])
            .arg(&deb)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    let files = run_ok(Command::new("dpkg").args(["-L", "pdinject"]));
    let files = String::from_utf8_lossy(&files.stdout).into_owned();
    let bin = Path::new("/usr/bin/pdinject");
    let mut want_files = vec![
        "/usr/bin/pdinject".to_string(),
        "/usr/share/man/man1/pdinject.1.gz".into(),
        "/usr/share/man/man1/pdinject-batch.1.gz".into(),
        "/usr/share/bash-completion/completions/pdinject".into(),
        "/usr/share/zsh/vendor-completions/_pdinject".into(),
        "/usr/share/fish/vendor_completions.d/pdinject.fish".into(),
        "/usr/share/doc/pdinject/README.md".into(),
        "/usr/share/doc/pdinject/CHANGELOG.md".into(),
        "/usr/share/doc/pdinject/copyright".into(),
        "/usr/share/doc/pdinject/examples/slurm-batch.sh".into(),
        "/usr/share/doc/pdinject/examples/k8s-indexed-job.yaml".into(),
    ];
    for e in std::fs::read_dir(manifest_dir().join("docs"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            want_files.push(format!("/usr/share/doc/pdinject/docs/{name}"));
        }
    }
    for f in &want_files {
        assert!(
            files.lines().any(|l| l == f) && Path::new(f).exists(),
            "the package did not install {f}; dpkg -L:\n{files}"
        );
    }
    // The binary: the version and commit of this tree, and the README's demo.
    let v = run_ok(Command::new(bin).arg("--version"));
    assert_eq!(v.stdout, run_ok(pdinject().arg("--version")).stdout);
    assert_demo(bin, "the package's /usr/bin/pdinject");
    // man finds both pages by name and they list every flag --help lists.
    for (sub, page) in [(&[][..], "pdinject"), (&["batch"][..], "pdinject-batch")] {
        let text = man_text(&[page]);
        let flags = help_flags(bin, sub);
        let lacking = missing(&flags, &text);
        assert!(lacking.is_empty(), "man {page} lacks {lacking:?}:\n{text}");
    }
    // Completion as an interactive shell loads it: bash-completion's loader finds the
    // script by the command's name, fish its vendor folder; zsh's fpath holds the
    // folder with the function.
    assert_completes(
        "the package",
        &format!("source {}; _completion_loader pdinject", loader.display()),
        "true",
    );
    let fpath = run_ok(Command::new("zsh").args(["-c", "print -l $fpath"]));
    assert!(
        String::from_utf8_lossy(&fpath.stdout)
            .lines()
            .any(|l| l == "/usr/share/zsh/vendor-completions"),
        "zsh's fpath lacks /usr/share/zsh/vendor-completions"
    );
    let z = run(Command::new("zsh").args(["-n", "/usr/share/zsh/vendor-completions/_pdinject"]));
    assert!(z.status.success(), "zsh -n _pdinject: {}", tail(&z.stderr));
    Ok(())
}
