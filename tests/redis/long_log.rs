//! A sliding log of 9 001 entries (of a log's most, 10 000 units) through a settling layer, on
//! Redis beside memory in lockstep: a request of cost 3 held by its handler while 9 000 others
//! are admitted (some of cost 2 settling for 1, given back from the newest entry), then settled for less itself, which
//! gives back from the oldest entry and rewrites every later one in Redis. Every response on
//! Redis has the status, `RateLimit` and `Retry-After` of the same response on memory, and
//! the log keeps every unit: the one that fills what remains is admitted, the next refused.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis"): both stores keep the same
//! account, whatever the log's length.
#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::redis_server::RedisServer;
use http::{Request, Response};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::RedisStore;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type Svc = BoxCloneSyncService<Request<()>, Response<Full<Bytes>>, Infallible>;

/// Answers with the cost in `x-actual`; a request to `/slow` first waits for the gate.
fn handler(gate: Arc<Semaphore>, calls: Arc<AtomicUsize>) -> Svc {
    Svc::new(tower::service_fn(move |req: Request<()>| {
        let (gate, calls) = (gate.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if req.uri().path() == "/slow" {
                gate.acquire().await.unwrap().forget();
            }
            let actual = req
                .headers()
                .get("x-actual")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            let mut resp = Response::new(Full::new(Bytes::new()));
            if let Some(a) = actual {
                resp.extensions_mut().insert(ActualCost(a));
            }
            Ok::<_, Infallible>(resp)
        }
    }))
}

fn req(path: &str, cost: u32, actual: u32) -> Request<()> {
    Request::get(path)
        .header("x-key", "k")
        .header("x-cost", cost.to_string())
        .header("x-actual", actual.to_string())
        .body(())
        .unwrap()
}

/// Status, `RateLimit` and `Retry-After` of a response.
fn seen(resp: &Response<Full<Bytes>>) -> (u16, String, String) {
    let field = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    (
        resp.status().as_u16(),
        field("ratelimit"),
        field("retry-after"),
    )
}

#[tokio::test]
async fn a_request_settled_after_nine_thousand_others_gives_back_from_the_oldest_entry_as_memory_does(
) {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, hand) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new(
        "long",
        Quota::sliding_log(10_000, Duration::from_secs(3_600)),
    ))
    .key(Header::new("x-key"))
    .cost(|h| {
        h.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
    .settle(ActualCost::of)
    .clock(clock);
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let memory = Svc::new(layer.layer(handler(gate.clone(), calls.clone())));
    let redis = Svc::new(
        layer
            .clone()
            .store(store)
            .layer(handler(gate.clone(), calls.clone())),
    );
    // The slow request reserves 3 on each store, and will use 1.
    let slow: Vec<_> = [&memory, &redis]
        .into_iter()
        .map(|svc| tokio::spawn(svc.clone().oneshot(req("/slow", 3, 1))))
        .collect();
    while calls.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    let mut used = 3u64;
    for i in 0..9_000u32 {
        if i % 10 == 0 {
            hand.advance(Duration::from_millis(1));
        }
        // One in ten costs 2, and one in seventy of those uses 1.
        let cost = if i % 10 == 0 { 2 } else { 1 };
        let actual = if i % 70 == 0 { 1 } else { cost };
        let m = memory
            .clone()
            .oneshot(req("/", cost, actual))
            .await
            .unwrap();
        let r = redis.clone().oneshot(req("/", cost, actual)).await.unwrap();
        assert_eq!(seen(&r), seen(&m), "request {i}");
        assert_eq!(m.status(), 200, "request {i}");
        used += u64::from(actual);
    }
    // The slow request uses 1 of its 3: 2 come back from the oldest entry.
    gate.add_permits(2);
    for handle in slow {
        let resp = handle.await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
    }
    used -= 2;
    hand.advance(Duration::from_millis(1));
    assert_eq!(used, 9_772);
    let left = u32::try_from(10_000 - used).unwrap();
    let m = memory.clone().oneshot(req("/", left, left)).await.unwrap();
    let r = redis.clone().oneshot(req("/", left, left)).await.unwrap();
    assert_eq!(seen(&r), seen(&m), "the request of what remains");
    assert_eq!(m.status(), 200, "{:?}", seen(&m));
    let m = memory.clone().oneshot(req("/", 1, 1)).await.unwrap();
    let r = redis.clone().oneshot(req("/", 1, 1)).await.unwrap();
    assert_eq!(seen(&r), seen(&m), "the request past the limit");
    assert_eq!(m.status(), 429, "{:?}", seen(&m));
}
