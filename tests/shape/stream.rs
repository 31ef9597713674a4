//! The stream adapters on a paused tokio clock: every item waits exactly for its slot.
//!
//! Pins docs/design.md section 1 ("GCRA decision", "Shaping").
#![cfg(feature = "stream")]

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::time::Instant;
use tollgate::stream::LimitStreamExt;
use tollgate::Shaper;
use tollgate::{Clock, Quota, RateLimiter};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync>(q: Quota) -> RateLimiter<K> {
    RateLimiter::<K>::builder(q).clock(Clock::tokio()).build()
}

/// When each item came out, relative to the start.
async fn times<S: futures_util::Stream + Unpin>(mut s: S) -> Vec<(S::Item, Duration)> {
    let start = Instant::now();
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        out.push((item, start.elapsed()));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn burst_passes_at_once_then_one_item_per_interval() {
    let l = limiter::<()>(Quota::per_second(2));
    let out = times(stream::iter(1..=5).rate_limit(l, |_| ())).await;
    assert_eq!(
        out,
        vec![
            (1, ms(0)),
            (2, ms(0)),
            (3, ms(500)),
            (4, ms(1000)),
            (5, ms(1500))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn keys_are_limited_on_their_own_and_order_is_kept() {
    let l = limiter::<char>(Quota::per_second(1).burst(1));
    let items = ['a', 'a', 'a', 'b', 'b'];
    let out = times(stream::iter(items).rate_limit(l, |c| *c)).await;
    // b's bucket is full when its first item's turn comes (behind a's third at 2 s).
    assert_eq!(
        out,
        vec![
            ('a', ms(0)),
            ('a', ms(1000)),
            ('a', ms(2000)),
            ('b', ms(2000)),
            ('b', ms(3000))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn an_item_waits_until_its_whole_cost_is_admitted() {
    let l = limiter::<()>(Quota::per_second(1).burst(5));
    let out = times(
        stream::iter([3u32, 3, 1])
            .rate_limit(l, |_| ())
            .cost(|c| *c),
    )
    .await;
    // 5 at t=0: 3 pass, 2 left; the second needs one more unit (1 s); the third one more.
    assert_eq!(out, vec![(3, ms(0)), (3, ms(1000)), (1, ms(2000))]);
}

#[tokio::test(start_paused = true)]
async fn cost_above_the_burst_is_paid_in_parts_and_keeps_the_rate() {
    let l = limiter::<()>(Quota::per_second(1).burst(2));
    let out = times(
        stream::iter([5u32, 1])
            .rate_limit(l.clone(), |_| ())
            .cost(|c| *c),
    )
    .await;
    // 2 at 0 s, 2 at 2 s, 1 at 3 s: five units take as long as five single items would.
    assert_eq!(out, vec![(5, ms(3000)), (1, ms(4000))]);
}

#[tokio::test(start_paused = true)]
async fn zero_cost_items_pass_at_once_and_consume_nothing() {
    let l = limiter::<()>(Quota::per_second(1).burst(1));
    let out = times(
        stream::iter([0u32, 0, 0, 1, 0])
            .rate_limit(l.clone(), |_| ())
            .cost(|c| *c),
    )
    .await;
    assert_eq!(
        out,
        vec![(0, ms(0)), (0, ms(0)), (0, ms(0)), (1, ms(0)), (0, ms(0))]
    );
    assert_eq!(l.peek(&()).remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_flood_is_spread_over_time_and_the_quiet_after_refills_the_burst() {
    let l = limiter::<()>(Quota::per_second(10));
    let out = times(stream::iter(0..100).rate_limit(l.clone(), |_| ())).await;
    assert_eq!(out.len(), 100);
    // 10 at once, then one per 100 ms: the hundredth at 9 s.
    assert_eq!(out[9].1, ms(0));
    assert_eq!(out[10].1, ms(100));
    assert_eq!(out[99].1, ms(9000));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(l.peek(&()).remaining(), 10);
}

#[tokio::test(start_paused = true)]
async fn items_wait_while_the_stream_underneath_is_not_polled() {
    let l = limiter::<()>(Quota::per_second(1).burst(1));
    let polled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = polled.clone();
    let source = stream::iter(0..10).inspect(move |_| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let mut s = Box::pin(source.rate_limit(l, |_| ()));
    assert_eq!(s.next().await, Some(0));
    // The second item is pulled and waits; the third is not pulled.
    let waiting = tokio::time::timeout(ms(500), s.next()).await;
    assert!(waiting.is_err());
    assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(s.next().await, Some(1));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_stream_consumes_nothing_more() {
    let l = limiter::<()>(Quota::per_second(1).burst(1));
    let mut s = Box::pin(stream::iter(0..10).rate_limit(l.clone(), |_| ()));
    assert_eq!(s.next().await, Some(0));
    assert!(tokio::time::timeout(ms(500), s.next()).await.is_err());
    drop(s);
    tokio::time::sleep(ms(500)).await;
    // The dropped item never got its unit: a fresh one is available.
    assert!(l.check(&()).is_allowed());
}

#[tokio::test(start_paused = true)]
async fn an_empty_stream_ends_at_once() {
    let l = limiter::<()>(Quota::per_second(1));
    let out = times(stream::iter(Vec::<u8>::new()).rate_limit(l, |_| ())).await;
    assert!(out.is_empty());
}

#[tokio::test(start_paused = true)]
async fn shaped_items_leave_one_per_interval_per_key() {
    let shaper = Shaper::<char>::new(Quota::per_second(4));
    let items = ['a', 'a', 'a', 'b'];
    let out = times(stream::iter(items).shape(shaper, |c| *c)).await;
    assert_eq!(
        out,
        vec![('a', ms(0)), ('a', ms(250)), ('a', ms(500)), ('b', ms(500))]
    );
}

#[tokio::test(start_paused = true)]
async fn shaped_cost_takes_that_many_slots_and_zero_takes_none() {
    let shaper = Shaper::<()>::new(Quota::per_second(4));
    let out = times(
        stream::iter([2u32, 0, 1, 3])
            .shape(shaper, |_| ())
            .cost(|c| *c),
    )
    .await;
    assert_eq!(
        out,
        vec![(2, ms(250)), (0, ms(250)), (1, ms(500)), (3, ms(1250))]
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_shaped_stream_gives_its_place_back() {
    let shaper = Shaper::<()>::new(Quota::per_second(1));
    let mut s = Box::pin(stream::iter(0..10).shape(shaper.clone(), |_| ()));
    assert_eq!(s.next().await, Some(0));
    assert!(tokio::time::timeout(ms(100), s.next()).await.is_err());
    drop(s);
    // The place the dropped item held (1 s) goes to the next comer.
    let start = Instant::now();
    shaper.until_slot(&()).await;
    assert_eq!(start.elapsed(), ms(900));
}
