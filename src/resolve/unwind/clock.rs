//! The CPU-budget clock: a sample's unwind is bounded by the CPU time it used,
//! read seldom ([`CpuAnchor`]).

use std::time::{Duration, Instant};

/// A recent reading of the thread's CPU time beside the wall clock. Reading the CPU
/// clock is a system call (about a microsecond here, 15 % of the whole resolve stage
/// when done per sample), so a sample's own CPU start is never read: it is at most the
/// anchor's CPU time plus the wall time since the anchor (a thread cannot run longer
/// than the clock), which bounds the CPU a sample has used from below. The anchor is
/// renewed every [`ANCHOR_EVERY`] samples so the bound stays tight when the worker
/// was preempted earlier.
pub(super) struct CpuAnchor {
    pub(super) wall: Instant,
    pub(super) cpu: Duration,
    pub(super) samples: u32,
}

/// Samples between two readings of the CPU clock.
pub(super) const ANCHOR_EVERY: u32 = 64;

impl CpuAnchor {
    pub(super) fn now() -> Self {
        CpuAnchor {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
            samples: 0,
        }
    }

    /// Called once per sample before its wall clock starts.
    pub(super) fn tick(&mut self) {
        self.samples += 1;
        if self.samples >= ANCHOR_EVERY {
            *self = CpuAnchor::now();
        }
    }

    /// True when the sample that began at `start` has used more than `budget` of CPU
    /// time for certain. `first_check` is the sample's CPU clock at its first check
    /// that could not tell: after time off the CPU since the anchor (another process
    /// ran, a lock was waited for) the anchor's bound stays loose for the rest of the
    /// window, and the CPU used since that check is then the sample's lower bound.
    pub(super) fn spent(
        &self,
        start: Instant,
        first_check: &mut Option<Duration>,
        budget: Duration,
    ) -> bool {
        let now = thread_cpu_time();
        let cpu_at_start_max = self.cpu + start.saturating_duration_since(self.wall);
        let used = now
            .saturating_sub(cpu_at_start_max)
            .max(first_check.map_or(Duration::ZERO, |c| now.saturating_sub(c)));
        if used > budget {
            return true;
        }
        first_check.get_or_insert(now);
        false
    }
}

/// CPU time consumed by the calling thread.
pub(super) fn thread_cpu_time() -> Duration {
    // SAFETY: clock_gettime writes the timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
