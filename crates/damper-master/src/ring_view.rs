//! The master's view of the ring: which accounts it owns, so it can tell
//! an agent that routes by a different view (most likely one with a master
//! down that the others see up) to heal it.

use damper_core::ring::Ring;
use damper_core::wire::Rollup;

use crate::Master;

/// The ring the masters form, as this master was told it, and its own
/// address in it.
pub(crate) struct RingView {
    pub(crate) ring: Ring,
    me: String,
}

/// Why a ring view was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingViewError {
    /// This master is not among the members.
    #[error("this master's address {me:?} is not one of the ring's members {members:?}")]
    NotAMember {
        /// The address given for this master.
        me: String,
        /// The members given.
        members: Vec<String>,
    },
    /// A view was set already.
    #[error("the ring view is already set")]
    AlreadySet,
}

impl RingView {
    /// This master's address in the ring.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// The other members.
    pub(crate) fn peers(&self) -> impl Iterator<Item = &str> {
        self.ring.members().filter(move |m| *m != self.me)
    }
}

impl Master {
    /// Tells this master the ring the masters form (every configured master,
    /// as agents address them) and its own address in it. It then counts the
    /// entries of rollups for accounts it does not own and says so in the
    /// reply, with its ring version, so agents whose view differs heal it.
    pub fn set_ring(&self, members: &[String], me: &str) -> Result<(), RingViewError> {
        if !members.iter().any(|m| m == me) {
            return Err(RingViewError::NotAMember {
                me: me.to_string(),
                members: members.to_vec(),
            });
        }
        self.shared
            .ring
            .set(RingView {
                ring: Ring::new(members),
                me: me.to_string(),
            })
            .map_err(|_| RingViewError::AlreadySet)
    }

    /// How many of the request's entries are for accounts this master does
    /// not own, when the agent's ring differs from this master's (`None`
    /// when it is the same, or no ring is set).
    pub(crate) fn foreign_entries(&self, request: &Rollup) -> Option<usize> {
        let view = self.shared.ring.get()?;
        (request.ring_version != view.ring.version()).then(|| {
            request
                .ops
                .iter()
                .flat_map(|op| &op.accounts)
                .filter(|c| view.ring.owner(&c.account) != Some(view.me.as_str()))
                .count()
        })
    }
}
