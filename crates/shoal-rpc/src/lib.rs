//! shoal-rpc
