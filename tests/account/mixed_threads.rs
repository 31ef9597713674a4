//! Three threads on one key of the memory limiter, under policies of two to four quotas of
//! any kinds in any order (GCRA, GCRA with warm-up of cold factor 1, a fixed window, a
//! sliding log, a sliding counter; a kind may come twice), requests of costs 0 to 4 on a
//! clock that stands, so that what each quota holds is what the admitted requests took,
//! whatever their order. A quota that refuses puts back what the quotas before it wrote, so:
//! * the units admitted never pass the smallest limit of the policy;
//! * afterwards every quota has exactly its limit less those units left.
//!
//! Pins docs/design.md section 1 ("Several quotas on one key": all or nothing, one atomic
//! step in memory).

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Clock, Quota, RateLimiter};

/// One quota: kind (0 to 4) and limit; windows of a minute, GCRA of 100 ms per unit.
fn quota(kind: u8, limit: u32) -> Quota {
    let minute = Duration::from_secs(60);
    let gcra = Quota::new(1, Duration::from_millis(100)).burst(limit);
    match kind {
        0 => gcra,
        1 => gcra.warm_up(Duration::from_secs(2), 1),
        2 => Quota::fixed_window(limit, minute),
        3 => Quota::sliding_log(limit, minute),
        _ => Quota::sliding_window(limit, minute),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn threads_on_one_key_take_at_most_the_smallest_limit_and_each_quota_holds_what_they_took(
        policy in prop::collection::vec((0u8..5, 1u32..40), 2..=4),
        costs in prop::collection::vec(prop::collection::vec(0u32..5, 1..40), 3),
    ) {
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(1_000));
        let b = RateLimiter::<u8>::builder(quota(policy[0].0, policy[0].1)).clock(clock);
        let l = policy[1..].iter().fold(b, |b, &(k, n)| b.quota(quota(k, n))).build();
        let start = std::sync::Arc::new(std::sync::Barrier::new(costs.len()));
        let threads: Vec<_> = costs
            .into_iter()
            .map(|costs| {
                let (l, start) = (l.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    costs
                        .into_iter()
                        .filter(|&c| l.check_n(&1, c).is_allowed())
                        .map(u64::from)
                        .sum::<u64>()
                })
            })
            .collect();
        let held: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let smallest = policy.iter().map(|p| u64::from(p.1)).min().unwrap_or(0);
        prop_assert!(held <= smallest, "{} units admitted, smallest limit {}", held, smallest);
        let left: Vec<u64> = l.peek(&1).states().iter().map(|s| s.remaining()).collect();
        let want: Vec<u64> = policy.iter().map(|p| u64::from(p.1) - held).collect();
        prop_assert_eq!(left, want);
    }
}
