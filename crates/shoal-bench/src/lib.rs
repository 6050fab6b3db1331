//! shoal's benchmark suite.

pub mod grpc;
