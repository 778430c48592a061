//! The claim the design rests on, as a test: under a deluge, a factor
//! computed from the demand (attempted rate) holds admitted traffic steadily
//! at the limit, while Ably's first approach, a linear ramp on the admitted
//! rate, swings between letting everything through and suppressing almost
//! everything.

use damper_sim::engine::Sim;
use damper_tests::masters::WireMasters;
use damper_tests::{rounds, sampling_sd, scenario, series};

/// `rounds` rounds of a deluge at 20 × the limit of 1000/s, through two
/// masters under `config` and six agents: per round, the admitted cost per
/// second and the mean factor in force at the ends of its seconds.
fn run(config: &str, rounds_n: usize) -> Vec<(f64, f64)> {
    let toml = format!(
        "name = \"policies\"\nduration_s = {}\nseed = 3\n[cluster]\nagents = 6\nmasters = 2\n{config}\n\
         [[traffic]]\naccount = \"acme\"\nop = \"messages\"\ncost = 21\n\
         profile = [ {{ at_s = 0, rate = 952 }} ]\narrivals = \"uniform\"\n",
        rounds_n * 2
    );
    let mut masters = WireMasters::new(config, 2);
    let run = Sim::with_masters(scenario(&toml), &mut masters).run(|_| {});
    rounds(series(&run, "acme", "messages"), 0, 2)
}

#[test]
fn demand_policy_holds_a_deluge_steadily_at_the_limit() {
    for estimator in ["latest-round", "ably-mma"] {
        let config = format!(
            "[window]\nestimator = \"{estimator}\"\n[policy]\nkind = \"demand\"\n[limits]\nmessages = 1000\n"
        );
        let rounds = run(&config, 60);
        // Once a window (24 s) plus the settle time has passed, the factor
        // is steady: exactly 1 − 1000/19 992. Each round's admitted traffic
        // is decided by the factor at the end of the round before.
        for (i, (_, factor)) in rounds.iter().enumerate().skip(14) {
            assert!(
                (factor - 0.94998).abs() < 0.001,
                "{estimator} round {i}: factor {factor}"
            );
        }
        // Admitted traffic sits on the limit: every round, and their mean,
        // within 4 standard deviations of the sampling noise of admitting
        // 1904 publishes of cost 21 with probability 0.05 (σ ≈ 10% a round).
        let steady = &rounds[15..];
        let sd_per_sec = sampling_sd(1904.0, 21.0, 0.95) / 2.0;
        let mean = steady.iter().map(|r| r.0).sum::<f64>() / steady.len() as f64;
        let sd_mean = sd_per_sec / (steady.len() as f64).sqrt();
        assert!(
            (mean - 1000.0).abs() <= 4.0 * sd_mean,
            "{estimator}: mean {mean}/s"
        );
        for (i, (admitted, _)) in steady.iter().enumerate() {
            assert!(
                (admitted - 1000.0).abs() <= 4.0 * sd_per_sec,
                "{estimator} round {i}: {admitted}/s (sd {sd_per_sec})"
            );
        }
    }
}

#[test]
fn linear_ramp_on_the_admitted_rate_oscillates_under_a_deluge() {
    let config = "[window]\nestimator = \"ably-mma\"\n\
                  [policy]\nkind = \"linear-ramp\"\nramp = 3.0\n\
                  [limits]\nmessages = 1000\n";
    let rounds = run(config, 90);
    let steady = &rounds[15..];
    let factors: Vec<f64> = steady.iter().map(|r| r.1).collect();
    let admitted: Vec<f64> = steady.iter().map(|r| r.0).collect();
    let max_f = factors.iter().cloned().fold(0.0, f64::max);
    let min_f = factors.iter().cloned().fold(1.0, f64::min);
    // The factor swings between full suppression and well under the
    // ramp's fixed point (0.86 here), not a damped settling...
    assert!(
        max_f >= 0.99 && min_f <= 0.5,
        "factors {min_f}..{max_f}: {factors:?}"
    );
    // ...and admitted traffic swings from nothing to several times the limit.
    let max_a = admitted.iter().cloned().fold(0.0, f64::max);
    let min_a = admitted.iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        max_a > 5_000.0 && min_a < 100.0,
        "admitted {min_a}..{max_a}"
    );
    // It keeps swinging: several full cycles in 150 s.
    let opens = factors
        .windows(2)
        .filter(|w| w[0] > 0.5 && w[1] <= 0.5)
        .count();
    assert!(opens >= 3, "{opens} swings: {factors:?}");
}
