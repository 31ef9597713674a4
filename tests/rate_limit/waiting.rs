//! `until_ready` under many waiters: one line per key, first come first served, one wake per
//! admission, and no cost that waits forever behind smaller ones. On a paused tokio clock, so
//! every time below is exact.
//!
//! Pins docs/design.md section 1 ("GCRA decision": `retry_after`) and section 5 (waiting for
//! admission).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::{Clock, Quota, RateLimiter};

/// Counts the polls of the future it wraps.
struct Polls<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicU64>,
}

impl<F: Future> Future for Polls<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

fn counted<F: Future>(f: F, polls: &Arc<AtomicU64>) -> Polls<F> {
    Polls {
        inner: Box::pin(f),
        polls: polls.clone(),
    }
}

fn limiter(quota: Quota) -> RateLimiter<&'static str> {
    RateLimiter::<&str>::builder(quota)
        .clock(Clock::tokio())
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_thousand_waiters_are_admitted_at_the_full_rate_in_order_with_one_wake_each() {
    let limiter = limiter(Quota::per_second(100).burst(1));
    let start = Instant::now();
    let polls = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let (l, admitted) = (limiter.clone(), admitted.clone());
        let wait = counted(async move { l.until_ready(&"k").await }, &polls);
        tasks.push(tokio::spawn(async move {
            assert!(wait.await.is_allowed());
            let ms = start.elapsed().as_millis();
            admitted.lock().unwrap().push((ms, i));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let admitted = admitted.lock().unwrap().clone();
    // First come, first served: one admission every 10 ms from 0, in the order of arrival.
    let expected: Vec<(u128, u32)> = (0..1000).map(|i| (10 * u128::from(i), i)).collect();
    assert_eq!(admitted, expected);
    // Exactly 100 in each simulated second.
    for s in 0..10 {
        let n = admitted.iter().filter(|(ms, _)| ms / 1000 == s).count();
        assert_eq!(n, 100, "second {s}");
    }
    // Each waiter is polled when it arrives, when its turn comes (it decides, is told to wait
    // 10 ms) and when that sleep ends; the first is admitted at once and the second is at the
    // head on arrival. Nothing wakes the others: 3 polls per admission, whatever the line.
    assert_eq!(polls.load(Ordering::Relaxed), 1 + 2 + 998 * 3);
}

#[tokio::test(start_paused = true)]
async fn a_large_cost_at_the_head_is_served_before_the_small_ones_behind_it() {
    // 100/s, burst 10; 50 tasks loop on cost 1, then one task asks for 5.
    let limiter = limiter(Quota::per_second(100).burst(10));
    let start = Instant::now();
    let small = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::new();
    for _ in 0..50 {
        let (l, small) = (limiter.clone(), small.clone());
        loops.push(tokio::spawn(async move {
            loop {
                let _ = l.until_ready(&"k").await;
                small.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let l = limiter.clone();
    let small_before = small.clone();
    let large = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1005)).await;
        let joined = start.elapsed();
        let wait = tokio::time::timeout(Duration::from_secs(60), l.until_ready_n(&"k", 5)).await;
        let d = wait
            .expect("admitted within a minute")
            .expect("5 fits the burst");
        assert!(d.is_allowed());
        (
            joined,
            start.elapsed(),
            small_before.load(Ordering::Relaxed),
        )
    });
    let (joined, admitted_at, small_before) = large.await.unwrap();
    for l in loops {
        l.abort();
    }
    // The burst of 10 at 0, then one every 10 ms: 110 by 1.000 s, when the 50 looping tasks
    // all stand in line (each joins again at the back as soon as it is admitted). The cost of
    // 5 joins behind them at 1.005 s; they are admitted at 1.010 .. 1.500 s, leaving the key
    // 100 ms ahead, and 5 units fit 50 ms later. So at most (50 + 5) × 10 ms after it joins.
    assert_eq!(joined, Duration::from_millis(1005));
    assert_eq!(admitted_at, Duration::from_millis(1550));
    assert_eq!(small_before, 160);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_consumes_nothing_and_the_next_one_moves_up() {
    let limiter = limiter(Quota::per_second(10).burst(1));
    assert!(limiter.check(&"k").is_allowed());
    let start = Instant::now();
    // First in line, then dropped while it sleeps at the head.
    let first = tokio::spawn({
        let l = limiter.clone();
        async move { l.until_ready(&"k").await }
    });
    let second = tokio::spawn({
        let l = limiter.clone();
        async move {
            let _ = l.until_ready(&"k").await;
            start.elapsed()
        }
    });
    // Both have joined; the first sleeps at the head until 100 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The second moves up and takes the unit the first would have had, at 100 ms.
    assert_eq!(second.await.unwrap(), Duration::from_millis(100));
    // Nothing else was consumed: the next unit is free at 200 ms.
    assert!(!limiter.check(&"k").is_allowed());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(limiter.check(&"k").is_allowed());
}

#[tokio::test(start_paused = true)]
async fn keys_wait_in_separate_lines() {
    let limiter = limiter(Quota::per_second(10).burst(1));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for key in ["a", "b", "a", "b"] {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let _ = l.until_ready(&key).await;
            start.elapsed().as_millis()
        }));
    }
    let mut at = Vec::new();
    for t in tasks {
        at.push(t.await.unwrap());
    }
    assert_eq!(at, [0, 0, 100, 100]);
}
