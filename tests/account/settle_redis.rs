//! Limits that learn from the response, where only Redis has something to say (the rules
//! both stores keep run over both in `settle.rs`, whose handler and requests these cases
//! share): the deny cache, a settlement Redis does not answer, the log's members, and a key
//! Redis lost between the reservation and the settlement.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis").

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::future::Future;
use std::task::Context;
use std::time::Duration;

use common::redis_server::RedisServer;
use http::StatusCode;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::RedisStore;
use tollgate::{Clock, ManualClock, Policy, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

use crate::settle::{call, field, req, Handler};

type Limit = RateLimitLayer<Header, RedisStore>;

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

fn on(store: RedisStore, policy: impl Into<Policy>) -> (Limit, ManualClock) {
    let (clock, hand) = Clock::manual();
    let layer = RateLimitLayer::new(policy)
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(store);
    (layer, hand)
}

async fn left(layer: &Limit, name: &str, key: &str) -> Vec<u64> {
    let limiter = layer.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = key.as_bytes().into();
    let d = limiter.peek(&key).await;
    d.states().iter().map(|s| s.remaining()).collect()
}

fn failures(store: RedisStore, limit: u32) -> (Limit, ManualClock) {
    let (layer, hand) = on(store, Policy::new("failures", Quota::per_minute(limit)));
    (
        layer.count_if(|res| matches!(res.status.as_u16(), 401 | 403)),
        hand,
    )
}

fn tokens(store: RedisStore, estimate: u32) -> (Limit, ManualClock) {
    let (layer, hand) = on(store, Policy::new("tokens", Quota::per_minute(100)));
    (layer.cost(move |_| estimate).settle(ActualCost::of), hand)
}

#[tokio::test]
async fn successes_give_their_reservation_back_on_redis() {
    let server = RedisServer::start();
    let (limit, _hand) = failures(store(&server).await, 3);
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    for _ in 0..10 {
        let resp = call(&mut svc, req("k", 200, Some("1"))).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(field(&resp, "ratelimit"), Some(r#""failures";r=3;t=0"#));
    }
    for _ in 0..3 {
        assert_eq!(call(&mut svc, req("k", 403, Some("1"))).await.status(), 403);
    }
    let resp = call(&mut svc, req("k", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("20"));
}

#[tokio::test]
async fn a_charge_on_a_new_redis_key_of_two_quotas_moves_both() {
    let server = RedisServer::start();
    let (limit, _hand) = on(
        store(&server).await,
        Policy::new("tokens", Quota::per_minute(100)).quota(Quota::per_hour(1000)),
    );
    let limit = limit.cost(|_| 0).settle(ActualCost::of);
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    call(&mut svc, req("new", 200, Some("7"))).await;
    assert_eq!(left(&limit, "tokens", "new").await, [93, 993]);
}

#[tokio::test]
async fn a_cached_rejection_does_not_outlive_a_settlement_that_gives_back() {
    let server = RedisServer::start();
    let (limit, _hand) = failures(store(&server).await.deny_cache(1_000), 1);
    let handler = Handler::gated();
    let mut svc = limit.clone().layer(handler.clone());
    // The only unit is held by a request in flight; the next one is rejected, and cached.
    let mut other = svc.clone();
    let mut first = Box::pin(call(&mut other, req("k", 200, Some("1"))));
    let waker = futures_util::task::noop_waker();
    while handler.calls() == 0 {
        assert!(first
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        tokio::task::yield_now().await;
    }
    let resp = call(&mut svc, req("k", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let cached = limit.limiter("failures").unwrap().unwrap();
    let before = server.calls("evalsha");
    assert_eq!(call(&mut svc, req("k", 200, Some("1"))).await.status(), 429);
    assert_eq!(server.calls("evalsha"), before);
    assert_eq!(cached.local_rejections(), 1);
    // The request in flight succeeds: its unit comes back, and so does the key.
    handler.gate.add_permits(10);
    assert_eq!(first.await.status(), 200);
    assert_eq!(call(&mut svc, req("k", 200, Some("1"))).await.status(), 200);
}

#[tokio::test]
async fn a_settlement_redis_does_not_answer_leaves_the_reservation_and_its_fields() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(200));
    let (limit, _hand) = tokens(store, 10);
    let handler = Handler::gated();
    let mut svc = limit.clone().layer(handler.clone());
    let mut fut = Box::pin(call(&mut svc, req("k", 200, Some("50"))));
    let waker = futures_util::task::noop_waker();
    while handler.calls() == 0 {
        assert!(fut
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        tokio::task::yield_now().await;
    }
    server.pause();
    handler.gate.add_permits(1);
    let resp = fut.await;
    server.resume();
    assert_eq!(resp.status(), 200);
    assert_eq!(field(&resp, "ratelimit"), Some(r#""tokens";r=90;t=6"#));
    // The script may have reached Redis before the timeout: applied once, or not at all.
    let now = left(&limit, "tokens", "k").await;
    assert!(now == [90] || now == [50], "{now:?}");
}

/// A huge charge on a log logs at most its limit: one script call, no flood of entries.
#[tokio::test]
async fn a_huge_charge_on_a_redis_log_keeps_at_most_its_limit() {
    let server = RedisServer::start();
    let minute = Duration::from_secs(60);
    let (limit, _hand) = on(
        store(&server).await,
        Policy::new("huge", Quota::sliding_log(10, minute)),
    );
    let limit = limit.cost(|_| 1).settle(ActualCost::of);
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    assert_eq!(
        call(&mut svc, req("k", 200, Some(&u32::MAX.to_string())))
            .await
            .status(),
        200
    );
    let key = limit
        .limiter("huge")
        .unwrap()
        .unwrap()
        .redis_key(&Box::from(&b"k"[..]));
    let key = String::from_utf8(key).unwrap();
    // The reservation's entry, one entry for the charge (whole), and the
    // member that holds the words: however large the cost.
    let members = server.cli(&["ZCARD", &key]).unwrap();
    assert_eq!(members.trim(), "3");
}

/// Redis loses the key (a restart without persistence, `FLUSHALL`, an eviction) between the
/// reservation and the settlement: the settlement neither fails nor invents a debt. What was
/// reserved is gone with the state; a refund leaves the key as new (never better than new),
/// and a charge takes only the difference beyond the reservation. Every kind of quota.
#[tokio::test]
async fn a_key_lost_between_reservation_and_settlement_is_settled_from_nothing() {
    let server = RedisServer::start();
    let minute = Duration::from_secs(60);
    for (name, quota) in [
        ("gcra", Quota::per_minute(100)),
        ("fixed", Quota::fixed_window(100, minute)),
        ("log", Quota::sliding_log(100, minute)),
        ("counter", Quota::sliding_window(100, minute)),
    ] {
        for (actual, left_after) in [(5u32, 100u64), (80, 30)] {
            let (limit, _hand) = on(store(&server).await, Policy::new(name, quota.clone()));
            let limit = limit.cost(|_| 10).settle(ActualCost::of);
            let handler = Handler::gated();
            let svc = limit.clone().layer(handler.clone());
            let key = format!("lost-{actual}");
            let task = tokio::spawn(svc.oneshot(req(&key, 200, Some(&actual.to_string()))));
            // The request has reserved 10 and is in the handler; Redis forgets everything.
            tokio::time::timeout(Duration::from_secs(10), async {
                while handler.calls() == 0 {
                    handler.arrived.notified().await;
                }
            })
            .await
            .expect("the request reaches the handler");
            assert_eq!(left(&limit, name, &key).await, [90], "{name}");
            server.cli(&["FLUSHALL"]).expect("FLUSHALL");
            handler.gate.add_permits(1);
            let resp = task.await.unwrap().unwrap();
            assert_eq!(resp.status(), 200, "{name} {actual}");
            assert_eq!(
                left(&limit, name, &key).await,
                [left_after],
                "{name}, actual {actual}"
            );
        }
    }
}
