//! Arbitrary text as a master config: parsed and validated. Errors are
//! fine; panics are not, and a config that parses must build a master.
#![no_main]

use damper_core::config::MasterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = MasterConfig::from_toml(text) {
        let _ = damper_core::master::MasterState::new(config);
    }
});
