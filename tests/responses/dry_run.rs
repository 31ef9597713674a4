#![cfg(feature = "axum")]
//! Dry-run (shadow) mode: every layer decides as if enforced, but rejects and delays nothing;
//! the would-be rejection is in the request's extensions and in a tracing event; state is
//! consumed exactly as enforcement would consume it.
//!
//! Pins docs/design.md section 3 ("Observability": dry-run decides and records everything).

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use common::capture::capture;
use http::{Request, Response, StatusCode};
use tollgate::key::Header;
use tollgate::observe::{DryRunRejection, LayerKind};
use tollgate::response::RejectionKind;
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Service, ServiceBuilder, ServiceExt};

/// Answers with the dry-run rejections the request carries, as `kind/policy/quota` lines.
async fn echo(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let lines: Vec<String> = DryRunRejection::all(req.extensions())
        .iter()
        .map(|r| {
            format!(
                "{:?}/{}/{}/{}",
                r.kind(),
                r.policy(),
                r.quota().unwrap_or("-"),
                r.status().as_u16()
            )
        })
        .collect();
    Ok(Response::new(Body::from(lines.join(";"))))
}

fn from(client: &str) -> Request<Body> {
    Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap()
}

async fn call<S, B>(svc: &mut S, req: Request<Body>) -> (StatusCode, String, bool)
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let resp = svc.ready().await.unwrap().call(req).await.unwrap();
    let status = resp.status();
    let has_fields = resp.headers().contains_key("ratelimit");
    (status, text(resp).await, has_fields)
}

async fn text<B>(resp: Response<B>) -> String
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let body = axum::body::to_bytes(Body::new(resp.into_body()), 1024)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_rate_limit_lets_every_request_through_and_marks_the_ones_it_would_reject() {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new("per-client", Quota::per_second(1).burst(2)))
        .key(Header::new("x-client"))
        .clock(clock)
        .dry_run(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    let mut bodies = Vec::new();
    for _ in 0..4 {
        let (status, body, fields) = call(&mut svc, from("a")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!fields, "no RateLimit fields in dry-run mode by default");
        bodies.push(body);
    }
    assert_eq!(
        bodies,
        [
            "",
            "",
            "RateLimited/per-client/per-client/429",
            "RateLimited/per-client/per-client/429"
        ]
    );
    // Another key has its own state.
    assert_eq!(call(&mut svc, from("b")).await.1, "");
}

/// A would-be rejection consumes nothing, as a rejection does when enforced: a shadow layer
/// and an enforcing one fed the same requests are in the same state afterwards.
#[tokio::test(start_paused = true)]
async fn a_would_be_rejection_consumes_exactly_what_an_enforced_rejection_consumes() {
    let (clock, time) = Clock::manual();
    let quota = Quota::per_second(1).burst(2);
    let shadow = RateLimitLayer::new(quota.clone())
        .clock(clock.clone())
        .dry_run(true);
    let enforcing = RateLimitLayer::new(quota).clock(clock);
    let mut shadow_svc = ServiceBuilder::new().layer(shadow.clone()).service_fn(echo);
    let mut enforcing_svc = ServiceBuilder::new()
        .layer(enforcing.clone())
        .service_fn(echo);
    let mut outcomes = Vec::new();
    // A flood, then the quiet after it: 10 requests at t=0, then one every 500 ms.
    for i in 0..16 {
        if i >= 10 {
            time.advance(Duration::from_millis(500));
        }
        let (_, body, _) = call(&mut shadow_svc, from("a")).await;
        let (status, _, _) = call(&mut enforcing_svc, from("a")).await;
        outcomes.push((body.is_empty(), status == StatusCode::OK));
    }
    for (i, (shadow_admits, enforced_admits)) in outcomes.iter().enumerate() {
        assert_eq!(shadow_admits, enforced_admits, "request {i}");
    }
    let admitted = outcomes.iter().filter(|(a, _)| *a).count();
    // 2 at once, then one per second over the 3 s of quiet.
    assert_eq!(admitted, 5);
    let shadow_state = shadow.limiter("1-per-1s").unwrap().unwrap().peek(&());
    let enforced_state = enforcing.limiter("1-per-1s").unwrap().unwrap().peek(&());
    assert_eq!(shadow_state, enforced_state);
}

#[tokio::test(start_paused = true)]
async fn dry_run_headers_sends_the_fields_of_the_decision() {
    let layer = RateLimitLayer::new(Quota::per_second(1).burst(1))
        .clock(Clock::tokio())
        .dry_run(true)
        .dry_run_headers(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    assert!(call(&mut svc, from("a")).await.2);
    let (status, body, fields) = call(&mut svc, from("a")).await;
    assert_eq!((status, fields), (StatusCode::OK, true));
    assert_eq!(body, "RateLimited/1-per-1s/1-per-1s/429");
}

#[tokio::test(start_paused = true)]
async fn the_quota_that_fired_is_named_among_several() {
    let policy = Policy::new("api", Quota::per_second(10).burst(10))
        .quota(Quota::per_minute(3).named("api-minute"));
    let layer = RateLimitLayer::new(policy)
        .clock(Clock::tokio())
        .dry_run(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    for _ in 0..3 {
        assert_eq!(call(&mut svc, from("a")).await.1, "");
    }
    assert_eq!(
        call(&mut svc, from("a")).await.1,
        "RateLimited/api/api-minute/429"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_never_fits_is_marked_and_let_through() {
    let layer = RateLimitLayer::new(Quota::per_second(1).burst(2))
        .cost(|_| 3)
        .clock(Clock::tokio())
        .dry_run(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    let (status, body, _) = call(&mut svc, from("a")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "CostExceedsBurst/1-per-1s/1-per-1s/429");
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_key_is_marked_and_let_through_by_every_layer() {
    let rate = RateLimitLayer::new(Policy::new("r", Quota::per_second(1)))
        .key(Header::new("x-client"))
        .on_missing_key(MissingKey::reject(401))
        .dry_run(true);
    let conc = ConcurrencyLimitLayer::new(1)
        .key(Header::new("x-client"))
        .name("c")
        .dry_run(true);
    let shape = ShapeLayer::new(Quota::per_second(1))
        .name("s")
        .key(Header::new("x-client"))
        .dry_run(true);
    let mut svc = ServiceBuilder::new()
        .layer(rate)
        .layer(conc)
        .layer(shape)
        .service_fn(echo);
    let bare = Request::get("/").body(Body::empty()).unwrap();
    let (status, body, _) = call(&mut svc, bare).await;
    assert_eq!(status, StatusCode::OK);
    // Outermost first.
    assert_eq!(
        body,
        "MissingKey/r/-/401;MissingKey/c/-/400;MissingKey/s/-/400"
    );
}

/// A stacked enforcing layer inside a shadow one rejects: the shadow layer took the request
/// as an admitted one, and gives it back as an enforcing layer would.
#[tokio::test(start_paused = true)]
async fn a_shadow_layer_gives_back_what_an_inner_rejection_took() {
    let (clock, _time) = Clock::manual();
    let shadow = RateLimitLayer::new(Policy::new("outer", Quota::per_second(1).burst(2)))
        .clock(clock.clone())
        .dry_run(true);
    let inner =
        RateLimitLayer::new(Policy::new("inner", Quota::per_second(1).burst(1))).clock(clock);
    let mut svc = ServiceBuilder::new()
        .layer(shadow.clone())
        .layer(inner)
        .service_fn(echo);
    assert_eq!(call(&mut svc, from("a")).await.0, StatusCode::OK);
    assert_eq!(
        call(&mut svc, from("a")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let outer = shadow.limiter("outer").unwrap().unwrap();
    // One admitted request holds the outer quota; the rejected one was given back.
    assert_eq!(outer.peek(&()).remaining(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_concurrency_limit_neither_rejects_nor_queues_and_holds_no_extra_permit() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(4, Duration::from_secs(10))
        .name("db")
        .dry_run(true);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req: Request<Body>| {
            let g = g.clone();
            async move {
                if req.uri().path() == "/slow" {
                    g.notified().await;
                }
                echo(req).await
            }
        });
    let slow = tokio::spawn(
        svc.clone()
            .oneshot(Request::get("/slow").body(Body::empty()).unwrap()),
    );
    tokio::task::yield_now().await;
    // The slow one holds the only permit: the next two would have waited (or been refused).
    for _ in 0..2 {
        let resp = svc.clone().oneshot(from("a")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(text(resp).await, "Concurrency/db/-/503");
    }
    gate.notify_one();
    let resp = slow.await.unwrap().unwrap();
    assert_eq!(text(resp).await, "");
    // The permit is back: the next request is admitted as enforcement would admit it.
    let resp = svc.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(text(resp).await, "");
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_shaper_delays_nothing_and_refuses_nothing_but_keeps_the_schedule() {
    let layer = ShapeLayer::new(Quota::per_second(1))
        .name("up")
        .max_waiting(2)
        .dry_run(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    let start = tokio::time::Instant::now();
    let mut bodies = Vec::new();
    for _ in 0..5 {
        let (status, body, fields) = call(&mut svc, from("a")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!fields);
        bodies.push(body);
    }
    // None waited: the paused clock did not move.
    assert_eq!(start.elapsed(), Duration::ZERO);
    // One leaves, two would wait, the queue (2) would refuse the rest.
    assert_eq!(
        bodies,
        ["", "", "", "QueueFull/up/-/429", "QueueFull/up/-/429"]
    );
    // Once the would-be waiters' slots have passed, the queue is free again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(call(&mut svc, from("a")).await.1, "");
}

#[tokio::test(start_paused = true)]
async fn each_rejection_is_one_debug_event_with_the_policy_quota_and_retry_time_but_no_key() {
    let (out, _guard) = capture(tracing::Level::DEBUG);
    let layer = RateLimitLayer::new(Policy::new("login", Quota::per_minute(1)))
        .key(Header::new("x-client"))
        .clock(Clock::tokio());
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    assert_eq!(
        call(&mut svc, from("alice@example.com")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&mut svc, from("alice@example.com")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let text = out.text();
    let events: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate::reject"))
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    let e = events[0];
    assert!(
        e.trim_start()
            .starts_with("DEBUG tollgate::reject: request rejected"),
        "{e}"
    );
    for field in [
        "layer=\"rate_limit\"",
        "policy=\"login\"",
        "quota=\"login\"",
        "outcome=\"limited\"",
        "status=429",
        "retry_after_ms=60000",
        "dry_run=false",
    ] {
        assert!(e.contains(field), "{field} missing from {e}");
    }
    assert!(
        !text.contains("alice"),
        "the key must not be logged by default: {text}"
    );
    // The configuration was logged when the layer was built.
    assert!(text.contains("tollgate::config: layer built"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn trace_keys_puts_the_key_in_the_event() {
    let (out, _guard) = capture(tracing::Level::DEBUG);
    let layer = ShapeLayer::new(Quota::per_second(1))
        .name("s")
        .max_waiting(1)
        .key(Header::new("x-client"))
        .trace_keys(true);
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);
    let first = tokio::spawn(svc.clone().oneshot(from("bob")));
    let second = tokio::spawn(svc.clone().oneshot(from("bob")));
    tokio::task::yield_now().await;
    assert_eq!(
        call(&mut svc, from("bob")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    let text = out.text();
    let e = text
        .lines()
        .find(|l| l.contains("tollgate::reject"))
        .unwrap_or_default();
    assert!(e.contains("outcome=\"queue_full\""), "{text}");
    // The key in its `Debug` form: this extractor's key is the header's bytes, "bob".
    assert!(e.contains("key=[98, 111, 98]"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn a_would_be_rejection_is_an_info_event_of_its_own_target() {
    let (out, _guard) = capture(tracing::Level::INFO);
    let layer = ConcurrencyLimitLayer::new(1).dry_run(true);
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req: Request<Body>| {
            let g = g.clone();
            async move {
                if req.uri().path() == "/slow" {
                    g.notified().await;
                }
                echo(req).await
            }
        });
    let slow = tokio::spawn(
        svc.clone()
            .oneshot(Request::get("/slow").body(Body::empty()).unwrap()),
    );
    tokio::task::yield_now().await;
    assert_eq!(
        svc.clone().oneshot(from("a")).await.unwrap().status(),
        StatusCode::OK
    );
    gate.notify_one();
    slow.await.unwrap().unwrap();
    let text = out.text();
    let events: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate::dry_run"))
        .collect();
    assert_eq!(events.len(), 1, "{text}");
    assert!(events[0]
        .trim_start()
        .starts_with("INFO tollgate::dry_run: request would have been rejected"));
    assert!(events[0].contains("layer=\"concurrency\""), "{}", events[0]);
    assert!(events[0].contains("dry_run=true"), "{}", events[0]);
}

#[test]
fn a_dry_run_rejection_says_what_would_have_happened() {
    let mut req = Request::new(());
    assert!(DryRunRejection::first(req.extensions()).is_none());
    let layer = RateLimitLayer::new(Quota::per_second(1).burst(1)).dry_run(true);
    let _ = &mut req;
    let _ = layer;
    assert_eq!(LayerKind::RateLimit.as_str(), "rate_limit");
    assert_eq!(LayerKind::Concurrency.as_str(), "concurrency");
    assert_eq!(LayerKind::Shape.as_str(), "shape");
    assert_eq!(LayerKind::Limiter.as_str(), "limiter");
    assert_eq!(RejectionKind::RateLimited.code(), "rate_limited");
}
