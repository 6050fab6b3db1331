//! The node supervisor (`shoal_node::supervise::Supervisor`, the core the
//! daemon ships) over a simulated edge: children that crash at start, die
//! later or live on, spawns that fail, children that ignore SIGTERM, and
//! an operator who starts, stops, restarts, re-adds and removes services
//! at random times.  The edge does what the core says, as the daemon's
//! `supervise_io.rs` does with real processes, and a model of the rules
//! `docs/services.md` states checks every step.
//!
//! Checks:
//! - **no double start, no stray signal**: a spawn only for a service with
//!   no child and no spawn under way; a signal only to a live child;
//! - **back-off**: after a child that ran less than `STABLE_AFTER` ends
//!   on its own, the next spawn comes exactly when the doubled delay
//!   (from `FIRST_DELAY` up to `MAX_DELAY`) ends, not sooner or later;
//! - **policies**: `never` stays down after any end, `on-failure` after
//!   exit 0, until the operator starts it again; a stopped or removed
//!   service is never spawned;
//! - **stops end**: a child asked to stop is gone within its stop timeout
//!   (SIGKILL after it), and a restart brings it straight back;
//! - **one view**: the core's state agrees with the edge's children;
//! - **liveness**: once crashes stop, every service the operator wants
//!   runs; after `shutdown`, every child has ended.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_node::supervise::{
    Action, Command, Exit, FIRST_DELAY, MAX_DELAY, Policy, Restart, STABLE_AFTER, Sig, State,
    Supervisor,
};
use shoal_proto::Time;

use crate::timeline::{Timeline, Trace};

/// A scenario's shape.
#[derive(Debug, Clone)]
pub struct SuperviseSimConfig {
    pub services: usize,
    /// Simulated time with faults and commands, then time to settle.
    pub run: Duration,
    /// Chance that a spawn fails, a child ignores SIGTERM, a child dies
    /// soon after it started.
    pub spawn_fail_chance: f64,
    pub ignore_term_chance: f64,
    pub crash_early_chance: f64,
    /// Mean time between the operator's commands.
    pub command_every: Duration,
}

impl Default for SuperviseSimConfig {
    fn default() -> Self {
        SuperviseSimConfig {
            services: 4,
            run: Duration::from_secs(600),
            spawn_fail_chance: 0.1,
            ignore_term_chance: 0.3,
            crash_early_chance: 0.4,
            command_every: Duration::from_secs(20),
        }
    }
}

/// What a run saw.
#[derive(Debug, Default, Clone)]
pub struct SuperviseReport {
    pub spawns: u64,
    pub crashes: u64,
    pub backoffs: u64,
    pub kills: u64,
    pub commands: u64,
    pub violations: Vec<String>,
    /// The run's trace (with `SHOAL_SIM_TRACE` set).
    pub trace: Vec<String>,
}

/// Longest a spawn takes at the edge.
const SPAWN_MAX: Duration = Duration::from_millis(50);
/// Longest a child takes to end after a signal it obeys.
const DIE_MAX: Duration = Duration::from_millis(300);

/// The edge's child of one service.
#[derive(Debug, Clone, Copy)]
struct Child {
    pid: u64,
    started: Time,
    ignores_term: bool,
    /// When it ends, and how (one pending end at a time).
    end: Option<(Time, Exit)>,
}

/// The model's record of one service: what the rules promise.
#[derive(Debug, Clone)]
struct Model {
    policy: Policy,
    child: Option<Child>,
    spawning: bool,
    /// The operator wants it running.
    wanted: bool,
    /// Removed: forgotten once its child has ended.  (The operator may
    /// start it again before then: it runs until it next stops, and is
    /// forgotten then.)
    removed: bool,
    /// A stop or restart is under way (the end, when it comes, is asked
    /// for).
    stopping: bool,
    /// The child must be gone by then.
    gone_by: Option<Time>,
    /// The back-off delay the core should be using, and when the next
    /// spawn is due (exactly).
    delay: Duration,
    due: Option<Time>,
}

enum Event {
    SpawnDone(String),
    End(String, u64),
    Operator,
}

/// One seeded run.
pub struct SuperviseSim {
    cfg: SuperviseSimConfig,
    rng: ChaCha8Rng,
    sup: Supervisor,
    now: Time,
    models: BTreeMap<String, Model>,
    events: Timeline<Event>,
    next_pid: u64,
    /// Faults and commands stop after `cfg.run`.
    calm: bool,
    /// Every step (with `SHOAL_SIM_TRACE` set).
    trace: Trace,
    report: SuperviseReport,
}

impl SuperviseSim {
    pub fn new(seed: u64, cfg: SuperviseSimConfig) -> SuperviseSim {
        SuperviseSim {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            sup: Supervisor::new(),
            now: Time::ZERO,
            models: BTreeMap::new(),
            events: Timeline::new(),
            next_pid: 1,
            calm: false,
            trace: Trace::from_env(),
            report: SuperviseReport::default(),
        }
    }

    pub fn run(mut self) -> SuperviseReport {
        for i in 0..self.cfg.services {
            let name = format!("svc{i}");
            let policy = self.policy();
            self.add(&name, policy);
        }
        self.schedule_operator();
        let run = Time::ZERO + self.cfg.run;
        self.until(run);
        // Calm: no more crashes, failed spawns or commands; every child
        // that is to run comes up and stays.
        self.calm = true;
        for m in self.models.values_mut() {
            if let Some(c) = &mut m.child
                && !m.stopping
            {
                c.end = None;
            }
        }
        let settle = run + MAX_DELAY * 3;
        self.until(settle);
        self.check_settled();
        let actions = self.sup.shutdown(self.now);
        for m in self.models.values_mut() {
            m.wanted = false;
            m.due = None;
            if m.child.is_some() || m.spawning {
                m.stopping = true;
            }
        }
        self.perform(actions);
        let end = settle + Duration::from_secs(120);
        self.until(end);
        if !self.sup.all_ended() || self.models.values().any(|m| m.child.is_some()) {
            self.violation("after shutdown, children still run".to_string());
        }
        self.report.trace = self.trace.lines().to_vec();
        self.report
    }

    fn policy(&mut self) -> Policy {
        let restart = match self.rng.random_range(0..4) {
            0 => Restart::Never,
            1 => Restart::OnFailure,
            _ => Restart::Always,
        };
        Policy {
            restart,
            stop_timeout: Duration::from_millis(self.rng.random_range(100..10_000)),
        }
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        self.trace.line(self.now.0, what);
    }

    fn violation(&mut self, what: String) {
        let what = format!("t={}: {what}", self.now.0);
        self.trace
            .violation(self.now.0, &mut self.report.violations, what);
    }

    fn schedule_operator(&mut self) {
        let mean = self.cfg.command_every.as_millis() as u64;
        let gap = Duration::from_millis(self.rng.random_range(1..=2 * mean));
        self.events.at(self.now + gap, Event::Operator);
    }

    /// Runs events and the core's deadlines up to `end`.
    fn until(&mut self, end: Time) {
        loop {
            let event = self.events.peek();
            let deadline = self.sup.next_deadline();
            let at = [event, deadline]
                .into_iter()
                .flatten()
                .min()
                .filter(|&at| at <= end);
            let Some(at) = at else {
                self.now = end;
                self.check_due(end);
                return;
            };
            self.check_due(at);
            self.now = at;
            if event == Some(at) {
                let (_, e) = self.events.next(at).expect("an event");
                self.handle(e);
            } else {
                let actions = self.sup.tick(at);
                self.perform(actions);
            }
            self.check_views();
        }
    }

    fn handle(&mut self, e: Event) {
        match e {
            Event::SpawnDone(name) => self.spawn_done(&name),
            Event::End(name, pid) => self.end(&name, pid),
            Event::Operator if self.calm => {}
            Event::Operator => {
                self.operator();
                self.schedule_operator();
            }
        }
    }

    /// Does what the core said.
    fn perform(&mut self, actions: Vec<Action>) {
        for a in actions {
            self.log(|| format!("core: {a:?}"));
            match a {
                Action::Spawn(name) => self.spawn(&name),
                Action::Signal(name, sig) => self.signal(&name, sig),
            }
        }
    }

    fn spawn(&mut self, name: &str) {
        self.report.spawns += 1;
        let now = self.now;
        let Some(m) = self.models.get_mut(name) else {
            return self.violation(format!("spawned {name}, which is not a service"));
        };
        let mut wrong = Vec::new();
        if m.child.is_some() || m.spawning {
            wrong.push(format!("{name} spawned twice"));
        }
        if !m.wanted {
            wrong.push(format!(
                "{name} spawned, not wanted (removed: {})",
                m.removed
            ));
        }
        match m.due {
            Some(due) if due != now => {
                wrong.push(format!("{name} spawned at {now:?}, due at {due:?}"));
            }
            None if !wrong.is_empty() => {}
            None => wrong.push(format!("{name} spawned when no spawn was due")),
            Some(_) => {}
        }
        m.spawning = true;
        m.due = None;
        for w in wrong {
            self.violation(w);
        }
        let after = Duration::from_micros(self.rng.random_range(0..=SPAWN_MAX.as_micros() as u64));
        self.events
            .at(now + after, Event::SpawnDone(name.to_string()));
    }

    fn spawn_done(&mut self, name: &str) {
        let fail = !self.calm && self.rng.random_bool(self.cfg.spawn_fail_chance);
        let now = self.now;
        let Some(m) = self.models.get_mut(name) else {
            return;
        };
        m.spawning = false;
        self.log(|| format!("edge: {name} spawned (failed: {fail})"));
        if fail {
            let actions = self.sup.spawn_failed(name, "no such program".into(), now);
            // As an end at once: ran for nothing.
            self.ended(name, Exit::Code(127), Duration::ZERO);
            return self.perform(actions);
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        let ignores_term = self.rng.random_bool(self.cfg.ignore_term_chance);
        let end = if self.calm {
            None
        } else {
            let life = if self.rng.random_bool(self.cfg.crash_early_chance) {
                self.rng.random_range(0..STABLE_AFTER.as_millis() as u64)
            } else {
                self.rng
                    .random_range(0..6 * STABLE_AFTER.as_millis() as u64)
            };
            let exit = match self.rng.random_range(0..3) {
                0 => Exit::Code(0),
                1 => Exit::Code(1),
                _ => Exit::Signal(11),
            };
            Some((now + Duration::from_millis(life), exit))
        };
        let m = self.models.get_mut(name).expect("present");
        if m.stopping && m.wanted {
            // Stopped while being started, then started again: the stop
            // is off.
            m.stopping = false;
        }
        m.child = Some(Child {
            pid,
            started: now,
            ignores_term,
            end,
        });
        if m.stopping && !m.wanted {
            // Stopped while it was being started: SIGTERM comes now.
            m.gone_by = Some(now + m.policy.stop_timeout + DIE_MAX);
        }
        if let Some((at, _)) = end {
            self.events.at(at, Event::End(name.to_string(), pid));
        }
        let actions = self.sup.spawned(name, now);
        self.perform(actions);
    }

    fn signal(&mut self, name: &str, sig: Sig) {
        let now = self.now;
        let die = Duration::from_micros(self.rng.random_range(1..=DIE_MAX.as_micros() as u64));
        let Some(c) = self.models.get_mut(name).and_then(|m| m.child.as_mut()) else {
            return self.violation(format!("{sig:?} to {name}, which has no child"));
        };
        let (exit, obeys) = match sig {
            Sig::Term => (Exit::Signal(15), !c.ignores_term),
            Sig::Kill => (Exit::Signal(9), true),
        };
        if !obeys {
            return;
        }
        if sig == Sig::Kill {
            self.report.kills += 1;
        }
        let at = now + die;
        if c.end.is_some_and(|(t, _)| t <= at) {
            return;
        }
        c.end = Some((at, exit));
        let pid = c.pid;
        self.events.at(at, Event::End(name.to_string(), pid));
    }

    /// A child's end, if it is still that child's and still due now.
    fn end(&mut self, name: &str, pid: u64) {
        let now = self.now;
        let Some(m) = self.models.get_mut(name) else {
            return;
        };
        let Some(c) = m.child else {
            return;
        };
        let Some((at, exit)) = c.end else {
            return;
        };
        if c.pid != pid || at != now {
            return;
        }
        m.child = None;
        m.gone_by = None;
        let stopping = m.stopping;
        self.log(|| format!("edge: {name} ended {exit:?} (stopping: {stopping})"));
        let m = self.models.get_mut(name).expect("present");
        if !m.stopping {
            self.report.crashes += 1;
        }
        let ran = now.saturating_since(c.started);
        let actions = self.sup.exited(name, exit, now);
        self.ended(name, exit, ran);
        self.perform(actions);
    }

    /// The model's side of an end: what must happen next.
    fn ended(&mut self, name: &str, exit: Exit, ran: Duration) {
        let now = self.now;
        let m = self.models.get_mut(name).expect("present");
        if m.stopping {
            m.stopping = false;
            if m.wanted {
                // A restart: straight back.
                m.delay = Duration::ZERO;
                m.due = Some(now);
            } else if m.removed {
                self.models.remove(name);
            }
            return;
        }
        let again = m.wanted
            && match m.policy.restart {
                Restart::Always => true,
                Restart::OnFailure => exit != Exit::Code(0),
                Restart::Never => false,
            };
        if !again {
            m.wanted = false;
            if m.removed {
                self.models.remove(name);
            }
            return;
        }
        m.delay = if ran >= STABLE_AFTER {
            Duration::ZERO
        } else {
            (m.delay * 2).clamp(FIRST_DELAY, MAX_DELAY)
        };
        if !m.delay.is_zero() {
            self.report.backoffs += 1;
        }
        m.due = Some(now + m.delay);
    }

    fn add(&mut self, name: &str, policy: Policy) {
        let now = self.now;
        let known = self.models.contains_key(name);
        if known {
            self.models.get_mut(name).expect("present").policy = policy;
            self.models.get_mut(name).expect("present").removed = false;
            self.command_model(name, Command::Restart);
        } else {
            self.models.insert(
                name.to_string(),
                Model {
                    policy,
                    child: None,
                    spawning: false,
                    wanted: true,
                    removed: false,
                    stopping: false,
                    gone_by: None,
                    delay: Duration::ZERO,
                    due: Some(now),
                },
            );
        }
        let actions = self.sup.add(name, policy, now);
        self.perform(actions);
    }

    /// One command of the operator's, on a service chosen at random
    /// (sometimes one that is gone, which the core must refuse).
    fn operator(&mut self) {
        self.report.commands += 1;
        let now = self.now;
        let name = format!("svc{}", self.rng.random_range(0..self.cfg.services));
        let what = self.rng.random_range(0..10);
        if what == 0 {
            let policy = self.policy();
            self.log(|| format!("operator: add {name} {policy:?}"));
            return self.add(&name, policy);
        }
        if what == 1 {
            self.log(|| format!("operator: remove {name}"));
            if let Some(m) = self.models.get_mut(&name) {
                m.removed = true;
            }
            self.command_model(&name, Command::Stop);
            let actions = self.sup.remove(&name, now);
            if self
                .models
                .get(&name)
                .is_some_and(|m| m.child.is_none() && !m.spawning)
            {
                self.models.remove(&name);
            }
            return self.perform(actions);
        }
        let command = match what {
            2..=4 => Command::Start,
            5..=7 => Command::Stop,
            _ => Command::Restart,
        };
        let known = self.models.contains_key(&name);
        self.log(|| format!("operator: {command:?} {name}"));
        match self.sup.command(&name, command, now) {
            Ok(actions) if known => {
                self.command_model(&name, command);
                // A removed service stopped with nothing running is
                // forgotten at once.
                if self
                    .models
                    .get(&name)
                    .is_some_and(|m| m.removed && !m.wanted && m.child.is_none() && !m.spawning)
                {
                    self.models.remove(&name);
                }
                self.perform(actions);
            }
            Ok(_) => self.violation(format!("{command:?} of {name}, removed, was taken")),
            Err(_) if known => self.violation(format!("{command:?} of {name} was refused")),
            Err(_) => {}
        }
    }

    /// The model's side of an operator's command.
    fn command_model(&mut self, name: &str, command: Command) {
        let now = self.now;
        let Some(m) = self.models.get_mut(name) else {
            return;
        };
        let running = m.child.is_some();
        match command {
            Command::Stop => {
                m.wanted = false;
                m.due = None;
                if running && !m.stopping {
                    m.stopping = true;
                    m.gone_by = Some(now + m.policy.stop_timeout + DIE_MAX);
                } else if m.spawning {
                    m.stopping = true;
                }
            }
            Command::Start | Command::Restart => {
                m.wanted = true;
                m.delay = Duration::ZERO;
                if m.spawning {
                    // Stopped while being started, then started again.
                    m.stopping = false;
                }
                if command == Command::Restart && running && !m.stopping {
                    m.stopping = true;
                    m.gone_by = Some(now + m.policy.stop_timeout + DIE_MAX);
                } else if !running && !m.spawning && !m.stopping {
                    m.due = Some(now);
                }
            }
        }
    }

    /// Nothing due before `at` was left undone.
    fn check_due(&mut self, at: Time) {
        let mut late = Vec::new();
        for (name, m) in &self.models {
            if let Some(due) = m.due
                && due < at
            {
                late.push(format!("{name} was due to spawn at {due:?} and was not"));
            }
            if let Some(by) = m.gone_by
                && by < at
            {
                late.push(format!("{name}'s child outlived its stop ({by:?})"));
            }
        }
        for l in late {
            self.violation(l);
        }
        for m in self.models.values_mut() {
            if m.due.is_some_and(|d| d < at) {
                m.due = None;
            }
            if m.gone_by.is_some_and(|b| b < at) {
                m.gone_by = None;
            }
        }
    }

    /// The core's view agrees with the edge's children.
    fn check_views(&mut self) {
        let mut wrong = Vec::new();
        for (name, s) in self.sup.services() {
            let Some(m) = self.models.get(name) else {
                wrong.push(format!("the core keeps {name}, which was forgotten"));
                continue;
            };
            let agrees = match s.state {
                State::Running { .. } | State::Stopping { .. } => m.child.is_some(),
                State::Spawning => m.spawning,
                State::Stopped | State::Backoff { .. } => m.child.is_none() && !m.spawning,
            };
            if !agrees {
                wrong.push(format!(
                    "{name}: the core says {:?}, the edge has a child: {}, spawning: {}",
                    s.state,
                    m.child.is_some(),
                    m.spawning
                ));
            }
        }
        for name in self.models.keys() {
            if !self.sup.services().contains_key(name) {
                wrong.push(format!("the core forgot {name}"));
            }
        }
        for w in wrong {
            self.violation(w);
        }
    }

    /// After the calm: what the operator wants runs, the rest does not.
    fn check_settled(&mut self) {
        let mut wrong = Vec::new();
        for (name, m) in &self.models {
            let state = self.sup.services().get(name).map(|s| s.state);
            let runs = m.child.is_some() && matches!(state, Some(State::Running { .. }));
            if m.wanted && !runs {
                wrong.push(format!("{name} is wanted and does not run: {state:?}"));
            }
            if !m.wanted && m.child.is_some() {
                wrong.push(format!("{name} is not wanted and runs: {state:?}"));
            }
        }
        for w in wrong {
            self.violation(w);
        }
    }
}
