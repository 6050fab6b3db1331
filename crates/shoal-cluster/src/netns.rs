//! Namespaces, veths, the bridge and iptables rules, through `ip` and
//! `iptables` (Debian's iproute2 and iptables).

use std::net::Ipv4Addr;
use std::process::Command;

use crate::Spec;

/// MTU of the cluster network: a full 64 KiB datagram crosses it in one
/// frame, as on loopback.
const MTU: &str = "65535";

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program} (is it installed?): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ns_run(ns: &str, program: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// The cluster's bridge, as a switch with IGMP snooping: it is the
/// segment's querier (there is no other), so it forwards a group's
/// multicast only to the ports whose nodes joined the group, not to every
/// node and the host.  Without a querier a bridge floods all multicast,
/// and every copy costs the sender's CPU (a veth delivers in the sending
/// thread).  Queries every 10 s, answers within 1 s: a node that was cut
/// off long enough for its memberships to lapse (260 s) is forwarded to
/// again within 10 s of coming back.  The bridge floods until it has been
/// the querier for a moment (it waits for answers to its first query), and
/// a new group until a member's report (within a second of its join).
/// It queries in IGMPv3, so the nodes report in v3.  In v2 (the bridge's
/// default) a node that hears another node's report for a group cancels
/// its own; with it, a node was seen never to report a group it had
/// joined, and the bridge, having learned only the other nodes, cut it
/// off from the group.
pub fn create_bridge(bridge: &str, subnet: u8) -> Result<(), String> {
    // A bridge left over by a cluster that died: replace it.
    let _ = run("ip", &["link", "del", bridge]);
    run(
        "ip",
        &[
            "link",
            "add",
            bridge,
            "type",
            "bridge",
            "mcast_snooping",
            "1",
            "mcast_igmp_version",
            "3",
            "mcast_query_use_ifaddr",
            "1",
            "mcast_query_interval",
            "1000",
            "mcast_query_response_interval",
            "100",
        ],
    )?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("10.77.{subnet}.1/24"),
            "dev",
            bridge,
        ],
    )?;
    run("ip", &["link", "set", bridge, "up"])?;
    // The querier last, once the bridge is up and its response interval
    // set: that interval is how long the kernel then waits for answers to
    // its first query before it filters.
    run(
        "ip",
        &[
            "link",
            "set",
            bridge,
            "type",
            "bridge",
            "mcast_querier",
            "1",
        ],
    )
}

pub fn delete_bridge(bridge: &str) {
    let _ = run("ip", &["link", "del", bridge]);
}

pub fn create_node(
    bridge: &str,
    ns: &str,
    spec: &Spec,
    index: usize,
    ip: Ipv4Addr,
) -> Result<(), String> {
    let _ = run("ip", &["netns", "del", ns]);
    run("ip", &["netns", "add", ns])?;
    let host = format!("shv-{}-{index}", spec.name);
    let _ = run("ip", &["link", "del", &host]);
    run(
        "ip",
        &[
            "link", "add", &host, "mtu", MTU, "type", "veth", "peer", "name", "eth0", "mtu", MTU,
            "netns", ns,
        ],
    )?;
    run("ip", &["link", "set", &host, "master", bridge, "up"])?;
    ns_run(
        ns,
        "ip",
        &["addr", "add", &format!("{ip}/24"), "dev", "eth0"],
    )?;
    ns_run(ns, "ip", &["link", "set", "eth0", "up"])?;
    ns_run(ns, "ip", &["link", "set", "lo", "up"])
}

pub fn delete_node(ns: &str) {
    // Deleting the namespace deletes its veth end, and so the pair.
    let _ = run("ip", &["netns", "del", ns]);
}

pub fn partition(ns: &str) -> Result<(), String> {
    ns_run(ns, "iptables", &["-I", "INPUT", "-i", "eth0", "-j", "DROP"])?;
    ns_run(
        ns,
        "iptables",
        &["-I", "OUTPUT", "-o", "eth0", "-j", "DROP"],
    )
}

pub fn loss(ns: &str, probability: f64) -> Result<(), String> {
    let p = format!("{probability:.4}");
    for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
        ns_run(
            ns,
            "iptables",
            &[
                "-I",
                chain,
                dir,
                "eth0",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &p,
                "-j",
                "DROP",
            ],
        )?;
    }
    Ok(())
}

pub fn heal(ns: &str) -> Result<(), String> {
    ns_run(ns, "iptables", &["-F", "INPUT"])?;
    ns_run(ns, "iptables", &["-F", "OUTPUT"])
}
