#![cfg(feature = "axum")]
//! Stacked layers are all or nothing: a request that a layer inside rejects gives back what
//! the rate-limit layers outside took from it, as several quotas in one layer already do.
//!
//! Pins docs/design.md section 3 ("Stacked layers are all or nothing").

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate::key::Header;
use tollgate::response::OnReject;
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Layer, Service, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

/// A handler that answers 429 itself, for its own reasons.
async fn busy(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut resp = Response::new(Body::from("busy"));
    *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    Ok(resp)
}

fn req(api_key: &str, ip: &str) -> Request<Body> {
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

async fn send<S, B>(svc: &mut S, r: Request<Body>) -> StatusCode
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

#[tokio::test(start_paused = true)]
async fn an_inner_rate_limit_gives_back_the_outer_quota() {
    let outer = per_key(Policy::new("daily", Quota::per_day(3)));
    let inner = per_ip(Policy::new("login", Quota::per_hour(1)));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));

    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(
            send(&mut svc, req("k", "a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    // Only the one request served used the daily quota.
    assert_eq!(left(&outer, "daily", "k"), vec![2]);
    assert_eq!(send(&mut svc, req("k", "b")).await, StatusCode::OK);
    assert_eq!(send(&mut svc, req("k", "c")).await, StatusCode::OK);
    assert_eq!(
        send(&mut svc, req("k", "d")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "daily", "k"), vec![0]);
}

#[tokio::test(start_paused = true)]
async fn the_other_way_round_an_inner_key_quota_gives_back_the_outer_ip_limit() {
    let outer = per_ip(Policy::new("login", Quota::per_hour(1)));
    let inner = per_key(Policy::new("daily", Quota::per_day(1)));
    let mut svc = outer
        .clone()
        .layer(inner.clone().layer(tower::service_fn(ok)));

    assert_eq!(send(&mut svc, req("k1", "a")).await, StatusCode::OK);
    // k1 has used its day: the request from b is rejected inside, and b keeps its login.
    assert_eq!(
        send(&mut svc, req("k1", "b")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "login", "b"), vec![1]);
    assert_eq!(send(&mut svc, req("k2", "b")).await, StatusCode::OK);
    assert_eq!(left(&outer, "login", "b"), vec![0]);
    assert_eq!(left(&inner, "daily", "k2"), vec![0]);
}

#[tokio::test(start_paused = true)]
async fn several_quotas_and_a_cost_above_one_are_given_back_together() {
    let outer = per_key(
        Policy::new("api", Quota::per_minute(6)).quota(Quota::per_hour(10).named("hourly")),
    )
    .cost(|_| 2);
    let inner = per_ip(Policy::new("login", Quota::per_hour(1)));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));

    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    assert_eq!(left(&outer, "api", "k"), vec![4, 8]);
    for _ in 0..3 {
        assert_eq!(
            send(&mut svc, req("k", "a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(left(&outer, "api", "k"), vec![4, 8]);
}

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
async fn a_missing_key_inside_gives_back_the_outer_quota() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let inner = RateLimitLayer::new(Quota::per_hour(5))
        .key(Header::new("x-user"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    for _ in 0..5 {
        assert_eq!(
            send(&mut svc, req("k", "a")).await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(left(&outer, "api", "k"), vec![3]);
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

#[tokio::test(start_paused = true)]
async fn a_rejection_built_by_a_hook_inside_still_gives_back() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let hook = OnReject::new(|r| {
        let mut resp = Response::new(Bytes::from_static(b"{\"error\":\"slow down\"}"));
        *resp.status_mut() = r.status();
        resp
    });
    let inner = per_ip(Policy::new("login", Quota::per_hour(1))).on_reject(hook);
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    assert_eq!(
        send(&mut svc, req("k", "a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "api", "k"), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn a_429_from_the_handler_itself_is_not_given_back() {
    let outer = per_key(Policy::new("api", Quota::per_hour(3)));
    let mut svc = outer.clone().layer(tower::service_fn(busy));
    assert_eq!(
        send(&mut svc, req("k", "a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&mut svc, req("k", "a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "api", "k"), vec![1]);
}

#[tokio::test(start_paused = true)]
async fn three_layers_deep_every_outer_layer_gives_back() {
    let outer = per_key(Policy::new("daily", Quota::per_day(3)));
    let middle = per_ip(Policy::new("ip", Quota::per_hour(3)));
    let inner =
        RateLimitLayer::new(Policy::new("global", Quota::per_hour(1))).clock(Clock::tokio());
    let mut svc = outer
        .clone()
        .layer(middle.clone().layer(inner.layer(tower::service_fn(ok))));
    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    assert_eq!(
        send(&mut svc, req("k", "a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "daily", "k"), vec![2]);
    assert_eq!(left(&middle, "ip", "a"), vec![2]);
}
