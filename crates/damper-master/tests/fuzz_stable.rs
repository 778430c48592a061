//! Fuzzing on stable Rust, in the suite: property tests that throw
//! arbitrary and mutated input at what a client controls, the rollup off
//! the wire, the factors query (early reports included) and the config
//! text, and check that each is answered with a precise status (never a
//! panic, never another code) and that the master still serves a good
//! rollup afterwards. The cargo-fuzz targets in `fuzz/` do the same with
//! coverage guidance on nightly.
//!
//! A short run is part of `cargo test` (proptest's 256 cases per
//! property). The long run: `PROPTEST_CASES=200000 cargo test --release -p
//! damper-master --test fuzz_stable`. A failing case is shrunk and kept in
//! `proptest-regressions/`, which is checked in, so it is rerun first
//! forever after.

use std::sync::Arc;

use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{AccountCounts, FactorsRequest, OpAccounts, OpCounts, RollupRequest};
use proptest::prelude::*;
use prost::Message;
use tonic::Code;

const T0_MS: u64 = 1_800_000_000_000;

fn master() -> Master {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000\n\"messages/a\" = 5").unwrap();
    let mut options = MasterOptions::default();
    options.shards = 2;
    options.max_entries = 1_000;
    options.max_pairs = 500;
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)));
    Master::with_clock(config, options, clock)
}

fn good_rollup() -> RollupRequest {
    RollupRequest {
        agent_id: "honest".into(),
        interval_start_unix_ms: T0_MS - 2_000,
        interval_end_unix_ms: T0_MS,
        ops: vec![OpCounts {
            op_costs: Vec::new(),
            op_counts: Vec::new(),
            attempted: Vec::new(),
            ids: Vec::new(),
            rejected: Vec::new(),
            op: "messages".into(),
            accounts: vec![AccountCounts {
                op_cost: 0,
                ops: 0,
                id: 0,
                account: "acme".into(),
                attempted: 8_000,
                admitted: 8_000,
                start_unix_ms: 0,
            }],
        }],
        ring_version: 0,
        ..Default::default()
    }
}

/// After any input, a good rollup is still answered.
fn still_serves(m: &Master) {
    let reply = m.rollup(&good_rollup()).expect("a good rollup is served");
    assert_eq!(reply.rollup_interval_ms, 2_000);
}

/// The only codes bad input may get.
fn precise(code: Code) -> bool {
    matches!(code, Code::InvalidArgument | Code::ResourceExhausted)
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z/]{1,12}",
        Just("messages".to_owned()),
        Just("a".to_owned()),
        "\\PC{0,300}",
    ]
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![0..10_000u64, Just(u64::MAX), any::<u64>()]
}

fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        (T0_MS - 100_000)..(T0_MS + 100_000),
        any::<u64>()
    ]
}

fn rollup() -> impl Strategy<Value = RollupRequest> {
    let entry =
        (name(), count(), count(), millis()).prop_map(|(account, attempted, admitted, start)| {
            AccountCounts {
                op_cost: 0,
                ops: 0,
                id: 0,
                account,
                attempted,
                admitted,
                start_unix_ms: start,
            }
        });
    let op = (name(), prop::collection::vec(entry, 0..8)).prop_map(|(op, accounts)| OpCounts {
        op_costs: Vec::new(),
        op_counts: Vec::new(),
        attempted: Vec::new(),
        ids: Vec::new(),
        rejected: Vec::new(),
        op,
        accounts,
    });
    (
        name(),
        millis(),
        millis(),
        prop::collection::vec(op, 0..4),
        any::<u64>(),
    )
        .prop_map(|(agent_id, start, end, ops, ring_version)| RollupRequest {
            agent_id,
            interval_start_unix_ms: start,
            interval_end_unix_ms: end,
            ops,
            ring_version,
            ..Default::default()
        })
}

fn rate() -> impl Strategy<Value = f32> {
    prop_oneof![
        0.0f32..100_000.0,
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(-1.0f32),
        Just(f32::MAX),
        any::<f32>()
    ]
}

fn factors() -> impl Strategy<Value = FactorsRequest> {
    let op = (
        name(),
        prop::collection::vec(name(), 0..5),
        prop::collection::vec(rate(), 0..6),
        prop::collection::vec(rate(), 0..6),
        prop::collection::vec(any::<bool>(), 0..6),
        prop::collection::vec(any::<bool>(), 0..6),
        prop::collection::vec(any::<bool>(), 0..6),
        prop::collection::vec(any::<u32>(), 0..6),
        prop::collection::vec(rate(), 0..6),
        prop::collection::vec(any::<u32>(), 0..6),
    )
        .prop_map(
            |(
                op,
                accounts,
                rates,
                baselines,
                surged,
                joined,
                hints,
                ops,
                rollup_baselines,
                span_micros,
            )| {
                OpAccounts {
                    op,
                    accounts,
                    rates,
                    baselines,
                    surged,
                    joined,
                    hints,
                    ops,
                    rollup_baselines,
                    span_micros,
                }
            },
        );
    (name(), prop::collection::vec(op, 0..3), millis()).prop_map(|(agent_id, ops, surge_at)| {
        FactorsRequest {
            agent_id,
            ops,
            surge_at_unix_ms: surge_at,
        }
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_as_a_rollup_get_a_precise_status(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let m = master();
        if let Err(status) = m.rollup_bytes(&bytes) {
            prop_assert!(precise(status.code()), "{status:?}");
        }
        still_serves(&m);
    }

    #[test]
    fn a_good_rollup_mutated_gets_a_precise_status(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let m = master();
        let mut bytes = good_rollup().encode_to_vec();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        if let Err(status) = m.rollup_bytes(&bytes) {
            prop_assert!(precise(status.code()), "{status:?}");
        }
        still_serves(&m);
    }

    #[test]
    fn structured_rollups_are_answered_or_refused_precisely(request in rollup()) {
        let m = master();
        match m.rollup(&request) {
            Ok(reply) => {
                for op in &reply.ops {
                    for a in &op.accounts {
                        prop_assert!((0.0..=1.0).contains(&a.factor), "{a:?}");
                    }
                }
            }
            Err(status) => prop_assert!(precise(status.code()), "{status:?}"),
        }
        prop_assert!(m.len() <= 500 + 2);
        still_serves(&m);
    }

    #[test]
    fn factors_queries_and_early_reports_are_answered_or_refused_precisely(request in factors()) {
        let m = master();
        if let Err(status) = m.factors(&request) {
            prop_assert!(precise(status.code()), "{status:?}");
        }
        still_serves(&m);
    }

    #[test]
    fn config_text_is_parsed_or_refused_never_panics(
        lines in prop::collection::vec(prop_oneof![
            Just("[limits]".to_owned()),
            Just("[window]".to_owned()),
            Just("[policy]".to_owned()),
            "[a-z_]{1,20} = -?[0-9]{1,12}(\\.[0-9]{1,3})?",
            "\"[a-z/]{1,10}\" = [0-9e.+-]{1,8}",
            "(rollup_interval_ms|sub_interval_ms|sub_intervals|grace_ms|confidence_sigmas|surge_min_gap_ms) = [0-9-]{1,10}",
            "estimator = \"[a-z-]{0,14}\"",
            "\\PC{0,40}",
        ], 0..12),
    ) {
        let text = lines.join("\n");
        if let Ok(config) = MasterConfig::from_toml(&text) {
            // What parses must run.
            let m = Master::with_clock(config, MasterOptions::default(), Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5))));
            let _ = m.rollup(&good_rollup());
        }
    }
}
