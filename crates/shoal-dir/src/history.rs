//! Histories of directory operations, for linearizability checks: the
//! operations a test client performs on one directory (names are small
//! numbers, values are made-up capabilities), what the service answered,
//! and the sequential specification they are checked against.  The
//! simulator and the real-cluster tests share it (the checker itself is
//! `shoal_sim::linearize`).

use shoal_cap::{Capability, GetPort, ObjectId, ObjectSecret, Rights};

use crate::model::DirError;
use crate::op::{Answer, Expect, InstallItem, Op};

/// A client operation on the test directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Append(u8, u64),
    Delete(u8),
    /// Replace(name, expected value, new value).
    Replace(u8, u64, u64),
    Lookup(u8),
    /// Move(from, to, expected value of from): an install of two rows.
    Move(u8, u8, u64),
}

/// What the service answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Ok,
    Exists,
    NotFound,
    Conflict,
    Value(u64),
}

/// The sequential specification: what `input` answers on `state` (the
/// value under each name) and the state after it.
pub fn step(state: &[Option<u64>], input: &Input) -> (Output, Vec<Option<u64>>) {
    let mut s = state.to_vec();
    let out = match *input {
        Input::Append(k, v) => {
            if s[k as usize].is_some() {
                Output::Exists
            } else {
                s[k as usize] = Some(v);
                Output::Ok
            }
        }
        Input::Delete(k) => {
            if s[k as usize].take().is_some() {
                Output::Ok
            } else {
                Output::NotFound
            }
        }
        Input::Replace(k, e, n) => match s[k as usize] {
            None => Output::NotFound,
            Some(x) if x != e => Output::Conflict,
            Some(_) => {
                s[k as usize] = Some(n);
                Output::Ok
            }
        },
        Input::Lookup(k) => match s[k as usize] {
            None => Output::NotFound,
            Some(x) => Output::Value(x),
        },
        Input::Move(a, b, v) => match (s[a as usize], s[b as usize]) {
            (None, _) => Output::NotFound,
            (Some(x), _) if x != v => Output::Conflict,
            (_, Some(_)) => Output::Exists,
            (Some(x), None) => {
                s[a as usize] = None;
                s[b as usize] = Some(x);
                Output::Ok
            }
        },
    };
    (out, s)
}

/// The row name for name number `k`.
pub fn row_name(k: u8) -> Vec<u8> {
    format!("k{k}").into_bytes()
}

/// A value as a capability stored in a row (a made-up object of another
/// service); its object number is the value.
pub fn value_cap(v: u64) -> Capability {
    let port = GetPort::from_bytes([0x5a; 16]).put_port();
    Capability::mint(
        port,
        ObjectId::new(v),
        Rights::ALL,
        &ObjectSecret::from_bytes([1; 32]),
    )
}

/// The request for one input, on directory `dir` (of one column).
pub fn op_for(dir: Capability, input: &Input) -> Op {
    match *input {
        Input::Append(k, v) => Op::Append {
            dir,
            name: row_name(k),
            caps: vec![value_cap(v)],
            masks: vec![Rights::ALL],
        },
        Input::Delete(k) => Op::Delete {
            dir,
            name: row_name(k),
        },
        Input::Replace(k, e, n) => Op::Replace {
            dir,
            name: row_name(k),
            expect: vec![value_cap(e)],
            caps: vec![value_cap(n)],
        },
        Input::Lookup(k) => Op::Lookup {
            dir,
            name: row_name(k),
        },
        Input::Move(a, b, v) => Op::Install {
            items: vec![
                InstallItem {
                    dir,
                    name: row_name(a),
                    expect: Expect::Caps(vec![value_cap(v)]),
                    new: None,
                },
                InstallItem {
                    dir,
                    name: row_name(b),
                    expect: Expect::Absent,
                    new: Some((vec![value_cap(v)], vec![Rights::ALL])),
                },
            ],
        },
    }
}

/// The output an answer means (`None`: not an answer about the directory,
/// e.g. "try another replica").
pub fn output_of(result: &Result<Answer, DirError>) -> Option<Output> {
    Some(match result {
        Ok(Answer::Done) => Output::Ok,
        Ok(Answer::Caps(c)) => Output::Value(c.first()?.object().get()),
        Err(DirError::Exists(_)) => Output::Exists,
        Err(DirError::NotFound(_)) => Output::NotFound,
        Err(DirError::Conflict(_)) => Output::Conflict,
        _ => return None,
    })
}

impl Input {
    /// Text form: `append K V`, `delete K`, `replace K E N`, `lookup K`,
    /// `move A B V`.
    pub fn to_text(&self) -> String {
        match self {
            Input::Append(k, v) => format!("append {k} {v}"),
            Input::Delete(k) => format!("delete {k}"),
            Input::Replace(k, e, n) => format!("replace {k} {e} {n}"),
            Input::Lookup(k) => format!("lookup {k}"),
            Input::Move(a, b, v) => format!("move {a} {b} {v}"),
        }
    }

    /// Parses [`Input::to_text`].
    pub fn from_text(s: &str) -> Option<Input> {
        let w: Vec<&str> = s.split_whitespace().collect();
        let n = |i: usize| w.get(i)?.parse::<u64>().ok();
        let k = |i: usize| w.get(i)?.parse::<u8>().ok();
        Some(match *w.first()? {
            "append" => Input::Append(k(1)?, n(2)?),
            "delete" => Input::Delete(k(1)?),
            "replace" => Input::Replace(k(1)?, n(2)?, n(3)?),
            "lookup" => Input::Lookup(k(1)?),
            "move" => Input::Move(k(1)?, k(2)?, n(3)?),
            _ => return None,
        })
    }
}

impl Output {
    /// Text form: `ok`, `exists`, `notfound`, `conflict`, `value V`.
    pub fn to_text(&self) -> String {
        match self {
            Output::Ok => "ok".into(),
            Output::Exists => "exists".into(),
            Output::NotFound => "notfound".into(),
            Output::Conflict => "conflict".into(),
            Output::Value(v) => format!("value {v}"),
        }
    }

    /// Parses [`Output::to_text`].
    pub fn from_text(s: &str) -> Option<Output> {
        let w: Vec<&str> = s.split_whitespace().collect();
        Some(match *w.first()? {
            "ok" => Output::Ok,
            "exists" => Output::Exists,
            "notfound" => Output::NotFound,
            "conflict" => Output::Conflict,
            "value" => Output::Value(w.get(1)?.parse().ok()?),
            _ => return None,
        })
    }
}
