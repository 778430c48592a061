//! Window snapshots: a master that stops writes every (account, op)'s demand
//! window to a file, and on start reloads it if it is recent, so a rolling
//! restart does not open a hole of a whole window in enforcement.
//!
//! The file is JSON (a format version, when it was written, the window shape
//! it was cut for, and the windows), written to a temporary file beside it
//! and renamed into place, so a crash mid-write leaves the old file or none,
//! never half of one. A snapshot that cannot be read, is of another format
//! or window shape, or is older than the caller allows is refused with a
//! [`SnapshotError`] saying which; the master then starts empty.

use std::path::Path;
use std::time::Duration;

use damper_core::config::WindowConfig;
use damper_core::master::KeySnapshot;
use damper_core::time::Nanos;
use serde::{Deserialize, Serialize};

use crate::Master;

/// The snapshot format this build writes and reads.
const FORMAT: u32 = 2;

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    written_unix_ms: u64,
    window: Shape,
    keys: Vec<KeySnapshot>,
}

/// How the windows are cut: a snapshot fits only the same shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Shape {
    sub_interval_ms: u128,
    sub_intervals: usize,
    rollup_interval_ms: u128,
    grace_ms: u128,
}

impl Shape {
    fn of(w: &WindowConfig) -> Shape {
        Shape {
            sub_interval_ms: w.sub_interval.as_millis(),
            sub_intervals: w.sub_intervals.get(),
            rollup_interval_ms: w.rollup_interval.as_millis(),
            grace_ms: w.grace.as_millis(),
        }
    }
}

/// Why a snapshot was not written or not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading or writing the file failed (a missing file included).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a snapshot this build can read.
    #[error("{path}: not a readable snapshot: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The snapshot is older than allowed: its counts are outside any window.
    #[error("{path}: written {age_ms} ms ago, more than the {max_ms} ms allowed")]
    TooOld {
        /// The file.
        path: String,
        /// Its age.
        age_ms: u64,
        /// The most allowed.
        max_ms: u64,
    },
    /// The snapshot's windows were cut for another `[window]` config.
    #[error("{path}: written for another [window] config ({found}); this one is {expected}")]
    OtherShape {
        /// The file.
        path: String,
        /// The snapshot's shape.
        found: String,
        /// This config's shape.
        expected: String,
    },
}

impl Master {
    /// The shape of this master's windows (every shard has the same config).
    fn shape(&self) -> Shape {
        Shape::of(&self.lock(0).config().window)
    }

    /// Writes every window to `path` (atomically: a temporary file renamed
    /// into place). Returns how many (account, op) windows were written.
    pub fn write_snapshot(&self, path: &Path) -> Result<usize, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.display().to_string(),
            source,
        };
        let now = self.shared.clock.now();
        let keys = (0..self.shared.shards.len())
            .flat_map(|shard| self.lock(shard).export(now))
            .collect();
        let file = SnapshotFile {
            format: FORMAT,
            written_unix_ms: now.as_millis(),
            window: self.shape(),
            keys,
        };
        let written = file.keys.len();
        let tmp = path.with_extension("tmp");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        serde_json::to_writer(&mut out, &file).map_err(|e| io(e.into()))?;
        let out = out.into_inner().map_err(|e| io(e.into_error()))?;
        out.sync_all().map_err(io)?;
        drop(out);
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(written)
    }

    /// Loads the windows of a snapshot at `path` written at most `max_age`
    /// ago, for (account, op) pairs this master does not track yet. Returns
    /// how many were loaded. On any error nothing is loaded.
    pub fn load_snapshot(&self, path: &Path, max_age: Duration) -> Result<usize, SnapshotError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| SnapshotError::Io {
            path: name.clone(),
            source,
        })?;
        let corrupt = |reason: String| SnapshotError::Corrupt {
            path: name.clone(),
            reason,
        };
        let file: SnapshotFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.format != FORMAT {
            return Err(corrupt(format!(
                "format {} (this build reads {FORMAT})",
                file.format
            )));
        }
        let now = self.shared.clock.now();
        let age = now.since(Nanos::from_millis(file.written_unix_ms));
        if age > max_age {
            return Err(SnapshotError::TooOld {
                path: name,
                age_ms: age.as_millis() as u64,
                max_ms: max_age.as_millis() as u64,
            });
        }
        let expected = self.shape();
        if file.window != expected {
            return Err(SnapshotError::OtherShape {
                path: name,
                found: format!("{:?}", file.window),
                expected: format!("{expected:?}"),
            });
        }
        let mut by_shard: Vec<Vec<KeySnapshot>> = vec![Vec::new(); self.shared.shards.len()];
        for key in file.keys {
            by_shard[self.shard(&key.account)].push(key);
        }
        Ok(by_shard
            .into_iter()
            .enumerate()
            .map(|(shard, keys)| self.lock(shard).import(keys))
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use damper_core::config::MasterConfig;
    use damper_core::time::{Clock, ManualClock};
    use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};

    use super::*;
    use crate::MasterOptions;

    const T0_MS: u64 = 1_800_000_000_000;

    fn master(clock: &Arc<ManualClock>, window: &str) -> Master {
        let toml = format!("{window}\n[limits]\nmessages = 1000\n");
        Master::with_clock(
            MasterConfig::from_toml(&toml).unwrap(),
            MasterOptions::default(),
            clock.clone(),
        )
    }

    /// 4000/s on `flood` for 12 s, in 2 s rollups.
    fn flood(m: &Master, clock: &ManualClock) {
        for end in (2_000..=12_000).step_by(2_000) {
            clock.set(Nanos::from_millis(T0_MS + end + 5));
            let request = RollupRequest {
                agent_id: "a".into(),
                ring_version: 0,
                interval_start_unix_ms: T0_MS + end - 2_000,
                interval_end_unix_ms: T0_MS + end,
                ops: vec![OpCounts {
                    op_costs: Vec::new(),
                    op_counts: Vec::new(),
                    attempted: Vec::new(),
                    ids: Vec::new(),
                    rejected: Vec::new(),
                    op: "messages".into(),
                    accounts: vec![AccountCounts {
                        op_cost: 0,
                        ops: 0,
                        id: 0,
                        account: "flood".into(),
                        attempted: 8_000,
                        admitted: 8_000,
                        start_unix_ms: 0,
                    }],
                }],
                ..Default::default()
            };
            m.rollup(&request).unwrap();
        }
    }

    /// A scratch directory, removed with what the test wrote when dropped.
    fn dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("damper-snapshot-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_restarted_master_answers_from_the_snapshot_at_once() {
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS)));
        let before = master(&clock, "");
        flood(&before, &clock);
        let factor = before.factor("flood", "messages").unwrap();
        assert!((factor - 0.75).abs() < 1e-9, "{factor}");
        let dir = dir();
        let path = dir.path().join("a.json");
        assert_eq!(before.write_snapshot(&path).unwrap(), 1);

        // Three seconds of restart later.
        clock.set(clock.now() + Duration::from_secs(3));
        let after = master(&clock, "");
        assert_eq!(after.factor("flood", "messages"), Some(0.0), "amnesia");
        let loaded = after.load_snapshot(&path, Duration::from_secs(60)).unwrap();
        assert_eq!(loaded, 1);
        assert_eq!(
            after.factor("flood", "messages"),
            before.factor("flood", "messages")
        );
        assert!(after.factor("flood", "messages").unwrap() > 0.7);
    }

    #[test]
    fn bad_old_or_mismatched_snapshots_are_refused_and_load_nothing() {
        let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS)));
        let m = master(&clock, "");
        flood(&m, &clock);
        let scratch = dir();
        let dir = scratch.path();
        let good = dir.join("good.json");
        m.write_snapshot(&good).unwrap();
        let max = Duration::from_secs(60);

        let missing = master(&clock, "").load_snapshot(&dir.join("none.json"), max);
        assert!(
            matches!(missing, Err(SnapshotError::Io { .. })),
            "{missing:?}"
        );

        let text = std::fs::read_to_string(&good).unwrap();
        for (name, body) in [
            ("empty", String::new()),
            ("truncated", text[..text.len() / 2].to_string()),
            ("garbage", "\u{0}\u{1}not json".to_string()),
            (
                "format",
                text.replacen(&format!("\"format\":{FORMAT}"), "\"format\":99", 1),
            ),
            (
                "shape",
                text.replacen("\"sub_intervals\":4", "\"sub_intervals\":\"x\"", 1),
            ),
        ] {
            let path = dir.join(format!("{name}.json"));
            std::fs::write(&path, body).unwrap();
            let fresh = master(&clock, "");
            let e = fresh.load_snapshot(&path, max).unwrap_err();
            assert!(matches!(e, SnapshotError::Corrupt { .. }), "{name}: {e}");
            assert!(e.to_string().contains(&*path.display().to_string()), "{e}");
            assert!(fresh.is_empty(), "{name}");
        }

        let other = master(&clock, "[window]\nsub_intervals = 5");
        let e = other.load_snapshot(&good, max).unwrap_err();
        assert!(matches!(e, SnapshotError::OtherShape { .. }), "{e}");
        assert!(other.is_empty());

        clock.set(clock.now() + Duration::from_secs(61));
        let late = master(&clock, "");
        let e = late.load_snapshot(&good, max).unwrap_err();
        assert!(matches!(e, SnapshotError::TooOld { .. }), "{e}");
        assert!(late.is_empty());
    }
}
