//! The round rule: how far a stream may be resolved when more is still to come.
//!
//! perf writes each CPU's ring buffer in turn, so in a stream a mapping can come
//! *after* a sample that needs it. perf's own reader (ordered_events) relies on one
//! promise, which is this type's contract: when a FINISHED_ROUND record is written,
//! every record written after it is no older than everything written before the
//! *previous* FINISHED_ROUND. So every mapping a sample before the second-to-last
//! round needs has been read once the last round is in: resolving up to the
//! second-to-last round is safe, and what follows waits for the next batch.
//!
//! Streams without rounds (one buffer, or a perf too old to write them) have no
//! reordering to wait for: they are resolved up to the last clean point. So is a
//! carry that grew past its limit (rounds that stopped coming), since waiting for
//! ever would hold the whole stream. A "clean point" is a record boundary where no
//! compressed frame or inner record is half-way, the only places a chunk may start.

/// A place in the stream: byte offset and the number of the record that starts there.
pub type Point = (u64, u64);

/// Clean points seen, and the two newest that follow a FINISHED_ROUND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rounds {
    /// Clean points just after the last two rounds, older first.
    after_round: [Option<Point>; 2],
    /// The newest clean point.
    clean: Point,
}

impl Rounds {
    /// Nothing seen yet; the stream's records start at `start`.
    pub fn new(start: Point) -> Self {
        Rounds {
            after_round: [None, None],
            clean: start,
        }
    }

    /// A clean point at `p`, right after a FINISHED_ROUND record when `round`.
    pub fn clean(&mut self, p: Point, round: bool) {
        self.clean = p;
        if round {
            self.after_round = [self.after_round[1], Some(p)];
        }
    }

    /// The newest clean point: where a stream may be resolved up to when it cannot
    /// wait for the round rule (see [`crate::limits::StreamKept`]).
    pub fn newest_clean(&self) -> Point {
        self.clean
    }

    /// Where resolution may end now. `base` is where the unresolved bytes start;
    /// `carried` how many bytes wait there and `limit` how many may wait at most;
    /// `eof` that the stream has ended (everything is safe then). Never before `base`:
    /// returning `base` means "wait for more".
    pub fn safe_end(&self, base: Point, carried: usize, limit: usize, eof: bool) -> Point {
        if eof {
            return self.clean;
        }
        match self.after_round {
            [Some(r), _] if r.0 > base.0 => r,
            // Rounds come, but not two since `base`: wait for the next one.
            [_, Some(_)] if carried < limit => base,
            _ => self.clean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_rounds_everything_clean_is_safe() {
        let mut r = Rounds::new((16, 0));
        r.clean((100, 3), false);
        assert_eq!(r.safe_end((16, 0), 84, 1000, false), (100, 3));
    }

    #[test]
    fn resolution_stops_at_the_second_to_last_round() {
        let mut r = Rounds::new((16, 0));
        r.clean((100, 3), true);
        r.clean((150, 5), false);
        // One round only: what follows it may still be needed by what precedes it.
        assert_eq!(r.safe_end((16, 0), 134, 1000, false), (16, 0));
        r.clean((200, 7), true);
        r.clean((260, 9), false);
        assert_eq!(r.safe_end((16, 0), 244, 1000, false), (100, 3));
        // Once flushed up to there, the next safe point needs the next round.
        assert_eq!(r.safe_end((100, 3), 160, 1000, false), (100, 3));
        r.clean((300, 11), true);
        assert_eq!(r.safe_end((100, 3), 200, 1000, false), (200, 7));
    }

    #[test]
    fn a_carry_past_its_limit_and_the_end_of_the_stream_flush_all() {
        let mut r = Rounds::new((16, 0));
        r.clean((100, 3), true);
        r.clean((5000, 90), false);
        assert_eq!(r.safe_end((16, 0), 4984, 4096, false), (5000, 90));
        assert_eq!(r.safe_end((16, 0), 10, 4096, true), (5000, 90));
    }
}
