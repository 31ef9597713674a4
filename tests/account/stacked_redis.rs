//! Stacked layers on Redis are all or nothing even when the store inside fails: an outage of
//! an inner Redis-backed layer gives back what an outer one took. The rules both stores keep
//! run over both in `stacked.rs`.
//!
//! Pins docs/design.md section 3 ("Stacked layers are all or nothing", "Redis").

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use http::StatusCode;
use tollgate::key::Header;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::Layer;

use crate::stacked::{ok, req, send};

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
