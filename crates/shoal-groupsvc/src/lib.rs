//! Group communication for programs: reliable, totally ordered broadcast
//! with a resilience degree (Amoeba's `CreateGroup`, `JoinGroup`,
//! `SendToGroup`, `ReceiveFromGroup`, `LeaveGroup`, `ResetGroup`,
//! `GetInfoGroup`).
//!
//! ```no_run
//! use shoal_rpc::Context;
//! use shoal_groupsvc::{Delivery, Group, GroupOptions};
//!
//! # fn main() -> Result<(), shoal_groupsvc::GroupError> {
//! let ctx = Context::from_env()?;
//! let group = Group::create(&ctx, GroupOptions { resilience: 1, ..Default::default() })?;
//! println!("join with {}", group.port());          // give this to the others
//! group.send(b"hello")?;                             // returns once ordered
//! loop {
//!     match group.receive(None)? {
//!         Delivery::Message { seq, body, .. } => println!("{seq}: {body:?}"),
//!         other => println!("{other:?}"),
//!     }
//! }
//! # }
//! ```
//!
//! Each member runs the protocol core (`shoal-group`) in its own process;
//! the node daemon only makes the group's members findable (they register
//! the group's locate port, as servers register theirs).  Messages go by IP
//! multicast on a cluster network that has broadcast (the local cluster's
//! bridge), else by one datagram per member.
//!
//! Threads: a thread inside [`Group::send`] or [`Group::receive`] reads the
//! member's sockets itself while it waits (polling for a while, then
//! sleeping in `poll`), so the answer it waits for wakes nobody else; an I/O
//! thread per member does the same work, and runs the timers, whenever no
//! application thread is inside, and steps aside (kicked out of its `poll`)
//! when one enters.  A member that nobody waits on (not the sequencer, not
//! an acknowledger) takes its datagrams in 1 ms batches.
//!
//! The rest of the crate: `keys.rs`, each member's key service (its
//! server and threads; what they decide is `shoal_group::keys`, and each
//! datagram is sealed by `shoal_group::seal`); `find.rs`, finding members
//! and admitting joiners; `member_io.rs`, the member's sockets and
//! threads.
//!
//! **Architecture invariant:** an I/O shell; every protocol decision is in
//! `shoal-group`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use shoal_cap::{GetPort, PutPort};
use shoal_group::{Event, GroupConfig, GroupCore, MemberEntry, MemberId};
pub use shoal_group::{GroupInfo, GroupSeq, Incarnation, SendError, Status};
use shoal_wire::{MAX_DATAGRAM, Nonce};

pub use crate::find::{Found, inspect, locate};
use crate::find::{admitted, register};
use crate::keys::{Behind, KeyHost, KeyService, Sequencing, SharedKeys};
use shoal_group::keys::{KeyCore, Keys};
use shoal_group::seal::GroupSeal;
use shoal_rpc::clock;
use shoal_rpc::link::Link;
use shoal_rpc::socket;
use shoal_rpc::spin::Window;
use shoal_rpc::{Context, DEFAULT_SPIN};

mod find;
pub mod keys;
mod member_io;

use member_io::Active;

/// Why a group call failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error(transparent)]
    Rpc(#[from] shoal_rpc::Error),
    #[error(
        "no member of group {0} answered (is the group running? was it created on this cluster?)"
    )]
    NotFound(PutPort),
    #[error(
        "joining group {0} timed out: its members did not admit this process (a group admits only programs of its creator's uid, unless created --open)"
    )]
    JoinFailed(PutPort),
    #[error("group {0} did not admit this process: {1}")]
    NotAdmitted(PutPort, String),
    #[error("this process is no longer a member of the group (expelled or left); join again")]
    NotMember,
    #[error("the group has not ordered the message within {0:?}; it may still be ordered")]
    Timeout(Duration),
    #[error("message of {len} bytes is larger than the group allows ({limit} bytes)")]
    TooLarge { len: usize, limit: usize },
    #[error("network i/o failed: {0}")]
    Io(#[from] io::Error),
}

/// What [`Group::receive`] returns, in the group's total order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Message {
        seq: GroupSeq,
        sender: MemberId,
        body: Bytes,
    },
    Joined {
        seq: GroupSeq,
        member: MemberId,
        addr: SocketAddr,
    },
    Left {
        seq: GroupSeq,
        member: MemberId,
    },
    /// A reset installed a new incarnation with these members.
    View {
        seq: GroupSeq,
        incarnation: Incarnation,
        members: Vec<MemberId>,
    },
    /// This member joined: the group's state (from the state callback of
    /// the member that admitted it) as of `seq`.
    State {
        seq: GroupSeq,
        state: Bytes,
    },
    /// A reset could not gather enough members; the group retries.  Call
    /// [`Group::reset`] with a lower minimum to go on with fewer (accepting
    /// that messages only the absent members hold may be lost).
    ResetFailed {
        have: usize,
        need: usize,
    },
}

/// Parameters of a group.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// Resilience degree r: a sent message survives any r simultaneous
    /// member crashes (the sequencer's included).  Fixed at creation.
    pub resilience: usize,
    /// Messages of at least this many bytes are broadcast by their sender
    /// (BB), smaller ones go through the sequencer (PB).
    pub large_bytes: usize,
    /// Least number of members a reset needs (default: a majority, and at
    /// least all but r).
    pub min_members: Option<usize>,
    /// Bytes of history the sequencer keeps before a lagging member is
    /// expelled.
    pub history_bytes: usize,
    /// Use IP multicast: `None` decides from the cluster network (yes on a
    /// network with broadcast).
    pub multicast: Option<bool>,
    /// How long [`Group::send`] waits for its message to be ordered.
    pub send_timeout: Duration,
    /// How long joining may take.
    pub join_timeout: Duration,
    /// The new group's name ([`Group::create`] only; default: a fresh
    /// random port, open or owned as `open` says).  Services whose members
    /// must find their group again after a restart derive it from their
    /// own secret.
    pub port: Option<PutPort>,
    /// A new group admits anyone who knows its port, not only programs of
    /// its creator's uid ([`Group::create`] only; see
    /// [`shoal_group::keys::is_open`]).
    pub open: bool,
    /// Members only on the nodes the service map names as the servers of
    /// this system port (a replicated system service's own: see
    /// [`crate::served_by`]): a member's key service admits, and takes
    /// rekeys from, no caller on another node.
    pub members_serve: Option<PutPort>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        let core = GroupConfig::default();
        Self {
            resilience: 0,
            large_bytes: core.large_bytes,
            min_members: None,
            history_bytes: core.history_bytes,
            multicast: None,
            send_timeout: Duration::from_secs(10),
            join_timeout: core.join_timeout,
            port: None,
            open: false,
            members_serve: None,
        }
    }
}

/// The port under which a group's members register with their nodes, so a
/// joiner can find them: derived from the group's port, so anyone who knows
/// the group can find it and only members register it.
pub fn locate_port(group: &PutPort) -> GetPort {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(group.as_bytes());
    GetPort::derive(&key, "shoal 2026 group locate v1")
}

/// The multicast address of a group: 239.77.x.y, port 20000–31999 (below
/// the kernel's ephemeral ports, which unicast sockets take), from the
/// group's port.
pub fn multicast_addr(group: &PutPort) -> SocketAddrV4 {
    let h = fnv(group.as_bytes());
    SocketAddrV4::new(
        Ipv4Addr::new(239, 77, (h >> 8) as u8, h as u8),
        20_000 + ((h >> 16) % 12_000) as u16,
    )
}

fn fnv(bytes: &[u8]) -> u64 {
    // FNV-1a: the address only has to spread groups, not resist anyone.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

type StateFn = Box<dyn FnMut() -> Vec<u8> + Send>;

/// A member's sockets: unicast, multicast (socket and group address) if
/// used, and its identity.
type Sockets = (UdpSocket, Option<(UdpSocket, SocketAddrV4)>, MemberEntry);

struct Shared {
    core: Mutex<Inner>,
    /// Wakes threads waiting for a send to complete (or window room).
    sent_cv: Condvar,
    /// Wakes threads waiting for deliveries, or for the member's status.
    events_cv: Condvar,
    /// Wakes the I/O thread when application threads stop polling.
    io_cv: Condvar,
    socket: UdpSocket,
    mcast: Option<(UdpSocket, SocketAddrV4)>,
    closed: AtomicBool,
    group: PutPort,
    /// Application threads inside `send` or `receive`, which read the
    /// sockets themselves while they wait: the I/O thread stays out of
    /// their way (two threads polling one socket means the loser is woken
    /// for nothing, and that wake-up lands on the critical path).
    active: std::sync::atomic::AtomicUsize,
    /// The I/O thread is blocked in `poll` on the sockets (then a thread
    /// that becomes active kicks it out through `kick`).
    io_polling: AtomicBool,
    kick: std::os::fd::OwnedFd,
    /// When the last application thread left (microseconds, `clock`).
    idle_since: std::sync::atomic::AtomicU64,
    /// This member's unicast address: its own multicasts come back from it.
    me: SocketAddr,
}

struct Inner {
    core: GroupCore,
    /// Own messages ordered: msg_id → seq.
    sent: HashMap<shoal_group::MsgId, GroupSeq>,
    state_fn: Option<StateFn>,
    /// Deliveries polled from the core and not yet returned (a state
    /// transfer answered in between).
    out: std::collections::VecDeque<Delivery>,
    /// Injected delay, for tests (`SHOAL_NET_DELAY_MS`).
    delay: Option<Delay>,
    /// Receive buffer of whichever thread reads the sockets.
    rx: Vec<u8>,
    /// Whether our multicasts loop back to this host (only needed when
    /// another member shares our address).
    mcast_loop: bool,
    /// Seals what the core sends and opens what comes.
    seal: GroupSeal,
    /// Where a sealed datagram is built.
    sealed: Vec<u8>,
    /// How long a thread polls the sockets before it sleeps, learned
    /// from the gaps between the datagrams that came.
    window: Window,
    /// When the latest datagram came in.
    last_arrival: Instant,
}

/// A datagram held back: when it is due, a tie-breaker, where it goes.
type Delayed = (Instant, u64, SocketAddr, Vec<u8>);

/// Datagrams held back by an injected delay: this kernel has no `netem`, so
/// tests of real clusters delay (and so reorder) datagrams here.  Set
/// `SHOAL_NET_DELAY_MS=MIN-MAX` (milliseconds) in a member's environment.
struct Delay {
    min_us: u64,
    max_us: u64,
    rng: u64,
    queue: std::collections::BinaryHeap<std::cmp::Reverse<Delayed>>,
    count: u64,
}

impl Delay {
    fn from_env() -> Option<Delay> {
        let v = std::env::var("SHOAL_NET_DELAY_MS").ok()?;
        let (a, b) = v.split_once('-').unwrap_or((&v, &v));
        let min: u64 = a.trim().parse().ok()?;
        let max: u64 = b.trim().parse().ok()?;
        Some(Delay {
            min_us: min * 1000,
            max_us: max.max(min) * 1000,
            rng: u64::from(std::process::id()) | 1,
            queue: Default::default(),
            count: 0,
        })
    }

    fn push(&mut self, to: SocketAddr, bytes: Vec<u8>) {
        // xorshift: any spread will do.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let span = self.max_us - self.min_us + 1;
        let due = Instant::now() + Duration::from_micros(self.min_us + self.rng % span);
        self.count += 1;
        self.queue
            .push(std::cmp::Reverse((due, self.count, to, bytes)));
    }

    fn next_due(&self) -> Option<Instant> {
        self.queue.peek().map(|r| r.0.0)
    }
}

/// One member of a group.  Dropping it leaves the group.
pub struct Group {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The member's key service (none without a node to register it).
    keys: Mutex<Option<KeyService>>,
    _link: Option<Link>,
    send_timeout: Duration,
}

impl Group {
    /// Creates a new group with this process as its only member (and
    /// sequencer).  Others join with [`Group::port`].
    pub fn create(ctx: &Context, opts: GroupOptions) -> Result<Group, GroupError> {
        let group = opts
            .port
            .unwrap_or_else(|| crate::keys::new_group_port(opts.open));
        let (socket, mcast, me) = open_sockets(ctx, &group, &opts)?;
        let cfg = core_config(ctx, &opts);
        let keys = crate::keys::new_keys(me.id);
        let core = GroupCore::create(clock::now(), group, me, cfg);
        let link = register(ctx, &group, &me)?;
        Group::start(keys, group, core, (socket, mcast), link, &opts, ctx)
    }

    /// Joins the group named `group`.  Returns once this process is a
    /// member; its first delivery is [`Delivery::State`].
    pub fn join(ctx: &Context, group: PutPort, opts: GroupOptions) -> Result<Group, GroupError> {
        let (keys, contacts) = admitted(ctx, &group)?;
        let epoch = keys.epoch;
        match Group::join_with(ctx, group, &opts, keys, contacts) {
            // The group's key moved on while this process joined, and its
            // join went out sealed in an epoch the members no longer
            // open: once more with the new keys.
            Err(GroupError::JoinFailed(_)) => match admitted(ctx, &group) {
                Ok((keys, contacts)) if keys.epoch != epoch => {
                    Group::join_with(ctx, group, &opts, keys, contacts)
                }
                _ => Err(GroupError::JoinFailed(group)),
            },
            other => other,
        }
    }

    fn join_with(
        ctx: &Context,
        group: PutPort,
        opts: &GroupOptions,
        keys: Keys,
        contacts: Vec<SocketAddr>,
    ) -> Result<Group, GroupError> {
        let (socket, mcast, me) = open_sockets(ctx, &group, opts)?;
        let cfg = core_config(ctx, opts);
        let core = GroupCore::join(clock::now(), group, me, cfg, contacts, Nonce::random().0);
        let mut g = Group::start(keys, group, core, (socket, mcast), None, opts, ctx)?;
        // Wait until admitted.
        let deadline = Instant::now() + opts.join_timeout + Duration::from_millis(500);
        {
            let mut inner = g.shared.core.lock();
            loop {
                match inner.core.status() {
                    Status::Normal => break,
                    Status::Out | Status::Left => return Err(GroupError::JoinFailed(group)),
                    _ => {}
                }
                if Instant::now() >= deadline {
                    return Err(GroupError::JoinFailed(group));
                }
                g.shared.events_cv.wait_for(&mut inner, SLICE);
            }
        }
        g._link = register(ctx, &group, &me)?;
        Ok(g)
    }

    /// Starts a member: its I/O thread, and its key service (before the
    /// first datagram goes out: the sequencer hands a joiner the next key
    /// as soon as it is admitted).
    fn start(
        keys: Keys,
        group: PutPort,
        mut core: GroupCore,
        (socket, mcast): (UdpSocket, Option<(UdpSocket, SocketAddrV4)>),
        link: Option<Link>,
        opts: &GroupOptions,
        ctx: &Context,
    ) -> Result<Group, GroupError> {
        let window = Window::from_setting(ctx.config().server_spin, DEFAULT_SPIN);
        let me = socket.local_addr().expect("a bound socket");
        let seal = GroupSeal::new(keys.epoch, keys.key, &group, core.id());
        core.set_key_epoch(keys.epoch);
        let id = core.id();
        let key_state: SharedKeys = Arc::new(parking_lot::Mutex::new(KeyCore::new(keys)));
        let shared = Arc::new(Shared {
            core: Mutex::new(Inner {
                seal,
                sealed: Vec::with_capacity(MAX_DATAGRAM),
                core,
                sent: HashMap::new(),
                state_fn: None,
                out: Default::default(),
                delay: Delay::from_env(),
                rx: vec![0u8; MAX_DATAGRAM],
                mcast_loop: true,
                window,
                last_arrival: Instant::now(),
            }),
            sent_cv: Condvar::new(),
            events_cv: Condvar::new(),
            io_cv: Condvar::new(),
            socket,
            mcast,
            closed: AtomicBool::new(false),
            group,
            active: std::sync::atomic::AtomicUsize::new(0),
            io_polling: AtomicBool::new(false),
            kick: eventfd(),
            idle_since: std::sync::atomic::AtomicU64::new(0),
            me,
        });
        let keys = match ctx.config().node_socket {
            Some(_) => Some(KeyService::start(
                ctx,
                group,
                id,
                key_state,
                shared.clone() as Arc<dyn KeyHost>,
                opts.members_serve
                    .map(|port| shoal_rpc::served_by::ServedBy::new(ctx, port)),
            )?),
            None => None,
        };
        {
            let mut inner = shared.core.lock();
            shared.flush(&mut inner);
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("shoal-group".into())
            .spawn(move || s.run())
            .expect("spawn the group thread");
        Ok(Group {
            shared,
            thread: Mutex::new(Some(thread)),
            keys: Mutex::new(keys),
            _link: link,
            send_timeout: opts.send_timeout,
        })
    }

    /// The group's name: give it to processes that should join.
    pub fn port(&self) -> PutPort {
        self.shared.group
    }

    /// This member's id.
    pub fn id(&self) -> MemberId {
        self.shared.core.lock().core.id()
    }

    /// Sets the state-transfer callback: called (on a thread inside
    /// [`Group::receive`], between two deliveries) when a process joins; it
    /// returns the application's state after every delivery received so
    /// far.  Without one, joiners get an empty state.
    pub fn on_state_wanted(&self, f: impl FnMut() -> Vec<u8> + Send + 'static) {
        self.shared.core.lock().state_fn = Some(Box::new(f));
    }

    /// Sends `body` to every member; returns its sequence number once the
    /// message is ordered (and, with resilience r, held by r + 1 members).
    pub fn send(&self, body: &[u8]) -> Result<GroupSeq, GroupError> {
        let deadline = Instant::now() + self.send_timeout;
        let body = Bytes::copy_from_slice(body);
        let _active = Active::new(&self.shared);
        let mut inner = self.shared.core.lock();
        let msg_id = loop {
            match inner.core.send(clock::now(), body.clone()) {
                Ok(id) => break id,
                Err(SendError::WindowFull) => {}
                Err(SendError::NotMember) => {
                    if matches!(inner.core.status(), Status::Out | Status::Left) {
                        return Err(GroupError::NotMember);
                    }
                    // Joining or recovering: wait for the group.
                }
                Err(SendError::TooLarge { limit }) => {
                    return Err(GroupError::TooLarge {
                        len: body.len(),
                        limit,
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(GroupError::Timeout(self.send_timeout));
            }
            self.shared
                .wait_io(&mut inner, Instant::now(), deadline, false);
        };
        self.shared.flush(&mut inner);
        // Poll the sockets ourselves for a while: the answer usually comes
        // within a round trip, and handing it over from another thread
        // would cost a wake-up.
        let spin_until = Instant::now() + inner.window.get().max(inner.window.base() * 4);
        loop {
            if let Some(seq) = inner.sent.remove(&msg_id) {
                return Ok(seq);
            }
            if matches!(inner.core.status(), Status::Out | Status::Left) {
                return Err(GroupError::NotMember);
            }
            if Instant::now() >= deadline {
                return Err(GroupError::Timeout(self.send_timeout));
            }
            self.shared.wait_io(&mut inner, spin_until, deadline, false);
        }
    }

    /// The next delivery, in the group's total order; waits at most
    /// `timeout` (`None`: forever), then fails with [`GroupError::Timeout`].
    pub fn receive(&self, timeout: Option<Duration>) -> Result<Delivery, GroupError> {
        self.receive_timeout(timeout)?
            .ok_or(GroupError::Timeout(timeout.unwrap_or(Duration::MAX)))
    }

    /// Like [`Group::receive`], but a timeout is `Ok(None)`.
    pub fn receive_timeout(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Option<Delivery>, GroupError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let _active = (timeout != Some(Duration::ZERO)).then(|| Active::new(&self.shared));
        let mut inner = self.shared.core.lock();
        // Poll the sockets ourselves for a while before sleeping, as a
        // server does, where answers are awaited: the thread that reads
        // deliveries is often the one that must answer next (the
        // sequencer's, or an acknowledger's).
        let critical = inner.core.answers_on_the_critical_path();
        let spin_until = if critical {
            Instant::now() + inner.window.get()
        } else {
            Instant::now()
        };
        loop {
            if let Some(d) = inner.out.pop_front() {
                return Ok(Some(d));
            }
            while let Some(ev) = inner.core.poll_event() {
                match ev {
                    Event::Message {
                        seq, sender, body, ..
                    } => return Ok(Some(Delivery::Message { seq, sender, body })),
                    Event::Joined { seq, member } => {
                        return Ok(Some(Delivery::Joined {
                            seq,
                            member: member.id,
                            addr: member.addr,
                        }));
                    }
                    Event::Left { seq, member } => return Ok(Some(Delivery::Left { seq, member })),
                    Event::View { seq, inc, members } => {
                        return Ok(Some(Delivery::View {
                            seq,
                            incarnation: inc,
                            members: members.iter().map(|m| m.id).collect(),
                        }));
                    }
                    Event::State { seq, state, .. } => {
                        return Ok(Some(Delivery::State { seq, state }));
                    }
                    Event::StateWanted { joiner } => {
                        // The application's state is exactly that after
                        // every delivery it has received: call it without
                        // holding up the I/O thread.
                        let mut f = inner.state_fn.take();
                        let state = parking_lot::MutexGuard::unlocked(&mut inner, || {
                            f.as_mut().map(|f| f()).unwrap_or_default()
                        });
                        if inner.state_fn.is_none() {
                            inner.state_fn = f;
                        }
                        inner.core.provide_state(clock::now(), joiner, &state);
                        self.shared.flush(&mut inner);
                    }
                    Event::ResetFailed { have, need } => {
                        return Ok(Some(Delivery::ResetFailed { have, need }));
                    }
                    Event::Expelled | Event::JoinFailed | Event::LeftGroup => {
                        return Err(GroupError::NotMember);
                    }
                }
            }
            if matches!(inner.core.status(), Status::Out | Status::Left) {
                return Err(GroupError::NotMember);
            }
            let until = match deadline {
                Some(d) => {
                    if Instant::now() >= d {
                        return Ok(None);
                    }
                    d
                }
                None => Instant::now() + SLICE,
            };
            self.shared
                .wait_io(&mut inner, spin_until, until, !critical);
        }
    }

    /// Starts a reset now; with `min_members`, one that goes on with that
    /// many members even if fewer than the safe quorum answer.
    pub fn reset(&self, min_members: Option<usize>) {
        let mut inner = self.shared.core.lock();
        inner.core.reset(clock::now(), min_members);
        self.shared.flush(&mut inner);
    }

    /// The group as this member sees it.  It formats every member and
    /// copies the counters: a question asked often takes one of the
    /// accessors below.
    pub fn info(&self) -> GroupInfo {
        self.shared.core.lock().core.info()
    }

    /// This member's status ([`GroupInfo::status`]).
    pub fn status(&self) -> Status {
        self.shared.core.lock().core.status()
    }

    /// The group's incarnation and the member it names its sequencer
    /// ([`GroupInfo::incarnation`] and [`GroupInfo::sequencer`]).
    pub fn sequencer(&self) -> (Incarnation, MemberId) {
        let inner = self.shared.core.lock();
        (inner.core.incarnation(), inner.core.sequencer())
    }

    /// Whether the group names this member its sequencer (`member ==
    /// sequencer` in [`GroupInfo`]).
    pub fn names_me_sequencer(&self) -> bool {
        let inner = self.shared.core.lock();
        inner.core.sequencer() == inner.core.id()
    }

    /// Leaves the group; returns once the leave is ordered (or after a
    /// short while if the group does not answer).  Later calls fail with
    /// [`GroupError::NotMember`].
    pub fn leave(&self) {
        let Some(thread) = self.thread.lock().take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        {
            let mut inner = self.shared.core.lock();
            inner.core.leave(clock::now());
            self.shared.flush(&mut inner);
            while !matches!(inner.core.status(), Status::Left | Status::Out)
                && Instant::now() < deadline
            {
                self.shared.events_cv.wait_for(&mut inner, SLICE);
            }
        }
        self.shared.closed.store(true, Ordering::Release);
        self.shared.io_cv.notify_all();
        let _ = thread.join();
        if let Some(keys) = self.keys.lock().take() {
            keys.stop();
        }
        self.shared.events_cv.notify_all();
        self.shared.sent_cv.notify_all();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.leave();
    }
}

impl KeyHost for Shared {
    fn sequencing(&self) -> Option<Sequencing> {
        let inner = self.core.lock();
        let core = &inner.core;
        if core.status() != Status::Normal || !core.is_sequencer() {
            return None;
        }
        let mut members: Vec<u64> = core.members().iter().map(|m| m.id.0).collect();
        members.sort_unstable();
        Some(Sequencing {
            me: core.id(),
            members,
            membership: core.membership(),
        })
    }

    fn take(&self, epoch: u32, key: [u8; 32], send: bool) {
        let mut inner = self.core.lock();
        inner.seal.add(clock::now(), epoch, key, send);
        let sending = inner.seal.sending();
        inner.core.set_key_epoch(sending);
    }

    fn take_extra(&self, epoch: u32, key: [u8; 32]) {
        self.core.lock().seal.add_extra(clock::now(), epoch, key);
    }

    fn behind(&self) -> Option<Behind> {
        let inner = self.core.lock();
        let want = inner.seal.behind()?;
        let core = &inner.core;
        let (seq, me) = (core.sequencer(), core.id());
        let sequencer = (seq != me).then_some(seq);
        let mut members: Vec<MemberId> = sequencer.into_iter().collect();
        members.extend(
            core.members()
                .iter()
                .map(|m| m.id)
                .filter(|m| *m != seq && *m != me),
        );
        Some(Behind {
            want,
            me,
            sequencer,
            members,
        })
    }
}

fn eventfd() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd has no memory preconditions; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// Longest a waiting thread sleeps before it looks at the member's status
/// again.
const SLICE: Duration = Duration::from_millis(20);

fn core_config(ctx: &Context, opts: &GroupOptions) -> GroupConfig {
    GroupConfig {
        resilience: opts.resilience,
        large_bytes: opts.large_bytes,
        frag_bytes: ctx.config().frag_bytes,
        history_bytes: opts.history_bytes,
        min_members: opts.min_members,
        join_timeout: opts.join_timeout,
        ..GroupConfig::default()
    }
}

/// Whether the cluster network has broadcast (and so multicast): locate
/// then goes to one broadcast address.
fn network_has_broadcast(ctx: &Context) -> bool {
    let locate = &ctx.config().locate;
    locate.len() == 1
        && matches!(locate[0].ip(), IpAddr::V4(ip) if ip.octets()[3] == 255 || ip.is_broadcast())
}

fn open_sockets(
    ctx: &Context,
    group: &PutPort,
    opts: &GroupOptions,
) -> Result<Sockets, GroupError> {
    let bind_ip = ctx.config().bind_ip;
    let socket = socket::bind(SocketAddr::new(bind_ip, 0))?;
    let me = MemberEntry {
        id: MemberId::random(),
        addr: socket.local_addr()?,
    };
    let use_mcast = opts.multicast.unwrap_or_else(|| network_has_broadcast(ctx));
    let mcast = match (use_mcast, bind_ip) {
        (true, IpAddr::V4(ip)) => Some(open_multicast(&socket, group, ip)?),
        _ => None,
    };
    Ok((socket, mcast, me))
}

fn open_multicast(
    unicast: &UdpSocket,
    group: &PutPort,
    ip: Ipv4Addr,
) -> Result<(UdpSocket, SocketAddrV4), GroupError> {
    let addr = multicast_addr(group);
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    if socket::set_force(&s, 8 << 20).is_err() {
        let _ = s.set_recv_buffer_size(8 << 20);
    }
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, addr.port())).into())?;
    s.join_multicast_v4(addr.ip(), &ip)?;
    let u = socket2::SockRef::from(unicast);
    u.set_multicast_if_v4(&ip)?;
    u.set_multicast_loop_v4(true)?;
    u.set_multicast_ttl_v4(1)?;
    Ok((s.into(), addr))
}
