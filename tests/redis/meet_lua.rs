//! The decision script's sliding windows (src/redis/gcra.lua: a sliding log's entries read
//! once per call, the quotas' words rewritten only when they change) meet refunds,
//! settlements, live changes and peeks: on a real redis-server, a layer deciding through
//! the script and one deciding in memory on the same manual clock agree on every admission,
//! every refund and settlement, and on the state a peek reads after each step, with all four
//! kinds in one policy and two logs of different widths in another.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis"): both stores keep the same
//! account.

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
use common::redis_server::RedisServer;
use common::stores;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::redis::RedisStore;
use tollgate::{Policy, Quota};
use tower::Layer;

const MS: u64 = 1;

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` for key `k`, held in flight when admitted.
    Send(usize, u32),
    /// The request in flight at this index (modulo) is answered: a success (given back), a
    /// failure (counted), or a failure settling `n`.
    Answer(usize, Option<u32>, bool),
    /// The clock moves on.
    Wait(u64),
    /// The policy becomes the variant of this index: windows widened or narrowed, counts
    /// lowered or raised.
    Change(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..2, 0u32..4).prop_map(|(k, c)| Op::Send(k, c)),
        4 => (0usize..8, 0u32..9, any::<bool>()).prop_map(|(i, n, ok)| Op::Answer(i, Some(n), ok)),
        1 => (0usize..8).prop_map(|i| Op::Answer(i, None, false)),
        3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
        1 => (0usize..4).prop_map(Op::Change),
    ]
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n * MS)
}

/// The quotas of policy `shape` (0: every kind; 1: two logs, a counter, a fixed window) in
/// variant `v` (0 as built; 1 widened; 2 narrowed; 3 counts lowered, then 1 raised them).
fn quotas(shape: u8, v: usize) -> Vec<Quota> {
    let (w, n): (u64, u32) = [(1_000, 3), (2_500, 3), (400, 3), (1_000, 1)][v];
    match shape {
        0 => vec![
            Quota::new(n + 1, ms(w * 2)).burst(n + 1),
            Quota::fixed_window(n + 1, ms(w)),
            Quota::sliding_log(n, ms(w * 2)),
            Quota::sliding_window(n + 1, ms(w)),
        ],
        _ => vec![
            Quota::sliding_log(n, ms(w)),
            Quota::sliding_log(n + 3, ms(w * 3)),
            Quota::sliding_window(n + 2, ms(w * 2)),
            Quota::fixed_window(n + 4, ms(w * 4)),
        ],
    }
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

type Seen = (tollgate::Outcome, Option<u128>, Vec<(u64, Duration)>);

/// What a decision reports; the retry time in whole microseconds, rounded up (the script's
/// resolution: a counter's exact retry time may fall between two microseconds).
fn seen(d: &tollgate::Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after().map(|r| r.as_nanos().div_ceil(1000)),
        d.states()
            .iter()
            .map(|s| (s.remaining(), s.reset_after()))
            .collect(),
    )
}

async fn run(store: &RedisStore, case: u32, shape: u8, ops: &[Op]) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let name = format!("lua{case}");
    let quotas0 = quotas(shape, 0);
    let memory = stores::layer(&quotas0, &name, &clock);
    let redis = stores::layer(&quotas0, &name, &clock).store(store.clone());
    let mem_limiter = memory.limiter(&name).unwrap().unwrap();
    let redis_limiter = redis.limiter(&name).unwrap().unwrap();
    let mut m = Rig::new(|h| memory.clone().layer(h));
    let mut r = Rig::new(|h| redis.clone().layer(h));
    // (memory id, redis id) of each admitted request in flight.
    let mut flying: Vec<(u64, u64)> = Vec::new();
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
                let p = policy(&name, shape, v);
                memory.handle().unwrap().apply(&p).unwrap();
                redis.handle().unwrap().apply(&p).unwrap();
            }
        }
        for key in KEYS {
            let k = stores::key(key);
            let (a, b) = (mem_limiter.peek(&k), redis_limiter.peek(&k).await);
            prop_assert!(!b.is_degraded(), "op {}: Redis failed", i);
            prop_assert_eq!(seen(&a), seen(&b), "op {}: peek of {}", i, key);
        }
    }
    Ok(())
}

/// Both policies, random requests of two keys answered in any order with refunds, failures
/// and settlements above and below the cost, clock jumps across every window, and live
/// changes that widen, narrow, lower and raise: the script keeps the memory store's account.
#[test]
fn the_script_keeps_the_memory_account_through_refunds_settlements_and_changes() {
    let server = RedisServer::start();
    let rt = common::twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let mut runner = TestRunner::new(Config::with_cases(96));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(
            &(0u8..2, prop::collection::vec(op(), 1..50)),
            |(shape, ops)| {
                case.set(case.get() + 1);
                rt.block_on(run(&store, case.get(), shape, &ops))
            },
        )
        .unwrap();
}
