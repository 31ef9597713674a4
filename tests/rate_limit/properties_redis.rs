//! The Redis store against the reference model on random inputs (the body `properties.rs`
//! runs on memory too, here with quotas and requests the scripts' microseconds decide
//! exactly), and a Redis clock that steps backwards.
//!
//! Pins docs/design.md section 1 ("GCRA decision", "Other kinds") and section 3 ("Redis").
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use super::properties::agrees_with_the_reference_model;
use common::redis_server::RedisServer;
use common::stores::{OnRedis, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Quota};

/// Quotas whose emission interval is a whole number of milliseconds, so that the script's
/// microsecond arithmetic and the model's nanoseconds agree exactly.
fn quota() -> impl Strategy<Value = Quota> {
    (1u32..10, 1u64..300, 1u32..10).prop_map(|(count, ms_per_request, burst)| {
        Quota::new(
            count,
            Duration::from_millis(u64::from(count) * ms_per_request),
        )
        .burst(burst)
    })
}

/// (gap before the request in µs, key, cost, evict idle keys first: nothing on Redis)
fn requests() -> impl Strategy<Value = Vec<(u64, u8, u32, bool)>> {
    prop::collection::vec(
        (0u64..300_000, 0u8..3, 0u32..6, prop::bool::weighted(0.05)),
        1..60,
    )
}

#[test]
fn redis_store_agrees_with_the_reference_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(
            &(prop::collection::vec(quota(), 1..=4), requests()),
            |(quotas, reqs)| {
                case_no.set(case_no.get() + 1);
                rt.block_on(agrees_with_the_reference_model(
                    &redis,
                    &format!("prop-{}", case_no.get()),
                    &quotas,
                    &reqs,
                ))
            },
        )
        .unwrap();
}

/// A clock that steps back (a failover to a server whose clock is behind) never grants more
/// than the configured burst, in memory or in Redis, and never panics.
#[test]
fn a_clock_stepping_backwards_grants_no_extra_burst() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(std::time::Duration::from_secs(5));
    let quota = Quota::per_second(10).burst(5);

    let (clock, time) = Clock::manual();
    let redis = RedisRateLimiter::<&str>::builder(store, quota.clone())
        .name("backwards")
        .clock(clock.clone())
        .build();
    let memory = tollgate::RateLimiter::<&str>::builder(quota)
        .clock(clock)
        .build();

    time.set(Duration::from_secs(100));
    let mut admitted = (0, 0);
    for _ in 0..10 {
        admitted.0 += usize::from(rt.block_on(redis.check(&"k")).is_allowed());
        admitted.1 += usize::from(memory.check(&"k").is_allowed());
    }
    assert_eq!(admitted, (5, 5));
    // The clock jumps 30 s back: nothing more until it has caught up.
    time.set(Duration::from_secs(70));
    for _ in 0..10 {
        let d = rt.block_on(redis.check(&"k"));
        assert!(!d.is_allowed() && !d.is_degraded());
        assert!(!memory.check(&"k").is_allowed());
    }
    // Back where it was plus one interval: exactly one more.
    time.set(Duration::from_millis(100_100));
    let again: Vec<bool> = (0..3)
        .map(|_| rt.block_on(redis.check(&"k")).is_allowed())
        .collect();
    assert_eq!(again, [true, false, false]);
    let again: Vec<bool> = (0..3).map(|_| memory.check(&"k").is_allowed()).collect();
    assert_eq!(again, [true, false, false]);
}
