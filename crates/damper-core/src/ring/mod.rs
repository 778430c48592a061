//! The master ring: which master owns an account, by consistent hashing.
//!
//! Every agent (and every master, to check that it owns what it is sent)
//! builds the ring from the same member list and gets the same answer: the
//! members are deduplicated and sorted, each is placed at `vnodes` points
//! (virtual nodes) by a fixed hash of its address and replica number, and an
//! account belongs to the first point at or after the account's hash. When a
//! member joins or leaves, only the accounts on its arcs move.
//!
//! ```
//! use damper_core::ring::Ring;
//! let ring = Ring::new(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]);
//! let owner = ring.owner("acme").unwrap();
//! // Same members in another order: same owner.
//! let again = Ring::new(["10.0.0.3:7070", "10.0.0.1:7070", "10.0.0.2:7070"]);
//! assert_eq!(again.owner("acme"), Some(owner));
//! ```
//!
//! # Layout
//! - this file: members, the placement (`hashring`'s), [`Ring`].
//! - `lookup`: the points as a dense index, so [`Ring::owner`] is a table
//!   read and a step or two rather than a binary search.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use hashring::HashRing;

mod lookup;

use lookup::{Lookup, ring_hash};

/// Reads a member's address as flags and configs give it: `host:port`,
/// with an `http://` in front or a `/` after tolerated and dropped, since
/// the ring hashes the bare address and every agent and master must agree
/// on it. The one parser of `--masters` and `--ring`.
pub fn parse_member(text: &str) -> Result<String, String> {
    let address = text
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?}: expected host:port"))?;
    if host.is_empty() {
        return Err(format!("{text:?}: the host is empty"));
    }
    if host.contains("://") || host.contains('/') {
        return Err(format!(
            "{text:?}: give host:port, without a scheme or path"
        ));
    }
    port.parse::<u16>()
        .map_err(|_| format!("{text:?}: the port is not a number from 0 to 65535"))?;
    Ok(address.to_owned())
}

/// Virtual nodes per member by default: enough that three masters each get
/// within a few percent of a third of the accounts.
pub const DEFAULT_VNODES: u32 = 160;

/// One point of a member on the ring.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VNode {
    member: Arc<str>,
    replica: u32,
}

impl Hash for VNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.member.hash(state);
        self.replica.hash(state);
    }
}

/// A consistent-hash ring of master addresses.
#[derive(Clone)]
pub struct Ring {
    /// The points as a dense index, for [`Ring::owner`].
    lookup: Lookup,
    members: Vec<Arc<str>>,
    vnodes: u32,
    version: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("members", &self.members)
            .field("vnodes", &self.vnodes)
            .field("version", &format_args!("{:016x}", self.version))
            .finish()
    }
}

/// The ring of `members` (sorted, deduplicated), `vnodes` points each, as
/// `hashring` places them: the placement every agent and master agrees on.
fn place(members: &[Arc<str>], vnodes: u32) -> HashRing<VNode> {
    let mut ring = HashRing::new();
    ring.batch_add(
        members
            .iter()
            .flat_map(|m| {
                (0..vnodes).map(|replica| VNode {
                    member: m.clone(),
                    replica,
                })
            })
            .collect(),
    );
    ring
}

impl Ring {
    /// A ring of `members` with [`DEFAULT_VNODES`] points each.
    pub fn new<S: AsRef<str>>(members: impl IntoIterator<Item = S>) -> Ring {
        Ring::with_vnodes(members, DEFAULT_VNODES)
    }

    /// A ring of `members` with `vnodes` points each (at least 1).
    pub fn with_vnodes<S: AsRef<str>>(members: impl IntoIterator<Item = S>, vnodes: u32) -> Ring {
        let vnodes = vnodes.max(1);
        let mut members: Vec<Arc<str>> = members.into_iter().map(|m| m.as_ref().into()).collect();
        members.sort();
        members.dedup();
        // `hashring` places the points; the lookup indexes them in its order.
        let lookup = Lookup::new(place(&members, vnodes).into_iter().map(|vnode| {
            let member = members
                .binary_search(&vnode.member)
                .expect("a point's member is a member");
            (ring_hash(&vnode), member as u32)
        }));
        // A digest of the membership, equal wherever the members are equal:
        // lets an agent and a master see that their views differ.
        let mut digest = siphasher::sip::SipHasher::new();
        vnodes.hash(&mut digest);
        members.hash(&mut digest);
        Ring {
            lookup,
            members,
            vnodes,
            version: digest.finish(),
        }
    }

    /// The member that owns `account`, or `None` for an empty ring.
    pub fn owner(&self, account: &str) -> Option<&str> {
        Some(self.member(self.owner_index(account)?))
    }

    /// Where the member that owns `account` is in [`members`](Self::members),
    /// or `None` for an empty ring: a caller grouping many accounts by
    /// owner files them by number, not by comparing addresses.
    pub fn owner_index(&self, account: &str) -> Option<usize> {
        Some(self.lookup.member(ring_hash(account))? as usize)
    }

    /// The member at `index` in [`members`](Self::members).
    ///
    /// # Panics
    /// When `index` is not below the number of members.
    pub fn member(&self, index: usize) -> &str {
        &self.members[index]
    }

    /// How many members the ring has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The members, sorted.
    pub fn members(&self) -> impl ExactSizeIterator<Item = &str> {
        self.members.iter().map(|m| &**m)
    }

    /// Whether the ring has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A digest of the membership: equal for equal member sets.
    pub fn version(&self) -> u64 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn members_are_host_and_port_with_a_scheme_or_slash_dropped() {
        assert_eq!(parse_member("10.0.0.1:7070"), Ok("10.0.0.1:7070".into()));
        assert_eq!(parse_member("http://m1:7070/"), Ok("m1:7070".into()));
        assert_eq!(parse_member("[::1]:7070"), Ok("[::1]:7070".into()));
        for (bad, why) in [
            ("m1", "expected host:port"),
            (":7070", "the host is empty"),
            ("https://m1:7070", "without a scheme"),
            ("m1:99999", "the port"),
        ] {
            let err = parse_member(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    use super::*;
    use std::collections::HashMap;

    fn accounts() -> impl Iterator<Item = String> {
        (0..30_000).map(|i| format!("account-{i}"))
    }

    #[test]
    fn empty_ring_has_no_owner() {
        let ring = Ring::new(Vec::<String>::new());
        assert!(ring.is_empty());
        assert_eq!(ring.owner("acme"), None);
    }

    #[test]
    fn owners_do_not_depend_on_member_order_or_duplicates() {
        let a = Ring::new(["m1:1", "m2:1", "m3:1"]);
        let b = Ring::new(["m3:1", "m1:1", "m2:1", "m1:1"]);
        assert_eq!(a.version(), b.version());
        for account in accounts().take(2_000) {
            assert_eq!(a.owner(&account), b.owner(&account));
        }
        assert_ne!(a.version(), Ring::new(["m1:1", "m2:1"]).version());
    }

    /// Pins the placement itself: a change of hash or layout would move
    /// accounts between masters across a rolling upgrade.
    #[test]
    fn placement_is_stable_across_builds() {
        let ring = Ring::new(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]);
        let owners: Vec<&str> = ["acme", "globex", "initech", "org/team"]
            .iter()
            .map(|a| ring.owner(a).unwrap())
            .collect();
        assert_eq!(owners, PINNED_OWNERS);
    }
    const PINNED_OWNERS: [&str; 4] = [
        "10.0.0.2:7070",
        "10.0.0.3:7070",
        "10.0.0.2:7070",
        "10.0.0.1:7070",
    ];

    /// The dense lookup answers what `hashring` itself does, for rings of
    /// one point, of one member and of many.
    #[test]
    fn owners_are_hashrings_own() {
        for (members, vnodes) in [
            (vec!["m1:1".to_owned()], 1),
            (vec!["m1:1".to_owned()], DEFAULT_VNODES),
            (vec!["m1:1".to_owned(), "m2:1".to_owned()], 1),
            (
                vec!["m1:1".to_owned(), "m2:1".to_owned(), "m3:1".to_owned()],
                DEFAULT_VNODES,
            ),
            ((0..40).map(|i| format!("10.0.0.{i}:7070")).collect(), 400),
        ] {
            let ring = Ring::with_vnodes(&members, vnodes);
            let placed = place(&ring.members, vnodes);
            for account in accounts().chain(["".to_owned(), "x".repeat(300)]) {
                assert_eq!(
                    ring.owner(&account),
                    placed.get(&account.as_str()).map(|v| &*v.member),
                    "{account} on {members:?} x {vnodes}"
                );
            }
        }
    }

    #[test]
    fn accounts_spread_evenly() {
        let ring = Ring::new(["m1:1", "m2:1", "m3:1"]);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for account in accounts() {
            *counts.entry(ring.owner(&account).unwrap()).or_default() += 1;
        }
        for (member, n) in counts {
            let share = n as f64 / 30_000.0;
            assert!((share - 1.0 / 3.0).abs() < 0.05, "{member}: {share}");
        }
    }

    #[test]
    fn removing_a_member_moves_only_its_accounts() {
        let three = Ring::new(["m1:1", "m2:1", "m3:1"]);
        let two = Ring::new(["m1:1", "m3:1"]);
        let mut moved = 0;
        for account in accounts() {
            let before = three.owner(&account).unwrap();
            let after = two.owner(&account).unwrap();
            if before == "m2:1" {
                moved += 1;
            } else {
                assert_eq!(before, after, "{account} moved off a surviving member");
            }
        }
        assert!(moved > 0);
    }
}
