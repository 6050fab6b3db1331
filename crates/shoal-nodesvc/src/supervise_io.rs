//! The supervisor's edge (`docs/services.md`): it does what
//! [`shoal_node::supervise::Supervisor`] says with real processes.
//!
//! - The `supervise` thread ticks the core (back-offs ending, stop
//!   timeouts expiring) and performs its actions: a spawn goes through
//!   the exec service's spawner (`crate::spawn`, the same three processes
//!   as a `shoal run` program, without namespaces), a signal goes to the
//!   child's process group.
//! - One `svc-NAME` thread per running child copies its stdout and
//!   stderr into its log (`crate::service_log`) and reports its end.
//!
//! The core and the children's records share one mutex; every action is
//! performed under it, so the core never sees an edge out of step.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use shoal_pool::exec::StartSpec;
use shoal_proto::Time;

use crate::config::ServiceConfig;
use crate::service::ServiceStatus;
use crate::service_log::Log;
use crate::spawn::{Change, Io, Spawned, Spawner};
use shoal_node::supervise::{Action, Command, Exit, Sig, State, Supervisor};

/// Longest the `supervise` thread sleeps before it looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);
/// How long a child's output is still read after it ended (what it
/// printed last).
const DRAIN: Duration = Duration::from_millis(200);

/// A node's services and their children.
pub(crate) struct Services {
    inner: Mutex<Inner>,
    /// Notified when the core may have something to do sooner.
    wake: Condvar,
    spawner: Arc<Spawner>,
    /// `STATE_DIR/services`: the logs.
    dir: PathBuf,
    /// The node's link socket, the children's `SHOAL_NODE`.
    socket: PathBuf,
    /// The core's clock starts here.
    epoch: Instant,
    /// Set when the daemon stops: every service is stopped.
    stopping: AtomicBool,
}

struct Inner {
    core: Supervisor,
    children: BTreeMap<String, Child>,
}

/// What the edge keeps of one service.
struct Child {
    config: ServiceConfig,
    /// The running child's process group (its watcher's pid).
    group: Option<libc::pid_t>,
    log: Arc<Mutex<Log>>,
    /// Exits of each kind, for the metrics.
    exits: BTreeMap<&'static str, u64>,
}

impl Services {
    /// No services yet: [`Services::reload`] gives them, [`Services::run`]
    /// keeps them.
    pub fn new(
        spawner: Arc<Spawner>,
        state_dir: &std::path::Path,
        socket: PathBuf,
    ) -> Result<Arc<Services>, String> {
        let dir = state_dir.join("services");
        crate::service_log::private_dir(&dir)?;
        let services = Arc::new(Services {
            inner: Mutex::new(Inner {
                core: Supervisor::new(),
                children: BTreeMap::new(),
            }),
            wake: Condvar::new(),
            spawner,
            dir,
            socket,
            epoch: Instant::now(),
            stopping: AtomicBool::new(false),
        });
        Ok(services)
    }

    /// Has the `supervise` thread look at the stop flag now.
    pub fn wake(&self) {
        self.wake.notify_all();
    }

    fn now(&self) -> Time {
        Time::ZERO + self.epoch.elapsed()
    }

    /// Takes a new set of services: new ones start, removed ones stop,
    /// changed ones restart; unchanged ones are left alone.
    pub fn reload(self: &Arc<Self>, configs: &[ServiceConfig]) -> Result<(), String> {
        crate::config::check_services(configs)?;
        let mut inner = self.inner.lock();
        let now = self.now();
        let mut actions = Vec::new();
        let gone: Vec<String> = inner
            .children
            .keys()
            .filter(|n| !configs.iter().any(|c| &c.name == *n))
            .cloned()
            .collect();
        for name in gone {
            tracing::info!(service = %name, "service removed from the configuration");
            actions.extend(inner.core.remove(&name, now));
        }
        for config in configs {
            if inner.children.get(&config.name).map(|c| &c.config) == Some(config) {
                continue;
            }
            match inner.children.get_mut(&config.name) {
                Some(child) => {
                    child.config = config.clone();
                    child
                        .log
                        .lock()
                        .set_limits(config.log_bytes, config.log_keep);
                }
                None => {
                    let log =
                        Log::open(&self.dir, &config.name, config.log_bytes, config.log_keep)?;
                    inner.children.insert(
                        config.name.clone(),
                        Child {
                            config: config.clone(),
                            group: None,
                            log: Arc::new(Mutex::new(log)),
                            exits: BTreeMap::new(),
                        },
                    );
                }
            }
            actions.extend(inner.core.add(&config.name, config.policy(), now));
        }
        self.perform(&mut inner, actions);
        self.forget_removed(&mut inner);
        self.wake.notify_all();
        Ok(())
    }

    /// The `supervise` thread: until the daemon stops and every child
    /// has ended.
    pub fn run(self: &Arc<Self>, stop: &AtomicBool) {
        let mut inner = self.inner.lock();
        loop {
            let now = self.now();
            if stop.load(Ordering::Acquire) && !self.stopping.swap(true, Ordering::AcqRel) {
                let actions = inner.core.shutdown(now);
                self.perform(&mut inner, actions);
            }
            if self.stopping.load(Ordering::Acquire) && inner.core.all_ended() {
                return;
            }
            let actions = inner.core.tick(now);
            self.perform(&mut inner, actions);
            self.forget_removed(&mut inner);
            let wait = inner
                .core
                .next_deadline()
                .map_or(POLL, |d| d.saturating_since(self.now()).min(POLL));
            self.wake.wait_for(&mut inner, wait);
        }
    }

    /// An operator's `start`, `stop` or `restart`.
    pub fn command(self: &Arc<Self>, name: &str, command: Command) -> Result<(), String> {
        let mut inner = self.inner.lock();
        if self.stopping.load(Ordering::Acquire) {
            return Err("the node is shutting down".into());
        }
        let actions = inner
            .core
            .command(name, command, self.now())
            .map_err(|e| e.to_string())?;
        if let Some(child) = inner.children.get(name) {
            child
                .log
                .lock()
                .note(&format!("{} by an operator", command_word(command)));
        }
        self.perform(&mut inner, actions);
        self.wake.notify_all();
        Ok(())
    }

    /// Service `name`'s log and the uid it runs as (`u32::MAX` if its
    /// user has no account here), if the service exists.
    pub fn log(&self, name: &str) -> Option<(u32, Arc<Mutex<Log>>)> {
        let inner = self.inner.lock();
        let child = inner.children.get(name)?;
        let uid = user_of(&child.config).map_or(u32::MAX, |(uid, ..)| uid);
        Some((uid, child.log.clone()))
    }

    /// Every service, as `shoal service ls` shows it.
    pub fn list(&self) -> Vec<ServiceStatus> {
        let inner = self.inner.lock();
        let now = self.now();
        inner
            .core
            .services()
            .iter()
            .filter_map(|(name, s)| {
                let child = inner.children.get(name)?;
                let (state, for_s) = match s.state {
                    State::Stopped => ("stopped", None),
                    State::Spawning => ("starting", None),
                    State::Running { since } => ("running", Some(now.saturating_since(since))),
                    State::Backoff { until } => ("backoff", Some(until.saturating_since(now))),
                    State::Stopping { .. } => ("stopping", None),
                };
                Some(ServiceStatus {
                    name: name.clone(),
                    state: state.into(),
                    pid: child.group.and_then(program_pid),
                    user: child.config.user.clone().unwrap_or_else(daemon_user),
                    system: child.config.system,
                    command: child.config.command[0].clone(),
                    starts: s.starts,
                    last_exit: s.last_exit.map(describe),
                    error: s.last_error.clone(),
                    for_s: for_s.map(|d| d.as_secs_f64()),
                    exits: child
                        .exits
                        .iter()
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect(),
                })
            })
            .collect()
    }

    /// Whether `pid` is the program of a running service allowed to serve
    /// system ports (its watcher is the pid's parent; a process the
    /// program forks is not).
    pub fn is_system(&self, pid: i32) -> bool {
        let Some(parent) = crate::procfs::parent(pid) else {
            return false;
        };
        let inner = self.inner.lock();
        inner
            .children
            .values()
            .any(|c| c.config.system && c.group == Some(parent))
    }

    fn forget_removed(&self, inner: &mut Inner) {
        let Inner { core, children } = inner;
        children.retain(|name, _| core.services().contains_key(name));
    }

    /// Does what the core says, and what it says in answer, under the lock.
    fn perform(self: &Arc<Self>, inner: &mut Inner, actions: Vec<Action>) {
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let now = self.now();
            match action {
                Action::Spawn(name) => match self.spawn(inner, &name) {
                    Ok(()) => queue.extend(inner.core.spawned(&name, now)),
                    Err(e) => {
                        tracing::warn!(service = %name, "{e}");
                        if let Some(child) = inner.children.get(&name) {
                            child.log.lock().note(&e);
                        }
                        queue.extend(inner.core.spawn_failed(&name, e, now));
                        self.note_backoff(inner, &name);
                    }
                },
                Action::Signal(name, sig) => {
                    let Some(group) = inner.children.get(&name).and_then(|c| c.group) else {
                        continue;
                    };
                    let signal = match sig {
                        Sig::Term => libc::SIGTERM,
                        Sig::Kill => libc::SIGKILL,
                    };
                    // SAFETY: kill has no memory effects; the group is the
                    // child's, which has not been reaped (its watcher
                    // reports the end before it exits).
                    unsafe { libc::kill(-group, signal) };
                }
            }
        }
    }

    fn spawn(self: &Arc<Self>, inner: &mut Inner, name: &str) -> Result<(), String> {
        let child = inner
            .children
            .get_mut(name)
            .ok_or_else(|| format!("service {name} has no configuration"))?;
        let spec = start_spec(&child.config, &self.socket)?;
        let (spawned, io) = self.spawner.spawn(&spec, false)?;
        let Io::Pipes {
            stdin,
            stdout,
            stderr,
        } = io
        else {
            unreachable!("services run without a terminal");
        };
        drop(stdin);
        child.group = Some(spawned.group);
        child.log.lock().note(&format!(
            "started {} (pid {})",
            child.config.command[0],
            program_pid(spawned.group).unwrap_or(spawned.group as u32)
        ));
        let log = child.log.clone();
        let services = self.clone();
        let owned = name.to_string();
        std::thread::Builder::new()
            .name(format!("svc-{name}"))
            .spawn(move || {
                let exit = watch(spawned, stdout, stderr, &log);
                services.exited(&owned, exit);
            })
            .map_err(|e| format!("cannot start a thread for service {name}: {e}"))?;
        Ok(())
    }

    /// A child ended.
    fn exited(self: &Arc<Self>, name: &str, exit: Exit) {
        let mut inner = self.inner.lock();
        let now = self.now();
        if let Some(child) = inner.children.get_mut(name) {
            child.group = None;
            let kind = match exit {
                Exit::Code(0) => "exited",
                Exit::Code(_) => "failed",
                Exit::Signal(_) => "killed",
            };
            *child.exits.entry(kind).or_default() += 1;
            child.log.lock().note(&format!("ended: {}", describe(exit)));
        }
        tracing::info!(service = %name, "service ended: {}", describe(exit));
        let actions = inner.core.exited(name, exit, now);
        self.perform(&mut inner, actions);
        self.note_backoff(&mut inner, name);
        self.forget_removed(&mut inner);
        self.wake.notify_all();
    }

    /// Logs the wait before the next start, if the service waits.
    fn note_backoff(&self, inner: &mut Inner, name: &str) {
        if let (Some(s), Some(child)) = (inner.core.services().get(name), inner.children.get(name))
            && let State::Backoff { until } = s.state
        {
            let wait = until.saturating_since(self.now());
            child
                .log
                .lock()
                .note(&format!("starting again in {:.0} s", wait.as_secs_f64()));
        }
    }
}

fn command_word(command: Command) -> &'static str {
    match command {
        Command::Start => "start",
        Command::Stop => "stop",
        Command::Restart => "restart",
    }
}

/// How a child ended, in words.
pub(crate) fn describe(exit: Exit) -> String {
    match exit {
        Exit::Code(c) => format!("exit status {c}"),
        Exit::Signal(s) => format!("killed by signal {s}"),
    }
}

/// The account a service runs as: uid, gid, home, name.
/// Without `user`, the daemon's own (root, for an installed node).
fn user_of(config: &ServiceConfig) -> Result<(u32, u32, PathBuf, String), String> {
    let name = config.user.clone().unwrap_or_else(daemon_user);
    let p = crate::account::by_name(&name)
        .ok_or_else(|| format!("service {}: no user {name} on this node", config.name))?;
    Ok((p.uid, p.gid, p.home, name))
}

/// The name of the daemon's user.
fn daemon_user() -> String {
    // SAFETY: geteuid cannot fail.
    crate::account::user_name(unsafe { libc::geteuid() })
}

/// What the spawner is to start for `config`: its program (beside the
/// daemon's binary if there), as its user with that user's groups, in a
/// clean environment, in `/`.
fn start_spec(config: &ServiceConfig, socket: &std::path::Path) -> Result<StartSpec, String> {
    let (uid, gid, home, user) = user_of(config)?;
    let groups = crate::account::lookup(uid).map_or_else(|| vec![gid], |a| a.groups);
    let mut argv = config.command.clone();
    if !argv[0].contains('/')
        && let Some(beside) = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(&argv[0])))
            .filter(|p| p.is_file())
    {
        argv[0] = beside.to_string_lossy().into_owned();
    }
    let mut env = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        format!("HOME={}", home.display()),
        format!("USER={user}"),
        format!("LOGNAME={user}"),
        format!("SHOAL_NODE={}", socket.display()),
        format!("SHOAL_SERVICE={}", config.name),
    ];
    for (k, v) in &config.env {
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
    Ok(StartSpec {
        argv,
        env,
        cwd: "/".into(),
        uid,
        gid,
        groups,
        umask: 0o022,
        rlimits: Vec::new(),
        hostname: String::new(),
        tty: None,
    })
}

/// The program under the watcher `group` leads.
fn program_pid(group: libc::pid_t) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{group}/task/{group}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Copies a child's output into its log until it ends; how it ended.
fn watch(mut spawned: Spawned, stdout: File, stderr: File, log: &Mutex<Log>) -> Exit {
    let mut streams = [Stream::new(stdout, "out"), Stream::new(stderr, "err")];
    let mut end = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        let mut fds: Vec<libc::pollfd> = streams
            .iter()
            .filter(|s| s.open)
            .map(|s| libc::pollfd {
                fd: s.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let status_at = fds.len();
        if end.is_none() {
            fds.push(libc::pollfd {
                fd: spawned.status_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if fds.is_empty() {
            break;
        }
        let timeout = match drain_until {
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                left.as_millis() as i32 + 1
            }
            None => -1,
        };
        // SAFETY: poll reads and writes `fds`, ours, of the length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if end.is_none() && fds[status_at].revents != 0 {
            end = Some(loop {
                match spawned.next_change() {
                    Some(Change::Exited(c)) => break Exit::Code(c),
                    Some(Change::Killed(s)) => break Exit::Signal(s),
                    Some(Change::Stopped(_) | Change::Continued) => continue,
                    // The watcher is gone without a word: killed with it.
                    None => break Exit::Signal(libc::SIGKILL),
                }
            });
            drain_until = Some(Instant::now() + DRAIN);
        }
        // The polled streams are the open ones, in order.
        for (i, s) in streams.iter_mut().filter(|s| s.open).enumerate() {
            if fds[i].revents != 0 {
                s.read(log);
            }
        }
    }
    for s in &mut streams {
        s.flush(log);
    }
    end.unwrap_or(Exit::Signal(libc::SIGKILL))
}

/// One of a child's output streams, cut into lines.
struct Stream {
    file: File,
    tag: &'static str,
    open: bool,
    partial: Vec<u8>,
}

impl Stream {
    fn new(file: File, tag: &'static str) -> Stream {
        Stream {
            file,
            tag,
            open: true,
            partial: Vec::new(),
        }
    }

    fn read(&mut self, log: &Mutex<Log>) {
        let mut buf = [0u8; 16 * 1024];
        match self.file.read(&mut buf) {
            Ok(0) | Err(_) => self.open = false,
            Ok(n) => {
                self.partial.extend_from_slice(&buf[..n]);
                let mut log = log.lock();
                while let Some(at) = self.partial.iter().position(|&b| b == b'\n') {
                    log.line(self.tag, &self.partial[..at]);
                    self.partial.drain(..=at);
                }
                if self.partial.len() >= crate::service_log::MAX_LINE {
                    log.line(self.tag, &self.partial);
                    self.partial.clear();
                }
            }
        }
    }

    fn flush(&mut self, log: &Mutex<Log>) {
        if !self.partial.is_empty() {
            log.lock().line(self.tag, &self.partial);
            self.partial.clear();
        }
    }
}
