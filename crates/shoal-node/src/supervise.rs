//! The supervisor core (`docs/services.md`): when to start a node's
//! services, when to signal them, and how long to wait after a crash,
//! without I/O. The edge forks and execs on [`Action::Spawn`], signals on
//! [`Action::Signal`], and reports back what happened: [`Supervisor::spawned`],
//! [`Supervisor::spawn_failed`] and [`Supervisor::exited`]. Time is the
//! caller's monotonic clock, so the simulator can drive it
//! (`crates/shoal-sim/src/supervise.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use shoal_time::Time;

/// A service that ran at least this long restarts at once; one that ended
/// sooner waits (the back-off doubles from [`FIRST_DELAY`] to [`MAX_DELAY`]).
pub const STABLE_AFTER: Duration = Duration::from_secs(10);
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// When a service that ended is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    #[default]
    Always,
    /// Not after exit status 0.
    OnFailure,
    Never,
}

/// A service's policy, from its configuration table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub restart: Restart,
    /// Between SIGTERM and SIGKILL when stopping.
    pub stop_timeout: Duration,
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Kill,
}

/// What the edge is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Spawn(String),
    Signal(String, Sig),
}

/// An operator's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Start,
    Stop,
    Restart,
}

/// Where a service is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not running and not to be started.
    Stopped,
    /// Asked to start ([`Action::Spawn`] given), not confirmed yet.
    Spawning,
    Running {
        since: Time,
    },
    /// Waiting to be started again.
    Backoff {
        until: Time,
    },
    /// Sent SIGTERM; SIGKILL at `kill_at` unless it ends first.
    Stopping {
        kill_at: Time,
        killed: bool,
    },
}

/// One service's record, as `shoal service ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub policy: Policy,
    pub state: State,
    /// Whether the operator (or the configuration) wants it running.
    pub wanted: bool,
    /// Whether it leaves the supervisor once stopped (removed from the
    /// configuration).
    pub removing: bool,
    /// The next back-off delay.
    pub delay: Duration,
    pub starts: u64,
    pub last_exit: Option<Exit>,
    /// Why the last start failed, if it did.
    pub last_error: Option<String>,
}

impl Service {
    fn start(&mut self, name: &str) -> Action {
        self.state = State::Spawning;
        self.starts += 1;
        Action::Spawn(name.to_string())
    }
}

/// A node's services.
#[derive(Debug, Default)]
pub struct Supervisor {
    services: BTreeMap<String, Service>,
}

/// Errors of [`Supervisor::command`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperviseError {
    #[error("no service named {0:?} on this node")]
    Unknown(String),
}

impl Supervisor {
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// The services, by name.
    pub fn services(&self) -> &BTreeMap<String, Service> {
        &self.services
    }

    /// Adds a service to keep running (started at once); one of the same
    /// name gets the new policy and is restarted if it runs.
    pub fn add(&mut self, name: &str, policy: Policy, now: Time) -> Vec<Action> {
        if let Some(s) = self.services.get_mut(name) {
            s.policy = policy;
            s.removing = false;
            return self
                .command(name, Command::Restart, now)
                .unwrap_or_default();
        }
        self.services.insert(
            name.to_string(),
            Service {
                policy,
                state: State::Stopped,
                wanted: true,
                removing: false,
                delay: Duration::ZERO,
                starts: 0,
                last_exit: None,
                last_error: None,
            },
        );
        self.start(name)
    }

    /// Stops a service and forgets it once it has ended.
    pub fn remove(&mut self, name: &str, now: Time) -> Vec<Action> {
        let Some(s) = self.services.get_mut(name) else {
            return Vec::new();
        };
        s.removing = true;
        let actions = self.stop(name, now);
        self.forget_if_done(name);
        actions
    }

    /// Stops every service (the daemon is shutting down).
    pub fn shutdown(&mut self, now: Time) -> Vec<Action> {
        let names: Vec<String> = self.services.keys().cloned().collect();
        names.iter().flat_map(|n| self.stop(n, now)).collect()
    }

    /// Whether every service has ended (after [`Supervisor::shutdown`]).
    pub fn all_ended(&self) -> bool {
        self.services.values().all(|s| s.state == State::Stopped)
    }

    pub fn command(
        &mut self,
        name: &str,
        command: Command,
        now: Time,
    ) -> Result<Vec<Action>, SuperviseError> {
        let Some(s) = self.services.get_mut(name) else {
            return Err(SuperviseError::Unknown(name.to_string()));
        };
        Ok(match (command, s.state) {
            (Command::Stop, _) => self.stop(name, now),
            (Command::Restart, State::Running { .. }) => {
                // Started again when it ends (`exited`).
                let actions = self.stop(name, now);
                self.services.get_mut(name).expect("present").wanted = true;
                actions
            }
            (Command::Start | Command::Restart, state) => {
                s.wanted = true;
                s.delay = Duration::ZERO;
                match state {
                    State::Stopped | State::Backoff { .. } => self.start(name),
                    // Spawning or stopping: it runs, or restarts once ended.
                    _ => Vec::new(),
                }
            }
        })
    }

    /// The edge started the service's child.
    pub fn spawned(&mut self, name: &str, now: Time) -> Vec<Action> {
        let Some(s) = self.services.get_mut(name) else {
            return Vec::new();
        };
        if s.state != State::Spawning {
            return Vec::new();
        }
        s.state = State::Running { since: now };
        s.last_error = None;
        if !s.wanted {
            // Stopped while it was being started.
            return self.stop(name, now);
        }
        Vec::new()
    }

    /// The edge could not start the child (a missing program, say): it
    /// backs off as a crash at start would.
    pub fn spawn_failed(&mut self, name: &str, error: String, now: Time) -> Vec<Action> {
        let Some(s) = self.services.get_mut(name) else {
            return Vec::new();
        };
        if s.state != State::Spawning {
            return Vec::new();
        }
        s.last_error = Some(error);
        s.state = State::Running { since: now };
        self.exited(name, Exit::Code(127), now)
    }

    /// The service's child ended.
    pub fn exited(&mut self, name: &str, exit: Exit, now: Time) -> Vec<Action> {
        let Some(s) = self.services.get_mut(name) else {
            return Vec::new();
        };
        let (ran, restarting) = match s.state {
            State::Running { since } => (now.saturating_since(since), false),
            // Still wanted while stopping: an operator's restart.
            State::Stopping { .. } => (STABLE_AFTER, true),
            State::Stopped | State::Spawning | State::Backoff { .. } => return Vec::new(),
        };
        s.last_exit = Some(exit);
        let again = s.wanted
            && (restarting
                || match s.policy.restart {
                    Restart::Always => true,
                    Restart::OnFailure => exit != Exit::Code(0),
                    Restart::Never => false,
                });
        if !again {
            s.state = State::Stopped;
            s.wanted = false;
            self.forget_if_done(name);
            return Vec::new();
        }
        s.delay = if ran >= STABLE_AFTER {
            Duration::ZERO
        } else {
            (s.delay * 2).clamp(FIRST_DELAY, MAX_DELAY)
        };
        if s.delay.is_zero() {
            return self.start(name);
        }
        s.state = State::Backoff {
            until: now + s.delay,
        };
        Vec::new()
    }

    /// Time passes: back-offs end, stop timeouts expire.
    pub fn tick(&mut self, now: Time) -> Vec<Action> {
        let mut actions = Vec::new();
        for (name, s) in &mut self.services {
            match s.state {
                State::Backoff { until } if now >= until && s.wanted => {
                    actions.push(s.start(name));
                }
                State::Stopping { kill_at, killed } if now >= kill_at && !killed => {
                    s.state = State::Stopping {
                        kill_at,
                        killed: true,
                    };
                    actions.push(Action::Signal(name.clone(), Sig::Kill));
                }
                _ => {}
            }
        }
        actions
    }

    /// The earliest time [`Supervisor::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Time> {
        self.services
            .values()
            .filter_map(|s| match s.state {
                State::Backoff { until } if s.wanted => Some(until),
                State::Stopping {
                    kill_at,
                    killed: false,
                } => Some(kill_at),
                _ => None,
            })
            .min()
    }

    fn start(&mut self, name: &str) -> Vec<Action> {
        vec![self.services.get_mut(name).expect("present").start(name)]
    }

    fn stop(&mut self, name: &str, now: Time) -> Vec<Action> {
        let s = self.services.get_mut(name).expect("present");
        s.wanted = false;
        match s.state {
            State::Running { .. } => {
                s.state = State::Stopping {
                    kill_at: now + s.policy.stop_timeout,
                    killed: false,
                };
                vec![Action::Signal(name.to_string(), Sig::Term)]
            }
            State::Backoff { .. } => {
                s.state = State::Stopped;
                self.forget_if_done(name);
                Vec::new()
            }
            // Spawning: stopped once `spawned` confirms it.
            State::Spawning | State::Stopping { .. } | State::Stopped => Vec::new(),
        }
    }

    fn forget_if_done(&mut self, name: &str) {
        if self
            .services
            .get(name)
            .is_some_and(|s| s.removing && s.state == State::Stopped)
        {
            self.services.remove(name);
        }
    }
}

#[cfg(test)]
mod tests;
