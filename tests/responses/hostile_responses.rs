#![cfg(feature = "axum")]
//! Responses under hostile or careless conditions: keys of different extractors, handlers that
//! take the decision, header integers and names at their limits, stacked layers, duration
//! settings at 0 and MAX, and the `RateLimit-Policy` window.
//!
//! Pins docs/design.md section 2.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::headers::{policy_window, MAX_INTEGER, MAX_NAME_LEN};
use tollgate::key::{Either, Header, KeyExtractor, KeyExtractorExt, PeerIp, RequestHead};
use tollgate::{
    Clock, ConcurrencyLimitLayer, ConfigError, Decision, Decisions, MissingKey, Policy, Quota,
    RateLimitLayer, ShapeLayer,
};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn from_peer(peer: &str, headers: &[(&'static str, &str)]) -> Request<Body> {
    let mut req = Request::get("/").body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{peer}:4000").parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    for (name, value) in headers {
        req.headers_mut()
            .append(*name, HeaderValue::from_str(value).unwrap());
    }
    req
}

fn header<'a, B>(resp: &'a Response<B>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body(resp: Response<Body>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Every integer in a structured-field header value (digits after `=`, or the whole value).
fn integers(value: &str) -> Vec<&str> {
    value
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect()
}

fn assert_sf_integers<B>(resp: &Response<B>) {
    for name in [
        "ratelimit-policy",
        "ratelimit",
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        for v in resp.headers().get_all(name) {
            for n in integers(v.to_str().unwrap()) {
                assert!(n.len() <= 15, "{name}: {n} has more than 15 digits");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Keys of different extractors

/// A client that sends another client's address as its API key must not spend that client's
/// bucket, with the key types left as they are or mapped to one type.
#[tokio::test(start_paused = true)]
async fn an_api_key_that_reads_like_an_address_never_spends_that_address_bucket() {
    let plain = Header::new("x-api-key").or(PeerIp::new());
    let mapped = Header::new("x-api-key")
        .map(|k| k.to_vec())
        .or(PeerIp::new().map(|ip| ip.to_string().into_bytes()));
    async fn attack<E: KeyExtractor + Clone>(extractor: E) {
        let layer = RateLimitLayer::new(Quota::per_hour(3))
            .key(extractor)
            .clock(Clock::tokio());
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        for _ in 0..3 {
            let req = from_peer("6.6.6.6", &[("x-api-key", "198.51.100.7")]);
            let resp = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
        let req = from_peer("6.6.6.6", &[("x-api-key", "198.51.100.7")]);
        let resp = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        // The victim's first request ever.
        let resp = svc
            .clone()
            .oneshot(from_peer("198.51.100.7", &[]))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit"), Some(r#""3-per-1h";r=2;t=1200"#));
    }
    attack(plain).await;
    attack(mapped).await;
}

#[test]
fn or_tags_each_key_with_the_extractor_that_found_it() {
    let extractor = Header::new("x-api-key").or(PeerIp::new());
    let with_key = from_peer("6.6.6.6", &[("x-api-key", "198.51.100.7")]);
    let without = from_peer("198.51.100.7", &[]);
    let a = extractor.extract(&RequestHead::new(&with_key)).unwrap();
    let b = extractor.extract(&RequestHead::new(&without)).unwrap();
    assert_eq!(a, Either::First(b"198.51.100.7"[..].into()));
    assert!(matches!(b, Either::Second(_)));
    assert_ne!(a, b);
}

// ---------------------------------------------------------------------------------------------
// The Decision extractor

async fn report(d: Decision) -> String {
    format!("unlimited={} remaining={}", d.is_unlimited(), d.remaining())
}

/// Requests the layer lets through without deciding reach a `Decision` handler, which learns
/// that they were not limited; no request can make the extractor answer 500.
#[tokio::test(start_paused = true)]
async fn requests_passed_without_a_decision_reach_a_decision_handler() {
    let layer = RateLimitLayer::new(Quota::per_second(2))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Allow)
        .skip_method(Method::OPTIONS)
        .skip_path("/health")
        .skip_if(|req| req.headers.contains_key("x-internal"))
        .clock(Clock::tokio());
    let app = Router::new()
        .route("/", get(report).options(report))
        .route("/health", get(report))
        .layer(layer);
    let cases = [
        Request::get("/").body(Body::empty()).unwrap(),
        Request::options("/")
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap(),
        Request::get("/health")
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap(),
        Request::get("/")
            .header("x-api-key", "k")
            .header("x-internal", "1")
            .body(Body::empty())
            .unwrap(),
    ];
    for req in cases {
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            body(resp).await,
            format!("unlimited=true remaining={}", u64::MAX)
        );
    }
    let req = Request::get("/")
        .header("x-api-key", "k")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(body(resp).await, "unlimited=false remaining=1");
}

/// An inner layer that skips a request leaves the outer layer's decision in place.
#[tokio::test(start_paused = true)]
async fn an_inner_skip_keeps_the_outer_decision() {
    let outer = RateLimitLayer::new(Quota::per_second(10)).clock(Clock::tokio());
    let inner = RateLimitLayer::new(Quota::per_second(3))
        .skip_path("/")
        .clock(Clock::tokio());
    let app = Router::new()
        .route("/", get(report))
        .layer(inner)
        .layer(outer);
    let resp = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await;
    assert_eq!(body(resp.unwrap()).await, "unlimited=false remaining=9");
}

// ---------------------------------------------------------------------------------------------
// Stacked decisions

async fn all(decisions: Decisions, innermost: Decision) -> String {
    let limits: Vec<_> = decisions.iter().map(|d| d.limit()).collect();
    format!("{limits:?} innermost={}", innermost.limit())
}

/// A handler behind two rate limits sees both decisions, outermost first; `Decision` stays
/// the innermost.
#[tokio::test(start_paused = true)]
async fn a_handler_sees_every_decision_that_admitted_it() {
    let global =
        RateLimitLayer::new(Policy::new("global", Quota::per_second(100))).clock(Clock::tokio());
    let per_key = RateLimitLayer::new(Policy::new("per-key", Quota::per_second(5)))
        .key(Header::new("x-api-key"))
        .clock(Clock::tokio());
    let third = RateLimitLayer::new(Policy::new("third", Quota::per_minute(7)))
        .skip_method(Method::POST)
        .clock(Clock::tokio());
    let app = Router::new()
        .route("/", get(all).post(all))
        .layer(third)
        .layer(per_key)
        .layer(global);
    let req = |m: Method| {
        Request::builder()
            .method(m)
            .uri("/")
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let resp = app.clone().oneshot(req(Method::GET)).await.unwrap();
    assert_eq!(body(resp).await, "[100, 5, 7] innermost=7");
    let resp = app.clone().oneshot(req(Method::POST)).await.unwrap();
    assert_eq!(body(resp).await, "[100, 5] innermost=5");
}

#[tokio::test(start_paused = true)]
async fn decisions_are_empty_without_a_decision_and_readable_without_axum() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let handler = service_fn(move |req: Request<Body>| {
        let d = Decisions::from_extensions(req.extensions());
        log.lock().unwrap().push(d.len());
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    });
    let svc = RateLimitLayer::new(Quota::per_second(1))
        .skip_path("/skip")
        .clock(Clock::tokio())
        .layer(handler);
    for uri in ["/", "/skip"] {
        let req = Request::get(uri).body(Body::empty()).unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), vec![1, 0]);
}

// ---------------------------------------------------------------------------------------------
// Legacy fields

/// The legacy triple on a rejection is the rejecting layer's, whatever the layers outside say.
#[tokio::test(start_paused = true)]
async fn legacy_fields_of_a_stack_describe_the_most_restrictive_quota() {
    let outer = RateLimitLayer::new(Quota::per_second(1000))
        .legacy_headers(true)
        .clock(Clock::tokio());
    let inner = RateLimitLayer::new(Quota::per_minute(2))
        .key(Header::new("x-api-key"))
        .legacy_headers(true)
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service_fn(ok);
    let req = || {
        Request::get("/")
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let triple = |resp: &Response<Body>| {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .map(|n| header(resp, n).unwrap().to_owned())
    };
    let resp = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(triple(&resp), ["2", "1", "30"]);
    let resp = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(triple(&resp), ["2", "0", "60"]);
    let resp = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after"), Some("30"));
    assert_eq!(triple(&resp), ["2", "0", "60"]);
    // One field each, never a list.
    assert_eq!(
        resp.headers().get_all("x-ratelimit-limit").iter().count(),
        1
    );

    // The other way round: the outer layer is the tighter one, and its triple replaces the
    // inner one's.
    let outer = RateLimitLayer::new(Quota::per_minute(2))
        .legacy_headers(true)
        .clock(Clock::tokio());
    let inner = RateLimitLayer::new(Quota::per_second(1000))
        .legacy_headers(true)
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service_fn(ok);
    let resp = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(triple(&resp), ["2", "1", "30"]);
}

#[tokio::test(start_paused = true)]
async fn legacy_fields_of_several_quotas_come_from_one_quota() {
    let layer = |quotas: Policy| {
        let layer = RateLimitLayer::new(quotas)
            .legacy_headers(true)
            .clock(Clock::tokio());
        ServiceBuilder::new().layer(layer).service_fn(ok)
    };
    let triple = |resp: &Response<Body>| {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .map(|n| header(resp, n).unwrap().to_owned())
    };
    // 10/s (r=9, t=1) and 1000/day (r=999, t=87): the per-second quota, with its own reset.
    let svc = layer(Policy::new("p", Quota::per_second(10)).quota(Quota::per_day(1000)));
    let resp = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(triple(&resp), ["10", "9", "1"]);
    // 5/s and 5/min both have 4 left: the one that takes longer to come back.
    let svc = layer(Policy::new("p", Quota::per_second(5)).quota(Quota::per_minute(5)));
    let resp = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_eq!(triple(&resp), ["5", "4", "12"]);
}

// ---------------------------------------------------------------------------------------------
// Header integers

#[tokio::test(start_paused = true)]
async fn header_integers_never_exceed_fifteen_digits() {
    // A shaping queue of usize::MAX: q is no longer the capacity, but the rate stays exact.
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(usize::MAX))
        .service_fn(ok);
    let resp = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_sf_integers(&resp);
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""shape-10-per-1s";q=10;w=1"#)
    );

    // A concurrency limit of 2^60: q is clamped.
    let svc = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(1 << 60).name("c"))
        .service_fn(ok);
    let resp = svc.oneshot(Request::new(Body::empty())).await.unwrap();
    assert_sf_integers(&resp);
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""c";q=999999999999999;qu="concurrent-requests""#)
    );
    assert_eq!(MAX_INTEGER, 999_999_999_999_999);
}

#[test]
fn the_longest_quotas_render_within_fifteen_digits() {
    let quotas = [
        Quota::new(1, Duration::from_secs(4_000_000_000)),
        Quota::new(1, Duration::from_nanos(u64::MAX / 4)),
        Quota::new(1_000_000_000, Duration::from_secs(1)),
        Quota::new(1, Duration::from_nanos(1)),
    ];
    let mut cases: Vec<_> = quotas
        .iter()
        .map(|q| (u64::from(q.burst_size()), q.count(), q.period()))
        .collect();
    // Beyond what a quota accepts: shaping capacities and raw calls.
    for burst in [0, 1, u64::MAX] {
        for count in [0, 1, u32::MAX] {
            for period in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
                cases.push((burst, count, period));
            }
        }
    }
    for (burst, count, period) in cases {
        let (q, w) = policy_window(burst, count, period);
        assert!(
            (1..=MAX_INTEGER).contains(&q),
            "{burst} {count} {period:?}: q={q}"
        );
        assert!(
            (1..=MAX_INTEGER).contains(&w),
            "{burst} {count} {period:?}: w={w}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Duration settings at 0 and MAX

/// A concurrency rejection with `retry_after(Duration::MAX)` answers with the largest
/// `Retry-After` a structured integer holds; `Duration::ZERO` still says 1.
#[tokio::test(start_paused = true)]
async fn concurrency_retry_after_at_zero_and_max_never_overflows() {
    for (setting, expected) in [
        (Duration::MAX, "999999999999999"),
        (Duration::ZERO, "1"),
        (Duration::from_nanos(1), "1"),
    ] {
        let layer = ConcurrencyLimitLayer::new(1).retry_after(setting);
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        let hold = std::sync::Arc::new(tokio::sync::Mutex::new(Some(hold)));
        let mut svc = layer.layer(service_fn(move |_req: Request<Body>| {
            let hold = hold.clone();
            async move {
                if let Some(rx) = hold.lock().await.take() {
                    let _ = rx.await;
                }
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        }));
        let first = svc.ready().await.unwrap().call(Request::new(Body::empty()));
        let first = tokio::spawn(first);
        tokio::task::yield_now().await;
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(Body::empty()))
            .await;
        let resp = resp.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&resp, "retry-after"), Some(expected));
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
    }
}

/// A queue's `max_wait` of MAX waits as long as it takes; of 0, refuses a request that
/// cannot be admitted at once.
#[tokio::test(start_paused = true)]
async fn concurrency_queue_wait_at_zero_and_max() {
    for (max_wait, admitted) in [(Duration::MAX, true), (Duration::ZERO, false)] {
        let layer = ConcurrencyLimitLayer::new(1).queue(1, max_wait);
        let mut svc = layer.layer(service_fn(|_req: Request<Body>| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }));
        let first = svc.ready().await.unwrap().call(Request::new(Body::empty()));
        // The place is held until the response body is dropped: keep only the status.
        let first = tokio::spawn(async move { first.await.map(|r| r.status()) });
        tokio::task::yield_now().await;
        let second = svc.ready().await.unwrap().call(Request::new(Body::empty()));
        let resp = second.await.unwrap();
        assert_eq!(resp.status() == StatusCode::OK, admitted, "{max_wait:?}");
        assert_eq!(first.await.unwrap().unwrap(), StatusCode::OK);
    }
}

/// Shaping with `max_delay` of MAX queues the request; of 0, refuses one that would wait.
#[tokio::test(start_paused = true)]
async fn shaping_max_delay_at_zero_and_max() {
    for (max_delay, second_ok) in [(Duration::MAX, true), (Duration::ZERO, false)] {
        let layer = ShapeLayer::new(Quota::per_second(1)).max_wait(max_delay);
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let a = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(a.status(), StatusCode::OK);
        assert_sf_integers(&a);
        let b = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(b.status() == StatusCode::OK, second_ok, "{max_delay:?}");
        assert_sf_integers(&b);
    }
}

#[test]
fn a_manual_clock_advanced_by_max_stays_at_the_end_of_time() {
    let (clock, time) = Clock::manual();
    let limiter = tollgate::RateLimiter::<()>::builder(Quota::per_second(1))
        .clock(clock)
        .build();
    time.advance(Duration::from_secs(1));
    time.advance(Duration::MAX);
    assert_eq!(time.now(), Duration::from_nanos(u64::MAX));
    time.advance(Duration::MAX);
    time.advance(Duration::ZERO);
    assert_eq!(time.now(), Duration::from_nanos(u64::MAX));
    // At the end of time, a decision still cannot admit more than the burst.
    let admitted = (0..3).filter(|_| limiter.check(&()).is_allowed()).count();
    assert!(admitted <= 1, "{admitted}");
}

// ---------------------------------------------------------------------------------------------
// Names

#[test]
fn names_from_configuration_are_checked_without_panics() {
    let long = "n".repeat(MAX_NAME_LEN + 1);
    let longest = "n".repeat(MAX_NAME_LEN);
    assert_eq!(MAX_NAME_LEN, 64);
    let too_long = ConfigError::NameTooLong {
        len: MAX_NAME_LEN + 1,
        max: MAX_NAME_LEN,
    };
    assert_eq!(
        Quota::per_second(1).try_named(long.clone()),
        Err(too_long.clone())
    );
    assert!(Quota::per_second(1).try_named(longest.clone()).is_ok());
    assert_eq!(
        Quota::per_second(1).try_named("a\"b"),
        Err(ConfigError::InvalidName("a\"b".into()))
    );
    assert_eq!(
        Quota::per_second(1).try_named(""),
        Err(ConfigError::InvalidName(String::new()))
    );
    assert!(Quota::per_second(1).try_named("é").is_err());
    assert!(Quota::per_second(1).try_named("a\\b").is_err());

    let policy = RateLimitLayer::new(Policy::new(long.clone(), Quota::per_second(1)));
    assert_eq!(policy.validate().err(), Some(too_long.clone()));
    let policy = RateLimitLayer::new(Policy::new(longest, Quota::per_second(1)));
    assert!(policy.validate().is_ok());
    let renamed = RateLimitLayer::new(Quota::per_second(1)).name(long.clone());
    assert_eq!(renamed.validate().err(), Some(too_long.clone()));
    let tier = RateLimitLayer::new(Quota::per_second(1))
        .tier(Policy::new(long.clone(), Quota::per_second(2)));
    assert_eq!(tier.validate().err(), Some(too_long.clone()));
    let conc = ConcurrencyLimitLayer::new(1).name(long.clone());
    assert_eq!(conc.validate().err(), Some(too_long.clone()));
    let shape = ShapeLayer::new(Quota::per_second(1)).name(long);
    assert_eq!(shape.validate().err(), Some(too_long));
}

// ---------------------------------------------------------------------------------------------
// The RateLimit-Policy window

/// `q / w` is the rate the quota enforces wherever a whole `w` allows it.
#[test]
fn policy_window_states_the_enforced_rate() {
    let ms = Duration::from_millis;
    // (quota, q, w)
    let cases = [
        // The burst form: the burst period is whole seconds.
        (Quota::per_second(10), 10, 1),
        (Quota::per_second(3), 3, 1),
        (Quota::per_minute(7), 7, 60),
        (Quota::per_minute(5), 5, 60),
        (Quota::per_hour(7), 7, 3600),
        (Quota::per_day(1000), 1000, 86_400),
        (Quota::per_second(10).burst(20), 20, 2),
        (Quota::per_second(1).burst(1_000_000), 1_000_000, 1_000_000),
        // The rate form: the burst period is not whole seconds.
        (Quota::per_second(100).burst(1), 100, 1),
        (Quota::per_second(1000).burst(3), 1000, 1),
        (Quota::per_second(2).burst(3), 2, 1),
        (Quota::per_hour(7).burst(1), 7, 3600),
        (Quota::new(2, ms(500)), 4, 1),
        (Quota::new(7, ms(1500)), 14, 3),
        (Quota::new(1, ms(333)), 1000, 333),
        (Quota::new(1, ms(250)).burst(1), 4, 1),
        // The approximation: never above the rate.
        (Quota::new(1, Duration::from_nanos(1_000_000_007)), 1, 2),
        (Quota::new(3, Duration::from_nanos(1_000_000_007)), 5, 2),
    ];
    for (quota, q, w) in cases {
        let got = policy_window(u64::from(quota.burst_size()), quota.count(), quota.period());
        assert_eq!(got, (q, w), "{quota:?}");
        // q/w against count/period, in whole numbers: never above.
        let lhs = u128::from(q) * quota.period().as_nanos();
        let rhs = u128::from(quota.count()) * u128::from(w) * 1_000_000_000;
        assert!(lhs <= rhs, "{quota:?} advertises more than it admits");
    }
}

/// Through the layer: the three rounded-interval cases.
#[tokio::test(start_paused = true)]
async fn the_policy_field_of_rounded_intervals_states_the_rate() {
    for (quota, expected) in [
        (Quota::per_second(3), r#""3-per-1s";q=3;w=1"#),
        (Quota::per_minute(7), r#""7-per-1m";q=7;w=60"#),
        (Quota::per_second(100).burst(1), r#""100-per-1s";q=100;w=1"#),
    ] {
        let svc = ServiceBuilder::new()
            .layer(RateLimitLayer::new(quota).clock(Clock::tokio()))
            .service_fn(ok);
        let resp = svc.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(header(&resp, "ratelimit-policy"), Some(expected));
    }
}
