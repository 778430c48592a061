//! Live configuration changes: new limits and policy take effect on the
//! next rollup, and every demand window is kept.
//!
//! [`Master::reload`] swaps a validated config in. [`ConfigWatcher`] is what
//! the binary runs: it rereads the config file when its content changes
//! (polled, which also catches Kubernetes' ConfigMap symlink swaps) or on
//! SIGHUP, and keeps the old config in force when the new file is invalid,
//! with one logged error naming the field and line.
//!
//! A change to how windows are cut (`window.sub_interval_ms`,
//! `sub_intervals`, `rollup_interval_ms`, `grace_ms`) is refused: the
//! counts kept so far do not fit another shape, and starting every window
//! afresh would release every suppressed account for a window. Such a
//! change needs a restart (whose snapshot is then ignored).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use damper_core::config::{ConfigError, MasterConfig};

use crate::Master;

/// Why a new config was not put in force. The old one stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("{path}: {source}")]
    Invalid {
        /// The file.
        path: String,
        /// The field (and line) at fault.
        source: ConfigError,
    },
    /// The window would be cut differently: needs a restart.
    #[error(
        "`window.{field}` changed from {from} to {to}: the windows kept so far do not fit another shape; restart the master to change it"
    )]
    ShapeChanged {
        /// The `[window]` field that changed.
        field: &'static str,
        /// Its value in force.
        from: String,
        /// Its value in the new config.
        to: String,
    },
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReloadSummary {
    /// Limits configured now.
    pub limits: usize,
    /// Limit keys added, removed or given another rate, as `key: old -> new`
    /// (`-` for none), sorted by key.
    pub changed: Vec<String>,
    /// Whether the `[policy]` table changed.
    pub policy_changed: bool,
}

impl Master {
    /// The configuration in force.
    pub fn config(&self) -> MasterConfig {
        self.lock(0).config().clone()
    }

    /// Puts `config` in force on every shard: new limits and policy apply
    /// from the next report of each (account, op), with every window kept.
    /// A config whose windows are cut differently is refused.
    pub fn reload(&self, config: MasterConfig) -> Result<ReloadSummary, ReloadError> {
        let old = self.config();
        if let Some(c) = old.window.shape_change(&config.window) {
            return Err(ReloadError::ShapeChanged {
                field: c.field,
                from: c.from,
                to: c.to,
            });
        }
        let rate = |c: &MasterConfig| -> std::collections::BTreeMap<String, f64> {
            c.limits
                .iter()
                .map(|(k, r)| (k.to_owned(), r.get()))
                .collect()
        };
        let (before, after) = (rate(&old), rate(&config));
        // Over the union of keys, in order (a set), so sorted.
        let changed: Vec<String> = before
            .keys()
            .chain(after.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| before.get(*k) != after.get(*k))
            .map(|k| {
                let show = |r: Option<&f64>| r.map_or("-".to_string(), f64::to_string);
                format!("{k}: {} -> {}", show(before.get(k)), show(after.get(k)))
            })
            .collect();
        let mut changed = changed;
        if old.exempt != config.exempt {
            changed.push("[exempt] changed".to_string());
        }
        let shadowed = |c: &MasterConfig| -> Vec<String> {
            let mut keys: Vec<String> = c.limits.shadowed().map(str::to_owned).collect();
            keys.sort_unstable();
            keys
        };
        let (was, now) = (shadowed(&old), shadowed(&config));
        if was != now {
            changed.push(format!("[shadow] {was:?} -> {now:?}"));
        }
        let summary = ReloadSummary {
            limits: config.limits.len(),
            changed,
            policy_changed: old.policy != config.policy,
        };
        for shard in 0..self.shared.shards.len() {
            self.lock(shard).set_config(config.clone());
        }
        Ok(summary)
    }
}

/// Why a [`ConfigWatcher`] looked at the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Its content changed since the last look.
    Changed,
    /// An operator asked (SIGHUP): reloaded even if unchanged.
    Signal,
}

impl Cause {
    fn as_str(self) -> &'static str {
        match self {
            Cause::Changed => "file changed",
            Cause::Signal => "SIGHUP",
        }
    }
}

/// Watches a master's config file and reloads it when it changes or when
/// asked. Each attempt logs one line and counts
/// `damper_master_config_reloads_total{result="ok"|"error"}`.
pub struct ConfigWatcher {
    master: Master,
    path: PathBuf,
    /// The content last looked at (in force, or refused): unchanged content
    /// is not reloaded, and a refused file is not reported every poll.
    last: Vec<u8>,
    /// The last read error, so a file missing for a while (a deploy
    /// swapping it) is reported once.
    last_read_error: Option<String>,
}

impl ConfigWatcher {
    /// Watches `path`, whose content `loaded` is in force on `master`.
    pub fn new(master: Master, path: impl Into<PathBuf>, loaded: &str) -> ConfigWatcher {
        ConfigWatcher {
            master,
            path: path.into(),
            last: loaded.as_bytes().to_vec(),
            last_read_error: None,
        }
    }

    /// The watched file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks at the file once. With [`Cause::Changed`], reloads only if the
    /// content differs from the last look; with [`Cause::Signal`], always.
    /// `None` when there was nothing to do.
    pub fn check(&mut self, cause: Cause) -> Option<Result<ReloadSummary, ReloadError>> {
        let path = self.path.display().to_string();
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => {
                self.last_read_error = None;
                bytes
            }
            Err(source) => {
                let message = source.to_string();
                let repeated = self.last_read_error.as_deref() == Some(message.as_str());
                self.last_read_error = Some(message);
                if repeated && cause == Cause::Changed {
                    return None;
                }
                return Some(self.report(cause, Err(ReloadError::Read { path, source })));
            }
        };
        if cause == Cause::Changed && bytes == self.last {
            return None;
        }
        self.last = bytes;
        let result = String::from_utf8(self.last.clone())
            .map_err(|e| ReloadError::Invalid {
                path: path.clone(),
                source: ConfigError::Parse(format!("not UTF-8: {e}")),
            })
            .and_then(|text| {
                MasterConfig::from_toml(&text)
                    .map_err(|source| ReloadError::Invalid { path, source })
            })
            .and_then(|config| self.master.reload(config));
        Some(self.report(cause, result))
    }

    fn report(
        &self,
        cause: Cause,
        result: Result<ReloadSummary, ReloadError>,
    ) -> Result<ReloadSummary, ReloadError> {
        match &result {
            Ok(summary) => {
                metrics::counter!("damper_master_config_reloads_total", "result" => "ok")
                    .increment(1);
                tracing::info!(
                    config = %self.path.display(), cause = cause.as_str(), limits = summary.limits,
                    changed = ?summary.changed, policy_changed = summary.policy_changed,
                    "config reloaded"
                );
            }
            Err(e) => {
                metrics::counter!("damper_master_config_reloads_total", "result" => "error")
                    .increment(1);
                tracing::error!(
                    config = %self.path.display(), cause = cause.as_str(), error = %e,
                    "config reload refused; the config in force is unchanged"
                );
            }
        }
        result
    }

    /// Checks the file every `every` (never, if `None`) and whenever
    /// `signals` yields (SIGHUP), until `shutdown` completes.
    pub async fn run(
        mut self,
        every: Option<Duration>,
        mut signals: tokio::sync::mpsc::Receiver<()>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut tick = every.map(|every| {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        tokio::pin!(shutdown);
        let mut signals_open = true;
        loop {
            let polled = async {
                match &mut tick {
                    Some(tick) => {
                        tick.tick().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = polled => { self.check(Cause::Changed); }
                signal = signals.recv(), if signals_open => match signal {
                    Some(()) => { self.check(Cause::Signal); }
                    // No more signals can come: keep polling only.
                    None => signals_open = false,
                },
            }
        }
    }
}
