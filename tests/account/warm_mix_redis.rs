//! Warm-up beside the window kinds in one policy, side by side on a real redis-server and in
//! memory, on one manual clock: two keys' requests of costs 0 to 3 held in flight and
//! answered in any order (given back by `count_if`, kept, settled lower or higher), clock
//! jumps across every window and warm-up period, idle keys evicted from memory, and live
//! changes that move the warm-up curve (its rate or its cold factor) together with a window's
//! width, or its burst alone, or lower and raise the windows' counts. The script (its
//! warm-up renewals: a key idle under the old quotas at a change of curve is new, judged by
//! each window as it was before the change) keeps the memory store's account: every
//! admission, every answer, and every figure a peek reads after each step.
//!
//! Two policies: warm-up with a fixed window, a sliding log and a sliding counter; and GCRA,
//! warm-up, a sliding log and a sliding counter. At most four changes of curve a case: more
//! within one warm-up period is a known limit of the renewals a call carries.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change", "Redis").

#![cfg(feature = "redis")]

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::redis::RedisStore;
use tollgate::{Decision, Outcome, Policy, Quota};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
use crate::common::redis_server::{connection, RedisServer, ServerClock};
use crate::common::stores;

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` for key `k`, held in flight when admitted.
    Send(usize, u32),
    /// The request in flight at this index (modulo) answers: given back, kept, or settled.
    Answer(usize, Option<u32>, bool),
    /// The clock moves on, in milliseconds.
    Wait(u64),
    /// The policy becomes the variant of this index.
    Change(usize),
    /// Memory drops its idle keys.
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, 0u32..4).prop_map(|(k, c)| Op::Send(k, c)),
        4 => (0usize..8, 0u32..7, any::<bool>()).prop_map(|(i, n, ok)| Op::Answer(i, Some(n), ok)),
        1 => (0usize..8).prop_map(|i| Op::Answer(i, None, false)),
        4 => prop_oneof![0u64..300, 0u64..3_000, Just(6_000)].prop_map(Op::Wait),
        2 => (0usize..4).prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The warm-up quota of variant `v`: 0 as built; 1 a colder curve; 2 a larger burst, the
/// same curve; 3 a slower rate.
fn warm(v: usize) -> Quota {
    match v {
        0 => Quota::per_second(5).burst(4).warm_up(ms(2_000), 3),
        1 => Quota::per_second(5).burst(4).warm_up(ms(2_000), 4),
        2 => Quota::per_second(5).burst(6).warm_up(ms(2_000), 3),
        _ => Quota::per_second(4).burst(4).warm_up(ms(2_000), 3),
    }
}

/// The quotas of policy `shape` in variant `v`: with a change of curve (1, 3), a window is
/// widened (1) or narrowed (3); 2 moves the burst and lowers the counts; 3 raises them.
fn quotas(shape: u8, v: usize) -> Vec<Quota> {
    let (w, n): (u64, u32) = [(1_000, 3), (2_500, 3), (1_000, 2), (400, 4)][v];
    match shape {
        0 => vec![
            warm(v),
            Quota::fixed_window(n + 1, ms(w)),
            Quota::sliding_log(n, ms(w * 2)),
            Quota::sliding_window(n + 1, ms(1_500)),
        ],
        _ => vec![
            Quota::new(1, ms(500)).burst(n + 1),
            warm(v),
            Quota::sliding_log(n + 1, ms(1_200)),
            Quota::sliding_window(n, ms(w)),
        ],
    }
}

/// Whether going from variant `a` to `b` changes the warm-up curve (rate, period, cold
/// factor), not only the burst.
fn curve_changes(a: usize, b: usize) -> bool {
    let (x, y) = (warm(a), warm(b));
    x.warm_up_settings() != y.warm_up_settings() || x.emission_interval() != y.emission_interval()
}

fn policy(name: &str, shape: u8, v: usize) -> Policy {
    let qs = quotas(shape, v);
    qs[1..]
        .iter()
        .fold(Policy::new(name.to_owned(), qs[0].clone()), |p, q| {
            p.quota(q.clone())
        })
}

const KEYS: [&str; 2] = ["a", "b"];

type Seen = (Outcome, Option<u128>, Vec<(u64, Duration)>);

/// What a decision reports; the retry time in whole microseconds, rounded up (the script's
/// resolution).
fn seen(d: &Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after().map(|r| r.as_nanos().div_ceil(1000)),
        d.states()
            .iter()
            .map(|s| (s.remaining(), s.reset_after()))
            .collect(),
    )
}

async fn run(
    store: &RedisStore,
    server_clock: &mut ServerClock,
    case: u32,
    shape: u8,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let name = format!("warmmix{case}");
    let quotas0 = quotas(shape, 0);
    let memory = stores::layer(&quotas0, &name, &clock);
    let redis = stores::layer(&quotas0, &name, &clock).store(store.clone());
    let mem_limiter = memory.limiter(&name).unwrap().unwrap();
    let redis_limiter = redis.limiter(&name).unwrap().unwrap();
    let mut m = Rig::new(|h| memory.clone().layer(h));
    let mut r = Rig::new(|h| redis.clone().layer(h));
    let mut flying: Vec<(u64, u64)> = Vec::new();
    let (mut variant, mut curves) = (0, 0);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Send(k, cost) => {
                let (x, y) = (m.send(KEYS[k], cost).await, r.send(KEYS[k], cost).await);
                prop_assert_eq!(x.is_some(), y.is_some(), "op {}: admitted", i);
                if let (Some(x), Some(y)) = (x, y) {
                    flying.push((x, y));
                }
            }
            Op::Answer(j, settle, ok) => {
                if flying.is_empty() {
                    continue;
                }
                let (x, y) = flying.remove(j % flying.len());
                let reply: Reply = match (settle, ok) {
                    (_, true) => OK,
                    (None, false) => FAILED,
                    (Some(n), false) => settles(n),
                };
                let (a, b) = (m.answer(x, reply).await, r.answer(y, reply).await);
                prop_assert_eq!(a, b, "op {}: answer", i);
            }
            Op::Wait(n) => time.advance(ms(n)),
            Op::Change(v) => {
                if curve_changes(variant, v) {
                    if curves == 4 {
                        continue;
                    }
                    curves += 1;
                }
                variant = v;
                let p = policy(&name, shape, v);
                memory.handle().unwrap().apply(&p).unwrap();
                redis.handle().unwrap().apply(&p).unwrap();
            }
            Op::Evict => {
                mem_limiter.evict_idle();
            }
        }
        server_clock.keep_all().await;
        for key in KEYS {
            let k = stores::key(key);
            let (a, b) = (mem_limiter.peek(&k), redis_limiter.peek(&k).await);
            prop_assert!(!b.is_degraded(), "op {}: Redis failed", i);
            prop_assert_eq!(seen(&a), seen(&b), "op {}: peek of {}", i, key);
        }
    }
    Ok(())
}

/// Both policies on random interleavings: the script keeps the memory store's account
/// through warm-up renewals, width changes, refunds, settlements and eviction.
#[test]
fn warm_up_beside_windows_keeps_the_memory_account_on_redis_through_changes_of_curve() {
    let server = RedisServer::start();
    let rt = crate::common::twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let conn = rt.block_on(connection(&server));
    let mut runner = TestRunner::new(Config::with_cases(128));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(
            &(0u8..2, prop::collection::vec(op(), 1..60)),
            |(shape, ops)| {
                case.set(case.get() + 1);
                rt.block_on(async {
                    // Redis expires keys on its own clock, the decisions run on the manual
                    // one: a case in which the server expired a key before the step's peeks
                    // is void.
                    let mut clock = ServerClock::watch(&conn).await;
                    let outcome = run(&store, &mut clock, case.get(), shape, &ops).await;
                    clock.judge(outcome).await
                })
            },
        )
        .unwrap();
}
