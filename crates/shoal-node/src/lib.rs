//! shoal-node
