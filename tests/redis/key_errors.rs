//! Errors about one key are not outages: a key of the wrong type (or a script error on one
//! key) never trips the store's outage state, is refused as unavailable for that request
//! whatever the failure mode, and is logged once per policy with the key's Redis name.
//! Against a real `redis-server` started by each test.
//!
//! Pins docs/design.md section 3 ("Redis": an error about one key is not an outage).

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{FailMode, Lease, RedisRateLimiter, RedisStore};
use tollgate::{Clock, Quota};

/// The tests of this file hit the same logging callsite: one at a time, so that the one that
/// captures the log sees its interest settled.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn store(server: &RedisServer, mode: FailMode) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .on_failure(mode)
        .probe_every(Duration::from_secs(5))
}

fn limiter(store: RedisStore, quota: Quota, clock: &Clock) -> RedisRateLimiter<u64> {
    RedisRateLimiter::<u64>::builder(store, quota)
        .name("api")
        .clock(clock.clone())
        .build()
}

/// Makes `key`'s Redis key a hash, as another program (or a limiter of another kind) would.
fn poison(server: &RedisServer, limiter: &RedisRateLimiter<u64>, key: u64) -> String {
    let name = String::from_utf8(limiter.redis_key(&key)).unwrap();
    server.cli(&["HSET", &name, "f", "v"]).unwrap();
    name
}

#[tokio::test]
async fn a_key_of_the_wrong_type_refuses_that_key_only_and_never_trips_the_outage_state() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let l = limiter(
        store(&server, FailMode::Closed).await,
        Quota::per_second(10),
        &clock,
    );
    poison(&server, &l, 1);
    let d = l.check(&1).await;
    assert!(!d.is_allowed() && d.is_degraded());
    // With probe_every(5 s), an outage would answer the next requests at once, refused: an
    // unrelated key is decided by Redis, all five admitted.
    for _ in 0..5 {
        let d = l.check(&2).await;
        assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
    }
    assert_eq!(l.check(&2).await.remaining(), 4);
}

#[tokio::test]
async fn a_key_error_is_refused_even_when_the_store_fails_open() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    for mode in [FailMode::Open, FailMode::local(0.5)] {
        let l = limiter(store(&server, mode).await, Quota::per_second(10), &clock);
        poison(&server, &l, 7);
        for _ in 0..30 {
            let d = l.check(&7).await;
            assert!(!d.is_allowed() && d.is_degraded(), "{mode:?}: {d:?}");
            assert!(!d.is_local(), "{mode:?}");
        }
    }
}

#[tokio::test]
async fn a_key_error_is_logged_once_per_policy_at_error_with_the_key_name() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    // Whatever other tests' threads log meanwhile.
    let (captured, _guard) = common::capture::capture(tracing::Level::INFO);
    let (clock, _time) = Clock::manual();
    let l = limiter(
        store(&server, FailMode::Open).await,
        Quota::per_second(10),
        &clock,
    );
    let name = poison(&server, &l, 3);
    for _ in 0..10 {
        let _ = l.check(&3).await;
    }
    let text = captured.text();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].contains(&name), "{text}");
    assert!(errors[0].contains("another type"), "{text}");
    assert!(!text.contains("Redis unavailable"), "{text}");
}

#[tokio::test]
async fn a_key_error_on_a_leased_key_refuses_its_requests_and_leaves_the_other_keys_leased() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let store = store(&server, FailMode::Open)
        .await
        .lease(Lease::new(8, Duration::from_secs(1)));
    let l = limiter(store, Quota::per_second(100), &clock);
    // Key 1 is hot: a batch is on its way when its Redis key goes bad.
    for _ in 0..4 {
        assert!(l.check(&1).await.is_allowed());
    }
    let served = l.leased();
    assert!(served > 0);
    // Units already held are used up; then every request on the key is refused.
    let name = String::from_utf8(l.redis_key(&1)).unwrap();
    server.cli(&["DEL", &name]).unwrap();
    server.cli(&["HSET", &name, "f", "v"]).unwrap();
    let mut refused = 0;
    for _ in 0..20 {
        let d = l.check(&1).await;
        if !d.is_allowed() {
            assert!(d.is_degraded());
            refused += 1;
        }
    }
    assert!(refused >= 20 - 8, "{refused}");
    // Another key still takes its batches from Redis.
    for _ in 0..10 {
        let d = l.check(&2).await;
        assert!(d.is_allowed() && !d.is_degraded());
    }
    assert!(l.leased() > served);
}

#[tokio::test]
async fn a_key_error_under_a_penalty_box_is_refused_and_is_no_outage() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let l = RedisRateLimiter::<u64>::builder(
        store(&server, FailMode::Open).await,
        Quota::per_second(10),
    )
    .name("banned")
    .penalty_box(PenaltyBox::new(
        3,
        Duration::from_secs(60),
        Duration::from_secs(60),
    ))
    .clock(clock)
    .build();
    poison(&server, &l, 1);
    let d = l.check(&1).await;
    assert!(!d.is_allowed() && d.is_degraded());
    let d = l.check(&2).await;
    assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
}

#[tokio::test]
async fn redis_out_of_memory_refuses_the_write_and_is_no_outage() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let l = limiter(
        store(&server, FailMode::Open).await,
        Quota::per_second(10),
        &clock,
    );
    assert!(l.check(&1).await.is_allowed());
    // Redis is full: it refuses every write with OOM.
    server
        .cli(&["SET", "ballast", &"x".repeat(100_000)])
        .unwrap();
    server
        .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let d = l.check(&2).await;
    assert!(!d.is_allowed() && d.is_degraded(), "{d:?}");
    // Memory again: with probe_every(5 s), an outage would keep refusing; Redis decides at once.
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    let d = l.check(&2).await;
    assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
}
