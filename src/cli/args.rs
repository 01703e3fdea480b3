//! The flags single runs and batches share: what the engine is asked ([`EngineArgs`])
//! and how a run writes and speaks ([`RunArgs`]), each declared once.

use pdinject::options::{AttrsFor, DEFAULT_MAX_FRAMES, Mode, Options, UnwindChoice, parse_known};
use pdinject::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// The flags of every run, single or batch. Their help speaks of a single run;
/// `pdinject batch` words it for many ([`super::batch::help`]).
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// What the engine is asked.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Rewrite IN itself (only what changes, crash-safe); no OUT.
    #[arg(long = "in-place")]
    pub in_place: bool,
    /// Worker threads (default: all cores). Long form only: `-j` is perf's --jit.
    #[arg(long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Also write the summary as JSON to FILE.
    #[arg(long = "report", value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Also print how long each stage took.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// No summary on stderr.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
}

impl RunArgs {
    /// `--jobs` within its limits.
    pub(crate) fn check_jobs(&self) -> Result<()> {
        match self.jobs {
            Some(j) => pdinject::cli_support::check_jobs(j),
            None => Ok(()),
        }
    }
}

/// Values of `--unwind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum UnwindArg {
    /// DWARF when samples carry user stacks, else nothing.
    Auto,
    /// Never unwind.
    None,
    /// Frame pointers only.
    Fp,
    /// DWARF CFI, frame pointers where CFI is missing.
    Dwarf,
}

/// Values of `--live` (issue 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LiveArg {
    /// When the input is a stream being recorded now on this host and boot.
    Auto,
    /// On any stream input, without the proof that it is of this host and boot.
    On,
    /// Never.
    Off,
}

/// Values of `--attrs-for`: a perf version, since what a user knows is which perf
/// refuses the file ("incompatible file format"), not the size of its attr struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AttrsForArg {
    /// 128-byte attrs (PERF_ATTR_SIZE_VER7), what perf 6.1 reads.
    #[value(name = "6.1")]
    Perf6_1,
    /// 136-byte attrs (PERF_ATTR_SIZE_VER8, with config3), what perf 6.12 reads.
    #[value(name = "6.12")]
    Perf6_12,
}

/// The flags of a run that single-file and batch runs share. They come in groups by
/// what they are about, each flattened where its flags stand in `--help`; the flags
/// between the groups stay here.
#[derive(clap::Args, Debug)]
pub(crate) struct EngineArgs {
    /// Which DSOs get IDs, the records that carry them, and the data rewritten.
    #[command(flatten)]
    pub(crate) form: FormArgs,
    /// Build IDs to use for paths: 'HEX PATH,HEX PATH' (as perf inject).
    #[arg(long = "known-build-ids", value_name = "LIST")]
    pub known_build_ids: Option<String>,
    /// How user stacks are walked.
    #[command(flatten)]
    pub(crate) unwinding: UnwindingArgs,
    /// Where DSO files are found and kept, and what vouches for them.
    #[command(flatten)]
    pub(crate) files: FileArgs,
    /// Memory a stream input may keep across its batches: the process model, the
    /// build-ID records it carries, its events and features (e.g. 512M, 2G; see
    /// "Limits" in docs/guarantees.md). A stream that needs more stops with an error.
    #[arg(long = "stream-memory", value_name = "SIZE", value_parser = pdinject::cli_support::parse_size, default_value = pdinject::cli_support::DEFAULT_STREAM_MEMORY_ARG)]
    pub stream_memory: u64,
    /// The live capture (issue 32).
    #[command(flatten)]
    pub(crate) capture: CaptureArgs,
    /// Write the event attributes at the size this perf reads (an older perf refuses
    /// larger ones); refused when a field that size has no room for is not zero.
    /// Default: the input's attrs as they are.
    #[arg(long = "attrs-for", value_name = "PERF", value_enum)]
    pub attrs_for: Option<AttrsForArg>,
    /// JIT code as DSOs.
    #[command(flatten)]
    pub(crate) jit_code: JitArgs,
}

/// What the output carries: which DSOs get table entries, whether mapping records
/// carry the IDs too, and what else of the data is rewritten.
#[derive(clap::Args, Debug)]
pub(crate) struct FormArgs {
    /// Table entries for every DSO a sample touches (the default).
    #[arg(short = 'b', long = "buildids", visible_alias = "build-ids")]
    pub buildids: bool,
    /// Table entries for every mapped DSO, hit or not.
    #[arg(long = "buildid-all")]
    pub buildid_all: bool,
    /// Every mapping record of a DSO mapped as code, in build-ID MMAP2 form (as perf
    /// 6.12's --mmap2-buildid-all), and its ID in the table.
    #[arg(long = "mmap2-buildid-all")]
    pub mmap2_buildid_all: bool,
    /// Mapping records of the DSOs samples touch, in build-ID MMAP2 form (perf 7.3's
    /// `-B, --mmap2-buildids`).
    #[arg(short = 'B', long = "mmap2-buildids")]
    pub mmap2_buildids: bool,
    /// Unwind each `--call-graph dwarf` sample's user stack into its callchain and
    /// drop the stack dumps (perf 7.3's flag; see docs/convert.md).
    #[arg(long = "convert-callchain")]
    pub convert_callchain: bool,
    /// Move every mapping to a fixed layout and remap every address that names a
    /// place in the recorded machine's memory, or remove it (perf 7.3's flag; see
    /// docs/aslr.md): a profile that can leave the building.
    #[arg(long = "aslr")]
    pub aslr: bool,
}

/// How user stacks of `--call-graph dwarf` samples are walked, and how far.
#[derive(clap::Args, Debug)]
pub(crate) struct UnwindingArgs {
    /// How user stacks of `--call-graph dwarf` samples are walked.
    #[arg(long = "unwind", value_enum, default_value = "auto")]
    pub unwind: UnwindArg,
    /// Time allowed to unwind one sample (e.g. 500us, 1ms, 2s); a sample over it keeps
    /// the DSOs found so far and is counted in the summary.
    #[arg(long = "unwind-budget", value_name = "DURATION", value_parser = parse_duration, default_value = "1ms")]
    pub unwind_budget: Duration,
    /// Frames walked at most per sample.
    #[arg(long = "unwind-max-frames", value_name = "N", default_value_t = DEFAULT_MAX_FRAMES)]
    pub unwind_max_frames: usize,
}

/// Where DSO files are looked up, where they are kept (perf's build-ID cache, a
/// symbol store), and what vouches for a file whose times moved.
#[derive(clap::Args, Debug)]
pub(crate) struct FileArgs {
    /// perf's build-ID cache directory to fill (default: buildid.dir of perfconfig,
    /// else ~/.debug).
    #[arg(long = "buildid-dir", value_name = "DIR")]
    pub buildid_dir: Option<PathBuf>,
    /// Do not add the DSOs to perf's build-ID cache.
    #[arg(short = 'N', long = "no-buildid-cache")]
    pub no_buildid_cache: bool,
    /// Also put each proven DSO's file and its separate debug info into this build-ID
    /// symbol store, once per ID, laid out for `debuginfod -F DIR` (docs/store.md).
    #[arg(long = "symbol-store", value_name = "DIR")]
    pub symbol_store: Option<PathBuf>,
    /// Look user DSOs up under this sysroot (a copy of the recorded machine's files).
    #[arg(long = "symfs", value_name = "DIR")]
    pub symfs: Option<PathBuf>,
    /// dpkg's database (dpkg's --admindir): a DSO whose ctime moved after the
    /// recording started keeps its ID when it is byte for byte the file of a package
    /// installed before (default /var/lib/dpkg; docs/guarantees.md).
    #[arg(long = "dpkg-admindir", value_name = "DIR")]
    pub dpkg_admindir: Option<PathBuf>,
    /// Trust that a DSO whose code pages are laid out as recorded was not rewritten
    /// in place: take it whatever its ctime says (a same-layout rebuild written over
    /// it with its times set back gets the rebuild's ID; off by default, see
    /// docs/guarantees.md).
    #[arg(long = "trust-same-layout")]
    pub trust_same_layout: bool,
}

/// The live capture (issue 32): when it runs, and what it may copy.
#[derive(clap::Args, Debug)]
pub(crate) struct CaptureArgs {
    /// Read each file a live process maps as its record arrives, while a stream is
    /// being recorded on this host and boot: its build ID from the mapped inode and
    /// the file into the build-ID cache (docs/live.md).
    #[arg(long = "live", value_name = "WHEN", value_enum, default_value = "auto")]
    pub live: LiveArg,
    /// Bytes the live capture may copy into the cache and the symbol store (hard
    /// links cost none), e.g. 512M, 2G.
    #[arg(long = "live-budget", value_name = "SIZE", value_parser = pdinject::cli_support::parse_size, default_value = pdinject::cli_support::DEFAULT_BUDGET_ARG)]
    pub live_budget: u64,
}

/// JIT code as DSOs (`--jit`), and which of its loads get mapping records.
#[derive(clap::Args, Debug)]
pub(crate) struct JitArgs {
    /// JIT code as DSOs (perf inject's -j, --jit): each jitdump a process mapped
    /// (jit-PID.dump) becomes one ELF image beside it and an MMAP2 record per code
    /// load samples touch, at its time (see docs/jit.md). Record with perf record -k 1.
    #[arg(short = 'j', long = "jit")]
    pub jit: bool,
    /// With --jit: which code loads get a mapping record. touched: those a sample's
    /// IP, callchain or branch stack lies in at its time (every sample names the same
    /// code as with all; time and memory follow the samples, not the jitdump); all:
    /// every load, as perf inject --jit writes them.
    #[arg(
        long = "jit-maps",
        value_name = "WHICH",
        value_enum,
        default_value = "touched",
        requires = "jit"
    )]
    pub jit_maps: JitMapsArg,
}

/// `--jit-maps` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum JitMapsArg {
    /// The loads samples touch.
    Touched,
    /// Every load.
    All,
}

impl EngineArgs {
    /// `--attrs-for` as the library takes it.
    pub(crate) fn attrs_for(&self) -> AttrsFor {
        match self.attrs_for {
            None => AttrsFor::Verbatim,
            Some(AttrsForArg::Perf6_1) => AttrsFor::Perf6_1,
            Some(AttrsForArg::Perf6_12) => AttrsFor::Perf6_12,
        }
    }

    /// The engine's options; `debuginfod` as `--debuginfod` gave it (single runs).
    pub(crate) fn options(&self, debuginfod: Option<&str>) -> Result<Options> {
        // This order (then --known-build-ids, as the options are built; a
        // --symbol-store that cannot be made is named when the run opens it) decides
        // which of several bad flags the usage error names.
        self.unwinding.check()?;
        pdinject::cli_support::check_stream_memory(self.stream_memory)?;
        self.files.check()?;
        let (cache, vouchers) = self.files.cache_and_vouchers(debuginfod)?;
        Ok(Options {
            mode: self.form.mode(),
            known: match &self.known_build_ids {
                Some(s) => parse_known(s)?,
                None => Vec::new(),
            },
            unwind: pdinject::options::Unwinding {
                how: self.unwinding.choice(),
                budget: self.unwinding.unwind_budget,
                max_frames: self.unwinding.unwind_max_frames,
            },
            form: self.form.form(),
            attrs_for: self.attrs_for(),
            cache,
            store: self.files.symbol_store.clone(),
            symfs: self.files.symfs.clone(),
            memory: pdinject::options::Memory {
                stream: self.stream_memory,
                ..Default::default()
            },
            callchains: self.form.callchains(),
            addresses: self.form.addresses(),
            live: pdinject::options::Live {
                choice: self.capture.choice(),
                budget: self.capture.live_budget,
            },
            jit: self.jit_code.choice(),
            vouchers,
            ..Options::default()
        })
    }
}

impl FormArgs {
    /// Which DSOs get table entries.
    fn mode(&self) -> Mode {
        if self.buildid_all || self.mmap2_buildid_all {
            Mode::All
        } else {
            Mode::Hit
        }
    }

    /// Whether mapping records carry the IDs too.
    fn form(&self) -> pdinject::options::Form {
        if self.mmap2_buildid_all || self.mmap2_buildids {
            pdinject::options::Form::Mmap2
        } else {
            pdinject::options::Form::Table
        }
    }

    fn callchains(&self) -> pdinject::options::Callchains {
        if self.convert_callchain {
            pdinject::options::Callchains::Converted
        } else {
            pdinject::options::Callchains::AsRecorded
        }
    }

    fn addresses(&self) -> pdinject::options::Addresses {
        if self.aslr {
            pdinject::options::Addresses::Remapped
        } else {
            pdinject::options::Addresses::AsRecorded
        }
    }
}

impl UnwindingArgs {
    fn check(&self) -> Result<()> {
        if self.unwind_max_frames == 0 {
            return Err(Error::Usage(
                "--unwind-max-frames must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn choice(&self) -> UnwindChoice {
        match self.unwind {
            UnwindArg::Auto => UnwindChoice::Auto,
            UnwindArg::None => UnwindChoice::None,
            UnwindArg::Fp => UnwindChoice::Fp,
            UnwindArg::Dwarf => UnwindChoice::Dwarf,
        }
    }
}

impl FileArgs {
    /// `--symfs` and `--dpkg-admindir` name what they must.
    fn check(&self) -> Result<()> {
        if let Some(root) = &self.symfs
            && !root.is_dir()
        {
            return Err(Error::Usage(format!(
                "--symfs {}: not a directory",
                root.display()
            )));
        }
        if let Some(d) = &self.dpkg_admindir
            && !d.join("info").is_dir()
        {
            return Err(Error::Usage(format!(
                "--dpkg-admindir {}: no dpkg database there (no info/ directory)",
                d.display()
            )));
        }
        Ok(())
    }

    /// The build-ID cache this run fills (none with `-N`), and what vouches for a
    /// file whose ctime moved.
    fn cache_and_vouchers(
        &self,
        debuginfod: Option<&str>,
    ) -> Result<(
        Option<pdinject::options::BuildIdCache>,
        pdinject::options::Vouchers,
    )> {
        // The cache's link record is read with or without -N: it is evidence about
        // this machine's files, not something this run writes.
        let cache_dir = pdinject::options::BuildIdCache::locate(self.buildid_dir.as_deref())
            .map_err(Error::Usage)?;
        let vouchers = pdinject::options::Vouchers {
            dpkg: Some(
                self.dpkg_admindir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(pdinject::cli_support::DPKG_ADMINDIR)),
            ),
            cache: Some(cache_dir.clone()),
            same_layout: self.trust_same_layout,
            // The run notes what dpkg vouched for when it writes the cache (not -N).
            ..Default::default()
        };
        let cache = if self.no_buildid_cache {
            None
        } else {
            let dir = cache_dir;
            Some(pdinject::options::BuildIdCache {
                dir,
                symfs: self.symfs.clone(),
                debuginfod: pdinject::cli_support::debuginfod_servers(debuginfod)?,
            })
        };
        Ok((cache, vouchers))
    }
}

impl CaptureArgs {
    fn choice(&self) -> pdinject::options::LiveChoice {
        match self.live {
            LiveArg::Auto => pdinject::options::LiveChoice::Auto,
            LiveArg::On => pdinject::options::LiveChoice::On,
            LiveArg::Off => pdinject::options::LiveChoice::Off,
        }
    }
}

impl JitArgs {
    fn choice(&self) -> pdinject::options::JitChoice {
        if self.jit {
            pdinject::options::JitChoice::Inject(match self.jit_maps {
                JitMapsArg::Touched => pdinject::options::JitMaps::Touched,
                JitMapsArg::All => pdinject::options::JitMaps::Every,
            })
        } else {
            pdinject::options::JitChoice::Off
        }
    }
}

/// Parses `500us`, `1ms`, `2s`, `100ns` (a bare number is milliseconds).
pub(crate) fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration like 500us, 1ms or 2s"))?;
    let ns = match unit.trim() {
        "ns" => v,
        "us" | "µs" => v * 1e3,
        "" | "ms" => v * 1e6,
        "s" => v * 1e9,
        u => return Err(format!("unknown duration unit '{u}' (ns, us, ms, s)")),
    };
    if !ns.is_finite() || !(0.0..=3.6e12).contains(&ns) {
        return Err(format!("'{s}' is out of range"));
    }
    Ok(Duration::from_nanos(ns as u64))
}
