//! A compromised node (`docs/security.md`, "What a compromised node can
//! and cannot do"): its root serves the system's ports, and no other
//! node's request, nor byte of their users, reaches it.
//!
//! A local cluster's nodes let root serve system ports
//! (`system_ports = "root"`), as a compromised node's root would set in
//! its own configuration.  Its endpoints are registered before the
//! administrator's service map reaches the nodes, so that this node's
//! daemon answers locates for them as a compromised daemon would.

use std::time::Duration;

mod common;

use common::TestCluster;
use shoal_cluster::Mode;
use shoal_rpc::link::{Link, LinkRequest, LinkResponse};

/// A server on `node` that records who calls it, and answers nothing
/// useful.
struct Witness {
    server: shoal_rpc::Server,
    heard: std::sync::Arc<parking_lot::Mutex<Vec<(String, u32)>>>,
}

impl Witness {
    fn serving(c: &shoal_cluster::Cluster, node: &str, service: shoal_rpc::Service) -> Witness {
        let server = context(c, node).serve(service).unwrap();
        let heard = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        {
            let (server, heard) = (server.clone(), heard.clone());
            std::thread::spawn(move || {
                while let Ok(req) = server.getreq() {
                    heard
                        .lock()
                        .push((req.caller().node.to_string(), req.caller().uid));
                    let _ = server.putrep(&req, b"not here".to_vec());
                }
            });
        }
        Witness { server, heard }
    }
}

/// A context of root's on `node`'s link, listening where this process
/// can be reached.
fn context(c: &shoal_cluster::Cluster, node: &str) -> shoal_rpc::Context {
    let attached = shoal_rpc::Context::attach(&c.node(node).unwrap().socket).unwrap();
    let mut config = attached.config().clone();
    config.bind_ip = std::net::IpAddr::from([0, 0, 0, 0]);
    shoal_rpc::Context::new(config)
}

/// The nodes (hex ids) that answered a locate of `port`, asked on `on`'s
/// link, with endpoints.
fn served_by(c: &shoal_cluster::Cluster, on: &str, port: &shoal_rpc::PutPort) -> Vec<String> {
    let mut link = Link::connect(&c.node(on).unwrap().socket).unwrap();
    let LinkResponse::Client { id, .. } = link.call(&LinkRequest::Client).unwrap() else {
        panic!("no client id")
    };
    let LinkResponse::Located { answers } = link
        .call(&LinkRequest::Locate {
            client: id,
            port: port.to_string(),
            instance: format!("{:016x}", 0),
            node: format!("{:016x}", 0),
            wait_ms: 3000,
            all: true,
        })
        .unwrap()
    else {
        panic!("no answer to locate")
    };
    let mut nodes: Vec<String> = answers
        .into_iter()
        .filter(|a| !a.endpoints.is_empty())
        .map(|a| a.node)
        .collect();
    nodes.sort();
    nodes
}

fn node_id(c: &shoal_cluster::Cluster, name: &str) -> String {
    c.status(&c.context(), name, Duration::from_secs(2))
        .unwrap()
        .node
}

/// Review 3, H1: n4's root serves a node's exec service; no locate of it
/// keeps n4's answer, and a program started on n1 from n2 sends n4
/// nothing.
#[test]
fn a_node_cannot_answer_for_another_node_s_own_services() {
    let t = TestCluster::up("uk", 55, 3, Mode::Netns);
    let c = t.get();
    let cluster = c.context().config().cluster;
    let exec_n1 = shoal_poolsvc::exec_service(&cluster, "n1");
    let impostor = Witness::serving(c, "n3", exec_n1);
    assert_eq!(served_by(c, "n2", &exec_n1.put_port()), [node_id(c, "n1")]);
    let mark = format!("shoal-h1-{:016x}", rand::random::<u64>());
    for _ in 0..3 {
        let out = c
            .command("n2", common::shoal())
            .unwrap()
            .env("SHOAL_TEST_MARK", &mark)
            .args([
                "run",
                "--on",
                "n1",
                "--",
                "sh",
                "-c",
                "echo $SHOAL_TEST_MARK",
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), mark);
    }
    assert!(impostor.heard.lock().is_empty(), "n3 heard a start request");
    let status = c
        .status(&c.context(), "n2", Duration::from_secs(2))
        .unwrap();
    assert!(status.counters["refused_system_answers"] >= 1);
}

/// Review 3, H1: n4's root serves the directory's and the file system's
/// ports and a replica's peer port; the service map names n1 … n3 for
/// them.  No node keeps n4's answers, so the users and mounts of n1 … n3
/// send it nothing; the replicas do not tell it their group's port, and
/// with that port leaked, their key services give it no key; and n4's
/// daemon, honest again, registers no such port.
#[test]
fn a_node_the_service_map_does_not_name_serves_no_system_service() {
    let t = TestCluster::up("ul", 62, 4, Mode::Netns);
    let c = t.get();
    let cluster = c.context().config().cluster;
    let dir = shoal_dirsvc::service_port(&cluster, "dir");
    let fs = shoal_fssvc::service_port(&cluster, "fs");
    let dir_peer = shoal_dirsvc::peer_port(&cluster, "dir", 0);
    let fs_peer = shoal_fssvc::peer_port(&cluster, "fs", 1);
    let impostors: Vec<Witness> = [dir, fs, dir_peer, fs_peer]
        .into_iter()
        .map(|s| Witness::serving(c, "n4", s))
        .collect();
    // Before the map, n4 is a server like any.
    let n4 = node_id(c, "n4");
    assert_eq!(served_by(c, "n2", &dir.put_port()), [n4]);
    c.start_system(&mut |l| eprintln!("[ul] {l}")).unwrap();
    let mut replicas: Vec<String> = ["n1", "n2", "n3"].iter().map(|n| node_id(c, n)).collect();
    replicas.sort();
    for on in ["n1", "n2", "n3", "n4"] {
        assert_eq!(served_by(c, on, &dir.put_port()), replicas, "on {on}");
        assert_eq!(served_by(c, on, &fs.put_port()), replicas, "on {on}");
    }
    assert_eq!(served_by(c, "n2", &dir_peer.put_port()), [node_id(c, "n1")]);
    // Every node's users and mounts at work.
    for node in ["n1", "n2", "n3"] {
        common::ok(
            c,
            node,
            &format!(
                "$SHOAL dir ls / >/dev/null && echo {node} > /shoal/{node} && cat /shoal/{node} && ls /shoal"
            ),
        );
    }
    for w in &impostors {
        assert!(
            w.heard.lock().is_empty(),
            "n4 heard {:?} on {}",
            w.heard.lock(),
            w.server.port()
        );
    }
    // The replicas' group port: told to root on n1, not to root on n4.
    let peer_status = |on: &str| -> serde_json::Value {
        let mut client = context(c, on).client().unwrap();
        let body = client
            .trans(
                &shoal_dirsvc::peer_port(&cluster, "dir", 1).put_port(),
                Vec::new(),
            )
            .unwrap();
        serde_json::from_slice(&body).unwrap()
    };
    let group = peer_status("n1")["group_port"]
        .as_str()
        .expect("root on n1 learns the group's port")
        .to_string();
    assert!(peer_status("n4")["group_port"].is_null());
    // Even knowing it, n4's root gets no key from any member.
    assert!(
        common::sh(c, "n1", &format!("$SHOAL group info {group}"))
            .status
            .success()
    );
    let refused = common::sh(c, "n4", &format!("$SHOAL group info {group}"));
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("service map"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // An honest n4 registers none of them now.
    let Err(err) = context(c, "n4").serve(dir) else {
        panic!("n4 registered the directory's port")
    };
    assert!(err.to_string().contains("service map"), "{err}");
    let status = c
        .status(&c.context(), "n2", Duration::from_secs(2))
        .unwrap();
    assert!(status.counters["refused_system_answers"] >= 1);
    assert!(status.service_map >= 1);
}
