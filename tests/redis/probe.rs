//! `RedisStore::probe_every`: during an outage one call per interval tries Redis and the others
//! are decided by the failure policy at once; without it each decision waits the timeout. On
//! loopback, with Redis paused (nothing answers: every call that tries waits the timeout) and
//! then resumed; bounded real waits.
//!
//! Pins docs/design.md section 3 ("Redis": never a hung request).
#![cfg(feature = "redis")]

use crate::common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore, MAX_PROBE_INTERVAL};
use tollgate::{Clock, Quota};

const TIMEOUT: Duration = Duration::from_millis(200);

async fn limiter(server: &RedisServer, probe: Option<Duration>) -> RedisRateLimiter<u64> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(TIMEOUT)
        .on_failure(FailMode::local(0.5));
    let store = match probe {
        Some(every) => store.probe_every(every),
        None => store,
    };
    let (clock, _time) = Clock::manual();
    RedisRateLimiter::builder(store, Quota::per_minute(60).burst(20))
        .name("probe")
        .clock(clock)
        .build()
}

/// Decides `n` requests for one key; how many were admitted and how many waited the timeout.
async fn flood(l: &RedisRateLimiter<u64>, n: u32) -> (u32, u32) {
    let (mut admitted, mut waited) = (0, 0);
    for _ in 0..n {
        let t = Instant::now();
        let d = l.check(&1).await;
        assert!(d.is_degraded() && d.is_local(), "{d:?}");
        admitted += u32::from(d.is_allowed());
        waited += u32::from(t.elapsed() >= TIMEOUT);
    }
    (admitted, waited)
}

#[tokio::test]
async fn during_an_outage_only_the_probes_wait_the_timeout() {
    let server = RedisServer::start();
    let probing = limiter(&server, Some(Duration::from_secs(60))).await;
    let plain = limiter(&server, None).await;
    server.pause();
    // Probing: the first call finds the outage (it waits the timeout), the others are decided
    // by the local fallback at once, at half the burst.
    let started = Instant::now();
    let (admitted, waited) = flood(&probing, 30).await;
    assert_eq!(admitted, 10);
    assert_eq!(waited, 1);
    assert!(started.elapsed() < TIMEOUT * 5, "{:?}", started.elapsed());
    // Without probing, every decision waits the timeout.
    let (admitted, waited) = flood(&plain, 3).await;
    assert_eq!(admitted, 3);
    assert_eq!(waited, 3);
    server.resume();
}

#[tokio::test]
async fn a_probe_per_interval_finds_redis_back() {
    let server = RedisServer::start();
    let every = Duration::from_millis(300);
    let l = limiter(&server, Some(every)).await;
    assert!(!l.check(&1).await.is_degraded());
    server.pause();
    let (_, waited) = flood(&l, 5).await;
    assert_eq!(waited, 1);
    // One interval later, one call probes (and waits the timeout), the next ones do not.
    tokio::time::sleep(every).await;
    let (_, waited) = flood(&l, 5).await;
    assert_eq!(waited, 1);
    server.resume();
    // Redis answers the next probe, at most one interval away: then it decides again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = l.check(&1).await;
        if !d.is_degraded() {
            break;
        }
        assert!(Instant::now() < deadline, "Redis not asked again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And every decision after that is Redis's.
    for _ in 0..5 {
        assert!(!l.check(&1).await.is_degraded());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_racing_during_an_outage_send_one_probe() {
    let server = RedisServer::start();
    let l = limiter(&server, Some(Duration::from_secs(60))).await;
    assert!(!l.check(&1).await.is_degraded());
    server.pause();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let l = l.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let d = l.check(&1).await;
            (d, t.elapsed())
        });
    }
    let (mut admitted, mut waited) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (d, took) = r.unwrap();
        assert!(d.is_local(), "{d:?}");
        admitted += u32::from(d.is_allowed());
        waited += u32::from(took >= TIMEOUT);
    }
    server.resume();
    // The calls that set out before the first failure each wait the timeout (they are on
    // their way already); once it is known, none but the probe would. The fallback admits
    // half the burst of 20.
    assert_eq!(admitted, 10);
    assert!(waited >= 1, "{waited}");
    // A second wave, all after the outage is known: not one waits (the next probe is a
    // minute away).
    server.pause();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let l = l.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let _ = l.check(&2).await;
            t.elapsed()
        });
    }
    while let Some(r) = tasks.join_next().await {
        let took = r.unwrap();
        assert!(took < TIMEOUT, "{took:?}");
    }
    server.resume();
}

#[tokio::test]
async fn the_smallest_and_largest_intervals_are_usable() {
    let server = RedisServer::start();
    // Zero: every call probes, as without the setting.
    let zero = limiter(&server, Some(Duration::ZERO)).await;
    // The largest: capped at a minute, no overflow of the clock.
    let largest = limiter(&server, Some(Duration::MAX)).await;
    assert!(format!("{:?}", largest.store()).contains(&format!("{MAX_PROBE_INTERVAL:?}")));
    server.pause();
    let (_, waited) = flood(&zero, 3).await;
    assert_eq!(waited, 3);
    let (_, waited) = flood(&largest, 3).await;
    assert_eq!(waited, 1);
    server.resume();
}

#[tokio::test]
async fn the_store_settings_give_the_same_store_in_every_order() {
    use tollgate::redis::Lease;
    let server = RedisServer::start();
    let base = RedisStore::connect(&server.url()).await.unwrap();
    type Setting = fn(RedisStore) -> RedisStore;
    let settings: [Setting; 4] = [
        |s| s.timeout(TIMEOUT),
        |s| s.on_failure(FailMode::local(0.5)),
        |s| s.probe_every(Duration::from_millis(300)),
        |s| s.lease(Lease::new(8, Duration::from_millis(100))),
    ];
    let apply = |order: &[usize]| {
        let store = order.iter().fold(base.clone(), |s, &i| settings[i](s));
        format!("{store:?}")
    };
    let want = apply(&[0, 1, 2, 3]);
    for s in ["200ms", "Local", "300ms", "max_batch: 8"] {
        assert!(want.contains(s), "{s} missing from {want}");
    }
    // All 24 orders.
    let mut orders = Vec::new();
    for a in 0..4 {
        for b in 0..4 {
            for c in 0..4 {
                for d in 0..4 {
                    let order = [a, b, c, d];
                    if (0..4).all(|i| order.contains(&i)) {
                        orders.push(order);
                    }
                }
            }
        }
    }
    assert_eq!(orders.len(), 24);
    for order in &orders {
        assert_eq!(apply(order), want, "order {order:?}");
    }
    // A setting given twice: the last one stands, wherever the others come.
    let twice = base
        .clone()
        .probe_every(Duration::from_secs(5))
        .timeout(TIMEOUT)
        .lease(Lease::new(2, Duration::from_secs(1)))
        .on_failure(FailMode::local(0.5))
        .probe_every(Duration::from_millis(300))
        .lease(Lease::new(8, Duration::from_millis(100)));
    assert_eq!(format!("{twice:?}"), want);
}
