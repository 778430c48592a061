//! The `[shadow]` table: limits tried out without refusing anything.
//!
//! ```toml
//! [shadow]
//! limits = ["messages/acme"]   # these keys of [limits]
//! ops = ["presence"]           # every limit of these ops
//! ```
//!
//! A limit in shadow is computed, reported and sent to the agents as any
//! other, so an operator sees exactly what it would do; but `check` admits
//! what it would refuse, and its admitted decision carries the refusal it
//! would have been ([`Admitted::would_reject`](crate::agent::Admitted)).
//! The master's events and metrics tell would-be suppression apart from
//! real. A reload moves a limit in or out of shadow at the pair's next
//! report, its window kept.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::limits::Limits;

/// The `[shadow]` table as written in a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ShadowSection {
    /// Keys of `[limits]` whose limit is in shadow: the key names one limit
    /// exactly, so `messages` is the op's default only, not its overrides.
    pub limits: Vec<String>,
    /// Ops every limit of which (the default and every override) is in
    /// shadow: trying a whole op out, or taking it out of enforcement at
    /// once.
    pub ops: Vec<String>,
}

impl ShadowSection {
    /// Puts the limits this table names in shadow. A name that matches no
    /// limit is refused, naming the entry: a typo would otherwise enforce
    /// a limit its operator meant only to watch.
    pub fn apply(&self, limits: &mut Limits) -> Result<(), ConfigError> {
        for (i, key) in self.limits.iter().enumerate() {
            if !limits.set_shadow(key) {
                return Err(ConfigError::invalid(
                    &format!("shadow.limits[{i}]"),
                    format!(
                        "{key:?} is not a key of [limits]: only a configured limit can be in shadow"
                    ),
                ));
            }
        }
        for (i, op) in self.ops.iter().enumerate() {
            let keys: Vec<String> = limits
                .iter()
                .map(|(key, _)| key)
                .filter(|key| key.split('/').next() == Some(op.as_str()))
                .map(str::to_owned)
                .collect();
            if keys.is_empty() {
                return Err(ConfigError::invalid(
                    &format!("shadow.ops[{i}]"),
                    format!("op {op:?} has no limit in [limits]: nothing to put in shadow"),
                ));
            }
            for key in keys {
                limits.set_shadow(&key);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::MasterConfig;

    fn config(text: &str) -> Result<MasterConfig, String> {
        MasterConfig::from_toml(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_key_puts_that_limit_in_shadow_and_an_op_every_limit_of_it() {
        let c = config(
            "[limits]\nmessages = 10\n\"messages/acme\" = 50\npresence = 5\n\"presence/org\" = 7\n\
             [shadow]\nlimits = [\"messages/acme\"]\nops = [\"presence\"]\n",
        )
        .unwrap();
        let shadow = |account, op| c.limits.lookup(account, op).unwrap().shadow;
        assert!(shadow("acme", "messages"));
        assert!(!shadow("other", "messages"));
        assert!(shadow("org/team", "presence"));
        assert!(shadow("other", "presence"));
        assert!(!c.limits.op_match("messages").unwrap().shadow);
        assert!(c.limits.op_match("presence").unwrap().shadow);
    }

    #[test]
    fn names_that_match_no_limit_are_refused_naming_the_entry() {
        let e = config("[limits]\nmessages = 10\n[shadow]\nlimits = [\"messages/acme\"]\n")
            .unwrap_err();
        assert!(
            e.contains("shadow.limits[0]") && e.contains("messages/acme"),
            "{e}"
        );
        let e = config("[limits]\nmessages = 10\n[shadow]\nops = [\"messages\", \"mess\"]\n")
            .unwrap_err();
        assert!(e.contains("shadow.ops[1]") && e.contains("\"mess\""), "{e}");
        let e = config("[shadow]\nlimit = [\"messages\"]\n").unwrap_err();
        assert!(e.contains("limit"), "{e}");
    }
}
