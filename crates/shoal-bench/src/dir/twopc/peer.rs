//! The peer port of the two-phase-commit baseline (`super`): phase 1
//! and 2 at the receiving replica, pairing (join, unpair) and the
//! control loop that finds the peer and decides when to go alone.

use super::*;

impl Shared {
    pub(super) fn serve_peer(&self, server: &Server) {
        loop {
            let Ok(request) = server.getreq() else { return };
            let body = request.body();
            let answer = match body.first().copied() {
                _ if !peer_may(request.caller(), body) => self.refused(),
                Some(_) if !self.peer_served_by.admits(request.caller().node) => self.refused(),
                None => self.status().to_string().into_bytes(),
                Some(TAG_INTENT) if body.len() >= 17 => {
                    let pair = u64::from_le_bytes(body[1..9].try_into().unwrap());
                    let index = u64::from_le_bytes(body[9..17].try_into().unwrap());
                    match Request::decode(&body[17..]) {
                        Ok(req) => {
                            self.on_intent(pair, index, req, &body[17..], &mut |a| {
                                let _ = server.putrep(&request, a);
                            });
                            continue;
                        }
                        Err(_) => self.refused(),
                    }
                }
                Some(TAG_JOIN) => self.on_join(),
                Some(TAG_UNPAIR) if body.len() >= 9 => {
                    self.on_unpair(u64::from_le_bytes(body[1..9].try_into().unwrap()))
                }
                Some(_) => self.refused(),
            };
            let _ = server.putrep(&request, answer);
        }
    }

    fn refused(&self) -> Vec<u8> {
        vec![REFUSED, self.phase() as u8]
    }

    /// Phase 1 and 2 at the receiving replica: acknowledge, then
    /// intention to disk, apply, result to disk, intention removed.
    fn on_intent(
        &self,
        pair: u64,
        index: u64,
        req: Request,
        encoded: &[u8],
        reply: &mut dyn FnMut(Vec<u8>),
    ) {
        let deadline = Instant::now() + LOCK_WAIT;
        // Replica 0 wins a tie: it refuses replica 1 while it is itself
        // asking replica 1.  Otherwise wait for the lock: its holder may
        // be finishing a write, or installing a copy of the peer's state
        // that this intention follows.
        let wins_ties = self.cfg.replica == 0;
        let mut w = loop {
            if let Some(w) = self.work.try_lock_for(Duration::from_micros(100)) {
                break w;
            }
            if wins_ties && self.committing.load(Ordering::Acquire) {
                return reply(vec![BUSY]);
            }
            if Instant::now() > deadline {
                return reply(if self.phase().serving() {
                    vec![BUSY]
                } else {
                    self.refused()
                });
            }
        };
        if self.phase() != Phase::Paired || self.pair.load(Ordering::Acquire) != pair {
            return reply(self.refused());
        }
        let mine = self.state.read().index();
        if mine != index {
            tracing::error!(
                "out of step with the peer: it writes at index {index}, this replica is at {mine}; copying its state"
            );
            self.pair.store(0, Ordering::Release);
            self.set_phase(Phase::Joining);
            return reply(self.refused());
        }
        reply(vec![ACK]);
        let applied = self.commit(&mut w, &req, encoded);
        self.finish(&mut w, &applied, &req, encoded);
        self.peer_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// The peer copies this replica's state: pair again, under the write
    /// lock, so the copy holds every write this replica applied.
    fn on_join(&self) -> Vec<u8> {
        if !self.phase().serving() {
            return self.refused();
        }
        let Some(_w) = self.work.try_lock_for(Duration::from_secs(2)) else {
            return vec![BUSY];
        };
        if !self.phase().serving() {
            return self.refused();
        }
        let pair = rand::random::<u64>() | 1;
        let snapshot = self.state.read().encode_snapshot();
        self.pair.store(pair, Ordering::Release);
        self.set_phase(Phase::Paired);
        tracing::info!(
            "replica {} copied the state ({} bytes): paired again",
            self.peer_number(),
            snapshot.len()
        );
        let mut out = Vec::with_capacity(9 + snapshot.len());
        out.push(ACK);
        out.extend_from_slice(&pair.to_le_bytes());
        out.extend_from_slice(&snapshot);
        out
    }

    /// The peer went on alone and says this replica's pairing is broken.
    fn on_unpair(&self, pair: u64) -> Vec<u8> {
        if pair == 0 || self.pair.load(Ordering::Acquire) != pair {
            return vec![ACK];
        }
        let Some(_w) = self.work.try_lock_for(Duration::from_secs(1)) else {
            return vec![BUSY];
        };
        if self.pair.load(Ordering::Acquire) == pair && self.phase() == Phase::Paired {
            tracing::warn!(
                "the peer (replica {}) went on alone: copying its state",
                self.peer_number()
            );
            self.pair.store(0, Ordering::Release);
            self.set_phase(Phase::Joining);
        }
        vec![ACK]
    }

    // ---- pairing --------------------------------------------------------

    /// The peer's (phase, index, pair), if it answers.
    fn ask_peer(&self, client: &mut Client) -> Option<(Phase, u64, u64)> {
        let opts = CallOptions {
            deadline: Some(Duration::from_millis(400)),
            cancel: None,
        };
        let answer = client
            .trans_with(&self.peer_port, Vec::new(), &opts)
            .map_err(|_| client.forget(&self.peer_port))
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&answer).ok()?;
        Some((
            Phase::parse(v["phase"].as_str()?)?,
            v["index"].as_u64()?,
            v["pair"].as_u64().unwrap_or(0),
        ))
    }

    /// Copies the peer's state and pairs with it.
    fn join(&self) {
        self.set_phase(Phase::Joining);
        self.stop_serving();
        let mut w = self.work.lock();
        let opts = CallOptions {
            deadline: Some(Duration::from_secs(10)),
            cancel: None,
        };
        let answer = match w.peer.trans_with(&self.peer_port, vec![TAG_JOIN], &opts) {
            Ok(a) => a,
            Err(e) => {
                w.peer.forget(&self.peer_port);
                tracing::warn!("copying the peer's state failed: {e}");
                self.set_phase(Phase::Starting);
                return;
            }
        };
        if answer.first() != Some(&ACK) || answer.len() < 9 {
            // The peer is not serving (or busy): decide again.
            self.set_phase(Phase::Starting);
            return;
        }
        let pair = u64::from_le_bytes(answer[1..9].try_into().unwrap());
        let new = match DirState::decode_snapshot(&answer[9..]) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("the peer's state is undecodable: {e}");
                self.set_phase(Phase::Starting);
                return;
            }
        };
        let index = new.index();
        let snaps = w.store.snapshots();
        if let Err(e) = snaps
            .write(index, &answer[9..])
            .and_then(|_| w.store.rotate(index))
        {
            fatal("writing the copied state", e);
        }
        w.log = LogBuffer::new();
        *self.state.write() = new;
        *self.applied.lock() = index;
        self.applied_cv.notify_all();
        self.pair.store(pair, Ordering::Release);
        self.set_phase(Phase::Paired);
        tracing::info!("copied the peer's state at index {index}: paired");
    }

    /// Pairs, re-pairs and starts and stops serving.
    pub(super) fn control(self: &Arc<Self>) {
        let Ok(mut client) = self.ctx.client() else {
            tracing::error!("no RPC client for the control thread");
            return;
        };
        let mut said = Instant::now() - Duration::from_secs(60);
        while !self.stop.load(Ordering::Relaxed) {
            let phase = self.phase();
            if phase.serving() {
                if !self.server.is_serving()
                    && let Err(e) = self.start_serving()
                {
                    tracing::error!("cannot serve the directory port: {e}");
                }
            } else {
                self.stop_serving();
            }
            match phase {
                Phase::Paired => std::thread::sleep(Duration::from_millis(50)),
                Phase::Joining => self.join(),
                Phase::Alone => {
                    match self.ask_peer(&mut client) {
                        Some((Phase::Paired, _, pair)) if pair != 0 => {
                            // It still believes in the pairing this
                            // replica broke: tell it to copy our state.
                            let mut msg = vec![TAG_UNPAIR];
                            msg.extend_from_slice(&pair.to_le_bytes());
                            let _ = client.trans_with(
                                &self.peer_port,
                                msg,
                                &CallOptions {
                                    deadline: Some(Duration::from_millis(400)),
                                    cancel: None,
                                },
                            );
                        }
                        Some((Phase::Alone, theirs, _)) => {
                            let mine = self.state.read().index();
                            let me = (mine, std::cmp::Reverse(self.cfg.replica));
                            if (theirs, std::cmp::Reverse(self.peer_number())) > me {
                                tracing::error!(
                                    "both replicas ran alone (a partition): the peer has more writes ({theirs} against {mine}); this replica's writes since they parted are discarded"
                                );
                                let _w = self.work.lock();
                                self.pair.store(0, Ordering::Release);
                                self.set_phase(Phase::Joining);
                                continue;
                            }
                        }
                        _ => {}
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Phase::Starting => match self.ask_peer(&mut client) {
                    Some((p, _, _)) if p.serving() => self.join(),
                    Some((Phase::Starting, theirs, _)) => {
                        let mine = self.state.read().index();
                        let me = (mine, std::cmp::Reverse(self.cfg.replica));
                        if me > (theirs, std::cmp::Reverse(self.peer_number())) {
                            tracing::info!(
                                "both replicas restarted: serving from this replica's state (index {mine}); the peer copies it"
                            );
                            self.set_phase(Phase::Alone);
                        } else {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    Some(_) => std::thread::sleep(Duration::from_millis(100)),
                    None => {
                        if said.elapsed() > Duration::from_secs(5) {
                            tracing::info!(
                                "waiting for the peer (replica {}): a restarted replica serves only once it knows it misses no write",
                                self.peer_number()
                            );
                            said = Instant::now();
                        }
                        std::thread::sleep(Duration::from_millis(300));
                    }
                },
            }
        }
    }
}

/// Whether `caller` may send `body` to a replica's peer port: anyone may
/// ask its status (an empty body); intentions, joins and unpairings come
/// only from the other replica, which only a daemon or root runs, so from
/// root on a node of the cluster (and, where the service map names the
/// other replica's node, from root there alone: `docs/security.md`,
/// "Which nodes serve the system").
fn peer_may(caller: shoal_rpc::Caller, body: &[u8]) -> bool {
    body.is_empty() || caller.uid == 0
}

#[cfg(test)]
mod peer_tests {
    #[test]
    fn only_root_sends_intentions_anyone_asks_the_status() {
        let caller = |uid| shoal_rpc::Caller {
            node: shoal_wire::NodeId(1),
            uid,
            client: shoal_wire::ClientId(2),
        };
        for tag in [super::TAG_INTENT, super::TAG_JOIN, super::TAG_UNPAIR] {
            assert!(!super::peer_may(caller(1000), &[tag; 17]));
            assert!(super::peer_may(caller(0), &[tag; 17]));
        }
        assert!(super::peer_may(caller(1000), &[]));
    }
}
