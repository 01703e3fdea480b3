//! Discovery: paths (files, `perf record --threads` directories, directories to walk,
//! `--from` lists) turned into [`Input`]s named relative to their common parent folder.

use super::Dest;
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::io::{BufRead, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// One recording of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// The path to open (as given, or as found by the walk).
    pub path: PathBuf,
    /// Its path relative to the inputs' common parent folder: the output's name under
    /// the output directory, and what the shard hash is computed over.
    pub rel: PathBuf,
    /// Bytes (all files of a directory-format recording), for progress.
    pub bytes: u64,
    /// A problem found while listing (unreadable directory): reported as this input's
    /// failure.
    pub problem: Option<String>,
}

/// What [`collect`] found.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// The inputs, sorted by `rel`.
    pub inputs: Vec<Input>,
    /// The common parent folder.
    pub parent: PathBuf,
}

/// What the walk leaves out.
#[derive(Clone, Debug, Default)]
pub struct WalkSkip {
    /// `(st_dev, st_ino)` of the output directory (a rerun must not take its outputs
    /// for inputs).
    pub out_dir: Option<(u64, u64)>,
    /// Output suffix (same reason).
    pub suffix: Option<String>,
}

impl WalkSkip {
    /// What to leave out for outputs going to `dest`.
    pub fn for_dest(dest: &Dest) -> WalkSkip {
        match dest {
            Dest::OutDir(d) => WalkSkip {
                out_dir: std::fs::metadata(d).ok().map(|m| (m.dev(), m.ino())),
                suffix: None,
            },
            Dest::Suffix(s) => WalkSkip {
                out_dir: None,
                suffix: Some(s.clone()),
            },
            Dest::InPlace => WalkSkip::default(),
        }
    }
}

/// Reads a list of paths, one per line (`--from FILE`, `--from -`); blank lines and
/// surrounding whitespace are ignored.
pub fn read_list(r: &mut dyn Read, name: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for line in std::io::BufReader::new(r).split(b'\n') {
        let line = line.map_err(|e| Error::io(name, e))?;
        let s = line.trim_ascii();
        if !s.is_empty() {
            use std::os::unix::ffi::OsStrExt;
            out.push(PathBuf::from(std::ffi::OsStr::from_bytes(s)));
        }
    }
    Ok(out)
}

/// An absolute path with `.` and `..` resolved by name (not through symlinks): output
/// names follow the paths the user gave.
pub(super) fn absolute(p: &Path) -> PathBuf {
    let a = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in a.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// The first 8 bytes say perf.data (either byte order; pipe format included).
fn has_perf_magic(path: &Path) -> bool {
    let mut m = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .is_ok()
        && (&m == b"PERFILE2" || &m == b"2ELIFREP")
}

/// A `perf record --threads` recording: a directory with a perf.data `data` file and
/// `data.N` streams.
pub(crate) fn is_perf_dir(dir: &Path) -> bool {
    let data = dir.join("data");
    if !std::fs::metadata(&data).is_ok_and(|m| m.is_file()) || !has_perf_magic(&data) {
        return false;
    }
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("data."))
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
    })
}

/// Size and newest mtime (ns) of a file, or of a directory's files (one level).
pub(super) fn stamp(path: &Path) -> Option<(u64, i128)> {
    let m = std::fs::metadata(path).ok()?;
    let t = |m: &std::fs::Metadata| m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128;
    if !m.is_dir() {
        return Some((m.len(), t(&m)));
    }
    let mut size = 0;
    let mut newest = t(&m);
    for e in std::fs::read_dir(path).ok()? {
        let m = e.ok()?.metadata().ok()?;
        size += m.len();
        newest = newest.max(t(&m));
    }
    Some((size, newest))
}

/// Temp files of pdinject's own outputs ([`crate::write::temp_name`]).
fn is_temp_name(name: &str) -> bool {
    crate::write::temp_name_pid(name).is_some()
}

fn walk(dir: &Path, skip: &WalkSkip, found: &mut Vec<(PathBuf, Option<String>)>) {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            found.push((
                dir.to_path_buf(),
                Some(format!("cannot list directory: {e}")),
            ));
            return;
        }
    };
    let mut ents: Vec<_> = rd.flatten().collect();
    ents.sort_by_key(|e| e.file_name());
    for e in ents {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        // Symlinks are not followed: a walk must end, and a link to a recording
        // elsewhere would give it a second name.
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            if let (Some(out), Ok(m)) = (skip.out_dir, e.metadata())
                && (m.dev(), m.ino()) == out
            {
                continue;
            }
            if is_perf_dir(&p) {
                found.push((p, None));
            } else {
                walk(&p, skip, found);
            }
        } else if ft.is_file() {
            if is_temp_name(&name)
                || name.ends_with(".pdinject.json")
                || skip
                    .suffix
                    .as_deref()
                    .is_some_and(|s| !s.is_empty() && name.ends_with(s))
            {
                continue;
            }
            // A file with a suffix-mode marker beside it is an output of an earlier
            // batch (perhaps with another suffix), not a recording.
            if has_perf_magic(&p) && !dir.join(format!(".{name}.pdinject.json")).exists() {
                found.push((p, None));
            }
        }
    }
}

fn common_prefix(a: &Path, b: &Path) -> PathBuf {
    a.components()
        .zip(b.components())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x)
        .collect()
}

/// Lists the inputs: files named are inputs whatever they hold (a damaged one gets
/// its error line); `perf record --threads` directories are one input each; other
/// directories are walked for regular files starting with perf.data's magic and for
/// `--threads` directories. Paths are deduplicated; `rel` is relative to the common
/// parent of the named inputs' folders and of the walked directories themselves (so
/// `batch fleet/` names outputs `host/perf.data` however many hosts it holds).
pub fn collect(paths: &[PathBuf], skip: &WalkSkip) -> Listing {
    let mut found: Vec<(PathBuf, Option<String>)> = Vec::new();
    let mut parents: Vec<PathBuf> = Vec::new();
    for p in paths {
        let abs = absolute(p);
        if std::fs::metadata(p).is_ok_and(|m| m.is_dir()) && !is_perf_dir(p) {
            parents.push(abs);
            walk(p, skip, &mut found);
        } else {
            parents.push(abs.parent().map(Path::to_path_buf).unwrap_or(abs.clone()));
            found.push((p.clone(), None));
        }
    }
    let parent = parents
        .iter()
        .skip(1)
        .fold(parents.first().cloned().unwrap_or_default(), |acc, p| {
            common_prefix(&acc, p)
        });
    let mut seen = HashSet::new();
    let mut inputs = Vec::new();
    for (path, problem) in found {
        let abs = absolute(&path);
        if !seen.insert(abs.clone()) {
            continue;
        }
        let rel = abs
            .strip_prefix(&parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| abs.clone());
        let bytes = stamp(&path).map_or(0, |s| s.0);
        inputs.push(Input {
            path,
            rel,
            bytes,
            problem,
        });
    }
    inputs.sort_by(|a, b| a.rel.cmp(&b.rel));
    Listing { inputs, parent }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_relative_to_the_common_parent() {
        let d = tempfile::tempdir().unwrap();
        let fleet = d.path().join("fleet");
        for h in ["a", "b/c"] {
            std::fs::create_dir_all(fleet.join(h)).unwrap();
            std::fs::write(fleet.join(h).join("perf.data"), b"PERFILE2 rest").unwrap();
        }
        std::fs::write(fleet.join("notes.txt"), b"not a recording").unwrap();
        std::fs::write(fleet.join("a/perf.data.bid"), b"PERFILE2 an output").unwrap();
        let threads = fleet.join("t/perf.data");
        std::fs::create_dir_all(&threads).unwrap();
        std::fs::write(threads.join("data"), b"PERFILE2 header").unwrap();
        std::fs::write(threads.join("data.0"), b"stream").unwrap();
        let skip = WalkSkip {
            out_dir: None,
            suffix: Some(".bid".into()),
        };
        let l = collect(std::slice::from_ref(&fleet), &skip);
        let rels: Vec<_> = l.inputs.iter().map(|i| i.rel.clone()).collect();
        assert_eq!(
            rels,
            ["a/perf.data", "b/c/perf.data", "t/perf.data"].map(PathBuf::from)
        );
        // One host only: the walked folder still is the parent.
        let l = collect(&[fleet.join("b")], &skip);
        assert_eq!(l.inputs[0].rel, PathBuf::from("c/perf.data"));
        // Files named: their folders' common parent.
        let l = collect(
            &[fleet.join("a/perf.data"), fleet.join("b/c/perf.data")],
            &skip,
        );
        assert_eq!(l.parent, absolute(&fleet));
        // A named file is an input whatever it holds (it gets its error line).
        let l = collect(&[fleet.join("notes.txt")], &skip);
        assert_eq!(l.inputs.len(), 1);
    }
}
