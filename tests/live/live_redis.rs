//! Limits changed while serving, on a real `redis-server` (started by each test), where Redis
//! differs from memory (the rules both keep run over both stores in `live.rs`): every
//! instance's change from its next decision, a deny cache that never keeps an old, stricter
//! rejection, and a rate too fine for the scripts.
//!
//! Pins docs/design.md section 3 ("A live quota change", "Redis").

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, ConfigError, Quota};

const MS: Duration = Duration::from_millis(1);

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// A limiter named after its test, so that tests never share a key even on one server.
fn limiter(store: &RedisStore, quota: Quota, clock: &Clock) -> RedisRateLimiter<&'static str> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().name().hash(&mut h);
    RedisRateLimiter::<&str>::builder(store.clone(), quota)
        .name(format!("live-{:x}", h.finish()))
        .clock(clock.clone())
        .build()
}

async fn admitted(l: &RedisRateLimiter<&'static str>, key: &'static str) -> u32 {
    let mut n = 0;
    while n < 1_000 {
        let d = l.check(&key).await;
        assert!(!d.is_degraded());
        if !d.is_allowed() {
            break;
        }
        n += 1;
    }
    n
}

#[tokio::test]
async fn each_instance_decides_with_its_own_quotas_from_its_next_decision() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    // Two instances: two limiters with the same name on the same Redis.
    let a = limiter(&store, Quota::per_second(5), &clock);
    let b = limiter(&store, Quota::per_second(5), &clock);
    assert_eq!(admitted(&a, "k").await, 5);
    assert_eq!(admitted(&b, "k").await, 0);
    a.set_quotas([Quota::per_second(10).burst(20)]).unwrap();
    // `a` sees 1 s spent of 2 s: 10 more; `b`, not yet changed, sees the key ahead by more
    // than its tolerance: held to "spent".
    assert_eq!(admitted(&a, "k").await, 10);
    assert_eq!(admitted(&b, "k").await, 0);
    b.set_quotas([Quota::per_second(10).burst(20)]).unwrap();
    time.advance(100 * MS);
    assert_eq!(admitted(&b, "k").await, 1);
    assert_eq!(admitted(&a, "k").await, 0);
}

#[tokio::test]
async fn the_deny_cache_does_not_keep_rejecting_under_an_old_stricter_quota() {
    let server = RedisServer::start();
    let store = store(&server)
        .await
        .deny_cache_max_age(Duration::from_secs(60));
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let l = limiter(&store, Quota::per_second(1), &clock);
    // Admitted once, then rejected by Redis; from then on, from the cache.
    assert_eq!(admitted(&l, "k").await, 1);
    assert!(!l.check(&"k").await.is_allowed());
    assert!(!l.check(&"k").await.is_allowed());
    assert_eq!(l.local_rejections(), 2);
    // Burst 10: the key spent 1 s of 10 s, and the cached rejection (good for 1 s more) is
    // not repeated.
    l.set_quotas([Quota::per_second(1).burst(10)]).unwrap();
    assert_eq!(admitted(&l, "k").await, 9);
    // The tenth is rightly rejected from the cache, which the admissions kept up to date.
    assert_eq!(l.local_rejections(), 3);
}

#[tokio::test]
async fn a_rate_too_fine_for_the_scripts_is_refused_and_the_old_quotas_stay() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let l = limiter(&store, Quota::per_second(3), &clock);
    let too_fine = Quota::new(1_000_000_000, Duration::from_secs(1));
    assert!(matches!(
        l.set_quotas([too_fine]),
        Err(ConfigError::RateTooHighForStore { .. })
    ));
    assert_eq!(*l.quotas(), [Quota::per_second(3)][..]);
    assert_eq!(admitted(&l, "k").await, 3);
}
