//! Newtypes for the identifiers that travel in packets, so a sequence
//! number can never be passed where a client id is expected.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:016x}", self.0)
            }
        }

        impl $name {
            /// A fresh random identifier (never zero: zero means "unknown").
            pub fn random() -> Self {
                loop {
                    let v: u64 = rand::random();
                    if v != 0 {
                        return Self(v);
                    }
                }
            }
        }
    };
}

id_type!(
    /// One client endpoint, new each time a program opens one.  Together with
    /// [`Seq`] it names a transaction for at-most-once filtering.
    ClientId
);
id_type!(
    /// One incarnation of a server endpoint (its "boot id").  A request names
    /// the instance it was meant for, so a restarted server is detected and
    /// never silently re-executes a request.
    Instance
);
id_type!(
    /// A node daemon's persistent identity.
    NodeId
);
id_type!(
    /// One member of a group: a process's endpoint in it, new each time it joins.
    MemberId
);
id_type!(
    /// Matches a locate answer to its question.
    Nonce
);

/// Declares a number that only counts up, printed as the number.
macro_rules! counter_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The one after this.
            pub fn next(self) -> Self {
                Self(self.0 + 1)
            }

            /// The one before this (none before zero: zero).
            pub fn prev(self) -> Self {
                Self(self.0.saturating_sub(1))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

counter_type!(
    /// A group's incarnation: the number a reset's coordinator chose, one
    /// above any it had seen (0 for a joiner or an outsider).  With the
    /// member that installed it (its sequencer) it orders resets' ballots.
    Incarnation
);
counter_type!(
    /// A member's message number in its group, 1, 2, 3, ...: the
    /// sequencer orders each member's messages once, in this order.
    MsgId
);

counter_type!(
    /// A position in a group's stream: the number the sequencer gave an
    /// entry, 1, 2, 3, ... (0: before the first).  How far a member holds,
    /// has committed or has delivered the stream is one of these.
    GroupSeq
);

impl GroupSeq {
    /// The `n`th entry after this.
    pub fn plus(self, n: u64) -> Self {
        Self(self.0 + n)
    }

    /// How many entries lie after `earlier` up to this one (none if
    /// `earlier` is not before it).
    pub fn since(self, earlier: GroupSeq) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The entries `self..=last`, in order.
    pub fn through(self, last: GroupSeq) -> impl DoubleEndedIterator<Item = GroupSeq> {
        (self.0..=last.0).map(GroupSeq)
    }
}

/// A transaction's sequence number within its client; strictly increasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A transaction: which client, which of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId {
    pub client: ClientId,
    pub seq: Seq,
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.client, self.seq)
    }
}
