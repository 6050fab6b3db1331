//! shoal's capabilities, after Amoeba.
//!
//! A service listens on a secret [`GetPort`] and is reached at its public
//! [`PutPort`], a one-way image of it (the F-box).  Each object of the
//! service has an [`ObjectId`] and a server-held [`ObjectSecret`].  A
//! [`Capability`] is a 48-byte bearer token: put-port, object id, a short
//! history of [`Rights`], and a chained MAC over them keyed by the object's
//! secret.  Anyone holding a capability can make a weaker one offline
//! ([`Capability::restrict`]); only the server can check one
//! ([`Capability::verify`]), and replacing the object's secret revokes them
//! all.
//!
//! **Architecture invariant:** this crate does no I/O and keeps no state;
//! decoders never panic, and verify does not allocate.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod capability;
pub mod codec;
mod ct;
mod error;
mod object;
mod port;
mod rights;
mod secret;

pub use capability::Capability;
pub use error::CapError;
pub use object::ObjectId;
pub use port::{GetPort, PutPort};
pub use rights::Rights;
pub use secret::ObjectSecret;
