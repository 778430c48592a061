//! The master's configuration: the `[window]`, `[policy]` and `[limits]`
//! tables of a TOML file, validated into types that cannot hold a bad value.
//!
//! The raw tables ([`WindowSection`], [`PolicySection`], [`LimitsSection`])
//! are public so that other files (the simulator's scenarios) can embed them
//! unchanged: settings tuned in a scenario deploy as they are.
//!
//! ```
//! # use damper_core::config::MasterConfig;
//! let config = MasterConfig::from_toml(r#"
//!     [window]
//!     sub_interval_ms = 6000
//!     sub_intervals = 4
//!     [policy]
//!     kind = "demand"
//!     [limits]
//!     messages = 1000
//!     "messages/acme" = 5000
//! "#).unwrap();
//! assert_eq!(config.limits.lookup("acme", "messages").unwrap().rate.get(), 5000.0);
//!
//! let err = MasterConfig::from_toml("[window]\nsub_intervals = 0").unwrap_err();
//! assert!(err.to_string().contains("window.sub_intervals"));
//! ```

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::{Limits, LimitsError};
use crate::window::CONFIDENCE_SIGMAS;

/// A configuration that cannot be used, with the field at fault.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field has a value outside its valid range.
    #[error("invalid `{field}`{}: {reason}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Invalid {
        /// Dotted path of the field, such as `window.sub_intervals`.
        field: String,
        /// What is wrong and what is allowed.
        reason: String,
        /// The line of the file the field is on, when read from a file and
        /// found there (1-based).
        line: Option<usize>,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the
    /// wrong type. The message carries the key and the line.
    #[error("{0}")]
    Parse(String),
}

impl From<LimitsError> for ConfigError {
    fn from(e: LimitsError) -> ConfigError {
        ConfigError::invalid(&e.field, e.reason)
    }
}

impl ConfigError {
    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            field: field.to_string(),
            reason: reason.into(),
            line: None,
        }
    }

    /// Adds the line `field` is on in `text`, when it can be found.
    fn located(self, text: &str) -> ConfigError {
        match self {
            ConfigError::Invalid {
                field,
                reason,
                line: None,
            } => ConfigError::Invalid {
                line: line_of(text, &field),
                field,
                reason,
            },
            other => other,
        }
    }
}

/// The 1-based line of `text` that sets `field` (a dotted path such as
/// `window.sub_intervals` or `limits."messages/acme"`), under its table
/// header or as a dotted key at the top level. Plain TOML layouts only: a
/// field set in an inline table is not found, and the error says no line.
fn line_of(text: &str, field: &str) -> Option<usize> {
    let unquote = |s: &str| s.trim().trim_matches('"').trim_matches('\'').to_string();
    let (table, key) = field.split_once('.')?;
    let (table, key) = (unquote(table), unquote(key));
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            current = unquote(header.trim_end_matches(']'));
            continue;
        }
        let Some((lhs, _)) = line.split_once('=') else {
            continue;
        };
        let lhs = unquote(lhs);
        let here = if current.is_empty() {
            lhs.split_once('.')
                .is_some_and(|(t, k)| unquote(t) == table && unquote(k) == key)
        } else {
            current == table && lhs == key
        };
        if here {
            return Some(i + 1);
        }
    }
    None
}

/// How the master estimates an (account, op)'s rates from its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum EstimatorKind {
    /// The rates of the latest complete rollup round (every agent reports
    /// once per rollup interval), or of the round being reported when that
    /// is already higher. Rises at once on a spike and releases one rollup
    /// interval after demand falls. The default.
    #[default]
    LatestRound,
    /// Ably's modified moving average over the sub-intervals: the completed
    /// ones, plus the one in progress only when its rate is at or above
    /// their mean. Smooth, but holds a flood's estimate for up to a window
    /// after it stops.
    AblyMma,
}

impl EstimatorKind {
    /// Its name in a config file.
    pub fn name(self) -> &'static str {
        match self {
            EstimatorKind::LatestRound => "latest-round",
            EstimatorKind::AblyMma => "ably-mma",
        }
    }
}

/// The `[window]` table as written in a file: how time is cut up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowSection {
    /// Length of one sub-interval, in milliseconds. Default 6000.
    pub sub_interval_ms: u64,
    /// Number of sub-intervals in the moving window (the in-progress one
    /// included). Default 4, so the window spans 24 s.
    pub sub_intervals: usize,
    /// How often agents send rollups, in milliseconds. The master groups
    /// reports into rounds of this length and scales factor validity by it.
    /// Must match the agents'. Default 2000.
    pub rollup_interval_ms: u64,
    /// How late, past the end of its interval, a rollup may still arrive
    /// (network delay and the agents' send spread), in milliseconds. A
    /// sub-interval counts as completed only this long after the rollup
    /// round that ends it. Default 500.
    pub grace_ms: u64,
    /// Which estimator turns the window into rates.
    pub estimator: EstimatorKind,
}

impl Default for WindowSection {
    fn default() -> Self {
        WindowSection {
            sub_interval_ms: 6_000,
            sub_intervals: 4,
            rollup_interval_ms: crate::DEFAULT_ROLLUP_INTERVAL.as_millis() as u64,
            grace_ms: 500,
            estimator: EstimatorKind::LatestRound,
        }
    }
}

/// The `[policy]` table as written in a file: how rates become a factor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySection {
    /// `demand` (the default) or `linear-ramp`.
    pub kind: String,
    /// For `linear-ramp` only: the multiple of the limit at which the
    /// factor reaches 1. Default 3 (Ably's first prototype).
    pub ramp: Option<f64>,
    /// How long agents may apply a factor without a fresher one, in
    /// milliseconds. Default: three rollup intervals.
    pub factor_validity_ms: Option<u64>,
    /// After an early report (a surge), how soon the agent asks again, in
    /// milliseconds: by then the other agents' early reports of the same
    /// sub-window are in, so the first to report learn the whole estimate.
    /// Default 100; at most one rollup interval.
    pub surge_recheck_ms: Option<u64>,
    /// The least time between two early reports from one agent, on
    /// average, in milliseconds: a faster agent is refused
    /// (RESOURCE_EXHAUSTED) and counted, so a broken or hostile agent
    /// cannot make the master re-estimate without end. One report may come
    /// up to a gap early: agents scan every half sub-window (100 ms by
    /// default), and the network's jitter brings consecutive reports a few
    /// milliseconds closer. Default 100; at most 60000.
    pub surge_min_gap_ms: Option<u64>,
    /// For `demand`: how many standard deviations of its own round-to-round
    /// scatter an account's demand must be over its limit before it is
    /// suppressed, so chance alone never refuses an account that keeps to
    /// its limit. Default 5; 0 suppresses whenever a round's demand is
    /// over the limit. At most 20.
    pub confidence_sigmas: Option<f64>,
    /// The share of its limit at which an account's demand counts as near
    /// it: crossing it upwards, or back down, is an event (a log line and
    /// an entry on `/v1/events`), so operators hear of an account close to
    /// its limit before anything is refused. Default 0.8; in (0, 1).
    pub near_limit_share: Option<f64>,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            kind: "demand".into(),
            ramp: None,
            factor_validity_ms: None,
            surge_recheck_ms: None,
            surge_min_gap_ms: None,
            confidence_sigmas: None,
            near_limit_share: None,
        }
    }
}

/// The `[limits]` table as written in a file: key to cost per second.
pub type LimitsSection = BTreeMap<String, f64>;

/// How many sub-intervals the settle time (rollup interval plus grace) may
/// span. Each (account, op) keeps that many besides its window.
pub const MAX_UNSETTLED_SUB_INTERVALS: u128 = 64;

/// How the window is cut up, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowConfig {
    /// Length of one sub-interval (> 0).
    pub sub_interval: Duration,
    /// Number of sub-intervals in the moving window (≥ 1).
    pub sub_intervals: NonZeroUsize,
    /// The agents' rollup interval (> 0).
    pub rollup_interval: Duration,
    /// Allowance for late rollups.
    pub grace: Duration,
    /// Which estimator turns the window into rates.
    pub estimator: EstimatorKind,
}

impl WindowConfig {
    /// How long after its end a sub-interval (or round) is complete:
    /// one rollup interval for every agent to report it, plus the grace.
    pub fn settle(&self) -> Duration {
        self.rollup_interval + self.grace
    }

    /// The first setting under which `other` cuts windows differently from
    /// this config, so counts kept under one do not fit the other; `None`
    /// when they fit. The estimator counts: windows keep only what theirs
    /// reads (the sub-intervals only for `ably-mma`), to stay small.
    pub fn shape_change(&self, other: &WindowConfig) -> Option<ShapeChange> {
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        [
            (
                "sub_interval_ms",
                ms(self.sub_interval),
                ms(other.sub_interval),
            ),
            (
                "sub_intervals",
                self.sub_intervals.to_string(),
                other.sub_intervals.to_string(),
            ),
            (
                "rollup_interval_ms",
                ms(self.rollup_interval),
                ms(other.rollup_interval),
            ),
            ("grace_ms", ms(self.grace), ms(other.grace)),
            (
                "estimator",
                self.estimator.name().to_owned(),
                other.estimator.name().to_owned(),
            ),
        ]
        .into_iter()
        .find(|(_, from, to)| from != to)
        .map(|(field, from, to)| ShapeChange { field, from, to })
    }
}

/// A `[window]` setting that differs between two configs and changes how
/// windows are cut ([`WindowConfig::shape_change`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeChange {
    /// The field in `[window]`, such as `sub_intervals`.
    pub field: &'static str,
    /// Its value in the first config.
    pub from: String,
    /// Its value in the second.
    pub to: String,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowSection::default()
            .try_into()
            .expect("the default window is valid")
    }
}

impl TryFrom<WindowSection> for WindowConfig {
    type Error = ConfigError;

    fn try_from(w: WindowSection) -> Result<Self, ConfigError> {
        const MAX_MS: u64 = 24 * 3600 * 1000;
        let ms = |field: &str, v: u64, min: u64| {
            if v < min || v > MAX_MS {
                Err(ConfigError::invalid(
                    field,
                    format!("must be between {min} and {MAX_MS} milliseconds, got {v}"),
                ))
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        let sub_interval = ms("window.sub_interval_ms", w.sub_interval_ms, 1)?;
        let rollup_interval = ms("window.rollup_interval_ms", w.rollup_interval_ms, 1)?;
        let grace = ms("window.grace_ms", w.grace_ms, 0)?;
        let sub_intervals = NonZeroUsize::new(w.sub_intervals)
            .filter(|n| n.get() <= 1024)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "window.sub_intervals",
                    format!("must be between 1 and 1024, got {}", w.sub_intervals),
                )
            })?;
        let config = WindowConfig {
            sub_interval,
            sub_intervals,
            rollup_interval,
            grace,
            estimator: w.estimator,
        };
        // Every (account, op) keeps the sub-intervals a settle time spans:
        // bound them, or a tiny sub-interval under a long settle time would
        // cost gigabytes per key.
        let unsettled = config.settle().as_nanos().div_ceil(sub_interval.as_nanos());
        if unsettled > MAX_UNSETTLED_SUB_INTERVALS {
            return Err(ConfigError::invalid(
                "window.sub_interval_ms",
                format!(
                    "rollup_interval_ms + grace_ms ({} ms) spans {unsettled} sub-intervals of {} ms; \
                     at most {MAX_UNSETTLED_SUB_INTERVALS} are allowed: use longer sub-intervals",
                    config.settle().as_millis(),
                    w.sub_interval_ms
                ),
            ));
        }
        Ok(config)
    }
}

/// How rates become a suppression factor.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[non_exhaustive]
pub enum PolicyKind {
    /// `factor = max(0, 1 − limit / demand)`, from the demand (attempted)
    /// rate: admitted demand lands at the limit, and an account at or under
    /// its limit gets exactly 0. The production default.
    #[default]
    Demand,
    /// Ably's first prototype: the factor grows linearly from 0 at the limit
    /// to 1 at `ramp × limit`, computed from the *admitted* rate. Kept so the
    /// simulator can show why it oscillates under a deluge.
    LinearRamp {
        /// Multiple of the limit at which the factor reaches 1 (> 1).
        ramp: f64,
    },
}

/// The policy, validated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyConfig {
    /// How rates become a factor.
    pub kind: PolicyKind,
    /// How long agents may apply a factor without a fresher one.
    pub factor_validity: Duration,
    /// How soon an agent asks again after an early report.
    pub surge_recheck: Duration,
    /// The least time between two early reports from one agent, on
    /// average (see [`SurgeBudget`](crate::master::SurgeBudget)).
    pub surge_min_gap: Duration,
    /// How far over the limit, in standard deviations of its own scatter,
    /// a round's demand must be to suppress (0: any amount).
    pub confidence_sigmas: f64,
    /// The share of its limit at which an account's demand counts as near
    /// it (an event each way).
    pub near_limit_share: f64,
}

impl PolicyConfig {
    /// Validates the `[policy]` table; the validity default depends on the
    /// window's rollup interval.
    pub fn from_section(p: &PolicySection, window: &WindowConfig) -> Result<Self, ConfigError> {
        let kind = match p.kind.as_str() {
            "demand" => {
                if p.ramp.is_some() {
                    return Err(ConfigError::invalid(
                        "policy.ramp",
                        "applies only to kind = \"linear-ramp\"",
                    ));
                }
                PolicyKind::Demand
            }
            "linear-ramp" => {
                let ramp = p.ramp.unwrap_or(3.0);
                if !(ramp.is_finite() && ramp > 1.0) {
                    return Err(ConfigError::invalid(
                        "policy.ramp",
                        format!("must be a finite number greater than 1, got {ramp}"),
                    ));
                }
                PolicyKind::LinearRamp { ramp }
            }
            other => {
                return Err(ConfigError::invalid(
                    "policy.kind",
                    format!("unknown policy {other:?}; expected \"demand\" or \"linear-ramp\""),
                ));
            }
        };
        let factor_validity = match p.factor_validity_ms {
            None => window.rollup_interval * 3,
            Some(ms) if (1..=3_600_000).contains(&ms) => Duration::from_millis(ms),
            Some(ms) => {
                return Err(ConfigError::invalid(
                    "policy.factor_validity_ms",
                    format!("must be between 1 and 3600000 milliseconds, got {ms}"),
                ));
            }
        };
        let interval_ms = window.rollup_interval.as_millis() as u64;
        let surge_recheck = match p.surge_recheck_ms.unwrap_or(100.min(interval_ms)) {
            ms if (1..=interval_ms).contains(&ms) => Duration::from_millis(ms),
            ms => {
                return Err(ConfigError::invalid(
                    "policy.surge_recheck_ms",
                    format!(
                        "must be between 1 and the rollup interval ({interval_ms}) milliseconds, got {ms}"
                    ),
                ));
            }
        };
        let surge_min_gap = match p.surge_min_gap_ms.unwrap_or(100) {
            ms if ms <= 60_000 => Duration::from_millis(ms),
            ms => {
                return Err(ConfigError::invalid(
                    "policy.surge_min_gap_ms",
                    format!("must be at most 60000 milliseconds, got {ms}"),
                ));
            }
        };
        let confidence_sigmas = match p.confidence_sigmas.unwrap_or(CONFIDENCE_SIGMAS) {
            z if (0.0..=20.0).contains(&z) => z,
            z => {
                return Err(ConfigError::invalid(
                    "policy.confidence_sigmas",
                    format!("must be a number between 0 and 20, got {z}"),
                ));
            }
        };
        let near_limit_share = match p.near_limit_share.unwrap_or(0.8) {
            share if share > 0.0 && share < 1.0 => share,
            share => {
                return Err(ConfigError::invalid(
                    "policy.near_limit_share",
                    format!("must be a number above 0 and below 1, got {share}"),
                ));
            }
        };
        Ok(PolicyConfig {
            kind,
            factor_validity,
            surge_recheck,
            surge_min_gap,
            confidence_sigmas,
            near_limit_share,
        })
    }
}

/// A master's configuration file: exactly the `[window]`, `[policy]`,
/// `[limits]`, `[exempt]` and `[shadow]` tables. Unknown keys are errors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFile {
    /// The `[window]` table.
    pub window: WindowSection,
    /// The `[policy]` table.
    pub policy: PolicySection,
    /// The `[limits]` table.
    pub limits: LimitsSection,
    /// The `[exempt]` table.
    pub exempt: crate::exempt::ExemptSection,
    /// The `[shadow]` table.
    pub shadow: crate::shadow::ShadowSection,
}

/// Everything the master state machine needs to know, validated.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// How time is cut up and which estimator runs.
    pub window: WindowConfig,
    /// How rates become a factor.
    pub policy: PolicyConfig,
    /// The limits, those in shadow marked.
    pub limits: Limits,
    /// The accounts never limited.
    pub exempt: crate::exempt::Exemptions,
}

impl MasterConfig {
    /// The accounts of `op` whose limit is not its default, in no
    /// particular order: each `[limits]` key `op/account`, and each
    /// `[exempt]` entry that covers `op` (no limit at all). A limit under an
    /// exempt account is refused at load, so the two never disagree.
    pub fn overrides<'a>(
        &'a self,
        op: &'a str,
    ) -> impl Iterator<Item = crate::wire::Override> + 'a {
        let limits =
            self.limits
                .overrides(op)
                .map(|(account, rate, shadow)| crate::wire::Override {
                    account: account.to_owned(),
                    limit: rate.get(),
                    shadow,
                });
        let exempt = self
            .exempt
            .prefixes(op)
            .map(|account| crate::wire::Override {
                account: account.to_owned(),
                limit: crate::limits::Rate::UNLIMITED.get(),
                shadow: false,
            });
        limits.chain(exempt)
    }

    /// Parses and validates a TOML config file.
    pub fn from_toml(text: &str) -> Result<MasterConfig, ConfigError> {
        let file: ConfigFile =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        MasterConfig::from_sections(&file.window, &file.policy, &file.limits)
            .and_then(|c| c.with_exemptions(&file.exempt))
            .and_then(|c| c.with_shadow(&file.shadow))
            .map_err(|e| e.located(text))
    }

    /// Validates the three tables (as embedded in another file).
    pub fn from_sections(
        window: &WindowSection,
        policy: &PolicySection,
        limits: &LimitsSection,
    ) -> Result<MasterConfig, ConfigError> {
        let window = WindowConfig::try_from(window.clone())?;
        let policy = PolicyConfig::from_section(policy, &window)?;
        let limits = Limits::new(limits.iter().map(|(k, v)| (k.as_str(), *v)))?;
        Ok(MasterConfig {
            window,
            policy,
            limits,
            exempt: crate::exempt::Exemptions::default(),
        })
    }

    /// The same config with the `[exempt]` table's exemptions, validated
    /// against its limits.
    pub fn with_exemptions(
        mut self,
        exempt: &crate::exempt::ExemptSection,
    ) -> Result<MasterConfig, ConfigError> {
        self.exempt = crate::exempt::Exemptions::new(exempt, &self.limits)?;
        Ok(self)
    }

    /// The same config with the limits the `[shadow]` table names in
    /// shadow.
    pub fn with_shadow(
        mut self,
        shadow: &crate::shadow::ShadowSection,
    ) -> Result<MasterConfig, ConfigError> {
        shadow.apply(&mut self.limits)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        MasterConfig::from_toml(text).unwrap_err().to_string()
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let c = MasterConfig::from_toml("").unwrap();
        assert_eq!(c.window.sub_interval, Duration::from_secs(6));
        assert_eq!(c.window.sub_intervals.get(), 4);
        assert_eq!(c.window.rollup_interval, Duration::from_secs(2));
        assert_eq!(c.window.estimator, EstimatorKind::LatestRound);
        assert_eq!(c.policy.kind, PolicyKind::Demand);
        assert_eq!(c.policy.factor_validity, Duration::from_secs(6));
        assert!(c.limits.is_empty());
    }

    #[test]
    fn every_setting_is_read() {
        let c = MasterConfig::from_toml(
            r#"
            [window]
            sub_interval_ms = 5000
            sub_intervals = 6
            rollup_interval_ms = 1000
            grace_ms = 100
            estimator = "ably-mma"
            [policy]
            kind = "linear-ramp"
            ramp = 2.0
            factor_validity_ms = 4000
            [limits]
            messages = 1000
            "messages/acme" = 2.5
            "#,
        )
        .unwrap();
        assert_eq!(c.window.sub_interval, Duration::from_secs(5));
        assert_eq!(c.window.sub_intervals.get(), 6);
        assert_eq!(c.window.rollup_interval, Duration::from_secs(1));
        assert_eq!(c.window.grace, Duration::from_millis(100));
        assert_eq!(c.window.estimator, EstimatorKind::AblyMma);
        assert_eq!(c.policy.kind, PolicyKind::LinearRamp { ramp: 2.0 });
        assert_eq!(c.policy.factor_validity, Duration::from_secs(4));
        assert_eq!(c.limits.lookup("acme", "messages").unwrap().rate.get(), 2.5);
    }

    #[test]
    fn exemptions_are_read_and_checked_against_the_limits() {
        let c = MasterConfig::from_toml(
            "[limits]\nmessages = 10\n[exempt]\naccounts = [\"vip\"]\nmessages = [\"org/partner\"]\n",
        )
        .unwrap();
        assert_eq!(c.exempt.covers("vip/team", "presence"), Some("vip"));
        assert_eq!(
            c.exempt.covers("org/partner", "messages"),
            Some("org/partner")
        );
        assert_eq!(c.exempt.covers("org", "messages"), None);
        let e = err("[limits]\n\"messages/vip\" = 10\n[exempt]\naccounts = [\"vip\"]\n");
        assert!(
            e.contains("limits.\"messages/vip\"") && e.contains("exempt"),
            "{e}"
        );
        let e = err("[exempt]\naccounts = [\"a//b\"]\n");
        assert!(e.contains("exempt.accounts[0]"), "{e}");
        // Not a list: the parser's error, with the line.
        let e = err("[exempt]\naccounts = \"vip\"\n");
        assert!(e.contains("line 2") && e.contains("sequence"), "{e}");
    }

    #[test]
    fn invalid_values_name_their_field() {
        for (text, field) in [
            ("[window]\nsub_intervals = 0", "window.sub_intervals"),
            ("[window]\nsub_interval_ms = 0", "window.sub_interval_ms"),
            (
                "[window]\nrollup_interval_ms = 0",
                "window.rollup_interval_ms",
            ),
            // 2.5 s of settle time over 1 ms sub-intervals: 2 500 per key.
            ("[window]\nsub_interval_ms = 1", "window.sub_interval_ms"),
            ("[policy]\nkind = \"token-bucket\"", "policy.kind"),
            (
                "[policy]\nkind = \"linear-ramp\"\nramp = 1.0",
                "policy.ramp",
            ),
            ("[policy]\nramp = 2.0", "policy.ramp"),
            (
                "[policy]\nfactor_validity_ms = 0",
                "policy.factor_validity_ms",
            ),
            (
                "[policy]\nconfidence_sigmas = -1",
                "policy.confidence_sigmas",
            ),
            (
                "[policy]\nconfidence_sigmas = nan",
                "policy.confidence_sigmas",
            ),
            (
                "[policy]\nnear_limit_share = 1.0",
                "policy.near_limit_share",
            ),
            ("[policy]\nnear_limit_share = 0", "policy.near_limit_share"),
            ("[limits]\nmessages = 0", "limits.\"messages\""),
            ("[limits]\nmessages = -3", "limits.\"messages\""),
        ] {
            let e = err(text);
            assert!(e.contains(field), "{text:?} gave {e:?}");
        }
    }

    #[test]
    fn invalid_values_read_from_a_file_name_their_line() {
        for (text, want) in [
            (
                "# limits\n[limits]\nmessages = 100\n\"messages/acme\" = 0\n",
                4,
            ),
            ("[window]\n\nsub_intervals = 0\n", 3),
            ("window.sub_intervals = 0\n", 1),
            ("[policy]\nkind = \"linear-ramp\"\nramp = 0.5\n", 3),
        ] {
            let e = err(text);
            assert!(e.contains(&format!("(line {want})")), "{text:?} gave {e:?}");
        }
        // Built from sections (no file), there is no line to name.
        let window = WindowSection {
            sub_intervals: 0,
            ..WindowSection::default()
        };
        let e = MasterConfig::from_sections(
            &window,
            &PolicySection::default(),
            &LimitsSection::default(),
        )
        .unwrap_err();
        assert!(
            matches!(e, ConfigError::Invalid { line: None, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors_naming_the_key() {
        let e = err("[window]\nsub_interval = 6000");
        assert!(e.contains("sub_interval"), "{e}");
        let e = err("[windw]\nsub_intervals = 4");
        assert!(e.contains("windw"), "{e}");
        let e = err("[window]\nestimator = \"ewma\"");
        assert!(e.contains("ewma") || e.contains("estimator"), "{e}");
        let e = err("[limits]\nmessages = \"lots\"");
        assert!(e.contains("messages"), "{e}");
        // The line is reported too.
        let e = err("\n\n[window]\nsub_intervals = \"four\"");
        assert!(
            e.contains("line 4") || e.contains(":4:") || e.contains("4 |"),
            "{e}"
        );
    }
}
