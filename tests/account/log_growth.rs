//! A sliding log holding hundreds of entries on one key: its buffer grows (4, then 16, then
//! doubling) and shrinks as entries leave, while requests held in flight are given back late
//! into old entries (refunds by `count_if`, settlements lower and higher), the log's limit
//! and width change live, and idle keys are evicted. Beside it a second quota (a narrower
//! log sharing the key's entries, or a sliding counter). Decided on one key against the
//! reference model of `tests/common/account.rs`, on memory and on a real redis-server: every
//! request admitted exactly when the model admits it, and what each quota has left after
//! every step the model's.
//!
//! Pins docs/design.md sections 1 ("Other kinds": the sliding log) and 3 ("An account per
//! key", "A live quota change", "Keyed state": eviction changes no decision).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::Quota;

use crate::common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{Memory, Store};

const MS: u64 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// `n` requests of cost 1 to 3 (`costs` picks each), `gap` ms apart, held in flight.
    Burst(usize, u64, u64),
    /// The `i`-th request in flight answers: refunded (200), kept (401) or settled at a cost.
    Answer(usize, Option<Option<u32>>),
    /// The oldest half of the requests in flight are given back.
    GiveBackOldest,
    Wait(u64),
    /// The log takes this limit and width (ms).
    Change(u64, u64),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..60, any::<u64>(), 0u64..8).prop_map(|(n, c, g)| Op::Burst(n, c, g)),
        4 => (0usize..400, prop::option::of(prop::option::of(0u32..6)))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        1 => Just(Op::GiveBackOldest),
        2 => (0u64..700).prop_map(Op::Wait),
        1 => (20u64..300, 200u64..1_500).prop_map(|(l, w)| Op::Change(l, w)),
        1 => Just(Op::Evict),
    ]
}

fn kinds(log: (u64, u64), second: bool) -> Vec<Kind> {
    let (limit, width) = (log.0, log.1 * MS);
    vec![
        Kind::Log { limit, width },
        if second {
            Kind::Log {
                limit: limit / 2 + 1,
                width: width / 3 + MS,
            }
        } else {
            Kind::Counter {
                limit: 400,
                width: 2 * width,
            }
        },
    ]
}

/// The reply of an answer (`None`: given back; `Some(None)`: kept; `Some(Some(n))`: settled
/// at `n`), and the cost it settles `t` at.
fn reply_of(r: Option<Option<u32>>, t: &Taken) -> (Reply, u32) {
    match r {
        None => (OK, 0),
        Some(None) => (FAILED, t.cost),
        Some(Some(n)) => (settles(n), n),
    }
}

fn remaining(d: &tollgate::Decision) -> Vec<u64> {
    d.states().iter().map(|s| s.remaining()).collect()
}

async fn a_long_log_keeps_the_account_of_the_model(
    s: &impl Store,
    name: &str,
    log: (u64, u64),
    second: bool,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quotas: Vec<Quota> = kinds(log, second).iter().map(Kind::quota).collect();
    let l = s.layer(&quotas, name, &clock);
    let lim = s.limiter(&l, name);
    let mut rig = Rig::new(|h| tower::Layer::layer(&l, h));
    let mut model = Account::new(kinds(log, second));
    let mut now = 1_000_000_000_001u64;
    let mut taken: Vec<(u64, Taken)> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Burst(n, mut costs, gap) => {
                for _ in 0..n {
                    let cost = 1 + (costs % 3) as u32;
                    costs /= 3;
                    let (said, t) = model.admit(now, cost);
                    let got = rig.send("k", cost).await;
                    prop_assert_eq!(got.is_some(), said.allowed, "step {}: send {}", step, cost);
                    if let Some(id) = got {
                        taken.push((id, t.unwrap_or(Taken::nothing())));
                    }
                    time.advance(Duration::from_millis(gap));
                    now += gap * MS;
                }
            }
            Op::Answer(i, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (id, t) = taken.remove(i % taken.len());
                let (reply, actual) = reply_of(reply, &t);
                model.settle(now, &t, actual);
                rig.answer(id, reply).await;
            }
            Op::GiveBackOldest => {
                for _ in 0..taken.len() / 2 {
                    let (id, t) = taken.remove(0);
                    let (reply, actual) = reply_of(None, &t);
                    model.settle(now, &t, actual);
                    rig.answer(id, reply).await;
                }
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * MS;
            }
            Op::Change(limit, width) => {
                let k = kinds((limit, width), second);
                s.set_quotas(&lim, k.iter().map(Kind::quota).collect());
                model.set_quotas(now, k);
            }
            Op::Evict => s.evict_idle(&lim),
        }
        s.keep(&lim, "k").await;
        let d = s.peek(&lim, "k").await;
        let said = model.peek(now);
        prop_assert_eq!(remaining(&d), said.remaining, "step {}: held", step);
        prop_assert_eq!(d.is_allowed(), said.allowed, "step {}: held", step);
    }
    Ok(())
}

fn start() -> impl Strategy<Value = ((u64, u64), bool)> {
    ((20u64..300, 200u64..1_500), any::<bool>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The property on the memory store.
    #[test]
    fn a_log_of_hundreds_of_entries_keeps_the_account_of_the_model_in_memory(
        (log, second) in start(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(a_long_log_keeps_the_account_of_the_model(&Memory, "p", log, second, ops))?;
    }
}

/// The property on a real redis-server: one server for every case, a policy name of its own
/// per case.
#[cfg(feature = "redis")]
#[test]
fn a_log_of_hundreds_of_entries_keeps_the_account_of_the_model_on_redis() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(24));
    let case = std::cell::Cell::new(0u32);
    let strategy = (start(), prop::collection::vec(op(), 1..40));
    runner
        .run(&strategy, |((log, second), ops)| {
            case.set(case.get() + 1);
            let name = format!("long{}", case.get());
            rt.block_on(async {
                let outcome =
                    a_long_log_keeps_the_account_of_the_model(&redis, &name, log, second, ops);
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
}
