//! The documentation a newcomer reads (issue 17): README.md stays under 300 lines, it
//! links every guide in docs/, and every relative link in README.md, docs/*.md,
//! benches/README.md and CHANGELOG.md names a file or folder that exists. Links carry
//! no `#anchor`: headings get reworded and nothing checks an anchor, so a link names a
//! file and the text says which section.

use super::common::*;
use std::path::{Path, PathBuf};

/// README.md's length a newcomer reads in five minutes.
const README_MAX_LINES: usize = 300;

/// The documents whose links are checked, relative to the crate root: README.md,
/// CHANGELOG.md, benches/README.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = manifest_dir();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no .md file");
    let mut all: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "benches/README.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    all.extend(docs);
    all
}

/// The targets of the inline links `[text](target)` of a Markdown text, with the line
/// they are on, outside fenced code blocks (where `](` is code, not a link). An
/// optional title (`[t](target "title")`) is dropped.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// Links to other sites are not followed (no network in tests).
fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// Why a relative link of `doc` is broken, if it is.
fn broken(doc: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link".into());
    }
    if target.contains('#') {
        return Some("has an #anchor: link the file and name the section in the text".into());
    }
    if target.starts_with('/') {
        return Some("absolute path: link relative to the document".into());
    }
    let base = doc.parent().expect("a document has a folder");
    let path = base.join(target);
    if !path.exists() {
        return Some(format!("{} does not exist", path.display()));
    }
    // Inside the repository: a link out of it would work here and nowhere else.
    let root = manifest_dir().canonicalize().expect("crate root");
    let real = path.canonicalize().expect("an existing path");
    if !real.starts_with(&root) {
        return Some(format!("{} is outside the repository", real.display()));
    }
    None
}

#[test]
fn readme_is_short() {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(
        n < README_MAX_LINES,
        "README.md has {n} lines, at most {} allowed: move the details into docs/",
        README_MAX_LINES - 1
    );
}

#[test]
fn every_relative_link_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc.display()));
        for (line, target) in links(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(why) = broken(&doc, &target) {
                bad.push(format!("{}:{line}: ({target}): {why}", doc.display()));
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
    // The README alone links a dozen files: a parser that finds nothing is broken too.
    assert!(checked > 20, "only {checked} relative links found");
}

#[test]
fn readme_links_every_guide() {
    let readme = std::fs::read_to_string(manifest_dir().join("README.md")).unwrap();
    let targets: Vec<String> = links(&readme).into_iter().map(|(_, t)| t).collect();
    for doc in documents() {
        let rel = doc
            .strip_prefix(manifest_dir())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel == "README.md" {
            continue;
        }
        assert!(
            targets.contains(&rel),
            "README.md does not link {rel}: a guide nobody finds is not read"
        );
    }
}

#[test]
fn link_parser_finds_links_and_skips_code() {
    let text = "a [x](docs/a.md) b [y](b.md \"t\") [z](https://e.org/)\n```\n[no](c.md)\n```\n[w](d.md#s)\n";
    let got: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, ["docs/a.md", "b.md", "https://e.org/", "d.md#s"]);
    let doc = manifest_dir().join("README.md");
    assert!(broken(&doc, "docs/no-such-guide.md").is_some());
    assert!(broken(&doc, "docs/guarantees.md#limits").is_some());
    assert!(broken(&doc, "CHANGELOG.md").is_none());
}
