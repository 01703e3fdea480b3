//! The house's walls (issue 17), checked from the source: which room of the library
//! may use which. A room is a top-level module (`src/NAME.rs` or `src/NAME/`); an
//! edge is any `crate::NAME` path in a room's files (a `use`, or a path in code),
//! doc comments and tests aside. Two things must hold:
//!
//! * no cycle between rooms: a reader can take the rooms in one order, each using
//!   only rooms before it;
//! * the floors below: a room uses no room on a floor above its own. The driver
//!   sits on top; sinks and the engine never reach up to it, and the engine does
//!   not know which sink it feeds.
//!
//! A new room must be given a floor here, so its place is decided, not drifted into.

use super::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, lowest first. A room may use rooms on its own floor or below; a cycle
/// inside one floor fails too.
const FLOORS: &[&[&str]] = &[
    // Words every room speaks: errors, bounds.
    &["error", "limits"],
    // The input's bytes, and the signals that guard reading them.
    &["format", "signals"],
    &["perfconfig", "proof"],
    &["model", "input"],
    // Writing files safely (temp outputs, in place, clones).
    &["write"],
    &["buildid"],
    // Live capture (issue 32): files read while a live stream's processes map
    // them; identify asks it through buildid::Captured.
    &["live"],
    &["options"],
    // `--jit`: jitdumps read into images and records the engine folds into its
    // model and the sink splices in (an engine stage since issue 30).
    &["jit"],
    &["resolve"],
    // `--aslr`: the layout the engine builds after the resolve, the rewrites the sink
    // applies (docs/aslr.md).
    &["aslr"],
    // --convert-callchain: unwinds samples again with what the resolve used; its
    // counts go into the report.
    &["convert"],
    &["report"],
    &["engine"],
    &["sink"],
    &["driver"],
    &["batch"],
    // What the tests, benches and fuzz targets reach besides the API (the fuzz
    // targets' bodies among it): above every room it may drive, below nothing.
    &["testing"],
];

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable src dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's rooms: the modules `src/lib.rs` declares (the binary's own modules,
/// the command line, are not rooms of the library).
fn library_rooms(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("readable src/lib.rs");
    code(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.split_once("mod ")?.1;
            let name = rest.strip_suffix(';')?;
            (l.starts_with("pub") || l.starts_with("mod")).then(|| name.trim().to_string())
        })
        .collect()
}

/// The room a file of `src/` belongs to (`None`: the crate root and the binary's
/// modules).
fn room_of(src: &Path, rooms: &BTreeSet<String>, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    rooms.contains(name).then(|| name.to_string())
}

/// The code of a file without comments and without its `#[cfg(test)]` module (tests
/// may reach anywhere).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The rooms named by `crate::NAME` paths in `code`, with those inside `use
/// crate::{a, b::c}` groups.
fn used_rooms(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // `use crate::{a::X, b, c::{..}}`: the first name of each top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && !c.is_whitespace() => {
                        out.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    // `crate::Error`/`crate::Result` are re-exports of the error room.
    for reexport in ["Error", "Result"] {
        if out.remove(reexport) {
            out.insert("error".into());
        }
    }
    out.retain(|r| !r.is_empty() && r.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    out
}

/// room -> rooms it uses (itself left out).
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = manifest_dir().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rooms = library_rooms(&src);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(room) = room_of(&src, &rooms, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("readable source");
        let used = used_rooms(&code(&text));
        let e = g.entry(room.clone()).or_default();
        e.extend(used.into_iter().filter(|u| *u != room));
    }
    g
}

#[test]
fn every_room_has_a_floor() {
    let unplaced: Vec<String> = edges()
        .keys()
        .filter(|r| floor_of(r).is_none())
        .cloned()
        .collect();
    assert!(
        unplaced.is_empty(),
        "rooms without a floor in tests/it/layers.rs: {unplaced:?}"
    );
}

#[test]
fn no_room_reaches_up() {
    let mut up = Vec::new();
    for (room, used) in edges() {
        let Some(mine) = floor_of(&room) else {
            continue;
        };
        for u in used {
            if floor_of(&u).is_some_and(|theirs| theirs > mine) {
                up.push(format!("{room} -> {u}"));
            }
        }
    }
    assert!(up.is_empty(), "rooms using a room above them: {up:#?}");
}

#[test]
fn no_cycle_between_rooms() {
    let g = edges();
    // Depth-first search for a back edge; the path found is reported.
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut cycle = path[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(g, m, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(&g, n, &mut Vec::new(), &mut done) {
            panic!("import cycle between rooms: {}", c.join(" -> "));
        }
    }
}
