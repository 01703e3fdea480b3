//! The driver: one run from an input path to an output path. The input is
//! classified once, the sink chosen by the output (`-` is a stream, anything else a
//! file-format perf.data: `output`), and the engine's entry called for the input's
//! kind ([`file`]: one batch; [`stream`]: many); the engine hands each batch's final
//! bytes to the sink through the driver's adapter, with the engine's
//! [`Facts`](crate::sink::Facts). Any input reaches any sink.
//!
//! The driver sits above the engine and the sinks and is the only room that calls
//! both: it may import `engine`, `sink`, `input`, `format`, `write`, `report`,
//! `options`, `signals`; nothing below imports it (but `batch`, which runs it per
//! input).

pub(crate) mod file;
mod output;
pub(crate) mod stream;

pub(crate) use file::run_file;
pub(crate) use stream::{BATCH_BYTES, StreamInput, is_stream_header, run_stream};

use crate::engine::dating::{Dating, wall_ns};
use crate::engine::{Context, Handles, Host, dating::RecordingStart};
use crate::error::{Error, Result};
use crate::format::header::PIPE_HEADER_SIZE;
use crate::input::PerfInput;
use crate::options::{AttrsFor, Callchains, Options, UnwindChoice, Unwinding};
use crate::report::Report;
use crate::sink::{NullSink, Sink};
use crate::write::TempOutput;
use output::{Output, sink_for, stream_sink};
use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

/// What the input path names.
pub(crate) enum Input {
    /// A file-format perf.data (or a `perf record --threads` directory).
    File(Box<PerfInput>),
    /// A stream saved to a regular file (`perf record -o - > FILE`).
    SavedStream(File),
    /// A stream on stdin (a pipe, or a redirected file).
    Stdin(File),
}

fn is_dash(p: &Path) -> bool {
    p.as_os_str() == "-"
}

impl Input {
    /// Classifies `path` (`-` for stdin): the one place that looks at what an input is.
    pub(crate) fn open(path: &Path) -> Result<Input> {
        if is_dash(path) {
            use std::os::fd::AsFd;
            let fd = std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| Error::io("<stdin>", e))?;
            return Ok(Input::Stdin(File::from(fd)));
        }
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()) {
            // A named pipe is a live stream (`perf record -o FIFO`), read like stdin.
            let f = File::open(path).map_err(|e| Error::io(path, e))?;
            return Ok(Input::Stdin(f));
        }
        if meta.is_file() {
            // A truncation while mapped (SIGBUS) names this input.
            crate::signals::input_opened(path);
            let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
            let mut head = [0u8; PIPE_HEADER_SIZE as usize];
            if f.read_exact(&mut head).is_ok() && is_stream_header(&head) {
                f.rewind().map_err(|e| Error::io(path, e))?;
                return Ok(Input::SavedStream(f));
            }
        }
        PerfInput::open(path).map(|i| Input::File(Box::new(i)))
    }

    /// True for a directory recording.
    fn is_dir(&self) -> bool {
        matches!(self, Input::File(i) if i.is_dir)
    }
}

/// True when `a` and `b` name the same file.
pub(crate) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Runs the whole job from `input` to `output`; either may be `-` (stdin, stdout).
pub fn run(input: &Path, output: &Path, opts: &Options) -> Result<Report> {
    run_staged(input, output, opts, None, &mut |_| Ok(()))
}

/// [`run`], then `finish` on the report (the command line adds what it did besides),
/// and the report written as JSON to `report_path`: one run, one outcome. The report
/// goes to a temp file committed together with the output, so a report that cannot
/// be written leaves no output (a stream on stdout is gone before the report exists:
/// there the report is only written whole or not at all).
pub fn run_staged(
    input: &Path,
    output: &Path,
    opts: &Options,
    report_path: Option<&Path>,
    finish: &mut dyn FnMut(&mut Report) -> Result<()>,
) -> Result<Report> {
    if let Some(r) = report_path {
        crate::report::check_report_path(r, input, output)?;
    }
    let opened = Opened::open(opts)?;
    let cx = opened.cx(opts, Host::Consult);
    let (mut report, tmp) = run_uncommitted(cx, input, output)?;
    finish(&mut report)?;
    let staged = match report_path {
        Some(r) => Some(crate::report::stage_json(&report, r)?),
        None => None,
    };
    crate::signals::hooks::pause("commit");
    if let Some(t) = tmp {
        t.commit()?;
    }
    if let Some(r) = staged {
        r.commit()?;
    }
    Ok(report)
}

/// [`run`] on a pool the caller owns (a batch runs every input on one pool).
pub(crate) fn run_in(cx: Context<'_>, input: &Path, output: &Path) -> Result<Report> {
    let (report, tmp) = run_uncommitted(cx, input, output)?;
    if let Some(t) = tmp {
        t.commit()?;
    }
    Ok(report)
}

/// The run into a new output (a file or stdout), with a file output left in its temp
/// file for the caller to commit.
fn run_uncommitted(
    cx: Context<'_>,
    input: &Path,
    output: &Path,
) -> Result<(Report, Option<TempOutput>)> {
    run_plain(cx, input, output)
}

/// The run itself.
fn run_plain(cx: Context<'_>, input: &Path, output: &Path) -> Result<(Report, Option<TempOutput>)> {
    if !is_dash(input) && !is_dash(output) && (input == output || same_file(input, output)) {
        return Err(Error::Usage(format!(
            "{}: output would overwrite the input; write to another file",
            output.display()
        )));
    }
    if !is_dash(input) && crate::write::inplace::has_journal(input) {
        return Err(Error::unsupported(format!(
            "an in-place run was interrupted and left its undo journal {}; run pdinject --in-place on the file to restore and finish it",
            crate::write::inplace::journal_path(input).display()
        ))
        .in_file(input));
    }
    if cx.opts.callchains == Callchains::Converted {
        check_convert(cx.opts)?;
    }
    let src = Input::open(input)?;
    // A file input's attrs are checked before anything is written (a stream's are
    // checked as its HEADER_ATTR records arrive).
    if let Input::File(i) = &src {
        check_attrs_for(i, cx.opts.attrs_for)?;
    }
    let in_name = if is_dash(input) {
        PathBuf::from("<stdin>")
    } else {
        input.to_path_buf()
    };
    let skipped = match &src {
        Input::File(i) => i.skipped_note(),
        _ => None,
    };
    let target = Output::open(input, output, src.is_dir())?;
    let mut sink = sink_for(&target, cx.opts);
    let r = drive(cx, &in_name, src, sink.as_mut());
    drop(sink);
    let (mut report, tmp) = target.close(r, cx.opts, &in_name, output)?;
    report.notes.extend(skipped);
    report.pipe = is_dash(output);
    report.input = input.display().to_string();
    report.output = output.display().to_string();
    Ok((report, tmp))
}

/// Checks that every attr of a file input can be written at `to.size()`, before
/// anything is written (the output sinks cut them, or refuse, as they write).
fn check_attrs_for(input: &PerfInput, to: AttrsFor) -> Result<()> {
    use crate::format::attr_compat::{FEAT_EVENT_DESC, describe, parse_event_desc, shrink};
    let Some(n) = to.size() else {
        return Ok(());
    };
    let h = &input.header;
    let entry = h.attr_size as usize;
    let attr_len = entry - 16;
    if attr_len <= n {
        return Ok(());
    }
    let raw = input.data_files[0].read_at(h.attrs.offset, h.attrs.size)?;
    let names = input
        .feature(FEAT_EVENT_DESC)
        .map(|p| parse_event_desc(&p, h.endian))
        .unwrap_or_default();
    for (i, ent) in raw.chunks_exact(entry).enumerate() {
        let event = || {
            describe(
                i,
                names.get(i).map(String::as_str),
                &ent[..attr_len],
                h.endian,
            )
        };
        shrink(&ent[..attr_len], h.endian, to, &event)
            .map_err(|e| e.in_file(&input.header_path))?;
    }
    Ok(())
}

/// [`run_in_place`], then `finish` on the report and the report written as JSON to
/// `report_path`. In place the file itself is the output, already in its new state
/// when the report is written: the report follows it (a report that cannot be written
/// is an error, the file stays rewritten).
pub fn run_in_place_staged(
    path: &Path,
    opts: &Options,
    report_path: Option<&Path>,
    finish: &mut dyn FnMut(&mut Report) -> Result<()>,
) -> Result<Report> {
    if let Some(r) = report_path {
        crate::report::check_report_path(r, path, path)?;
    }
    let mut report = run_in_place(path, opts)?;
    finish(&mut report)?;
    if let Some(r) = report_path {
        crate::report::stage_json(&report, r)?.commit()?;
    }
    Ok(report)
}

/// Rewrites `path` itself (`--in-place`): restores it first if an earlier in-place
/// run was interrupted, then writes only what changes, crash-safe
/// ([`crate::write::inplace`]).
pub fn run_in_place(path: &Path, opts: &Options) -> Result<Report> {
    if is_dash(path) {
        return Err(Error::Usage(
            "--in-place needs a file, not a stream on stdin".into(),
        ));
    }
    let opened = Opened::open(opts)?;
    let cx = opened.cx(opts, Host::Consult);
    run_in_place_in(cx, path)
}

/// [`run_in_place`] on a pool the caller owns (a batch of files rewritten in place).
pub(crate) fn run_in_place_in(cx: Context<'_>, path: &Path) -> Result<Report> {
    let opts = cx.opts;
    opts.attrs_for.check_in_place()?;
    if opts.callchains == Callchains::Converted {
        return Err(Error::Usage(
            "--convert-callchain cannot rewrite a file in place (the stack dumps it drops would leave the file shorter); write a new file: pdinject --convert-callchain IN OUT".into(),
        ));
    }
    if opts.jit != crate::options::JitChoice::Off {
        return Err(Error::Usage(
            "--jit inserts records into the data, which an in-place run cannot do; write a new file: pdinject --jit IN OUT".into(),
        ));
    }
    if opts.addresses == crate::options::Addresses::Remapped {
        return Err(Error::Usage(
            "--aslr removes records and the register dumps of samples, which leaves the data shorter than an in-place run can write; write a new file: pdinject --aslr IN OUT".into(),
        ));
    }
    let restored = crate::write::inplace::recover(path)?;
    let src = Input::open(path)?;
    if !matches!(src, Input::File(_)) {
        return Err(Error::Usage(format!(
            "{}: --in-place takes a file-format perf.data (a stream cannot gain records in place); write a new file",
            path.display()
        )));
    }
    let mut sink = sink_for(&Output::InPlace, opts);
    let mut report = drive(cx, path, src, sink.as_mut())?;
    if restored {
        report.notes.insert(
            0,
            "an interrupted in-place run was undone from its journal first".into(),
        );
    }
    report.input = path.display().to_string();
    report.output = path.display().to_string();
    Ok(report)
}

/// What `--convert-callchain` needs of the other options.
fn check_convert(opts: &Options) -> Result<()> {
    if matches!(opts.unwind.how, UnwindChoice::None | UnwindChoice::Fp) {
        return Err(Error::Usage(
            "--convert-callchain unwinds with DWARF CFI: it cannot be combined with --unwind none or fp".into(),
        ));
    }
    Ok(())
}

/// Drives the engine over `src` into `sink`.
fn drive(cx: Context<'_>, name: &Path, src: Input, sink: &mut dyn Sink) -> Result<Report> {
    match src {
        Input::File(input) => run_file(cx, &input, sink),
        Input::SavedStream(mut f) | Input::Stdin(mut f) => {
            let meta = f.metadata().map_err(|e| Error::io(name, e))?;
            // A regular file (by path, or redirected to stdin) is read twice: first
            // for the span of its times, so that the recording's start is known
            // before any file is judged. Anything else is a live stream.
            let dating = if meta.is_file() {
                let first = f.stream_position().unwrap_or(0);
                let start = match cx.host {
                    Host::Consult => crate::engine::stream::date_saved_stream(cx, name, &f, first)?,
                    Host::Closed => RecordingStart::Unknown("the host is not consulted".into()),
                };
                Dating::Fixed(start)
            } else {
                Dating::Live {
                    began_ns: wall_ns(),
                }
            };
            let input = StreamInput {
                name: name.to_path_buf(),
                reader: &mut f,
                total: meta.is_file().then_some(meta.len()),
                dating,
                batch: BATCH_BYTES,
            };
            run_stream(cx, input, sink)
        }
    }
}

/// What a run opens from its options before the engine starts: the worker pool and
/// the handles ([`Handles`]).
struct Opened {
    pool: rayon::ThreadPool,
    handles: Handles,
}

impl Opened {
    fn open(opts: &Options) -> Result<Opened> {
        Ok(Opened {
            pool: opts.pool()?,
            handles: Handles::open(opts)?,
        })
    }

    fn cx<'a>(&'a self, opts: &'a Options, host: Host) -> Context<'a> {
        Context {
            opts,
            pool: &self.pool,
            handles: &self.handles,
            host,
        }
    }
}

/// Reads an input through to its end, samples decoded, writing nothing and asking
/// the host nothing: Ok when perf's reader could take every record (what a reader of
/// pdinject's output may rely on; the mutation test and fuzzers check outputs so).
pub fn validate(path: &Path) -> Result<Report> {
    let opts = Options {
        jobs: Some(1),
        unwind: Unwinding {
            how: UnwindChoice::None,
            ..Unwinding::default()
        },
        ..Options::default()
    };
    let opened = Opened::open(&opts)?;
    let src = Input::open(path)?;
    drive(opened.cx(&opts, Host::Closed), path, src, &mut NullSink)
}

/// The engine over `path` (file or stream format) with this host consulted and no
/// output written: scan, model, resolve (unwinding included) and identify. The
/// criterion bench drives this.
pub fn analyse(path: &Path, opts: &Options) -> Result<Report> {
    let opened = Opened::open(opts)?;
    let cx = opened.cx(opts, Host::Consult);
    let src = Input::open(path)?;
    drive(cx, path, src, &mut NullSink)
}

/// [`validate`] over bytes in memory (file or stream format): what the fuzzers drive.
pub fn validate_bytes(bytes: &[u8]) -> Result<Report> {
    let opts = Options {
        jobs: Some(1),
        unwind: Unwinding {
            how: UnwindChoice::None,
            ..Unwinding::default()
        },
        ..Options::default()
    };
    let opened = Opened::open(&opts)?;
    let name = Path::new("<memory>");
    if is_stream_header(bytes) {
        let input = StreamInput {
            name: name.to_path_buf(),
            reader: &mut &bytes[..],
            total: None,
            dating: Dating::Fixed(RecordingStart::Unknown("in memory".into())),
            batch: BATCH_BYTES,
        };
        return run_stream(opened.cx(&opts, Host::Closed), input, &mut NullSink);
    }
    let input = PerfInput::from_bytes(name, bytes.to_vec())?;
    run_file(opened.cx(&opts, Host::Closed), &input, &mut NullSink)
}

/// A stream from any reader to any writer, in batches of `batch` bytes, taken as a
/// live stream (dated by this boot's clock). Tests drive many small batches through
/// the carry-over from one batch to the next; the stream fuzzer drives this.
pub fn stream_in_batches(
    r: &mut dyn Read,
    w: &mut dyn std::io::Write,
    opts: &Options,
    batch: usize,
) -> Result<Report> {
    let opened = Opened::open(opts)?;
    let mut sink = stream_sink(Box::new(w), Path::new("<output>"), opts);
    let input = StreamInput {
        name: PathBuf::from("<stdin>"),
        reader: r,
        total: None,
        dating: Dating::Live {
            began_ns: wall_ns(),
        },
        batch,
    };
    let mut report = run_stream(opened.cx(opts, Host::Consult), input, sink.as_mut())?;
    report.pipe = true;
    Ok(report)
}
