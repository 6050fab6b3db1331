//! Forming, joining and re-forming the replicas' group (the control
//! thread), asking the peers where they stand, and finding where the
//! service's writes go.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use shoal_cap::PutPort;
use shoal_groupsvc::{Group, GroupOptions, Status};
use shoal_replica::{Control, Formation, Machine, PeerStatus, Phase, Standing, Why, control};
use shoal_rpc::{CallOptions, Server};

use super::Replicated;
use crate::writes_at::Endpoint;

/// A peer's status as [`Replicated::status`] shows it (`None`: no answer, or
/// not one).
fn peer_status(s: &serde_json::Value) -> Option<PeerStatus> {
    Some(PeerStatus {
        phase: Phase::parse(s["phase"].as_str()?)?,
        generation: s["generation"].as_u64()?,
        index: s["index"].as_u64()?,
        group: s["group"].as_u64()?,
    })
}

impl<M: Machine> Replicated<M> {
    pub(super) fn serve_peers(&self, server: &Server) {
        loop {
            let Ok(request) = server.getreq() else { return };
            // Peers are replicas, which only daemons and root run: root
            // on a node the service map names for the service, where
            // there is one (`docs/security.md`, "Which nodes serve the
            // system").
            let peer = self.is_peer(request.caller());
            let _ = server.putrep(&request, self.status(peer).to_string().into_bytes());
        }
    }

    /// This replica's client endpoint, while it serves.
    pub(super) fn endpoint(&self) -> Option<Endpoint> {
        Some(Endpoint {
            node: self.ctx.config().node.as_ref()?.0,
            instance: self.server.instance()?,
        })
    }

    /// Finds where the writes go best, from the group and the peers'
    /// statuses (`writes_at`).
    fn aim_writes(&self, peers: &[serde_json::Value]) {
        let group = self.group.read().clone();
        let at = group.and_then(|g| {
            let info = g.info();
            crate::writes_at::choose(&info.sequencer, (&info.member, self.endpoint()), peers)
        });
        *self.writes_at.lock() = at;
    }

    /// Every other replica's status (None: did not answer).
    fn ask_peers(&self) -> Vec<(usize, Option<PeerStatus>)> {
        self.ask_peers_ports()
            .into_iter()
            .map(|(i, s, _)| (i, s))
            .collect()
    }

    /// [`Replicated::ask_peers`], with the port of each peer's group.
    fn ask_peers_ports(&self) -> Vec<(usize, Option<PeerStatus>, Option<PutPort>)> {
        self.ask_peers_json()
            .into_iter()
            .map(|(i, json)| {
                let status = peer_status(&json);
                let group = json["group_port"].as_str().and_then(|p| p.parse().ok());
                (i, status, group)
            })
            .collect()
    }

    /// Every other replica's status as it sent it (`null`: no answer).
    fn ask_peers_json(&self) -> Vec<(usize, serde_json::Value)> {
        let Ok(mut client) = self.ctx.client() else {
            return Vec::new();
        };
        let opts = CallOptions {
            deadline: Some(Duration::from_millis(400)),
            cancel: None,
        };
        (0..self.cfg.replicas)
            .filter(|&i| i != self.cfg.replica)
            .map(|i| {
                let port = self.ports.peers[i].put_port();
                let json = client
                    .trans_with(&port, Vec::new(), &opts)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                (i, json.unwrap_or_default())
            })
            .collect()
    }

    /// Options of the replicas' group.  Each group gets a fresh random
    /// port (joiners learn it from the peers' status): a port derived from
    /// the generation alone could name an earlier group whose departed
    /// members a node still remembers.
    fn group_options(&self) -> GroupOptions {
        GroupOptions {
            resilience: self.cfg.resilience(),
            members_serve: Some(self.port),
            ..GroupOptions::default()
        }
    }

    fn install_group(self: &Arc<Self>, group: Group, generation: u64, phase: Phase) {
        let weak = Arc::downgrade(self);
        group.on_state_wanted(move || {
            weak.upgrade()
                .map(|s| s.rs.read().encode_snapshot())
                .unwrap_or_default()
        });
        self.new_epoch();
        *self.group.write() = Some(Arc::new(group));
        if self.generation.swap(generation, Ordering::SeqCst) != generation
            && let Err(e) = self.durable.lock().store.write_generation(generation)
        {
            tracing::error!("recording generation {generation} failed: {e}");
        }
        *self.phase.lock() = phase;
    }

    fn leave_group(&self) {
        self.stop_serving();
        if let Some(g) = self.group.write().take() {
            g.leave();
        }
        *self.phase.lock() = Phase::Forming;
        *self.abnormal_since.lock() = None;
        self.new_epoch();
    }

    /// Where this replica stands, for `shoal_replica::control`.
    fn standing(&self, phase: Phase, joined_at: Instant) -> Standing {
        Standing {
            me: self.cfg.replica,
            phase,
            index: self.index(),
            unapplied: self.unapplied(),
            generation: self.generation.load(Ordering::SeqCst),
            group: self.group_tag(),
            group_works: self
                .group
                .read()
                .as_ref()
                .is_some_and(|g| g.status() == Status::Normal),
            joining_for: joined_at.elapsed(),
        }
    }

    /// Forms, joins and re-forms the group; starts and stops serving.  Each
    /// turn's decision is `shoal_replica::control`, as in the simulator;
    /// what is here is the I/O around it.
    pub(super) fn control(self: &Arc<Self>) {
        let mut joined_at = Instant::now();
        // Peers are asked at once on joining (where writes go), then every
        // second.
        let mut checked = Instant::now()
            .checked_sub(Duration::from_secs(2))
            .unwrap_or_else(Instant::now);
        let mut said = Instant::now() - Duration::from_secs(60);
        let mut peers: Vec<serde_json::Value> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let phase = *self.phase.lock();
            match phase {
                Phase::Member => {
                    if !self.server.is_serving()
                        && let Err(e) = self.start_serving()
                    {
                        tracing::error!("cannot serve the {} port: {e}", self.cfg.service);
                    }
                    let normal = self
                        .group
                        .read()
                        .as_ref()
                        .is_some_and(|g| g.status() == Status::Normal);
                    {
                        let mut a = self.abnormal_since.lock();
                        if normal {
                            *a = None;
                        } else if a.is_none() {
                            *a = Some(Instant::now());
                        }
                    }
                    // The sequencer's own replica knows at once that it
                    // takes the writes; the others learn whose endpoint
                    // does from their peers, every second.
                    self.aim_writes(&peers);
                    if checked.elapsed() >= Duration::from_secs(1) {
                        checked = Instant::now();
                        let answers = self.ask_peers_json();
                        peers = answers.iter().map(|(_, j)| j.clone()).collect();
                        let statuses: Vec<_> =
                            answers.iter().map(|(i, j)| (*i, peer_status(j))).collect();
                        let standing = self.standing(phase, joined_at);
                        if control(&standing, &statuses) == Control::Leave(Why::Behind) {
                            tracing::warn!(
                                "a replica outside the group has applied more writes: dissolving the group to re-form from it"
                            );
                            self.leave_group();
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Phase::Joining => {
                    let standing = self.standing(phase, joined_at);
                    if control(&standing, &[]) == Control::Leave(Why::NoStateTransfer) {
                        tracing::warn!("no state transfer within 15 s; joining again");
                        self.leave_group();
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Phase::Stuck => {
                    let standing = self.standing(phase, joined_at);
                    let peers = self.ask_peers();
                    match control(&standing, &peers) {
                        Control::Reset => {
                            tracing::warn!(
                                "the group cannot reset and no replica is in a working group: resetting with the members this replica reaches"
                            );
                            if let Some(g) = self.group.read().clone() {
                                g.reset(Some(1));
                            }
                            std::thread::sleep(Duration::from_millis(500));
                        }
                        Control::Serve => {
                            tracing::info!(
                                "the group works again and holds the most writes: serving"
                            );
                            *self.phase.lock() = Phase::Member;
                        }
                        Control::Leave(_) => {
                            tracing::warn!(
                                "the group cannot reset and another replica goes on: joining it"
                            );
                            self.leave_group();
                        }
                        Control::Stay | Control::Form(_) => {
                            std::thread::sleep(Duration::from_millis(200))
                        }
                    }
                }
                Phase::Forming => {
                    self.stop_serving();
                    let answers = self.ask_peers_ports();
                    let peers: Vec<_> = answers.iter().map(|(i, s, _)| (*i, *s)).collect();
                    let standing = self.standing(phase, joined_at);
                    let index = standing.index;
                    let Control::Form(formation) = control(&standing, &peers) else {
                        continue;
                    };
                    match formation {
                        Formation::Join(generation) => {
                            let Some(port) = answers.iter().find_map(|(_, s, p)| {
                                s.filter(|s| s.phase == Phase::Member && s.generation == generation)
                                    .and(*p)
                            }) else {
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            };
                            match Group::join(&self.ctx, port, self.group_options()) {
                                Ok(g) => {
                                    tracing::info!("joined the group of generation {generation}");
                                    joined_at = Instant::now();
                                    self.install_group(g, generation, Phase::Joining);
                                }
                                Err(e) => {
                                    tracing::warn!("joining generation {generation} failed: {e}");
                                    std::thread::sleep(Duration::from_millis(200));
                                }
                            }
                        }
                        Formation::Create(generation) => {
                            match Group::create(&self.ctx, self.group_options()) {
                                Ok(g) => {
                                    tracing::info!(
                                        "formed the group of generation {generation} at index {index}"
                                    );
                                    self.install_group(g, generation, Phase::Member);
                                }
                                Err(e) => {
                                    tracing::error!("creating the group failed: {e}");
                                    std::thread::sleep(Duration::from_millis(500));
                                }
                            }
                        }
                        Formation::Wait { missing } => {
                            if !missing.is_empty() && said.elapsed() > Duration::from_secs(5) {
                                tracing::info!(
                                    "waiting for replicas {missing:?}: after the group is lost, every replica must answer before it re-forms"
                                );
                                said = Instant::now();
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            }
        }
    }
}
