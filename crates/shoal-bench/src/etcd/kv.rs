//! etcd's KV service over gRPC, the way etcd's own clients (`etcdctl`, the
//! Go client, `etcd-client` in Rust) speak to it: tonic over HTTP/2 with
//! `TCP_NODELAY` and the prost codec, one connection kept across calls.
//!
//! The three calls the benchmarks make (`Put`, `Range` of one key,
//! `DeleteRange` of one key) are written by hand in the shape `tonic-build`
//! would generate from etcd's `rpc.proto` and `kv.proto` (package
//! `etcdserverpb`, service `KV`; field numbers as there), with only the
//! fields the benchmarks use: prost skips the others when it decodes. So
//! no `protoc` or build script is needed, as for [`crate::grpc`].
//!
//! The API is blocking: the client drives its own current-thread tokio
//! runtime for each call.

use std::net::SocketAddr;

use tokio::runtime::{Builder, Runtime};
use tonic::Request;
use tonic::client::Grpc;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

/// `message PutRequest`: key = 1, value = 2 (lease, prev_kv and the
/// ignore flags left at their defaults).
#[derive(Clone, PartialEq, prost::Message)]
struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `message PutResponse`, none of whose fields the benchmarks read.
#[derive(Clone, PartialEq, prost::Message)]
struct PutResponse {}

/// `message RangeRequest` of one key: key = 1 (no range_end).
#[derive(Clone, PartialEq, prost::Message)]
struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

/// `mvccpb.KeyValue`: key = 1, value = 5.
#[derive(Clone, PartialEq, prost::Message)]
struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    value: Vec<u8>,
}

/// `message RangeResponse`: kvs = 2.
#[derive(Clone, PartialEq, prost::Message)]
struct RangeResponse {
    #[prost(message, repeated, tag = "2")]
    kvs: Vec<KeyValue>,
}

/// `message DeleteRangeRequest` of one key: key = 1.
#[derive(Clone, PartialEq, prost::Message)]
struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

/// `message DeleteRangeResponse`: deleted = 2.
#[derive(Clone, PartialEq, prost::Message)]
struct DeleteRangeResponse {
    #[prost(int64, tag = "2")]
    deleted: i64,
}

/// A blocking client of one etcd member's KV service.
pub struct Kv {
    addr: SocketAddr,
    rt: Runtime,
    grpc: Grpc<Channel>,
}

impl Kv {
    /// Connects to the member whose client address is `addr`.
    pub fn connect(addr: SocketAddr) -> Result<Kv, String> {
        let fail = |e: &dyn std::fmt::Display| format!("etcd at {addr}: {e}");
        let rt = Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(&e))?;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| fail(&e))?
            .tcp_nodelay(true);
        let channel = rt.block_on(endpoint.connect()).map_err(|e| fail(&e))?;
        Ok(Kv {
            addr,
            rt,
            grpc: Grpc::new(channel),
        })
    }

    /// Puts `value` under `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let _: PutResponse = self.unary(
            "/etcdserverpb.KV/Put",
            PutRequest {
                key: key.to_vec(),
                value: value.to_vec(),
            },
        )?;
        Ok(())
    }

    /// The value under `key`, if there is one.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let r: RangeResponse =
            self.unary("/etcdserverpb.KV/Range", RangeRequest { key: key.to_vec() })?;
        Ok(r.kvs
            .into_iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value))
    }

    /// Deletes `key`; how many keys went (0 or 1).
    pub fn delete(&mut self, key: &[u8]) -> Result<i64, String> {
        let r: DeleteRangeResponse = self.unary(
            "/etcdserverpb.KV/DeleteRange",
            DeleteRangeRequest { key: key.to_vec() },
        )?;
        Ok(r.deleted)
    }

    /// One unary call, as a generated client stub makes it.
    fn unary<Q, A>(&mut self, path: &'static str, request: Q) -> Result<A, String>
    where
        Q: prost::Message + Send + 'static,
        A: prost::Message + Default + Send + 'static,
    {
        let (addr, grpc) = (self.addr, &mut self.grpc);
        self.rt.block_on(async move {
            grpc.ready()
                .await
                .map_err(|e| format!("etcd at {addr}: {e}"))?;
            grpc.unary(
                Request::new(request),
                PathAndQuery::from_static(path),
                ProstCodec::<Q, A>::default(),
            )
            .await
            .map(|r| r.into_inner())
            .map_err(|s| format!("etcd at {addr}, {path}: {}", s.message()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn requests_encode_as_etcds_schema_says() {
        // PutRequest{key: "k", value: "v"}: field 1 and field 2, both
        // length-delimited (wire type 2).
        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        assert_eq!(put.encode_to_vec(), [0x0a, 1, b'k', 0x12, 1, b'v']);
        let range = RangeRequest { key: b"k".to_vec() };
        assert_eq!(range.encode_to_vec(), [0x0a, 1, b'k']);
    }

    #[test]
    fn a_range_response_yields_the_value_and_skips_unknown_fields() {
        // kvs[0] = {key: "k" (1), create_revision: 7 (2), value: "v" (5)},
        // then more: true (3) and count: 1 (4), which this schema lacks.
        let kv = [0x0a, 1, b'k', 0x10, 7, 0x2a, 1, b'v'];
        let mut bytes = vec![0x12, kv.len() as u8];
        bytes.extend_from_slice(&kv);
        bytes.extend_from_slice(&[0x18, 1, 0x20, 1]);
        let r = RangeResponse::decode(&bytes[..]).unwrap();
        assert_eq!(r.kvs.len(), 1);
        assert_eq!(
            (&r.kvs[0].key[..], &r.kvs[0].value[..]),
            (&b"k"[..], &b"v"[..])
        );
    }

    #[test]
    fn no_member_is_a_clear_error() {
        // A port nothing listens on (bound, then closed).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let e = Kv::connect(addr).err().expect("nothing listens there");
        assert!(e.starts_with(&format!("etcd at {addr}")), "{e}");
    }
}
