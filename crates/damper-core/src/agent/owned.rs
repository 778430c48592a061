//! Fields one writer owns: a pair's drained counts (written under the
//! drain lock), its scan state (written by the one scanner), the local
//! guard's base (written by the check that won the window). Their owner
//! replaces a value with a load and a store, not a locked swap: a locked
//! instruction costs several times as much, on passes over every pair
//! (a drain's four swaps per pair were 2.6% of the simulator's hour).
//!
//! Readers on other threads see the old value or the new one, as with a
//! swap; only a second writer could tell the difference, and there is
//! none.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

/// A field its one writer replaces (see the module's docs).
pub(super) trait Owned {
    /// The value it holds.
    type Value: Copy;

    /// Stores `value` and returns what the field held, as `swap` would
    /// for its only writer.
    fn replace(&self, value: Self::Value) -> Self::Value;
}

macro_rules! owned {
    ($atomic:ty, $value:ty) => {
        impl Owned for $atomic {
            type Value = $value;

            #[inline]
            fn replace(&self, value: $value) -> $value {
                let old = self.load(Relaxed);
                self.store(value, Relaxed);
                old
            }
        }
    };
}

owned!(AtomicBool, bool);
owned!(AtomicU32, u32);
owned!(AtomicU64, u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replace_returns_what_was_held_and_leaves_the_new_value() {
        let word = AtomicU64::new(7);
        assert_eq!(word.replace(9), 7);
        assert_eq!(word.replace(11), 9);
        assert_eq!(word.load(Relaxed), 11);
        let flag = AtomicBool::new(false);
        assert!(!flag.replace(true));
        assert!(flag.load(Relaxed));
        let bits = AtomicU32::new(1);
        assert_eq!(bits.replace(2), 1);
    }
}
