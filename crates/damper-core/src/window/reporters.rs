//! Which agents a surge estimate holds an early report of: a 256-bit
//! Bloom filter of their ids, so a follow-up can be told from an agent's
//! first report in it.
//!
//! An agent calls its report a follow-up (`SurgeRates::surged`) while its
//! last early report is of this round or the last, and sends it as a
//! change from that report's rate. But the master's estimate may have
//! given way to a fresh one meanwhile (a chance spike's, at the next
//! round's first report), and the fresh one never held that rate: the
//! follow-up is the agent's first report there. An agent's report of a
//! round may even land in the estimate of the round before, which a
//! fresh one of its own round replaces a moment later, so neither the
//! agent nor the round can tell; the estimate itself must remember.
//!
//! Three bits per agent in 256: with the twenty agents an account is
//! typically on, one agent in a hundred that never reported reads as one
//! that did, and is taken as before: a change from its last early report.
//! Past about a hundred agents it reads nearly full, and every follow-up
//! is taken so.

use serde::{Deserialize, Serialize};

/// The agents a surge estimate holds an early report of (see the module
/// docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Reporters([u64; 4]);

impl Reporters {
    /// Notes an early report from the agent whose id hashes to `agent`
    /// (`crate::agent::agent_seed`).
    pub(super) fn insert(&mut self, agent: u64) {
        for bit in bits(agent) {
            self.0[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether it may hold an early report from the agent whose id hashes
    /// to `agent`: certainly not when `false`.
    pub(super) fn may_hold(&self, agent: u64) -> bool {
        bits(agent)
            .into_iter()
            .all(|bit| self.0[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// The three bits an agent's id sets: bytes of its hash, mixed again
/// (FNV-1a's low bits follow its last bytes closely, and agent ids often
/// differ only in a trailing number).
fn bits(agent: u64) -> [usize; 3] {
    let mut h = agent ^ (agent >> 33);
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    [h as u8, (h >> 8) as u8, (h >> 16) as u8].map(usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::agent_seed;

    #[test]
    fn holds_every_agent_inserted() {
        let mut r = Reporters::default();
        let ids: Vec<u64> = (0..40).map(|i| agent_seed(&format!("node-{i}"))).collect();
        for &id in &ids {
            r.insert(id);
        }
        assert!(ids.iter().all(|&id| r.may_hold(id)));
    }

    /// With twenty agents in, few of a thousand others read as held: the
    /// module docs' one in a hundred, with room for chance.
    #[test]
    fn twenty_agents_in_leave_others_mostly_out() {
        let mut r = Reporters::default();
        for i in 0..20 {
            r.insert(agent_seed(&format!("node-{i}")));
        }
        let false_hits = (20..1_020)
            .filter(|i| r.may_hold(agent_seed(&format!("node-{i}"))))
            .count();
        assert!(false_hits < 30, "{false_hits}");
        assert!(!Reporters::default().may_hold(agent_seed("node-0")));
    }
}
