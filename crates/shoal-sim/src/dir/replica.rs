//! The simulated replicas: pauses, crashes and restarts, forming groups,
//! serving requests, durability and snapshots, group events (`super`).

use super::*;

impl DirSim {
    pub(super) fn set_pause(&mut self, r: usize, on: bool) {
        self.reps[r].paused = on;
        if !on {
            let held = std::mem::take(&mut self.reps[r].held);
            for ev in held {
                self.step(ev);
            }
            // Timers that came due meanwhile fire now.
            self.reps[r].scheduled = None;
            self.after(r);
        }
    }

    pub(super) fn crash(&mut self, r: usize) {
        self.log(|| format!("crash r{r}"));
        let p = &mut self.reps[r];
        p.alive = false;
        p.paused = false;
        p.held.clear();
        p.core = None;
        p.by_msg.clear();
        p.by_seq.clear();
        p.results.clear();
        p.for_disk.clear();
        p.for_index.clear();
        // Unsynced log bytes are lost, except perhaps a torn prefix.
        for i in 0..p.disk.logs.len() {
            let (_, bytes, synced) = &mut p.disk.logs[i];
            let extra = bytes.len() - *synced;
            let keep = if extra > 0 && self.rng.random_bool(0.5) {
                *synced + self.rng.random_range(0..=extra)
            } else {
                *synced
            };
            bytes.truncate(keep);
            *synced = keep;
        }
    }

    pub(super) fn restart(&mut self, r: usize) {
        if self.reps[r].alive {
            return;
        }
        let logs: Vec<(u64, &[u8])> = self.reps[r]
            .disk
            .logs
            .iter()
            .map(|(b, bytes, _)| (*b, bytes.as_slice()))
            .collect();
        let rec = match log::recover(self.port, self.reps[r].disk.snapshot.as_deref(), &logs) {
            Ok(rec) => rec,
            Err(e) => {
                self.violation(format!("recovery: r{r} cannot recover: {e}"));
                return;
            }
        };
        let keep = rec.keep.clone();
        let index = rec.state.index();
        self.log(|| format!("restart r{r} at index {index} ({} replayed)", rec.replayed));
        let p = &mut self.reps[r];
        let mut logs = std::mem::take(&mut p.disk.logs);
        let mut kept = Vec::new();
        for ((base, mut bytes, _), k) in logs.drain(..).zip(keep) {
            match k {
                None => {}
                Some(0) => kept.push((base, log::header(base).to_vec(), log::LOG_HEADER)),
                Some(len) => {
                    bytes.truncate(len);
                    kept.push((base, bytes, len));
                }
            }
        }
        if kept.is_empty() {
            kept.push((index, log::header(index).to_vec(), log::LOG_HEADER));
        }
        p.disk.logs = kept;
        p.rs = ReplicaState::new(rec.state);
        p.durable = index;
        p.alive = true;
        p.boot += 1;
        p.generation = p.disk.generation;
        p.phase = Phase::Forming;
        p.syncing = false;
        p.origin = self.rng.random::<u64>() | 1;
        self.timeline
            .at(self.now + Duration::from_millis(1), Ev::Form { r });
        if self.cfg.durability == Durability::Replicated {
            self.timeline.at(
                self.now + Duration::from_micros(self.cfg.flush_us),
                Ev::Flush { r },
            );
        }
    }

    // ---- the replica ------------------------------------------------------

    pub(super) fn status_of(&self, r: usize) -> PeerStatus {
        let p = &self.reps[r];
        // A member whose group has been in a reset for long reports itself
        // stuck, so replicas outside do not wait to join it.
        let stuck = p.phase == Phase::Member
            && p.abnormal_since
                .is_some_and(|t| self.now >= t + STUCK_AFTER);
        PeerStatus {
            phase: if stuck { Phase::Stuck } else { p.phase },
            generation: p.generation,
            index: p.rs.state.index(),
            group: self.tag(r),
        }
    }

    pub(super) fn tag(&self, r: usize) -> u64 {
        self.reps[r].core.as_ref().map_or(0, |c| {
            let info = c.info();
            group_tag(info.incarnation, &info.sequencer)
        })
    }

    /// Asks every other replica where it is (an RPC that may be lost).
    pub(super) fn ask_peers(&mut self, r: usize) -> Vec<(usize, Option<PeerStatus>)> {
        let drop = if self.faults_on {
            self.cfg.faults.drop
        } else {
            0.0
        };
        (0..self.reps.len())
            .filter(|&i| i != r)
            .map(|i| {
                let reachable = self.usable(i) && !self.reps[i].paused && self.usable(r);
                let lost = self.rng.random_bool(drop);
                (i, (reachable && !lost).then(|| self.status_of(i)))
            })
            .collect()
    }

    pub(super) fn form(&mut self, r: usize) {
        // A joiner asks no one; every other phase asks its peers first.
        let phase = self.reps[r].phase;
        let peers = if phase == Phase::Joining {
            Vec::new()
        } else {
            self.ask_peers(r)
        };
        let standing = Standing {
            me: r,
            phase,
            index: self.reps[r].rs.state.index(),
            unapplied: self.held_unapplied(r),
            generation: self.reps[r].generation,
            group: self.tag(r),
            group_works: self.reps[r]
                .core
                .as_ref()
                .is_some_and(|c| c.status() == Status::Normal),
            joining_for: self.now.saturating_since(self.reps[r].joined_at),
        };
        // The same turn of the control loop as the replica shell's.
        match control(&standing, &peers) {
            Control::Stay => {}
            Control::Leave(Why::Behind) => {
                self.lose_group(r, "a replica outside the group has applied more")
            }
            Control::Leave(Why::NoStateTransfer) => self.lose_group(r, "no state transfer"),
            Control::Leave(Why::AnotherGoesOn) => {
                self.lose_group(r, "stuck, and another replica goes on")
            }
            Control::Reset => {
                self.log(|| format!("r{r} stuck: resets with whoever it reaches"));
                let now = self.now;
                if let Some(core) = self.reps[r].core.as_mut() {
                    core.reset(now, Some(1));
                }
            }
            Control::Serve => {
                self.log(|| format!("r{r} stuck: its group works again and holds the most"));
                self.reps[r].phase = Phase::Member;
            }
            Control::Form(decision) => {
                let index = standing.index;
                let cfg = self.group_config();
                let id = MemberId(self.rng.random_range(1..u64::MAX));
                let me = MemberEntry {
                    id,
                    addr: self.reps[r].addr,
                };
                match decision {
                    Formation::Join(g) => {
                        let contacts: Vec<SocketAddr> = peers
                            .iter()
                            .filter(|(_, s)| {
                                s.is_some_and(|s| s.phase == Phase::Member && s.generation == g)
                            })
                            .map(|(i, _)| self.reps[*i].addr)
                            .collect();
                        let nonce = self.rng.random();
                        let core = GroupCore::join(
                            self.now,
                            group_port(&self.ports, g),
                            me,
                            cfg,
                            contacts,
                            nonce,
                        );
                        self.log(|| format!("r{r} joins generation {g}"));
                        let p = &mut self.reps[r];
                        p.core = Some(core);
                        p.phase = Phase::Joining;
                        p.joined_at = self.now;
                        p.generation = g;
                        p.disk.generation = g;
                    }
                    Formation::Create(g) => {
                        self.log(|| format!("r{r} forms generation {g} at index {index}"));
                        self.report.generations = self.report.generations.max(g);
                        let core = GroupCore::create(self.now, group_port(&self.ports, g), me, cfg);
                        let p = &mut self.reps[r];
                        p.core = Some(core);
                        p.phase = Phase::Member;
                        p.generation = g;
                        p.disk.generation = g;
                    }
                    Formation::Wait { .. } => {}
                }
            }
        }
    }

    /// Group messages replica `r`'s member holds and it has not applied:
    /// every delivery is applied as it comes, so those beyond the core's
    /// deliveries.
    fn held_unapplied(&self, r: usize) -> u64 {
        self.reps[r]
            .core
            .as_ref()
            .map_or(0, |c| c.held().since(c.delivered()))
    }

    pub(super) fn lose_group(&mut self, r: usize, why: &str) {
        self.log(|| format!("r{r} out of its group: {why}"));
        let p = &mut self.reps[r];
        p.core = None;
        p.phase = Phase::Forming;
        p.abnormal_since = None;
        p.results.clear();
        let pending: Vec<Pending> = std::mem::take(&mut p.by_msg)
            .into_values()
            .chain(std::mem::take(&mut p.by_seq).into_values())
            .chain(std::mem::take(&mut p.for_index).into_iter().map(|(_, p)| p))
            .collect();
        for p in pending {
            self.answer(r, &p, self.unavailable(r));
        }
    }

    pub(super) fn unavailable(&self, r: usize) -> Response {
        Response {
            index: self.reps[r].rs.state.index(),
            result: Err(DirError::Unavailable("not in the group".into())),
        }
    }

    pub(super) fn answer(&mut self, r: usize, p: &Pending, resp: Response) {
        if self.reps[r].cut {
            return;
        }
        // Only a serving replica answers about the directory: one whose
        // group is stuck may yet be dissolved, with what it applied.
        let resp = if self.reps[r].phase == Phase::Member || output_of(&resp.result).is_none() {
            resp
        } else {
            self.unavailable(r)
        };
        let body = resp.encode();
        let faults = self.net();
        for d in faults.verdict(&mut self.rng) {
            self.timeline.at(
                self.now + Duration::from_micros(d),
                Ev::Reply {
                    client: p.client,
                    op: p.op,
                    body: body.clone(),
                },
            );
        }
    }

    pub(super) fn net(&self) -> Faults {
        if self.faults_on {
            self.cfg.faults.clone()
        } else {
            Faults::none()
        }
    }

    pub(super) fn on_request(&mut self, r: usize, client: usize, op: u64, body: &[u8]) {
        let Ok(req) = Request::decode(body) else {
            return;
        };
        let pending = Pending {
            client,
            op,
            req: req.clone(),
            kind: if req.op.is_write() {
                Waiting::Write
            } else {
                Waiting::Sync
            },
        };
        if self.reps[r].phase != Phase::Member || self.reps[r].core.is_none() {
            let resp = self.unavailable(r);
            self.answer(r, &pending, resp);
            return;
        }
        let linearizable = req.flags & FLAG_LINEARIZABLE != 0;
        if !req.op.is_write() && !linearizable {
            self.serve_read(r, pending);
            return;
        }
        let entry = if req.op.is_write() {
            encode_entry(self.reps[r].origin, &req)
        } else {
            encode_entry(
                self.reps[r].origin,
                &Request {
                    client: 0,
                    seq: 0,
                    min_index: 0,
                    flags: 0,
                    op: Op::Sync,
                },
            )
        };
        let now = self.now;
        let sent = self.reps[r]
            .core
            .as_mut()
            .expect("member")
            .send(now, Bytes::from(entry));
        match sent {
            Ok(msg) => {
                self.reps[r].by_msg.insert(msg, pending);
            }
            Err(_) => {
                let resp = self.unavailable(r);
                self.answer(r, &pending, resp);
            }
        }
    }

    pub(super) fn serve_read(&mut self, r: usize, p: Pending) {
        let resp = self.reps[r].rs.read(&p.req);
        if matches!(resp.result, Err(DirError::Behind { .. })) {
            self.reps[r].for_index.push((self.now + CATCH_UP, p));
            return;
        }
        self.answer_when_durable(r, p, resp);
    }

    /// Answers once the log holds the state the answer saw (the fsync
    /// mode): a read must not show a write that a crash of every replica
    /// could still take back.
    pub(super) fn answer_when_durable(&mut self, r: usize, p: Pending, resp: Response) {
        if self
            .cfg
            .durability
            .reply_ready(resp.index, self.reps[r].durable)
        {
            self.answer(r, &p, resp);
        } else {
            self.reps[r].for_disk.push((resp.index, p, resp));
            self.flush(r);
        }
    }

    pub(super) fn expire_reads(&mut self, r: usize) {
        let now = self.now;
        let index = self.reps[r].rs.state.index();
        let waiting = std::mem::take(&mut self.reps[r].for_index);
        for (deadline, p) in waiting {
            if index >= p.req.min_index || deadline <= now {
                let resp = self.reps[r].rs.read(&p.req);
                if matches!(resp.result, Err(DirError::Behind { .. })) {
                    self.answer(r, &p, resp);
                } else {
                    self.answer_when_durable(r, p, resp);
                }
            } else {
                self.reps[r].for_index.push((deadline, p));
            }
        }
    }

    /// A group message of this replica's was applied: answer it.
    pub(super) fn finish(&mut self, r: usize, p: Pending, resp: Response) {
        match p.kind {
            Waiting::Write => self.answer_when_durable(r, p, resp),
            Waiting::Sync => self.serve_read(r, p),
        }
    }

    pub(super) fn release_durable(&mut self, r: usize) {
        let durable = self.reps[r].durable;
        let waiting = std::mem::take(&mut self.reps[r].for_disk);
        for (index, p, resp) in waiting {
            if index <= durable {
                self.answer(r, &p, resp);
            } else {
                self.reps[r].for_disk.push((index, p, resp));
            }
        }
    }

    /// Starts writing the log buffer (one sync at a time).
    pub(super) fn flush(&mut self, r: usize) {
        let p = &mut self.reps[r];
        if p.syncing || !p.alive {
            return;
        }
        let last = p.rs.log.last_index();
        let bytes = p.rs.log.take(self.cfg.durability.marks());
        if bytes.is_none() && last <= p.durable {
            return;
        }
        let log = p.disk.logs.last_mut().expect("a current log");
        if let Some(b) = bytes {
            log.1.extend_from_slice(&b);
        }
        let len = log.1.len();
        p.syncing = true;
        let boot = p.boot;
        let d = self.rng.random_range(300..8_000);
        self.timeline.at(
            self.now + Duration::from_micros(d),
            Ev::Synced {
                r,
                boot,
                len,
                index: last,
            },
        );
    }

    pub(super) fn maybe_snapshot(&mut self, r: usize) {
        let p = &mut self.reps[r];
        let len = p.disk.logs.last().map(|l| l.1.len()).unwrap_or(0);
        if len < self.cfg.snapshot_bytes || p.syncing {
            return;
        }
        // As the shell does: flush and sync the buffer, start a new log,
        // write the snapshot (atomically: tmp, sync, rename), drop old logs.
        if let Some(b) = p.rs.log.take(false) {
            p.disk
                .logs
                .last_mut()
                .expect("a current log")
                .1
                .extend_from_slice(&b);
        }
        for l in &mut p.disk.logs {
            l.2 = l.1.len();
        }
        let index = p.rs.state.index();
        p.durable = p.durable.max(index);
        p.disk
            .logs
            .push((index, log::header(index).to_vec(), log::LOG_HEADER));
        p.disk.snapshot = Some(p.rs.state.encode_snapshot());
        p.disk.logs.retain(|(b, _, _)| *b >= index);
        self.report.snapshots += 1;
        self.release_durable(r);
    }

    pub(super) fn install_state(&mut self, r: usize, bytes: &[u8]) {
        let state = match DirState::decode_snapshot(bytes) {
            Ok(s) => s,
            Err(e) => {
                self.violation(format!(
                    "state_transfer: r{r} got an undecodable state: {e}"
                ));
                return;
            }
        };
        let index = state.index();
        self.log(|| format!("r{r} state transfer at index {index}"));
        let p = &mut self.reps[r];
        self.report.cancelled_pairs += p.rs.log.cancelled_pairs;
        p.rs = ReplicaState::new(state);
        p.disk.snapshot = Some(bytes.to_vec());
        p.disk.logs = vec![(index, log::header(index).to_vec(), log::LOG_HEADER)];
        p.durable = index;
        p.syncing = false;
        p.boot += 1;
        if p.phase == Phase::Joining {
            p.phase = Phase::Member;
        }
    }

    pub(super) fn on_event(&mut self, r: usize, ev: Event) {
        if !matches!(ev, Event::Message { .. }) {
            self.log(|| format!("r{r} event {ev:?}").chars().take(160).collect());
        }
        match ev {
            Event::Message { seq, body, .. } => {
                let Some((origin, resp)) = self.reps[r].rs.deliver(&body) else {
                    self.violation(format!("replica_agreement: r{r} got an undecodable entry"));
                    return;
                };
                if self.cfg.durability == Durability::Fsync {
                    self.flush(r);
                }
                if origin == self.reps[r].origin {
                    match self.reps[r].by_seq.remove(&seq) {
                        Some(p) => self.finish(r, p, resp),
                        None => {
                            self.reps[r].results.insert(seq, resp);
                        }
                    }
                }
                self.expire_reads(r);
            }
            Event::State { state, .. } => self.install_state(r, &state),
            Event::StateWanted { joiner } => {
                let state = self.reps[r].rs.state.encode_snapshot();
                let now = self.now;
                if let Some(core) = self.reps[r].core.as_mut() {
                    core.provide_state(now, joiner, &state);
                }
            }
            Event::View { .. } => {}
            Event::ResetFailed { .. } => {
                if self.reps[r].phase == Phase::Member {
                    self.reps[r].phase = Phase::Stuck;
                }
            }
            Event::Expelled | Event::LeftGroup | Event::JoinFailed => {
                self.lose_group(r, "expelled");
            }
            Event::Joined { .. } | Event::Left { .. } => {}
        }
    }

    /// After a replica's core ran: its completions and deliveries, its
    /// datagrams, its timer.
    pub(super) fn after(&mut self, r: usize) {
        if !self.reps[r].alive || self.reps[r].paused {
            return;
        }
        while let Some((msg, seq)) = self.reps[r].core.as_mut().and_then(|c| c.poll_sent()) {
            if let Some(p) = self.reps[r].by_msg.remove(&msg) {
                match self.reps[r].results.remove(&seq) {
                    Some(resp) => self.finish(r, p, resp),
                    None => {
                        self.reps[r].by_seq.insert(seq, p);
                    }
                }
            }
        }
        loop {
            let Some(ev) = self.reps[r].core.as_mut().and_then(|c| c.poll_event()) else {
                break;
            };
            self.on_event(r, ev);
        }
        let normal = self.reps[r]
            .core
            .as_ref()
            .is_some_and(|c| c.status() == Status::Normal);
        let now = self.now;
        let p = &mut self.reps[r];
        p.abnormal_since = if normal {
            None
        } else {
            p.abnormal_since.or(Some(now))
        };
        let mut out = Vec::new();
        let mut members = Vec::new();
        if let Some(core) = self.reps[r].core.as_mut() {
            while let Some(t) = core.poll_transmit() {
                out.push(t);
            }
            members = core.members().iter().map(|m| m.addr).collect();
        }
        let from = self.reps[r].addr;
        for t in out {
            let targets: Vec<SocketAddr> = match t.dest {
                GroupDest::Addr(a) => vec![a],
                GroupDest::Members => members.iter().copied().filter(|a| *a != from).collect(),
            };
            for to in targets {
                self.datagram(r, to, t.bytes.clone());
            }
        }
        let mut next = self.reps[r].core.as_ref().and_then(|c| c.poll_timeout());
        if let Some(d) = self.reps[r].for_index.iter().map(|(d, _)| *d).min() {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        if let Some(t) = next {
            let t = t.max(self.now + Duration::from_micros(1));
            if self.reps[r].scheduled.is_none_or(|s| s > t || s < self.now) {
                self.reps[r].scheduled = Some(t);
                self.timeline.at(t, Ev::Tick { r });
            }
        }
    }

    pub(super) fn datagram(&mut self, from_r: usize, to: SocketAddr, bytes: Vec<u8>) {
        let Some(dst) = self.reps.iter().position(|q| q.addr == to) else {
            return;
        };
        if self.reps[from_r].cut || self.reps[dst].cut {
            return;
        }
        let from = self.reps[from_r].addr;
        for d in self.net().verdict(&mut self.rng) {
            self.timeline.at(
                self.now + Duration::from_micros(d),
                Ev::Datagram {
                    to: dst,
                    from,
                    bytes: bytes.clone(),
                },
            );
        }
    }

    // ---- the clients ------------------------------------------------------
}
