//! The simulator shows what the product does: one seeded run of the agents'
//! round, made twice, once against the simulator's masters and once against
//! real `damper-master` services over gRPC on loopback, gives the same
//! factors round by round, and the same admissions to the unit.

use damper_sim::engine::Sim;
use damper_tests::masters::GrpcMasters;
use damper_tests::{scenario, series};

/// Four agents, one master, no network delay (so both runs see each
/// request at the same simulated instant): a deluge that starts, steps up
/// and stops, a cost-11 account under its limit, and an override.
const SCENARIO: &str = r#"
name = "same round, simulated and served"
duration_s = 40
seed = 11

[cluster]
agents = 4
masters = 1
latency_ms = 0
jitter_ms = 0

[limits]
messages = 1000
"messages/big" = 20000

[[traffic]]
account = "flood"
op = "messages"
profile = [ { at_s = 0, rate = 300 }, { at_s = 6, rate = 8000 }, { at_s = 20, rate = 15000 }, { at_s = 30, rate = 400 } ]
arrivals = "poisson"

[[traffic]]
account = "calm"
op = "messages"
cost = 11
profile = [ { at_s = 0, rate = 60 } ]
arrivals = "poisson"
agents = [0, 1]

[[traffic]]
account = "big"
op = "messages"
profile = [ { at_s = 0, rate = 12000 } ]
"#;

const LIMITS: &str = "[limits]\nmessages = 1000\n\"messages/big\" = 20000\n";

#[test]
fn the_simulator_and_real_masters_over_grpc_give_the_same_factors_round_by_round() {
    let simulated = Sim::new(scenario(SCENARIO)).run(|_| {});
    let mut masters = GrpcMasters::new(LIMITS, 1);
    let served = Sim::with_masters(scenario(SCENARIO), &mut masters).run(|_| {});
    masters.stop();

    for (sim, real) in simulated.series.iter().zip(&served.series) {
        let name = &sim.traffic.account;
        assert_eq!(sim.seconds.len(), real.seconds.len());
        for (t, (s, r)) in sim.seconds.iter().zip(&real.seconds).enumerate() {
            assert_eq!(s, r, "{name}, second {t}: simulated {s:?}, served {r:?}");
        }
        assert_eq!(sim.factor_changes, real.factor_changes, "{name}");
    }
    assert_eq!(simulated.rollups, served.rollups);
    // Not a comparison of nothing: the deluge was suppressed, and let go.
    let flood = series(&served, "flood", "messages");
    let peak = flood.seconds.iter().map(|s| s.factor).fold(0.0, f64::max);
    assert!(peak > 0.9, "{peak}");
    assert_eq!(flood.seconds.last().unwrap().factor, 0.0);
    for calm in ["calm", "big"] {
        let s = series(&served, calm, "messages");
        let (attempted, admitted) = s
            .seconds
            .iter()
            .fold((0, 0), |(a, d), x| (a + x.attempted, d + x.admitted));
        assert_eq!(admitted, attempted, "{calm} was never refused");
    }
}
