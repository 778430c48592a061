//! The master config end-to-end tests run at: production's shape on a
//! quarter of its time scale, so a test sees several rounds in seconds.

use damper_core::config::MasterConfig;

/// The `[window]` table: 500-ms rounds, three of them a sub-interval, and
/// a 200-ms grace for reports in flight.
pub const QUICK_WINDOW: &str =
    "[window]\nrollup_interval_ms = 500\nsub_interval_ms = 1500\ngrace_ms = 200\n";

/// A master config of [`QUICK_WINDOW`] and `tables` (`[limits]`, and any
/// other table the test needs). Panics on a config the test got wrong.
pub fn quick_config(tables: &str) -> MasterConfig {
    MasterConfig::from_toml(&format!("{QUICK_WINDOW}{tables}")).expect("a valid test config")
}
