//! [`Exemptions`]: accounts that are never limited, as the `[exempt]` table
//! lists them.
//!
//! ```toml
//! [exempt]
//! accounts = ["acme", "org/vip"]   # every op, with everything under them
//! messages = ["partner"]           # messages only
//! ```
//!
//! An exempt account's demand is still tracked and shown, but its factor is
//! always 0 and agents are told it has no limit, so their local guard never
//! refuses it either. An entry covers the account it names and every
//! account under it (`org/vip` covers `org/vip/team`), at `/` boundaries as
//! limit keys do. A limit that names an exempt account, or one under it, for
//! an op the exemption covers could never apply: the config is refused,
//! naming both, rather than leaving which one wins to be guessed.

use std::collections::BTreeMap;

use crate::config::ConfigError;
use crate::limits::Limits;

/// The `[exempt]` table as written in a file: `accounts` (every op) or an
/// op's name, to the account paths exempted.
pub type ExemptSection = BTreeMap<String, Vec<String>>;

/// The key of `[exempt]` that exempts accounts from every op.
pub const EVERY_OP: &str = "accounts";

/// Which accounts are exempt, validated. Empty by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exemptions {
    every_op: Vec<Box<str>>,
    by_op: BTreeMap<Box<str>, Vec<Box<str>>>,
}

/// Whether `path` is `prefix` or under it, at a `/` boundary.
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl Exemptions {
    /// Validates `section` against `limits`.
    pub fn new(section: &ExemptSection, limits: &Limits) -> Result<Exemptions, ConfigError> {
        let mut exemptions = Exemptions::default();
        for (key, accounts) in section {
            let mut list = Vec::with_capacity(accounts.len());
            for (i, account) in accounts.iter().enumerate() {
                let field = format!("exempt.{key}[{i}]");
                if account.is_empty() || account.split('/').any(str::is_empty) {
                    return Err(ConfigError::invalid(
                        &field,
                        format!(
                            "{account:?} is not an account path: no empty segments, no leading, trailing or double '/'"
                        ),
                    ));
                }
                if account.len() > crate::MAX_NAME_LEN {
                    return Err(ConfigError::invalid(
                        &field,
                        format!("an account is at most {} bytes", crate::MAX_NAME_LEN),
                    ));
                }
                list.push(account.as_str().into());
            }
            if key == EVERY_OP {
                exemptions.every_op = list;
            } else if key.is_empty() || key.contains('/') {
                return Err(ConfigError::invalid(
                    &format!("exempt.{key}"),
                    "a key of [exempt] is `accounts` (every op) or an op's name",
                ));
            } else {
                exemptions.by_op.insert(key.as_str().into(), list);
            }
        }
        for (key, _) in limits.iter() {
            if let Some((op, account)) = key.split_once('/')
                && let Some(exempt) = exemptions.covers(account, op)
            {
                return Err(ConfigError::invalid(
                    &format!("limits.\"{key}\""),
                    format!(
                        "{account:?} is exempt on {op} (exempt entry {exempt:?}): a limit on it could never apply; remove one of the two"
                    ),
                ));
            }
        }
        Ok(exemptions)
    }

    /// The entry that exempts `account` from `op`, if any.
    pub fn covers(&self, account: &str, op: &str) -> Option<&str> {
        self.prefixes(op).find(|prefix| under(account, prefix))
    }

    /// The account paths exempt from `op`: those exempt from every op, and
    /// those listed for it.
    pub fn prefixes<'a>(&'a self, op: &str) -> impl Iterator<Item = &'a str> + 'a {
        let by_op = self.by_op.get(op).into_iter().flatten();
        self.every_op.iter().chain(by_op).map(|p| &**p)
    }

    /// Whether nothing is exempt.
    pub fn is_empty(&self) -> bool {
        self.every_op.is_empty() && self.by_op.values().all(Vec::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(entries: &[(&str, &[&str])]) -> ExemptSection {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn entries_cover_their_account_and_what_is_under_it_for_their_ops() {
        let limits = Limits::new([("messages", 1000.0), ("presence", 10.0)]).unwrap();
        let e = Exemptions::new(
            &section(&[("accounts", &["org/vip"]), ("messages", &["partner"])]),
            &limits,
        )
        .unwrap();
        assert_eq!(e.covers("org/vip", "presence"), Some("org/vip"));
        assert_eq!(e.covers("org/vip/team", "messages"), Some("org/vip"));
        assert_eq!(e.covers("org/vipx", "messages"), None);
        assert_eq!(e.covers("org", "messages"), None);
        assert_eq!(e.covers("partner", "messages"), Some("partner"));
        assert_eq!(e.covers("partner", "presence"), None);
    }

    #[test]
    fn a_limit_on_an_exempt_account_and_bad_entries_are_refused_naming_them() {
        let limits = Limits::new([("messages", 1000.0), ("messages/org/vip/team", 50.0)]).unwrap();
        let e = Exemptions::new(&section(&[("accounts", &["org/vip"])]), &limits)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("limits.\"messages/org/vip/team\"") && e.contains("org/vip"),
            "{e}"
        );
        let ok = Limits::new([("messages", 1000.0)]).unwrap();
        for (bad, field) in [
            (
                section(&[("accounts", &["org//vip"])]),
                "exempt.accounts[0]",
            ),
            (section(&[("messages", &["a", ""])]), "exempt.messages[1]"),
            (section(&[("messages/x", &["a"])]), "exempt.messages/x"),
        ] {
            let e = Exemptions::new(&bad, &ok).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
