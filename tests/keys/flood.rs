//! Floods of distinct keys and the quiet after them: the bound on tracked keys holds over the
//! whole store, idle keys make room before any active key is refused or forgotten, and ordinary
//! traffic shrinks the store again.
//!
//! The full-size flood (the default `max_keys`, 1.1 M keys) is `#[ignore]`d:
//!
//! ```text
//! cargo test --release --all-features --test keys -- --ignored flood
//! ```
//!
//! Pins docs/design.md section 3 ("Keyed state").

use std::time::Duration;

use tollgate::store::OnFull;
use tollgate::Shaper;
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
fn max_keys_bounds_the_whole_store_not_each_shard() {
    let (l, _hand) = limiter(Quota::per_minute(1), 1, OnFull::RejectNewKeys);
    let admitted = (0..1_000u64).filter(|k| l.check(k).is_allowed()).count();
    assert_eq!(admitted, 1);
    assert_eq!(l.len(), 1);

    let (l, _hand) = limiter(Quota::per_minute(1), 1_000, OnFull::RejectNewKeys);
    let admitted = (0..2_000u64).filter(|k| l.check(k).is_allowed()).count();
    assert_eq!(admitted, 1_000);
    assert_eq!(l.len(), 1_000);

    let (l, _hand) = limiter(Quota::per_minute(1), 1_000, OnFull::EvictNearestIdle);
    for k in 0..5_000u64 {
        assert!(l.check(&k).is_allowed());
        assert!(l.len() <= 1_000);
    }
    assert_eq!(l.len(), 1_000);
}

#[test]
fn reject_new_keys_admits_a_new_key_once_a_tracked_one_is_idle_and_says_when() {
    let (l, hand) = limiter(Quota::per_minute(1), 1, OnFull::RejectNewKeys);
    assert!(l.check(&1).is_allowed());
    let d = l.check(&2);
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    hand.advance(Duration::from_secs(59));
    let d = l.check(&2);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    hand.advance(Duration::from_secs(1));
    assert!(l.check(&2).is_allowed());
    assert_eq!(l.len(), 1);
}

#[test]
fn reject_new_keys_recovers_after_a_flood_of_a_hundred() {
    let (l, hand) = limiter(Quota::per_minute(1), 100, OnFull::RejectNewKeys);
    for k in 0..1_000u64 {
        let _ = l.check(&k);
    }
    assert_eq!(l.len(), 100);
    let d = l.check(&5_000);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
    hand.advance(Duration::from_secs(60));
    // Every tracked key is idle: 100 new keys fit, the 101st waits for them.
    let admitted = (10_000..10_101u64)
        .filter(|k| l.check(k).is_allowed())
        .count();
    assert_eq!(admitted, 100);
    assert_eq!(l.len(), 100);
}

#[test]
fn eviction_forgets_no_active_key_while_idle_ones_are_tracked() {
    let (l, hand) = limiter(Quota::per_hour(1), 1_000, OnFull::EvictNearestIdle);
    for k in 0..1_100u64 {
        let _ = l.check(&k);
    }
    hand.advance(Duration::from_secs(2 * 3600));
    // 100 clients spend their burst...
    for k in 1_000_000..1_000_100u64 {
        assert!(l.check(&k).is_allowed());
    }
    // ...then new keys arrive 1 ns apart, while 900 idle keys are still tracked.
    for k in 2_000_000..2_000_900u64 {
        hand.advance(Duration::from_nanos(1));
        assert!(l.check(&k).is_allowed());
    }
    for k in 1_000_000..1_000_100u64 {
        assert!(!l.check(&k).is_allowed(), "key {k} was forgotten");
    }
    assert_eq!(l.len(), 1_000);
}

#[test]
fn ordinary_traffic_shrinks_the_store_after_a_flood() {
    let (l, hand) = limiter(Quota::per_minute(1), 20_000, OnFull::EvictNearestIdle);
    for k in 0..20_000u64 {
        let _ = l.check(&k);
    }
    assert_eq!(l.len(), 20_000);
    hand.advance(Duration::from_secs(3600));
    // An hour of 4 000 clients, each once a minute: their keys are active, the flood's idle.
    for _minute in 0..60 {
        for c in 1_000_000..1_004_000u64 {
            assert!(l.check(&c).is_allowed());
        }
        hand.advance(Duration::from_secs(60));
    }
    assert!(l.len() <= 4_000, "{} keys tracked", l.len());
}

#[tokio::test(start_paused = true)]
async fn an_evicted_shaper_key_leaves_at_most_one_interval_early() {
    let shaper = Shaper::<u32>::builder(Quota::per_second(1))
        .no_delay_burst(3)
        .max_keys(1)
        .build();
    let start = tokio::time::Instant::now();
    for _ in 0..4 {
        shaper.until_slot(&1).await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Key 1 is four intervals ahead: it may not be forgotten to make room for key 2.
    assert!(shaper.reserve(&2).is_err());
    for _ in 0..4 {
        shaper.until_slot(&1).await;
    }
    assert_eq!(start.elapsed(), Duration::from_secs(4));
}

#[test]
#[ignore = "a flood of the default size; run in release"]
fn the_default_store_holds_under_a_full_size_flood() {
    let (l, hand) = limiter(Quota::per_hour(1), 1_000_000, OnFull::RejectNewKeys);
    for k in 0..1_100_000u64 {
        let _ = l.check(&k);
    }
    assert_eq!(l.len(), 1_000_000);
    hand.advance(Duration::from_secs(3 * 3600));
    let admitted = (2_000_000..2_010_000u64)
        .filter(|k| l.check(k).is_allowed())
        .count();
    assert_eq!(admitted, 10_000);
    assert!(l.len() <= 1_000_000);
}

#[test]
fn a_client_value_of_any_size_costs_a_bounded_key() {
    use tollgate::key::{Header, KeyExtractor, RequestHead, Route, MAX_KEY_BYTES};

    let extract = |value: &[u8]| {
        let req = http::Request::get("/")
            .header("x-api-key", value)
            .body(())
            .unwrap();
        Header::new("x-api-key")
            .extract(&RequestHead::new(&req))
            .unwrap()
    };
    let mut seen = std::collections::HashSet::new();
    for i in 0..100u32 {
        let mut value = vec![b'k'; 16 * 1024];
        // Distinct at the far end only: the whole value must count.
        value[16 * 1024 - 8..].copy_from_slice(format!("{i:08}").as_bytes());
        let key = extract(&value);
        assert!(key.len() <= MAX_KEY_BYTES, "{} bytes", key.len());
        // The same value gives the same key; distinct values distinct keys.
        assert_eq!(key, extract(&value));
        seen.insert(key);
    }
    assert_eq!(seen.len(), 100);
    // A short value is kept whole.
    assert_eq!(&*extract(b"key-123"), b"key-123");

    let path = format!("/{}", "p".repeat(10_000));
    let req = http::Request::get(path.as_str()).body(()).unwrap();
    let route = Route.extract(&RequestHead::new(&req)).unwrap();
    assert!(route.len() <= MAX_KEY_BYTES + 8, "{} bytes", route.len());
}
