//! Stacked layers on Redis are all or nothing: a request rejected by a layer inside gives back
//! what an outer Redis-backed layer took, in one script call, and a cached rejection of the key
//! does not outlive the refund.
//!
//! Pins docs/design.md section 3 ("Stacked layers are all or nothing", "Redis").

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use common::redis_server::RedisServer;
use http::{Request, Response, StatusCode};
use tollgate::key::Header;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn req(api_key: &str, ip: &str) -> Request<Body> {
    Request::post("/login")
        .header("x-api-key", api_key)
        .header("x-ip", ip)
        .body(Body::empty())
        .unwrap()
}

async fn send<S, B>(svc: &mut S, r: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(r).await.unwrap().status()
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// What is left of the layer's policy `name` for `key`, per quota, as Redis has it.
async fn left(layer: &RateLimitLayer<Header, RedisStore>, name: &str, key: &str) -> Vec<u64> {
    let limiter = layer.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = key.as_bytes().into();
    let d = limiter.peek(&key).await;
    d.states().iter().map(|s| s.remaining()).collect()
}

#[tokio::test]
async fn an_inner_memory_limit_gives_back_the_outer_redis_quota() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let outer = RateLimitLayer::new(
        Policy::new("daily", Quota::per_day(4)).quota(Quota::per_hour(6).named("hourly")),
    )
    .key(Header::new("x-api-key"))
    .cost(|_| 2)
    .clock(clock.clone())
    .store(store(&server).await);
    let inner = RateLimitLayer::new(Policy::new("login", Quota::per_hour(1)))
        .key(Header::new("x-ip"))
        .clock(clock);
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));

    assert_eq!(send(&mut svc, req("k", "a")).await, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            send(&mut svc, req("k", "a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(left(&outer, "daily", "k").await, vec![2, 4]);
    assert_eq!(send(&mut svc, req("k", "b")).await, StatusCode::OK);
    assert_eq!(left(&outer, "daily", "k").await, vec![0, 2]);
}

#[tokio::test]
async fn an_inner_redis_limit_gives_back_the_outer_redis_limit() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let shared = store(&server).await.deny_cache(1_000);
    let outer = RateLimitLayer::new(Policy::new("login", Quota::per_hour(1)))
        .key(Header::new("x-ip"))
        .clock(clock.clone())
        .store(shared.clone());
    let inner = RateLimitLayer::new(Policy::new("daily", Quota::per_day(1)))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(shared);
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));

    assert_eq!(send(&mut svc, req("k1", "a")).await, StatusCode::OK);
    // k1 has used its day: b's request is rejected inside, and b keeps its login.
    assert_eq!(
        send(&mut svc, req("k1", "b")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "login", "b").await, vec![1]);
    assert_eq!(send(&mut svc, req("k2", "b")).await, StatusCode::OK);
    assert_eq!(left(&outer, "login", "b").await, vec![0]);
    // An outer rejection is not a refund: c stays spent.
    assert_eq!(send(&mut svc, req("k3", "c")).await, StatusCode::OK);
    assert_eq!(
        send(&mut svc, req("k4", "c")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(left(&outer, "login", "c").await, vec![0]);
}

#[tokio::test]
async fn a_store_outage_inside_gives_back_the_outer_quota() {
    let server = RedisServer::start();
    let mut down = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let outer = RateLimitLayer::new(Policy::new("daily", Quota::per_day(3)))
        .key(Header::new("x-api-key"))
        .clock(clock.clone())
        .store(store(&server).await);
    let closed = RedisStore::connect(&down.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(200))
        .on_failure(FailMode::Closed);
    down.kill();
    let inner = RateLimitLayer::new(Policy::new("login", Quota::per_hour(5)))
        .key(Header::new("x-ip"))
        .clock(clock)
        .store(closed);
    let mut svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    for _ in 0..3 {
        assert_eq!(
            send(&mut svc, req("k", "a")).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    assert_eq!(left(&outer, "daily", "k").await, vec![3]);
}

#[tokio::test]
async fn a_refund_racing_admissions_on_the_same_redis_key_keeps_them() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let outer = RateLimitLayer::new(Policy::new("api", Quota::per_hour(20)))
        .key(Header::new("x-api-key"))
        .clock(clock.clone())
        .store(store(&server).await);
    // Every request from ip "no" is rejected inside; the others are served.
    let inner = RateLimitLayer::new(Policy::new("login", Quota::per_hour(1000)))
        .key(Header::new("x-ip"))
        .on_missing_key(tollgate::MissingKey::Reject(StatusCode::FORBIDDEN))
        .clock(clock);
    let svc = outer.clone().layer(inner.layer(tower::service_fn(ok)));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let r = if i % 2 == 0 {
                req("k", &format!("ip{i}"))
            } else {
                Request::post("/login")
                    .header("x-api-key", "k")
                    .body(Body::empty())
                    .unwrap()
            };
            svc.oneshot(r).await.unwrap().status()
        }));
    }
    let mut served = 0;
    for t in tasks {
        if t.await.unwrap() == StatusCode::OK {
            served += 1;
        }
    }
    assert_eq!(served, 10);
    assert_eq!(left(&outer, "api", "k").await, vec![10]);
}
