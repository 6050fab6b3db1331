//! shoal-sim
