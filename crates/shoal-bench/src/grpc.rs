//! gRPC peer (placeholder being written).
