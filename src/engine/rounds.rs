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
/// A type of its own so that it cannot be swapped with another pair of numbers (a
/// model's [`crate::model::Key`] is a time and a number too). Ordered by offset, then
/// number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Point {
    /// Byte offset in the data file.
    pub offset: u64,
    /// The number the scan gives the record that starts there.
    pub seq: u64,
}

impl Point {
    /// The record numbered `seq` starts at byte `offset`.
    pub(crate) fn new(offset: u64, seq: u64) -> Self {
        Point { offset, seq }
    }
}

/// Whether more of the input is still to come after what was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// A stream with more batches to come: only what the round rule allows is final.
    MoreToCome,
    /// The input has ended (a file, or a stream's last batch): everything is final.
    Ended,
}

/// What the record that ends at a clean point was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Follows {
    /// A FINISHED_ROUND record outside compressed data.
    Round,
    /// Any other record (or none: the end of what was read).
    Record,
}

/// Clean points seen, and the two newest that follow a FINISHED_ROUND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rounds {
    /// Clean points just after the last two rounds, older first.
    after_round: [Option<Point>; 2],
    /// The newest clean point.
    clean: Point,
}

impl Rounds {
    /// Nothing seen yet; the stream's records start at `start`.
    pub(crate) fn new(start: Point) -> Self {
        Rounds {
            after_round: [None, None],
            clean: start,
        }
    }

    /// A clean point at `p`, right after what `follows` says.
    pub(crate) fn clean(&mut self, p: Point, follows: Follows) {
        self.clean = p;
        if follows == Follows::Round {
            self.after_round = [self.after_round[1], Some(p)];
        }
    }

    /// The newest clean point: where a stream may be resolved up to when it cannot
    /// wait for the round rule (see [`crate::limits::StreamKept`]).
    pub(crate) fn newest_clean(&self) -> Point {
        self.clean
    }

    /// Where resolution may end now. `base` is where the unresolved bytes start;
    /// `carried` how many bytes wait there and `limit` how many may wait at most;
    /// `ending` whether the stream has ended (everything is safe then). Never before
    /// `base`: returning `base` means "wait for more".
    pub(crate) fn safe_end(
        &self,
        base: Point,
        carried: usize,
        limit: usize,
        ending: Ending,
    ) -> Point {
        if ending == Ending::Ended {
            return self.clean;
        }
        match self.after_round {
            [Some(r), _] if r.offset > base.offset => r,
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
        let mut r = Rounds::new(Point::new(16, 0));
        r.clean(Point::new(100, 3), Follows::Record);
        assert_eq!(
            r.safe_end(Point::new(16, 0), 84, 1000, Ending::MoreToCome),
            Point::new(100, 3)
        );
    }

    #[test]
    fn resolution_stops_at_the_second_to_last_round() {
        let mut r = Rounds::new(Point::new(16, 0));
        r.clean(Point::new(100, 3), Follows::Round);
        r.clean(Point::new(150, 5), Follows::Record);
        // One round only: what follows it may still be needed by what precedes it.
        assert_eq!(
            r.safe_end(Point::new(16, 0), 134, 1000, Ending::MoreToCome),
            Point::new(16, 0)
        );
        r.clean(Point::new(200, 7), Follows::Round);
        r.clean(Point::new(260, 9), Follows::Record);
        assert_eq!(
            r.safe_end(Point::new(16, 0), 244, 1000, Ending::MoreToCome),
            Point::new(100, 3)
        );
        // Once flushed up to there, the next safe point needs the next round.
        assert_eq!(
            r.safe_end(Point::new(100, 3), 160, 1000, Ending::MoreToCome),
            Point::new(100, 3)
        );
        r.clean(Point::new(300, 11), Follows::Round);
        assert_eq!(
            r.safe_end(Point::new(100, 3), 200, 1000, Ending::MoreToCome),
            Point::new(200, 7)
        );
    }

    #[test]
    fn a_carry_past_its_limit_and_the_end_of_the_stream_flush_all() {
        let mut r = Rounds::new(Point::new(16, 0));
        r.clean(Point::new(100, 3), Follows::Round);
        r.clean(Point::new(5000, 90), Follows::Record);
        assert_eq!(
            r.safe_end(Point::new(16, 0), 4984, 4096, Ending::MoreToCome),
            Point::new(5000, 90)
        );
        assert_eq!(
            r.safe_end(Point::new(16, 0), 10, 4096, Ending::Ended),
            Point::new(5000, 90)
        );
    }
}
