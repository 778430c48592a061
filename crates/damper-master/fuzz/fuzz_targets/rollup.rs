//! Arbitrary bytes as a rollup off the wire: decoded, validated and
//! ingested by a master at a fixed time. Any outcome but a panic is fine;
//! a second, well-formed rollup must then still be served.
#![no_main]

use std::sync::{Arc, OnceLock};

use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use libfuzzer_sys::fuzz_target;

const T0_MS: u64 = 1_800_000_000_000;

fn master() -> &'static Master {
    static MASTER: OnceLock<Master> = OnceLock::new();
    MASTER.get_or_init(|| {
        let config = MasterConfig::from_toml("[limits]\nmessages = 1000\n\"messages/a\" = 5").unwrap();
        let mut options = MasterOptions::default();
        options.shards = 2;
        options.max_entries = 1_000;
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)));
        Master::with_clock(config, options, clock)
    })
}

fuzz_target!(|data: &[u8]| {
    let m = master();
    if let Ok(reply) = m.rollup_bytes(data) {
        for op in &reply.ops {
            for f in &op.accounts {
                assert!((0.0..=1.0).contains(&f.factor), "factor {} out of range", f.factor);
            }
        }
    }
    if m.len() > 100_000 {
        m.evict_idle();
    }
});
