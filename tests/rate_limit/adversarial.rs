//! Hostile uses of the public API: the retry hint of a full store, races between threads on
//! one key, and the quiet after a flood.
//!
//! Pins docs/design.md section 1 and section 3 ("Keyed state").

use std::sync::Arc;
use std::time::Duration;

use tollgate::store::OnFull;
use tollgate::{Clock, ManualClock, Quota, RateLimiter};

fn limiter(quota: Quota, max_keys: usize, on_full: OnFull) -> (RateLimiter<u64>, ManualClock) {
    let (clock, hand) = Clock::manual();
    let l = RateLimiter::<u64>::builder(quota)
        .clock(clock)
        .max_keys(max_keys)
        .on_full(on_full)
        .build();
    (l, hand)
}

#[test]
fn reject_new_keys_retry_hint_follows_a_tracked_key_that_spent_more() {
    // 2 per minute, burst 2: one request makes the key idle 30 s later, two make it 60 s.
    let (l, hand) = limiter(Quota::per_minute(2), 1, OnFull::RejectNewKeys);
    assert!(l.check(&1).is_allowed());
    assert!(l.check(&1).is_allowed());
    // Key 1 is idle at 60 s, not before: a new key must wait that long.
    hand.advance(Duration::from_secs(10));
    let d = l.check(&2);
    assert!(!d.is_allowed());
    let wait = d.retry_after().unwrap();
    hand.advance(wait);
    assert!(
        l.check(&2).is_allowed(),
        "retry hint {wait:?} came before the tracked key went idle"
    );
}

#[test]
fn two_threads_on_one_key_never_admit_beyond_the_burst() {
    for _ in 0..50 {
        let (l, hand) = limiter(Quota::per_minute(10), 4, OnFull::RejectNewKeys);
        let l = Arc::new(l);
        hand.advance(Duration::from_secs(1));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || (0..20).filter(|_| l.check(&7).is_allowed()).count())
            })
            .collect();
        let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(admitted, 10);
        assert_eq!(l.len(), 1);
    }
}

#[test]
fn threads_flooding_distinct_keys_never_exceed_max_keys() {
    for on_full in [OnFull::RejectNewKeys, OnFull::EvictNearestIdle] {
        let (l, hand) = limiter(Quota::per_minute(1), 64, on_full);
        let l = Arc::new(l);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut most = 0;
                    for k in 0..2_000u64 {
                        let _ = l.check(&(t * 1_000_000 + k));
                        most = most.max(l.len());
                    }
                    most
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap() <= 64);
        }
        assert_eq!(l.len(), 64);
        // The quiet after: everything is idle a minute later and goes at the next sweep.
        hand.advance(Duration::from_secs(60));
        assert_eq!(l.evict_idle(), 0);
        assert!(l.check(&u64::MAX).is_allowed());
        assert_eq!(l.len(), 1);
    }
}

#[test]
fn numeric_edges_of_a_quota_decide_without_panicking() {
    let quotas = [
        Quota::try_new(u32::MAX, Duration::from_secs(u64::MAX)),
        Quota::try_new(1, Duration::MAX),
        Quota::try_new(1_000_000_000, Duration::from_secs(1)),
        Quota::try_new(u32::MAX, Duration::from_secs(5)),
        Quota::try_new(1, Duration::from_nanos(1)),
    ];
    let mut built = 0;
    for q in quotas.into_iter().flatten() {
        for burst in [1, 2, u32::MAX] {
            let Ok(q) = q.clone().try_burst(burst) else {
                continue;
            };
            for max_keys in [1, usize::MAX] {
                let (l, hand) = limiter(q.clone(), max_keys, OnFull::RejectNewKeys);
                let _ = l.check_n(&1, u32::MAX);
                let _ = l.check_n(&1, 0);
                let _ = l.check(&1);
                let d = l.check(&2);
                let _ = d.retry_after();
                hand.advance(Duration::from_secs(u64::MAX / 4));
                let _ = l.check(&1);
                let _ = l.peek(&3);
                let _ = l.evict_idle();
                built += 1;
            }
        }
    }
    assert!(built >= 12, "{built}");
}

#[tokio::test(start_paused = true)]
async fn a_new_key_waiting_on_a_full_store_is_admitted_when_room_is_made_in_order() {
    let l = Arc::new(
        RateLimiter::<u64>::builder(Quota::per_minute(2))
            .clock(Clock::tokio())
            .max_keys(1)
            .on_full(OnFull::RejectNewKeys)
            .build(),
    );
    assert!(l.check(&1).is_allowed());
    assert!(l.check(&1).is_allowed());
    let start = tokio::time::Instant::now();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3u64 {
        let (l, order) = (l.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let _ = l.until_ready(&2).await;
            order.lock().unwrap().push((i, start.elapsed()));
        }));
        tokio::task::yield_now().await;
    }
    // The middle waiter gives up; the others keep their order.
    tasks[1].abort();
    for t in tasks {
        let _ = t.await;
    }
    let order = order.lock().unwrap().clone();
    // Key 1 is idle at 60 s; key 2 then admits one request each 30 s.
    assert_eq!(
        order,
        [(0, Duration::from_secs(60)), (2, Duration::from_secs(60))]
    );
}
