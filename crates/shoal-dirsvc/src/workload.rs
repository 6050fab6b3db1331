//! A test workload: concurrent clients doing random appends, deletes,
//! replaces, atomic moves and linearizable lookups on a few names of one
//! directory, recording each operation's call and return times
//! (CLOCK_MONOTONIC, comparable between processes of one machine) and
//! answer, for a linearizability check (`shoal_dir::history`).  Behind
//! `shoal-dir-workload`; the real-cluster tests run it while they crash,
//! pause and partition replicas.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use shoal_cap::Capability;
use shoal_dir::history::{Input, Output, op_for, output_of};
use shoal_rpc::Context;

use crate::client::{ClientError, DirClient};

/// One operation of the history.
#[derive(Debug, Clone)]
pub struct Record {
    pub client: u64,
    pub input: Input,
    /// Nanoseconds, CLOCK_MONOTONIC.
    pub call: u64,
    /// `None`: the outcome is unknown (the call failed).
    pub ret: Option<u64>,
    pub output: Option<Output>,
}

impl Record {
    /// One JSON line.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "client": self.client,
            "input": self.input.to_text(),
            "call": self.call,
            "ret": self.ret,
            "output": self.output.as_ref().map(Output::to_text),
        })
        .to_string()
    }

    /// Parses [`Record::to_json`].
    pub fn from_json(line: &str) -> Option<Record> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        Some(Record {
            client: v["client"].as_u64()?,
            input: Input::from_text(v["input"].as_str()?)?,
            call: v["call"].as_u64()?,
            ret: v["ret"].as_u64(),
            output: match v["output"].as_str() {
                Some(s) => Some(Output::from_text(s)?),
                None => None,
            },
        })
    }
}

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts)
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How the workload runs.
#[derive(Debug, Clone)]
pub struct Workload {
    pub clients: usize,
    /// Operations per client (at most).
    pub ops: usize,
    /// Stop starting operations after this long.
    pub duration: Option<Duration>,
    pub names: u8,
    /// Distinguishes the values and client ids of workload processes.
    pub seed: u64,
    /// How long one call keeps retrying before its outcome is unknown.
    pub retry_for: Duration,
}

fn one(dir: &mut DirClient, cap: Capability, client: u64, input: Input) -> Record {
    let call = monotonic_ns();
    let result = dir.call(op_for(cap, &input));
    let ret = monotonic_ns();
    let output = match &result {
        Ok(a) => output_of(&Ok(a.clone())),
        Err(ClientError::Dir(e)) => output_of(&Err(e.clone())),
        Err(_) => None,
    };
    Record {
        client,
        input,
        call,
        ret: output.as_ref().map(|_| ret),
        output,
    }
}

/// Runs the clients to the end; returns every operation.
pub fn run(ctx: &Context, cap: Capability, w: &Workload) -> Vec<Record> {
    let threads: Vec<_> = (0..w.clients)
        .map(|c| {
            let ctx = ctx.clone();
            let w = w.clone();
            std::thread::spawn(move || {
                let client = w.seed * 1000 + c as u64;
                let mut rng = rand::rngs::StdRng::seed_from_u64(client);
                let mut dir = match DirClient::with_port(&ctx, cap.port()) {
                    Ok(d) => d,
                    Err(_) => return Vec::new(),
                };
                dir.linearizable(true).retry_for(w.retry_for);
                let mut last: BTreeMap<u8, u64> = BTreeMap::new();
                let mut out = Vec::new();
                let started = std::time::Instant::now();
                for n in 0..w.ops as u64 {
                    if w.duration.is_some_and(|d| started.elapsed() >= d) {
                        break;
                    }
                    let k = rng.random_range(0..w.names);
                    let fresh = client << 24 | n;
                    let known = last.get(&k).copied().unwrap_or(fresh);
                    let input = match rng.random_range(0..10) {
                        0..=2 => Input::Append(k, fresh),
                        3 | 4 => Input::Delete(k),
                        5 => Input::Replace(k, known, fresh),
                        6 => Input::Move(
                            k,
                            (k + 1 + rng.random_range(0..w.names - 1)) % w.names,
                            known,
                        ),
                        _ => Input::Lookup(k),
                    };
                    let r = one(&mut dir, cap, client, input);
                    if let (Input::Lookup(k), Some(Output::Value(v))) = (&r.input, &r.output) {
                        last.insert(*k, *v);
                    }
                    out.push(r);
                }
                out
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect()
}

/// Looks every name up once (linearizably).
pub fn final_reads(ctx: &Context, cap: Capability, names: u8, seed: u64) -> Vec<Record> {
    let Ok(mut dir) = DirClient::with_port(ctx, cap.port()) else {
        return Vec::new();
    };
    dir.linearizable(true).retry_for(Duration::from_secs(30));
    (0..names)
        .map(|k| one(&mut dir, cap, seed * 1000 + 999, Input::Lookup(k)))
        .collect()
}
