//! How a transaction can fail.  Each case says whether the request may have
//! been executed, because at-most-once means a client must never guess.

use std::time::Duration;

use shoal_cap::PutPort;

/// Why `trans` did not return a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransError {
    /// Locate found no server for the port before the deadline.  The
    /// request was not sent anywhere.
    #[error(
        "no server for port {port} answered within {:.1}s (not running, or this node is cut off)",
        waited.as_secs_f64()
    )]
    NotFound { port: PutPort, waited: Duration },
    /// The located server stopped answering.  The request may or may not
    /// have been executed.
    #[error(
        "server for port {port} stopped answering (its node may be down or cut off); the request may or may not have run"
    )]
    ServerUnreachable { port: PutPort },
    /// The server instance that received the request is gone: another
    /// instance answers at its address, or nothing does.  The request may
    /// have been executed by the old instance; it was not re-executed.
    #[error(
        "server for port {port} restarted or stopped during the call; the request may have run once, and was not run again"
    )]
    ServerRestarted { port: PutPort },
    /// The server has the request and is working on it, but did not reply
    /// before the deadline.
    #[error(
        "server for port {port} did not finish before the deadline; the request may still complete"
    )]
    DeadlineExceeded { port: PutPort },
    /// The server refused the request without executing it: too busy.
    #[error("server for port {port} is busy and refused the request (not executed)")]
    Busy { port: PutPort },
    /// The server refused the request without executing it: too large.
    #[error(
        "server for port {port} refused a request of {bytes} bytes as too large (not executed)"
    )]
    TooLarge { port: PutPort, bytes: u64 },
    /// The reply was larger than this client accepts.
    #[error("reply of {bytes} bytes from port {port} exceeds this client's limit")]
    ReplyTooLarge { port: PutPort, bytes: u64 },
    /// The caller cancelled the transaction.
    #[error("transaction cancelled; the request may or may not have run")]
    Cancelled,
}

impl TransError {
    /// Stable code for scripts and wire-visible errors.
    pub fn code(&self) -> &'static str {
        match self {
            TransError::NotFound { .. } => "not-found",
            TransError::ServerUnreachable { .. } => "unreachable",
            TransError::ServerRestarted { .. } => "restarted",
            TransError::DeadlineExceeded { .. } => "deadline",
            TransError::Busy { .. } => "busy",
            TransError::TooLarge { .. } => "too-large",
            TransError::ReplyTooLarge { .. } => "reply-too-large",
            TransError::Cancelled => "cancelled",
        }
    }
}
