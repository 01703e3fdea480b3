//! Batch mode: many recordings in one process, with one memo of DSO build IDs
//! ([`crate::buildid::memo`]), per-file errors that never stop the batch, resumable
//! runs and stable sharding over job arrays.
//!
//! The steps, each usable on its own:
//! [`collect`] turns paths (files, `perf record --threads` directories, directories to
//! walk) into [`Input`]s named relative to their common parent folder;
//! [`Shard`] keeps the inputs one task of a job array owns;
//! [`run`] processes them and calls back once per input with a [`FileResult`] (the
//! single-file [`Report`] plus status, error and skip reason: one JSON line each).

use crate::buildid::memo::{Memo, MemoStats};
use crate::options::Options;
use crate::report::Report;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
fn absolute(p: &Path) -> PathBuf {
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
pub fn is_perf_dir(dir: &Path) -> bool {
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
fn stamp(path: &Path) -> Option<(u64, i128)> {
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

/// 64-bit FNV-1a: the shard hash (fixed, documented, the same on every machine).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// MurmurHash3's 64-bit finalizer. FNV-1a alone is a poor shard hash: its low bits
/// depend only on the low bits of each byte (`host-a` and `host-e` would always share
/// a shard of 4); the finalizer mixes every bit into every other.
pub fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The shard hash of a relative path: `fmix64(fnv1a64(bytes))`, the same on every
/// machine and with every Rust version.
pub fn shard_hash(rel: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    fmix64(fnv1a64(rel.as_os_str().as_bytes()))
}

/// One task's share of the inputs: those whose relative path's [`shard_hash`] is
/// `index` modulo `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// 0-based.
    pub index: u64,
    /// Number of shards, at least 1.
    pub count: u64,
}

/// Environment variable giving the shard count of a Kubernetes Indexed Job (the job
/// sets `JOB_COMPLETION_INDEX` but not the number of completions).
pub const SHARD_COUNT_ENV: &str = "PDINJECT_SHARD_COUNT";

impl Shard {
    /// Parses `K/N` (1-based K, as in "shard 1 of 4").
    pub fn parse(s: &str) -> Result<Shard> {
        let bad = || Error::Usage(format!("--shard '{s}': expected K/N with 1 <= K <= N"));
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k: u64 = k.trim().parse().map_err(|_| bad())?;
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        if k == 0 || n == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard {
            index: k - 1,
            count: n,
        })
    }

    /// The shard of the job array this process runs in: Slurm
    /// (`SLURM_ARRAY_TASK_ID`, with `SLURM_ARRAY_TASK_MIN`/`_MAX`/`_STEP` or `_COUNT`)
    /// or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`, with the count from
    /// `count` or [`SHARD_COUNT_ENV`]). `env` reads a variable.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, count: Option<u64>) -> Result<Shard> {
        let num = |name: &str| -> Result<Option<u64>> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    Error::Usage(format!("--shard auto: {name}='{v}' is not a number"))
                }),
            }
        };
        let shard = if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = num("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            let n = num("SLURM_ARRAY_TASK_COUNT")?;
            let range = num("SLURM_ARRAY_TASK_MAX")?
                .filter(|&max| max >= min)
                .map(|max| (max - min) / step + 1);
            let derived = match (range, n) {
                (Some(r), Some(n)) if r != n => {
                    return Err(Error::Usage(format!(
                        "--shard auto: the Slurm array is not a contiguous range ({n} tasks between {min} and the max): use --array=0-{} or --shard K/N",
                        n.saturating_sub(1)
                    )));
                }
                (Some(r), _) => r,
                (None, Some(n)) => n,
                (None, None) => {
                    return Err(Error::Usage(
                        "--shard auto: SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_MAX nor SLURM_ARRAY_TASK_COUNT".into(),
                    ));
                }
            };
            if let Some(c) = count
                && c != derived
            {
                return Err(Error::Usage(format!(
                    "--shard-count {c} contradicts the Slurm array's {derived} tasks"
                )));
            }
            if id < min || (id - min) % step != 0 {
                return Err(Error::Usage(format!(
                    "--shard auto: SLURM_ARRAY_TASK_ID {id} is not in the array's range"
                )));
            }
            Shard {
                index: (id - min) / step,
                count: derived,
            }
        } else if let Some(i) = num("JOB_COMPLETION_INDEX")? {
            let n = match count {
                Some(c) => c,
                None => num(SHARD_COUNT_ENV)?.ok_or_else(|| {
                    Error::Usage(format!(
                        "--shard auto in a Kubernetes Indexed Job needs the number of completions: --shard-count N or {SHARD_COUNT_ENV}"
                    ))
                })?,
            };
            Shard { index: i, count: n }
        } else {
            return Err(Error::Usage(
                "--shard auto: not in a Slurm job array (SLURM_ARRAY_TASK_ID) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)".into(),
            ));
        };
        if shard.count == 0 || shard.index >= shard.count {
            return Err(Error::Usage(format!(
                "--shard auto: index {} is not below the count {}",
                shard.index, shard.count
            )));
        }
        Ok(shard)
    }

    /// Whether this shard owns the input at `rel` (hash of its bytes, so the split
    /// does not depend on the order or the machine).
    pub fn owns(&self, rel: &Path) -> bool {
        shard_hash(rel) % self.count == self.index
    }
}

/// Options of a batch.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Per-file options (their `jobs` and `progress` are set by the batch).
    pub engine: Options,
    /// Where outputs go.
    pub dest: Dest,
    /// Worker threads in all (default: all cores).
    pub jobs: Option<usize>,
    /// Redo outputs that are up to date.
    pub force: bool,
    /// Inputs smaller than this run side by side, one thread each; larger ones one at
    /// a time with every thread (see docs/unwinding.md for the measurement).
    pub concurrent_below: u64,
}

/// Default [`BatchOptions::concurrent_below`]: 64 MiB.
pub const CONCURRENT_BELOW: u64 = 64 << 20;

/// How an input ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Output written.
    Ok,
    /// Not processed: see `error`.
    Failed,
    /// Output already up to date: see `skipped`.
    Skipped,
}

/// One line of the batch report.
#[derive(Clone, Debug, Serialize)]
pub struct FileResult {
    /// How it ended.
    pub status: Status,
    /// Why it failed.
    pub error: Option<String>,
    /// Why it was skipped.
    pub skipped: Option<String>,
    /// Something the user should know about a done input (its up-to-date marker could
    /// not be written).
    pub warning: Option<String>,
    /// Input bytes.
    pub input_bytes: u64,
    /// Wall time of this input in seconds.
    pub seconds: f64,
    /// The single-file report (only input and output set unless status is ok).
    #[serde(flatten)]
    pub report: Report,
}

impl FileResult {
    /// `input` not done (yet): failed, with `error` when there is one.
    fn failed(input: &Input, dest: &Dest, error: Option<String>) -> FileResult {
        FileResult {
            status: Status::Failed,
            error,
            skipped: None,
            warning: None,
            input_bytes: input.bytes,
            seconds: 0.0,
            report: Report {
                input: input.path.display().to_string(),
                output: output_path(dest, input).display().to_string(),
                ..Report::default()
            },
        }
    }
}

/// Totals of a batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Inputs handled (this shard's).
    pub inputs: usize,
    /// Written.
    pub ok: usize,
    /// Failed.
    pub failed: usize,
    /// Up to date, skipped.
    pub skipped: usize,
    /// Input bytes of this shard.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Worker threads.
    pub jobs: usize,
    /// DSO files read, proofs run, memo hits.
    #[serde(flatten)]
    pub memo: MemoStats,
}

impl Summary {
    /// Exit code: 0 every input done or up to date (or none to do), 3 some failed,
    /// 1 all failed.
    pub fn exit_code(&self) -> i32 {
        if self.failed == 0 {
            0
        } else if self.failed < self.inputs {
            3
        } else {
            1
        }
    }
}

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

/// The options that change an output, as one string (stored in each marker).
pub fn fingerprint(o: &Options) -> String {
    let known: Vec<String> = o.known.iter().map(|(id, p)| format!("{id} {p}")).collect();
    // Only a non-default --attrs-for is named, so markers written before the option
    // existed still match runs without it.
    let attrs = match o.attrs_for {
        crate::options::AttrsFor::Verbatim => String::new(),
        a => format!(";attrs_for={}", a.perf()),
    };
    format!(
        "mode={:?};known={};unwind={:?};unwind_budget_ns={};max_frames={};symfs={:?};mmap2={}{attrs}",
        o.mode,
        known.join(","),
        o.unwind,
        o.unwind_budget.as_nanos(),
        o.max_frames,
        o.symfs,
        o.mmap2
    )
}

/// The output path of `input`.
pub fn output_path(dest: &Dest, input: &Input) -> PathBuf {
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

/// Where the up-to-date marker of `input`'s output lives: `OUT/.pdinject/REL.json`
/// under an output directory, `.NAME.pdinject.json` beside a suffixed output.
pub fn marker_path(dest: &Dest, input: &Input) -> PathBuf {
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

fn up_to_date(marker: &Path, input: &Path, output: &Path, options: &str) -> bool {
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

fn write_marker(marker: &Path, input: &Path, output: &Path, options: &str) -> Result<()> {
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

/// Problems the batch can see before running: outputs that would overwrite another
/// input, or land inside another output. Indexed like `inputs`.
fn conflicts(inputs: &[Input], dest: &Dest) -> BTreeMap<usize, String> {
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
fn remove_stale_temps(output: &Path) {
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

/// The batch's view of one input's error: its message, naming the input when the
/// error does not already.
fn describe(input: &Path, e: &Error) -> String {
    let m = e.to_string();
    let name = input.display().to_string();
    if m.contains(&name) {
        m
    } else {
        format!("{name}: {m}")
    }
}

fn process(input: &Input, opts: &BatchOptions, fp: &str, pool: &rayon::ThreadPool) -> FileResult {
    let t = Instant::now();
    let output = output_path(&opts.dest, input);
    let marker = marker_path(&opts.dest, input);
    let mut res = FileResult::failed(input, &opts.dest, None);
    if let Some(p) = &input.problem {
        res.error = Some(format!("{}: {p}", input.path.display()));
        return res;
    }
    if !opts.force && up_to_date(&marker, &input.path, &output, fp) {
        res.status = Status::Skipped;
        res.skipped = Some("up to date".into());
        res.seconds = t.elapsed().as_secs_f64();
        return res;
    }
    let engine = Options {
        progress: None,
        ..opts.engine.clone()
    };
    let cx = crate::engine::Context {
        opts: &engine,
        pool,
        host: crate::engine::Host::Consult,
    };
    let in_place = opts.dest == Dest::InPlace;
    let r = (|| {
        if let Some(d) = output.parent()
            && !d.as_os_str().is_empty()
            && !in_place
        {
            std::fs::create_dir_all(d).map_err(|e| Error::Output {
                path: output.clone(),
                source: e,
            })?;
        }
        remove_stale_temps(&output);
        // A panic in one input must not end the batch; the library is meant never to
        // panic, so this only turns a bug into that input's error line.
        let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if in_place {
                crate::run::run_in_place_in(cx, &input.path)
            } else {
                crate::run::run_in(cx, &input.path, &output)
            }
        }))
        .map_err(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Error::unsupported(format!("internal error (panic): {what}"))
        })??;
        Ok::<_, Error>(report)
    })();
    match r {
        Ok(rep) => {
            res.status = Status::Ok;
            res.report = rep;
            // The output is right without its marker; only the next run will redo it.
            if let Err(e) = write_marker(&marker, &input.path, &output, fp) {
                res.warning = Some(format!(
                    "{}: the output is written but a rerun will redo it: cannot write its marker: {e}",
                    input.path.display()
                ));
            }
        }
        Err(e) => res.error = Some(describe(&input.path, &e)),
    }
    res.seconds = t.elapsed().as_secs_f64();
    res
}

/// Processes `inputs` (already sharded) and calls `done` once per input, from the
/// worker that finished it. Small inputs run side by side, one worker thread each (the
/// faster way on few cores: per-file stages of small recordings are too short to share
/// well); inputs of [`BatchOptions::concurrent_below`] bytes or more run one at a time
/// with every thread. One memo serves all of them.
pub fn run(inputs: &[Input], opts: &BatchOptions, done: &(dyn Fn(&FileResult) + Sync)) -> Summary {
    let t = Instant::now();
    let jobs = opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let fp = fingerprint(&opts.engine);
    // One pool with every thread for large inputs; small ones run side by side, one
    // pool of one thread per worker, each kept for all the worker's inputs.
    let pool = match (Options {
        jobs: Some(jobs),
        ..Options::default()
    })
    .pool()
    {
        Ok(p) => p,
        Err(e) => {
            let mut s = Summary {
                inputs: inputs.len(),
                failed: inputs.len(),
                ..Summary::default()
            };
            for i in inputs {
                done(&FileResult::failed(
                    i,
                    &opts.dest,
                    Some(format!("{}: {e}", i.path.display())),
                ));
            }
            s.seconds = t.elapsed().as_secs_f64();
            return s;
        }
    };
    let memo = Arc::new(Memo::new());
    // Every input's run proves through the one memo.
    let opts = &BatchOptions {
        engine: Options {
            memo: Some(memo.clone()),
            ..opts.engine.clone()
        },
        ..opts.clone()
    };
    let bad = conflicts(inputs, &opts.dest);
    let summary = std::sync::Mutex::new(Summary {
        inputs: inputs.len(),
        bytes: inputs.iter().map(|i| i.bytes).sum(),
        jobs,
        ..Summary::default()
    });
    let finish = |r: FileResult| {
        if let Ok(mut s) = summary.lock() {
            match r.status {
                Status::Ok => s.ok += 1,
                Status::Failed => s.failed += 1,
                Status::Skipped => s.skipped += 1,
            }
        }
        done(&r);
    };
    let (big, small): (Vec<usize>, Vec<usize>) = (0..inputs.len())
        .filter(|n| !bad.contains_key(n))
        .partition(|&n| inputs[n].bytes >= opts.concurrent_below);
    for (&n, why) in &bad {
        finish(FileResult::failed(
            &inputs[n],
            &opts.dest,
            Some(format!("{}: {why}", inputs[n].path.display())),
        ));
    }
    for n in big {
        finish(process(&inputs[n], opts, &fp, &pool));
    }
    // Plain threads taking the next input from a counter (not the pool's own workers,
    // which would steal more inputs onto their stacks while they wait).
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(small.len()) {
            s.spawn(|| {
                // Each worker keeps one single-thread pool for all its inputs: small
                // recordings' stages are too short to share two threads well.
                let own = Options {
                    jobs: Some(1),
                    ..Options::default()
                }
                .pool();
                let pool = own.as_ref().unwrap_or(&pool);
                while let Some(&n) = small.get(next.fetch_add(1, Ordering::Relaxed)) {
                    finish(process(&inputs[n], opts, &fp, pool));
                }
            });
        }
    });
    let mut s = summary.into_inner().unwrap_or_default();
    s.memo = memo.stats();
    s.seconds = t.elapsed().as_secs_f64();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_parse_and_hash() {
        assert_eq!(Shard::parse("2/4").unwrap(), Shard { index: 1, count: 4 });
        for bad in ["0/4", "5/4", "1/0", "x", "1/", "/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        // The published FNV-1a test vectors: the split must be the same everywhere.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
        let rels: Vec<PathBuf> = (0..100)
            .map(|i| PathBuf::from(format!("host{i}/perf.data")))
            .collect();
        for r in &rels {
            let owners = (1..=4)
                .filter(|k| Shard::parse(&format!("{k}/4")).unwrap().owns(r))
                .count();
            assert_eq!(owners, 1);
        }
        // Names that differ only in bytes with the same low bits still spread.
        let mut per = [0usize; 4];
        for c in ["a", "e", "i", "m", "q", "u", "y"] {
            for i in 0..8 {
                let r = PathBuf::from(format!("host-{c}{}/perf.data", i * 4));
                per[(shard_hash(&r) % 4) as usize] += 1;
            }
        }
        assert!(per.iter().all(|&n| n >= 6), "{per:?}");
        // Pinned: the split must not change between versions or machines.
        assert_eq!(shard_hash(Path::new("host1/perf.data")), {
            fmix64(fnv1a64(b"host1/perf.data"))
        });
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456bcfc34c2cb2c);
    }

    #[test]
    fn shard_from_env() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let s = |vars, c| Shard::from_env(&env(vars), c);
        assert_eq!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "0"),
                    ("SLURM_ARRAY_TASK_MAX", "3")
                ],
                None
            )
            .unwrap(),
            Shard { index: 3, count: 4 }
        );
        assert_eq!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "5"),
                    ("SLURM_ARRAY_TASK_COUNT", "8")
                ],
                None
            )
            .unwrap(),
            Shard { index: 5, count: 8 }
        );
        // --array=1,3,7: not a range, no way to number the tasks 0..N.
        assert!(
            s(
                &[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_MAX", "7"),
                    ("SLURM_ARRAY_TASK_COUNT", "3")
                ],
                None
            )
            .is_err()
        );
        assert_eq!(
            s(&[("JOB_COMPLETION_INDEX", "2")], Some(5)).unwrap(),
            Shard { index: 2, count: 5 }
        );
        assert_eq!(
            s(
                &[("JOB_COMPLETION_INDEX", "0"), (SHARD_COUNT_ENV, "3")],
                None
            )
            .unwrap(),
            Shard { index: 0, count: 3 }
        );
        assert!(s(&[("JOB_COMPLETION_INDEX", "2")], None).is_err());
        assert!(s(&[("JOB_COMPLETION_INDEX", "5")], Some(5)).is_err());
        assert!(s(&[], Some(5)).is_err());
    }

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
