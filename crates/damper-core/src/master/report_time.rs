//! [`ReportTime`]: when a pair's last report arrived, to the second, in 22 bits.

use std::time::Duration;

use crate::time::Nanos;

/// The oldest a last report can be and still read back right: 24 days,
/// inside the 24.3 days (2^21 s) a wrapping 22-bit count of seconds tells
/// apart from a report yet to come. A master forgets a pair idle for
/// [`MasterState::evict_idle`](super::MasterState::evict_idle)'s
/// `idle_for`, which it takes as at most this; its passes must come more
/// often than the 0.3 days left of the wrap (the service's, every hour at
/// most, do).
pub const MAX_REPORT_AGE: Duration = Duration::from_secs(24 * 24 * 3600);

/// The bits a [`ReportTime`] takes in its entry's word.
pub(super) const REPORT_TIME_BITS: u32 = 22;
const MASK: u32 = (1 << REPORT_TIME_BITS) - 1;
const HALF: u32 = 1 << (REPORT_TIME_BITS - 1);
const _: () = assert!(MAX_REPORT_AGE.as_secs() < HALF as u64);

/// When a pair's last report arrived: whole seconds since the epoch,
/// modulo 2^22 (a wrap every 48.5 days), in the 22 bits its entry's word
/// has left ([`Entry`](super::table::Entry)). Read back against a `now`, it
/// is right as long as the report is at most [`MAX_REPORT_AGE`] old, which
/// every pair a master still tracks is. It is only ever read as an age,
/// for eviction (whose idle times are minutes to days), and shown in
/// views: to the second is plenty for both, and the 4 bytes a millisecond
/// count took are 4 of the 56 of each of millions of entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReportTime(u32);

fn wrapped(now: Nanos) -> u32 {
    // Modulo 2^22 by design.
    (now.as_millis() / 1000) as u32 & MASK
}

impl ReportTime {
    /// A report that arrived at `now`.
    pub(super) fn at(now: Nanos) -> ReportTime {
        ReportTime(wrapped(now))
    }

    /// The one whose [`bits`](Self::bits) are `bits` (the low 22 are kept).
    pub(super) fn from_bits(bits: u32) -> ReportTime {
        ReportTime(bits & MASK)
    }

    /// The seconds from it to `now` (wrapped), `None` when `now` precedes
    /// it: behind it by under half the wrap.
    fn until(self, now: u32) -> Option<u32> {
        Some(now.wrapping_sub(self.0) & MASK).filter(|&s| s < HALF)
    }

    /// How long before `now` it arrived, in whole seconds of the clock (a
    /// report at 1.9 s read at 2.1 s is a second old); zero for a report
    /// `now` precedes (a clock set back).
    pub(super) fn age(self, now: Nanos) -> Duration {
        Duration::from_secs(self.until(wrapped(now)).map_or(0, u64::from))
    }

    /// The later of this and a report arriving at `now`.
    pub(super) fn later(self, now: Nanos) -> ReportTime {
        let now = wrapped(now);
        match self.until(now) {
            Some(_) => ReportTime(now),
            None => self,
        }
    }

    /// When it arrived, read back against `now`: the start of its second.
    pub(super) fn when(self, now: Nanos) -> Nanos {
        let now_s = now.as_millis() / 1000;
        Nanos::from_millis(now_s.saturating_sub(self.age(now).as_secs()) * 1000)
    }

    /// Its bits, below 2^22.
    pub(super) fn bits(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000;

    #[test]
    fn ages_read_right_across_the_wrap_up_to_the_bound() {
        let wrap = 1u64 << REPORT_TIME_BITS;
        // Just before a wrap of the second count, and just after.
        let start = Nanos::from_millis((wrap * 419 - 5) * 1000);
        let t = ReportTime::at(start);
        for later_s in [0, 1, 5, 6, 72_000, MAX_REPORT_AGE.as_secs()] {
            let now = Nanos::from_millis((wrap * 419 - 5 + later_s) * 1000 + 999);
            assert_eq!(t.age(now), Duration::from_secs(later_s), "{later_s} s");
            assert_eq!(t.when(now), start, "{later_s} s");
        }
    }

    #[test]
    fn a_report_after_now_reads_as_now_and_the_later_report_wins() {
        let now = Nanos::from_millis(T);
        let ahead = ReportTime::at(Nanos::from_millis(T + 4_000));
        assert_eq!(ahead.age(now), Duration::ZERO);
        // The later of the two stays, whichever side it is on.
        assert_eq!(ahead.later(now), ahead);
        let behind = ReportTime::at(Nanos::from_millis(T - 4_000));
        assert_eq!(behind.later(now), ReportTime::at(now));
        assert_eq!(ReportTime::at(now).later(now), ReportTime::at(now));
    }

    #[test]
    fn seconds_are_kept_and_their_fractions_dropped() {
        let now = Nanos::from_nanos(T * 1_000_000 + 999_999_999);
        let t = ReportTime::at(now);
        assert_eq!(t.when(now), Nanos::from_millis(T));
        assert_eq!(
            t.age(now + Duration::from_millis(1)),
            Duration::from_secs(1)
        );
        assert_eq!(
            t.when(now + Duration::from_millis(2_005)),
            Nanos::from_millis(T)
        );
        assert!(t.bits() < 1 << REPORT_TIME_BITS);
        assert_eq!(ReportTime::from_bits(t.bits()), t);
    }
}
