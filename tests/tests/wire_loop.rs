//! The loop over the wire format: agents and masters exchanging encoded
//! `damper.v1` messages, routed by the ring.

use damper_tests::{Load, WireLoop, sampling_sd};

const CONFIG: &str = r#"
[limits]
messages = 1000
"messages/big" = 20000
"#;

#[test]
fn a_deluge_spread_over_agents_and_masters_is_held_at_its_limit() {
    let mut cluster = WireLoop::new(CONFIG, 3, 8, 11);
    let loads = [
        // 10 × the limit: 910 publishes/s, each to 10 subscribers (cost 11).
        Load {
            account: "flood",
            op: "messages",
            cost: 11,
            ops_per_sec: 910,
        },
        // Just under its limit: 980/s of cost 1.
        Load {
            account: "calm",
            op: "messages",
            cost: 1,
            ops_per_sec: 980,
        },
        // An override: 15 000/s against 20 000/s.
        Load {
            account: "big",
            op: "messages",
            cost: 3,
            ops_per_sec: 5_000,
        },
        // No limit configured for this op at all.
        Load {
            account: "flood",
            op: "presence",
            cost: 1,
            ops_per_sec: 3_000,
        },
    ];
    // Each account's owner: the loop must really span masters.
    let owners: std::collections::BTreeSet<_> = ["flood", "calm", "big"]
        .iter()
        .map(|a| cluster.ring().owner(a).unwrap())
        .collect();
    assert!(owners.len() >= 2, "accounts on one master only: {owners:?}");

    let mut flood_admitted = Vec::new();
    for round in 0..40 {
        let tallies = cluster.step(&loads);
        let calm = tallies["calm"];
        assert_eq!(
            calm.admitted, calm.attempted,
            "round {round}: calm account suppressed"
        );
        let big = tallies["big"];
        assert_eq!(
            big.admitted, big.attempted,
            "round {round}: override ignored"
        );
        if round >= 3 {
            let flood = tallies["flood"];
            // Messages only: presence is unlimited and admitted in full.
            let presence = 3_000 * 2;
            flood_admitted.push((flood.admitted - presence) as f64 / 2.0);
        }
    }
    // Held at the limit: every round, and their mean, within 4 standard
    // deviations of the noise of admitting 1820 publishes of cost 11 with
    // probability 0.1 (σ ≈ 7% a round).
    let sd = sampling_sd(1820.0, 11.0, 0.9) / 2.0;
    let mean = flood_admitted.iter().sum::<f64>() / flood_admitted.len() as f64;
    let sd_mean = sd / (flood_admitted.len() as f64).sqrt();
    assert!((mean - 1000.0).abs() <= 4.0 * sd_mean, "mean {mean}/s");
    for (round, admitted) in flood_admitted.iter().enumerate() {
        assert!(
            (admitted - 1000.0).abs() <= 4.0 * sd,
            "round {round}: {admitted}/s, sd {sd}"
        );
    }
    assert!(cluster.wire_bytes > 0);
}

/// Demand falls to half the limit. The master releases as soon as the round
/// that carries the drop is whole: the last agent to report it is told 0.
/// Agents that reported earlier in that round were answered before the
/// master could know, and are released by their next reply, one rollup
/// interval later.
#[test]
fn the_limit_releases_within_two_rounds_of_the_deluge_stopping() {
    let mut cluster = WireLoop::new(CONFIG, 3, 8, 5);
    let flood = |ops_per_sec| {
        [Load {
            account: "flood",
            op: "messages",
            cost: 11,
            ops_per_sec,
        }]
    };
    for round in 0..15 {
        let t = cluster.step(&flood(910))["flood"];
        // From the second round on, every agent holds the flood's factor.
        if round >= 1 {
            assert!(t.min_factor > 0.85, "round {round}: {t:?}");
        }
    }
    let during = cluster.step(&flood(45))["flood"];
    assert_eq!(
        during.min_factor, 0.0,
        "the round's last reporter is released"
    );
    assert!(
        during.factor > 0.85,
        "earlier reporters still hold the old factor"
    );
    let next = cluster.step(&flood(45))["flood"];
    assert_eq!(next.factor, 0.0, "every agent released: {next:?}");
    let after = cluster.step(&flood(45))["flood"];
    assert_eq!(after.admitted, after.attempted);
}
