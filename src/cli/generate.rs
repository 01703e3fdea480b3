//! `pdinject --generate WHAT`: the man pages and the shell completions, made from the
//! one clap parser the binary runs (ripgrep's `rg --generate man` spelling), so they
//! cannot drift from the flags. The Debian package ships what this prints
//! (`pkg/build-deb.sh`); docs/install.md says where each goes by hand.

use clap::ValueEnum;
use std::io::Write;

/// What `--generate` prints.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Generate {
    /// The man page pdinject(1).
    Man,
    /// The man page pdinject-batch(1).
    ManBatch,
    /// bash's completion script (`/usr/share/bash-completion/completions/pdinject`).
    CompleteBash,
    /// zsh's completion function (`_pdinject` in a folder of `$fpath`).
    CompleteZsh,
    /// fish's completions (`~/.config/fish/completions/pdinject.fish`).
    CompleteFish,
}

/// Writes `what` for the command line `cmd` (the binary's parser) to `out`.
pub(crate) fn write(
    what: Generate,
    cmd: clap::Command,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    use clap_complete::Shell;
    let shell = match what {
        Generate::Man => return man(cmd, out),
        Generate::ManBatch => return man_batch(cmd, out),
        Generate::CompleteBash => Shell::Bash,
        Generate::CompleteZsh => Shell::Zsh,
        Generate::CompleteFish => Shell::Fish,
    };
    let mut cmd = cmd;
    clap_complete::generate(shell, &mut cmd, "pdinject", out);
    Ok(())
}

/// pdinject(1): clap's sections, then what a man page has beyond `--help`.
fn man(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let m = clap_mangen::Man::new(cmd).section("1").manual("pdinject");
    m.render_title(out)?;
    m.render_name_section(out)?;
    m.render_synopsis_section(out)?;
    m.render_description_section(out)?;
    out.write_all(DESCRIPTION.as_bytes())?;
    m.render_options_section(out)?;
    m.render_subcommands_section(out)?;
    out.write_all(MAN_TAIL.as_bytes())?;
    m.render_version_section(out)
}

/// pdinject-batch(1): the `batch` subcommand as a page of its own, named as git and
/// perf name theirs (`perf-inject(1)`).
fn man_batch(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let batch = cmd
        .find_subcommand("batch")
        .cloned()
        .ok_or_else(|| std::io::Error::other("the parser has no batch subcommand"))?
        .name("pdinject-batch")
        .display_name("pdinject-batch")
        .bin_name("pdinject batch")
        // Its own section below (clap_mangen would head it EXTRA).
        .after_help(None::<&str>)
        .after_long_help(None::<&str>);
    let m = clap_mangen::Man::new(batch).section("1").manual("pdinject");
    m.render_title(out)?;
    m.render_name_section(out)?;
    m.render_synopsis_section(out)?;
    m.render_description_section(out)?;
    m.render_options_section(out)?;
    out.write_all(b".SH NOTES\n")?;
    out.write_all(roff_paragraphs(super::batch::AFTER_HELP).as_bytes())?;
    out.write_all(BATCH_TAIL.as_bytes())?;
    m.render_version_section(out)
}

/// Plain text (paragraphs between blank lines) as roff: `\` and `-` escaped, a line
/// that would start with a request (`.` or `'`) guarded.
fn roff_paragraphs(text: &str) -> String {
    let mut out = String::new();
    for para in text.split("\n\n") {
        out.push_str(".PP\n");
        for line in para.lines() {
            let line = line.replace('\\', "\\e").replace('-', "\\-");
            if line.starts_with(['.', '\'']) {
                out.push_str("\\&");
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Written after clap's description of pdinject(1). roff: `\-` is a hyphen that stays
/// one (a plain `-` may print as a dash, and copied flags would not work).
const DESCRIPTION: &str = r#".PP
pdinject reads a perf.data file (or a \fBperf record \-o \-\fR stream, or a
\fBperf record \-\-threads\fR directory), finds every DSO its samples touch (sample
IPs, callchain entries, branch\-stack ends, DWARF\-unwound user stacks) and writes
their build IDs into the output's build\-ID table, as \fBperf inject \-b\fR does, on
all cores. An ID is written only with a proof that the file read is the file that
was mapped; every DSO left without one is listed with its reason (stale, ambiguous,
missing, other\-host, ...). Like \fBperf inject \-b\fR, it fills perf's build\-ID
cache (\fI~/.debug\fR) unless told not to (\fB\-N\fR).
.PP
Flags are spelled as \fBperf inject\fR spells them where it has them (\fB\-b\fR,
\fB\-i\fR, \fB\-o\fR, \fB\-\-buildid\-all\fR, \fB\-\-mmap2\-buildid\-all\fR,
\fB\-B\fR, \fB\-j\fR).
"#;

const MAN_TAIL: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
The output was written (DSOs without an ID are listed, not an error); \fB\-\-help\fR,
\fB\-\-version\fR, \fB\-\-generate\fR.
.TP
\fB1\fR
Bad input or an I/O error: one line \fBpdinject: FILE: offset 0x...: problem\fR, and
no output file left behind.
.TP
\fB2\fR
A usage error.
.SH ENVIRONMENT
.TP
\fBDEBUGINFOD_URLS\fR
Servers (space\-separated http:// or https:// URLs) that \fB\-\-debuginfod\fR alone
(or \fB\-\-debuginfod=system\fR) fetches from; read only when asked, as perf does.
.TP
\fBDEBUGINFOD_TIMEOUT\fR, \fBDEBUGINFOD_MAXTIME\fR, \fBDEBUGINFOD_MAXSIZE\fR
As elfutils reads them (see \fBdebuginfod\-client\-config\fR(7)): a server must send
100 KiB (or the whole file) within each \fBDEBUGINFOD_TIMEOUT\fR seconds (default
90); a download may last at most \fBDEBUGINFOD_MAXTIME\fR seconds and be at most
\fBDEBUGINFOD_MAXSIZE\fR bytes (default: no limit but 4 GiB).
.TP
\fBSSL_CERT_FILE\fR, \fBSSL_CERT_DIR\fR
The CA certificates https servers are checked against, as OpenSSL's tools read
them; else the system's store.
.TP
\fBHOME\fR
The build\-ID cache is \fI$HOME/.debug\fR unless \fBbuildid.dir\fR of perfconfig
or \fB\-\-buildid\-dir\fR says otherwise.
.SH FILES
.TP
\fI~/.perfconfig\fR, \fI/etc/perfconfig\fR
\fBbuildid.dir\fR (the build\-ID cache) and \fBbuildid\-cache.debuginfod\fR (the
servers when \fB\-\-debuginfod\fR is not given), as perf reads them.
.TP
\fI~/.debug\fR
perf's build\-ID cache, filled from the very files proven.
.SH EXAMPLES
.TP
\fBpdinject \-\-buildids perf.data perf.data.ids\fR
Write the build IDs of the DSOs the samples touch.
.TP
\fBperf record \-B \-g \-o \- \-\- CMD | pdinject \-b \- \- | perf report \-i \-\fR
Pipe mode.
.TP
\fBpdinject \-B \-\-in\-place perf.data\fR
Rewrite the file's MMAP2 records in build\-ID form, in place.
.TP
\fBpdinject \-\-debuginfod https://debuginfod.debian.net perf.data out.data\fR
Fetch what is not on this machine from a debuginfod server.
.SH "SEE ALSO"
\fBpdinject\-batch\fR(1), \fBperf\-inject\fR(1), \fBperf\-record\fR(1),
\fBperf\-buildid\-cache\fR(1), \fBdebuginfod\-client\-config\fR(7).
The guides (pipe mode, MMAP2 records, JIT code, in place, batch mode, the build\-ID
cache, the symbol store, guarantees and limits) are in
\fI/usr/share/doc/pdinject/docs/\fR when installed from the Debian package.
"#;

const BATCH_TAIL: &str = r#".SH "SEE ALSO"
\fBpdinject\fR(1), \fBperf\-inject\fR(1), \fBsbatch\fR(1).
Batch mode, shards and the Slurm and Kubernetes examples are described in
\fI/usr/share/doc/pdinject/docs/batch.md\fR when installed from the Debian package.
"#;
