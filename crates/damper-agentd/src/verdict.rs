//! The one decision every front door asks for: [`Sidecar::check`] turns the
//! agent's [`Decision`] into a [`Verdict`] each protocol can say, after
//! refusing what the masters would refuse (bad names) so that nothing
//! malformed is counted.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use damper_agent::{Decision, Publisher, RejectSource, Standing};
use damper_core::MAX_NAME_LEN;
use damper_core::wire::{ReportError, validate_name};

use crate::Sidecar;

/// Whose factor refused an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The account's master, from its demand on every node.
    AccountLimit,
    /// This node alone attempts more than the account's whole limit.
    LocalGuard,
}

impl Reason {
    /// The name front doors print (`account_limit`, `local_guard`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AccountLimit => "account_limit",
            Reason::LocalGuard => "local_guard",
        }
    }

    /// The reason for a rejection from `source`.
    pub fn of(source: RejectSource) -> Reason {
        match source {
            RejectSource::LocalGuard => Reason::LocalGuard,
            _ => Reason::AccountLimit,
        }
    }
}

/// A decision as the front doors report it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Verdict {
    /// Whether to go ahead.
    pub admitted: bool,
    /// The suppression factor in force (the share of the account's
    /// attempted cost refused); 0 when nothing is suppressed.
    pub factor: f64,
    /// The account-wide limit, cost per second; 0 when none is known.
    pub limit: f64,
    /// When refused, the soonest the factor can change; zero when admitted.
    pub retry_after: Duration,
    /// When refused, whose factor refused it; when admitted under a limit
    /// in shadow that would have refused it (`would_reject`), whose factor
    /// would have.
    pub reason: Option<Reason>,
    /// Admitted, but a limit in shadow would have refused it.
    pub would_reject: bool,
    /// The account's demand over its limit as its master said it, for
    /// accounts at or above the near share of their limit
    /// ([`Admitted::utilisation`](damper_agent::Admitted)); `None` below it
    /// or when unknown.
    pub utilisation: Option<f32>,
    /// While the factor is positive, the demand it came from, cost per
    /// second over every node ([`Rejection::demand`]); 0 otherwise.
    ///
    /// [`Rejection::demand`]: damper_agent::Rejection::demand
    pub demand: f64,
}

/// A request that cannot be decided, and is not counted.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadInput {
    /// An account or op name is empty.
    #[error("{field} is empty")]
    Empty {
        /// `account` or `op`, as the front door names it.
        field: String,
    },
    /// An account or op name is longer than the masters accept.
    #[error("{field} is {len} bytes long; the limit is {MAX_NAME_LEN}")]
    TooLong {
        /// `account` or `op`, as the front door names it.
        field: String,
        /// Its length in bytes.
        len: usize,
    },
}

impl BadInput {
    /// The same error under a longer field name (`checks[3].` + `account`).
    pub fn within(self, prefix: &str) -> BadInput {
        match self {
            BadInput::Empty { field } => BadInput::Empty {
                field: format!("{prefix}{field}"),
            },
            BadInput::TooLong { field, len } => BadInput::TooLong {
                field: format!("{prefix}{field}"),
                len,
            },
        }
    }
}

/// Checks a name by the masters' own rule ([`validate_name`]), naming
/// `field` (which may be indexed, `checks[3].account`) when it fails.
pub fn name(field: &str, value: &str) -> Result<(), BadInput> {
    validate_name("name", value).map_err(|e| match e {
        ReportError::TooLong { len, .. } => BadInput::TooLong {
            field: field.into(),
            len,
        },
        // `Empty`, the only other error a name can have.
        _ => BadInput::Empty {
            field: field.into(),
        },
    })
}

impl Sidecar {
    /// Checks the names, then decides one operation of `cost` and counts
    /// it, as [`damper_agent::Agent::check`] does, or, when the client
    /// names its `publisher`, as [`damper_agent::Agent::check_from`] does
    /// (publishers of one account each keep their share). A cost of 0 is
    /// admitted and not counted.
    pub fn check(
        &self,
        account: &str,
        op: &str,
        cost: u64,
        publisher: Option<&str>,
    ) -> Result<Verdict, BadInput> {
        validate(account, op)?;
        validate_publisher(publisher)?;
        Ok(self.decide(account, op, cost, publisher))
    }

    /// Decides names already checked with [`validate`] and
    /// [`validate_publisher`].
    pub(crate) fn decide(
        &self,
        account: &str,
        op: &str,
        cost: u64,
        publisher: Option<&str>,
    ) -> Verdict {
        let decision = match publisher {
            None => self.agent().check(account, op, cost),
            Some(name) => self
                .agent()
                .check_from(account, op, cost, publisher_of(name)),
        };
        let verdict = match decision {
            Decision::Reject(r) => Verdict {
                admitted: false,
                factor: r.factor,
                limit: r.limit,
                retry_after: r.retry_after,
                reason: Some(Reason::of(r.source)),
                would_reject: false,
                utilisation: Some((r.demand / r.limit) as f32).filter(|u| u.is_finite()),
                demand: r.demand,
            },
            // Admitted (and whatever a later library version adds): under
            // a limit in shadow, the refusal it would have been; otherwise
            // what is in force, so a client can warn before refusals start.
            _ => match decision.shadow_refusal() {
                Some(r) => Verdict {
                    admitted: true,
                    factor: r.factor,
                    limit: r.limit,
                    retry_after: Duration::ZERO,
                    reason: Some(Reason::of(r.source)),
                    would_reject: true,
                    utilisation: decision.utilisation(),
                    demand: r.demand,
                },
                None => {
                    let standing = self.agent().peek(account, op);
                    Verdict {
                        admitted: true,
                        factor: standing.factor,
                        limit: standing.limit,
                        retry_after: Duration::ZERO,
                        reason: None,
                        would_reject: false,
                        utilisation: decision.utilisation(),
                        // As a refusal would say it (`Rejection::demand`).
                        demand: damper_agent::implied_demand(standing.limit, standing.factor),
                    }
                }
            },
        };
        crate::metrics::decided(&verdict);
        verdict
    }

    /// What an (account, op) stands at, counting nothing.
    pub fn peek(&self, account: &str, op: &str) -> Result<Standing, BadInput> {
        validate(account, op)?;
        Ok(self.agent().peek(account, op))
    }
}

/// Checks an (account, op) pair's names.
pub fn validate(account: &str, op: &str) -> Result<(), BadInput> {
    name("account", account)?;
    name("op", op)
}

/// Checks a publisher's name, when one is given: 1 to 256 bytes, as an
/// account's.
pub fn validate_publisher(publisher: Option<&str>) -> Result<(), BadInput> {
    publisher.map_or(Ok(()), |p| name("publisher", p))
}

/// The agent's key for the publisher a client names: a hash of the name,
/// the same for the same name for the life of the process (publishers
/// whose names collide share a lane, which costs fairness only).
fn publisher_of(name: &str) -> Publisher {
    let mut hasher = std::hash::DefaultHasher::new();
    name.hash(&mut hasher);
    Publisher::new(hasher.finish())
}
