//! shoal's immutable file service: the file server, the client library and
//! the object manager.
//!
//! A file server ([`server`]) keeps a `shoal_bullet` store in a data
//! directory and serves it on its own port.  Programs use [`FileClient`];
//! files with several replicas are named in the directory service by the
//! set of their replicas' capabilities, and the object manager
//! ([`manager`]) keeps that set at k replicas and garbage-collects what no
//! directory names.  `docs/files.md` describes the guarantees and formats.

#![deny(unsafe_code)]

mod cache;
pub mod client;
pub mod disk;
pub mod manager;
pub mod server;
mod sparse;

pub use cache::Cache;
pub use client::{ClientError, FileClient, FileReader, OneCopy};
pub use server::{FileServer, ServerConfig};
