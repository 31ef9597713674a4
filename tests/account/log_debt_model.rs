//! Sliding logs in debt, against the account model (`tests/common/account.rs`) on both stores:
//! two logs of different widths beside a sliding counter, requests of costs 0 to 3 held in
//! flight and answered late in any order (given back, kept, settled lower, or settled far
//! above the cost: debts of up to 40 units against limits of 1 to 12), while the limits are
//! raised and lowered and the widths moved, and idle keys are evicted. A debt is one entry of
//! its whole cost, so a limit raised later still counts all of it, and a late refund gives
//! back only its own entry's units that still count; at every step each store decides as the
//! model and reports the same remaining per quota.
//!
//! Pins docs/design.md section 3 ("An account per key": a debt stands, every kind keeps it
//! whole; "A live quota change").

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tower::Layer;

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{Memory, Store};

const MS: u64 = 1_000_000;

/// The quotas of variant `v`: 0 as built; 1 every limit lowered to 1 and 2; 2 raised to 12;
/// 3 the logs' widths swapped and the counter narrowed.
fn kinds(v: usize) -> Vec<Kind> {
    let (a, b, c, wa, wb, wc) = [
        (3, 5, 4, 1_000, 3_000, 2_000),
        (1, 2, 1, 1_000, 3_000, 2_000),
        (12, 12, 12, 1_000, 3_000, 2_000),
        (3, 5, 4, 3_000, 1_000, 700),
    ][v];
    vec![
        Kind::Log {
            limit: a,
            width: wa * MS,
        },
        Kind::Log {
            limit: b,
            width: wb * MS,
        },
        Kind::Counter {
            limit: c,
            width: wc * MS,
        },
    ]
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost, held in flight when admitted.
    Send(u32),
    /// The `i`-th request in flight answers: given back (200), kept (401), or settled.
    Answer(usize, Option<Option<u32>>),
    Wait(u64),
    Change(usize),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u32..4).prop_map(Op::Send),
        4 => (0usize..8, prop::option::of(prop::option::of(prop_oneof![0u32..4, 4u32..41])))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        3 => prop_oneof![0u64..400, 0u64..4_000].prop_map(Op::Wait),
        2 => (0usize..4).prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

async fn the_store_keeps_the_account_of_the_model(
    s: &impl Store,
    name: &str,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quotas: Vec<_> = kinds(0).iter().map(Kind::quota).collect();
    let l = s.layer(&quotas, name, &clock);
    let lim = s.limiter(&l, name);
    let mut rig = Rig::new(|h| l.layer(h));
    let mut model = Account::new(kinds(0));
    // The clock's time: 1 000 s and 1 ns at the start.
    let mut now = 1_000_000_000_001u64;
    let mut taken: Vec<(u64, Taken)> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Send(cost) => {
                let (said, t) = model.admit(now, cost);
                let got = rig.send("k", cost).await;
                prop_assert_eq!(got.is_some(), said.allowed, "op {}: send {}", i, cost);
                if let Some(id) = got {
                    taken.push((id, t.unwrap_or(Taken::nothing())));
                }
            }
            Op::Answer(j, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (id, t) = taken.remove(j % taken.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                let actual = match (reply.status, reply.actual) {
                    (200, _) => 0,
                    (_, Some(n)) => n,
                    (_, None) => t.cost,
                };
                model.settle(now, &t, actual);
                rig.answer(id, reply).await;
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * MS;
            }
            Op::Change(v) => {
                s.set_quotas(&lim, kinds(v).iter().map(Kind::quota).collect());
                model.set_quotas(now, kinds(v));
            }
            Op::Evict => s.evict_idle(&lim),
        }
        s.keep(&lim, "k").await;
        let d = s.peek(&lim, "k").await;
        let said = model.peek(now);
        let left: Vec<u64> = d.states().iter().map(|s| s.remaining()).collect();
        prop_assert_eq!(left, said.remaining, "op {}", i);
        prop_assert_eq!(d.is_allowed(), said.allowed, "op {}", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(Memory::CASES))]

    /// On the memory store.
    #[test]
    fn logs_in_debt_through_raises_lowerings_and_late_refunds_keep_the_model_in_memory(
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(the_store_keeps_the_account_of_the_model(&Memory, "p", ops))?;
    }
}

/// On a real redis-server: one server for every case, a policy name of its own per case.
#[cfg(feature = "redis")]
#[test]
fn logs_in_debt_through_raises_lowerings_and_late_refunds_keep_the_model_on_redis() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES * 2));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(&prop::collection::vec(op(), 1..60), |ops| {
            case.set(case.get() + 1);
            let name = format!("logdebt{}", case.get());
            // A case in which the server expired a key on its own clock is void.
            rt.block_on(async {
                let outcome = the_store_keeps_the_account_of_the_model(&redis, &name, ops).await;
                redis.judge(outcome).await
            })
        })
        .unwrap();
}
