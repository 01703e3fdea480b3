//! Up-to-date markers: a small JSON sidecar per output saying what wrote it and from
//! what, so a rerun skips outputs that are still right (resumable batches).

use super::dest::{Dest, output_path};
use super::discover::{Input, stamp};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The marker that says an output is up to date: what wrote it and what it was
/// written from. Kept as a small JSON sidecar file (see [`marker_path`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    pdinject: String,
    options: String,
    input_size: u64,
    input_mtime_ns: i128,
    output_size: u64,
    output_mtime_ns: i128,
}

/// Where the up-to-date marker of `input`'s output lives: `OUT/.pdinject/REL.json`
/// under an output directory, `.NAME.pdinject.json` beside a suffixed output.
pub(crate) fn marker_path(dest: &Dest, input: &Input) -> PathBuf {
    match dest {
        Dest::OutDir(d) => {
            let mut p = d.join(".pdinject").join(&input.rel).into_os_string();
            p.push(".json");
            PathBuf::from(p)
        }
        // Not `.NAME.pdinject.json`: the walk takes a file with that beside it for
        // an earlier batch's output, and an input rewritten in place is still one.
        Dest::InPlace => {
            let name = input
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            input
                .path
                .with_file_name(format!(".{name}.pdinject-inplace.json"))
        }
        Dest::Suffix(_) => {
            let out = output_path(dest, input);
            let name = out
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.with_file_name(format!(".{name}.pdinject.json"))
        }
    }
}

pub(super) fn up_to_date(marker: &Path, input: &Path, output: &Path, options: &str) -> bool {
    let Some(m) = std::fs::read(marker)
        .ok()
        .and_then(|b| serde_json::from_slice::<Marker>(&b).ok())
    else {
        return false;
    };
    let (Some(i), Some(o)) = (stamp(input), stamp(output)) else {
        return false;
    };
    m.pdinject == env!("CARGO_PKG_VERSION")
        && m.options == options
        && (m.input_size, m.input_mtime_ns) == i
        && (m.output_size, m.output_mtime_ns) == o
        && o.1 >= i.1
}

pub(super) fn write_marker(
    marker: &Path,
    input: &Path,
    output: &Path,
    options: &str,
) -> Result<()> {
    let (Some(i), Some(o)) = (stamp(input), stamp(output)) else {
        return Ok(());
    };
    let m = Marker {
        pdinject: env!("CARGO_PKG_VERSION").into(),
        options: options.into(),
        input_size: i.0,
        input_mtime_ns: i.1,
        output_size: o.0,
        output_mtime_ns: o.1,
    };
    if let Some(d) = marker.parent() {
        std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    }
    let json = serde_json::to_vec(&m).map_err(|e| Error::unsupported(format!("marker: {e}")))?;
    // Written beside and renamed: a marker is whole or absent.
    let mut tmp = marker.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, marker).map_err(|e| Error::io(marker, e))
}
