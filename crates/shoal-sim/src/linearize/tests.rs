//! The checker against histories known to be, and not to be, linearizable.

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
