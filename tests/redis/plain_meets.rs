//! The script of quotas without warm-up (src/redis/plain.lua) meets the general one
//! (src/redis/gcra.lua, which a limiter with a penalty box always runs) on the same keys: two
//! Redis limiters of one name, one plain and one with a penalty box that never bans, take
//! turns on the same keys, with reports (cost 0) and live changes of the quotas (windows
//! widened and narrowed, counts raised and lowered while keys hold state), and decide as one
//! memory limiter on the same manual clock does, to the request and to every report.
//!
//! Windows are seconds long, so that the keys' times to live (on the server's clock) outlast
//! the test's steps (on the manual clock).
//!
//! Pins docs/design.md section 3 ("Redis"): both stores keep the same account, whichever
//! script writes a key and whichever reads it next.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::twins;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Decision, Outcome, Quota, RateLimiter};

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` (0: a report) for key `k`, through the plain limiter (false) or the
    /// one with a penalty box (true).
    Check(bool, u8, u32),
    /// The clock moves on, in ms.
    Wait(u64),
    /// Every limiter takes the quotas of this variant.
    Change(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 0u8..2, prop_oneof![3 => 1u32..4, 1 => Just(0u32)])
            .prop_map(|(b, k, c)| Op::Check(b, k, c)),
        3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
        1 => (0usize..4).prop_map(Op::Change),
    ]
}

/// One quota: kind (0 GCRA, 1 fixed window, 2 sliding log, 3 sliding counter), count, and a
/// window per unit of the count in tens of ms (so that a GCRA interval is whole ms).
type Spec = (u8, u32, u64);

fn spec() -> impl Strategy<Value = Spec> {
    (0u8..4, 1u32..6, 30u64..100)
}

/// The quotas of `specs` in variant `v`: 0 as given, 1 windows widened 5/2, 2 narrowed 2/5,
/// 3 counts lowered by one (at least 1) and raised by one in turn.
fn quotas(specs: &[Spec], v: usize) -> Vec<Quota> {
    specs
        .iter()
        .enumerate()
        .map(|(i, &(kind, count, tens))| {
            let ms = match v {
                1 => tens * 25,
                2 => tens * 4,
                _ => tens * 10,
            };
            let count = match v {
                3 if i % 2 == 0 => count.saturating_sub(1).max(1),
                3 => count + 1,
                _ => count,
            };
            let w = Duration::from_millis(ms * u64::from(count));
            match kind {
                0 => Quota::new(count, w),
                1 => Quota::fixed_window(count, w),
                2 => Quota::sliding_log(count, w),
                _ => Quota::sliding_window(count, w),
            }
        })
        .collect()
}

type Seen = (Outcome, Option<u128>, Vec<u64>, Vec<Duration>);

/// What a decision reports; the retry time in whole microseconds, rounded up (the script's
/// resolution).
fn seen(d: &Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after().map(|r| r.as_nanos().div_ceil(1000)),
        d.states().iter().map(|s| s.remaining()).collect(),
        d.states().iter().map(|s| s.reset_after()).collect(),
    )
}

#[test]
fn both_scripts_on_one_key_decide_as_memory_through_live_changes_and_reports() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(2))
        // Two instances take turns on one key: a rejection cached by one would stand (as its
        // docs allow) while the other admits.
        .deny_cache(0);
    let mut runner = TestRunner::new(Config::with_cases(512));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(
            &(
                prop::collection::vec(spec(), 1..=3),
                prop::collection::vec(op(), 1..60),
            ),
            |(specs, ops)| {
                case_no.set(case_no.get() + 1);
                let name = format!("plain-meets-{}", case_no.get());
                let first = quotas(&specs, 0);
                let (clock, time) = Clock::manual();
                let build = |penalty: bool| {
                    let mut b = RedisRateLimiter::<u8>::builder(store.clone(), first[0].clone())
                        .name(name.clone())
                        .clock(clock.clone());
                    for q in &first[1..] {
                        b = b.quota(q.clone());
                    }
                    if penalty {
                        // Never bans: every rejection is a strike, a million are needed.
                        b = b.penalty_box(PenaltyBox::new(
                            1_000_000,
                            Duration::from_secs(1),
                            Duration::from_secs(1),
                        ));
                    }
                    b.build()
                };
                let plain = build(false);
                let boxed = build(true);
                let mut m = RateLimiter::<u8>::builder(first[0].clone()).clock(clock.clone());
                for q in &first[1..] {
                    m = m.quota(q.clone());
                }
                let memory = m.build();
                for (i, op) in ops.iter().enumerate() {
                    match *op {
                        Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                        Op::Change(v) => {
                            let qs = quotas(&specs, v);
                            plain.set_quotas(qs.clone()).unwrap();
                            boxed.set_quotas(qs.clone()).unwrap();
                            memory.set_quotas(qs).unwrap();
                        }
                        Op::Check(with_box, key, cost) => {
                            let limiter = if with_box { &boxed } else { &plain };
                            let got = rt.block_on(limiter.check_n(&key, cost));
                            if got.is_degraded() {
                                return Err(TestCaseError::fail(format!(
                                    "Redis failed at step {i}"
                                )));
                            }
                            let want = memory.check_n(&key, cost);
                            prop_assert_eq!(seen(&got), seen(&want), "step {}: {:?}", i, op);
                        }
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}
