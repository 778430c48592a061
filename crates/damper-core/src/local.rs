//! Local limits: keyed token buckets for the limits a node enforces on its
//! own, such as 50 messages per second per connection and per channel,
//! next to the account-wide limit the masters set.
//!
//! A bucket holds up to `capacity` tokens and starts full. Every
//! `refill_time`, `refill_amount` tokens are added back, up to the capacity.
//! [`TokenBuckets::reduce`] takes tokens only when enough are there; a
//! denial is a value, [`Reduced::Denied`], with a retry hint.
//!
//! - **Strict mode** ([`BucketConfig::strict`]): a denied attempt counts as
//!   activity. It restarts the refill clock, so a client that keeps
//!   hammering stays blocked until it pauses for a whole refill.
//! - **Caller-supplied time**: `now` is an argument, so historical events
//!   can be replayed through the same limiter. A timestamp before a bucket's
//!   last update refills nothing and does not move the bucket back.
//! - **Sweeping**: [`TokenBuckets::sweep`] removes the buckets that are full
//!   at `now`. A full bucket is the same as no bucket, so nothing is lost,
//!   and idle keys cost no memory.
//! - **Concurrent**: one bucket is one 128-bit word (tokens and last
//!   update) changed by compare-and-swap; keys live in a concurrent map. No
//!   lock, and no allocation for a known key.
//!
//! ```
//! use damper_core::local::{BucketConfig, Reduced, TokenBuckets};
//! use damper_core::time::Nanos;
//! use std::time::Duration;
//!
//! // 2 tokens, 1 back every second.
//! let config = BucketConfig::new(2, 1, Duration::from_secs(1)).unwrap();
//! let buckets: TokenBuckets<String> = TokenBuckets::new(config);
//! let t = Nanos::from_secs(1_700_000_000);
//! assert_eq!(buckets.reduce("conn-1", 1, t), Reduced::Taken { remaining: 1 });
//! assert_eq!(buckets.reduce("conn-1", 1, t), Reduced::Taken { remaining: 0 });
//! assert_eq!(
//!     buckets.reduce("conn-1", 1, t),
//!     Reduced::Denied { available: 0, retry_after: Some(Duration::from_secs(1)) }
//! );
//! let later = t + Duration::from_secs(1);
//! assert_eq!(buckets.reduce("conn-1", 1, later), Reduced::Taken { remaining: 0 });
//! // Two seconds on, the bucket is full again: a sweep removes it.
//! assert_eq!(buckets.sweep(later + Duration::from_secs(2)), 1);
//! assert!(buckets.is_empty());
//! ```

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use foldhash::fast::RandomState;
use portable_atomic::AtomicU128;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use crate::time::Nanos;

/// The settings of every bucket of one [`TokenBuckets`], valid by
/// construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketConfig {
    capacity: u64,
    refill_amount: u64,
    refill_ns: u64,
    strict: bool,
}

/// Why bucket settings were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketConfigError {
    /// A setting is zero.
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
    /// The refill time does not fit in 64-bit nanoseconds (584 years).
    #[error("`refill_time` is too long")]
    TooLong,
}

impl BucketConfig {
    /// Buckets of `capacity` tokens, refilled by `refill_amount` every
    /// `refill_time`. Not strict.
    pub fn new(
        capacity: u64,
        refill_amount: u64,
        refill_time: Duration,
    ) -> Result<BucketConfig, BucketConfigError> {
        if capacity == 0 {
            return Err(BucketConfigError::Zero("capacity"));
        }
        if refill_amount == 0 {
            return Err(BucketConfigError::Zero("refill_amount"));
        }
        let refill_ns =
            u64::try_from(refill_time.as_nanos()).map_err(|_| BucketConfigError::TooLong)?;
        if refill_ns == 0 {
            return Err(BucketConfigError::Zero("refill_time"));
        }
        Ok(BucketConfig {
            capacity,
            refill_amount,
            refill_ns,
            strict: false,
        })
    }

    /// `n` per second, smoothly: capacity `n`, one token back every `1/n`
    /// s. The usual "50 messages per second per connection".
    pub fn per_second(n: u64) -> Result<BucketConfig, BucketConfigError> {
        if n == 0 {
            return Err(BucketConfigError::Zero("per_second"));
        }
        BucketConfig::new(n, 1, Duration::from_nanos((1_000_000_000 / n).max(1)))
    }

    /// Strict mode: a denied attempt restarts the refill clock (see the
    /// module docs).
    pub fn strict(mut self, strict: bool) -> BucketConfig {
        self.strict = strict;
        self
    }

    /// Most tokens a bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Tokens added by each refill.
    pub fn refill_amount(&self) -> u64 {
        self.refill_amount
    }

    /// Time between refills.
    pub fn refill_time(&self) -> Duration {
        Duration::from_nanos(self.refill_ns)
    }

    /// Whether denied attempts restart the refill clock.
    pub fn is_strict(&self) -> bool {
        self.strict
    }
}

/// What [`TokenBuckets::reduce`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduced {
    /// The tokens were taken.
    Taken {
        /// Tokens left in the bucket.
        remaining: u64,
    },
    /// Not enough tokens: nothing was taken.
    Denied {
        /// Tokens in the bucket.
        available: u64,
        /// How long until enough tokens are there, if nothing else takes
        /// any (in strict mode: if the client waits that long without
        /// trying). `None` when more than the capacity was asked for.
        retry_after: Option<Duration>,
    },
}

impl Reduced {
    /// Whether the tokens were taken.
    pub fn is_taken(&self) -> bool {
        matches!(self, Reduced::Taken { .. })
    }
}

/// A bucket's state: tokens and the time of its last refill (or, in strict
/// mode, of its last denied attempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    tokens: u64,
    last: u64,
}

/// A bucket that a sweep removed: a `reduce` that finds it looks the key up
/// again. No real state has this many tokens at this instant.
const RETIRED: u128 = u128::MAX;

impl State {
    fn pack(self) -> u128 {
        (u128::from(self.tokens) << 64) | u128::from(self.last)
    }

    fn unpack(word: u128) -> State {
        State {
            tokens: (word >> 64) as u64,
            last: word as u64,
        }
    }

    /// The state at `now` after the refills due since `last`. A full
    /// bucket is the same as a new one: its refill clock starts when tokens
    /// are next taken (so a sweep, which forgets full buckets, loses
    /// nothing).
    fn refilled(self, c: &BucketConfig, now: u64) -> State {
        if self.tokens >= c.capacity {
            return State {
                tokens: c.capacity,
                last: self.last.max(now),
            };
        }
        if now <= self.last {
            return self;
        }
        let refills = (now - self.last) / c.refill_ns;
        if refills == 0 {
            return self;
        }
        let tokens = self
            .tokens
            .saturating_add(refills.saturating_mul(c.refill_amount))
            .min(c.capacity);
        State {
            tokens,
            last: if tokens >= c.capacity {
                now
            } else {
                self.last + refills * c.refill_ns
            },
        }
    }

    /// Takes `tokens` at `now` if there are enough.
    fn reduce(self, c: &BucketConfig, tokens: u64, now: u64) -> (State, Reduced) {
        let s = self.refilled(c, now);
        if tokens <= s.tokens {
            let left = s.tokens - tokens;
            return (
                State {
                    tokens: left,
                    last: s.last,
                },
                Reduced::Taken { remaining: left },
            );
        }
        let s = if c.strict {
            State {
                tokens: s.tokens,
                last: s.last.max(now),
            }
        } else {
            s
        };
        let retry_after = (tokens <= c.capacity).then(|| {
            let refills = (tokens - s.tokens).div_ceil(c.refill_amount);
            let at = s.last.saturating_add(refills.saturating_mul(c.refill_ns));
            Duration::from_nanos(at.saturating_sub(now))
        });
        (
            s,
            Reduced::Denied {
                available: s.tokens,
                retry_after,
            },
        )
    }
}

struct Bucket {
    state: AtomicU128,
}

/// Keyed token buckets, all with one [`BucketConfig`]. See the module
/// docs. Shared between threads by reference (`&self` everywhere).
pub struct TokenBuckets<K> {
    config: BucketConfig,
    buckets: papaya::HashMap<K, Bucket, RandomState>,
}

impl<K: Hash + Eq> std::fmt::Debug for TokenBuckets<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBuckets")
            .field("config", &self.config)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl<K: Hash + Eq> TokenBuckets<K> {
    /// No buckets yet, all to be made with `config`.
    pub fn new(config: BucketConfig) -> TokenBuckets<K> {
        TokenBuckets {
            config,
            buckets: papaya::HashMap::builder()
                .hasher(RandomState::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BucketConfig {
        &self.config
    }

    /// Takes `tokens` from `key`'s bucket at `now` if it holds enough; a new
    /// key starts full. Taking 0 tokens always succeeds and changes nothing
    /// but the refills.
    pub fn reduce<Q>(&self, key: &Q, tokens: u64, now: Nanos) -> Reduced
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = now.as_nanos();
        let guard = self.buckets.guard();
        loop {
            let bucket = match self.buckets.get(key, &guard) {
                Some(bucket) => bucket,
                None => self.buckets.get_or_insert_with(
                    key.to_owned(),
                    || Bucket {
                        state: AtomicU128::new(
                            State {
                                tokens: self.config.capacity,
                                last: now,
                            }
                            .pack(),
                        ),
                    },
                    &guard,
                ),
            };
            let mut word = bucket.state.load(Acquire);
            loop {
                if word == RETIRED {
                    break;
                }
                let (next, reduced) = State::unpack(word).reduce(&self.config, tokens, now);
                let next = next.pack();
                if next == word {
                    return reduced;
                }
                match bucket
                    .state
                    .compare_exchange_weak(word, next, Acquire, Acquire)
                {
                    Ok(_) => return reduced,
                    Err(current) => word = current,
                }
            }
            // Swept while we looked: help remove it, then start again.
            let _ = self
                .buckets
                .remove_if(key, |_, b| std::ptr::eq(b, bucket), &guard);
        }
    }

    /// Tokens in `key`'s bucket at `now` (the capacity for a key with no
    /// bucket). Changes nothing.
    pub fn available<Q>(&self, key: &Q, now: Nanos) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = self.buckets.guard();
        match self.buckets.get(key, &guard) {
            Some(bucket) => match bucket.state.load(Acquire) {
                RETIRED => self.config.capacity,
                word => {
                    State::unpack(word)
                        .refilled(&self.config, now.as_nanos())
                        .tokens
                }
            },
            None => self.config.capacity,
        }
    }

    /// Removes every bucket that is full at `now`, which is the same as no
    /// bucket: idle keys cost no memory. Returns how many went. Call it
    /// every few refill times.
    pub fn sweep(&self, now: Nanos) -> usize {
        let now = now.as_nanos();
        let before = self.buckets.len();
        self.buckets.pin().retain(|_, bucket| {
            let word = bucket.state.load(Relaxed);
            if word == RETIRED {
                return false;
            }
            let state = State::unpack(word).refilled(&self.config, now);
            // Retire it only if no reduce changed it meanwhile.
            !(state.tokens >= self.config.capacity
                && bucket
                    .state
                    .compare_exchange(word, RETIRED, Acquire, Relaxed)
                    .is_ok())
        });
        before.saturating_sub(self.buckets.len())
    }

    /// Number of buckets held (keys seen since they were last full).
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.len() == 0
    }
}

#[cfg(test)]
mod tests;
