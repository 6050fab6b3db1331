//! Linearizability checking of recorded histories: Wing and Gong's search
//! with Lowe's memoization, after Porcupine (anishathalye/porcupine).
//!
//! A *history* is a list of [`Operation`]s, each an input given by a client
//! at logical time `call` and the output it got back at time `ret`.  The
//! history is *linearizable* against a sequential [`Model`] if each
//! operation can be given one instant inside its interval at which it takes
//! effect, such that applying the operations one by one in the order of
//! those instants, starting from [`Model::init`], yields exactly the
//! outputs recorded.  Operation A *happens before* B iff `A.ret < B.call`;
//! equal timestamps are concurrent.
//!
//! # The search
//!
//! Each operation becomes a *call entry* and a *return entry*, sorted by
//! time (calls before returns at equal times, which makes equal timestamps
//! concurrent), and linked into a doubly linked list.  The search walks the
//! list from its head: a call entry is an operation that may be linearized
//! next, and the first return entry reached marks the end of the candidates
//! (that operation has returned, so nothing that is called later may go
//! before it).  To *linearize* a candidate, the model steps with it; if the
//! step is legal the call and its return are *lifted* out of the list (a
//! dancing-links removal: the entries keep their own links) and the search
//! restarts from the head with the new state.  When it reaches a return
//! entry it *backtracks*: it pops the last linearized operation, restores
//! the state from before it, *unlifts* its entries back into the list and
//! tries the next candidate after it.  The history is linearizable when
//! every operation with a known outcome has been lifted, and not when the
//! search backtracks with nothing left to pop.
//!
//! Two paths that linearize the same set of operations and reach the same
//! model state have the same future, so the search keeps a cache of
//! `(linearized set as a bitset, state)` pairs and never enters one twice.
//! This turns the search, exponential in the worst case, into one that is
//! close to linear on histories with little concurrency.
//!
//! # P-compositionality
//!
//! Linearizability is local (Herlihy and Wing), and Horn and Kroening's
//! P-compositionality extends this to any partition of a history that the
//! model declares independent: a history over independent objects (the keys
//! of a key-value store) is linearizable iff each object's sub-history is.
//! [`Model::partition`] may split a history into such sub-histories, each
//! checked on its own, which is exponentially cheaper than checking them
//! together.  The default is one partition.
//!
//! # Unknown outcomes
//!
//! An operation with `output == None` is one whose outcome the client never
//! learnt: its call failed with "may have happened", or it was still pending
//! when the history ended.  As in Porcupine and Jepsen, it is given a return
//! time of +infinity: it may take effect at any instant after its call, even
//! after later operations of the same client, with whatever output the
//! model gives it ([`Model::step_unknown`]); and it may never take effect at
//! all, so it need not be linearized.  In the list such an operation has a
//! call entry and no return entry, so it never ends the candidates.
//!
//! # Cost and budget
//!
//! Each *step* of the search is one model step or one backtrack.  The
//! number of steps can grow exponentially with the number of concurrent
//! operations, so [`check`] takes a budget of steps per partition and
//! answers [`CheckResult::Unknown`] when a partition exceeds it: a count of
//! steps, not a duration, so that a verdict never depends on the machine.
//! The cache holds one bitset of `n` bits per distinct configuration
//! reached, so memory grows as `n²/8` bytes for a partition of `n`
//! operations checked sequentially; partition long histories.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;

/// A budget of a few seconds' work (steps run at a few million per
/// second): a 2,000-operation register history of four concurrent clients
/// takes about 15,000 steps, of eight about 300,000; one of sixteen exceeds
/// it.
pub const STEPS_MAX_DEFAULT: u64 = 10_000_000;

/// A sequential specification: the object the history is checked against.
pub trait Model {
    /// The object's state.  Equal states must behave the same in every
    /// future (the search merges paths that reach equal states).
    type State: Clone + Eq + Hash + Debug;
    /// What a client asks of the object.
    type Input: Debug;
    /// What the object answers.
    type Output: Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// Applies `input` to `state`: `Some(new state)` if `output` is a
    /// possible result of it, `None` if not.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;

    /// Applies `input`, whose output was never seen, to `state`: the state
    /// after it, with whatever output the model would produce, or `None` if
    /// it cannot be applied to `state` at all.  The checker also considers
    /// the operation never taking effect, so this is only the case where it
    /// did.
    fn step_unknown(&self, state: &Self::State, input: &Self::Input) -> Option<Self::State>;

    /// Splits a history into independent sub-histories, as lists of indices
    /// into `history`: each operation in exactly one of them, and no
    /// operation of one able to affect the outputs of another (for example,
    /// one per key of a key-value store).  The default is one partition of
    /// everything.
    fn partition(&self, history: &[Operation<Self::Input, Self::Output>]) -> Vec<Vec<usize>> {
        vec![(0..history.len()).collect()]
    }
}

/// One operation of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// Who issued it; not used by the check, kept for reports.
    pub client: u64,
    /// What was asked.
    pub input: I,
    /// When it was called (logical time, one clock for the whole history).
    pub call: u64,
    /// What came back; `None` if the outcome is unknown (see the module
    /// documentation).
    pub output: Option<O>,
    /// When it returned: required, and at least `call`, when `output` is
    /// known; ignored when it is not (such an operation may take effect at
    /// any time after its call, even after the client gave up on it).
    pub ret: Option<u64>,
}

/// The verdict on a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    /// The history is linearizable.
    Ok,
    /// The history is not linearizable: partition number `partition` (an
    /// index into what [`Model::partition`] returned) has no linearization.
    Illegal {
        /// Which partition failed.
        partition: usize,
        /// The longest sequence of that partition's operations (indices
        /// into the history, in linearization order) that the search found
        /// legal before it ran out of candidates: where to start reading.
        longest_prefix: Vec<usize>,
    },
    /// No partition is illegal, but at least one exceeded the step budget:
    /// nothing is known about it.
    Unknown,
}

impl CheckResult {
    /// Whether the history was found linearizable.
    pub fn is_ok(&self) -> bool {
        matches!(self, CheckResult::Ok)
    }
}

/// Checks whether `history` is linearizable against `model`.
///
/// `steps_max` bounds the work per partition (see the module documentation;
/// [`STEPS_MAX_DEFAULT`] is a reasonable choice, `None` means no bound).
/// Partitions are checked in order; the first illegal one decides the
/// result, even after another exceeded its budget.
///
/// # Panics
///
/// If an operation has a known output but no return time, or returns before
/// it is called, or if [`Model::partition`] does not name every operation
/// exactly once: these are bugs in the caller.
pub fn check<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    steps_max: Option<u64>,
) -> CheckResult {
    for (i, op) in history.iter().enumerate() {
        if op.output.is_some() {
            let ret = op
                .ret
                .unwrap_or_else(|| panic!("operation {i} has an output but no return time"));
            assert!(
                op.call <= ret,
                "operation {i} returns at {ret}, before its call at {}",
                op.call
            );
        }
    }
    let partitions = model.partition(history);
    let mut seen = vec![false; history.len()];
    for &i in partitions.iter().flatten() {
        assert!(
            i < history.len(),
            "partition names operation {i}, past the history"
        );
        assert!(!seen[i], "operation {i} is in two partitions");
        seen[i] = true;
    }
    if let Some(i) = seen.iter().position(|&s| !s) {
        panic!("operation {i} is in no partition");
    }

    let mut exceeded = false;
    for (partition, ops) in partitions.iter().enumerate() {
        match search(model, history, ops, steps_max) {
            Verdict::Ok => {}
            Verdict::Exceeded => exceeded = true,
            Verdict::Illegal(prefix) => {
                return CheckResult::Illegal {
                    partition,
                    longest_prefix: prefix.into_iter().map(|op| ops[op]).collect(),
                };
            }
        }
    }
    if exceeded {
        CheckResult::Unknown
    } else {
        CheckResult::Ok
    }
}

/// The verdict on one partition; operations are numbered within it.
enum Verdict {
    Ok,
    Illegal(Vec<usize>),
    Exceeded,
}

/// The Wing–Gong search over one partition: `ops` are indices into
/// `history`, and the search numbers them `0..ops.len()`.
fn search<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    ops: &[usize],
    steps_max: Option<u64>,
) -> Verdict {
    let mut list = Entries::new(history, ops);
    let known_total = ops.iter().filter(|&&i| history[i].output.is_some()).count();
    let mut known_done = 0;
    let mut state = model.init();
    let mut linearized = Bitset::new(ops.len());
    let mut cache: HashSet<(Bitset, M::State)> = HashSet::new();
    // The linearized operations, in order: each one's call entry and the
    // state before it.
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut longest: Vec<usize> = Vec::new();
    let mut steps: u64 = 0;

    let mut entry = list.next[HEAD];
    while known_done < known_total {
        if steps_max.is_some_and(|max| steps >= max) {
            return Verdict::Exceeded;
        }
        steps += 1;
        match list.kinds[entry] {
            Kind::Call { op, .. } => {
                let operation = &history[ops[op]];
                let after = match &operation.output {
                    Some(output) => model.step(&state, &operation.input, output),
                    None => model.step_unknown(&state, &operation.input),
                };
                if let Some(after) = after {
                    linearized.set(op);
                    if cache.insert((linearized.clone(), after.clone())) {
                        stack.push((entry, std::mem::replace(&mut state, after)));
                        list.lift(entry);
                        if operation.output.is_some() {
                            known_done += 1;
                        }
                        entry = list.next[HEAD];
                        continue;
                    }
                    linearized.clear(op);
                }
                entry = list.next[entry];
            }
            // An operation that has returned without being linearized (the
            // tail is unreachable: every known operation left has a return
            // entry before it).
            Kind::Return | Kind::Tail => {
                if stack.len() > longest.len() {
                    longest = stack.iter().map(|&(call, _)| list.op(call)).collect();
                }
                let Some((call, before)) = stack.pop() else {
                    return Verdict::Illegal(longest);
                };
                let op = list.op(call);
                state = before;
                linearized.clear(op);
                list.unlift(call);
                if history[ops[op]].output.is_some() {
                    known_done -= 1;
                }
                entry = list.next[call];
            }
            Kind::Head => unreachable!("the head is never a successor"),
        }
    }
    Verdict::Ok
}

/// The list's sentinel before the first entry.
const HEAD: usize = 0;

/// What an entry of the list is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Head,
    /// The call of operation `op`, and where its return entry is (none if
    /// its outcome is unknown).
    Call {
        op: usize,
        ret: Option<usize>,
    },
    Return,
    Tail,
}

/// The call and return entries of one partition in time order, as a doubly
/// linked list over indices (`HEAD`, the entries, then the tail sentinel).
struct Entries {
    kinds: Vec<Kind>,
    prev: Vec<usize>,
    next: Vec<usize>,
}

impl Entries {
    fn new<I, O>(history: &[Operation<I, O>], ops: &[usize]) -> Self {
        // (time, 0 for a call or 1 for a return, operation): calls sort
        // before returns at equal times, so equal timestamps are concurrent.
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * ops.len());
        for (op, &i) in ops.iter().enumerate() {
            let operation = &history[i];
            events.push((operation.call, 0, op));
            if operation.output.is_some() {
                let ret = operation.ret.expect("checked by check()");
                events.push((ret, 1, op));
            }
        }
        events.sort_unstable();

        let len = events.len() + 2;
        let mut ret_entry = vec![None; ops.len()];
        for (at, &(_, kind, op)) in events.iter().enumerate() {
            if kind == 1 {
                ret_entry[op] = Some(at + 1);
            }
        }
        let mut kinds = Vec::with_capacity(len);
        kinds.push(Kind::Head);
        for &(_, kind, op) in &events {
            kinds.push(if kind == 0 {
                Kind::Call {
                    op,
                    ret: ret_entry[op],
                }
            } else {
                Kind::Return
            });
        }
        kinds.push(Kind::Tail);
        Self {
            kinds,
            // The head's prev and the tail's next are never followed.
            prev: (0..len).map(|e| e.saturating_sub(1)).collect(),
            next: (0..len).map(|e| (e + 1).min(len - 1)).collect(),
        }
    }

    /// The operation whose call entry is `call`.
    fn op(&self, call: usize) -> usize {
        match self.kinds[call] {
            Kind::Call { op, .. } => op,
            kind => unreachable!("entry {call} is {kind:?}, not a call"),
        }
    }

    /// Takes the call entry `call` and its return entry out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        if let Kind::Call { ret: Some(ret), .. } = self.kinds[call] {
            self.unlink(ret);
        }
    }

    /// Undoes the `lift` of `call`, which must be the latest one not undone.
    fn unlift(&mut self, call: usize) {
        if let Kind::Call { ret: Some(ret), .. } = self.kinds[call] {
            self.relink(ret);
        }
        self.relink(call);
    }

    fn unlink(&mut self, e: usize) {
        let (prev, next) = (self.prev[e], self.next[e]);
        self.next[prev] = next;
        self.prev[next] = prev;
    }

    fn relink(&mut self, e: usize) {
        let (prev, next) = (self.prev[e], self.next[e]);
        self.next[prev] = e;
        self.prev[next] = e;
    }
}

/// The set of linearized operations of a partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bitset(Vec<u64>);

impl Bitset {
    fn new(len: usize) -> Self {
        Self(vec![0; len.div_ceil(64)])
    }

    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }
}

#[cfg(test)]
mod tests;
