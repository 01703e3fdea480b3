//! Issue 33: pdinject reached and installed as perf users' tools are. The man pages
//! and the completions `--generate` prints name every flag `--help` lists (rendered
//! by man, completed by bash and fish, parsed by zsh); `--version` names the commit.

use super::common::*;
use std::path::Path;
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
fn shells_and_man(test: &str) -> bool {
    for (tool, pkg) in [
        ("man", "man-db"),
        ("bash", "bash"),
        ("fish", "fish"),
        ("zsh", "zsh"),
    ] {
        if !have(tool) {
            skip(
                test,
                &format!("{tool} is not installed (apt install {pkg})"),
            );
            return false;
        }
    }
    true
}

/// The man pages `--generate` prints list every flag of `--help`, as man renders them.
#[test]
fn generated_man_pages_name_every_flag() {
    const TEST: &str = "generated_man_pages_name_every_flag";
    if !have("man") {
        skip(TEST, "man is not installed (apt install man-db)");
        return;
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
}

/// The completion scripts list every flag of `--help`; bash and fish really complete
/// `pdinject --mm` with the MMAP2 flags; zsh reads its script without an error.
#[test]
fn generated_completions_offer_the_flags() {
    const TEST: &str = "generated_completions_offer_the_flags";
    if !shells_and_man(TEST) {
        return;
    }
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
}

/// `--version` says the version and the commit built from (`build.rs`).
#[test]
fn version_names_the_commit() {
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
}
