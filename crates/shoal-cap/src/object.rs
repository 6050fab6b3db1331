//! Object ids.
//!
//! An [`ObjectId`] names one object inside one server (the server itself is
//! named by its put-port).  The server picks them; this crate gives them no
//! structure.  Text form is decimal; parsing also takes `0x` hex.

use std::fmt;
use std::str::FromStr;

use crate::error::CapError;

/// Names one object within the server that owns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct ObjectId(pub u64);

impl ObjectId {
    /// The object id with this number.
    pub const fn new(id: u64) -> ObjectId {
        ObjectId(id)
    }

    /// The id's number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for ObjectId {
    fn from(id: u64) -> ObjectId {
        ObjectId(id)
    }
}

impl From<ObjectId> for u64 {
    fn from(id: ObjectId) -> u64 {
        id.0
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for ObjectId {
    type Err = CapError;
    fn from_str(s: &str) -> Result<ObjectId, CapError> {
        let (digits, radix) = match s.strip_prefix("0x") {
            Some(hex) => (hex, 16),
            None => (s, 10),
        };
        // from_str_radix accepts a leading '+'; we accept digits only.
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CapError::BadObjectId);
        }
        u64::from_str_radix(digits, radix)
            .map(ObjectId)
            .map_err(|_| CapError::BadObjectId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        for v in [0, 1, 42, u64::MAX] {
            let id = ObjectId::new(v);
            assert_eq!(id.to_string().parse::<ObjectId>(), Ok(id));
            assert_eq!(format!("0x{v:x}").parse::<ObjectId>(), Ok(id));
            assert_eq!(u64::from(id), v);
            assert_eq!(ObjectId::from(v).get(), v);
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "",
            "0x",
            "+1",
            "-1",
            "1a",
            "0x1g",
            "18446744073709551616",
            " 1",
        ] {
            assert_eq!(
                bad.parse::<ObjectId>(),
                Err(CapError::BadObjectId),
                "{bad:?}"
            );
        }
    }
}
