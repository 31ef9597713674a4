//! Limits that learn from the response, on Redis: the same rules as in memory (the cases both
//! stores share run on both in `settle.rs`), each settlement one script call that gives back
//! or charges (even over the limit) the difference.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis").

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use common::redis_server::RedisServer;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use tokio::sync::{Notify, Semaphore};
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::RedisStore;
use tollgate::{Clock, ManualClock, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

type Limit = RateLimitLayer<Header, RedisStore>;

fn req(key: &str, status: u16, tokens: u32) -> Request<Body> {
    Request::post("/")
        .header("x-api-key", key)
        .header("x-status", status.to_string())
        .header("x-tokens", tokens.to_string())
        .body(Body::empty())
        .unwrap()
}

/// Answers with the status the request asks for and its tokens as an [`ActualCost`]; a
/// status of 999 panics. While `gate` has no permit, waits in the handler.
#[derive(Clone)]
struct Handler {
    entered: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl Handler {
    fn open() -> Self {
        let h = Self::gated();
        h.gate.add_permits(Semaphore::MAX_PERMITS / 2);
        h
    }
    fn gated() -> Self {
        Handler {
            entered: Arc::default(),
            arrived: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
    fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

impl Service<Request<Body>> for Handler {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, r: Request<Body>) -> Self::Future {
        self.entered.fetch_add(1, Ordering::SeqCst);
        self.arrived.notify_one();
        let gate = self.gate.clone();
        let status: u16 = r.headers()["x-status"].to_str().unwrap().parse().unwrap();
        let tokens: u32 = r.headers()["x-tokens"].to_str().unwrap().parse().unwrap();
        Box::pin(async move {
            drop(gate.acquire().await.unwrap());
            assert!(status != 999, "handler panicked");
            let mut resp = Response::new(Body::from("done"));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            resp.extensions_mut().insert(ActualCost(tokens));
            Ok(resp)
        })
    }
}

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

async fn call<S>(svc: &mut S, r: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(r).await.unwrap()
}

fn field<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn left(layer: &Limit, name: &str, key: &str) -> Vec<u64> {
    let limiter = layer.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = key.as_bytes().into();
    let d = limiter.peek(&key).await;
    d.states().iter().map(|s| s.remaining()).collect()
}

/// Sends `n` requests at once; the handler holds those it admits until every other one has
/// been answered, so that all of them are decided while the admitted ones are in flight.
/// Returns the statuses, sorted.
async fn parallel<S>(
    svc: &S,
    handler: &Handler,
    n: usize,
    make: impl Fn() -> Request<Body>,
) -> Vec<u16>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let svc = svc.clone();
        let r = make();
        tasks.spawn(async move { svc.oneshot(r).await.unwrap().status().as_u16() });
    }
    let mut out = Vec::with_capacity(n);
    let mut opened = false;
    while !tasks.is_empty() {
        if !opened && out.len() + handler.entered() >= n {
            handler.gate.add_permits(n);
            opened = true;
        }
        // Bounded: a test that goes wrong fails instead of hanging.
        tokio::select! {
            done = tasks.join_next() => out.push(done.unwrap().unwrap()),
            () = handler.arrived.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(30)) => panic!("a request hung"),
        }
    }
    out.sort_unstable();
    out
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
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
async fn a_hundred_parallel_wrong_passwords_on_a_limit_of_five_reach_the_handler_five_times() {
    let server = RedisServer::start();
    let (limit, _hand) = failures(store(&server).await, 5);
    let handler = Handler::gated();
    let svc = limit.clone().layer(handler.clone());
    let statuses = parallel(&svc, &handler, 100, || req("victim", 401, 1)).await;
    assert_eq!(handler.entered(), 5);
    assert_eq!(count(&statuses, 401), 5);
    assert_eq!(count(&statuses, 429), 95);
    assert_eq!(left(&limit, "failures", "victim").await, [0]);
}

#[tokio::test]
async fn successes_give_their_reservation_back_on_redis() {
    let server = RedisServer::start();
    let (limit, _hand) = failures(store(&server).await, 3);
    let mut svc = limit.clone().layer(Handler::open());
    for _ in 0..10 {
        let resp = call(&mut svc, req("k", 200, 1)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(field(&resp, "ratelimit"), Some(r#""failures";r=3;t=0"#));
    }
    for _ in 0..3 {
        assert_eq!(call(&mut svc, req("k", 403, 1)).await.status(), 403);
    }
    let resp = call(&mut svc, req("k", 200, 1)).await;
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
    let mut svc = limit.clone().layer(Handler::open());
    call(&mut svc, req("new", 200, 7)).await;
    assert_eq!(left(&limit, "tokens", "new").await, [93, 993]);
}

#[tokio::test]
async fn parallel_settlements_of_one_redis_key_add_up_exactly() {
    let server = RedisServer::start();
    let (limit, _hand) = on(
        store(&server).await,
        Policy::new("tokens", Quota::per_hour(3_600)),
    );
    let limit = limit.cost(|_| 1).settle(ActualCost::of);
    let handler = Handler::gated();
    let svc = limit.clone().layer(handler.clone());
    let statuses = parallel(&svc, &handler, 50, || req("k", 200, 30)).await;
    assert_eq!(count(&statuses, 200), 50);
    let limiter = limit.limiter("tokens").unwrap().unwrap();
    let d = limiter.peek(&Box::from(&b"k"[..])).await;
    assert_eq!(d.states()[0].reset_after(), Duration::from_secs(1_500));
}

#[tokio::test]
async fn a_cached_rejection_does_not_outlive_a_settlement_that_gives_back() {
    let server = RedisServer::start();
    let (limit, _hand) = failures(store(&server).await.deny_cache(1_000), 1);
    let handler = Handler::gated();
    let mut svc = limit.clone().layer(handler.clone());
    // The only unit is held by a request in flight; the next one is rejected, and cached.
    let mut other = svc.clone();
    let mut first = Box::pin(call(&mut other, req("k", 200, 1)));
    let waker = futures_util::task::noop_waker();
    while handler.entered() == 0 {
        assert!(first
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        tokio::task::yield_now().await;
    }
    let resp = call(&mut svc, req("k", 200, 1)).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let cached = limit.limiter("failures").unwrap().unwrap();
    let before = server.calls("evalsha");
    assert_eq!(call(&mut svc, req("k", 200, 1)).await.status(), 429);
    assert_eq!(server.calls("evalsha"), before);
    assert_eq!(cached.local_rejections(), 1);
    // The request in flight succeeds: its unit comes back, and so does the key.
    handler.gate.add_permits(10);
    assert_eq!(first.await.status(), 200);
    assert_eq!(call(&mut svc, req("k", 200, 1)).await.status(), 200);
}

#[tokio::test]
async fn a_panicking_handler_leaves_the_redis_reservation_charged() {
    let server = RedisServer::start();
    let (limit, _hand) = tokens(store(&server).await, 10);
    let mut svc = limit.clone().layer(Handler::open());
    let fut = svc.ready().await.unwrap().call(req("k", 999, 1));
    assert!(AssertUnwindSafe(fut).catch_unwind().await.is_err());
    assert_eq!(left(&limit, "tokens", "k").await, [90]);
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
    let mut fut = Box::pin(call(&mut svc, req("k", 200, 50)));
    let waker = futures_util::task::noop_waker();
    while handler.entered() == 0 {
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
    let mut svc = limit.clone().layer(Handler::open());
    assert_eq!(call(&mut svc, req("k", 200, u32::MAX)).await.status(), 200);
    let key = limit
        .limiter("huge")
        .unwrap()
        .unwrap()
        .redis_key(&Box::from(&b"k"[..]));
    let key = String::from_utf8(key).unwrap();
    // The reservation's entry, one entry for the charge (capped at the limit), and the
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
            let task = tokio::spawn(svc.oneshot(req(&key, 200, actual)));
            // The request has reserved 10 and is in the handler; Redis forgets everything.
            tokio::time::timeout(Duration::from_secs(10), async {
                while handler.entered() == 0 {
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
