use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const T0: u64 = 1_700_000_000_000_000_000;

fn at(ms: u64) -> Nanos {
    Nanos::from_nanos(T0 + ms * 1_000_000)
}

/// The token bucket written out plainly, one `HashMap` entry per key, in
/// 128-bit arithmetic: what `TokenBuckets` must agree with.
struct Model {
    capacity: u128,
    refill_amount: u128,
    refill_ns: u128,
    strict: bool,
    buckets: HashMap<String, (u128, u128)>,
}

impl Model {
    fn new(c: &BucketConfig) -> Model {
        Model {
            capacity: c.capacity().into(),
            refill_amount: c.refill_amount().into(),
            refill_ns: c.refill_time().as_nanos(),
            strict: c.is_strict(),
            buckets: HashMap::new(),
        }
    }

    fn refill(&self, (tokens, last): (u128, u128), now: u128) -> (u128, u128) {
        if tokens == self.capacity {
            // Full is the same as new.
            return (tokens, last.max(now));
        }
        if now <= last {
            return (tokens, last);
        }
        let refills = (now - last) / self.refill_ns;
        let tokens = (tokens + refills * self.refill_amount).min(self.capacity);
        if tokens == self.capacity {
            (tokens, now)
        } else {
            (tokens, last + refills * self.refill_ns)
        }
    }

    fn reduce(&mut self, key: &str, want: u64, now: Nanos) -> Reduced {
        let now = u128::from(now.as_nanos());
        let want = u128::from(want);
        let bucket = *self
            .buckets
            .entry(key.to_string())
            .or_insert((self.capacity, now));
        let (tokens, mut last) = self.refill(bucket, now);
        if want <= tokens {
            self.buckets.insert(key.to_string(), (tokens - want, last));
            return Reduced::Taken {
                remaining: (tokens - want) as u64,
            };
        }
        if self.strict {
            last = last.max(now);
        }
        self.buckets.insert(key.to_string(), (tokens, last));
        let retry_after = (want <= self.capacity).then(|| {
            let refills = (want - tokens).div_ceil(self.refill_amount);
            let ready = last + refills * self.refill_ns;
            Duration::from_nanos(ready.saturating_sub(now) as u64)
        });
        Reduced::Denied {
            available: tokens as u64,
            retry_after,
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Reduce {
        key: usize,
        tokens: u64,
        advance_ms: u64,
    },
    Sweep {
        advance_ms: u64,
    },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        8 => (0usize..3, 0u64..6, 0u64..400).prop_map(|(key, tokens, advance_ms)| Step::Reduce { key, tokens, advance_ms }),
        1 => (0u64..3_000).prop_map(|advance_ms| Step::Sweep { advance_ms }),
    ];
    proptest::collection::vec(step, 1..200)
}

proptest! {
    /// Any sequence of reduces and sweeps, on a few keys, with time moving
    /// forward (and sometimes standing still), strict or not: the same
    /// answers and the same tokens as the model, which never sweeps.
    #[test]
    fn agrees_with_the_model_and_sweeping_loses_nothing(
        capacity in 1u64..8, refill_amount in 1u64..4, refill_ms in 1u64..500,
        strict in any::<bool>(), steps in steps(),
    ) {
        let config = BucketConfig::new(capacity, refill_amount, Duration::from_millis(refill_ms))
            .unwrap()
            .strict(strict);
        let buckets: TokenBuckets<String> = TokenBuckets::new(config);
        let mut model = Model::new(&config);
        let keys = ["a", "b", "c"];
        let mut ms = 0;
        for step in steps {
            match step {
                Step::Reduce { key, tokens, advance_ms } => {
                    ms += advance_ms;
                    let got = buckets.reduce(keys[key], tokens, at(ms));
                    let want = model.reduce(keys[key], tokens, at(ms));
                    prop_assert_eq!(got, want, "{} at {} ms", keys[key], ms);
                }
                Step::Sweep { advance_ms } => {
                    ms += advance_ms;
                    buckets.sweep(at(ms));
                }
            }
            for key in keys {
                let modelled = model
                    .buckets
                    .get(key)
                    .map_or(capacity, |b| model.refill(*b, u128::from(at(ms).as_nanos())).0 as u64);
                prop_assert_eq!(buckets.available(key, at(ms)), modelled, "{} at {} ms", key, ms);
            }
        }
    }

    /// Over any stretch of time, a key gets at most its capacity plus what
    /// the refills in that stretch add.
    #[test]
    fn never_gives_more_than_capacity_plus_refills(
        capacity in 1u64..20, refill_amount in 1u64..5, refill_ms in 1u64..200,
        gaps in proptest::collection::vec(0u64..50, 1..400),
    ) {
        let config = BucketConfig::new(capacity, refill_amount, Duration::from_millis(refill_ms)).unwrap();
        let buckets: TokenBuckets<String> = TokenBuckets::new(config);
        let mut ms = 0;
        let mut taken = 0u64;
        for gap in gaps {
            ms += gap;
            if buckets.reduce("k", 1, at(ms)).is_taken() {
                taken += 1;
            }
        }
        let refills = ms / refill_ms + 1;
        prop_assert!(taken <= capacity + refills * refill_amount, "{taken} in {ms} ms");
    }
}

#[test]
fn strict_mode_keeps_a_hammering_client_out_until_it_pauses() {
    let per_100ms = |strict| {
        TokenBuckets::<String>::new(
            BucketConfig::new(1, 1, Duration::from_millis(100))
                .unwrap()
                .strict(strict),
        )
    };
    for strict in [false, true] {
        let buckets = per_100ms(strict);
        assert!(buckets.reduce("c", 1, at(0)).is_taken());
        // Every 50 ms for a second.
        let admitted = (1..=20)
            .filter(|i| buckets.reduce("c", 1, at(i * 50)).is_taken())
            .count();
        if strict {
            assert_eq!(admitted, 0, "each denied try restarts the clock");
            // A 100 ms pause, and it is let through.
            assert!(buckets.reduce("c", 1, at(1_100)).is_taken());
        } else {
            assert_eq!(admitted, 10, "one per refill");
        }
    }
}

#[test]
fn denials_say_when_to_retry_and_asks_over_capacity_never_pass() {
    let buckets: TokenBuckets<String> =
        TokenBuckets::new(BucketConfig::new(10, 2, Duration::from_secs(1)).unwrap());
    assert_eq!(
        buckets.reduce("k", 9, at(0)),
        Reduced::Taken { remaining: 1 }
    );
    // 5 more needs 4 more tokens: two refills, 2 s after the take.
    assert_eq!(
        buckets.reduce("k", 5, at(300)),
        Reduced::Denied {
            available: 1,
            retry_after: Some(Duration::from_millis(1_700))
        }
    );
    assert!(buckets.reduce("k", 5, at(2_000)).is_taken());
    assert_eq!(
        buckets.reduce("k", 11, at(60_000)),
        Reduced::Denied {
            available: 10,
            retry_after: None
        }
    );
    // Zero tokens: always taken.
    assert!(buckets.reduce("k", 0, at(60_000)).is_taken());
}

#[test]
fn historical_timestamps_replay_and_earlier_ones_refill_nothing() {
    let buckets: TokenBuckets<String> = TokenBuckets::new(BucketConfig::per_second(2).unwrap());
    // Events from a log of a day long gone, replayed in order.
    let day = Nanos::from_secs(1_500_000_000);
    let taken = (0..10u64)
        .filter(|i| {
            buckets
                .reduce("k", 1, day + Duration::from_millis(i * 100))
                .is_taken()
        })
        .count();
    // 2 at once, then one per 500 ms: 0.5 s in, the third; at 0.9 s not yet.
    assert_eq!(taken, 3);
    // An event stamped before the bucket's last update refills nothing.
    assert!(!buckets.reduce("k", 1, day).is_taken());
}

#[test]
fn settings_are_valid_by_construction() {
    let one = Duration::from_secs(1);
    assert_eq!(
        BucketConfig::new(0, 1, one),
        Err(BucketConfigError::Zero("capacity"))
    );
    assert_eq!(
        BucketConfig::new(1, 0, one),
        Err(BucketConfigError::Zero("refill_amount"))
    );
    assert_eq!(
        BucketConfig::new(1, 1, Duration::ZERO),
        Err(BucketConfigError::Zero("refill_time"))
    );
    assert_eq!(
        BucketConfig::new(1, 1, Duration::MAX),
        Err(BucketConfigError::TooLong)
    );
    assert_eq!(
        BucketConfig::per_second(0),
        Err(BucketConfigError::Zero("per_second"))
    );
    let c = BucketConfig::per_second(50).unwrap();
    assert_eq!(
        (c.capacity(), c.refill_amount(), c.refill_time()),
        (50, 1, Duration::from_millis(20))
    );
}

#[test]
fn threads_never_take_more_than_there_is() {
    let buckets: TokenBuckets<String> =
        TokenBuckets::new(BucketConfig::new(10_000, 1, Duration::from_secs(3600)).unwrap());
    let taken = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..5_000u64 {
                    if buckets.reduce("hot", 1, at(i % 7)).is_taken() {
                        taken.fetch_add(1, Relaxed);
                    }
                    if i % 500 == 0 {
                        buckets.sweep(at(0));
                    }
                }
            });
        }
    });
    assert_eq!(
        taken.load(Relaxed),
        10_000,
        "exactly the capacity, no refill in an hour"
    );
    assert_eq!(buckets.available("hot", at(10)), 0);
}
