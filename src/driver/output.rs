//! Where a run's output goes: the sink that writes it in the options' form, the
//! engine's results handed to that sink ([`Fed`]), and a finished file output's
//! attrs made to say what its data holds.

use super::is_dash;
use crate::engine::{Consumer, Decision, Engine};
use crate::error::{Error, Result};
use crate::format::Endian;
use crate::input::PerfInput;
use crate::options::{Callchains, Form, Options};
use crate::report::{Report, SinkReport};
use crate::sink::edited::EditedSink;
use crate::sink::inplace::InplaceSink;
use crate::sink::mmap2::Mmap2Sink;
use crate::sink::stream::StreamSink;
use crate::sink::table::TableSink;
use crate::sink::{Batch, Begin, Facts, Sink, Staged};
use crate::write::TempOutput;
use std::io::{BufWriter, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Where a run's output goes, ready to be written. With the output's [`Form`] it
/// picks the sink, once ([`sink_for`]).
pub(super) enum Output {
    /// A stream on stdout (`-`).
    Stdout,
    /// A file-format perf.data (or a directory, `dir`, for a directory input),
    /// written to a temp beside its path and committed at the end.
    File { tmp: TempOutput, dir: bool },
    /// The input itself, only what changes, crash-safe ([`crate::write::inplace`]).
    InPlace,
}

impl Output {
    /// The new output `output` of a run from `input` (a directory when `dir`), made
    /// ready: stdout when it is not a terminal, else a temp file beside it.
    pub(super) fn open(input: &Path, output: &Path, dir: bool) -> Result<Output> {
        if is_dash(output) {
            if std::io::stdout().is_terminal() {
                return Err(Error::Usage(
                    "refusing to write perf data to a terminal; redirect or pipe the output".into(),
                ));
            }
            return Ok(Output::Stdout);
        }
        // perf.data holds secrets (paths, command lines, stacks): the output's mode
        // follows the input's; perf's 0600 for a stream read from stdin.
        let mode = if is_dash(input) {
            None
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(input)
                .ok()
                .map(|m| m.permissions().mode() & 0o7777)
        };
        let tmp = TempOutput::create_with_mode(output, dir, mode)?;
        Ok(Output::File { tmp, dir })
    }

    /// The output after the sink wrote what ended in `r`: a file's attrs as its data
    /// has them and cut to `--attrs-for` (its temp file left for the caller to
    /// commit); `in_name` and `output` name the input and output in errors.
    pub(super) fn close(
        self,
        r: Result<Report>,
        opts: &Options,
        in_name: &Path,
        output: &Path,
    ) -> Result<(Report, Option<TempOutput>)> {
        let tmp = match self {
            Output::File { tmp, .. } => tmp,
            Output::Stdout | Output::InPlace => return Ok((r?, None)),
        };
        let mut r = r
            .and_then(|r| rewrite_attrs(&tmp.header_file_path(), opts).map(|()| r))
            .map_err(|e| e.for_output(&tmp.path, output))?;
        // The attrs are cut in the finished output, whatever sink wrote it: the
        // output's own header says where they ended up.
        let cut = crate::format::attr_compat::rewrite_file(&tmp.header_file_path(), opts.attrs_for)
            .map_err(|e| e.in_file(in_name).for_output(&tmp.path, output))?;
        if let (Some(from), Some(to)) = (cut, opts.attrs_for.size()) {
            r.notes
                .push(crate::format::attr_compat::note(from, to, opts.attrs_for));
        }
        Ok((r, Some(tmp)))
    }
}

/// The sink that writes `target` in `form`: the one place outputs and forms meet.
/// Data that changes (`--convert-callchain`, `--jit`) is written by the editing
/// sink in any form.
pub(super) fn sink_for(target: &Output, opts: &Options) -> Box<dyn Sink> {
    let (form, callchains) = (opts.form, opts.callchains);
    let edits = callchains == Callchains::Converted
        || opts.jit != crate::options::JitChoice::Off
        || opts.addresses == crate::options::Addresses::Remapped;
    match target {
        Output::Stdout => {
            let w = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
            stream_sink(Box::new(w), Path::new("<stdout>"), opts)
        }
        Output::File { tmp, dir } => {
            let header_out = tmp.header_file_path();
            let dir = dir.then_some(tmp.path.as_path());
            match (edits, form) {
                (true, form) => Box::new(EditedSink::file(&header_out, dir, form, callchains)),
                (false, Form::Table) => Box::new(TableSink::new(&header_out, dir)),
                (false, Form::Mmap2) => Box::new(Mmap2Sink::file(&header_out, dir)),
            }
        }
        Output::InPlace => Box::new(InplaceSink::new(form)),
    }
}

/// The sink that writes a stream to `w` in the options' form.
pub(super) fn stream_sink<'w>(
    w: Box<dyn std::io::Write + 'w>,
    name: &Path,
    opts: &Options,
) -> Box<dyn Sink + 'w> {
    let edits = opts.callchains == Callchains::Converted
        || opts.jit != crate::options::JitChoice::Off
        || opts.addresses == crate::options::Addresses::Remapped;
    let mut sink = StreamSink::new(w, name);
    sink.set_attrs_for(opts.attrs_for);
    match (edits, opts.form) {
        (true, form) => Box::new(EditedSink::stream(sink, form, opts.callchains)),
        (false, Form::Table) => Box::new(sink),
        (false, Form::Mmap2) => Box::new(Mmap2Sink::stream(sink)),
    }
}

/// The attrs of a finished file output as its data has them, wherever the sink wrote
/// them: a conversion's lose the dumps (crate::convert::convert_attr), `--aslr`'s the
/// registers (crate::aslr::remap::strip_attr).
fn rewrite_attrs(path: &Path, opts: &Options) -> Result<()> {
    let converts = opts.callchains == Callchains::Converted;
    let remaps = opts.addresses == crate::options::Addresses::Remapped;
    if !converts && !remaps {
        return Ok(());
    }
    crate::convert::rewrite_file_attrs(path, &|a, e| {
        let mut changed = converts && crate::convert::convert_attr(a, e);
        if remaps {
            crate::aslr::remap::strip_attr(a, e, false);
            changed = true;
        }
        changed
    })
}

/// A sink as the engine's [`Consumer`]: each call handed on with what the engine has
/// read and decided ([`Facts`]).
pub(super) struct Fed<'s>(pub(super) &'s mut dyn Sink);

impl Consumer for Fed<'_> {
    fn start_file(&mut self, input: &PerfInput, stop: &Arc<AtomicBool>) -> Result<()> {
        self.0.begin(&Begin::File(input), stop)
    }

    fn start_stream(&mut self, header: &[u8], e: Endian, stop: &Arc<AtomicBool>) -> Result<()> {
        self.0.begin(&Begin::Stream { header, endian: e }, stop)
    }

    fn file_batch(
        &mut self,
        engine: &Engine<'_>,
        input: &PerfInput,
        new: &[Decision],
    ) -> Result<()> {
        with_facts(engine, |facts| {
            self.0.batch(&Batch::File { input, new }, facts)
        })
    }

    fn bytes_batch(
        &mut self,
        engine: &Engine<'_>,
        bytes: &[u8],
        offset: u64,
        new: &[Decision],
    ) -> Result<()> {
        let batch = Batch::Bytes { bytes, offset, new };
        with_facts(engine, |facts| self.0.batch(&batch, facts))
    }

    fn finish(&mut self, engine: &Engine<'_>) -> Result<SinkReport> {
        with_facts(engine, |facts| self.0.finish(facts))
    }

    fn mapped_beside(&self) -> u64 {
        self.0.mapped_beside()
    }

    fn spill_dir(&self) -> Option<PathBuf> {
        self.0.spill_dir()
    }

    fn abort(&mut self) -> Option<Error> {
        self.0.abort()
    }
}

/// Calls `f` with what the engine has read and decided, as the sinks take it.
fn with_facts<R>(engine: &Engine<'_>, f: impl FnOnce(&Facts<'_>) -> R) -> R {
    let passes_on = |t: &crate::format::buildid::TableEntry| engine.passes_on(t);
    let output_kept = |bytes, offset| engine.check_output_kept(bytes, offset);
    f(&Facts {
        name: engine.name(),
        endian: engine.endian(),
        attrs: engine.attrs(),
        attr_records: engine.attr_records(),
        stream_features: engine.stream_features(),
        decided: engine.decided(),
        mapping_records: engine.mapping_records(),
        user_records: engine.user_records(),
        compressed_records: engine.compressed_records(),
        unaligned_records: engine.unaligned_records(),
        passes_on: &passes_on,
        output_kept: &output_kept,
        stages: Staged {
            spill: engine.spill(),
            splices: engine.splices(),
            layout: engine.layout(),
            // live capture hook (issue 32)
            live: engine.live_capture(),
        },
        time_mode: engine.time_mode(),
        first_seqs: engine.first_seqs(),
    })
}
