//! Stream adapters over a limit shared through Redis: consumers in separate processes (here,
//! limiters on separate connections) draw from one limit, item costs are paid in parts of the
//! burst, and an outage holds items back instead of dropping them.
//!
//! Pins docs/design.md section 1 ("GCRA decision") and section 3 ("Redis").
#![cfg(all(feature = "stream", feature = "redis"))]

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use futures_util::StreamExt;
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore};
use tollgate::stream::LimitStreamExt;
use tollgate::{Clock, ManualClock, Quota};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// Advances `time` by `step` every few milliseconds until `done` reaches `total`, checking
/// before each step that no more than `bound(now)` units were yielded; a bounded loop.
///
/// The adapters wait out a decision's `retry_after` on tokio's clock, so each step is at
/// least the time that really passed since the last one: on a loaded machine, where the
/// loop's own sleep overruns, the manual clock never falls behind what the adapters waited.
async fn drive(
    time: &ManualClock,
    step: Duration,
    done: &AtomicU64,
    total: u64,
    bound: impl Fn(Duration) -> u64,
) {
    let mut now = Duration::ZERO;
    let mut last = tokio::time::Instant::now();
    for _ in 0..20_000 {
        let seen = done.load(Ordering::SeqCst);
        assert!(
            seen <= bound(now),
            "{seen} units yielded by {now:?}, at most {} allowed",
            bound(now)
        );
        if seen == total {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let step = step.max(last.elapsed());
        last = tokio::time::Instant::now();
        time.advance(step);
        now += step;
    }
    panic!(
        "only {} of {total} units yielded",
        done.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn consumers_on_separate_connections_share_one_limit_and_keep_their_order() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    // 100 per second, bursts of 10: one unit per 10 ms of the manual clock.
    let quota = Quota::per_second(100).burst(10);
    let done = Arc::new(AtomicU64::new(0));
    let mut consumers = Vec::new();
    for c in 0..3u32 {
        let limiter = RedisRateLimiter::<String>::builder(store(&server).await, quota.clone())
            .name("consumers")
            .clock(clock.clone())
            .build();
        let done = done.clone();
        consumers.push(tokio::spawn(async move {
            let messages = futures_util::stream::iter((0..40u32).map(move |i| (c, i)));
            let mut got = Vec::new();
            let mut limited = messages.rate_limit_redis(limiter, |_| "queue".to_owned());
            while let Some((_, i)) = limited.next().await {
                got.push(i);
                done.fetch_add(1, Ordering::SeqCst);
            }
            got
        }));
    }
    drive(&time, Duration::from_millis(5), &done, 120, |now| {
        10 + u64::try_from(now.as_millis() / 10).unwrap()
    })
    .await;
    for c in consumers {
        assert_eq!(c.await.unwrap(), (0..40).collect::<Vec<_>>());
    }
}

#[tokio::test]
async fn an_item_above_the_burst_is_paid_in_parts_and_waits_for_all_of_them() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let limiter =
        RedisRateLimiter::<&str>::builder(store(&server).await, Quota::per_second(100).burst(10))
            .name("parts")
            .clock(clock)
            .build();
    let done = Arc::new(AtomicU64::new(0));
    let counted = done.clone();
    let task = tokio::spawn(async move {
        // Costs 25, 0, 7, 25: 57 units.
        let items = futures_util::stream::iter([25u32, 0, 7, 25]);
        let mut limited = items
            .rate_limit_redis(limiter, |_| "k")
            .cost(|cost: &u32| *cost);
        let mut got = Vec::new();
        while let Some(cost) = limited.next().await {
            got.push(cost);
            counted.fetch_add(u64::from(cost), Ordering::SeqCst);
        }
        got
    });
    drive(&time, Duration::from_millis(5), &done, 57, |now| {
        10 + u64::try_from(now.as_millis() / 10).unwrap()
    })
    .await;
    assert_eq!(task.await.unwrap(), [25, 0, 7, 25]);
}

#[tokio::test]
async fn an_outage_under_fail_closed_holds_items_back_and_loses_none() {
    let mut server = RedisServer::start();
    let store = store(&server)
        .await
        .timeout(Duration::from_millis(200))
        .on_failure(FailMode::Closed);
    let limiter = RedisRateLimiter::<&str>::builder(store, Quota::per_second(1_000).burst(100))
        .name("outage")
        .build();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let items =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) });
    let mut limited = Box::pin(items.rate_limit_redis(limiter, |_| "k"));
    tx.send(0).unwrap();
    assert_eq!(limited.next().await, Some(0));
    server.kill();
    tx.send(1).unwrap();
    // Redis is down: the item waits (fail closed asks again after a second) ...
    let held = tokio::time::timeout(Duration::from_millis(1_500), limited.next()).await;
    assert!(
        held.is_err(),
        "an item passed while Redis was down: {held:?}"
    );
    // ... and passes, not lost, once Redis is back.
    server.restart();
    tx.send(2).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(20), limited.next()).await;
    assert_eq!(next.unwrap(), Some(1));
    let next = tokio::time::timeout(Duration::from_secs(20), limited.next()).await;
    assert_eq!(next.unwrap(), Some(2));
}
