//! docs/design.md section 1, case by case, on the in-memory `RateLimiter` with a manual clock.

use crate::common;

use std::time::Duration;

use common::spec;
use tollgate::{Clock, RateLimiter};

#[test]
fn memory_store_follows_the_table_of_cases() {
    let mut failures = Vec::new();
    for case in spec::cases() {
        let (clock, time) = Clock::manual();
        let mut builder = RateLimiter::<&str>::builder(case.quotas[0].clone()).clock(clock);
        for q in &case.quotas[1..] {
            builder = builder.quota(q.clone());
        }
        let limiter = builder.build();
        let start = time.now();
        for (i, step) in case.steps.iter().enumerate() {
            let target = start + Duration::from_millis(step.at_ms);
            time.advance(target - time.now());
            let d = limiter.check_n(&step.key, step.cost);
            if let Err(e) = spec::check(&case, i, &d) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rejected_requests_never_create_an_entry() {
    let (clock, _time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(tollgate::Quota::per_second(1).burst(2))
        .clock(clock)
        .build();
    for k in 0..100 {
        // A cost above the burst and a peek: neither stores anything.
        assert!(!limiter.check_n(&k, 3).is_allowed());
        assert!(limiter.peek(&k).is_allowed());
    }
    assert_eq!(limiter.len(), 0);
}
