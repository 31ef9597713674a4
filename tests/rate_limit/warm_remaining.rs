//! What a warm-up quota says remains (`r` of its `RateLimit` field) is what requests of cost 1
//! sent one after another at that instant get, over random curves (any rate, a warm zone of
//! a few requests or of thousands, cold factors 1 to 10 and the largest), random histories
//! of checks of any cost, waits that cool the key part way, and live changes of the curve,
//! the rate and the burst.
//!
//! The count is asked three ways at the same instant (a peek, a check of cost 0, the
//! figures an admission leaves), through a policy of the warm-up quota alone and one that
//! also holds a GCRA quota that never binds (the decision of several quotas in one pass).
//!
//! Pins docs/design.md section 1 ("Other kinds": warm-up) and `WarmUp`'s documented `r`.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::{Clock, Quota, RateLimiter};

/// A warm-up quota: `count` per `secs` seconds, burst `burst`, warming up over `warm_ms`
/// from 1/`cold` of the rate.
#[derive(Debug, Clone, Copy)]
struct Warm {
    count: u32,
    secs: u64,
    burst: u32,
    warm_ms: u64,
    cold: u32,
}

impl Warm {
    fn quota(self) -> Quota {
        Quota::new(self.count, Duration::from_secs(self.secs))
            .burst(self.burst)
            .warm_up(Duration::from_millis(self.warm_ms), self.cold)
    }
}

fn warm() -> impl Strategy<Value = Warm> {
    (
        1u32..=1_000,
        1u64..=60,
        1u32..=40,
        prop_oneof![1u64..=2_000, 1u64..=3_600_000],
        prop_oneof![4 => 1u32..=10, 1 => Just(u32::MAX), 1 => 1u32..=u32::MAX],
    )
        .prop_map(|(count, secs, burst, warm_ms, cold)| Warm {
            count,
            secs,
            burst,
            warm_ms,
            cold,
        })
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// The clock moves on by `ms` milliseconds.
    Wait(u64),
    /// A check of `cost`.
    Check(u32),
    /// The quota replaced: another curve, rate or burst.
    Change(Warm),
    /// The count, checked against requests sent one after another now.
    Count,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![0u64..50, 0u64..5_000, 0u64..200_000].prop_map(Op::Wait),
        4 => prop_oneof![0u32..=3, 0u32..=50].prop_map(Op::Check),
        1 => warm().prop_map(Op::Change),
        2 => Just(Op::Count),
    ]
}

/// The policy: the warm-up quota, alone or beside a GCRA quota that never binds.
fn policy(w: Warm, beside: bool) -> Vec<Quota> {
    let mut quotas = vec![w.quota()];
    if beside {
        quotas.push(Quota::new(1_000_000, Duration::from_secs(1)).burst(1_000_000));
    }
    quotas
}

fn run(first: Warm, ops: Vec<Op>, beside: bool) -> Result<(), TestCaseError> {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let limiter = RateLimiter::<u8>::builder(first.quota()).clock(clock);
    let limiter = policy(first, beside)[1..]
        .iter()
        .fold(limiter, |b, q| b.quota(q.clone()))
        .build();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Check(cost) => {
                let _ = limiter.check_n(&1, cost);
            }
            Op::Change(w) => limiter.set_quotas(policy(w, beside)).unwrap(),
            Op::Count => {
                let peeked = limiter.peek(&1).states()[0].remaining();
                let asked = limiter.check_n(&1, 0).states()[0].remaining();
                prop_assert_eq!(peeked, asked, "step {}: a peek and a check of cost 0", step);
                let mut sent = 0u64;
                let mut left = asked;
                loop {
                    let d = limiter.check(&1);
                    if !d.is_allowed() {
                        prop_assert_eq!(d.states()[0].remaining(), 0, "step {}: refused", step);
                        break;
                    }
                    sent += 1;
                    prop_assert!(sent <= asked, "step {}: more than the {} told", step, asked);
                    // Each admission leaves one fewer.
                    let after = d.states()[0].remaining();
                    prop_assert_eq!(after, left - 1, "step {}: after {} sent", step, sent);
                    left = after;
                }
                prop_assert_eq!(sent, asked, "step {}: told {}, sent {}", step, asked, sent);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn a_warm_up_quota_counts_what_requests_sent_one_after_another_get(
        first in warm(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(first, ops, false)?;
    }

    #[test]
    fn a_warm_up_quota_beside_another_counts_what_requests_sent_one_after_another_get(
        first in warm(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        run(first, ops, true)?;
    }
}
