//! shoal file service.
