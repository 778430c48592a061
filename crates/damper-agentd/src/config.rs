//! The sidecar's settings: a TOML file (every table optional), flags over
//! it, checked once at start with the offending field named.
//!
//! ```toml
//! [masters]
//! addresses = ["10.0.0.1:7070", "10.0.0.2:7070"]   # or dns = "masters.damper:7070"
//!
//! [grpc]
//! listen = "127.0.0.1:7171"       # damper.v1.Check
//!
//! [envoy]
//! listen = "127.0.0.1:8081"       # envoy.service.ratelimit.v3
//! account_key = "tenant"          # the descriptor entry whose value is the account
//! op = "requests"                 # the op every mapped descriptor is checked under
//!
//! [resp]
//! listen = "127.0.0.1:6380"       # DAMPER.CHECK over the Redis protocol
//!
//! [http]
//! listen = "127.0.0.1:9191"       # /healthz, /metrics
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Everything the sidecar is told. Built from [`Config::from_toml`] (or
/// `Default`), adjusted by flags, then [`Config::validate`]d.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Config {
    /// Where the masters are.
    pub masters: MastersConfig,
    /// The in-process agent.
    pub agent: AgentConfig,
    /// mTLS to the masters, when they require it.
    pub tls: Option<TlsConfig>,
    /// The `damper.v1.Check` gRPC front door.
    pub grpc: Door,
    /// Envoy's rate limit service front door.
    pub envoy: EnvoyConfig,
    /// The Redis-protocol front door.
    pub resp: RespConfig,
    /// The operator's endpoint: `/healthz` and Prometheus `/metrics`.
    pub http: Door,
    /// What one client may hold of the sidecar.
    pub limits: Limits,
}

/// Where the masters are: a fixed list or a DNS name, as the agent
/// library takes them.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct MastersConfig {
    /// `host:port` of every master.
    pub addresses: Vec<String>,
    /// A `host:port` whose name resolves to every master (a Kubernetes
    /// headless service), instead of `addresses`.
    pub dns: Option<String>,
    /// How often `dns` is resolved again. Default 30 s.
    #[serde(deserialize_with = "duration")]
    pub dns_every: Duration,
}

impl Default for MastersConfig {
    fn default() -> Self {
        MastersConfig {
            addresses: Vec::new(),
            dns: None,
            dns_every: Duration::from_secs(30),
        }
    }
}

/// The in-process agent's settings.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct AgentConfig {
    /// This sidecar's identity in rollups and logs. Default: host name
    /// and process id.
    pub id: Option<String>,
    /// How often counts go to the masters; must match the masters'
    /// `rollup_interval_ms`. Default 2 s.
    #[serde(deserialize_with = "duration")]
    pub rollup_interval: Duration,
    /// How many publisher lanes the agent keeps for checks that name their
    /// publisher (`FROM`, gRPC's `publisher`, Envoy's `publisher_key`):
    /// 16 bytes each, made at the first such check; past it publishers
    /// share lanes, which costs fairness only. 1 to 1 048 576. Default
    /// 4 096.
    pub publisher_lanes: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            id: None,
            rollup_interval: damper_core::DEFAULT_ROLLUP_INTERVAL,
            publisher_lanes: damper_core::agent::AgentConfig::default().publisher_lanes,
        }
    }
}

/// Files for mutual TLS to the masters (PEM).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsConfig {
    /// The CA that signed the masters' certificates.
    pub ca: PathBuf,
    /// This sidecar's certificate, when the masters ask for one.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
    /// The name the masters' certificates carry, when it is not their
    /// address's host.
    pub domain: Option<String>,
}

/// A front door that is only an address: off unless `listen` is given.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Door {
    /// Where to serve.
    pub listen: Option<SocketAddr>,
}

/// What a request whose descriptors name no account gets.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Unmapped {
    /// OK, counted nowhere (Damper limits accounts; this is not one).
    #[default]
    Allow,
    /// OVER_LIMIT: for gateways where every request must name its account.
    Deny,
}

/// Envoy's rate limit service, and how a descriptor maps to an (account,
/// op).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct EnvoyConfig {
    /// Where to serve `envoy.service.ratelimit.v3.RateLimitService`.
    pub listen: Option<SocketAddr>,
    /// The descriptor entry whose value is the account. Default `tenant`.
    pub account_key: String,
    /// The descriptor entry whose value is the op, when the op varies per
    /// request. A descriptor without it is checked under `op`.
    pub op_key: Option<String>,
    /// The op a mapped descriptor is checked under when `op_key` does not
    /// say. Default: the request's `domain`.
    pub op: Option<String>,
    /// The descriptor entry whose value names the publisher (a client id,
    /// `remote_address`), when Envoy sends one: publishers of one account
    /// then each keep their share of it (`check_from`). Default none.
    pub publisher_key: Option<String>,
    /// What a descriptor without `account_key` gets. Default `allow`.
    pub unmapped: Unmapped,
    /// Whether responses carry `RateLimit-Policy`, `RateLimit` and
    /// `Retry-After` headers for Envoy to add. Default on.
    pub headers: bool,
}

impl Default for EnvoyConfig {
    fn default() -> Self {
        EnvoyConfig {
            listen: None,
            account_key: "tenant".into(),
            op_key: None,
            op: None,
            publisher_key: None,
            unmapped: Unmapped::Allow,
            headers: true,
        }
    }
}

/// The Redis-protocol front door.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RespConfig {
    /// TCP address.
    pub listen: Option<SocketAddr>,
    /// A Unix socket path, for clients on the same host (a stale socket
    /// file there is replaced).
    pub unix: Option<PathBuf>,
}

/// What one client may hold of the sidecar, so a broken or hostile one
/// cannot starve the rest.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Limits {
    /// Open Redis-protocol connections at once (TCP and Unix together);
    /// more are closed at accept and counted. Default 10 000.
    pub max_connections: usize,
    /// A Redis-protocol connection that sends nothing this long is closed.
    /// Default 5 min.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// The largest Redis-protocol command, in bytes; a bigger one is a
    /// protocol error and closes the connection. Default 64 KiB.
    pub max_frame_bytes: usize,
    /// Checks in one `CheckMany`. Default 10 000.
    pub max_batch: usize,
    /// Requests in flight on one gRPC connection. Default 1 024.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            idle_timeout: Duration::from_secs(300),
            max_frame_bytes: 64 * 1024,
            max_batch: 10_000,
            max_in_flight: 1_024,
        }
    }
}

/// Why a config was refused: the field, and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file is not valid TOML for this schema (the message names the
    /// key and line).
    #[error("{0}")]
    Parse(String),
    /// A value is out of range or inconsistent.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The field, as written in the file (`envoy.account_key`).
        field: &'static str,
        /// What is allowed.
        reason: String,
    },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

impl Config {
    /// Parses a config file's text. Unknown keys are refused, so a typo
    /// cannot silently leave a default in force. Does not validate: flags
    /// may still fill in what the file leaves out.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Checks everything the sidecar needs to start, naming the first
    /// field that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_masters()?;
        let a = &self.agent;
        if let Some(id) = &a.id {
            damper_core::wire::validate_name("agent.id", id)
                .map_err(|e| invalid("agent.id", e.to_string()))?;
        }
        in_range(
            "agent.rollup_interval",
            a.rollup_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )?;
        if !(1..=damper_core::agent::MAX_PUBLISHER_LANES).contains(&a.publisher_lanes) {
            return Err(invalid("agent.publisher_lanes", "must be 1 to 1 048 576"));
        }
        self.validate_envoy()?;
        let doors = [
            self.grpc.listen.is_some(),
            self.envoy.listen.is_some(),
            self.resp.listen.is_some(),
            self.resp.unix.is_some(),
        ];
        if !doors.contains(&true) {
            return Err(invalid(
                "listen",
                "no front door: give at least one of grpc.listen, envoy.listen, resp.listen, resp.unix",
            ));
        }
        self.validate_limits()?;
        if let Some(tls) = &self.tls
            && tls.cert.is_some() != tls.key.is_some()
        {
            return Err(invalid("tls.key", "give tls.cert and tls.key together"));
        }
        Ok(())
    }

    fn validate_masters(&self) -> Result<(), ConfigError> {
        let m = &self.masters;
        match (&m.dns, m.addresses.is_empty()) {
            (None, true) => Err(invalid(
                "masters.addresses",
                "no masters: give masters.addresses (or --masters) or masters.dns",
            )),
            (Some(_), false) => Err(invalid(
                "masters.dns",
                "give masters.addresses or masters.dns, not both",
            )),
            (Some(dns), true) => {
                damper_core::ring::parse_member(dns).map_err(|e| invalid("masters.dns", e))?;
                in_range(
                    "masters.dns_every",
                    m.dns_every,
                    Duration::from_secs(1),
                    Duration::from_secs(86_400),
                )
            }
            (None, false) => {
                for address in &m.addresses {
                    damper_core::ring::parse_member(address)
                        .map_err(|e| invalid("masters.addresses", e))?;
                }
                Ok(())
            }
        }
    }

    fn validate_envoy(&self) -> Result<(), ConfigError> {
        let e = &self.envoy;
        let name = |field: &'static str, value: &str| {
            damper_core::wire::validate_name(field, value)
                .map_err(|err| invalid(field, err.to_string()))
        };
        name("envoy.account_key", &e.account_key)?;
        if let Some(key) = &e.op_key {
            name("envoy.op_key", key)?;
        }
        if let Some(op) = &e.op {
            name("envoy.op", op)?;
        }
        if let Some(key) = &e.publisher_key {
            name("envoy.publisher_key", key)?;
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        count("limits.max_connections", l.max_connections, 1, 1_000_000)?;
        count("limits.max_frame_bytes", l.max_frame_bytes, 1_024, 64 << 20)?;
        count("limits.max_batch", l.max_batch, 1, 1_000_000)?;
        count("limits.max_in_flight", l.max_in_flight, 1, 1_000_000)?;
        in_range(
            "limits.idle_timeout",
            l.idle_timeout,
            Duration::from_secs(1),
            Duration::from_secs(7 * 86_400),
        )
    }

    /// The masters as `host:port` strings, normalised (`http://` dropped).
    pub fn master_addresses(&self) -> Vec<String> {
        self.masters
            .addresses
            .iter()
            .filter_map(|a| damper_core::ring::parse_member(a).ok())
            .collect()
    }
}

fn in_range(
    field: &'static str,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if d < min || d > max {
        return Err(invalid(
            field,
            format!(
                "must be from {} to {}",
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

fn count(field: &'static str, n: usize, min: usize, max: usize) -> Result<(), ConfigError> {
    if n < min || n > max {
        return Err(invalid(field, format!("must be from {min} to {max}")));
    }
    Ok(())
}

/// A duration written as humans do: `2s`, `500ms`, `5m`.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(text.trim()).map_err(|e| {
        serde::de::Error::custom(format!(
            "{text:?}: {e} (write a number and a unit: 2s, 500ms, 1m)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(text: &str) -> Config {
        let config = Config::from_toml(text).unwrap();
        config.validate().unwrap();
        config
    }

    fn refused(text: &str) -> String {
        match Config::from_toml(text) {
            Err(e) => e.to_string(),
            Ok(config) => config.validate().unwrap_err().to_string(),
        }
    }

    #[test]
    fn a_full_file_is_read_with_every_table() {
        let config = valid(
            r#"
            [masters]
            addresses = ["10.0.0.1:7070", "http://10.0.0.2:7070"]
            [agent]
            id = "edge-1"
            rollup_interval = "500ms"
            [grpc]
            listen = "127.0.0.1:7171"
            [envoy]
            listen = "127.0.0.1:8081"
            account_key = "customer"
            op_key = "op"
            op = "requests"
            unmapped = "deny"
            headers = false
            [resp]
            listen = "127.0.0.1:6380"
            unix = "/tmp/agentd.sock"
            [http]
            listen = "127.0.0.1:9191"
            [limits]
            max_connections = 100
            idle_timeout = "30s"
            max_frame_bytes = 4096
            max_batch = 50
            max_in_flight = 8
            "#,
        );
        assert_eq!(
            config.master_addresses(),
            ["10.0.0.1:7070", "10.0.0.2:7070"]
        );
        assert_eq!(config.agent.rollup_interval, Duration::from_millis(500));
        assert_eq!(config.envoy.unmapped, Unmapped::Deny);
        assert_eq!(config.envoy.op_key.as_deref(), Some("op"));
        assert_eq!(config.limits.idle_timeout, Duration::from_secs(30));
        assert_eq!(config.limits.max_batch, 50);
    }

    #[test]
    fn defaults_fill_what_a_file_leaves_out() {
        let config =
            valid("[masters]\naddresses = [\"m:7070\"]\n[resp]\nlisten = \"127.0.0.1:6380\"\n");
        assert_eq!(config.envoy.account_key, "tenant");
        assert_eq!(config.envoy.unmapped, Unmapped::Allow);
        assert!(config.envoy.headers);
        assert_eq!(config.limits, Limits::default());
        assert_eq!(config.agent.rollup_interval, Duration::from_secs(2));
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        let base = "[masters]\naddresses = [\"m:7070\"]\n[resp]\nlisten = \"127.0.0.1:6380\"\n";
        let cases: Vec<(String, &str)> = vec![
            ("[masters]\n[resp]\nlisten = \"127.0.0.1:6380\"\n".into(), "masters.addresses"),
            ("[masters]\naddresses = [\"no-port\"]\n[resp]\nlisten = \"127.0.0.1:6380\"\n".into(), "masters.addresses"),
            ("[masters]\naddresses = [\"m:1\"]\ndns = \"d:1\"\n[grpc]\nlisten = \"127.0.0.1:1\"\n".into(), "masters.dns"),
            ("[masters]\naddresses = [\"m:7070\"]\n".into(), "listen"),
            (format!("{base}[envoy]\naccount_key = \"\"\n"), "envoy.account_key"),
            (format!("{base}[envoy]\nunmapped = \"maybe\"\n"), "unmapped"),
            (format!("{base}[limits]\nmax_connections = 0\n"), "limits.max_connections"),
            (format!("{base}[limits]\nidle_timeout = \"soon\"\n"), "idle_timeout"),
            (format!("{base}[limits]\nmax_frame_bytes = 10\n"), "limits.max_frame_bytes"),
            (format!("{base}[agent]\nrollup_interval = \"1ms\"\n"), "agent.rollup_interval"),
            (format!("{base}[agent]\npublisher_lanes = 0\n"), "agent.publisher_lanes"),
            (format!("{base}[http]\nport = 1\n"), "port"),
            (format!("{base}[tls]\nca = \"/ca.pem\"\ncert = \"/c.pem\"\n"), "tls.key"),
        ];
        for (text, field) in &cases {
            let error = refused(text);
            assert!(
                error.contains(field),
                "{text:?}: {error:?} does not name {field}"
            );
        }
    }
}
