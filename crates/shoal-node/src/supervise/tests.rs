//! Tests of the supervisor's restart rules: back-off after crashes at
//! start, stop by SIGTERM then SIGKILL, restart policies, failed spawns,
//! and a property that the edge never sees a double start or a stray
//! signal.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

const POLICY: Policy = Policy {
    restart: Restart::Always,
    stop_timeout: Duration::from_secs(10),
};

fn secs(s: u64) -> Time {
    Time::from_secs(s)
}

fn spawn(name: &str) -> Vec<Action> {
    vec![Action::Spawn(name.into())]
}

#[test]
fn a_crash_at_start_backs_off_doubling_and_a_stable_run_resets_it() {
    let mut s = Supervisor::new();
    assert_eq!(s.add("dir", POLICY, secs(0)), spawn("dir"));
    s.spawned("dir", secs(0));
    // Ended after 1 s: wait 1 s, then 2, 4, ... up to 60.
    let mut now = secs(1);
    let mut want = FIRST_DELAY;
    for _ in 0..10 {
        assert!(s.exited("dir", Exit::Signal(9), now).is_empty());
        assert_eq!(s.next_deadline(), Some(now + want));
        assert!(s.tick(now + want - Duration::from_millis(1)).is_empty());
        now += want;
        assert_eq!(s.tick(now), spawn("dir"));
        s.spawned("dir", now);
        want = (want * 2).min(MAX_DELAY);
    }
    assert_eq!(s.services()["dir"].delay, MAX_DELAY);
    // A run of STABLE_AFTER restarts at once and resets the delay.
    now += STABLE_AFTER;
    assert_eq!(s.exited("dir", Exit::Code(1), now), spawn("dir"));
    assert_eq!(s.services()["dir"].delay, Duration::ZERO);
    assert_eq!(s.services()["dir"].starts, 12);
    assert_eq!(s.services()["dir"].last_exit, Some(Exit::Code(1)));
}

#[test]
fn stop_terms_then_kills_and_a_stopped_service_stays_stopped() {
    let mut s = Supervisor::new();
    s.add("file", POLICY, secs(0));
    s.spawned("file", secs(0));
    let stop = s.command("file", Command::Stop, secs(20)).unwrap();
    assert_eq!(stop, vec![Action::Signal("file".into(), Sig::Term)]);
    assert!(s.tick(secs(29)).is_empty());
    assert_eq!(
        s.tick(secs(30)),
        vec![Action::Signal("file".into(), Sig::Kill)]
    );
    assert!(s.tick(secs(31)).is_empty(), "SIGKILL is sent once");
    assert!(s.exited("file", Exit::Signal(9), secs(31)).is_empty());
    assert_eq!(s.services()["file"].state, State::Stopped);
    assert!(s.tick(secs(100)).is_empty());
    assert_eq!(
        s.command("file", Command::Start, secs(101)).unwrap(),
        spawn("file")
    );
}

#[test]
fn restart_starts_again_at_once_whatever_the_policy() {
    let mut s = Supervisor::new();
    let never = Policy {
        restart: Restart::Never,
        ..POLICY
    };
    s.add("svc", never, secs(0));
    s.spawned("svc", secs(0));
    let term = s.command("svc", Command::Restart, secs(1)).unwrap();
    assert_eq!(term, vec![Action::Signal("svc".into(), Sig::Term)]);
    assert_eq!(s.exited("svc", Exit::Signal(15), secs(2)), spawn("svc"));
    s.spawned("svc", secs(2));
    // Its own exit is not restarted.
    assert!(s.exited("svc", Exit::Code(1), secs(3)).is_empty());
    assert_eq!(s.services()["svc"].state, State::Stopped);
}

#[test]
fn on_failure_does_not_restart_a_clean_exit() {
    let mut s = Supervisor::new();
    let p = Policy {
        restart: Restart::OnFailure,
        ..POLICY
    };
    s.add("a", p, secs(0));
    s.spawned("a", secs(0));
    assert!(s.exited("a", Exit::Code(0), secs(30)).is_empty());
    assert_eq!(s.services()["a"].state, State::Stopped);
    s.command("a", Command::Start, secs(31)).unwrap();
    s.spawned("a", secs(31));
    assert_eq!(s.exited("a", Exit::Code(2), secs(61)), spawn("a"));
}

#[test]
fn a_failed_spawn_backs_off_with_its_error_and_unknown_names_are_refused() {
    let mut s = Supervisor::new();
    s.add("x", POLICY, secs(0));
    assert!(
        s.spawn_failed("x", "no such program".into(), secs(0))
            .is_empty()
    );
    assert_eq!(
        s.services()["x"].last_error.as_deref(),
        Some("no such program")
    );
    assert_eq!(s.tick(secs(1)), spawn("x"));
    assert_eq!(
        s.command("nope", Command::Stop, secs(1)),
        Err(SuperviseError::Unknown("nope".into()))
    );
}

#[test]
fn removing_and_shutting_down_stop_every_child() {
    let mut s = Supervisor::new();
    for n in ["a", "b", "c"] {
        s.add(n, POLICY, secs(0));
        s.spawned(n, secs(0));
    }
    s.exited("c", Exit::Code(1), secs(1)); // c is backing off
    assert_eq!(
        s.remove("a", secs(2)),
        vec![Action::Signal("a".into(), Sig::Term)]
    );
    s.exited("a", Exit::Signal(15), secs(3));
    assert!(!s.services().contains_key("a"));
    assert_eq!(
        s.shutdown(secs(4)),
        vec![Action::Signal("b".into(), Sig::Term)]
    );
    assert!(!s.all_ended());
    s.exited("b", Exit::Signal(15), secs(5));
    assert!(s.all_ended());
    assert!(
        s.tick(secs(100)).is_empty(),
        "nothing starts after shutdown"
    );
}

#[derive(Debug, Clone)]
enum Input {
    Tick(u64),
    Exit(usize, bool),
    SpawnOk(usize),
    SpawnFail(usize),
    Cmd(usize, u8),
    Remove(usize),
    Add(usize),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        (0u64..120_000).prop_map(Input::Tick),
        (0usize..3, any::<bool>()).prop_map(|(i, c)| Input::Exit(i, c)),
        (0usize..3).prop_map(Input::SpawnOk),
        (0usize..3).prop_map(Input::SpawnFail),
        (0usize..3, 0u8..3).prop_map(|(i, c)| Input::Cmd(i, c)),
        (0usize..3).prop_map(Input::Remove),
        (0usize..3).prop_map(Input::Add),
    ]
}

proptest! {
    /// Driven by an edge that does what it is told, the supervisor never
    /// starts a service that is running or starting, never signals one
    /// that is not running, never waits longer than MAX_DELAY, and never
    /// starts one that was stopped or removed until it is started again.
    #[test]
    fn the_edge_never_sees_a_double_start_or_a_stray_signal(
        inputs in proptest::collection::vec(input(), 1..200)
    ) {
        const NAMES: [&str; 3] = ["a", "b", "c"];
        let mut s = Supervisor::new();
        let mut now = Time::ZERO;
        let mut spawning = BTreeSet::new();
        let mut running = BTreeSet::new();
        let mut held = BTreeSet::new(); // stopped or removed by the operator
        let act = |s: &Supervisor, actions: Vec<Action>,
                       spawning: &mut BTreeSet<String>,
                       running: &BTreeSet<String>,
                       held: &BTreeSet<String>| {
            for a in actions {
                match a {
                    Action::Spawn(n) => {
                        assert!(!spawning.contains(&n) && !running.contains(&n), "{n} started twice");
                        assert!(!held.contains(&n), "{n} started while stopped");
                        spawning.insert(n);
                    }
                    Action::Signal(n, _) => assert!(running.contains(&n), "{n} signalled, not running"),
                }
            }
            for svc in s.services().values() {
                assert!(svc.delay <= MAX_DELAY);
            }
        };
        for i in inputs {
            let actions = match i {
                Input::Tick(ms) => {
                    now += Duration::from_millis(ms);
                    s.tick(now)
                }
                Input::Exit(k, clean) => {
                    let n = NAMES[k];
                    if !running.remove(n) { continue; }
                    let exit = if clean { Exit::Code(0) } else { Exit::Signal(9) };
                    s.exited(n, exit, now)
                }
                Input::SpawnOk(k) => {
                    let n = NAMES[k];
                    if !spawning.remove(n) { continue; }
                    running.insert(n.to_string());
                    s.spawned(n, now)
                }
                Input::SpawnFail(k) => {
                    let n = NAMES[k];
                    if !spawning.remove(n) { continue; }
                    s.spawn_failed(n, "exec failed".into(), now)
                }
                Input::Cmd(k, c) => {
                    let n = NAMES[k];
                    let c = [Command::Start, Command::Stop, Command::Restart][c as usize];
                    match c {
                        Command::Stop => { held.insert(n.to_string()); }
                        _ => { held.remove(n); }
                    }
                    s.command(n, c, now).unwrap_or_default()
                }
                Input::Remove(k) => {
                    held.insert(NAMES[k].to_string());
                    s.remove(NAMES[k], now)
                }
                Input::Add(k) => {
                    held.remove(NAMES[k]);
                    s.add(NAMES[k], POLICY, now)
                }
            };
            act(&s, actions, &mut spawning, &running, &held);
        }
    }
}
