//! The simulated directory clients: what each asks next, sending, retrying
//! and taking replies into the history (`super`).

use super::*;

impl DirSim {
    pub(super) fn pick_input(&mut self, c: usize) -> DirInput {
        let names = self.cfg.names as u8;
        let k = self.rng.random_range(0..names);
        let fresh = (c as u64) << 32 | self.clis[c].next_op;
        let known = self.clis[c].last.get(&k).copied().unwrap_or(fresh);
        match self.rng.random_range(0..10) {
            0..=2 => DirInput::Append(k, fresh),
            3 | 4 => DirInput::Delete(k),
            5 => DirInput::Replace(k, known, fresh),
            6 => {
                let mut to = self.rng.random_range(0..names);
                if to == k {
                    to = (k + 1) % names;
                }
                DirInput::Move(k, to, known)
            }
            _ => DirInput::Lookup(k),
        }
    }

    pub(super) fn client_tick(&mut self, c: usize) {
        if let Some((_, _, _, h, give_up)) = self.clis[c].current.clone() {
            if self.now >= give_up {
                // Outcome unknown: the history keeps it without a return.
                self.log(|| format!("c{c} gives up on op {h}"));
                self.clis[c].current = None;
                self.report.ops_unknown += 1;
            } else if self.clis[c].retry_at.is_some_and(|t| t <= self.now) {
                self.send_current(c, true);
                return;
            } else {
                return;
            }
        }
        // The next operation; then client 0 looks every name up (after
        // the faults), so every acknowledged update is checked.
        let input = if self.clis[c].left > 0 {
            self.clis[c].left -= 1;
            self.pick_input(c)
        } else if c == 0 && !self.faults_on && self.clis[c].finals < self.cfg.names {
            self.clis[c].finals += 1;
            DirInput::Lookup(self.clis[c].finals as u8 - 1)
        } else {
            if c == 0 && self.clis[c].finals < self.cfg.names {
                self.timeline
                    .at(self.now + Duration::from_millis(100), Ev::ClientTick { c });
            }
            return;
        };
        self.clis[c].next_op += 1;
        let write = !matches!(input, DirInput::Lookup(_));
        let cli = &mut self.clis[c];
        if write {
            cli.seq += 1;
        }
        let req = Request {
            client: cli.id,
            seq: cli.seq,
            min_index: cli.seen,
            flags: if write { 0 } else { FLAG_LINEARIZABLE },
            op: op_for(self.dir, &input),
        };
        let h = self.history.len();
        self.history.push(Operation {
            client: c as u64,
            input: input.clone(),
            call: self.now.0,
            output: None,
            ret: None,
        });
        let op = self.clis[c].next_op;
        self.clis[c].current = Some((op, req.encode(), input, h, self.now + GIVE_UP));
        self.send_current(c, false);
    }

    pub(super) fn send_current(&mut self, c: usize, retry: bool) {
        let Some((op, body, _, _, _)) = self.clis[c].current.clone() else {
            return;
        };
        if retry {
            self.clis[c].target = self.rng.random_range(0..self.reps.len());
        }
        let to = self.clis[c].target;
        self.clis[c].retry_at = Some(self.now + CLIENT_TIMEOUT);
        self.timeline
            .at(self.now + CLIENT_TIMEOUT, Ev::ClientTick { c });
        if !self.reps[to].cut {
            for d in self.net().verdict(&mut self.rng) {
                self.timeline.at(
                    self.now + Duration::from_micros(d),
                    Ev::Request {
                        to,
                        client: c,
                        op,
                        body: body.clone(),
                    },
                );
            }
        }
    }

    pub(super) fn on_reply(&mut self, c: usize, op: u64, body: &[u8]) {
        let Some((cur, _, input, h, _)) = self.clis[c].current.clone() else {
            return;
        };
        if cur != op {
            return;
        }
        let Ok(resp) = Response::decode(body) else {
            return;
        };
        let Some(out) = output_of(&resp.result) else {
            // Try another replica soon.
            self.clis[c].retry_at = Some(self.now + Duration::from_millis(20));
            self.timeline
                .at(self.now + Duration::from_millis(20), Ev::ClientTick { c });
            return;
        };
        self.log(|| format!("c{c} {input:?} -> {out:?} at {}", resp.index));
        let cli = &mut self.clis[c];
        cli.seen = cli.seen.max(resp.index);
        if let (DirInput::Lookup(k), DirOutput::Value(v)) = (&input, &out) {
            cli.last.insert(*k, *v);
        }
        cli.current = None;
        cli.retry_at = None;
        self.history[h].output = Some(out);
        self.history[h].ret = Some(self.now.0);
        self.report.ops_ok += 1;
        let think = self.rng.random_range(0..3_000);
        self.timeline.at(
            self.now + Duration::from_micros(think),
            Ev::ClientTick { c },
        );
    }

    // ---- the end ------------------------------------------------------------
}
