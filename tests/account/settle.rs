#![cfg(feature = "axum")]
//! Limits that learn from the response: the cost is reserved before the handler and settled
//! from the response head (given back, or charged even over the limit) before the response is
//! returned; a response that never comes leaves the reservation charged. The cases at the end
//! run over both stores (`tests/common/stores.rs`), the others in memory; `settle_redis.rs`
//! has what only Redis has.
//!
//! Pins docs/design.md section 3 ("An account per key").

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use crate::common::account::rig::manual;
use crate::common::stores::Store;
use axum::body::Body;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

pub(crate) fn req(key: &str, status: u16, tokens: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/")
        .header("x-api-key", key)
        .header("x-status", status.to_string());
    if let Some(t) = tokens {
        b = b.header("x-tokens", t);
    }
    b.body(Body::empty()).unwrap()
}

/// Answers with the status the request asks for, reporting the tokens it asks for in the
/// `x-tokens-used` field and as an [`ActualCost`], after `delay` (so that parallel requests
/// are all in flight at once on the paused clock) and once `gate` gives it a permit (so that
/// they are on any clock, see [`gathered`]); a status of 999 panics.
#[derive(Clone)]
pub(crate) struct Handler {
    calls: Arc<AtomicUsize>,
    delay: Duration,
    pub(crate) arrived: Arc<Notify>,
    pub(crate) gate: Arc<Semaphore>,
}

impl Handler {
    pub(crate) fn new(delay: Duration) -> Self {
        let h = Self::gated();
        h.gate.add_permits(Semaphore::MAX_PERMITS / 2);
        Handler { delay, ..h }
    }
    /// A handler that holds every request until its gate is given permits.
    pub(crate) fn gated() -> Self {
        Handler {
            calls: Arc::default(),
            delay: Duration::ZERO,
            arrived: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
    /// How many requests entered the handler.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
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
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.arrived.notify_one();
        let gate = self.gate.clone();
        let delay = self.delay;
        let status: u16 = r.headers()["x-status"].to_str().unwrap().parse().unwrap();
        let tokens = r.headers().get("x-tokens").cloned();
        Box::pin(async move {
            drop(gate.acquire().await.unwrap());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if status == 999 {
                panic!("handler panicked");
            }
            let mut resp = Response::new(Body::from("done"));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(t) = tokens {
                if let Ok(n) = t.to_str().unwrap_or("").parse::<u32>() {
                    resp.extensions_mut().insert(ActualCost(n));
                }
                resp.headers_mut().insert("x-tokens-used", t);
            }
            Ok(resp)
        })
    }
}

fn layer(policy: impl Into<Policy>) -> RateLimitLayer<Header> {
    RateLimitLayer::new(policy)
        .key(Header::new("x-api-key"))
        .clock(Clock::tokio())
}

fn failures(limit: u32) -> RateLimitLayer<Header> {
    layer(Policy::new("failures", Quota::per_minute(limit)))
        .count_if(|res| matches!(res.status.as_u16(), 401 | 403))
}

/// 100 tokens per minute (one every 600 ms, burst 100), reserving `estimate` per request and
/// settling what the handler reports.
fn tokens(estimate: u32) -> RateLimitLayer<Header> {
    layer(Policy::new("tokens", Quota::per_minute(100)))
        .cost(move |_| estimate)
        .settle(ActualCost::of)
}

pub(crate) async fn call<S>(svc: &mut S, r: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(r).await.unwrap()
}

pub(crate) fn field<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

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
async fn only_responses_that_match_are_counted() {
    let handler = Handler::new(Duration::ZERO);
    let limit = failures(3);
    let mut svc = limit.clone().layer(handler.clone());
    for _ in 0..10 {
        assert_eq!(call(&mut svc, req("k", 200, None)).await.status(), 200);
    }
    assert_eq!(left(&limit, "failures", "k"), [3]);
    for _ in 0..3 {
        assert_eq!(call(&mut svc, req("k", 401, None)).await.status(), 401);
    }
    assert_eq!(handler.calls(), 13);
    // Over the limit: rejected before the handler, successes included.
    let resp = call(&mut svc, req("k", 200, None)).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("20"));
    assert_eq!(handler.calls(), 13);
}

#[tokio::test(start_paused = true)]
async fn a_response_that_does_not_count_reports_the_state_after_its_cost_came_back() {
    let mut svc = failures(3).layer(Handler::new(Duration::ZERO));
    let ok = call(&mut svc, req("k", 200, None)).await;
    assert_eq!(field(&ok, "ratelimit"), Some(r#""failures";r=3;t=0"#));
    let failed = call(&mut svc, req("k", 403, None)).await;
    assert_eq!(field(&failed, "ratelimit"), Some(r#""failures";r=2;t=20"#));
}

/// Spawns `n` requests at once on clones of `svc` and returns their statuses, sorted.
async fn parallel<S>(svc: &S, n: usize, make: impl Fn() -> Request<Body>) -> Vec<u16>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let mut svc = svc.clone();
        let r = make();
        tasks.push(tokio::spawn(async move {
            call(&mut svc, r).await.status().as_u16()
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out.sort_unstable();
    out
}

/// Sends `n` requests at once; the gated `handler` holds those it admits until every other
/// one has been answered, so that all of them are decided while the admitted ones are in
/// flight, on any clock and store. Returns the statuses, sorted.
pub(crate) async fn gathered<S>(
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
        if !opened && out.len() + handler.calls() >= n {
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

pub(crate) fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[tokio::test(start_paused = true)]
async fn parallel_successes_hold_the_limit_while_in_flight_and_give_it_all_back() {
    let handler = Handler::new(Duration::from_secs(1));
    let limit = failures(5);
    let svc = limit.clone().layer(handler.clone());
    let statuses = parallel(&svc, 100, || req("k", 200, None)).await;
    // While five are in flight, the others are turned away: the price of never letting
    // failures slip through.
    assert_eq!(count(&statuses, 200), 5);
    assert_eq!(count(&statuses, 429), 95);
    // Once they are answered, all five came back.
    assert_eq!(left(&limit, "failures", "k"), [5]);
}

#[tokio::test(start_paused = true)]
async fn the_handler_sees_the_reservation_and_the_client_the_settled_state() {
    let limit = tokens(50);
    let seen = Arc::new(AtomicU32::new(0));
    let seen2 = seen.clone();
    let handler = tower::service_fn(move |r: Request<Body>| {
        let d = *r.extensions().get::<tollgate::Decision>().unwrap();
        seen2.store(d.remaining() as u32, Ordering::SeqCst);
        async move {
            let mut resp = Response::new(Body::empty());
            resp.extensions_mut().insert(ActualCost(20));
            Ok::<_, Infallible>(resp)
        }
    });
    let mut svc = limit.layer(handler);
    let resp = call(&mut svc, req("k", 200, None)).await;
    assert_eq!(seen.load(Ordering::SeqCst), 50);
    assert_eq!(field(&resp, "ratelimit"), Some(r#""tokens";r=80;t=12"#));
}

#[tokio::test(start_paused = true)]
async fn a_response_without_a_figure_keeps_its_reservation() {
    let limit = layer(Policy::new("tokens", Quota::per_minute(100)))
        .cost(|_| 10)
        .settle(ActualCost::header("x-tokens-used"));
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    call(&mut svc, req("k", 200, None)).await;
    assert_eq!(left(&limit, "tokens", "k"), [90]);
    // Not a number, negative, past u32::MAX: the reservation stands.
    for lie in ["lots", "-5", "4294967296", ""] {
        call(&mut svc, req("k", 200, Some(lie))).await;
    }
    assert_eq!(left(&limit, "tokens", "k"), [50]);
    call(&mut svc, req("k", 200, Some(" 0 "))).await;
    assert_eq!(left(&limit, "tokens", "k"), [50]);
    call(&mut svc, req("k", 200, Some("30"))).await;
    assert_eq!(left(&limit, "tokens", "k"), [20]);
}

#[tokio::test(start_paused = true)]
async fn count_if_and_settle_combine_whatever_the_order_of_the_calls() {
    let count = |res: &http::response::Parts| res.status.is_success();
    let a = layer(Policy::new("tokens", Quota::per_minute(100)))
        .count_if(count)
        .cost(|_| 10)
        .settle(ActualCost::of);
    let b = layer(Policy::new("tokens", Quota::per_minute(100)))
        .settle(ActualCost::of)
        .cost(|_| 10)
        .count_if(count);
    for limit in [a, b] {
        let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
        // Counts: charged what it reports.
        call(&mut svc, req("k", 200, Some("30"))).await;
        assert_eq!(left(&limit, "tokens", "k"), [70]);
        // Does not count: charged nothing, whatever it reports.
        call(&mut svc, req("k", 500, Some("30"))).await;
        assert_eq!(left(&limit, "tokens", "k"), [70]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_reservation_of_zero_is_charged_in_full_after_the_response() {
    // A new key (no entry yet), a single quota and a policy of two quotas.
    let one = tokens(0);
    let two = layer(Policy::new("tokens", Quota::per_minute(100)).quota(Quota::per_hour(1000)))
        .cost(|_| 0)
        .settle(ActualCost::of);
    for (limit, want) in [(one, vec![93]), (two, vec![93, 993])] {
        let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
        call(&mut svc, req("new", 200, Some("7"))).await;
        assert_eq!(left(&limit, "tokens", "new"), want);
    }
}

#[tokio::test(start_paused = true)]
async fn one_key_for_all_goes_into_debt_too() {
    let limit = RateLimitLayer::new(Policy::new("tokens", Quota::per_minute(100)))
        .clock(Clock::tokio())
        .cost(|_| 1)
        .settle(ActualCost::of);
    let mut svc = limit.layer(Handler::new(Duration::ZERO));
    call(&mut svc, req("any", 200, Some("200"))).await;
    let resp = call(&mut svc, req("other", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("61"));
}

/// Turns a panic of the inner service's future into a `500`, as tower-http's
/// `CatchPanicLayer` does.
#[derive(Clone)]
struct CatchPanic<S>(S);

impl<S> Service<Request<Body>> for CatchPanic<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, r: Request<Body>) -> Self::Future {
        let fut = self.0.call(r);
        Box::pin(async move {
            match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(resp) => resp,
                Err(_) => {
                    let mut resp = Response::new(Body::empty());
                    *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    Ok(resp)
                }
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_turned_into_a_response_inside_is_settled_by_the_rules() {
    let limit = failures(5);
    let mut svc = limit
        .clone()
        .layer(CatchPanic(Handler::new(Duration::ZERO)));
    let resp = call(&mut svc, req("k", 999, None)).await;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    // A 500 is not a failed login: given back.
    assert_eq!(left(&limit, "failures", "k"), [5]);
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_before_the_response_leaves_the_reservation_charged() {
    let handler = Handler::new(Duration::from_secs(5));
    let limit = failures(5);
    let mut svc = limit.clone().layer(handler.clone());
    let mut fut = svc.ready().await.unwrap().call(req("k", 200, None));
    // In the handler, then dropped (the connection closed).
    let waker = futures_util::task::noop_waker();
    let pending = Pin::new(&mut fut).poll(&mut Context::from_waker(&waker));
    assert!(pending.is_pending());
    drop(fut);
    assert_eq!(handler.calls(), 1);
    assert_eq!(left(&limit, "failures", "k"), [4]);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(left(&limit, "failures", "k"), [4]);
    tokio::time::advance(Duration::from_secs(1)).await;
    // The reservation came back with time, as any request does; nothing was given twice.
    assert_eq!(left(&limit, "failures", "k"), [5]);
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_mid_way_keeps_what_the_head_settled() {
    let limit = tokens(10);
    let handler = tower::service_fn(|_r: Request<Body>| async {
        let chunks = futures_util::stream::iter(
            ["a", "b", "c"].map(|c| Ok::<_, Infallible>(bytes::Bytes::from(c))),
        );
        let mut resp = Response::new(Body::from_stream(chunks));
        resp.extensions_mut().insert(ActualCost(40));
        Ok::<_, Infallible>(resp)
    });
    let mut svc = limit.clone().layer(handler);
    let resp = call(&mut svc, req("k", 200, None)).await;
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "a");
    drop(body);
    assert_eq!(left(&limit, "tokens", "k"), [60]);
}

#[tokio::test(start_paused = true)]
async fn an_inner_rejection_gives_the_whole_reservation_back_without_asking_the_rules() {
    let asked = Arc::new(AtomicUsize::new(0));
    let asked2 = asked.clone();
    let outer = layer(Policy::new("tokens", Quota::per_minute(100)))
        .cost(|_| 10)
        .settle(move |_| {
            asked2.fetch_add(1, Ordering::SeqCst);
            Some(50)
        });
    let inner = RateLimitLayer::new(Policy::new("inner", Quota::per_hour(1)))
        .key(Header::new("x-api-key"))
        .clock(Clock::tokio());
    let mut svc = outer
        .clone()
        .layer(inner.layer(Handler::new(Duration::ZERO)));
    assert_eq!(call(&mut svc, req("k", 200, None)).await.status(), 200);
    assert_eq!(left(&outer, "tokens", "k"), [50]);
    let resp = call(&mut svc, req("k", 200, None)).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(left(&outer, "tokens", "k"), [50]);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_over_its_limit_is_rejected_before_the_handler_and_settles_nothing() {
    let handler = Handler::new(Duration::ZERO);
    let limit = tokens(60);
    let mut svc = limit.clone().layer(handler.clone());
    call(&mut svc, req("k", 200, Some("90"))).await;
    let resp = call(&mut svc, req("k", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls(), 1);
    assert_eq!(left(&limit, "tokens", "k"), [10]);
}

#[tokio::test(start_paused = true)]
async fn the_largest_actual_cost_saturates_instead_of_wrapping() {
    let limit = tokens(1);
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    let resp = call(&mut svc, req("k", 200, Some(&u32::MAX.to_string()))).await;
    assert_eq!(resp.status(), 200);
    let resp = call(&mut svc, req("k", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // 4 294 967 295 tokens at 600 ms each, less the 60 s burst.
    let want = (u64::from(u32::MAX) * 600 / 1000 - 60 + 1).to_string();
    assert_eq!(field(&resp, "retry-after"), Some(want.as_str()));
}

#[tokio::test(start_paused = true)]
async fn a_key_in_debt_rejects_even_a_request_that_reserves_nothing() {
    let handler = Handler::new(Duration::ZERO);
    let limit = tokens(0);
    let mut svc = limit.clone().layer(handler.clone());
    assert_eq!(
        call(&mut svc, req("k", 200, Some("250"))).await.status(),
        200
    );
    let resp = call(&mut svc, req("k", 200, Some("1"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("90"));
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_debt_charged_from_the_response_outlives_a_change_of_quota() {
    let limit = tokens(10);
    let handle = limit.handle().unwrap();
    let mut svc = limit.clone().layer(Handler::new(Duration::ZERO));
    // Reserved 10, used 250: 150 s of tokens at 100 a minute, 90 s beyond the 60 s burst.
    let resp = call(&mut svc, req("k", 200, Some("250"))).await;
    assert_eq!(resp.status(), 200);
    // Twice the rate, the same 60 s burst: no time earned under the old quota lies beyond
    // the new tolerance, so what lies beyond is the debt, and it stands.
    handle
        .set_quotas("tokens", [Quota::per_minute(200)])
        .unwrap();
    // Reserving 10 = 3 s at the new rate: admitted at 150 + 3 - 60 = 93 s.
    let resp = call(&mut svc, req("k", 200, Some("10"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("93"));
    assert_eq!(field(&resp, "ratelimit"), Some(r#""tokens";r=0;t=150"#));
    tokio::time::advance(Duration::from_secs(93)).await;
    assert_eq!(
        call(&mut svc, req("k", 200, Some("10"))).await.status(),
        200
    );
}

// ---- on both stores ----

crate::over_both_stores!(
    a_larger_actual_cost_puts_the_key_in_debt_with_a_true_retry_after,
    a_smaller_actual_cost_gives_the_difference_back,
    a_charge_goes_beyond_the_limit_of_every_quota_kind,
    a_hundred_parallel_wrong_passwords_on_a_limit_of_five_reach_the_handler_five_times,
    parallel_settlements_of_one_key_add_up_exactly,
    a_panicking_handler_leaves_the_reservation_charged_once,
);

/// The layer of [`tokens`] on `s` and a manual clock, its policy `name` of `quota`.
fn tokens_on<S: Store>(
    s: &S,
    name: &str,
    quota: Quota,
    estimate: u32,
) -> (S::Layer, tollgate::ManualClock) {
    let (clock, time) = manual();
    let l = RateLimitLayer::new(Policy::new(name.to_owned(), quota))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .cost(move |_| estimate)
        .settle(ActualCost::of);
    (s.on(l), time)
}

/// The layer of [`failures`] on `s` and a manual clock.
fn failures_on<S: Store>(s: &S, limit: u32) -> S::Layer {
    let (clock, _time) = manual();
    let l = RateLimitLayer::new(Policy::new("failures", Quota::per_minute(limit)))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .count_if(|res| matches!(res.status.as_u16(), 401 | 403));
    s.on(l)
}

/// The layer's service around [`Handler`]: what the shared bodies call.
trait Served: Store {
    type Svc: Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static;
    /// Around a handler that answers at once.
    fn serve(&self, l: &Self::Layer) -> Self::Svc {
        self.serve_with(l, Handler::new(Duration::ZERO))
    }
    fn serve_with(&self, l: &Self::Layer, h: Handler) -> Self::Svc;
}

impl<S: Store> Served for S
where
    S::Layer: Layer<Handler>,
    <S::Layer as Layer<Handler>>::Service: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    <<S::Layer as Layer<Handler>>::Service as Service<Request<Body>>>::Future: Send,
{
    type Svc = <S::Layer as Layer<Handler>>::Service;
    fn serve_with(&self, l: &Self::Layer, h: Handler) -> Self::Svc {
        <S::Layer as Layer<Handler>>::layer(l, h)
    }
}

async fn a_hundred_parallel_wrong_passwords_on_a_limit_of_five_reach_the_handler_five_times(
    s: &impl Served,
) {
    let limit = failures_on(s, 5);
    let handler = Handler::gated();
    let mut svc = s.serve_with(&limit, handler.clone());
    let statuses = gathered(&svc, &handler, 100, || req("victim", 401, None)).await;
    assert_eq!(handler.calls(), 5);
    assert_eq!(count(&statuses, 401), 5);
    assert_eq!(count(&statuses, 429), 95);
    assert_eq!(s.left(&limit, "failures", "victim").await, [0]);
    // The five failures stay counted: the next attempt is rejected before the handler.
    let resp = call(&mut svc, req("victim", 401, None)).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(handler.calls(), 5);
}

async fn parallel_settlements_of_one_key_add_up_exactly(s: &impl Served) {
    let (limit, _time) = tokens_on(s, "tokens", Quota::per_hour(3_600), 1);
    let handler = Handler::gated();
    let svc = s.serve_with(&limit, handler.clone());
    let statuses = gathered(&svc, &handler, 50, || req("k", 200, Some("30"))).await;
    assert_eq!(count(&statuses, 200), 50);
    // 50 requests of 30 s each: 1 500 s ahead.
    let d = s.peek(&s.limiter(&limit, "tokens"), "k").await;
    assert_eq!(d.states()[0].reset_after(), Duration::from_secs(1_500));
}

async fn a_panicking_handler_leaves_the_reservation_charged_once(s: &impl Served) {
    let (limit, time) = tokens_on(s, "tokens", Quota::per_minute(100), 10);
    let mut svc = s.serve(&limit);
    let fut = svc.ready().await.unwrap().call(req("k", 999, Some("1")));
    let outcome = AssertUnwindSafe(fut).catch_unwind().await;
    assert!(outcome.is_err());
    assert_eq!(s.left(&limit, "tokens", "k").await, [90]);
    // Nothing is given back later either.
    time.advance(Duration::from_millis(1));
    call(&mut svc, req("k", 200, Some("10"))).await;
    assert_eq!(s.left(&limit, "tokens", "k").await, [80]);
}

async fn a_larger_actual_cost_puts_the_key_in_debt_with_a_true_retry_after(s: &impl Served) {
    let (limit, time) = tokens_on(s, "tokens", Quota::per_minute(100), 10);
    let mut svc = s.serve(&limit);
    // Reserved 10, used 250: 150 s of tokens, 90 s beyond the 60 s burst.
    let resp = call(&mut svc, req("k", 200, Some("250"))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(field(&resp, "ratelimit"), Some(r#""tokens";r=0;t=150"#));
    // The next request (reserving 10 = 6 s) waits until 156 - 60 = 96 s.
    let resp = call(&mut svc, req("k", 200, Some("10"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("96"));
    time.advance(Duration::from_millis(95_999));
    let resp = call(&mut svc, req("k", 200, Some("10"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&resp, "retry-after"), Some("1"));
    time.advance(Duration::from_millis(1));
    assert_eq!(
        call(&mut svc, req("k", 200, Some("10"))).await.status(),
        200
    );
}

async fn a_smaller_actual_cost_gives_the_difference_back(s: &impl Served) {
    let (limit, _time) = tokens_on(s, "tokens", Quota::per_minute(100), 50);
    let mut svc = s.serve(&limit);
    let resp = call(&mut svc, req("k", 200, Some("5"))).await;
    assert_eq!(field(&resp, "ratelimit"), Some(r#""tokens";r=95;t=3"#));
    let d = s.peek(&s.limiter(&limit, "tokens"), "k").await;
    let left: Vec<u64> = d.states().iter().map(|s| s.remaining()).collect();
    assert_eq!(left, [95]);
}

async fn a_charge_goes_beyond_the_limit_of_every_quota_kind(s: &impl Served) {
    let minute = Duration::from_secs(60);
    for (name, quota, retry) in [
        ("fixed", Quota::fixed_window(10, minute), "60"),
        ("log", Quota::sliding_log(10, minute), "60"),
        // 25 counted in the first minute weigh 25 × (60 − e) / 60 in the second: one more
        // fits once that is at most 9, at e = 38.4 s.
        ("counter", Quota::sliding_window(10, minute), "99"),
    ] {
        let (limit, _time) = tokens_on(s, name, quota, 1);
        let mut svc = s.serve(&limit);
        let resp = call(&mut svc, req("k", 200, Some("25"))).await;
        assert_eq!(resp.status(), 200);
        let resp = call(&mut svc, req("k", 200, Some("1"))).await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert_eq!(field(&resp, "retry-after"), Some(retry), "{name}");
    }
}
