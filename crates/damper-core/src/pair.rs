//! One (account, op): what a limit applies to, a factor is computed for,
//! and a count is kept under. Written account first everywhere.

/// An (account, op), borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pair<'a> {
    /// The account id, 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    pub account: &'a str,
    /// The operation, 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    pub op: &'a str,
}

/// An (account, op), owned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnedPair {
    /// The account id.
    pub account: String,
    /// The operation.
    pub op: String,
}

impl<'a> Pair<'a> {
    /// The pair of `account` and `op`.
    pub fn new(account: &'a str, op: &'a str) -> Pair<'a> {
        Pair { account, op }
    }

    /// An owned copy.
    pub fn to_owned(self) -> OwnedPair {
        OwnedPair {
            account: self.account.to_owned(),
            op: self.op.to_owned(),
        }
    }
}

impl OwnedPair {
    /// Borrowed.
    pub fn as_pair(&self) -> Pair<'_> {
        Pair {
            account: &self.account,
            op: &self.op,
        }
    }
}

impl std::fmt::Display for Pair<'_> {
    /// `account/op`, as logs show a pair.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.account, self.op)
    }
}
