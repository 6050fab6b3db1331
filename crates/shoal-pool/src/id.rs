//! Cluster-wide process ids.
//!
//! A process is named by its home node and a sequence number the home
//! hands out (never reused while the home's daemon runs: it starts from a
//! random point, so a restarted home does not hand out the ids of its
//! previous incarnation's processes again).  The text form is
//! `HOME.SEQ` with the home's node id in hex, e.g.
//! `00a1b2c3d4e5f607.42`; what people see and type has the home's node
//! *name* in place of the hex id (`n1.42`, [`ProcId::named`]), which tools
//! resolve through membership.

use std::fmt;
use std::str::FromStr;

use shoal_wire::NodeId;

/// A process's cluster-wide id: its home node and its number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId {
    pub home: NodeId,
    pub seq: u64,
}

impl ProcId {
    /// Bytes of [`ProcId::to_bytes`].
    pub const LEN: usize = 16;

    /// Wire form: home then number, little-endian.
    pub fn to_bytes(self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.home.0.to_le_bytes());
        b[8..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// The form people see, with the home's name for its node id
    /// (`n1.42`); the hex form if the name is not known.
    pub fn named(self, home: Option<&str>) -> String {
        match home {
            Some(name) => format!("{name}.{}", self.seq),
            None => self.to_string(),
        }
    }

    /// From the wire form.
    pub fn from_bytes(b: &[u8; Self::LEN]) -> ProcId {
        ProcId {
            home: NodeId(u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))),
            seq: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
        }
    }
}

impl fmt::Display for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.home, self.seq)
    }
}

/// Why a process id's text does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseProcIdError {
    #[error("a process id is HOME.NUMBER (for example 00a1b2c3d4e5f607.42), not {0:?}")]
    Shape(String),
    #[error("the home of process id {0:?} is not a 16-digit hex node id")]
    Home(String),
    #[error("the number of process id {0:?} is not a decimal number")]
    Seq(String),
}

impl FromStr for ProcId {
    type Err = ParseProcIdError;

    fn from_str(s: &str) -> Result<ProcId, ParseProcIdError> {
        let (home, seq) = s
            .split_once('.')
            .ok_or_else(|| ParseProcIdError::Shape(s.to_string()))?;
        if home.len() != 16 || !home.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseProcIdError::Home(s.to_string()));
        }
        let home =
            u64::from_str_radix(home, 16).map_err(|_| ParseProcIdError::Home(s.to_string()))?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseProcIdError::Seq(s.to_string()));
        }
        let seq = seq
            .parse()
            .map_err(|_| ParseProcIdError::Seq(s.to_string()))?;
        Ok(ProcId {
            home: NodeId(home),
            seq,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn text_and_bytes_round_trip(home in any::<u64>(), seq in any::<u64>()) {
            let id = ProcId { home: NodeId(home), seq };
            prop_assert_eq!(id.to_string().parse::<ProcId>().unwrap(), id);
            prop_assert_eq!(ProcId::from_bytes(&id.to_bytes()), id);
        }

        #[test]
        fn parsing_never_panics(s in ".{0,40}") {
            let _ = s.parse::<ProcId>();
        }
    }

    #[test]
    fn malformed_ids_say_what_is_wrong() {
        for (text, want) in [
            ("42", "HOME.NUMBER"),
            ("n1.42", "16-digit hex"),
            ("00a1b2c3d4e5f607.", "decimal"),
            ("00a1b2c3d4e5f607.-1", "decimal"),
            ("00a1b2c3d4e5f607.99999999999999999999999", "decimal"),
        ] {
            let e = text.parse::<ProcId>().unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
