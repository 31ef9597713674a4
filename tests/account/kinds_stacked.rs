//! Stacked layers give back what a window quota took, for every kind, in memory and in Redis:
//! a request rejected inside consumes nothing outside (the log loses its newest entries, the
//! counters their units).
//!
//! Pins docs/design.md section 1 ("Other kinds") and section 3 ("Stacked layers are all or
//! nothing").

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::time::Duration;

use axum::body::Body;
use common::redis_server::RedisServer;
use http::{Request, StatusCode};
use tollgate::key::Header;
use tollgate::redis::RedisStore;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::Layer;

use crate::stacked::{ok, send};

fn req(ip: &str) -> Request<Body> {
    Request::post("/")
        .header("x-user", "u")
        .header("x-ip", ip)
        .body(Body::empty())
        .unwrap()
}

/// Every kind at once, each with room for three requests of cost 2.
fn outer_policy() -> Policy {
    let minute = Duration::from_secs(60);
    Policy::new("outer", Quota::new(6, minute))
        .quota(Quota::fixed_window(6, minute).named("fixed"))
        .quota(Quota::sliding_log(6, minute).named("log"))
        .quota(Quota::sliding_window(6, minute).named("counter"))
}

fn inner(clock: Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(Policy::new("per-ip", Quota::per_hour(1)))
        .key(Header::new("x-ip"))
        .clock(clock)
}

#[tokio::test]
async fn an_inner_rejection_gives_back_every_kind_in_memory() {
    let (clock, _time) = Clock::manual();
    let outer = RateLimitLayer::new(outer_policy())
        .key(Header::new("x-user"))
        .cost(|_| 2)
        .clock(clock.clone());
    let mut svc = outer
        .clone()
        .layer(inner(clock).layer(tower::service_fn(ok)));
    let left = |outer: &RateLimitLayer<Header>| {
        let d = outer
            .limiter("outer")
            .unwrap()
            .unwrap()
            .peek(&"u".as_bytes().into());
        d.states().iter().map(|s| s.remaining()).collect::<Vec<_>>()
    };
    assert_eq!(send(&mut svc, req("a")).await, StatusCode::OK);
    assert_eq!(left(&outer), [4, 4, 4, 4]);
    for _ in 0..5 {
        assert_eq!(
            send(&mut svc, req("a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(left(&outer), [4, 4, 4, 4]);
    assert_eq!(send(&mut svc, req("b")).await, StatusCode::OK);
    assert_eq!(send(&mut svc, req("c")).await, StatusCode::OK);
    assert_eq!(left(&outer), [0, 0, 0, 0]);
}

#[tokio::test]
async fn an_inner_rejection_gives_back_every_kind_in_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let (clock, _time) = Clock::manual();
    let outer = RateLimitLayer::new(outer_policy())
        .key(Header::new("x-user"))
        .cost(|_| 2)
        .clock(clock.clone())
        .store(store);
    let mut svc = outer
        .clone()
        .layer(inner(clock).layer(tower::service_fn(ok)));
    let left = |outer: RateLimitLayer<Header, RedisStore>| async move {
        let limiter = outer.limiter("outer").unwrap().unwrap();
        let d = limiter.peek(&"u".as_bytes().into()).await;
        d.states().iter().map(|s| s.remaining()).collect::<Vec<_>>()
    };
    assert_eq!(send(&mut svc, req("a")).await, StatusCode::OK);
    assert_eq!(left(outer.clone()).await, [4, 4, 4, 4]);
    for _ in 0..5 {
        assert_eq!(
            send(&mut svc, req("a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(left(outer.clone()).await, [4, 4, 4, 4]);
    assert_eq!(send(&mut svc, req("b")).await, StatusCode::OK);
    assert_eq!(send(&mut svc, req("c")).await, StatusCode::OK);
    assert_eq!(left(outer).await, [0, 0, 0, 0]);
}
