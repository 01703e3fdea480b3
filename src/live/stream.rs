//! The stream side of live capture: each record of a stream as it is read (before
//! the batch it belongs to is scanned: a batch is 64 MB, which a quiet recording
//! takes minutes to fill), telling whether the stream is being recorded now on this
//! host and boot, and handing its mapping records to a [`Capture`].
//!
//! How it tells (`--live auto`): the input is a stream from a pipe, FIFO or socket
//! (not a regular file: the driver asks for a `LiveStream` only then); the stream's
//! HOSTNAME and OSRELEASE are this machine's and its kernel reference map
//! (`[kernel.kallsyms]_text`) is at this boot's `_text` (the proof that lets this
//! boot's kernel notes speak for a recording); and its records arrive within a
//! minute of their time on this boot's clock. perf sends the features and the
//! kernel map before any user mapping, so the decision is made at the first user
//! mapping (or FINISHED_INIT). `--live on` skips the host and boot proof (each
//! mapping's own checks still apply); `--live off` never captures.

use super::{Capture, LiveChoice, LiveConfig, LiveSummary, MapArrival};
use crate::buildid::HostTrust;
use crate::buildid::host::HostInfo;
use crate::format::Endian;
use crate::format::attr::Attr;
use crate::format::feature::parse_string;
use crate::format::header::{FEAT_HOSTNAME, FEAT_OSRELEASE};
use crate::format::record::{
    FeatureRecord, RecordHeader, TrailerLayout, misc, mmap_fixed, parse_mmap, rt,
};

/// Records later than this after their time mean the stream is not being recorded
/// now (a replay): `--live auto` stops capturing.
const REPLAY_LAG_NS: i128 = 60_000_000_000;

/// PERF_RECORD_FINISHED_INIT: the end of perf's synthesized records.
const FINISHED_INIT: u32 = 82;

enum State {
    /// Features and the kernel map still to come.
    Deciding,
    /// Capturing.
    Live(Box<Capture>),
    /// Not capturing, and why (said once in the summary).
    Off(String),
}

/// One stream's live capture.
pub(crate) struct LiveStream {
    choice: LiveChoice,
    cfg: LiveConfig,
    e: Endian,
    trailer: Option<TrailerLayout>,
    /// The clock of the records' times (`-k`).
    clock: super::PerfClock,
    hostname: Option<String>,
    release: Option<String>,
    kernel_ref: Option<(String, u64)>,
    state: State,
    /// What the summary says besides the counts.
    notes: Vec<String>,
}

impl std::fmt::Debug for LiveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveStream")
            .field("choice", &self.choice)
            .finish_non_exhaustive()
    }
}

impl LiveStream {
    /// A live capture of a stream in byte order `e`; `None` for `--live off`.
    pub(crate) fn new(choice: LiveChoice, e: Endian, cfg: LiveConfig) -> Option<LiveStream> {
        (choice != LiveChoice::Off).then(|| LiveStream {
            choice,
            cfg,
            e,
            trailer: None,
            clock: super::PerfClock::Local,
            hostname: None,
            release: None,
            kernel_ref: None,
            state: State::Deciding,
            notes: Vec::new(),
        })
    }

    /// One whole record of the stream (header included, out-of-band payload not),
    /// as it is read. Cheap for every record but mapping records of user space.
    pub(crate) fn record(&mut self, rec: &[u8]) {
        if matches!(self.state, State::Off(_)) {
            return;
        }
        let e = self.e;
        let Some(h) = RecordHeader::parse(rec, e) else {
            return;
        };
        match h.kind {
            rt::HEADER_ATTR if self.trailer.is_none() => {
                if let Some(a) = rec
                    .get(8..)
                    .and_then(|b| Attr::parse(b, e, e == Endian::Big))
                {
                    self.trailer = Some(TrailerLayout::new(a.sample_type, a.sample_id_all()));
                    // use_clockid (flag 25), and the clock at byte 92 of the attr.
                    const USE_CLOCKID: u64 = 1 << 25;
                    self.clock = if a.flags & USE_CLOCKID == 0 {
                        super::PerfClock::Local
                    } else if a.size >= 96
                        && e.u32(rec, 8 + 92) == Some(libc::CLOCK_MONOTONIC as u32)
                    {
                        super::PerfClock::Monotonic
                    } else {
                        super::PerfClock::Other
                    };
                }
            }
            rt::HEADER_FEATURE => {
                if let Some(f) = FeatureRecord::parse(rec, e) {
                    let s = || parse_string(f.payload, e);
                    match f.id {
                        id if id == FEAT_HOSTNAME as u64 => self.hostname = s(),
                        id if id == FEAT_OSRELEASE as u64 => self.release = s(),
                        _ => {}
                    }
                }
            }
            FINISHED_INIT => {
                if matches!(self.state, State::Deciding) {
                    self.decide();
                }
            }
            rt::MMAP | rt::MMAP2 => self.mapping(&h, rec),
            _ => {}
        }
    }

    fn mapping(&mut self, h: &RecordHeader, rec: &[u8]) {
        let e = self.e;
        let Some(trailer) = self.trailer else {
            return;
        };
        let Some(body_end) = rec
            .len()
            .checked_sub(trailer.size)
            .filter(|&b| b >= mmap_fixed(h.kind))
        else {
            return;
        };
        let Some(m) = parse_mmap(h, rec, body_end, e) else {
            return;
        };
        let cpumode = h.cpumode();
        if cpumode == misc::KERNEL {
            if self.kernel_ref.is_none()
                && let Some(sym) = m.filename.strip_prefix(b"[kernel.kallsyms]")
                && !sym.is_empty()
            {
                self.kernel_ref = Some((String::from_utf8_lossy(sym).into_owned(), m.pgoff));
            }
            return;
        }
        if cpumode != misc::USER {
            return;
        }
        if matches!(self.state, State::Deciding) {
            self.decide();
        }
        let time = trailer.read(rec, e).time.filter(|&t| t != 0);
        if !matches!(self.state, State::Live(_)) {
            return;
        }
        if let Some(t) = time
            && self.choice == LiveChoice::Auto
            && self.clock != super::PerfClock::Other
        {
            let lag = super::procfs::mono_ns() - t as i128;
            if !(-5_000_000_000..=REPLAY_LAG_NS).contains(&lag) {
                let why = format!(
                    "live capture stopped: a mapping record arrived {:.1} s after its time on this boot's clock; the stream is not being recorded now",
                    lag as f64 / 1e9
                );
                self.stop(why);
                return;
            }
        }
        let State::Live(c) = &mut self.state else {
            return;
        };
        c.offer(&MapArrival {
            pid: m.pid,
            tid: m.tid,
            start: m.start,
            len: m.len,
            pgoff: m.pgoff,
            ident: m.ident,
            prot: m.prot,
            flags: m.flags,
            filename: m.filename,
            time,
            cpumode,
        });
    }

    /// Decides from what the stream said of itself whether to capture.
    fn decide(&mut self) {
        let trust = HostTrust::decide(
            self.hostname.as_deref(),
            self.release.as_deref(),
            self.kernel_ref.as_ref().map(|(s, a)| (s.as_str(), *a)),
            &HostInfo::detect(),
        );
        // Without a kernel map to compare (an unprivileged perf reads no kernel
        // addresses: no map, or one at 0), this boot is told by the records' times
        // alone: each mapping record must arrive within a minute of its time on this
        // boot's clock (checked as they arrive).
        let unprovable = match &self.kernel_ref {
            None => true,
            Some((sym, addr)) => *addr == 0 || crate::buildid::host::kernel_symbol(sym).is_none(),
        };
        let proven = match (&trust.local, &trust.kernel) {
            (Ok(()), Err(_)) if unprovable && self.clock != super::PerfClock::Other => {
                self.notes.push(
                    "live capture: no kernel map proves this boot; the records' times on this boot's clock do"
                        .into(),
                );
                Ok(())
            }
            (l, k) => l.as_ref().and(k.as_ref()).map(|_| ()),
        };
        match (self.choice, proven.as_ref()) {
            (LiveChoice::Auto, Err((_, why))) => {
                self.state = State::Off(format!(
                    "live capture off: the stream is not proven to be of this host and boot ({why}); --live on captures anyway"
                ));
                return;
            }
            (LiveChoice::On, Err((_, why))) => self.notes.push(format!(
                "live capture on (--live on) although the stream is not proven to be of this host and boot: {why}"
            )),
            _ => {}
        }
        let cfg = LiveConfig {
            perf_clock: self.clock,
            ..self.cfg.clone()
        };
        match Capture::start(cfg) {
            Ok(c) => self.state = State::Live(Box::new(c)),
            Err(e) => {
                self.state = State::Off(format!("live capture off: cannot start its thread: {e}"))
            }
        }
    }

    fn stop(&mut self, why: String) {
        if let State::Live(c) = std::mem::replace(&mut self.state, State::Off(why)) {
            let s = c.finish();
            self.notes.push(s.line());
        }
    }

    /// The capture, while capturing.
    pub(crate) fn capture(&self) -> Option<&Capture> {
        match &self.state {
            State::Live(c) => Some(c),
            _ => None,
        }
    }

    /// Ends the capture (the cache gets what is queued) and returns its summary and
    /// the lines the run's summary prints.
    pub(crate) fn finish(self) -> (Option<LiveSummary>, Vec<String>) {
        let mut notes = self.notes;
        match self.state {
            State::Live(c) => {
                let s = c.finish();
                notes.push(s.line());
                (Some(s), notes)
            }
            State::Off(why) => {
                notes.push(why);
                (None, notes)
            }
            State::Deciding => (None, notes),
        }
    }
}
