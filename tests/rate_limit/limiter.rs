//! The non-HTTP limiter: waiting, threads, eviction and the key bound.
//!
//! Pins docs/design.md section 1 ("GCRA decision") and section 3 ("Keyed state").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::store::OnFull;
use tollgate::{Clock, InsufficientCapacity, Quota, RateLimiter};

#[tokio::test(start_paused = true)]
async fn until_ready_waits_exactly_one_interval_per_request_after_the_burst() {
    let limiter = RateLimiter::<()>::builder(Quota::per_second(10).burst(2))
        .clock(Clock::tokio())
        .build();
    let start = tokio::time::Instant::now();
    let mut at = Vec::new();
    for _ in 0..5 {
        let _ = limiter.until_ready(&()).await;
        at.push(start.elapsed().as_millis());
    }
    assert_eq!(at, [0, 0, 100, 200, 300]);
}

#[tokio::test(start_paused = true)]
async fn until_ready_n_refuses_a_cost_above_the_burst_at_once() {
    let limiter = RateLimiter::<()>::builder(Quota::per_second(10).burst(5))
        .clock(Clock::tokio())
        .build();
    let err = limiter.until_ready_n(&(), 6).await.unwrap_err();
    assert_eq!(err, InsufficientCapacity { cost: 6, burst: 5 });
    assert!(limiter.until_ready_n(&(), 5).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_until_ready_consumes_nothing() {
    let limiter = RateLimiter::<()>::builder(Quota::per_second(1).burst(1))
        .clock(Clock::tokio())
        .build();
    let _ = limiter.until_ready(&()).await;
    // Waits 1 s; give up after 500 ms.
    let r = tokio::time::timeout(Duration::from_millis(500), limiter.until_ready(&())).await;
    assert!(r.is_err());
    // At 1 s exactly one request is available: the cancelled wait took nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(limiter.check(&()).is_allowed());
    assert!(!limiter.check(&()).is_allowed());
}

/// No lost updates: threads hammering one key admit exactly the burst while time stands still.
#[test]
fn threads_on_one_key_admit_exactly_the_burst() {
    for quotas in [1, 2] {
        let (clock, _time) = Clock::manual();
        let mut b = RateLimiter::<u8>::builder(Quota::per_hour(1000).burst(1000)).clock(clock);
        if quotas == 2 {
            b = b.quota(Quota::per_day(100_000).burst(5000));
        }
        let limiter = b.build();
        let admitted = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (limiter, admitted) = (limiter.clone(), admitted.clone());
                s.spawn(move || {
                    for _ in 0..10_000 {
                        if limiter.check(&7).is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), 1000, "{quotas} quota(s)");
    }
}

/// New keys racing into the store: each admitted exactly its burst.
#[test]
fn threads_inserting_the_same_new_keys_admit_exactly_the_burst_each() {
    let (clock, _time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(Quota::per_hour(3))
        .clock(clock)
        .build();
    let admitted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            s.spawn(move || {
                for k in 0..2000 {
                    for _ in 0..2 {
                        if limiter.check(&k).is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 3 * 2000);
    assert_eq!(limiter.len(), 2000);
}

#[test]
fn idle_keys_are_evicted_without_changing_any_decision() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(Quota::per_second(1).burst(2))
        .clock(clock)
        .build();
    for k in 0..10_000 {
        assert!(limiter.check(&k).is_allowed());
    }
    assert_eq!(limiter.len(), 10_000);
    // One second later every key is idle again (one request costs one second).
    time.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 0);
    for k in 0..10_000 {
        // As if never seen: a full burst of two.
        let d = limiter.check(&k);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
    }
}

#[test]
fn growth_sweeps_idle_keys_by_itself() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(Quota::per_second(1))
        .clock(clock)
        .build();
    // Waves of distinct keys, each wave idle before the next: tracked keys stay near one wave.
    let mut peak = 0;
    for wave in 0..20u32 {
        for k in 0..5_000 {
            assert!(limiter.check(&(wave * 5_000 + k)).is_allowed());
        }
        peak = peak.max(limiter.len());
        time.advance(Duration::from_secs(2));
    }
    assert!(
        peak <= 3 * 5_000,
        "peak {peak} keys tracked for waves of 5000"
    );
}

#[test]
fn the_key_bound_holds_under_a_flood_of_active_keys() {
    for on_full in [OnFull::EvictNearestIdle, OnFull::RejectNewKeys] {
        let (clock, _time) = Clock::manual();
        let limiter = RateLimiter::<u32>::builder(Quota::per_hour(1))
            .clock(clock)
            .max_keys(1000)
            .on_full(on_full)
            .build();
        let mut admitted = 0;
        for k in 0..50_000 {
            if limiter.check(&k).is_allowed() {
                admitted += 1;
            }
        }
        // The bound is split evenly over shards, rounded up.
        assert!(
            limiter.len() <= 1000 + 256,
            "{on_full:?}: {} keys",
            limiter.len()
        );
        match on_full {
            OnFull::EvictNearestIdle => assert_eq!(admitted, 50_000),
            _ => assert!(admitted <= 1000 + 256, "{admitted}"),
        }
    }
}

#[test]
fn rejected_new_keys_at_capacity_get_a_retry_hint() {
    let (clock, _time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(Quota::per_minute(1))
        .clock(clock)
        .max_keys(1)
        .on_full(OnFull::RejectNewKeys)
        .build();
    let mut rejected = None;
    for k in 0..10_000 {
        let d = limiter.check(&k);
        if !d.is_allowed() {
            rejected = Some(d);
            break;
        }
    }
    let d = rejected.expect("a full store turns new keys away");
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(d.remaining(), 0);
}

#[test]
fn clocks_near_their_limits_saturate_instead_of_overflowing() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<()>::builder(Quota::per_day(1))
        .clock(clock)
        .build();
    assert!(limiter.check(&()).is_allowed());
    time.advance(Duration::from_nanos(u64::MAX - 10));
    // No panic, and never more than the burst.
    let admitted = (0..3).filter(|_| limiter.check(&()).is_allowed()).count();
    assert!(admitted <= 1, "{admitted}");
}
