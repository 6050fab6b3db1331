//! Node daemons in the test's own process, on loopback, admitted to one
//! cluster by a fresh admin key, each knowing the others; and an RPC
//! context attached to each.  Services' integration tests start their
//! servers on these contexts (no namespaces, no root needed).  `fsx`:
//! what the shared file system's fsx-style tests share.

pub mod fsx;

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use shoal_nodesvc::{Daemon, NodeConfig};
use shoal_rpc::Context;
use shoal_wire::ClusterKey;

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("a local address")
        .port()
}

/// Node daemons that know each other, and a context on each.
pub struct Nodes {
    daemons: Vec<Daemon>,
    pub ctx: Vec<Context>,
    dir: tempfile::TempDir,
}

impl Nodes {
    /// `n` nodes, `n1`…: each seeded with every other's address.
    pub fn up(n: usize) -> Nodes {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key_file = dir.path().join("cluster.key");
        shoal_rpc::secrets::write(
            &key_file,
            format!("{}\n", ClusterKey::random().to_hex()).as_bytes(),
        )
        .expect("write the cluster key");
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let admin = shoal_nodesvc::identity::Admin::create(&dir.path().join("admin"))
            .expect("an admin key");
        let mut daemons = Vec::new();
        let mut ctx = Vec::new();
        for i in 0..n {
            let name = format!("n{}", i + 1);
            let state_dir = dir.path().join(&name);
            let public =
                shoal_nodesvc::identity::static_public_key(&state_dir).expect("a node key");
            let cert = admin.admit(&name, public, 1).expect("a certificate");
            let cert_file = state_dir.join("node.cert");
            std::fs::write(&cert_file, hex::encode(cert)).expect("write the certificate");
            let config = NodeConfig {
                name,
                socket: state_dir.join("node.sock"),
                state_dir,
                addr: addrs[i],
                bind: addrs[i],
                broadcast: None,
                seeds: (0..n).filter(|j| *j != i).map(|j| addrs[j]).collect(),
                key_file: Some(key_file.clone()),
                cluster: admin.cluster(),
                admin: admin.public(),
                cert_file,
                metrics: None,
                frag_bytes: 60_000,
                owner_detect: false,
                remote_root: shoal_nodesvc::RemoteRoot::Allow,
                socket_group: None,
                system_ports: shoal_nodesvc::SystemPorts::Root,
                services: Vec::new(),
            };
            let socket = config.socket.clone();
            daemons
                .push(Daemon::start(config, Arc::new(AtomicBool::new(false))).expect("a daemon"));
            ctx.push(Context::attach(&socket).expect("attach to the daemon"));
        }
        Nodes { daemons, ctx, dir }
    }

    /// A directory for the test's own files (removed with the nodes).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for d in self.daemons.drain(..) {
            d.shutdown();
        }
    }
}
