//! The window kinds beyond the shared table: configuration errors in every order, header
//! fields over HTTP, eviction of idle window keys, and a full store.
//!
//! Pins docs/design.md section 1 ("Other kinds") and section 2.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::store::OnFull;
use tollgate::{Clock, ConfigError, Policy, Quota, QuotaKind, RateLimitLayer, RateLimiter};
use tower::{Layer, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

#[test]
fn window_quotas_reject_zero_counts_zero_windows_and_a_burst_in_any_order() {
    for make in [
        Quota::try_fixed_window,
        Quota::try_sliding_log,
        Quota::try_sliding_window,
    ] {
        assert_eq!(make(0, SEC), Err(ConfigError::ZeroCount));
        assert_eq!(make(1, Duration::ZERO), Err(ConfigError::ZeroPeriod));
        assert_eq!(make(1, Duration::MAX), Err(ConfigError::WindowTooLong));
        // A window of one nanosecond and one of a century are fine.
        assert!(make(1, Duration::from_nanos(1)).is_ok());
        assert!(make(Quota::MAX_LOG_COUNT, SEC * 86_400 * 36_500).is_ok());
        // A burst is GCRA's alone, named before or after.
        let q = make(5, SEC).unwrap();
        assert_eq!(q.clone().try_burst(5), Err(ConfigError::BurstOnWindow));
        let named = q.try_named("w").unwrap();
        assert_eq!(named.clone().try_burst(1), Err(ConfigError::BurstOnWindow));
        assert_eq!(named.burst_size(), 5);
        assert_eq!(named.name(), Some("w"));
    }
    // The log's memory bound.
    assert_eq!(
        Quota::try_sliding_log(Quota::MAX_LOG_COUNT + 1, SEC),
        Err(ConfigError::LogTooLong {
            count: Quota::MAX_LOG_COUNT + 1,
            max: Quota::MAX_LOG_COUNT
        })
    );
    assert!(Quota::try_fixed_window(u32::MAX, SEC).is_ok());
    assert!(Quota::try_sliding_window(u32::MAX, SEC).is_ok());
    assert_eq!(Quota::per_second(3).kind(), QuotaKind::Gcra);
    assert_eq!(Quota::fixed_window(3, SEC).kind(), QuotaKind::FixedWindow);
    assert_eq!(Quota::sliding_log(3, SEC).kind(), QuotaKind::SlidingLog);
    assert_eq!(
        Quota::sliding_window(3, SEC).kind(),
        QuotaKind::SlidingWindow
    );
}

#[test]
#[should_panic(expected = "a window quota has no burst")]
fn a_burst_on_a_window_quota_panics_where_it_is_written() {
    let _ = Quota::fixed_window(3, SEC).burst(2);
}

#[test]
fn idle_window_keys_are_evicted_and_a_full_store_waits_for_the_first_to_close() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<u32>::builder(Quota::fixed_window(2, SEC))
        .quota(Quota::sliding_log(3, 2 * SEC))
        .quota(Quota::sliding_window(4, SEC))
        .clock(clock)
        .max_keys(2)
        .on_full(OnFull::RejectNewKeys)
        .build();
    assert!(limiter.check(&1).is_allowed());
    time.advance(SEC / 2);
    assert!(limiter.check(&2).is_allowed());
    // Full of active keys: key 1 is idle at 2 s (its log and its counter both need 2 s).
    let d = limiter.check(&3);
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1_500)));
    time.advance(Duration::from_millis(1_500));
    assert!(limiter.check(&3).is_allowed());
    assert_eq!(limiter.len(), 2);
    time.advance(10 * SEC);
    assert_eq!(limiter.evict_idle(), 0);
    // Forgotten keys start afresh, exactly as their state said.
    assert_eq!(limiter.check(&1).remaining(), 1);
}

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn header(resp: &Response<Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn window_quotas_speak_the_same_header_fields() {
    let layer = RateLimitLayer::new(
        Policy::new("minute", Quota::fixed_window(3, 60 * SEC))
            .quota(Quota::sliding_log(100, 3600 * SEC).named("hourly")),
    )
    .clock(Clock::tokio());
    let svc = layer.layer(tower::service_fn(ok));
    let get = || Request::get("/").body(Body::empty()).unwrap();
    let resp = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        header(&resp, "ratelimit-policy").as_deref(),
        Some("\"minute\";q=3;w=60, \"hourly\";q=100;w=3600")
    );
    assert_eq!(
        header(&resp, "ratelimit").as_deref(),
        Some("\"minute\";r=2;t=60, \"hourly\";r=99;t=3600")
    );
    tokio::time::advance(Duration::from_millis(20_500)).await;
    svc.clone().oneshot(get()).await.unwrap();
    svc.clone().oneshot(get()).await.unwrap();
    let resp = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // The window closes 39.5 s from now: rounded up.
    assert_eq!(header(&resp, "retry-after").as_deref(), Some("40"));
    assert_eq!(
        header(&resp, "ratelimit").as_deref(),
        Some("\"minute\";r=0;t=40, \"hourly\";r=97;t=3600")
    );
}
