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
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    // ---- a register ----

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum RegIn {
        Put(u64),
        Get,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum RegOut {
        Done,
        Value(u64),
    }

    /// A register holding a `u64`, initially 0.
    struct Register;

    impl Model for Register {
        type State = u64;
        type Input = RegIn;
        type Output = RegOut;

        fn init(&self) -> u64 {
            0
        }

        fn step(&self, state: &u64, input: &RegIn, output: &RegOut) -> Option<u64> {
            match (input, output) {
                (RegIn::Put(v), RegOut::Done) => Some(*v),
                (RegIn::Get, RegOut::Value(v)) if v == state => Some(*state),
                _ => None,
            }
        }

        fn step_unknown(&self, state: &u64, input: &RegIn) -> Option<u64> {
            match input {
                RegIn::Put(v) => Some(*v),
                RegIn::Get => Some(*state),
            }
        }
    }

    type RegOp = Operation<RegIn, RegOut>;

    fn put(client: u64, value: u64, call: u64, ret: u64) -> RegOp {
        Operation {
            client,
            input: RegIn::Put(value),
            call,
            output: Some(RegOut::Done),
            ret: Some(ret),
        }
    }

    fn get(client: u64, value: u64, call: u64, ret: u64) -> RegOp {
        Operation {
            client,
            input: RegIn::Get,
            call,
            output: Some(RegOut::Value(value)),
            ret: Some(ret),
        }
    }

    fn put_unknown(client: u64, value: u64, call: u64) -> RegOp {
        Operation {
            client,
            input: RegIn::Put(value),
            call,
            output: None,
            ret: None,
        }
    }

    fn check_register(history: &[RegOp]) -> CheckResult {
        check(&Register, history, Some(STEPS_MAX_DEFAULT))
    }

    fn assert_ok(history: &[RegOp]) {
        assert_eq!(check_register(history), CheckResult::Ok, "{history:#?}");
    }

    fn assert_illegal(history: &[RegOp]) {
        let result = check_register(history);
        assert!(
            matches!(result, CheckResult::Illegal { .. }),
            "{result:?} for {history:#?}"
        );
    }

    // ---- a key-value store, partitioned by key ----

    const KEYS: usize = 3;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum KvIn {
        Put(usize, u64),
        Get(usize),
    }

    impl KvIn {
        fn key(&self) -> usize {
            match *self {
                KvIn::Put(k, _) | KvIn::Get(k) => k,
            }
        }
    }

    /// `KEYS` registers, each initially 0; split by key when `partitioned`.
    struct Kv {
        partitioned: bool,
    }

    impl Model for Kv {
        type State = [u64; KEYS];
        type Input = KvIn;
        type Output = RegOut;

        fn init(&self) -> [u64; KEYS] {
            [0; KEYS]
        }

        fn step(&self, state: &[u64; KEYS], input: &KvIn, output: &RegOut) -> Option<[u64; KEYS]> {
            match (*input, *output) {
                (KvIn::Put(k, v), RegOut::Done) => {
                    let mut next = *state;
                    next[k] = v;
                    Some(next)
                }
                (KvIn::Get(k), RegOut::Value(v)) if state[k] == v => Some(*state),
                _ => None,
            }
        }

        fn step_unknown(&self, state: &[u64; KEYS], input: &KvIn) -> Option<[u64; KEYS]> {
            let mut next = *state;
            if let KvIn::Put(k, v) = *input {
                next[k] = v;
            }
            Some(next)
        }

        fn partition(&self, history: &[Operation<KvIn, RegOut>]) -> Vec<Vec<usize>> {
            if !self.partitioned {
                return vec![(0..history.len()).collect()];
            }
            let mut by_key = vec![Vec::new(); KEYS];
            for (i, op) in history.iter().enumerate() {
                by_key[op.input.key()].push(i);
            }
            by_key
        }
    }

    /// The register history `ops`, on key `key` of the store.
    fn on_key(key: usize, ops: &[RegOp]) -> Vec<Operation<KvIn, RegOut>> {
        ops.iter()
            .map(|op| Operation {
                client: op.client,
                input: match op.input {
                    RegIn::Put(v) => KvIn::Put(key, v),
                    RegIn::Get => KvIn::Get(key),
                },
                call: op.call,
                output: op.output,
                ret: op.ret,
            })
            .collect()
    }

    // ---- hand-written histories ----

    #[test]
    fn empty_history_is_linearizable() {
        assert_ok(&[]);
    }

    #[test]
    fn sequential_reads_see_the_latest_write() {
        assert_ok(&[
            get(0, 0, 0, 1),
            put(0, 1, 2, 3),
            get(1, 1, 4, 5),
            put(1, 2, 6, 7),
            get(0, 2, 8, 9),
        ]);
        assert_illegal(&[put(0, 1, 0, 1), get(1, 0, 2, 3)]);
        assert_illegal(&[get(0, 5, 0, 1)]);
    }

    #[test]
    fn stale_read_is_illegal_and_reports_the_longest_prefix() {
        let history = [put(0, 1, 0, 1), put(1, 2, 2, 3), get(2, 1, 4, 5)];
        assert_eq!(
            check_register(&history),
            CheckResult::Illegal {
                partition: 0,
                longest_prefix: vec![0, 1],
            }
        );
    }

    #[test]
    fn concurrent_writes_may_take_effect_in_either_order() {
        let writes = [put(0, 1, 0, 10), put(1, 2, 1, 9)];
        for (seen, ok) in [(1, true), (2, true), (0, false)] {
            let mut history = writes.to_vec();
            history.push(get(2, seen, 11, 12));
            assert_eq!(check_register(&history).is_ok(), ok, "read {seen}");
        }
        // But every reader sees the same order: 2 then 1 here.
        let mut history = writes.to_vec();
        history.extend([get(2, 2, 2, 3), get(3, 1, 4, 5)]);
        let mut after = history.clone();
        after.push(get(2, 1, 11, 12));
        assert_ok(&after);
        history.push(get(2, 2, 11, 12));
        assert_illegal(&history);
    }

    #[test]
    fn a_read_concurrent_with_a_write_sees_old_or_new_but_never_goes_back() {
        assert_ok(&[put(0, 1, 0, 10), get(1, 0, 1, 2), get(1, 1, 3, 4)]);
        assert_ok(&[put(0, 1, 0, 10), get(1, 1, 1, 2), get(2, 0, 1, 2)]);
        assert_illegal(&[put(0, 1, 0, 10), get(1, 1, 1, 2), get(1, 0, 3, 4)]);
    }

    #[test]
    fn equal_timestamps_are_concurrent() {
        assert_ok(&[put(0, 1, 0, 5), get(1, 0, 5, 6)]);
        assert_ok(&[get(1, 1, 0, 5), put(0, 1, 5, 6)]);
        assert_illegal(&[put(0, 1, 0, 5), get(1, 0, 6, 7)]);
        // An instantaneous operation.
        assert_ok(&[put(0, 1, 3, 3), get(1, 1, 3, 3)]);
    }

    #[test]
    fn an_unknown_write_may_explain_a_later_read() {
        assert_ok(&[put_unknown(0, 1, 0), get(1, 1, 5, 6)]);
        // Even one called while the read was in progress.
        assert_ok(&[get(1, 1, 0, 6), put_unknown(0, 1, 5)]);
        // And it may take effect after later writes: the client gave up at
        // 2, but its request was still on its way.
        let mut late = put_unknown(0, 1, 0);
        late.ret = Some(2);
        assert_ok(&[late, put(0, 2, 3, 4), get(1, 2, 5, 6), get(1, 1, 7, 8)]);
    }

    #[test]
    fn an_unknown_write_need_not_take_effect() {
        assert_ok(&[put_unknown(0, 1, 0), get(1, 0, 5, 6)]);
        assert_ok(&[put(0, 2, 0, 1), put_unknown(0, 1, 2), get(1, 2, 5, 6)]);
    }

    #[test]
    fn an_unknown_write_cannot_explain_a_read_before_its_call() {
        assert_illegal(&[get(1, 1, 0, 1), put_unknown(0, 1, 2)]);
    }

    #[test]
    fn an_unknown_write_takes_effect_at_most_once() {
        // Once seen it stays until overwritten: nothing wrote 0 after it.
        assert_illegal(&[put_unknown(0, 1, 0), get(1, 1, 1, 2), get(1, 0, 3, 4)]);
        // It cannot be read both before and after another write.
        assert_illegal(&[
            put_unknown(0, 1, 0),
            get(1, 1, 1, 2),
            put(2, 2, 3, 4),
            get(1, 2, 5, 6),
            get(1, 1, 7, 8),
        ]);
        // But two unknown writes of the same value can.
        assert_ok(&[
            put_unknown(0, 1, 0),
            put_unknown(3, 1, 0),
            get(1, 1, 1, 2),
            put(2, 2, 3, 4),
            get(1, 2, 5, 6),
            get(1, 1, 7, 8),
        ]);
    }

    #[test]
    fn an_unknown_read_constrains_nothing() {
        let unknown_get = Operation {
            client: 1,
            input: RegIn::Get,
            call: 0,
            output: None,
            ret: None,
        };
        assert_ok(&[unknown_get, put(0, 1, 1, 2), get(2, 1, 3, 4)]);
    }

    #[test]
    #[should_panic(expected = "before its call")]
    fn a_return_before_the_call_is_a_caller_bug() {
        check_register(&[put(0, 1, 5, 4)]);
    }

    #[test]
    #[should_panic(expected = "no return time")]
    fn a_known_output_without_a_return_is_a_caller_bug() {
        let mut op = put(0, 1, 0, 1);
        op.ret = None;
        check_register(&[op]);
    }

    #[test]
    fn the_failing_partition_is_named_with_history_indices() {
        let good = on_key(0, &[put(0, 1, 0, 1), get(1, 1, 2, 3)]);
        let stale = on_key(2, &[put(0, 1, 0, 1), put(1, 2, 2, 3), get(2, 1, 4, 5)]);
        // Interleave the two so that history indices differ from
        // partition-local ones: good[0] stale[0] good[1] stale[1] stale[2].
        let history = vec![
            good[0].clone(),
            stale[0].clone(),
            good[1].clone(),
            stale[1].clone(),
            stale[2].clone(),
        ];
        assert_eq!(
            check(&Kv { partitioned: true }, &history, None),
            CheckResult::Illegal {
                partition: 2,
                longest_prefix: vec![1, 3],
            }
        );
        assert!(check(&Kv { partitioned: true }, &history[..4], None).is_ok());
    }

    #[test]
    fn an_illegal_partition_wins_over_an_exhausted_one() {
        // Key 0: a hard history (many concurrent writes, then an
        // impossible read) that a tiny budget cannot decide; key 1: plainly
        // stale.
        let mut hard: Vec<RegOp> = (1..=12).map(|v| put(v, v, 0, 10)).collect();
        hard.push(get(0, 99, 11, 12));
        let mut history = on_key(0, &hard);
        history.extend(on_key(1, &[put(0, 1, 0, 1), get(1, 0, 2, 3)]));
        let kv = Kv { partitioned: true };
        assert!(matches!(
            check(&kv, &history, Some(100)),
            CheckResult::Illegal { partition: 1, .. }
        ));
        // Alone, key 0 is undecided within the budget and illegal without.
        let history = on_key(0, &hard);
        assert_eq!(check(&kv, &history, Some(100)), CheckResult::Unknown);
        assert!(matches!(
            check(&kv, &history, None),
            CheckResult::Illegal { partition: 0, .. }
        ));
    }

    #[test]
    #[should_panic(expected = "in no partition")]
    fn a_partition_must_name_every_operation() {
        struct Forgetful;
        impl Model for Forgetful {
            type State = u64;
            type Input = RegIn;
            type Output = RegOut;
            fn init(&self) -> u64 {
                0
            }
            fn step(&self, s: &u64, i: &RegIn, o: &RegOut) -> Option<u64> {
                Register.step(s, i, o)
            }
            fn step_unknown(&self, s: &u64, i: &RegIn) -> Option<u64> {
                Register.step_unknown(s, i)
            }
            fn partition(&self, _: &[RegOp]) -> Vec<Vec<usize>> {
                vec![vec![0]]
            }
        }
        check(&Forgetful, &[put(0, 1, 0, 1), get(0, 1, 2, 3)], None);
    }

    // ---- random histories ----

    /// A history of `clients` clients doing `ops_each` operations each
    /// against a real (atomic) register: each operation takes effect at a
    /// random instant inside its interval.  With probability `unknown`, an
    /// operation's outcome is lost: a lost write takes effect at a random
    /// instant after its call (perhaps after the client's next operations)
    /// or never.  Written values are distinct, from 1.
    fn simulate_register(
        rng: &mut ChaCha8Rng,
        clients: u64,
        ops_each: usize,
        unknown: f64,
    ) -> Vec<RegOp> {
        let mut history = Vec::new();
        // (instant, tie-break, operation)
        let mut effects: Vec<(u64, u64, usize)> = Vec::new();
        let mut value = 0;
        for client in 0..clients {
            let mut now = rng.random_range(0..3);
            for _ in 0..ops_each {
                let call = now;
                let ret = call + rng.random_range(0..6);
                let input = if rng.random_bool(0.5) {
                    value += 1;
                    RegIn::Put(value)
                } else {
                    RegIn::Get
                };
                let lost = rng.random_bool(unknown);
                let at = if !lost {
                    Some(rng.random_range(call..=ret))
                } else if matches!(input, RegIn::Put(_)) && rng.random_bool(0.5) {
                    Some(call + rng.random_range(0..20))
                } else {
                    None
                };
                if let Some(at) = at {
                    effects.push((at, rng.random(), history.len()));
                }
                history.push(Operation {
                    client,
                    input,
                    call,
                    output: (!lost).then_some(RegOut::Done),
                    ret: (!lost).then_some(ret),
                });
                now = ret + rng.random_range(0..3);
            }
        }
        effects.sort_unstable();
        let mut register = 0;
        for (_, _, i) in effects {
            match history[i].input {
                RegIn::Put(v) => register = v,
                RegIn::Get => history[i].output = Some(RegOut::Value(register)),
            }
        }
        history
    }

    #[test]
    fn histories_of_a_real_register_are_linearizable() {
        for seed in 0..500 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let clients = rng.random_range(1..6);
            let ops_each = rng.random_range(1..12);
            let history = simulate_register(&mut rng, clients, ops_each, 0.1);
            assert_eq!(
                check_register(&history),
                CheckResult::Ok,
                "seed {seed}: {history:#?}"
            );
        }
    }

    #[test]
    fn a_read_of_a_value_never_written_is_illegal() {
        let mut mutated = 0;
        for seed in 0..500 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let clients = rng.random_range(1..6);
            let ops_each = rng.random_range(1..12);
            let mut history = simulate_register(&mut rng, clients, ops_each, 0.1);
            let reads: Vec<usize> = (0..history.len())
                .filter(|&i| matches!(history[i].output, Some(RegOut::Value(_))))
                .collect();
            if reads.is_empty() {
                continue;
            }
            let i = reads[rng.random_range(0..reads.len())];
            history[i].output = Some(RegOut::Value(u64::MAX));
            let result = check_register(&history);
            assert!(
                matches!(result, CheckResult::Illegal { partition: 0, .. }),
                "seed {seed}: read {i} mutated, {result:?}"
            );
            mutated += 1;
        }
        assert!(mutated > 400, "only {mutated} histories had a read");
    }

    /// Whether some order of some of `history`'s operations (all those with
    /// known outputs, any of the others) respects real time and the model:
    /// by trying every permutation and every choice of unknown operations.
    fn brute_force(history: &[RegOp]) -> bool {
        fn permutations(n: usize) -> Vec<Vec<usize>> {
            if n == 0 {
                return vec![Vec::new()];
            }
            let mut all = Vec::new();
            for shorter in permutations(n - 1) {
                for at in 0..n {
                    let mut p = shorter.clone();
                    p.insert(at, n - 1);
                    all.push(p);
                }
            }
            all
        }
        let happens_before = |a: &RegOp, b: &RegOp| a.output.is_some() && a.ret.unwrap() < b.call;
        let unknown: Vec<usize> = (0..history.len())
            .filter(|&i| history[i].output.is_none())
            .collect();
        permutations(history.len()).iter().any(|order| {
            (0..1u32 << unknown.len()).any(|dropped| {
                let order: Vec<usize> = order
                    .iter()
                    .copied()
                    .filter(|i| {
                        unknown
                            .iter()
                            .position(|u| u == i)
                            .is_none_or(|bit| dropped & (1 << bit) == 0)
                    })
                    .collect();
                let in_real_time = order.iter().enumerate().all(|(at, &i)| {
                    order[at + 1..]
                        .iter()
                        .all(|&later| !happens_before(&history[later], &history[i]))
                });
                let mut state = Register.init();
                in_real_time
                    && order.iter().all(|&i| {
                        let op = &history[i];
                        let after = match &op.output {
                            Some(output) => Register.step(&state, &op.input, output),
                            None => Register.step_unknown(&state, &op.input),
                        };
                        match after {
                            Some(after) => {
                                state = after;
                                true
                            }
                            None => false,
                        }
                    })
            })
        })
    }

    /// Up to `max_ops` operations with random intervals and values from a
    /// small set: often not linearizable, never obviously so.
    fn random_register_history(rng: &mut ChaCha8Rng, max_ops: usize) -> Vec<RegOp> {
        (0..rng.random_range(1..=max_ops))
            .map(|client| {
                let call = rng.random_range(0..8);
                let ret = call + rng.random_range(0..5);
                let op = if rng.random_bool(0.5) {
                    put(client as u64, rng.random_range(1..3), call, ret)
                } else {
                    get(client as u64, rng.random_range(0..3), call, ret)
                };
                if rng.random_bool(0.2) {
                    Operation {
                        output: None,
                        ret: None,
                        ..op
                    }
                } else {
                    op
                }
            })
            .collect()
    }

    #[test]
    fn agrees_with_brute_force_on_small_histories() {
        let (mut ok, mut illegal) = (0, 0);
        for seed in 0..2_000 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let history = random_register_history(&mut rng, 6);
            let expected = brute_force(&history);
            let result = check_register(&history);
            assert_eq!(
                result.is_ok(),
                expected,
                "seed {seed}: {result:?} for {history:#?}"
            );
            if expected {
                ok += 1;
            } else {
                illegal += 1;
            }
        }
        // Both verdicts are exercised.
        assert!(ok > 400 && illegal > 400, "{ok} ok, {illegal} illegal");
    }

    #[test]
    fn the_longest_prefix_is_a_legal_sequence() {
        for seed in 0..500 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let history = random_register_history(&mut rng, 6);
            let CheckResult::Illegal { longest_prefix, .. } = check_register(&history) else {
                continue;
            };
            let ops: Vec<RegOp> = longest_prefix.iter().map(|&i| history[i].clone()).collect();
            // In order, each from the state of the one before.
            let mut state = Register.init();
            for op in &ops {
                state = match &op.output {
                    Some(output) => Register.step(&state, &op.input, output),
                    None => Register.step_unknown(&state, &op.input),
                }
                .unwrap_or_else(|| panic!("seed {seed}: {op:?} illegal in {longest_prefix:?}"));
            }
            for (at, a) in ops.iter().enumerate() {
                for b in &ops[at + 1..] {
                    assert!(
                        b.ret.is_none_or(|ret| ret >= a.call),
                        "seed {seed}: {longest_prefix:?} out of real-time order"
                    );
                }
            }
        }
    }

    #[test]
    fn partitioning_by_key_does_not_change_the_verdict() {
        for seed in 0..1_000 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut history = Vec::new();
            for key in 0..KEYS {
                history.extend(on_key(key, &random_register_history(&mut rng, 3)));
            }
            let whole = check(&Kv { partitioned: false }, &history, None);
            let split = check(&Kv { partitioned: true }, &history, None);
            assert_eq!(whole.is_ok(), split.is_ok(), "seed {seed}: {history:#?}");
            assert!(!matches!(whole, CheckResult::Unknown));
        }
    }

    // ---- long histories ----

    #[test]
    fn a_long_sequential_history_checks_in_linear_steps() {
        let history: Vec<RegOp> = (0..2_000)
            .map(|i| {
                let (call, ret) = (2 * i, 2 * i + 1);
                if i % 2 == 0 {
                    put(i % 3, i, call, ret)
                } else {
                    get(i % 3, i - 1, call, ret)
                }
            })
            .collect();
        // One step per operation: no backtracking at all.
        assert_eq!(check(&Register, &history, Some(2_000)), CheckResult::Ok);
        let mut stale = history.clone();
        stale[1_999].output = Some(RegOut::Value(0));
        assert!(matches!(
            check_register(&stale),
            CheckResult::Illegal { .. }
        ));
    }

    #[test]
    fn a_long_concurrent_history_checks_within_the_default_budget() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let history = simulate_register(&mut rng, 4, 500, 0.0);
        assert_eq!(check_register(&history), CheckResult::Ok);
    }
}
