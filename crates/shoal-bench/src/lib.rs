//! shoal-bench
