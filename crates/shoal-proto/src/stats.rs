//! Counters every core keeps; the daemon exports them as Prometheus metrics.

macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Event counters of one core.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            /// Every counter with its name.
            pub fn entries(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }

        }
    };
}

stats! {
    /// Datagrams handed to the core.
    datagrams_in,
    /// Datagrams the core asked to send.
    datagrams_out,
    /// Dropped: did not open (a bad tag or MAC, or no key for its channel).
    dropped_bad_mac,
    /// Dropped: opened, but its counter was seen before or is too old.
    replays,
    /// Dropped: malformed, truncated or of an unknown kind or version.
    dropped_malformed,
    /// Dropped: valid, but for no transaction this core knows.
    dropped_stale,
    /// Requests executed (server) or transactions completed (client).
    transactions,
    /// Duplicate request fragments filtered out (at-most-once at work).
    duplicates,
    /// Retransmissions after a timeout.
    retransmits,
    /// Locate requests sent or answered.
    locates,
    /// Requests refused as busy or too large.
    refused,
    /// Transactions that failed.
    failures,
}

impl Stats {
    /// Counts a datagram the shell could not open: a replay, or one that
    /// did not open at all.
    pub fn count_unopened(&mut self, replayed: bool) {
        self.datagrams_in += 1;
        if replayed {
            self.replays += 1;
        } else {
            self.dropped_bad_mac += 1;
        }
    }

    /// Counts a decode failure under the right counter.
    pub fn count_wire_error(&mut self, e: shoal_wire::WireError) {
        match e {
            shoal_wire::WireError::BadMac => self.dropped_bad_mac += 1,
            _ => self.dropped_malformed += 1,
        }
    }
}
