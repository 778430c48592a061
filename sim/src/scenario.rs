//! Scenario files: the cluster, the master's `[window]`, `[policy]` and
//! `[limits]` tables (exactly as `damper-master --config` reads them), the
//! traffic, and the events. See `docs/simulation.md`.

use std::time::Duration;

use damper_core::agent::{SurgeRule, SurgeRuleError};
use damper_core::config::{
    ConfigError, EstimatorKind, LimitsSection, MasterConfig, PolicySection, WindowSection,
};
use serde::Deserialize;

/// Why a scenario cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// Not valid TOML, an unknown key, or a value of the wrong type (the
    /// message has the key and the line).
    #[error("{0}")]
    Parse(String),
    /// A value out of range, naming the key.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// Dotted path of the key.
        field: String,
        /// What is allowed.
        reason: String,
    },
    /// The master tables are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A scenario file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Shown in plot titles and summaries.
    pub name: String,
    /// Simulated seconds.
    pub duration_s: u64,
    /// Seed of every random choice: same seed, same output.
    #[serde(default)]
    pub seed: u64,
    /// Traffic is generated in steps of this many milliseconds (default 100).
    #[serde(default = "default_step_ms")]
    pub step_ms: u64,
    /// The cluster.
    #[serde(default)]
    pub cluster: ClusterSection,
    /// The master's `[window]`.
    #[serde(default)]
    pub window: WindowSection,
    /// The master's `[policy]`.
    #[serde(default)]
    pub policy: PolicySection,
    /// The master's `[limits]`.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Traffic items.
    #[serde(default)]
    pub traffic: Vec<TrafficSection>,
    /// Events at given times.
    #[serde(default)]
    pub events: Vec<EventSection>,
}

fn default_step_ms() -> u64 {
    100
}

/// `[cluster]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// Edge nodes, each with an agent.
    pub agents: u32,
    /// Masters on the ring.
    pub masters: u32,
    /// How often agents send rollups; must equal `window.rollup_interval_ms`.
    pub rollup_interval_ms: u64,
    /// One-way network delay, mean.
    pub latency_ms: f64,
    /// The delay varies uniformly by up to this much either way.
    pub jitter_ms: f64,
    /// Probability that a rollup, or its reply, is lost.
    pub loss: f64,
    /// Fast onset on the agents: early reports of surges and the local
    /// guard's op defaults (default true). `false` runs rollups alone, as
    /// before it existed.
    pub fast_onset: bool,
    /// Whether masters push a verdict an early report flipped, or a
    /// rollup released, to every agent (default true; only with fast
    /// onset, whose agents watch their masters for pushes). `false` leaves the other agents to their rounds and
    /// rechecks, as before pushes existed.
    pub push: bool,
    /// Low-noise admission on the agents (default true): a per-pair
    /// credit keeps the admitted cost within a few operations of
    /// `1 − factor` of the attempted. `false` decides each operation by an
    /// independent draw, as before it existed.
    pub low_noise: bool,
    /// Pacing on the agents (default true; only with low-noise admission
    /// and fast onset): a pair suppressed by a fifth or more admits
    /// `1 − factor` of the rate its agent told the master rather than of
    /// what it attempts now. `false` keeps the share of what is attempted,
    /// as before pacing existed.
    pub pace: bool,
    /// Frozen admission for sparse paced pairs (default true; only with
    /// pacing): a paced pair that expects at most three operations a
    /// sub-window decides them all by one probability set from its credit
    /// at the sub-window's start. `false` moves the probability after each
    /// operation, as before.
    pub freeze_sparse: bool,
    /// Young peeks on the agents (default true; only with fast onset, and
    /// only with a `step_ms` that divides 20, so a new pair's first 20 ms
    /// are measured over whole steps): a pair a check creates is
    /// measured on its own and reported as soon as it proves a surge,
    /// between the grid's scans. `false` leaves new pairs to the grid, as
    /// before young peeks.
    pub young_peeks: bool,
    /// Sparse hints on the agents (default true; only with fast onset):
    /// a pair of sparse costly operations that saw more of them than
    /// chance allows is hinted to its master, which polls every agent for
    /// the pair when several hint at once. `false` leaves such floods to
    /// whole rounds, as before hints.
    pub sparse_hints: bool,
    /// Whether agents give accounts by number to masters that hold their
    /// dictionaries (default true), so each name goes to a master once.
    /// `false` names every account in every rollup, as before numbers
    /// existed.
    pub account_numbers: bool,
    /// The agents' surge sub-window, in milliseconds (default 200); must
    /// divide the rollup interval.
    pub surge_window_ms: u64,
    /// The jump, either way, that makes a surge (default 4).
    pub surge_jump: f64,
    /// The least change that makes a surge, as a share of the limit
    /// (default 0.125).
    pub surge_floor: f64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            agents: 20,
            masters: 3,
            rollup_interval_ms: 2000,
            latency_ms: 5.0,
            jitter_ms: 2.0,
            loss: 0.0,
            fast_onset: true,
            push: true,
            low_noise: true,
            pace: true,
            freeze_sparse: true,
            young_peeks: true,
            sparse_hints: true,
            account_numbers: true,
            surge_window_ms: 200,
            surge_jump: 4.0,
            surge_floor: 0.125,
        }
    }
}

impl ClusterSection {
    /// The agents' surge rule, when fast onset is on.
    pub fn surge_rule(&self) -> Result<Option<SurgeRule>, SurgeRuleError> {
        if !self.fast_onset {
            return Ok(None);
        }
        SurgeRule::new(
            Duration::from_millis(self.surge_window_ms),
            self.surge_jump,
            self.surge_floor,
            Duration::from_millis(self.rollup_interval_ms),
        )
        .map(Some)
    }
}

/// Which agents carry a traffic item.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum AgentsSection {
    /// `"all"`.
    Word(String),
    /// This many agents.
    Count(u32),
    /// These agent indexes.
    List(Vec<u32>),
}

/// How operations arrive within a step.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// Poisson: the count in each step is random with the profile's mean.
    #[default]
    Poisson,
    /// Uniform: exactly the profile's rate, spread evenly.
    Uniform,
}

/// One point of a rate profile: from `at_s` on, `rate` operations per second.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfilePoint {
    /// From this second on.
    pub at_s: f64,
    /// Operations per second attempted, over the item's agents together.
    pub rate: f64,
}

/// `[[traffic]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSection {
    /// Account id. With `count`, `{i}` is replaced by 0, 1, … .
    pub account: String,
    /// Operation.
    pub op: String,
    /// `"all"` (default), a number of agents, or a list of agent indexes.
    #[serde(default = "all_agents")]
    pub agents: AgentsSection,
    /// Cost of each operation (1 + subscribers for a publish).
    #[serde(default = "one")]
    pub cost: u64,
    /// Piecewise-constant rate over time.
    pub profile: Vec<ProfilePoint>,
    /// Poisson (default) or uniform arrivals.
    #[serde(default)]
    pub arrivals: Arrivals,
    /// Repeat this item for `count` accounts (default 1).
    #[serde(default = "one")]
    pub count: u64,
}

fn all_agents() -> AgentsSection {
    AgentsSection::Word("all".into())
}

fn one() -> u64 {
    1
}

/// `[[events]]`: exactly one action at `at_s`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSection {
    /// When, in simulated seconds.
    pub at_s: f64,
    /// Stop this master: its state is lost; rollups to it time out.
    pub kill_master: Option<u32>,
    /// Start this master again, with empty state.
    pub restart_master: Option<u32>,
    /// Cut these agents off from every master.
    pub partition_agents: Option<Vec<u32>>,
    /// End every partition.
    pub heal: Option<bool>,
}

/// One traffic item, validated and expanded.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    /// Account id.
    pub account: String,
    /// Operation.
    pub op: String,
    /// Agent indexes carrying it.
    pub agents: Vec<usize>,
    /// Cost per operation.
    pub cost: u64,
    /// Piecewise-constant profile, sorted by time.
    pub profile: Vec<ProfilePoint>,
    /// Arrival process.
    pub arrivals: Arrivals,
}

impl Traffic {
    /// Operations per second at `t` seconds.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.profile
            .iter()
            .take_while(|p| p.at_s <= t)
            .last()
            .map_or(0.0, |p| p.rate)
    }

    /// Mean operations per second over `[from, to)`: the rate at `from`
    /// when the profile does not change inside it, else each piece
    /// weighted by its length. A second in which a flood starts or stops
    /// holds part of it.
    pub fn mean_rate(&self, from: f64, to: f64) -> f64 {
        let inside = self.profile.iter().filter(|p| p.at_s > from && p.at_s < to);
        let (mut at, mut rate, mut sum) = (from, self.rate_at(from), 0.0);
        for p in inside {
            sum += rate * (p.at_s - at);
            (at, rate) = (p.at_s, p.rate);
        }
        if at == from {
            // No change inside (nor any span): the rate at `from`, exactly.
            return rate;
        }
        (sum + rate * (to - at)) / (to - from)
    }
}

/// What happens at an event.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Stop a master (losing its state).
    KillMaster(usize),
    /// Start a master again.
    RestartMaster(usize),
    /// Cut agents off from the masters.
    Partition(Vec<usize>),
    /// End all partitions.
    Heal,
}

/// A scenario, validated.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// Simulated seconds.
    pub duration_s: u64,
    /// Seed.
    pub seed: u64,
    /// Traffic step.
    pub step: Duration,
    /// The cluster.
    pub cluster: ClusterSection,
    /// The masters' configuration.
    pub master: MasterConfig,
    /// The `[policy]` table, kept to re-validate overrides.
    pub policy: PolicySection,
    /// The `[window]` table, kept to re-validate overrides.
    pub window: WindowSection,
    /// The `[limits]` table.
    pub limits: LimitsSection,
    /// Traffic items, expanded.
    pub traffic: Vec<Traffic>,
    /// Events, sorted by time.
    pub events: Vec<(f64, Action)>,
}

impl Scenario {
    /// Parses and validates a scenario file.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        Scenario::from_file(file)
    }

    /// Validates a parsed file.
    pub fn from_file(file: ScenarioFile) -> Result<Scenario, ScenarioError> {
        check_run(&file)?;
        check_cluster(&file.cluster, &file.window)?;
        let master = MasterConfig::from_sections(&file.window, &file.policy, &file.limits)?;
        let mut traffic = Vec::new();
        for (i, t) in file.traffic.iter().enumerate() {
            traffic.extend(traffic_items(i, t, &file.cluster)?);
        }
        let mut events = file
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| Ok((e.at_s, event_action(i, e, &file.cluster)?)))
            .collect::<Result<Vec<_>, ScenarioError>>()?;
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Scenario {
            name: file.name,
            duration_s: file.duration_s,
            seed: file.seed,
            step: Duration::from_millis(file.step_ms),
            cluster: file.cluster,
            master,
            policy: file.policy,
            window: file.window,
            limits: file.limits,
            traffic,
            events,
        })
    }

    /// The scenario under another policy (`demand` or `linear-ramp`).
    pub fn with_policy(&self, kind: &str) -> Result<Scenario, ScenarioError> {
        let mut policy = self.policy.clone();
        if policy.kind != kind {
            policy.kind = kind.to_string();
            if kind != "linear-ramp" {
                policy.ramp = None;
            }
        }
        let master = MasterConfig::from_sections(&self.window, &policy, &self.limits)?;
        Ok(Scenario {
            master,
            policy,
            ..self.clone()
        })
    }

    /// The scenario with the masters' `policy.confidence_sigmas` set.
    pub fn with_confidence_sigmas(&self, sigmas: f64) -> Result<Scenario, ScenarioError> {
        let mut policy = self.policy.clone();
        policy.confidence_sigmas = Some(sigmas);
        let master = MasterConfig::from_sections(&self.window, &policy, &self.limits)?;
        Ok(Scenario {
            master,
            policy,
            ..self.clone()
        })
    }

    /// The scenario under another estimator.
    pub fn with_estimator(&self, estimator: EstimatorKind) -> Scenario {
        let mut s = self.clone();
        s.window.estimator = estimator;
        s.master.window.estimator = estimator;
        s
    }

    /// The scenario with fast onset on or off on every agent.
    pub fn with_fast_onset(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.fast_onset = on;
        s
    }

    /// The scenario with agents that give accounts by number, or not.
    pub fn with_account_numbers(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.account_numbers = on;
        s
    }

    /// The scenario with masters that push, or not.
    pub fn with_push(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.push = on;
        s
    }

    /// The scenario with low-noise admission on or off on every agent.
    pub fn with_low_noise(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.low_noise = on;
        s
    }

    /// The scenario with pacing on or off on every agent.
    pub fn with_pace(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.pace = on;
        s
    }

    /// The scenario with frozen admission for sparse paced pairs on or
    /// off on every agent.
    pub fn with_freeze_sparse(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.freeze_sparse = on;
        s
    }

    /// The scenario with young peeks on or off on every agent.
    pub fn with_young_peeks(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.young_peeks = on;
        s
    }

    /// The scenario with sparse hints on or off on every agent.
    pub fn with_sparse_hints(&self, on: bool) -> Scenario {
        let mut s = self.clone();
        s.cluster.sparse_hints = on;
        s
    }

    /// The policy's name, as in the file.
    pub fn policy_name(&self) -> &str {
        &self.policy.kind
    }
}

/// The run's own settings: name, duration, step.
fn check_run(file: &ScenarioFile) -> Result<(), ScenarioError> {
    if file.name.trim().is_empty() {
        return Err(invalid("name", "must not be empty"));
    }
    if !(1..=7 * 24 * 3600).contains(&file.duration_s) {
        return Err(invalid(
            "duration_s",
            "must be between 1 and 604800 seconds",
        ));
    }
    if !(1..=10_000).contains(&file.step_ms) {
        return Err(invalid("step_ms", "must be between 1 and 10000"));
    }
    Ok(())
}

/// `[cluster]`, and that its rollup interval is the masters'.
fn check_cluster(c: &ClusterSection, window: &WindowSection) -> Result<(), ScenarioError> {
    if !(1..=100_000).contains(&c.agents) {
        return Err(invalid("cluster.agents", "must be between 1 and 100000"));
    }
    if !(1..=1_000).contains(&c.masters) {
        return Err(invalid("cluster.masters", "must be between 1 and 1000"));
    }
    if !(c.latency_ms.is_finite() && c.latency_ms >= 0.0 && c.latency_ms < 60_000.0) {
        return Err(invalid("cluster.latency_ms", "must be between 0 and 60000"));
    }
    if !(c.jitter_ms.is_finite()
        && c.jitter_ms >= 0.0
        && c.jitter_ms <= c.latency_ms.max(0.0) + 1e-9)
    {
        return Err(invalid(
            "cluster.jitter_ms",
            "must be between 0 and latency_ms",
        ));
    }
    if !(0.0..=1.0).contains(&c.loss) {
        return Err(invalid("cluster.loss", "must be a probability, 0 to 1"));
    }
    if let Err(e) = c.surge_rule() {
        let field = match e {
            SurgeRuleError::Window { .. } => "cluster.surge_window_ms",
            SurgeRuleError::Jump(_) => "cluster.surge_jump",
            _ => "cluster.surge_floor",
        };
        return Err(invalid(field, e.to_string()));
    }
    if c.rollup_interval_ms != window.rollup_interval_ms {
        return Err(invalid(
            "cluster.rollup_interval_ms",
            format!(
                "is {} but window.rollup_interval_ms is {}: agents and masters must agree; set both",
                c.rollup_interval_ms, window.rollup_interval_ms
            ),
        ));
    }
    Ok(())
}

/// `[[traffic]]` item `i`: one [`Traffic`] per account it names (`count`).
fn traffic_items(
    i: usize,
    t: &TrafficSection,
    c: &ClusterSection,
) -> Result<Vec<Traffic>, ScenarioError> {
    let field = |k: &str| format!("traffic[{i}].{k}");
    if t.account.is_empty() || t.op.is_empty() {
        return Err(invalid(
            field("account"),
            "account and op must not be empty",
        ));
    }
    if t.cost == 0 {
        return Err(invalid(field("cost"), "must be at least 1"));
    }
    if !(1..=100_000).contains(&t.count) {
        return Err(invalid(field("count"), "must be between 1 and 100000"));
    }
    if t.count > 1 && !t.account.contains("{i}") {
        return Err(invalid(
            field("account"),
            "with count > 1, must contain {i}",
        ));
    }
    let profile = profile(&t.profile).map_err(|reason| invalid(field("profile"), reason))?;
    (0..t.count)
        .map(|k| {
            Ok(Traffic {
                account: t.account.replace("{i}", &k.to_string()),
                op: t.op.clone(),
                agents: chosen_agents(&t.agents, k, c)
                    .map_err(|reason| invalid(field("agents"), reason))?,
                cost: t.cost,
                profile: profile.clone(),
                arrivals: t.arrivals,
            })
        })
        .collect()
}

/// A rate profile, checked and sorted by time.
fn profile(points: &[ProfilePoint]) -> Result<Vec<ProfilePoint>, String> {
    if points.is_empty() {
        return Err("needs at least one point".into());
    }
    if !points
        .iter()
        .all(|p| p.at_s.is_finite() && p.at_s >= 0.0 && p.rate.is_finite() && p.rate >= 0.0)
    {
        return Err("at_s and rate must be finite and not negative".into());
    }
    let mut profile = points.to_vec();
    profile.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(profile)
}

/// The agents that carry account number `k` of an item.
fn chosen_agents(agents: &AgentsSection, k: u64, c: &ClusterSection) -> Result<Vec<usize>, String> {
    let n_agents = c.agents as usize;
    match agents {
        AgentsSection::Word(w) if w == "all" => Ok((0..n_agents).collect()),
        AgentsSection::Word(w) => Err(format!("{w:?}: expected \"all\", a number or a list")),
        AgentsSection::Count(n) if (1..=c.agents).contains(n) => {
            // Consecutive agents, starting at a different one per account.
            let first = (k as usize * *n as usize) % n_agents;
            Ok((0..*n as usize).map(|j| (first + j) % n_agents).collect())
        }
        AgentsSection::Count(n) => Err(format!("{n}: must be between 1 and {}", c.agents)),
        AgentsSection::List(list) => {
            if list.is_empty() {
                return Err("the list is empty".into());
            }
            if let Some(bad) = list.iter().find(|a| **a >= c.agents) {
                return Err(format!("index {bad} out of range ({} agents)", c.agents));
            }
            let mut v: Vec<usize> = list.iter().map(|a| *a as usize).collect();
            v.sort_unstable();
            v.dedup();
            Ok(v)
        }
    }
}

/// `[[events]]` entry `i`: exactly one action.
fn event_action(i: usize, e: &EventSection, c: &ClusterSection) -> Result<Action, ScenarioError> {
    let field = |k: &str| format!("events[{i}].{k}");
    if !(e.at_s.is_finite() && e.at_s >= 0.0) {
        return Err(invalid(
            field("at_s"),
            "must be a time in seconds, not negative",
        ));
    }
    let master_index = |k: &str, m: u32| {
        if m < c.masters {
            Ok(m as usize)
        } else {
            Err(invalid(
                field(k),
                format!("master {m} out of range ({} masters)", c.masters),
            ))
        }
    };
    let mut actions = Vec::new();
    if let Some(m) = e.kill_master {
        actions.push(Action::KillMaster(master_index("kill_master", m)?));
    }
    if let Some(m) = e.restart_master {
        actions.push(Action::RestartMaster(master_index("restart_master", m)?));
    }
    if let Some(list) = &e.partition_agents {
        if let Some(bad) = list.iter().find(|a| **a >= c.agents) {
            return Err(invalid(
                field("partition_agents"),
                format!("index {bad} out of range ({} agents)", c.agents),
            ));
        }
        actions.push(Action::Partition(
            list.iter().map(|a| *a as usize).collect(),
        ));
    }
    match e.heal {
        Some(true) => actions.push(Action::Heal),
        Some(false) => {
            return Err(invalid(field("heal"), "write heal = true, or leave it out"));
        }
        None => {}
    }
    if actions.len() != 1 {
        return Err(invalid(
            format!("events[{i}]"),
            "needs exactly one of kill_master, restart_master, partition_agents, heal",
        ));
    }
    Ok(actions.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        name = "t"
        duration_s = 10
        [limits]
        messages = 100
        [[traffic]]
        account = "a"
        op = "messages"
        profile = [ { at_s = 0, rate = 10 }, { at_s = 5, rate = 500 } ]
    "#;

    #[test]
    fn a_minimal_scenario_takes_the_documented_defaults() {
        let s = Scenario::from_toml(MINIMAL).unwrap();
        assert_eq!((s.cluster.agents, s.cluster.masters), (20, 3));
        assert_eq!(s.traffic[0].agents.len(), 20);
        assert_eq!(s.traffic[0].arrivals, Arrivals::Poisson);
        assert_eq!(s.traffic[0].rate_at(4.9), 10.0);
        assert_eq!(s.traffic[0].rate_at(5.0), 500.0);
        assert_eq!(s.traffic[0].mean_rate(5.0, 6.0), 500.0);
        assert_eq!(s.traffic[0].mean_rate(4.5, 5.5), 255.0);
        assert_eq!(s.step, Duration::from_millis(100));
    }

    #[test]
    fn count_expands_accounts_over_rotating_agents() {
        let text = MINIMAL.replace(
            "account = \"a\"",
            "account = \"acct-{i}\"\ncount = 3\nagents = 5",
        );
        let s = Scenario::from_toml(&text).unwrap();
        let names: Vec<_> = s.traffic.iter().map(|t| t.account.as_str()).collect();
        assert_eq!(names, ["acct-0", "acct-1", "acct-2"]);
        assert_eq!(s.traffic[1].agents, vec![5, 6, 7, 8, 9]);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (from, to, key) in [
            ("duration_s = 10", "duration_s = 0", "duration_s"),
            (
                "op = \"messages\"",
                "op = \"messages\"\nagents = [0, 20]",
                "traffic[0].agents",
            ),
            (
                "op = \"messages\"",
                "op = \"messages\"\nagents = \"some\"",
                "traffic[0].agents",
            ),
            (
                "op = \"messages\"",
                "op = \"messages\"\ncost = 0",
                "traffic[0].cost",
            ),
            ("rate = 10 }", "rate = -1 }", "traffic[0].profile"),
            (
                "[limits]",
                "[cluster]\nloss = 2.0\n[limits]",
                "cluster.loss",
            ),
            (
                "[limits]",
                "[cluster]\nrollup_interval_ms = 1000\n[limits]",
                "cluster.rollup_interval_ms",
            ),
            ("messages = 100", "messages = 0", "limits.\"messages\""),
            (
                "[limits]",
                "[policy]\nkind = \"magic\"\n[limits]",
                "policy.kind",
            ),
        ] {
            let err = Scenario::from_toml(&MINIMAL.replace(from, to))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{to:?}: {err}");
        }
        let with_event = |e: &str| format!("{MINIMAL}\n[[events]]\nat_s = 1\n{e}\n");
        for (e, key) in [
            ("kill_master = 3", "events[0].kill_master"),
            ("kill_master = 0\nheal = true", "events[0]"),
            ("", "events[0]"),
        ] {
            let err = Scenario::from_toml(&with_event(e)).unwrap_err().to_string();
            assert!(err.contains(key), "{e:?}: {err}");
        }
        // Unknown keys: the key and the line.
        let err =
            Scenario::from_toml(&MINIMAL.replace("duration_s = 10", "duration_s = 10\nspeed = 2"))
                .unwrap_err()
                .to_string();
        assert!(err.contains("speed") && err.contains("line"), "{err}");
    }
}
