//! Hands the binary the commit it is built from, for `pdinject --version`
//! (`PDINJECT_COMMIT`: 12 hex digits, or `unknown`).
//!
//! Where the commit comes from, first found wins:
//! 1. `PDINJECT_BUILD_COMMIT` (a packager building from a tarball who knows it);
//! 2. git, when this package's folder is the top of a git work tree (a tarball
//!    unpacked inside some other repository must not take that repository's commit);
//! 3. `.cargo_vcs_info.json`, which `cargo package` writes into a crate's tarball;
//! 4. `unknown`: nothing here fails a build (`cargo install` of a tarball on a machine
//!    without git builds as before).
//!
//! No `-dirty` mark: knowing it would mean running this script again on every change of
//! any file, and each run that changes the value rebuilds the crate.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PDINJECT_BUILD_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = std::env::var("PDINJECT_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .map(|c| c.trim().to_string())
        .or_else(|| from_git(&dir))
        .or_else(|| from_vcs_info(&dir))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PDINJECT_COMMIT={commit}");
}

/// `git` in `dir`, trimmed; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    let s = String::from_utf8(o.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// HEAD's commit when `dir` is the top of a git work tree. The script runs again when
/// HEAD moves (a checkout, a commit on the branch): the files that say so are watched,
/// only those that exist (a missing one would run the script on every build).
fn from_git(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), dir) {
        return None;
    }
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec![git(dir, &["rev-parse", "--git-path", "HEAD"])];
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(dir, &["rev-parse", "--git-path", &r]));
    }
    watched.push(git(dir, &["rev-parse", "--git-path", "packed-refs"]));
    for p in watched.into_iter().flatten() {
        // --git-path answers relative to `dir` when the git dir is inside it.
        let p = dir.join(p);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    Some(commit)
}

/// The commit `cargo package` recorded in the tarball (`{"git": {"sha1": "…"}}`).
fn from_vcs_info(dir: &Path) -> Option<String> {
    let path = dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    // Not worth a JSON parser in the build: the one 40-hex value after "sha1".
    let after = &text[text.find("\"sha1\"")? + 6..];
    let start = after.find(|c: char| c.is_ascii_hexdigit())?;
    let hex: String = after[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (hex.len() >= 12).then(|| hex[..12].to_string())
}
