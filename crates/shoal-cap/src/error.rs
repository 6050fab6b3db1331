//! The one error type of this crate.
//!
//! Every message is a single line that says what was wrong and, where there
//! is one, what to do about it.  Messages never echo the offending input:
//! text that failed to parse as a get-port or a capability may be a secret
//! with a typo in it, and errors end up in logs.

use crate::rights::Rights;

/// Everything that can go wrong when decoding, parsing, restricting or
/// verifying ports, rights and capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    /// A binary capability was not exactly [`Capability::LEN`](crate::Capability::LEN) bytes.
    #[error("capability must be exactly 48 bytes, got {len}")]
    WrongLength {
        /// The length that was given.
        len: usize,
    },

    /// The rights chain is not a strictly shrinking prefix followed only by
    /// repeats of its last entry.
    #[error(
        "capability rights chain is not canonical (each entry must be a proper subset of the one before, then only repeats): corrupted or tampered"
    )]
    NonCanonical,

    /// The check field does not match the one the server would compute.
    #[error("capability check field does not match: forged, corrupted or revoked")]
    Forged,

    /// The capability is genuine but lacks some of the rights the operation needs.
    #[error(
        "capability grants rights {have} but the operation needs {need}; ask the owner for a capability with more rights"
    )]
    InsufficientRights {
        /// The rights the capability grants.
        have: Rights,
        /// The rights the operation needs.
        need: Rights,
    },

    /// The capability already used all 7 restriction steps.
    #[error(
        "capability already has 7 restriction steps and cannot be restricted further; ask the server for a freshly minted one"
    )]
    ChainFull,

    /// Capability text did not start with `cap1:`.
    #[error("capability text must start with \"cap1:\"")]
    MissingPrefix,

    /// Capability text had the prefix but not 96 characters after it.
    #[error(
        "capability text must be \"cap1:\" followed by 96 hex characters, got {len} characters after the prefix"
    )]
    TextLength {
        /// Bytes found after the prefix.
        len: usize,
    },

    /// Port or capability text contained a character that is not a hex digit.
    #[error("text contains a character that is not a hex digit (0-9, a-f)")]
    BadHex,

    /// Port text was not 32 characters long.
    #[error("port must be exactly 32 hex characters, got {len}")]
    PortLength {
        /// The length that was given, in bytes.
        len: usize,
    },

    /// Rights text was neither the 8-letter form nor `0xNN`.
    #[error(
        "rights must be 8 characters like \"rw------\" (letters r w c d a x 6 7 in that order, '-' for absent) or hex like 0x03"
    )]
    BadRights,

    /// Object id text was neither decimal nor `0x` hex fitting in 64 bits.
    #[error("object id must be a decimal or 0x-prefixed hex number that fits in 64 bits")]
    BadObjectId,
}
