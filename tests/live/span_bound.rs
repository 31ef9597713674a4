//! "No sequence of changes admits more over any span than the most generous quota in force
//! over it" (`RateLimiter::set_quotas`), checked directly, not through a model, on memory and
//! on a real redis-server, while the quotas change at random between requests of costs 1 to
//! 3 on one key:
//! * a sliding log of width `w`: the units admitted in any span of `w` are at most the largest
//!   limit in force at some moment of that span;
//! * GCRA: after every admission the key is no further ahead of now (`reset_after`) than the
//!   burst period (`burst × interval`) of the quota that admitted it.
//!
//! Pins docs/design.md section 3 ("A live quota change").

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::Quota;

use crate::common::account::rig::manual;
use crate::common::stores::{Memory, Store};

const MS: u64 = 1_000_000;

/// The log's width.
const W: u64 = 1_000 * MS;

#[derive(Debug, Clone)]
enum Op {
    Request(u32),
    Wait(u64),
    /// New settings: a log's limit; GCRA's interval (ms) and burst.
    Change(u64, u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u32..4).prop_map(Op::Request),
        3 => (0u64..400).prop_map(Op::Wait),
        1 => (1u64..9, 1u64..6, 1u64..7).prop_map(|(l, i, b)| Op::Change(l, i * 50, b)),
    ]
}

/// A log of `limit` per `W`.
async fn a_log_admits_at_most_the_largest_limit_in_force_over_any_span(
    s: &impl Store,
    name: &str,
    limit: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quota = |l: u64| vec![Quota::sliding_log(l as u32, Duration::from_nanos(W))];
    let lim = s.build(&quota(limit), name, &clock);
    let mut now = 0u64;
    // (time, limit) of every change, the first at 0; (time, cost) of every admission.
    let mut limits = vec![(0u64, limit)];
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    for op in ops {
        match op {
            Op::Request(cost) => {
                if s.check_n(&lim, "k", cost).await.is_allowed() {
                    admitted.push((now, u64::from(cost)));
                    // The span of W ending now: what it admitted, against the largest limit in
                    // force at some moment of it (the one in force at its start included).
                    let start = now.saturating_sub(W - 1);
                    let units: u64 = admitted
                        .iter()
                        .filter(|(t, _)| *t >= start)
                        .map(|a| a.1)
                        .sum();
                    let most = limits
                        .iter()
                        .enumerate()
                        .filter(|(i, (t, _))| {
                            *t >= start || limits.get(i + 1).map_or(true, |n| n.0 > start)
                        })
                        .map(|(_, l)| l.1)
                        .max()
                        .unwrap_or(0);
                    prop_assert!(
                        units <= most,
                        "{} units in the span of W ending at {} ms, the largest limit {}",
                        units,
                        now / MS,
                        most
                    );
                }
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * MS;
            }
            Op::Change(l, _, _) => {
                s.set_quotas(&lim, quota(l));
                limits.push((now, l));
            }
        }
        s.keep(&lim, "k").await;
    }
    Ok(())
}

/// One GCRA quota of `interval` ms and `burst`.
async fn a_gcra_key_is_never_further_ahead_than_the_burst_period_that_admitted_it(
    s: &impl Store,
    name: &str,
    (interval, burst): (u64, u64),
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quota = |i: u64, b: u64| vec![Quota::new(1, Duration::from_millis(i)).burst(b as u32)];
    let lim = s.build(&quota(interval, burst), name, &clock);
    let mut period = Duration::from_millis(interval * burst);
    for op in ops {
        match op {
            Op::Request(cost) => {
                let d = s.check_n(&lim, "k", cost).await;
                if d.is_allowed() {
                    prop_assert!(
                        d.reset_after() <= period,
                        "ahead {:?} after an admission of {}, the burst period {:?}",
                        d.reset_after(),
                        cost,
                        period
                    );
                }
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Change(_, i, b) => {
                s.set_quotas(&lim, quota(i, b));
                period = Duration::from_millis(i * b);
            }
        }
        s.keep(&lim, "k").await;
    }
    Ok(())
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(Memory::CASES))]

    #[test]
    fn a_log_admits_at_most_the_largest_limit_in_force_over_any_span_in_memory(
        limit in 1u64..9,
        ops in ops(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(a_log_admits_at_most_the_largest_limit_in_force_over_any_span(
            &Memory, "p", limit, ops,
        ))?;
    }

    #[test]
    fn a_gcra_key_is_never_further_ahead_than_the_burst_period_that_admitted_it_in_memory(
        start in (1u64..6, 1u64..7),
        ops in ops(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(a_gcra_key_is_never_further_ahead_than_the_burst_period_that_admitted_it(
            &Memory, "p", (start.0 * 50, start.1), ops,
        ))?;
    }
}

/// Both properties on a real redis-server: one server for every case, a policy name of its
/// own per case.
#[cfg(feature = "redis")]
#[test]
fn over_any_span_the_largest_quota_in_force_bounds_what_redis_admits() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let case = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    runner
        .run(&(1u64..9, ops()), |(limit, ops)| {
            case.set(case.get() + 1);
            let name = format!("log{}", case.get());
            rt.block_on(async {
                let outcome = a_log_admits_at_most_the_largest_limit_in_force_over_any_span(
                    &redis, &name, limit, ops,
                );
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    runner
        .run(&((1u64..6, 1u64..7), ops()), |(start, ops)| {
            case.set(case.get() + 1);
            let name = format!("gcra{}", case.get());
            rt.block_on(async {
                let outcome =
                    a_gcra_key_is_never_further_ahead_than_the_burst_period_that_admitted_it(
                        &redis,
                        &name,
                        (start.0 * 50, start.1),
                        ops,
                    );
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
}
