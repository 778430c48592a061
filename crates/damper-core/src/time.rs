//! Time as a value: [`Nanos`] points in time and the [`Clock`] that reads them.
//!
//! Every state machine in this crate takes `now` as an argument, so the
//! simulator can drive it in virtual time and tests can step a
//! [`ManualClock`]. This module is the only place that reads the system clock.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
#[allow(clippy::disallowed_types)] // The one place that reads the system clock.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: nanoseconds since the Unix epoch.
///
/// Wall-clock based on purpose: rollups from different agents are placed on
/// one timeline at the master, so agents and masters must agree on what "now"
/// is (NTP keeps them within milliseconds, which is noise next to 2 s rollups).
/// Because a wall clock can step backwards, every difference saturates at
/// zero instead of panicking or wrapping.
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(u64);

impl Nanos {
    /// The Unix epoch.
    pub const ZERO: Nanos = Nanos(0);

    /// From nanoseconds since the Unix epoch.
    pub const fn from_nanos(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// From milliseconds since the Unix epoch (saturating).
    pub const fn from_millis(millis: u64) -> Nanos {
        Nanos(millis.saturating_mul(1_000_000))
    }

    /// From seconds since the Unix epoch (saturating).
    pub const fn from_secs(secs: u64) -> Nanos {
        Nanos(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the Unix epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    /// Time elapsed from `earlier` to `self`; zero if `earlier` is later.
    pub fn since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// Converts a duration to whole nanoseconds, saturating at `u64::MAX`.
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Parses a duration as every Damper binary's flags take it: a number and
/// a unit, `2s`, `500ms`, `1m 30s` (humantime's syntax), from `min` to
/// `max`. The error says what was wrong and what is allowed; clap puts the
/// flag's name before it.
pub fn parse_duration_in(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (write a number and a unit: 2s, 500ms, 1m)"))?;
    if d < min || d > max {
        return Err(format!(
            "must be from {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

impl Add<Duration> for Nanos {
    type Output = Nanos;
    /// Saturating: a far-future expiry is still a valid point in time.
    fn add(self, rhs: Duration) -> Nanos {
        Nanos(self.0.saturating_add(duration_nanos(rhs)))
    }
}

impl Sub<Duration> for Nanos {
    type Output = Nanos;
    /// Saturating at the epoch.
    fn sub(self, rhs: Duration) -> Nanos {
        Nanos(self.0.saturating_sub(duration_nanos(rhs)))
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

/// A source of the current time.
///
/// The services use [`SystemClock`] (or, on the agent's hot path, a coarse
/// clock built on it); tests and the simulator use [`ManualClock`].
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_types)]
    fn now(&self) -> Nanos {
        // A clock set before 1970 reads as the epoch rather than panicking.
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Nanos(duration_nanos(since_epoch))
    }
}

/// A clock that only moves when told to: for tests and virtual time.
///
/// Shareable between threads; reads and writes are atomic.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Nanos) -> ManualClock {
        ManualClock(AtomicU64::new(start.0))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_nanos(by), Ordering::AcqRel);
    }

    /// Sets the clock to `to` (which may be earlier: wall clocks step back).
    pub fn set(&self, to: Nanos) {
        self.0.store(to.0, Ordering::Release);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.0.load(Ordering::Acquire))
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_saturate_instead_of_wrapping() {
        let a = Nanos::from_secs(10);
        let b = Nanos::from_secs(12);
        assert_eq!(b.since(a), Duration::from_secs(2));
        assert_eq!(a.since(b), Duration::ZERO);
        assert_eq!(Nanos::ZERO - Duration::from_secs(1), Nanos::ZERO);
        assert_eq!(
            Nanos::from_nanos(u64::MAX) + Duration::from_secs(1),
            Nanos::from_nanos(u64::MAX)
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Nanos::from_millis(1_000));
        assert_eq!(clock.now(), Nanos::from_millis(1_000));
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now(), Nanos::from_millis(1_250));
        clock.set(Nanos::from_millis(900));
        assert_eq!(clock.now().as_millis(), 900);
    }

    #[test]
    fn durations_are_a_number_and_a_unit_within_bounds() {
        let (min, max) = (Duration::from_millis(10), Duration::from_secs(3600));
        assert_eq!(
            parse_duration_in("2s", min, max),
            Ok(Duration::from_secs(2))
        );
        assert_eq!(
            parse_duration_in("500ms", min, max),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration_in(" 1m 30s ", min, max),
            Ok(Duration::from_secs(90))
        );
        let bare = parse_duration_in("2000", min, max).unwrap_err();
        assert!(bare.contains("unit"), "{bare}");
        let low = parse_duration_in("1ms", min, max).unwrap_err();
        assert_eq!(low, "must be from 10ms to 1h");
        assert!(parse_duration_in("2h", min, max).is_err());
        assert!(parse_duration_in("-2s", min, max).is_err());
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > Nanos::from_secs(1_577_836_800));
    }
}
