//! Group communication on real local clusters: members are `shoal group`
//! processes in separate network namespaces, talking over real sockets
//! (IP multicast on the cluster bridge), with iptables loss and partitions,
//! delay injected by the library (`SHOAL_NET_DELAY_MS`), and SIGKILL.
//!
//! Every member prints what it delivers and which of its lines were
//! ordered; [`check`] verifies on those logs the promises the simulator
//! checks: total order agreement (with membership), no gaps, no
//! duplicates, and no lost sends.  Needs root, like `cluster.rs`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{TestCluster, ok, shoal, shoal_ok};
use shoal_cluster::{Cluster, Mode};

/// A `shoal group create|join` process on one node.
struct Member {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Member {
    fn spawn(c: &Cluster, node: &str, args: &[&str]) -> Member {
        let mut child = c
            .command(node, shoal())
            .unwrap()
            .arg("group")
            .args(args)
            .env("SHOAL_NET_DELAY_MS", "0-2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().unwrap());
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in out.lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let m = Member {
            name: node.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
        };
        assert!(
            m.wait(Duration::from_secs(15), |l| l
                .iter()
                .any(|x| x.starts_with("group ") || x.starts_with("joined "))),
            "{node}: the member did not start: {:?}",
            m.log()
        );
        m
    }

    /// Creates a group with resilience `r`; returns the member and the port.
    fn create(c: &Cluster, node: &str, r: usize) -> (Member, String) {
        let m = Member::spawn(c, node, &["create", "-r", &r.to_string()]);
        let port = m.log()[0].split_whitespace().nth(1).unwrap().to_string();
        (m, port)
    }

    fn join(c: &Cluster, node: &str, port: &str) -> Member {
        Member::spawn(c, node, &["join", port])
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn wait(&self, timeout: Duration, done: impl Fn(&[String]) -> bool) -> bool {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if done(&self.lines.lock().unwrap()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Lines of this member that the group ordered.
    fn sent(&self) -> usize {
        self.log().iter().filter(|l| l.starts_with("sent ")).count()
    }

    fn messages(&self) -> usize {
        self.log().iter().filter(|l| is_msg(l)).count()
    }

    fn kill(&mut self) {
        // SAFETY: plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        // SAFETY: plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_msg(line: &str) -> bool {
    line.split_whitespace().nth(2) == Some("msg")
}

/// What [`check`] found.
#[derive(Debug, Default)]
struct Summary {
    entries: usize,
    ordered_sends: usize,
    views: usize,
}

/// Checks the promises on the members' logs; `finals` are the members
/// that stay to the end, which must have delivered every ordered send.
fn check(members: &[&Member], finals: &[&Member]) -> Summary {
    use std::collections::{BTreeMap, HashSet};
    let mut agreed: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut summary = Summary::default();
    for m in members {
        let mut last: Option<u64> = None;
        let mut seen: HashSet<String> = HashSet::new();
        for line in m.log() {
            let mut f = line.splitn(3, ' ');
            let first = f.next().unwrap_or("");
            let Ok(seq) = first.parse::<u64>() else {
                if line == "rejoin" {
                    // A new membership: a state comes first again.
                    last = None;
                    seen.clear();
                }
                continue;
            };
            let digest = f.next().unwrap().to_string();
            let rest = f.next().unwrap_or("").to_string();
            if rest == "state" {
                // no_gaps: deliveries go on from the state's point.
                last = Some(seq);
                if let Some((d, _, who)) = agreed.get(&seq) {
                    assert_eq!(
                        d, &digest,
                        "total_order_agreement: {}'s state at {seq} differs from {who}'s stream",
                        m.name
                    );
                }
                continue;
            }
            if let Some(prev) = last {
                assert_eq!(
                    seq,
                    prev + 1,
                    "no_gaps: {} delivered {seq} after {prev}",
                    m.name
                );
            } else {
                assert!(
                    rest.starts_with("view "),
                    "no_gaps: {} delivered {seq} before joining",
                    m.name
                );
            }
            last = Some(seq);
            if rest.starts_with("msg ") {
                assert!(
                    seen.insert(rest.clone()),
                    "no_duplicates: {} delivered `{rest}` twice",
                    m.name
                );
            }
            match agreed.get(&seq) {
                Some((d, r, who)) => {
                    assert_eq!(
                        r, &rest,
                        "total_order_agreement: at {seq} {} delivered `{rest}`, {who} `{r}`",
                        m.name
                    );
                    assert_eq!(
                        d, &digest,
                        "total_order_agreement: {}'s stream up to {seq} differs from {who}'s",
                        m.name
                    );
                }
                None => {
                    if rest.starts_with("view ") {
                        summary.views += 1;
                    }
                    agreed.insert(seq, (digest, rest, m.name.clone()));
                }
            }
        }
    }
    summary.entries = agreed.len();
    // no_lost_sends: every ordered line is in the stream at its place, and
    // every final member got that far.
    let reached: Vec<u64> = finals
        .iter()
        .map(|m| {
            m.log()
                .iter()
                .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for m in members {
        for line in m.log() {
            let Some(rest) = line.strip_prefix("sent ") else {
                continue;
            };
            let (seq, text) = rest.split_once(' ').unwrap();
            let seq: u64 = seq.parse().unwrap();
            let (_, delivered, _) = agreed.get(&seq).unwrap_or_else(|| {
                panic!(
                    "no_lost_sends: {}'s `{text}` ordered at {seq}, never delivered",
                    m.name
                )
            });
            assert!(
                delivered.starts_with("msg ") && delivered.ends_with(&format!(" {text}")),
                "no_lost_sends: {}'s `{text}` ordered at {seq}, but {seq} is `{delivered}`",
                m.name
            );
            for (f, r) in finals.iter().zip(&reached) {
                assert!(
                    *r >= seq,
                    "no_lost_sends: {} stopped at {r} before {seq}",
                    f.name
                );
            }
            summary.ordered_sends += 1;
        }
    }
    summary
}

/// A group of three with resilience `r`: created on n1, joined from n2
/// and n3.
fn trio(c: &Cluster, r: usize) -> (Member, Member, Member) {
    let (a, port) = Member::create(c, "n1", r);
    let b = Member::join(c, "n2", &port);
    let d = Member::join(c, "n3", &port);
    (a, b, d)
}

/// Each member sends its `k`-th line (`NODE-k`, unique in the run).
fn say_all(ms: &mut [&mut Member], k: usize) {
    for m in ms.iter_mut() {
        let line = format!("{}-{k}", m.name);
        m.say(&line);
    }
}

/// Waits until every member in `ms` has printed `n` "sent" lines (a
/// member prints one when its `send` returns, which may be just after the
/// delivery of the same message).
fn wait_sent(ms: &[&Member], n: usize) {
    for m in ms {
        assert!(
            m.wait(Duration::from_secs(20), |l| l
                .iter()
                .filter(|x| x.starts_with("sent "))
                .count()
                >= n),
            "{}: {} of {n} sends returned",
            m.name,
            m.sent()
        );
    }
}

/// Waits until every member in `ms` has delivered `n` messages.
fn wait_messages(ms: &[&Member], n: usize, timeout: Duration) {
    for m in ms {
        assert!(
            m.wait(timeout, |l| l.iter().filter(|x| is_msg(x)).count() >= n),
            "liveness: {} delivered {} of {n} messages: {:?}",
            m.name,
            m.messages(),
            m.log().iter().rev().take(5).collect::<Vec<_>>()
        );
    }
}

fn run(c: &Cluster, args: &[&str]) {
    let status = Command::new(shoal())
        .args(["cluster"])
        .args(args)
        .arg("--dir")
        .arg(c.dir())
        .status()
        .unwrap();
    assert!(status.success(), "shoal cluster {args:?} failed");
}

/// Three members, resilience 1, 20 % loss on one node and injected delay
/// everywhere: every member delivers every message, in one order.
#[test]
fn three_members_agree_under_loss_and_delay() {
    let tc = TestCluster::up("ga", 22, 3, Mode::Netns);
    let c = tc.get();
    let (mut a, mut b, mut d) = trio(c, 1);
    run(c, &["loss", "--percent", "20", "n2"]);
    for k in 0..20 {
        say_all(&mut [&mut a, &mut b, &mut d], k);
    }
    wait_messages(&[&a, &b, &d], 60, Duration::from_secs(60));
    wait_sent(&[&a, &b, &d], 20);
    run(c, &["heal", "n2"]);
    let s = check(&[&a, &b, &d], &[&a, &b, &d]);
    assert_eq!(s.ordered_sends, 60, "{s:?}");
    for m in [&mut a, &mut b, &mut d] {
        m.stop();
    }
}

/// Five members, resilience 2, loss on two nodes.
#[test]
fn five_members_with_resilience_two_agree_under_loss() {
    let tc = TestCluster::up("gb", 23, 5, Mode::Netns);
    let c = tc.get();
    let (a, port) = Member::create(c, "n1", 2);
    let mut ms = vec![a];
    for n in 2..=5 {
        ms.push(Member::join(c, &format!("n{n}"), &port));
    }
    run(c, &["loss", "--percent", "10", "n2"]);
    run(c, &["loss", "--percent", "10", "n4"]);
    for k in 0..10 {
        say_all(&mut ms.iter_mut().collect::<Vec<_>>(), k);
    }
    let refs: Vec<&Member> = ms.iter().collect();
    wait_messages(&refs, 50, Duration::from_secs(60));
    wait_sent(&refs, 10);
    let s = check(&refs, &refs);
    assert_eq!(s.ordered_sends, 50, "{s:?}");
}

/// SIGKILL of the sequencer in the middle of a stream of sends: the
/// survivors reset, no ordered message is lost, and sending goes on.
#[test]
fn sequencer_killed_mid_stream_group_carries_on() {
    let tc = TestCluster::up("gc", 24, 3, Mode::Netns);
    let c = tc.get();
    let (mut a, mut b, mut d) = trio(c, 1);
    for k in 0..10 {
        say_all(&mut [&mut a, &mut b, &mut d], k);
    }
    wait_messages(&[&b, &d], 30, Duration::from_secs(30));
    // A stream from the survivors, and the sequencer dies in its middle.
    for k in 10..40 {
        b.say(&format!("b-{k}"));
        d.say(&format!("d-{k}"));
        if k == 15 {
            a.kill();
        }
    }
    for m in [&b, &d] {
        assert!(
            m.wait(Duration::from_secs(30), |l| l
                .iter()
                .filter(|x| x.starts_with("sent ") || x.starts_with("unsent "))
                .count()
                >= 40),
            "{}: sends did not finish: {:?}",
            m.name,
            m.log().iter().rev().take(5).collect::<Vec<_>>()
        );
    }
    // Sends after the reset succeed.
    b.say("b-after");
    d.say("d-after");
    assert!(b.wait(Duration::from_secs(10), |l| {
        l.iter().any(|x| x.ends_with(" d-after") && is_msg(x))
    }));
    assert!(d.wait(Duration::from_secs(10), |l| {
        l.iter().any(|x| x.ends_with(" b-after") && is_msg(x))
    }));
    let s = check(&[&a, &b, &d], &[&b, &d]);
    assert!(s.views >= 2, "the survivors installed a new view: {s:?}");
    assert!(
        b.sent() + d.sent() >= 80,
        "survivors' sends were ordered: {s:?}"
    );
}

/// A member cut off by a partition: the others carry on; after the heal
/// it is a member again, with the group's state, and agrees with them.
#[test]
fn partitioned_member_rejoins_after_heal() {
    let tc = TestCluster::up("gd", 25, 3, Mode::Netns);
    let c = tc.get();
    let (mut a, mut b, d) = trio(c, 1);
    for k in 0..5 {
        a.say(&format!("a-{k}"));
    }
    wait_messages(&[&a, &b, &d], 5, Duration::from_secs(20));
    run(c, &["partition", "n3"]);
    for k in 5..15 {
        a.say(&format!("a-{k}"));
        b.say(&format!("b-{k}"));
    }
    wait_messages(&[&a, &b], 25, Duration::from_secs(30));
    // Long enough for the others to give n3 up and reset without it.
    std::thread::sleep(Duration::from_secs(2));
    run(c, &["heal", "n3"]);
    assert!(
        d.wait(Duration::from_secs(30), |l| l
            .iter()
            .skip_while(|x| *x != "rejoin")
            .any(|x| x.ends_with(" state"))),
        "n3 did not rejoin: {:?}",
        d.log()
    );
    a.say("a-after-heal");
    assert!(
        d.wait(Duration::from_secs(20), |l| l
            .iter()
            .any(|x| x.ends_with(" a-after-heal"))),
        "n3 does not receive after rejoining: {:?}\nn1: {:?}\nn2: {:?}",
        d.log().iter().rev().take(5).collect::<Vec<_>>(),
        a.log().iter().rev().take(6).collect::<Vec<_>>(),
        b.log().iter().rev().take(6).collect::<Vec<_>>(),
    );
    check(&[&a, &b, &d], &[&a, &b, &d]);
}

/// On a loopback cluster there is no broadcast, so no multicast: members
/// send to each member in turn, with the same guarantees.
#[test]
fn loopback_cluster_uses_unicast_fan_out() {
    let tc = TestCluster::up("ge", 26, 3, Mode::Loopback);
    let c = tc.get();
    let (mut a, mut b, mut d) = trio(c, 1);
    for k in 0..10 {
        say_all(&mut [&mut a, &mut b, &mut d], k);
    }
    wait_messages(&[&a, &b, &d], 30, Duration::from_secs(30));
    wait_sent(&[&a, &b, &d], 10);
    let s = check(&[&a, &b, &d], &[&a, &b, &d]);
    assert_eq!(s.ordered_sends, 30, "{s:?}");
}

/// Counts, from now on, the datagrams to any group address (239.0.0.0/8)
/// that reach `node`'s IP layer, whether or not a socket there joined the
/// group (an iptables rule without a target, before routing).
fn count_multicast(c: &Cluster, node: &str) {
    ok(c, node, "iptables -t raw -I PREROUTING -d 239.0.0.0/8");
}

/// What [`count_multicast`] counted on `node` so far.
fn multicast_in(c: &Cluster, node: &str) -> u64 {
    let text = ok(c, node, "iptables -t raw -L PREROUTING -n -v -x");
    let line = text.lines().find(|l| l.contains("239.0.0.0/8"));
    line.and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{node}: no count in {text:?}"))
}

/// Waits until the cluster's bridge has learned (from the nodes' IGMP
/// reports, within a second or so of a join) that the ports of `n` nodes
/// joined one group.
fn wait_learned(c: &Cluster, n: usize) {
    let bridge = c.file().bridge.clone().expect("a namespaced cluster");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("bridge")
            .args(["mdb", "show", "dev", &bridge])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut ports: std::collections::HashMap<&str, usize> = Default::default();
        for group in text.lines().filter_map(|l| l.split(" grp ").nth(1)) {
            *ports
                .entry(group.split_whitespace().next().unwrap())
                .or_default() += 1;
        }
        if ports.iter().any(|(g, k)| g.starts_with("239.") && *k >= n) {
            return;
        }
        assert!(
            Instant::now() < until,
            "the bridge did not learn the group: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The cluster's bridge forwards a group's broadcasts only to the nodes of
/// its members (it is the segment's IGMP querier): n2, a member's node,
/// receives them, n4, which holds no member, does not.
#[test]
fn broadcasts_reach_only_the_members_nodes() {
    let tc = TestCluster::up("gh", 55, 4, Mode::Netns);
    let c = tc.get();
    let (mut a, mut b, mut d) = trio(c, 1);
    wait_learned(c, 3);
    count_multicast(c, "n2");
    count_multicast(c, "n4");
    // The bridge floods until it has been the querier for a moment: one
    // message at a time until one reaches n4 no more.
    let until = Instant::now() + Duration::from_secs(60);
    let mut k = 0;
    loop {
        let before = multicast_in(c, "n4");
        a.say(&format!("probe-{k}"));
        k += 1;
        wait_messages(&[&a, &b, &d], k, Duration::from_secs(20));
        if multicast_in(c, "n4") == before {
            break;
        }
        assert!(
            Instant::now() < until,
            "the bridge still floods after a minute"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every node answers the bridge in IGMPv3 (why: `create_bridge`).
    for node in ["n1", "n2", "n3", "n4"] {
        let igmp = ok(c, node, "cat /proc/net/igmp");
        let link = igmp
            .lines()
            .find(|l| {
                let mut w = l.split_whitespace();
                w.next().is_some_and(|i| i.parse::<u32>().is_ok()) && w.next() != Some("lo")
            })
            .unwrap_or_else(|| panic!("{node}: no interface in {igmp}"));
        assert!(
            link.split_whitespace().any(|w| w == "V3"),
            "{node} answers the bridge in an older IGMP: {igmp}"
        );
    }
    let before = [multicast_in(c, "n2"), multicast_in(c, "n4")];
    for i in 0..40 {
        say_all(&mut [&mut a, &mut b, &mut d], i);
    }
    wait_messages(&[&a, &b, &d], k + 120, Duration::from_secs(60));
    wait_sent(&[&a, &b, &d], 40);
    let member = multicast_in(c, "n2") - before[0];
    let outsider = multicast_in(c, "n4") - before[1];
    assert!(member >= 40, "n2 received {member} multicast datagrams");
    assert!(
        outsider == 0,
        "n4 received {outsider} multicast datagrams, n2 {member}"
    );
    for m in [&mut a, &mut b, &mut d] {
        m.stop();
    }
}

/// `shoal group info --json` of the group `port`, asked from `node`.
fn info(c: &Cluster, node: &str, port: &str) -> Vec<serde_json::Value> {
    let out = c
        .command(node, shoal())
        .unwrap()
        .args(["group", "info", "--json", port])
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new();
    }
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Waits until `n` members answer `info` from n1, all sending in one key
/// epoch (another than `after`) and counting `n` members; returns the
/// epoch.
fn one_epoch(c: &Cluster, port: &str, n: usize, after: Option<u64>) -> u64 {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let answers = info(c, "n1", port);
        let epochs: Vec<u64> = answers
            .iter()
            .filter_map(|a| a["key_epoch"].as_u64())
            .collect();
        let counts = answers
            .iter()
            .all(|a| a["members"].as_array().is_some_and(|m| m.len() == n));
        if answers.len() == n
            && counts
            && epochs.len() == n
            && epochs.iter().all(|e| *e == epochs[0])
            && after.is_none_or(|a| epochs[0] != a)
        {
            return epochs[0];
        }
        assert!(
            Instant::now() < until,
            "no single key epoch over {n} members (after {after:?}): {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A group's key moves on without a member that leaves, and without one
/// whose node is revoked: the others take the next key from the
/// sequencer over their node sessions, the revoked node's member cannot,
/// falls silent, is expelled and reads nothing more; nobody re-keys the
/// cluster.
#[test]
fn the_group_key_moves_on_without_leavers_and_revoked_nodes() {
    let tc = TestCluster::up("gf", 52, 4, Mode::Netns);
    let c = tc.get();
    let (mut a, port) = Member::create(c, "n1", 1);
    let mut b = Member::join(c, "n2", &port);
    let d = Member::join(c, "n3", &port);
    let e = Member::join(c, "n4", &port);
    let first = one_epoch(c, &port, 4, None);

    // A member leaves: the rest move to a newer epoch without it.
    b.stop();
    let second = one_epoch(c, &port, 3, Some(first));

    // n3 is revoked: its member is left behind by the next key.
    let admin = shoal_nodesvc::identity::Admin::open(&c.dir().join("admin")).unwrap();
    let list = hex::encode(admin.revoke("n3").unwrap());
    shoal_ok(c, "n1", &["node", "revoke", &list]);
    // Until the list reaches a node (within seconds, in the sessions), n3
    // may still reach it; the promise holds from then on.
    let ctx = c.context();
    let until = Instant::now() + Duration::from_secs(30);
    while !["n1", "n2", "n4"].iter().all(|n| {
        c.status(&ctx, n, Duration::from_secs(2))
            .is_ok_and(|s| s.revocations == 1)
    }) {
        assert!(Instant::now() < until, "the revocation list did not spread");
        std::thread::sleep(Duration::from_millis(200));
    }
    let spread = one_epoch(c, &port, 2, Some(second));
    one_epoch(c, &port, 2, Some(spread));
    a.say("after-the-revocation");
    assert!(
        e.wait(Duration::from_secs(20), |l| l
            .iter()
            .any(|x| x.ends_with(" after-the-revocation") && is_msg(x))),
        "n4 does not receive after the revocation: {:?}",
        e.log().iter().rev().take(5).collect::<Vec<_>>()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !d.log().iter().any(|x| x.ends_with(" after-the-revocation")),
        "the revoked node's member read on: {:?}",
        d.log().iter().rev().take(5).collect::<Vec<_>>()
    );
}

/// The sequencer cut off by a partition: the others reset without it and
/// draw their own key; alone, it draws one too (its membership changed).
/// After the heal each side sees datagrams in an epoch it does not hold,
/// gets that epoch's key from the other side's members (found through
/// the nodes) to open them, and the old sequencer hears that it is out,
/// joins again with the group's state, and receives.
#[test]
fn partitioned_sequencer_rejoins_after_heal() {
    let tc = TestCluster::up("gg", 53, 3, Mode::Netns);
    let c = tc.get();
    let (a, mut b, d) = trio(c, 1);
    for k in 0..5 {
        b.say(&format!("b-{k}"));
    }
    wait_messages(&[&a, &b, &d], 5, Duration::from_secs(20));
    run(c, &["partition", "n1"]);
    for k in 5..15 {
        b.say(&format!("b-{k}"));
    }
    wait_messages(&[&b, &d], 15, Duration::from_secs(30));
    // Long enough for n1 to give the others up and draw its own key.
    std::thread::sleep(Duration::from_secs(2));
    run(c, &["heal", "n1"]);
    assert!(
        a.wait(Duration::from_secs(40), |l| l
            .iter()
            .skip_while(|x| *x != "rejoin")
            .any(|x| x.ends_with(" state"))),
        "n1 did not rejoin: {:?}",
        a.log().iter().rev().take(8).collect::<Vec<_>>()
    );
    b.say("b-after-heal");
    assert!(
        a.wait(Duration::from_secs(20), |l| l
            .iter()
            .any(|x| x.ends_with(" b-after-heal"))),
        "n1 does not receive after rejoining: {:?}",
        a.log().iter().rev().take(5).collect::<Vec<_>>()
    );
    check(&[&a, &b, &d], &[&a, &b, &d]);
}
