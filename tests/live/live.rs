//! Limits changed while serving: a key's time carries over, no free burst, no debt beyond the
//! new tolerance, every clone sees the change, invalid changes leave the old limits. The
//! first cases and the refused changes run over both stores (`tests/common/stores.rs`), the
//! rest on the memory limiter; `live_redis.rs` has what only Redis has (instances, the deny
//! cache, a rate too fine for the scripts).
//!
//! Pins docs/design.md section 3 ("A live quota change").

use std::time::Duration;

use crate::common::account::rig::manual;
use crate::common::stores::Store;
use tollgate::{Clock, ConfigError, Quota, RateLimiter};

const MS: Duration = Duration::from_millis(1);

crate::over_both_stores!(
    raising_the_rate_mid_burst_keyed_and_with_several_quotas,
    lowering_the_tolerance_keeps_the_time_a_key_spent_and_judges_it_by_the_new_quota,
    a_window_quota_keeps_its_count_and_a_lower_count_holds_the_key_until_the_window_ends,
    an_invalid_change_is_refused_and_the_old_quotas_stay,
    a_quota_cannot_change_its_kind_while_serving,
);

/// How many requests of `k` are admitted in a row right now, none of them degraded.
async fn admitted_on<S: Store>(s: &S, l: &S::Limiter, k: &str) -> u32 {
    let mut n = 0;
    while n < 1_000 {
        let d = s.check(l, k).await;
        assert!(!d.is_degraded());
        if !d.is_allowed() {
            break;
        }
        n += 1;
    }
    n
}

/// How many requests of `key` are admitted in a row right now.
fn admitted<K: std::hash::Hash + Eq + Clone + Send + Sync>(l: &RateLimiter<K>, key: &K) -> u32 {
    let mut n = 0;
    while n < 10_000 && l.check(key).is_allowed() {
        n += 1;
    }
    n
}

#[test]
fn raising_the_rate_mid_burst_gives_no_free_burst() {
    // Every store shape: the global one-word slot, a keyed word, keyed several quotas.
    let (clock, time) = Clock::manual();
    let global = RateLimiter::<()>::builder(Quota::per_second(1))
        .clock(clock.clone())
        .build();
    assert_eq!(admitted(&global, &()), 1);
    global.set_quotas([Quota::per_second(10)]).unwrap();
    // The key is 1 s ahead: the whole tolerance of 10 at 10/s.
    assert_eq!(admitted(&global, &()), 0);
    time.advance(100 * MS);
    assert_eq!(admitted(&global, &()), 1);
    time.advance(500 * MS);
    assert_eq!(admitted(&global, &()), 5);
}

async fn raising_the_rate_mid_burst_keyed_and_with_several_quotas(s: &impl Store) {
    let (clock, time) = manual();
    let keyed = s.build(&[Quota::per_second(1)], "keyed", &clock);
    let many = s.build(
        &[Quota::per_second(1), Quota::per_minute(100)],
        "many",
        &clock,
    );
    assert_eq!(admitted_on(s, &keyed, "k").await, 1);
    assert_eq!(admitted_on(s, &many, "k").await, 1);
    s.set_quotas(&keyed, vec![Quota::per_second(10)]);
    s.set_quotas(&many, vec![Quota::per_second(10), Quota::per_minute(100)]);
    assert_eq!(admitted_on(s, &keyed, "k").await, 0);
    assert_eq!(admitted_on(s, &many, "k").await, 0);
    // A key never seen before gets the new quota's whole burst.
    assert_eq!(admitted_on(s, &keyed, "fresh").await, 10);
    time.advance(300 * MS);
    assert_eq!(admitted_on(s, &keyed, "k").await, 3);
    assert_eq!(admitted_on(s, &many, "k").await, 3);
}

#[test]
fn raising_the_burst_keeps_what_the_key_spent() {
    let (clock, _time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(10).burst(5))
        .clock(clock)
        .build();
    assert_eq!(admitted(&l, &1), 5);
    l.set_quotas([Quota::per_second(10).burst(20)]).unwrap();
    // 500 ms spent of a new tolerance of 2 s: 15 more, not 20.
    assert_eq!(admitted(&l, &1), 15);
}

#[test]
fn lowering_the_limit_mid_burst_counts_what_was_spent_in_time() {
    let (clock, time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    assert_eq!(admitted(&l, &1), 10);
    // 1 s spent; the new quota (1 per second, burst 2) has 2 s of tolerance: one left.
    l.set_quotas([Quota::per_second(1).burst(2)]).unwrap();
    assert_eq!(admitted(&l, &1), 1);
    time.advance(999 * MS);
    assert_eq!(admitted(&l, &1), 0);
    time.advance(MS);
    assert_eq!(admitted(&l, &1), 1);
}

async fn lowering_the_tolerance_keeps_the_time_a_key_spent_and_judges_it_by_the_new_quota(
    s: &impl Store,
) {
    for n in [100, 10] {
        let (clock, time) = manual();
        let l = s.build(&[Quota::per_second(n)], &format!("lower{n}"), &clock);
        assert_eq!(admitted_on(s, &l, "k").await, n);
        // The key is 1 s ahead; the new quota tolerates 200 ms (10/s, burst 2).
        s.set_quotas(&l, vec![Quota::per_second(10).burst(2)]);
        let d = s.check(&l, "k").await;
        assert!(!d.is_allowed());
        // The second it spent stands: the next request fits once it is 200 ms ahead with it.
        assert_eq!(d.retry_after(), Some(900 * MS), "{n}/s");
        assert_eq!(d.reset_after(), 1_000 * MS);
        assert_eq!(d.remaining(), 0);
        // A peek agrees: the key is 800 ms beyond the new tolerance.
        assert_eq!(s.peek(&l, "k").await.retry_after(), Some(800 * MS));
        time.advance(899 * MS);
        assert_eq!(admitted_on(s, &l, "k").await, 0);
        time.advance(MS);
        assert_eq!(admitted_on(s, &l, "k").await, 1);
        time.advance(200 * MS);
        assert_eq!(admitted_on(s, &l, "k").await, 2);
    }
}

#[test]
fn a_key_with_several_quotas_is_judged_per_quota_and_still_all_or_nothing() {
    let (clock, time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(100))
        .quota(Quota::per_second(50).burst(100))
        .clock(clock)
        .build();
    assert_eq!(admitted(&l, &1), 100);
    // First quota 1 s ahead, second 2 s ahead; both now tolerate 100 ms.
    l.set_quotas([
        Quota::per_second(10).burst(1),
        Quota::per_second(20).burst(2),
    ])
    .unwrap();
    // The second quota decides: 2 s ahead, 50 ms more fits 100 ms ahead at 1.95 s.
    let d = l.check(&1);
    assert_eq!(d.retry_after(), Some(1_950 * MS));
    time.advance(1_949 * MS);
    assert_eq!(admitted(&l, &1), 0);
    time.advance(MS);
    assert_eq!(admitted(&l, &1), 1);
}

#[test]
fn a_peek_after_a_stricter_change_reports_the_time_spent_under_the_new_quota() {
    let (clock, _time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(100))
        .clock(clock)
        .build();
    assert_eq!(admitted(&l, &1), 100);
    l.set_quotas([Quota::per_second(10).burst(2)]).unwrap();
    let d = l.peek(&1);
    assert_eq!(d.remaining(), 0);
    assert_eq!(d.reset_after(), 1_000 * MS);
    assert_eq!(d.limit(), 2);
    // 1 s ahead against a tolerance of 200 ms: even a request of cost 0 waits 800 ms, in
    // memory as on Redis.
    assert_eq!(d.retry_after(), Some(800 * MS));
}

#[test]
fn every_clone_sees_a_change_at_once() {
    let (clock, _time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    let clones: Vec<_> = (0..4).map(|_| l.clone()).collect();
    clones[2].set_quotas([Quota::per_second(3)]).unwrap();
    for (i, c) in clones.iter().enumerate() {
        assert_eq!(c.quotas()[0], Quota::per_second(3));
        assert_eq!(admitted(c, &(i as u64)), 3, "clone {i}");
    }
    assert_eq!(admitted(&l, &9), 3);
}

async fn an_invalid_change_is_refused_and_the_old_quotas_stay(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let l = s.build(
        &[Quota::per_second(10), Quota::per_hour(100)],
        "invalid",
        &clock,
    );
    assert_eq!(s.try_set_quotas(&l, vec![]), Err(ConfigError::NoQuota));
    assert_eq!(
        s.try_set_quotas(&l, vec![Quota::per_second(1)]),
        Err(ConfigError::QuotaCountChanged { was: 2, got: 1 })
    );
    assert_eq!(
        s.try_set_quotas(&l, vec![Quota::per_second(1); 5]),
        Err(ConfigError::TooManyQuotas { got: 5, max: 4 })
    );
    assert_eq!(admitted_on(s, &l, "1").await, 10);
    // Still two quotas: a change of two is taken.
    s.set_quotas(&l, vec![Quota::per_second(20), Quota::per_hour(100)]);
    assert_eq!(admitted_on(s, &l, "2").await, 20);
}

async fn a_quota_cannot_change_its_kind_while_serving(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let log = Quota::sliding_log(5, Duration::from_secs(1));
    let l = s.build(std::slice::from_ref(&log), "kind", &clock);
    assert!(matches!(
        s.try_set_quotas(&l, vec![Quota::per_second(5)]),
        Err(ConfigError::NotChangeable(_))
    ));
    // Still the log: five in its second.
    assert_eq!(admitted_on(s, &l, "1").await, 5);
}

#[test]
fn no_state_is_lost_on_change() {
    let (clock, _time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(5))
        .clock(clock)
        .build();
    for k in 0..100 {
        assert_eq!(admitted(&l, &k), 5);
    }
    l.set_quotas([Quota::per_second(5).named("same-rate")])
        .unwrap();
    assert_eq!(l.len(), 100);
    for k in 0..100 {
        assert_eq!(admitted(&l, &k), 0, "key {k}");
    }
}

#[test]
fn changes_under_concurrent_requests_never_admit_more_than_either_quota_allows() {
    // Threads decide on one key while another flips the quota between 10 and 20 per second
    // (burst 10 and 20) with the clock stopped: no more than the larger burst in total.
    let (clock, _time) = Clock::manual();
    let l = RateLimiter::<u64>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    let total = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..2_000 {
                    if l.check(&7).is_allowed() {
                        total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            for i in 0..200 {
                let n = if i % 2 == 0 { 20 } else { 10 };
                l.set_quotas([Quota::per_second(n)]).unwrap();
            }
        });
    });
    let total = total.into_inner();
    // The first 10 take 1 s (10/s) or 500 ms (20/s) of the key's time; it never exceeds the
    // larger tolerance, 1 s, so at most 20 are admitted, and at least the first 10.
    assert!((10..=20).contains(&total), "{total}");
    // Whatever the last quota, less than one 100 ms interval of the 1 s is left.
    l.set_quotas([Quota::per_second(20)]).unwrap();
    assert!(admitted(&l, &7) <= 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_decides_under_the_new_quota_when_its_turn_comes() {
    let l = RateLimiter::<u64>::builder(Quota::per_second(1))
        .clock(Clock::tokio())
        .build();
    let start = tokio::time::Instant::now();
    let _ = l.until_ready(&1).await;
    let waiter = tokio::spawn({
        let l = l.clone();
        async move {
            for _ in 0..3 {
                let _ = l.until_ready(&1).await;
            }
            start.elapsed()
        }
    });
    tokio::time::sleep(500 * MS).await;
    l.set_quotas([Quota::per_second(10).burst(1)]).unwrap();
    // The waiter sleeps until the time it was given (1 s), then decides under the new quota:
    // one request every 100 ms, not one a second.
    assert_eq!(waiter.await.unwrap(), 1200 * MS);
}

async fn a_window_quota_keeps_its_count_and_a_lower_count_holds_the_key_until_the_window_ends(
    s: &impl Store,
) {
    let minute = Duration::from_secs(60);
    // Alone, and beside a GCRA quota.
    for (i, with) in [vec![], vec![Quota::per_second(100)]]
        .into_iter()
        .enumerate()
    {
        let quotas = |count| [vec![Quota::fixed_window(count, minute)], with.clone()].concat();
        let (clock, time) = manual();
        let l = s.build(&quotas(5), &format!("window{i}"), &clock);
        assert_eq!(admitted_on(s, &l, "k").await, 5);
        s.set_quotas(&l, quotas(3));
        let d = s.check(&l, "k").await;
        assert!(!d.is_degraded());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(minute));
        s.set_quotas(&l, quotas(8));
        assert_eq!(admitted_on(s, &l, "k").await, 3);
        assert!(matches!(
            s.try_set_quotas(&l, vec![Quota::per_second(8); with.len() + 1]),
            Err(ConfigError::NotChangeable(_))
        ));
        time.advance(minute);
        assert_eq!(admitted_on(s, &l, "k").await, 8);
    }
}

#[cfg(feature = "axum")]
mod layer {
    use std::convert::Infallible;

    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use http::{Request, StatusCode};
    use tollgate::key::Header;
    use tollgate::{Clock, ConfigError, Policy, Quota, RateLimitLayer};
    use tower::ServiceExt;

    use super::MS;

    fn req(uri: &str, user: &str) -> Request<Body> {
        Request::get(uri)
            .header("x-user", user)
            .body(Body::empty())
            .unwrap()
    }

    /// How many requests of `user` on `uri` are answered 200 in a row.
    async fn served(app: &Router, uri: &str, user: &str) -> u32 {
        let mut n = 0;
        while n < 1_000 {
            let resp = app.clone().oneshot(req(uri, user)).await.unwrap();
            if resp.status() != StatusCode::OK {
                assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
                break;
            }
            n += 1;
        }
        n
    }

    fn layer() -> RateLimitLayer<Header> {
        RateLimitLayer::new(Policy::new("free", Quota::per_second(2)))
            .tier(Policy::new("pro", Quota::per_second(10)))
            .select_tier(|req| {
                req.headers
                    .get("x-user")
                    .is_some_and(|u| u.as_bytes().starts_with(b"pro"))
                    .then_some("pro")
            })
            .key(Header::new("x-user"))
            .clock(Clock::tokio())
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_reaches_every_route_and_clone_of_the_layer_keeping_key_state() {
        let layer = layer();
        let handle = layer.handle().unwrap();
        // Two routes, each with its own clone of the layer: one state.
        let app = Router::new()
            .route("/a", get(|| async { "a" }).layer(layer.clone()))
            .route("/b", get(|| async { "b" }).layer(layer));
        assert_eq!(served(&app, "/a", "ann").await, 2);
        assert_eq!(served(&app, "/b", "pro-bob").await, 10);
        handle
            .apply(&Policy::new("free", Quota::per_second(4)))
            .unwrap();
        // ann spent 1 s of time; at 4/s the whole tolerance is 1 s: nothing free.
        assert_eq!(served(&app, "/b", "ann").await, 0);
        assert_eq!(served(&app, "/a", "cid").await, 4);
        tokio::time::sleep(500 * MS).await;
        assert_eq!(served(&app, "/a", "ann").await, 2);
        // The other tier is as it was.
        assert_eq!(served(&app, "/a", "pro-dee").await, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn the_header_fields_describe_the_new_quotas() {
        let layer = layer();
        let handle = layer.handle().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
        let policy = |resp: &http::Response<Body>| {
            resp.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        let resp = app.clone().oneshot(req("/", "ann")).await.unwrap();
        assert_eq!(policy(&resp), r#""free";q=2;w=1"#);
        handle
            .set_quotas("free", [Quota::per_minute(30).burst(5)])
            .unwrap();
        let resp = app.clone().oneshot(req("/", "bob")).await.unwrap();
        assert_eq!(policy(&resp), r#""free";q=5;w=10"#);
        assert_eq!(resp.headers()["ratelimit"], r#""free";r=4;t=2"#);
    }

    #[tokio::test(start_paused = true)]
    async fn an_invalid_change_is_refused_and_the_layer_serves_on_as_before() {
        let layer = layer();
        let handle = layer.handle().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
        assert_eq!(
            handle.set_quotas("gold", [Quota::per_second(1)]),
            Err(ConfigError::UnknownTier("gold".into()))
        );
        assert_eq!(
            handle.set_quotas("free", [Quota::per_second(1), Quota::per_day(5)]),
            Err(ConfigError::QuotaCountChanged { was: 1, got: 2 })
        );
        assert_eq!(handle.set_quotas("free", []), Err(ConfigError::NoQuota));
        assert_eq!(handle.policies()[0].quotas(), [Quota::per_second(2)]);
        assert_eq!(served(&app, "/", "ann").await, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_during_changes_never_exceed_the_larger_tolerance() {
        let layer = RateLimitLayer::new(Quota::per_second(10)).clock(Clock::tokio());
        let handle = layer.handle().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }).layer(layer));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..50 {
                    let resp = app.clone().oneshot(req("/", "x")).await.unwrap();
                    ok += u32::from(resp.status() == StatusCode::OK);
                    tokio::task::yield_now().await;
                }
                Ok::<_, Infallible>(ok)
            }));
        }
        for i in 0..50 {
            // Burst 10 at 10/s and burst 20 at 20/s: 1 s of tolerance either way.
            let n = if i % 2 == 0 { 20 } else { 10 };
            handle.set_default_quotas([Quota::per_second(n)]).unwrap();
            tokio::task::yield_now().await;
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap().unwrap();
        }
        assert!((10..=20).contains(&total), "{total}");
    }
}
