//! What an (account, op) stands at, counting nothing:
//! [`AgentState::peek`], for callers that want to show a customer how close
//! it is to its limit, or a sidecar's `PEEK`, without spending anything.

use std::sync::atomic::Ordering::{Acquire, Relaxed};

use super::entry::factor_of;
use super::{AgentState, RejectSource};
use crate::time::{Nanos, duration_nanos};

/// What [`AgentState::check`] would apply to an (account, op) now.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Standing {
    /// The share of the attempted cost `check` refuses now: the larger of
    /// the master's factor in force and the local guard's. 0 when nothing
    /// is suppressed.
    pub factor: f64,
    /// Whose factor that is; `None` when `factor` is 0.
    pub source: Option<RejectSource>,
    /// The account-wide limit in cost per second: the one the master last
    /// sent for the pair, or else its op's default as learned from any
    /// reply; 0 when no limit is known (none configured, the account is
    /// exempt, or no master has answered yet).
    pub limit: f64,
    /// Whether this agent tracks the pair (it was checked or answered for
    /// and not forgotten since).
    pub tracked: bool,
    /// The account's demand over its limit, as its master last said it
    /// (see [`Admitted::utilisation`](super::Admitted::utilisation)).
    pub utilisation: Option<f32>,
}

impl AgentState {
    /// What an (account, op) stands at, at `now`: the factor `check` would
    /// apply and the limit in force. Counts nothing, creates no state, and
    /// does not move the local guard's measurement; a local factor whose
    /// measurement is more than two local windows old (nothing checked
    /// since) counts as 0, since the next check would measure afresh.
    pub fn peek(&self, now: Nanos, account: &str, op: &str) -> Standing {
        let pinned = self.pairs.pin();
        let Some(entry) = pinned.find(account, op) else {
            return Standing {
                factor: 0.0,
                source: None,
                limit: self.op_limit(op).unwrap_or(0.0),
                tracked: false,
                utilisation: None,
            };
        };
        let expires = entry.master_expires.load(Acquire);
        let master = entry.master_factor_at(now);
        // As in `check`: a lapsed master leaves the local guard nothing to
        // enforce (fail open).
        let lapsed = expires != 0 && now.as_nanos() >= expires;
        let fresh = now
            .as_nanos()
            .saturating_sub(super::entry::window_start(entry.local_start.load(Relaxed)))
            < 2 * duration_nanos(self.config.local_window);
        let local = if lapsed || !fresh {
            0
        } else {
            entry.local_factor.load(Relaxed)
        };
        let (stored, _) = super::entry::limit_of(entry.limit.load(Relaxed));
        // An exempt account's master sends `f64::MAX`: no limit, as for
        // an op that has none.
        let limit = if super::entry::is_unlimited(stored) {
            0.0
        } else if stored > 0.0 {
            stored
        } else {
            self.op_limit(op).unwrap_or(0.0)
        };
        let bits = master.max(local);
        let source = match (bits, local > master) {
            (0, _) => None,
            (_, true) => Some(RejectSource::LocalGuard),
            (_, false) => Some(RejectSource::Master),
        };
        let utilisation = if now.as_nanos() < expires {
            entry.said_utilisation()
        } else {
            None
        };
        Standing {
            factor: factor_of(bits),
            source,
            limit,
            tracked: true,
            utilisation,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng;

    use super::*;
    use crate::agent::AgentConfig;

    fn t(ms: u64) -> Nanos {
        Nanos::from_secs(1_800_000_000) + Duration::from_millis(ms)
    }

    #[test]
    fn peek_reports_the_factor_in_force_and_counts_nothing() {
        let agent = AgentState::new(AgentConfig::default());
        let unseen = agent.peek(t(0), "acme", "messages");
        assert_eq!(
            (unseen.factor, unseen.limit, unseen.tracked),
            (0.0, 0.0, false)
        );
        // Peeking creates nothing.
        assert!(agent.is_empty());

        agent.apply(
            t(0),
            "acme",
            "messages",
            0.75,
            1000.0,
            Duration::from_secs(6),
        );
        let s = agent.peek(t(10), "acme", "messages");
        assert_eq!(s.factor, 0.75);
        assert_eq!(s.limit, 1000.0);
        assert_eq!(s.source, Some(RejectSource::Master));
        assert!(s.tracked);
        // Nothing counted: the drain finds no counts.
        let mut drained = 0;
        agent.drain(t(20), |_, _, d| drained += d.attempted);
        assert_eq!(drained, 0);

        // Past its validity the factor is gone (fail open); the limit stays known.
        let later = agent.peek(t(7_000), "acme", "messages");
        assert_eq!(
            (later.factor, later.source, later.limit),
            (0.0, None, 1000.0)
        );
    }

    #[test]
    fn peek_sees_the_local_guard_while_its_measurement_is_fresh() {
        let agent = AgentState::new(AgentConfig::default());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        // A limit of 100/s, no master factor, and this agent alone at 10 000/s.
        agent.apply(
            t(0),
            "acme",
            "messages",
            0.0,
            100.0,
            Duration::from_secs(60),
        );
        for i in 0..3_000 {
            agent.check(t(i / 10), "acme", "messages", 1, &mut rng);
        }
        let s = agent.peek(t(300), "acme", "messages");
        assert_eq!(s.source, Some(RejectSource::LocalGuard));
        assert!(s.factor > 0.9, "{s:?}");
        // Long after the last check, the guard would measure afresh.
        assert_eq!(agent.peek(t(5_000), "acme", "messages").factor, 0.0);
    }
}
