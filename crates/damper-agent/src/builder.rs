//! The agent's settings ([`AgentBuilder`]), checked when it starts: every
//! refusal names the setting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damper_core::agent::{AgentConfig, AgentState, MAX_PUBLISHER_LANES, SurgeRule};
use damper_core::round::RoundConfig;
use tokio::sync::watch;

use crate::clock::CoarseClock;
use crate::stats::Stats;
use crate::{Agent, Shared, rollup};

/// Where the masters are.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Masters {
    /// A fixed list of `host:port` addresses.
    Static(Vec<String>),
    /// A DNS name resolved to every address it has, re-resolved
    /// periodically: a Kubernetes headless service, for instance.
    Dns {
        /// The name to resolve.
        host: String,
        /// The masters' gRPC port.
        port: u16,
        /// How often to resolve again.
        every: Duration,
    },
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentError {
    /// No master was given.
    #[error("no masters: give at least one address or a DNS name")]
    NoMasters,
    /// A master address is not `host:port`.
    #[error("master address: {reason}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The builder method.
        field: &'static str,
        /// What is allowed.
        reason: &'static str,
    },
    /// `start` was called outside a tokio runtime.
    #[error("Agent::start must be called from within a tokio runtime")]
    NoRuntime,
    /// The clock thread could not be started.
    #[error("cannot start the agent's clock thread: {0}")]
    Clock(String),
}

/// Settings for an [`Agent`]; see [`Agent::builder`].
#[derive(Clone, Debug)]
pub struct AgentBuilder {
    masters: Option<Masters>,
    agent_id: Option<String>,
    rollup_interval: Duration,
    fast_onset: bool,
    account_numbers: bool,
    low_noise: bool,
    pace: bool,
    freeze_sparse: bool,
    sparse_hints: bool,
    publisher_lanes: usize,
    local_window: Duration,
    forget_after: Duration,
    request_timeout: Option<Duration>,
    max_entries_per_request: usize,
    max_carry: Duration,
    fail_after: u32,
    fail_static: Vec<(String, Duration)>,
    tls: Option<AgentTls>,
}

/// TLS to the masters: the CA their certificates chain to and, for mutual
/// TLS, this agent's own certificate and key. PEM throughout.
#[derive(Clone)]
pub struct AgentTls {
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AgentTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl AgentTls {
    /// Trust masters whose certificates chain to this CA.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> AgentTls {
        AgentTls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Present this client certificate and key (mutual TLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Verify the masters' certificates against this name instead of the
    /// host in each master's address.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }
}

impl Default for AgentBuilder {
    fn default() -> Self {
        AgentBuilder {
            masters: None,
            agent_id: None,
            rollup_interval: damper_core::DEFAULT_ROLLUP_INTERVAL,
            fast_onset: true,
            account_numbers: true,
            low_noise: true,
            pace: true,
            freeze_sparse: true,
            sparse_hints: true,
            publisher_lanes: AgentConfig::default().publisher_lanes,
            local_window: Duration::from_millis(250),
            forget_after: AgentConfig::default().forget_after,
            request_timeout: None,
            max_entries_per_request: 10_000,
            max_carry: Duration::from_secs(30),
            fail_after: 2,
            fail_static: Vec::new(),
            tls: None,
        }
    }
}

impl AgentBuilder {
    /// A fixed list of master addresses (`host:port`).
    pub fn masters<S: Into<String>>(mut self, addresses: impl IntoIterator<Item = S>) -> Self {
        self.masters = Some(Masters::Static(
            addresses.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Masters found by resolving `host` (every address it has, on `port`),
    /// again every `every`.
    pub fn masters_dns(mut self, host: impl Into<String>, port: u16, every: Duration) -> Self {
        self.masters = Some(Masters::Dns {
            host: host.into(),
            port,
            every,
        });
        self
    }

    /// This agent's identity in rollups and logs. Default: host name and
    /// process id.
    pub fn agent_id(mut self, id: impl Into<String>) -> Self {
        self.agent_id = Some(id.into());
        self
    }

    /// How often counts go to the masters (default 2 s). Must match the
    /// masters' `rollup_interval_ms`.
    pub fn rollup_interval(mut self, interval: Duration) -> Self {
        self.rollup_interval = interval;
        self
    }

    /// How long an (account, op) with nothing counted and no factor in force
    /// stays in memory (default 60 s, at least the rollup interval). A
    /// forgotten pair behaves exactly as one never seen, so this only trades
    /// memory for the cost of an insert when the account comes back.
    pub fn forget_after(mut self, idle: Duration) -> Self {
        self.forget_after = idle;
        self
    }

    /// Fast onset (default on): early reports of pairs whose demand jumps
    /// or falls within a 200 ms sub-window, and the local guard applying
    /// each op's default limit, learned from the masters at start, to
    /// accounts no master has answered for yet (`docs/design.md`). Off,
    /// the agent reports in rollups alone, every interval.
    pub fn fast_onset(mut self, on: bool) -> Self {
        self.fast_onset = on;
        self
    }

    /// Account numbers (default on): a master that holds this agent's
    /// dictionary gets each account's name once, and its number after
    /// (a few bytes an entry rather than the name's length, see
    /// `damper_core::wire::dictionary`). Masters that predate numbers get
    /// names either way. Off, every rollup names every account.
    pub fn account_numbers(mut self, on: bool) -> Self {
        self.account_numbers = on;
        self
    }

    /// Low-noise admission (default on): a factor keeps `1 − factor` of
    /// each account's attempted cost to within a few operations, by a
    /// per-pair credit, instead of deciding each operation by an
    /// independent draw (`docs/design.md`). Off only to compare the two.
    pub fn low_noise(mut self, on: bool) -> Self {
        self.low_noise = on;
        self
    }

    /// Pacing (default on): a pair its master suppresses by a fifth or more
    /// admits `1 − factor` of the rate this agent last told the master,
    /// not of what it attempts now, so the agents together admit the limit
    /// rather than the limit times the round-to-round swing of the
    /// account's demand (`docs/design.md`). Needs low-noise admission and
    /// fast onset. Off only to compare.
    pub fn pace(mut self, on: bool) -> Self {
        self.pace = on;
        self
    }

    /// Frozen admission for sparse paced pairs (default on): a paced pair
    /// that expects at most a few operations a sub-window decides them all
    /// by one probability set from its credit at the sub-window's start,
    /// so a costly account spread thin over many agents swings less from
    /// one 6-s bucket to the next (`docs/design.md`). Needs pacing. Off
    /// only to compare.
    pub fn freeze_sparse(mut self, on: bool) -> Self {
        self.freeze_sparse = on;
        self
    }

    /// How many publisher lanes [`Agent::check_from`](crate::Agent::check_from)
    /// keeps (default 4 096, 16 bytes each, made at its first call): one
    /// per (account, op, publisher) in use under a factor, so that
    /// publishers sharing an account each keep their share. Past it,
    /// publishers share lanes, which costs fairness only. 1 to 2^20,
    /// rounded up to a power of two.
    pub fn publisher_lanes(mut self, lanes: usize) -> Self {
        self.publisher_lanes = lanes;
        self
    }

    /// Sparse hints (default on): a pair of sparse costly operations that
    /// saw more of them than chance allows, too few for this agent alone
    /// to call a surge, is hinted to its master, which polls every agent
    /// for the pair when several hint at once, so a flood of costly
    /// operations spread thin over many nodes is held within a second
    /// (`docs/design.md`, "Sparse hints"). Needs fast onset. Off only to
    /// compare.
    pub fn sparse_hints(mut self, on: bool) -> Self {
        self.sparse_hints = on;
        self
    }

    /// The local guard's measurement window (default 250 ms).
    pub fn local_window(mut self, window: Duration) -> Self {
        self.local_window = window;
        self
    }

    /// How long to wait for a master's reply (default: half the rollup
    /// interval, at most 1 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Most (account, op) entries in one request; a larger rollup is split
    /// (default 10 000), and its requests go to their master at most two
    /// at a time, each timed from when it is sent.
    pub fn max_entries_per_request(mut self, n: usize) -> Self {
        self.max_entries_per_request = n;
        self
    }

    /// How long counts that could not be delivered are kept and resent
    /// before they are dropped, counted in
    /// `damper_agent_rollup_dropped_cost_total` (default 30 s: older counts
    /// fall outside any window the master keeps).
    pub fn max_carry(mut self, max: Duration) -> Self {
        self.max_carry = max;
        self
    }

    /// Failed rollups in a row that take a master off this agent's ring, so
    /// its accounts go to their next owners (default 2). It is probed, with
    /// backoff, and rejoined when it answers.
    pub fn fail_after(mut self, failures: u32) -> Self {
        self.fail_after = failures;
        self
    }

    /// Makes `op` fail static: when no fresh factor arrives (its master is
    /// unreachable), keep applying the last one for `hold` past its validity
    /// before failing open. Default for every op: fail open as soon as the
    /// factor's validity (3 rollup intervals) passes. `hold` is at most
    /// 10 minutes: a stale factor no longer follows the demand.
    pub fn fail_static(mut self, op: impl Into<String>, hold: Duration) -> Self {
        self.fail_static.push((op.into(), hold));
        self
    }

    /// Talk to the masters over TLS (default: plain TCP, for loopback or a
    /// trusted network).
    pub fn tls(mut self, tls: AgentTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Starts the agent: its clock and its rollup task. Call from within a
    /// tokio runtime.
    pub fn start(self) -> Result<Agent, AgentError> {
        let masters = validate_masters(self.masters.clone().ok_or(AgentError::NoMasters)?)?;
        self.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| AgentError::NoRuntime)?;
        let agent_id = self.agent_id.unwrap_or_else(default_agent_id);
        let clock = CoarseClock::shared().map_err(|e| AgentError::Clock(e.to_string()))?;
        let mut config = AgentConfig::default();
        config.rollup_interval = self.rollup_interval;
        config.local_window = self.local_window;
        config.forget_after = self.forget_after;
        config.fast_onset = self.fast_onset;
        config.low_noise = self.low_noise;
        config.pace = self.pace;
        config.freeze_sparse = self.freeze_sparse;
        config.sparse_hints = self.sparse_hints;
        config.publisher_lanes = self.publisher_lanes;
        // A pair `check` creates is young: the round peeks at it from the
        // moment the driver, woken here, shows it to the round.
        let young = Arc::new(tokio::sync::Notify::new());
        let woken = young.clone();
        let state = self
            .fail_static
            .iter()
            .fold(AgentState::new(config), |state, (op, hold)| {
                state.with_fail_static(op, *hold)
            })
            .with_young_hook(move || woken.notify_one());
        let shared = Arc::new(Shared {
            state,
            clock,
            agent_id,
            stats: Stats::default(),
        });
        let mut round = RoundConfig::new(shared.agent_id.clone());
        round.rollup_interval = self.rollup_interval;
        round.max_entries_per_request = self.max_entries_per_request;
        round.max_carry = self.max_carry;
        round.incarnation = Some(crate::os_seeded_u64());
        round.health.fail_after = self.fail_after;
        round.account_numbers = self.account_numbers;
        round.fast_onset = self
            .fast_onset
            .then(|| SurgeRule::default_for(self.rollup_interval));
        let settings = rollup::Settings {
            masters,
            round,
            request_timeout: self
                .request_timeout
                .unwrap_or((self.rollup_interval / 2).min(Duration::from_secs(1))),
            tls: self.tls,
            young,
        };
        let (stop, stopped) = watch::channel(false);
        let task = runtime.spawn(rollup::run(shared.clone(), settings, stopped));
        Ok(Agent {
            shared,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    /// Checks every setting but the masters, naming the one at fault.
    fn validate(&self) -> Result<(), AgentError> {
        if self.rollup_interval < Duration::from_millis(10) {
            return Err(AgentError::Invalid {
                field: "rollup_interval",
                reason: "must be at least 10 ms",
            });
        }
        if self.forget_after < self.rollup_interval {
            return Err(AgentError::Invalid {
                field: "forget_after",
                reason: "must be at least the rollup interval",
            });
        }
        if self.fail_after == 0 {
            return Err(AgentError::Invalid {
                field: "fail_after",
                reason: "must be at least 1",
            });
        }
        if !(1..=MAX_PUBLISHER_LANES).contains(&self.publisher_lanes) {
            return Err(AgentError::Invalid {
                field: "publisher_lanes",
                reason: "must be 1 to 1 048 576",
            });
        }
        if self.max_entries_per_request == 0 {
            return Err(AgentError::Invalid {
                field: "max_entries_per_request",
                reason: "must be at least 1",
            });
        }
        for (op, hold) in &self.fail_static {
            if damper_core::wire::validate_name("op", op).is_err() {
                return Err(AgentError::Invalid {
                    field: "fail_static",
                    reason: "the op must be 1 to 256 bytes long",
                });
            }
            if *hold > Duration::from_secs(600) {
                return Err(AgentError::Invalid {
                    field: "fail_static",
                    reason: "the hold must be at most 10 minutes",
                });
            }
        }
        Ok(())
    }
}

/// Checks the masters' addresses (or DNS name), naming what is wrong;
/// addresses come back bare (`host:port`, see
/// [`parse_member`](damper_core::ring::parse_member)).
fn validate_masters(masters: Masters) -> Result<Masters, AgentError> {
    if let Masters::Static(list) = &masters {
        if list.is_empty() {
            return Err(AgentError::NoMasters);
        }
        let bare = list
            .iter()
            .map(|a| parse_address(a))
            .collect::<Result<_, _>>()?;
        return Ok(Masters::Static(bare));
    }
    if let Masters::Dns { host, every, .. } = &masters {
        if host.is_empty() {
            return Err(AgentError::NoMasters);
        }
        if every.is_zero() {
            return Err(AgentError::Invalid {
                field: "masters_dns",
                reason: "the re-resolve period must be greater than zero",
            });
        }
    }
    Ok(masters)
}

fn parse_address(address: &str) -> Result<String, AgentError> {
    damper_core::ring::parse_member(address).map_err(|reason| AgentError::BadAddress {
        address: address.to_string(),
        reason,
    })
}

/// `host-pid`, and `host-pid-N` for the Nth agent started after it in the
/// same process: the masters budget new pairs per agent id, so two agents
/// must not share one unless told to.
fn default_agent_id() -> String {
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "agent".into());
    let pid = std::process::id();
    match STARTED.fetch_add(1, Ordering::Relaxed) {
        0 => format!("{host}-{pid}"),
        n => format!("{host}-{pid}-{}", n + 1),
    }
}
