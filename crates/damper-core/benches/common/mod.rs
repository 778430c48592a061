//! What the `check` and `local` benchmarks share: the keys, the order they
//! are visited in, and the instant they run at.

use damper_core::time::Nanos;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Keys each limiter holds: enough that every call misses cache, as on a
/// node with many accounts.
pub const KEYS: usize = 100_000;
/// The op `check` is called with.
pub const OP: &str = "messages";
/// The `now` every call is given.
pub const NOW: Nanos = Nanos::from_secs(1_800_000_000);

/// `KEYS` distinct `String` keys, `{prefix}-NNNNNN`.
pub fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("{prefix}-{i:06}")).collect()
}

/// A shuffled visiting order, the same for every limiter compared.
pub fn order(seed: u64) -> Vec<usize> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..KEYS).collect();
    for i in (1..order.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}
