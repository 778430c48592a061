//! Finding an account's point on the ring fast: the points' hashes in a
//! dense sorted array, with a table of where each slice of the hash space
//! begins, so a lookup is one table read and a step or two along the array
//! instead of a binary search over the ring's (hash, member) nodes.
//!
//! The answer is the ring's own: the first point at or after the account's
//! hash, wrapping to the first point. Every agent drains its pairs through
//! it each round, and the simulator's 50 agents spent a tenth of their time
//! in the binary search, a dependent cache miss per step.

use std::hash::{BuildHasher, Hash};

/// Slices of the 64-bit hash space the table divides it into: 2^8, so a
/// ring of a few hundred points has a point or two per slice, and the
/// table (1 KiB) stays in cache beside the points. (2^12 slices, 16 KiB,
/// measured slower in the simulator, where 50 agents' rings compete for
/// the cache.)
const SLICE_BITS: u32 = 8;

/// The points of a ring, sorted, each with its member's index.
#[derive(Clone, Debug, Default)]
pub(super) struct Lookup {
    /// The points' hashes, ascending.
    points: Vec<u64>,
    /// `members[i]`: the index of the member at `points[i]`.
    members: Vec<u32>,
    /// `starts[s]`: the first point whose hash is in slice `s` or later.
    starts: Vec<u32>,
}

/// The hash the ring places keys and points by: SipHash-2-4 with zero keys,
/// as `hashring` computes it, so the placement never changes.
pub(super) fn ring_hash(value: impl Hash) -> u64 {
    hashring::DefaultHashBuilder.hash_one(value)
}

impl Lookup {
    /// The lookup of points `(hash, member index)` in ring order.
    pub(super) fn new(points: impl IntoIterator<Item = (u64, u32)>) -> Lookup {
        let (points, members): (Vec<u64>, Vec<u32>) = points.into_iter().unzip();
        debug_assert!(points.is_sorted(), "the ring's points come in order");
        let mut starts = Vec::with_capacity(1 << SLICE_BITS);
        let mut next = 0;
        for slice in 0..1u64 << SLICE_BITS {
            let floor = slice << (64 - SLICE_BITS);
            while next < points.len() && points[next] < floor {
                next += 1;
            }
            starts.push(u32::try_from(next).expect("fewer than 2^32 points"));
        }
        Lookup {
            points,
            members,
            starts,
        }
    }

    /// The index of the member owning `hash`, or `None` for no points.
    #[inline]
    pub(super) fn member(&self, hash: u64) -> Option<u32> {
        let first = *self.members.first()?;
        let mut i = self.starts[(hash >> (64 - SLICE_BITS)) as usize] as usize;
        while i < self.points.len() && self.points[i] < hash {
            i += 1;
        }
        Some(self.members.get(i).copied().unwrap_or(first))
    }
}
