//! When was the recording made? The staleness proof compares a file's times with
//! the recording's start, so every input needs an answer, and "unknown" must be an
//! answer that refuses local files, never one that skips the check.

use crate::format::feature::ClockData;

pub(crate) use crate::buildid::proof::RecordingStart;

/// What the input tells about the end of the recording.
#[derive(Clone, Debug)]
pub(crate) enum Dating {
    /// A finished file: its mtime is the end of the recording.
    Ended {
        /// mtime in ns since the epoch.
        mtime_ns: i128,
    },
    /// A live stream (perf record writing now): perf's clock is this boot's
    /// monotonic clock.
    Live {
        /// Wall-clock ns when reading began.
        began_ns: i128,
    },
    /// Already decided (by a first pass over a saved stream).
    Fixed(RecordingStart),
}

/// Times the input holds: smallest and largest non-zero record and sample time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// Smallest time seen.
    pub min: Option<u64>,
    /// Largest time seen.
    pub max: Option<u64>,
}

impl Span {
    /// Takes `t` into the span (0 means "no time").
    pub(crate) fn note(&mut self, t: u64) {
        if t != 0 {
            self.min = Some(self.min.map_or(t, |m| m.min(t)));
            self.max = Some(self.max.map_or(t, |m| m.max(t)));
        }
    }
}

impl Dating {
    /// The start, given the times seen so far and the recording's CLOCK_DATA.
    pub(crate) fn start(&self, span: Span, clock: Option<&ClockData>) -> RecordingStart {
        if let Dating::Fixed(s) = self {
            return s.clone();
        }
        // CLOCK_DATA (perf record -k) pairs perf's clock with the wall clock.
        if let (Some(cd), Some(min)) = (clock, span.min) {
            return RecordingStart::Known(cd.wall_ns as i128 + min as i128 - cd.clock_ns as i128);
        }
        match *self {
            Dating::Fixed(_) => unreachable!("handled above"),
            Dating::Ended { mtime_ns } => {
                let len = match (span.min, span.max) {
                    (Some(a), Some(b)) => b.saturating_sub(a) as i128,
                    _ => 0,
                };
                // A copy's mtime is when it was copied, and the start it gives is late:
                // late accepts files changed between the recording and the copy.
                // perf's default clock is this boot's monotonic one, which dates a
                // recording of this boot exactly; one of an earlier boot (or across a
                // suspend, or on another clock) reads later than it was. So the earlier
                // of the two is never later than what the mtime says, and a copy made
                // on this boot is dated right.
                let by_mtime = mtime_ns - len;
                let by_clock = span
                    .min
                    .map(|min| wall_ns() - (perf_clock_ns() - min as i128));
                RecordingStart::Known(by_clock.map_or(by_mtime, |c| c.min(by_mtime)))
            }
            Dating::Live { began_ns } => {
                let (Some(min), Some(max)) = (span.min, span.max) else {
                    // No times at all: a live stream began with this process.
                    return RecordingStart::Known(began_ns);
                };
                let (mono, wall) = (perf_clock_ns(), wall_ns());
                let lag = mono - max as i128;
                if (-5_000_000_000..=60_000_000_000).contains(&lag) {
                    RecordingStart::Known(wall - (mono - min as i128))
                } else {
                    RecordingStart::Unknown(format!(
                        "the stream's newest time ({:.3} s) is not this boot's clock now ({:.3} s): a replayed recording, and nothing says when it was made; give its file by path (its mtime dates it)",
                        max as f64 / 1e9,
                        mono as f64 / 1e9
                    ))
                }
            }
        }
    }
}

/// The wall clock in ns since the epoch.
pub(crate) fn wall_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// perf's default clock (the kernel's local clock) now: the monotonic clock less
/// `monotonic - perf clock` as measured now (its low bound, which dates a recording
/// the earlier). The two are close on a machine that ran through (2 ms apart after an
/// hour), but a machine restored from a snapshot can find them seconds apart, and a
/// recording dated by the monotonic clock alone would then be dated seconds early,
/// refusing files built shortly before it. Where the offset cannot be measured
/// (perf_event_open not permitted) the two are taken as one.
fn perf_clock_ns() -> i128 {
    let d = crate::live::perf_clock_offset().map_or(0, |(low, _)| low);
    monotonic_ns() - d
}

/// CLOCK_MONOTONIC in ns.
fn monotonic_ns() -> i128 {
    // SAFETY: clock_gettime writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_starts_its_span_before_its_mtime() {
        let mut s = Span::default();
        s.note(0);
        s.note(5_000);
        s.note(2_000);
        let d = Dating::Ended {
            mtime_ns: 1_000_000,
        };
        // Times far past this boot's clock (another boot's): the mtime dates it.
        let mut far = Span::default();
        let later = monotonic_ns() as u64 + 3_600_000_000_000;
        far.note(later);
        far.note(later + 5_000);
        assert_eq!(d.start(far, None), RecordingStart::Known(1_000_000 - 5_000));
        let cd = ClockData {
            clock_ns: 1_000,
            wall_ns: 9_000_000,
        };
        assert_eq!(
            d.start(s, Some(&cd)),
            RecordingStart::Known(9_000_000 + 1_000)
        );
    }

    #[test]
    fn a_copy_of_a_recording_of_this_boot_is_dated_by_the_clock_not_its_mtime() {
        // Recorded 10 s ago by this boot's clock, copied (mtime: now) a moment ago.
        let mut s = Span::default();
        let ten_s_ago = monotonic_ns() as u64 - 10_000_000_000;
        s.note(ten_s_ago);
        s.note(ten_s_ago + 1_000_000_000);
        let d = Dating::Ended {
            mtime_ns: wall_ns(),
        };
        let RecordingStart::Known(start) = d.start(s, None) else {
            panic!("dated");
        };
        let ago = wall_ns() - start;
        assert!(
            (9_900_000_000..=10_500_000_000).contains(&ago),
            "started {ago} ns ago"
        );
    }

    #[test]
    fn a_replay_far_from_this_boots_clock_is_undated() {
        let mut s = Span::default();
        s.note(1);
        s.note(2);
        let d = Dating::Live { began_ns: 0 };
        assert!(matches!(d.start(s, None), RecordingStart::Unknown(_)));
        assert_eq!(
            Dating::Live { began_ns: 42 }.start(Span::default(), None),
            RecordingStart::Known(42)
        );
    }
}
