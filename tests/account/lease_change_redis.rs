//! A Redis lease meets live changes and the account: the HTTP layer of two GCRA quotas on a
//! store that lends batches of at most 4 units, at one instant of a manual clock, sends
//! requests of costs 1 to 3 held in flight and answered in any order (given back by
//! `count_if`, kept, settled lower or higher), while the handle changes the quotas (bursts
//! lowered and raised, an interval made longer) and the instance gives its leases back now
//! and then.
//!
//! The clock stands, so each quota's time ahead of now in Redis (`reset_after`) is the sum of
//! the slices the requests still hold, each sized by the interval in force when it was taken
//! (a debt by the interval when it was charged), plus the units the instance holds and those
//! a change left unused (never more than one batch a change). So, after every step:
//! * Redis's time is never less than what the requests hold: no refund, settlement or lease
//!   gives back more than its request took, and a refund after a change goes back at the
//!   interval it was taken with, to the quota it came from;
//! * never more than that plus one batch per change and one held: a lease takes at most
//!   `max_batch`, and what it holds goes back;
//! * right after an admission and without debts, Redis's time fits every quota's tolerance:
//!   a lease never admits more than each quota allows.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change", "Redis": a
//! leased unit is used at most its hold after Redis granted it).

#![cfg(feature = "redis")]

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::redis::{Lease, RedisStore};
use tollgate::{Policy, Quota};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
use crate::common::redis_server::RedisServer;
use crate::common::stores;

/// The most units a batch holds.
const BATCH: u128 = 4;

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost`, held in flight when admitted.
    Send(u32),
    /// The request in flight at this index (modulo) answers: given back, kept, or settled.
    Answer(usize, Option<u32>, bool),
    /// The quotas become the variant of this index.
    Change(usize),
    /// The instance gives its leases back.
    Return,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..4).prop_map(Op::Send),
        4 => (0usize..8, 0u32..6, any::<bool>()).prop_map(|(i, n, ok)| Op::Answer(i, Some(n), ok)),
        1 => (0usize..8).prop_map(|i| Op::Answer(i, None, false)),
        2 => (0usize..4).prop_map(Op::Change),
        1 => Just(Op::Return),
    ]
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// (interval, burst) of each quota in variant `v`: 0 as built; 1 the first burst lowered;
/// 2 the second burst lowered and the first raised; 3 the second interval longer.
fn settings(v: usize) -> [(u64, u32); 2] {
    [
        [(100, 12), (250, 10)],
        [(100, 6), (250, 10)],
        [(100, 16), (250, 5)],
        [(100, 12), (400, 10)],
    ][v]
}

/// The quotas of variant `v`, and a third that never limits here but keeps the Redis key
/// alive for a day of real time while the limiter sends the manual clock's.
fn quotas(v: usize) -> Vec<Quota> {
    let [a, b] = settings(v);
    vec![
        Quota::new(1, ms(a.0)).burst(a.1),
        Quota::new(1, ms(b.0)).burst(b.1),
        Quota::per_day(100_000).burst(100_000),
    ]
}

fn policy(name: &str, v: usize) -> Policy {
    let q = quotas(v);
    Policy::new(name.to_owned(), q[0].clone())
        .quota(q[1].clone())
        .quota(q[2].clone())
}

/// What an admitted request holds of each quota's time, in ns: its cost at the intervals in
/// force when it was admitted.
#[derive(Debug, Clone)]
struct Held {
    cost: u32,
    intervals: [u128; 2],
}

fn intervals(v: usize) -> [u128; 2] {
    let [a, b] = settings(v);
    [u128::from(a.0) * 1_000_000, u128::from(b.0) * 1_000_000]
}

/// One case; how many of its admissions a lease served.
async fn run(store: &RedisStore, case: u32, ops: &[Op]) -> Result<u64, TestCaseError> {
    let (clock, _time) = manual();
    let name = format!("leasechange{case}");
    let l = stores::layer(&quotas(0), &name, &clock).store(store.clone());
    let lim = l.limiter(&name).unwrap().unwrap();
    let mut rig = Rig::new(|h| l.clone().layer(h));
    let k = stores::key("k");
    let mut v = 0;
    // Per quota, in ns: what the requests and debts hold; what changes may have left unused.
    let mut holds = [0u128; 2];
    let mut lost = [0u128; 2];
    let mut debts = false;
    let mut flying: Vec<(u64, Held)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let mut admitted = false;
        match *op {
            Op::Send(cost) => {
                if let Some(id) = rig.send("k", cost).await {
                    let h = Held {
                        cost,
                        intervals: intervals(v),
                    };
                    for (hold, t) in holds.iter_mut().zip(h.intervals) {
                        *hold += u128::from(cost) * t;
                    }
                    flying.push((id, h));
                    admitted = true;
                }
            }
            Op::Answer(j, settle, ok) => {
                if flying.is_empty() {
                    continue;
                }
                let (id, h) = flying.remove(j % flying.len());
                let (reply, actual): (Reply, u32) = match (settle, ok) {
                    (_, true) => (OK, 0),
                    (None, false) => (FAILED, h.cost),
                    (Some(n), false) => (settles(n), n),
                };
                rig.answer(id, reply).await;
                for ((hold, then), now) in holds.iter_mut().zip(h.intervals).zip(intervals(v)) {
                    if actual < h.cost {
                        *hold -= u128::from(h.cost - actual) * then;
                    } else {
                        *hold += u128::from(actual - h.cost) * now;
                    }
                }
                debts |= actual > h.cost;
            }
            Op::Change(to) => {
                // The units the instance holds are never used after the change.
                for (lost, t) in lost.iter_mut().zip(intervals(v)) {
                    *lost += BATCH * t;
                }
                v = to;
                l.handle().unwrap().apply(&policy(&name, v)).unwrap();
            }
            Op::Return => lim.return_leases().await,
        }
        let d = lim.peek(&k).await;
        prop_assert!(!d.is_degraded(), "op {}: Redis failed", i);
        for q in 0..2 {
            let ahead = d.states()[q].reset_after().as_nanos();
            let held = BATCH * intervals(v)[q];
            prop_assert!(
                ahead >= holds[q],
                "op {}: quota {} has {} ns ahead, its requests hold {}",
                i,
                q,
                ahead,
                holds[q]
            );
            prop_assert!(
                ahead <= holds[q] + lost[q] + held,
                "op {}: quota {} has {} ns ahead, its requests hold {}, changes left {}",
                i,
                q,
                ahead,
                holds[q],
                lost[q]
            );
            if admitted && !debts {
                let [a, b] = settings(v);
                let tau = [a, b][q].1 as u128 * intervals(v)[q];
                prop_assert!(ahead <= tau, "op {}: quota {} past its tolerance", i, q);
            }
        }
    }
    // Given back, the leases leave what the requests hold and what changes left unused.
    lim.return_leases().await;
    let d = lim.peek(&k).await;
    for q in 0..2 {
        let ahead = d.states()[q].reset_after().as_nanos();
        prop_assert!(holds[q] <= ahead && ahead <= holds[q] + lost[q]);
    }
    Ok(lim.leased())
}

/// Random interleavings at one instant: Redis's time is what the requests hold, give or take
/// what a lease holds and what changes left unused, and an admission fits every quota.
#[test]
fn leased_admissions_refunded_and_settled_across_changes_give_back_what_they_took() {
    let server = RedisServer::start();
    let rt = crate::common::twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .lease(Lease::new(BATCH as u32, Duration::from_secs(10)));
    let mut runner = TestRunner::new(Config::with_cases(128));
    let case = std::cell::Cell::new(0u32);
    let leased = std::cell::Cell::new(0u64);
    runner
        .run(&prop::collection::vec(op(), 1..60), |ops| {
            case.set(case.get() + 1);
            leased.set(leased.get() + rt.block_on(run(&store, case.get(), &ops))?);
            Ok(())
        })
        .unwrap();
    assert!(
        leased.get() > 20,
        "{} admissions served by a lease",
        leased.get()
    );
}
