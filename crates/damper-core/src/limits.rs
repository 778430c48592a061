//! Limits per operation, with per-account overrides, looked up by
//! hierarchical key.
//!
//! A limit key is an op name, optionally followed by `/` and an account path:
//! `messages` is the default for every account, `messages/acme` overrides it
//! for account `acme`, and `messages/org` overrides it for every account whose
//! id starts with `org/` (`org/team`, `org/team/x`, …). The most specific key
//! wins: for account `org/team` and op `messages` the probes are
//! `messages/org/team`, then `messages/org`, then `messages`. An (account, op)
//! no key matches has no limit and is never suppressed.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;

/// A rate in cost per second: finite and greater than zero by construction.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

impl Rate {
    /// No limit: what an exempt account is told (`f64::MAX`, finite, so
    /// arithmetic on it stays finite; agents read it as no limit at all).
    pub const UNLIMITED: Rate = Rate(f64::MAX);

    /// Whether this is [`UNLIMITED`](Self::UNLIMITED).
    pub fn is_unlimited(self) -> bool {
        self.0 == f64::MAX
    }

    /// A rate of `per_second`, if it is finite and greater than zero.
    pub fn per_second(per_second: f64) -> Option<Rate> {
        (per_second.is_finite() && per_second > 0.0).then_some(Rate(per_second))
    }

    /// The rate in cost per second.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.0)
    }
}

/// Which configured limit applied to an (account, op): its key and rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitMatch<'a> {
    /// The key that matched, such as `messages/acme` or `messages`.
    pub key: &'a str,
    /// The limit.
    pub rate: Rate,
    /// Where the key sits in its [`Limits`]: lets callers cache the match
    /// and get it back with [`Limits::get`].
    pub id: LimitId,
    /// Whether the limit is in shadow (`[shadow]`): computed and reported
    /// as usual, but agents admit what it would refuse, and say so.
    pub shadow: bool,
}

/// The most keys one [`Limits`] holds (2^24 − 1): a master entry keeps
/// the [`LimitId`] of its pair's match in 24 bits of a word it shares with
/// the op, the flags and the report time (16.7 million keys is some
/// thousand times more than the largest configs the project has seen).
pub const MAX_LIMIT_KEYS: usize = (1 << 24) - 1;

/// Position of a key in one [`Limits`] value (not stable across reloads),
/// plus one: never zero, and below 2^24, so a master entry keeps an
/// `Option<LimitId>` in 24 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitId(NonZeroU32);

impl LimitId {
    fn new(position: usize) -> Option<LimitId> {
        (position < MAX_LIMIT_KEYS)
            .then(|| NonZeroU32::new(position as u32 + 1))
            .flatten()
            .map(LimitId)
    }

    fn position(self) -> usize {
        self.0.get() as usize - 1
    }

    /// Its bits: from 1 to [`MAX_LIMIT_KEYS`].
    pub(crate) fn bits(self) -> u32 {
        self.0.get()
    }

    /// The id whose [`bits`](Self::bits) are `bits`; `None` for 0.
    pub(crate) fn from_bits(bits: u32) -> Option<LimitId> {
        debug_assert!(bits as usize <= MAX_LIMIT_KEYS);
        NonZeroU32::new(bits).map(LimitId)
    }
}

/// Why a set of limits was refused: the field at fault (`limits."KEY"`)
/// and what is wrong. The config turns it into its own error, with the
/// line of the file.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("invalid `{field}`: {reason}")]
#[non_exhaustive]
pub struct LimitsError {
    /// Dotted path of the field.
    pub field: String,
    /// What is wrong and what is allowed.
    pub reason: String,
}

fn invalid(field: &str, reason: impl Into<String>) -> LimitsError {
    LimitsError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// The configured limits, validated. Build with [`Limits::new`] or from the
/// `[limits]` table of a config file.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    entries: Vec<(Box<str>, Rate, bool)>,
    by_key: HashMap<Box<str>, LimitId>,
}

impl Limits {
    /// Limits from `(key, cost per second)` pairs. Errors name the key.
    pub fn new<K: AsRef<str>>(
        entries: impl IntoIterator<Item = (K, f64)>,
    ) -> Result<Limits, LimitsError> {
        let mut limits = Limits::default();
        for (key, rate) in entries {
            let key = key.as_ref();
            let field = format!("limits.\"{key}\"");
            validate_key(key).map_err(|reason| invalid(&field, reason))?;
            let rate = Rate::per_second(rate).ok_or_else(|| {
                invalid(
                    &field,
                    format!("limit must be a finite number greater than zero, got {rate}"),
                )
            })?;
            match limits.by_key.get(key) {
                Some(id) => limits.entries[id.position()].1 = rate,
                None => {
                    let id = LimitId::new(limits.entries.len()).ok_or_else(|| {
                        invalid(
                            "limits",
                            format!("at most {MAX_LIMIT_KEYS} limit keys (2^24 - 1)"),
                        )
                    })?;
                    limits.entries.push((key.into(), rate, false));
                    limits.by_key.insert(key.into(), id);
                }
            }
        }
        Ok(limits)
    }

    /// The key and rate of a match found earlier in this same value.
    pub fn get(&self, id: LimitId) -> Option<LimitMatch<'_>> {
        self.entries
            .get(id.position())
            .map(|(key, rate, shadow)| LimitMatch {
                key,
                rate: *rate,
                id,
                shadow: *shadow,
            })
    }

    /// Puts the limit of `key` in shadow; `false` when no such key.
    pub fn set_shadow(&mut self, key: &str) -> bool {
        match self.by_key.get(key) {
            Some(id) => {
                self.entries[id.position()].2 = true;
                true
            }
            None => false,
        }
    }

    /// The limit of `op` itself (the key `op`, without an account path):
    /// what applies to every account of it that no more specific key names.
    /// `None` when only some accounts of `op` are limited, or none.
    ///
    /// ```
    /// # use damper_core::limits::Limits;
    /// let limits = Limits::new([("messages", 1000.0), ("presence/acme", 10.0)]).unwrap();
    /// assert_eq!(limits.op_limit("messages").map(|r| r.get()), Some(1000.0));
    /// assert!(limits.op_limit("presence").is_none());
    /// ```
    pub fn op_limit(&self, op: &str) -> Option<Rate> {
        self.op_match(op).map(|m| m.rate)
    }

    /// The match of `op` itself, its key, rate and shadow flag: what
    /// [`op_limit`](Self::op_limit) gives the rate of.
    pub fn op_match(&self, op: &str) -> Option<LimitMatch<'_>> {
        self.by_key.get(op).and_then(|id| self.get(*id))
    }

    /// The limit for `account` doing `op`: the most specific key that matches.
    ///
    /// ```
    /// # use damper_core::limits::Limits;
    /// let limits = Limits::new([("messages", 1000.0), ("messages/org", 5000.0)]).unwrap();
    /// let hit = limits.lookup("org/team", "messages").unwrap();
    /// assert_eq!((hit.key, hit.rate.get()), ("messages/org", 5000.0));
    /// assert!(limits.lookup("acme", "presence").is_none());
    /// ```
    pub fn lookup(&self, account: &str, op: &str) -> Option<LimitMatch<'_>> {
        if self.by_key.is_empty() {
            return None;
        }
        let mut probe = String::with_capacity(op.len() + 1 + account.len());
        probe.push_str(op);
        probe.push('/');
        probe.push_str(account);
        // `messages/org/team`, `messages/org`, then `messages`.
        let mut end = probe.len();
        loop {
            if let Some(id) = self.by_key.get(&probe[..end]) {
                return self.get(*id);
            }
            if end == op.len() {
                return None;
            }
            end = probe[op.len()..end]
                .rfind('/')
                .map(|slash| op.len() + slash)
                .expect("the probe contains the '/' after the op");
        }
    }

    /// Number of configured keys.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no limit is configured (nothing is ever suppressed).
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The ops that have a limit of their own (a key with no account path),
    /// in no particular order.
    pub fn default_ops(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .map(|(k, _, _)| &**k)
            .filter(|k| !k.contains('/'))
    }

    /// The overrides of `op`: for each key `op/account`, the account path,
    /// its limit and whether it is in shadow, in no particular order.
    pub fn overrides<'a>(
        &'a self,
        op: &'a str,
    ) -> impl Iterator<Item = (&'a str, Rate, bool)> + 'a {
        self.entries.iter().filter_map(move |(k, rate, shadow)| {
            let account = k.strip_prefix(op)?.strip_prefix('/')?;
            Some((account, *rate, *shadow))
        })
    }

    /// The keys whose limit is in shadow, in no particular order.
    pub fn shadowed(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|(_, _, shadow)| *shadow)
            .map(|(k, _, _)| &**k)
    }

    /// The configured `(key, rate)` pairs, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Rate)> {
        self.entries.iter().map(|(k, r, _)| (&**k, *r))
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("a limit key must name an operation".into());
    }
    if key.split('/').any(str::is_empty) {
        return Err("a limit key has no empty segments: no leading, trailing or double '/'".into());
    }
    if key.len() > crate::MAX_NAME_LEN * 2 + 1 {
        return Err(format!(
            "a limit key is at most {} bytes",
            crate::MAX_NAME_LEN * 2 + 1
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A master entry keeps a match's id in 24 bits: ids stop there, and
    /// read back from their bits.
    #[test]
    fn ids_fit_in_24_bits_and_read_back() {
        let last = LimitId::new(MAX_LIMIT_KEYS - 1).expect("the last position");
        assert_eq!(last.bits() as usize, MAX_LIMIT_KEYS);
        assert!(last.bits() < 1 << 24);
        assert_eq!(LimitId::from_bits(last.bits()), Some(last));
        assert_eq!(LimitId::new(MAX_LIMIT_KEYS), None);
        let first = LimitId::new(0).unwrap();
        assert_eq!((first.bits(), LimitId::from_bits(0)), (1, None));
        assert_eq!(LimitId::from_bits(first.bits()), Some(first));
    }

    fn limits() -> Limits {
        Limits::new([
            ("messages", 1000.0),
            ("messages/acme", 5000.0),
            ("messages/org", 200.0),
            ("messages/org/team", 300.0),
            ("presence/org/team", 7.0),
        ])
        .unwrap()
    }

    #[test]
    fn most_specific_key_wins() {
        let l = limits();
        let get = |account, op| l.lookup(account, op).map(|m| (m.key, m.rate.get()));
        assert_eq!(get("acme", "messages"), Some(("messages/acme", 5000.0)));
        assert_eq!(get("other", "messages"), Some(("messages", 1000.0)));
        assert_eq!(get("org", "messages"), Some(("messages/org", 200.0)));
        assert_eq!(get("org/x", "messages"), Some(("messages/org", 200.0)));
        assert_eq!(
            get("org/team", "messages"),
            Some(("messages/org/team", 300.0))
        );
        assert_eq!(
            get("org/team/x/y", "messages"),
            Some(("messages/org/team", 300.0))
        );
        assert_eq!(
            get("org/team", "presence"),
            Some(("presence/org/team", 7.0))
        );
        // No default for presence: other accounts are unlimited.
        assert_eq!(get("org", "presence"), None);
        assert_eq!(get("acme", "connections"), None);
    }

    #[test]
    fn prefixes_match_only_at_slash_boundaries() {
        let l = limits();
        // `organic` is not under `org`.
        assert_eq!(l.lookup("organic", "messages").unwrap().key, "messages");
        // `acme2` is not `acme`.
        assert_eq!(l.lookup("acme2", "messages").unwrap().key, "messages");
        // An op named like a prefix of another op does not match it.
        assert!(l.lookup("acme", "message").is_none());
    }

    #[test]
    fn invalid_limits_name_the_key() {
        for (key, rate, needle) in [
            ("messages", 0.0, "greater than zero"),
            ("messages", -5.0, "greater than zero"),
            ("messages", f64::NAN, "finite"),
            ("messages", f64::INFINITY, "finite"),
            ("", 10.0, "name an operation"),
            ("messages//acme", 10.0, "empty segments"),
            ("messages/", 10.0, "empty segments"),
        ] {
            let err = Limits::new([(key, rate)]).unwrap_err().to_string();
            assert!(err.contains(&format!("limits.\"{key}\"")), "{err}");
            assert!(err.contains(needle), "{err}");
        }
    }

    /// The reference: every key that is the op, or the op plus a prefix of
    /// the account that ends at a '/' boundary, is a candidate; the longest wins.
    fn reference(keys: &[(String, f64)], account: &str, op: &str) -> Option<(String, f64)> {
        let segments: Vec<&str> = account.split('/').collect();
        let mut candidates = vec![op.to_string()];
        for n in 1..=segments.len() {
            candidates.push(format!("{op}/{}", segments[..n].join("/")));
        }
        candidates
            .into_iter()
            .rev()
            .find_map(|c| keys.iter().rev().find(|(k, _)| *k == c).cloned())
    }

    proptest! {
        #[test]
        fn lookup_order_matches_reference(
            keys in proptest::collection::vec(
                ("(m|p)(/(a|b|c)){0,3}", 1.0f64..1e6), 0..12),
            account in "(a|b|c|ab)(/(a|b|c)){0,3}",
            op in "m|p",
        ) {
            let limits = Limits::new(keys.iter().map(|(k, r)| (k.as_str(), *r))).unwrap();
            let got = limits.lookup(&account, &op).map(|m| (m.key.to_string(), m.rate.get()));
            prop_assert_eq!(got, reference(&keys, &account, &op));
        }
    }
}
