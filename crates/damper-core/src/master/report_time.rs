//! [`ReportTime`]: when a pair's last report arrived, in four bytes.

use std::time::Duration;

use crate::time::Nanos;

/// The oldest a last report can be and still read back right: 24 days,
/// inside the 24.8 days (2^31 ms) a wrapping 32-bit count of milliseconds
/// tells apart from a report yet to come. A master forgets a pair idle for
/// [`MasterState::evict_idle`](super::MasterState::evict_idle)'s
/// `idle_for`, which it takes as at most this; its passes must come more
/// often than the 0.8 days left of the wrap (the service's, every hour at
/// most, do).
pub const MAX_REPORT_AGE: Duration = Duration::from_secs(24 * 24 * 3600);

/// When a pair's last report arrived: milliseconds since the epoch, modulo
/// 2^32 (a wrap every 49.7 days). Read back against a `now`, it is right as
/// long as the report is at most [`MAX_REPORT_AGE`] old, which every pair a
/// master still tracks is: eight bytes fewer in each of millions of entries
/// than a [`Nanos`], for what is only ever read as an age and shown to the
/// millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReportTime(u32);

fn wrapped(now: Nanos) -> u32 {
    // Modulo 2^32 by design.
    now.as_millis() as u32
}

impl ReportTime {
    /// A report that arrived at `now`.
    pub(super) fn at(now: Nanos) -> ReportTime {
        ReportTime(wrapped(now))
    }

    /// The milliseconds from it to `now` (wrapped), `None` when `now`
    /// precedes it: behind it by under half the wrap.
    fn until(self, now: u32) -> Option<u32> {
        Some(now.wrapping_sub(self.0)).filter(|&ms| ms <= i32::MAX as u32)
    }

    /// How long before `now` it arrived; zero for a report `now` precedes
    /// (a clock set back).
    pub(super) fn age(self, now: Nanos) -> Duration {
        Duration::from_millis(self.until(wrapped(now)).map_or(0, u64::from))
    }

    /// The later of this and a report arriving at `now`.
    pub(super) fn later(self, now: Nanos) -> ReportTime {
        let now = wrapped(now);
        match self.until(now) {
            Some(_) => ReportTime(now),
            None => self,
        }
    }

    /// When it arrived, read back against `now`, to the millisecond.
    pub(super) fn when(self, now: Nanos) -> Nanos {
        Nanos::from_millis(
            now.as_millis()
                .saturating_sub(self.age(now).as_millis() as u64),
        )
    }

    /// Its bits, for loads that only touch the entry.
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
        let wrap = 1u64 << 32;
        // Just before a wrap of the millisecond count, and just after.
        let start = Nanos::from_millis(wrap * 419 - 5);
        let t = ReportTime::at(start);
        for later_ms in [0, 1, 5, 6, 72_000, MAX_REPORT_AGE.as_millis() as u64] {
            let now = Nanos::from_millis(wrap * 419 - 5 + later_ms);
            assert_eq!(t.age(now), Duration::from_millis(later_ms), "{later_ms} ms");
            assert_eq!(t.when(now), start, "{later_ms} ms");
        }
    }

    #[test]
    fn a_report_after_now_reads_as_now_and_the_later_report_wins() {
        let now = Nanos::from_millis(T);
        let ahead = ReportTime::at(Nanos::from_millis(T + 40));
        assert_eq!(ahead.age(now), Duration::ZERO);
        // The later of the two stays, whichever side it is on.
        assert_eq!(ahead.later(now), ahead);
        let behind = ReportTime::at(Nanos::from_millis(T - 40));
        assert_eq!(behind.later(now), ReportTime::at(now));
        assert_eq!(ReportTime::at(now).later(now), ReportTime::at(now));
    }

    #[test]
    fn milliseconds_are_kept_and_nanoseconds_dropped() {
        let now = Nanos::from_nanos(T * 1_000_000 + 999_999);
        let t = ReportTime::at(now);
        assert_eq!(t.when(now), Nanos::from_millis(T));
        assert_eq!(
            t.when(now + Duration::from_millis(2_005)),
            Nanos::from_millis(T)
        );
    }
}
