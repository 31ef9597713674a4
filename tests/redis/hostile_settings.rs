#![cfg(feature = "redis")]
//! Duration settings of the Redis store at their edges, against a real `redis-server`.
//!
//! Pins docs/design.md section 3 ("Redis": a short timeout).

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::key::Either;
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore};
use tollgate::Quota;

/// A timeout of `Duration::MAX` waits for the answer; `ZERO` gives up at the timer's next tick
/// (an answer may or may not beat it on loopback) and lets the failure policy decide. Neither
/// panics, and either way a fresh key under fail-open is admitted.
#[tokio::test]
async fn redis_timeout_at_max_decides_and_at_zero_falls_to_the_failure_policy() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let patient: RedisRateLimiter<&str> = RedisRateLimiter::<&str>::builder(
        store.clone().timeout(Duration::MAX),
        Quota::per_second(1),
    )
    .name("max".to_owned())
    .build();
    let d = patient.check(&"k").await;
    assert!(d.is_allowed() && !d.is_degraded());
    let d = patient.check(&"k").await;
    assert!(!d.is_allowed() && !d.is_degraded());

    let hasty: RedisRateLimiter<&str> = RedisRateLimiter::<&str>::builder(
        store.timeout(Duration::ZERO).on_failure(FailMode::Open),
        Quota::per_second(1),
    )
    .name("zero".to_owned())
    .build();
    let d = hasty.check(&"k").await;
    assert!(d.is_allowed());
}

/// Keys of the two sides of `or` are different Redis keys, even with equal values.
#[tokio::test]
async fn either_sides_are_different_redis_keys() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let limiter: RedisRateLimiter<Either<String, String>> =
        RedisRateLimiter::<Either<String, String>>::builder(store, Quota::per_hour(1))
            .name("or".to_owned())
            .build();
    let first = Either::First("198.51.100.7".to_owned());
    let second = Either::Second("198.51.100.7".to_owned());
    assert!(limiter.check(&first).await.is_allowed());
    assert!(!limiter.check(&first).await.is_allowed());
    assert!(limiter.check(&second).await.is_allowed());
}
