//! Limits changed while serving, on a real `redis-server` (started by each test): the same
//! rules as in memory, every instance's change from its next decision, and a deny cache that
//! never keeps an old, stricter rejection.
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
async fn raising_the_rate_mid_burst_gives_no_free_burst_on_redis() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let l = limiter(&store, Quota::per_second(1), &clock);
    assert_eq!(admitted(&l, "k").await, 1);
    l.set_quotas([Quota::per_second(10)]).unwrap();
    assert_eq!(admitted(&l, "k").await, 0);
    time.advance(300 * MS);
    assert_eq!(admitted(&l, "k").await, 3);
    assert_eq!(admitted(&l, "fresh").await, 10);
}

#[tokio::test]
async fn lowering_the_tolerance_keeps_the_time_a_key_spent_on_redis_as_in_memory() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    // 10 at once put the key 1 s ahead; the new quota tolerates 200 ms.
    let l = limiter(&store, Quota::per_second(10), &clock);
    assert_eq!(admitted(&l, "k").await, 10);
    l.set_quotas([Quota::per_second(10).burst(2)]).unwrap();
    let d = l.check(&"k").await;
    assert_eq!(d.retry_after(), Some(900 * MS));
    assert_eq!(d.reset_after(), 1_000 * MS);
    // A peek agrees: the key is 800 ms beyond the new tolerance.
    assert_eq!(l.check_n(&"k", 0).await.retry_after(), Some(800 * MS));
    time.advance(899 * MS);
    assert_eq!(admitted(&l, "k").await, 0);
    time.advance(MS);
    assert_eq!(admitted(&l, "k").await, 1);
    time.advance(200 * MS);
    assert_eq!(admitted(&l, "k").await, 2);
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
async fn an_invalid_change_is_refused_and_the_old_quotas_stay_on_redis() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let l = limiter(&store, Quota::per_second(3), &clock);
    let too_fine = Quota::new(1_000_000_000, Duration::from_secs(1));
    assert!(matches!(
        l.set_quotas([too_fine]),
        Err(ConfigError::RateTooHighForStore { .. })
    ));
    assert_eq!(
        l.set_quotas([Quota::per_second(1), Quota::per_hour(1)]),
        Err(ConfigError::QuotaCountChanged { was: 1, got: 2 })
    );
    assert_eq!(*l.quotas(), [Quota::per_second(3)][..]);
    assert_eq!(admitted(&l, "k").await, 3);
}

#[tokio::test]
async fn a_window_quota_over_a_lower_count_reports_none_remaining_on_redis() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let l = limiter(
        &store,
        Quota::fixed_window(5, Duration::from_secs(60)),
        &clock,
    );
    assert_eq!(admitted(&l, "k").await, 5);
    l.set_quotas([Quota::fixed_window(3, Duration::from_secs(60))])
        .unwrap();
    let d = l.check(&"k").await;
    assert!(!d.is_degraded());
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    l.set_quotas([Quota::fixed_window(8, Duration::from_secs(60))])
        .unwrap();
    assert_eq!(admitted(&l, "k").await, 3);
    assert!(matches!(
        l.set_quotas([Quota::per_second(8)]),
        Err(ConfigError::NotChangeable(_))
    ));
}
