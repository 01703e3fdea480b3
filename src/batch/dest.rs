//! Where outputs go: the destination, each input's output path, outputs that would
//! collide with an input or another output, and temp files an interrupted run left.

use super::discover::{Input, absolute};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where outputs go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Under this directory, at each input's relative path.
    OutDir(PathBuf),
    /// Beside each input, its name with this suffix appended (`perf.data.bid`).
    Suffix(String),
    /// The input itself, rewritten in place (crash-safe; see docs/in-place.md).
    InPlace,
}

/// The output path of `input`.
pub(crate) fn output_path(dest: &Dest, input: &Input) -> PathBuf {
    match dest {
        Dest::OutDir(d) => d.join(&input.rel),
        Dest::InPlace => input.path.clone(),
        Dest::Suffix(s) => {
            let mut o = input.path.clone().into_os_string();
            o.push(s);
            PathBuf::from(o)
        }
    }
}

/// Problems the batch can see before running: outputs that would overwrite another
/// input, or land inside another output. Indexed like `inputs`.
pub(super) fn conflicts(inputs: &[Input], dest: &Dest) -> BTreeMap<usize, String> {
    let outs: Vec<PathBuf> = inputs
        .iter()
        .map(|i| absolute(&output_path(dest, i)))
        .collect();
    let ins: BTreeMap<PathBuf, usize> = inputs
        .iter()
        .enumerate()
        .map(|(n, i)| (absolute(&i.path), n))
        .collect();
    let by_out: BTreeMap<&Path, usize> = outs
        .iter()
        .enumerate()
        .map(|(n, o)| (o.as_path(), n))
        .collect();
    let mut bad = BTreeMap::new();
    for (n, o) in outs.iter().enumerate() {
        if let Some(&m) = ins.get(o)
            && m != n
        {
            bad.insert(
                n,
                format!(
                    "the output {} would overwrite the input {}",
                    o.display(),
                    inputs[m].path.display()
                ),
            );
            continue;
        }
        if let Some(&m) = o.ancestors().skip(1).find_map(|a| by_out.get(a)) {
            bad.insert(
                n,
                format!(
                    "the output {} would be inside the output of {}",
                    o.display(),
                    inputs[m].path.display()
                ),
            );
        }
    }
    bad
}

/// Removes what an interrupted earlier run left beside `output`: temp outputs
/// ([`crate::write::temp_name`]) of a PID that is no running process on this machine.
pub(super) fn remove_stale_temps(output: &Path) {
    let Some(dir) = output.parent() else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name();
        let Some(pid) = n
            .to_str()
            .and_then(crate::write::temp_name_pid)
            .and_then(|p| libc::pid_t::try_from(p).ok())
            .filter(|&p| p > 0 && p != std::process::id() as libc::pid_t)
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let p = e.path();
            let _ = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicting_outputs_are_refused() {
        let i = |p: &str, rel: &str| Input {
            path: PathBuf::from(p),
            rel: PathBuf::from(rel),
            bytes: 0,
            problem: None,
        };
        let ins = [i("/x/a.data", "a.data"), i("/x/a.data.bid", "a.data.bid")];
        let bad = conflicts(&ins, &Dest::Suffix(".bid".into()));
        assert_eq!(bad.keys().copied().collect::<Vec<_>>(), [0]);
        let ins = [i("/x/p", "p"), i("/x/p/data", "p/data")];
        let bad = conflicts(&ins, &Dest::OutDir("/o".into()));
        assert_eq!(bad.keys().copied().collect::<Vec<_>>(), [1]);
    }
}
