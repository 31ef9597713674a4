#![cfg(feature = "axum")]
//! Stacked layers are all or nothing: a request that a layer inside rejects gives back what
//! the rate-limit layers outside took from it, as several quotas in one layer already do.
//! The first cases run over both stores (`tests/common/stores.rs`), the outer layers in
//! memory and on a real redis-server; `stacked_redis.rs` has an outage inside.
//!
//! Pins docs/design.md section 3 ("Stacked layers are all or nothing").

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::response::OnReject;
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Layer, Service, ServiceExt};

use crate::common::account::rig::{manual, Handler};
use crate::common::stores::{self, Boxed, Store};

pub(crate) async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

pub(crate) fn req(api_key: &str, ip: &str) -> Request<Body> {
    Request::post("/login")
        .header("x-api-key", api_key)
        .header("x-ip", ip)
        .body(Body::empty())
        .unwrap()
}

fn per_key(quota: impl Into<Policy>) -> RateLimitLayer<Header> {
    RateLimitLayer::new(quota)
        .key(Header::new("x-api-key"))
        .clock(Clock::tokio())
}

fn per_ip(quota: impl Into<Policy>) -> RateLimitLayer<Header> {
    RateLimitLayer::new(quota)
        .key(Header::new("x-ip"))
        .clock(Clock::tokio())
}

pub(crate) async fn send<S, B>(svc: &mut S, r: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(r).await.unwrap().status()
}

/// What is left of `layer`'s policy `name` for `key`, per quota.
fn left(layer: &RateLimitLayer<Header>, name: &str, key: &str) -> Vec<u64> {
    let limiter = layer.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = key.as_bytes().into();
    limiter
        .peek(&key)
        .states()
        .iter()
        .map(|s| s.remaining())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Over both stores (`tests/common/stores.rs`): the outer layers on the store under test, the
// inner ones in memory unless they are on it too; the manual clock.

crate::over_both_stores!(
    an_inner_rate_limit_gives_back_the_outer_quota,
    the_other_way_round_an_inner_key_quota_gives_back_the_outer_ip_limit,
    several_quotas_and_a_cost_above_one_are_given_back_together,
    a_missing_key_inside_gives_back_the_outer_quota,
    a_rejection_built_by_a_hook_inside_still_gives_back,
    a_429_from_the_handler_itself_is_not_given_back,
    three_layers_deep_every_outer_layer_gives_back,
    a_refund_racing_admissions_on_the_same_key_keeps_them(
        flavor = "multi_thread",
        worker_threads = 2
    ),
);

/// Keyed by `x-api-key`, on the manual clock `clock`.
fn by_key(quota: impl Into<Policy>, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(quota)
        .key(Header::new("x-api-key"))
        .clock(clock.clone())
}

/// Keyed by `x-ip`, on the manual clock `clock`.
fn by_ip(quota: impl Into<Policy>, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(quota)
        .key(Header::new("x-ip"))
        .clock(clock.clone())
}

/// The handler, answering `200`.
fn served() -> Boxed {
    Boxed::new(Handler::default())
}

fn to(api_key: &str, ip: &str) -> Request<()> {
    Request::post("/login")
        .header("x-api-key", api_key)
        .header("x-ip", ip)
        .body(())
        .unwrap()
}

async fn status(svc: &Boxed, r: Request<()>) -> StatusCode {
    svc.clone().oneshot(r).await.unwrap().status()
}

async fn an_inner_rate_limit_gives_back_the_outer_quota(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("daily", Quota::per_day(3)), &clock));
    let inner = by_ip(Policy::new("login", Quota::per_hour(1)), &clock);
    let svc = s.around(&outer, stores::around(&inner, served()));

    assert_eq!(status(&svc, to("k", "a")).await, StatusCode::OK);
    for _ in 0..5 {
        let refused = status(&svc, to("k", "a")).await;
        assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    }
    // Only the one request served used the daily quota.
    assert_eq!(s.left(&outer, "daily", "k").await, vec![2]);
    assert_eq!(status(&svc, to("k", "b")).await, StatusCode::OK);
    assert_eq!(status(&svc, to("k", "c")).await, StatusCode::OK);
    let spent = status(&svc, to("k", "d")).await;
    assert_eq!(spent, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.left(&outer, "daily", "k").await, vec![0]);
}

async fn the_other_way_round_an_inner_key_quota_gives_back_the_outer_ip_limit(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_ip(Policy::new("login", Quota::per_hour(1)), &clock));
    let inner = s.on(by_key(Policy::new("daily", Quota::per_day(1)), &clock));
    let svc = s.around(&outer, s.around(&inner, served()));

    assert_eq!(status(&svc, to("k1", "a")).await, StatusCode::OK);
    // k1 has used its day: the request from b is rejected inside, and b keeps its login (a
    // cached rejection of b, on Redis, does not outlive the give-back).
    let inside = status(&svc, to("k1", "b")).await;
    assert_eq!(inside, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.left(&outer, "login", "b").await, vec![1]);
    assert_eq!(status(&svc, to("k2", "b")).await, StatusCode::OK);
    assert_eq!(s.left(&outer, "login", "b").await, vec![0]);
    assert_eq!(s.left(&inner, "daily", "k2").await, vec![0]);
    // An outer rejection is not a give-back: c stays spent.
    assert_eq!(status(&svc, to("k3", "c")).await, StatusCode::OK);
    let outside = status(&svc, to("k4", "c")).await;
    assert_eq!(outside, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.left(&outer, "login", "c").await, vec![0]);
}

async fn several_quotas_and_a_cost_above_one_are_given_back_together(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(
        Policy::new("api", Quota::per_minute(6)).quota(Quota::per_hour(10).named("hourly")),
        &clock,
    )
    .cost(|_| 2));
    let inner = by_ip(Policy::new("login", Quota::per_hour(1)), &clock);
    let svc = s.around(&outer, stores::around(&inner, served()));

    assert_eq!(status(&svc, to("k", "a")).await, StatusCode::OK);
    assert_eq!(s.left(&outer, "api", "k").await, vec![4, 8]);
    for _ in 0..3 {
        let refused = status(&svc, to("k", "a")).await;
        assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(s.left(&outer, "api", "k").await, vec![4, 8]);
    // The next served request takes both quotas again.
    assert_eq!(status(&svc, to("k", "b")).await, StatusCode::OK);
    assert_eq!(s.left(&outer, "api", "k").await, vec![2, 6]);
}

async fn a_missing_key_inside_gives_back_the_outer_quota(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("api", Quota::per_hour(3)), &clock));
    let inner = RateLimitLayer::new(Quota::per_hour(5))
        .key(Header::new("x-user"))
        .clock(clock)
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let svc = s.around(&outer, stores::around(&inner, served()));
    for _ in 0..5 {
        assert_eq!(status(&svc, to("k", "a")).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(s.left(&outer, "api", "k").await, vec![3]);
}

async fn a_rejection_built_by_a_hook_inside_still_gives_back(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("api", Quota::per_hour(3)), &clock));
    let hook = OnReject::new(|r| {
        let mut resp = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
        *resp.status_mut() = r.status();
        resp
    });
    let inner = by_ip(Policy::new("login", Quota::per_hour(1)), &clock).on_reject(hook);
    let svc = s.around(&outer, stores::around(&inner, served()));
    assert_eq!(status(&svc, to("k", "a")).await, StatusCode::OK);
    let refused = status(&svc, to("k", "a")).await;
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.left(&outer, "api", "k").await, vec![2]);
}

async fn a_429_from_the_handler_itself_is_not_given_back(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("api", Quota::per_hour(3)), &clock));
    let busy = Boxed::new(tower::service_fn(|_: Request<()>| async {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"busy")));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        Ok::<_, Infallible>(resp)
    }));
    let svc = s.around(&outer, busy);
    for _ in 0..2 {
        let own = status(&svc, to("k", "a")).await;
        assert_eq!(own, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(s.left(&outer, "api", "k").await, vec![1]);
}

async fn three_layers_deep_every_outer_layer_gives_back(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("daily", Quota::per_day(3)), &clock));
    let middle = s.on(by_ip(Policy::new("ip", Quota::per_hour(3)), &clock));
    let inner = RateLimitLayer::new(Policy::new("global", Quota::per_hour(1))).clock(clock);
    let svc = s.around(&outer, s.around(&middle, stores::around(&inner, served())));
    assert_eq!(status(&svc, to("k", "a")).await, StatusCode::OK);
    let refused = status(&svc, to("k", "a")).await;
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.left(&outer, "daily", "k").await, vec![2]);
    assert_eq!(s.left(&middle, "ip", "a").await, vec![2]);
}

async fn a_refund_racing_admissions_on_the_same_key_keeps_them(s: &impl Store) {
    let (clock, _time) = manual();
    let outer = s.on(by_key(Policy::new("api", Quota::per_hour(20)), &clock));
    // Every request without an ip is rejected inside; the others are served.
    let inner = by_ip(Policy::new("login", Quota::per_hour(1000)), &clock)
        .on_missing_key(MissingKey::Reject(StatusCode::FORBIDDEN));
    let svc = s.around(&outer, stores::around(&inner, served()));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let r = if i % 2 == 0 {
                    to("k", &format!("ip{i}"))
                } else {
                    Request::post("/login")
                        .header("x-api-key", "k")
                        .body(())
                        .unwrap()
                };
                svc.oneshot(r).await.unwrap().status()
            })
        })
        .collect();
    let mut served = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::OK {
            served += 1;
        }
    }
    assert_eq!(served, 10);
    assert_eq!(s.left(&outer, "api", "k").await, vec![10]);
}

// ---------------------------------------------------------------------------------------------
// In memory: a give-back decided while another request of the key is in flight, and the
// concurrency and shaping layers inside, on tokio's paused clock.

#[tokio::test(start_paused = true)]
async fn a_refund_after_time_has_passed_never_gives_more_than_the_burst() {
    let outer = per_key(Policy::new("api", Quota::per_second(1).burst(2)));
    let inner = per_ip(Policy::new("login", Quota::per_hour(1)));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    // Ahead by 1 s; the inner rejection comes when the time has passed: nothing to give back.
    let slow = svc.ready().await.unwrap().call(req("k", "a"));
    assert_eq!(left(&outer, "api", "k"), vec![0]);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(slow.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&outer, "api", "k"), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn a_refund_racing_another_admission_on_the_key_keeps_that_admission() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let inner = per_ip(Policy::new("login", Quota::per_hour(1)));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    // Both are admitted by the outer layer before the first one's rejection comes back.
    let rejected = svc.ready().await.unwrap().call(req("k", "a"));
    let served = svc.ready().await.unwrap().call(req("k", "b"));
    assert_eq!(left(&outer, "api", "k"), vec![0]);
    assert_eq!(
        rejected.await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(served.await.unwrap().status(), StatusCode::OK);
    assert_eq!(left(&outer, "api", "k"), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn a_full_shaping_queue_inside_gives_back_the_outer_quota() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let inner = ShapeLayer::new(Quota::per_hour(1)).max_wait(Duration::from_secs(1));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    let status = send(&mut svc, req("k", "a")).await;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status}"
    );
    assert_eq!(left(&outer, "api", "k"), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_rejection_inside_gives_back_the_outer_quota() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let inner = ConcurrencyLimitLayer::new(1);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let handler = tower::service_fn(move |_req: Request<Body>| {
        let rx = rx.clone();
        async move {
            if let Some(rx) = rx.lock().await.take() {
                let _ = rx.await;
            }
            Ok::<_, Infallible>(Response::new(Body::from("ok")))
        }
    });
    let mut svc = outer.clone().layer(inner.layer(handler));
    let held = tokio::spawn(svc.ready().await.unwrap().call(req("k", "a")));
    tokio::task::yield_now().await;
    let status = send(&mut svc, req("k", "a")).await;
    assert!(
        status.is_client_error() || status.is_server_error(),
        "{status}"
    );
    assert_eq!(left(&outer, "api", "k"), vec![2]);
    tx.send(()).unwrap();
    assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(left(&outer, "api", "k"), vec![2]);
}
