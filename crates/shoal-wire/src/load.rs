//! What a node reports about itself: its load, its free memory, and
//! whether its owner is using it.  Nodes send it in every heartbeat, so
//! every node's view holds every other node's load of a moment ago (the
//! processor pool places programs from it: `shoal-pool`).

/// Whether the person a node belongs to is using it.  Foreign programs are
/// placed on a node whose owner is active only when asked for by name or
/// with permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Owner {
    #[default]
    Idle,
    Active,
}

/// A node's load report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// Processor cores.
    pub cores: u16,
    /// The run queue: the one-minute load average, in hundredths.
    pub run_queue_centi: u32,
    /// Processor time used by processes that are not shoal's over the last
    /// sampling interval, in thousandths of one core.
    pub foreign_cpu_milli: u32,
    /// Memory available for new programs, in MiB.
    pub mem_free_mib: u32,
    /// shoal processes running on the node (placed there, from any home).
    pub shoal_procs: u32,
    /// The owner's state.
    pub owner: Owner,
}

/// Bytes of a load report on the wire.
pub const LOAD_LEN: usize = 2 + 4 + 4 + 4 + 4 + 1;

/// Why bytes are not a load report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeLoadError {
    #[error("a load report is {LOAD_LEN} bytes, not {0}")]
    Length(usize),
    #[error("unknown owner state {0}")]
    Owner(u8),
    #[error("a node reports at least one core")]
    NoCores,
}

impl Load {
    /// Wire form, little-endian.
    pub fn to_bytes(&self) -> [u8; LOAD_LEN] {
        let mut b = [0u8; LOAD_LEN];
        b[0..2].copy_from_slice(&self.cores.to_le_bytes());
        b[2..6].copy_from_slice(&self.run_queue_centi.to_le_bytes());
        b[6..10].copy_from_slice(&self.foreign_cpu_milli.to_le_bytes());
        b[10..14].copy_from_slice(&self.mem_free_mib.to_le_bytes());
        b[14..18].copy_from_slice(&self.shoal_procs.to_le_bytes());
        b[18] = match self.owner {
            Owner::Idle => 0,
            Owner::Active => 1,
        };
        b
    }

    /// From the wire form.
    pub fn from_bytes(b: &[u8]) -> Result<Load, DecodeLoadError> {
        let b: &[u8; LOAD_LEN] = b.try_into().map_err(|_| DecodeLoadError::Length(b.len()))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let load = Load {
            cores: u16::from_le_bytes([b[0], b[1]]),
            run_queue_centi: u32_at(2),
            foreign_cpu_milli: u32_at(6),
            mem_free_mib: u32_at(10),
            shoal_procs: u32_at(14),
            owner: match b[18] {
                0 => Owner::Idle,
                1 => Owner::Active,
                o => return Err(DecodeLoadError::Owner(o)),
            },
        };
        if load.cores == 0 {
            return Err(DecodeLoadError::NoCores);
        }
        Ok(load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn reports_round_trip(
            cores in 1u16..,
            q in any::<u32>(),
            f in any::<u32>(),
            m in any::<u32>(),
            p in any::<u32>(),
            active in any::<bool>(),
        ) {
            let load = Load {
                cores,
                run_queue_centi: q,
                foreign_cpu_milli: f,
                mem_free_mib: m,
                shoal_procs: p,
                owner: if active { Owner::Active } else { Owner::Idle },
            };
            prop_assert_eq!(Load::from_bytes(&load.to_bytes()).unwrap(), load);
        }

        #[test]
        fn decoding_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = Load::from_bytes(&b);
        }
    }
}
