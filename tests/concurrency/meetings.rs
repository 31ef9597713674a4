//! The concurrency limit where it meets its neighbours: a response body that fails; a waiter
//! that goes away in the instant a place is handed to it, before and after a lower maximum;
//! and a rate limit stacked outside it that counts with `count_if`, settles (holding a
//! waiter's reservation while it waits), keeps a penalty box, or gives back what a request
//! the queue turned away took.
//!
//! Pins docs/design.md section 1 ("Concurrency limit": a permit is held until the response body
//! is finished or dropped) and section 3 ("Stacked layers are all or nothing", "The penalty box
//! punishes the client's own traffic").

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::{Clock, ConcurrencyLimitLayer, Quota, RateLimitLayer};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

/// A body of one data frame, then an error.
struct Failing {
    sent: bool,
}

impl Body for Failing {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
        if self.sent {
            return Poll::Ready(Some(Err("the upstream went away")));
        }
        self.sent = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"part")))))
    }
}

async fn send<S, B>(svc: &S, req: Request<B>) -> S::Response
where
    S: Service<Request<B>, Error = Infallible> + Clone,
{
    match svc.clone().oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// A request for key `k` asking the handler for status `status`.
fn req(k: &str, status: u16) -> Request<()> {
    Request::get("/")
        .header("x-key", k)
        .header("x-status", status.to_string())
        .body(())
        .unwrap()
}

/// Answers with the status the request asks for; the body of one frame holds the request's
/// permit until it is read or dropped.
fn handler() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    service_fn(|r: Request<()>| async move {
        let status = r.headers()["x-status"].to_str().unwrap().parse().unwrap();
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        Ok::<_, Infallible>(resp)
    })
}

#[tokio::test]
async fn a_body_that_fails_mid_stream_gives_its_permit_back_with_the_error() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Failing { sent: false }))
    }));
    let resp = send(&svc, Request::new(())).await;
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "part");
    assert_eq!(
        layer.in_flight(),
        1,
        "the body is not over after its first frame"
    );
    assert_eq!(
        body.frame().await.unwrap().unwrap_err(),
        "the upstream went away"
    );
    // Given back with the error, before the server drops the body.
    assert!(!body.holds_permit());
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, Request::new(())).await.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_turned_away_by_its_wait_or_a_full_queue_gives_back_what_the_rate_limit_outside_took(
) {
    // A burst of 3 a minute outside one place with one waiting for at most 100 ms.
    let concurrency = ConcurrencyLimitLayer::new(1).queue(1, Duration::from_millis(100));
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Quota::per_minute(1).burst(3)).clock(Clock::tokio()))
        .layer(concurrency.clone())
        .service(handler());
    let held = send(&svc, req("-", 200)).await;
    assert_eq!(held.status(), 200);
    for _ in 0..5 {
        let waiter = tokio::spawn({
            let svc = svc.clone();
            async move { send(&svc, req("-", 200)).await.status() }
        });
        tokio::task::yield_now().await;
        assert_eq!(concurrency.waiting(), 1);
        // The queue is full: turned away at once.
        let full = send(&svc, req("-", 200)).await;
        assert_eq!(full.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()["retry-after"], "1");
        // The waiter, after its 100 ms.
        assert_eq!(waiter.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
    drop(held);
    // Ten refusals later (0.5 s), the burst has exactly its two left.
    assert_eq!(send(&svc, req("-", 200)).await.status(), 200);
    assert_eq!(send(&svc, req("-", 200)).await.status(), 200);
    assert_eq!(send(&svc, req("-", 200)).await.status(), 429);
}

#[tokio::test]
async fn a_per_key_concurrency_refusal_inside_is_given_back_even_where_count_if_would_count_it() {
    // Only failures count (say, wrong passwords): at most 2 a minute per key.
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(Quota::per_minute(2))
                .key(Header::new("x-key"))
                .clock(Clock::manual().0)
                .count_if(|r| r.status != StatusCode::OK),
        )
        .layer(ConcurrencyLimitLayer::new(1).key(Header::new("x-key")))
        .service(handler());
    let held = send(&svc, req("a", 200)).await;
    assert_eq!(held.status(), 200);
    for _ in 0..10 {
        // The concurrency limit's 429, never a failure of the client's own.
        assert_eq!(send(&svc, req("a", 401)).await.status(), 429);
    }
    drop(held);
    assert_eq!(send(&svc, req("a", 401)).await.status(), 401);
    assert_eq!(send(&svc, req("a", 401)).await.status(), 401);
    let refused = send(&svc, req("a", 401)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "30");
}

#[tokio::test]
async fn a_per_key_concurrency_refusal_inside_is_no_strike_for_a_penalty_box_outside() {
    // One strike bans for 10 minutes: any refusal taken for a strike would show.
    let (clock, _time) = Clock::manual();
    let limit = RateLimitLayer::new(Quota::per_minute(100))
        .key(Header::new("x-key"))
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 600 * SEC));
    let svc = ServiceBuilder::new()
        .layer(limit)
        .layer(ConcurrencyLimitLayer::new(1).key(Header::new("x-key")))
        .service(handler());
    let held = send(&svc, req("a", 200)).await;
    for _ in 0..3 {
        assert_eq!(send(&svc, req("a", 200)).await.status(), 429);
    }
    drop(held);
    let after = send(&svc, req("a", 200)).await;
    assert_eq!(
        after.status(),
        200,
        "banned for a refusal of the layer inside"
    );
    // Two requests admitted in all: the rate limit counts 98 left.
    let fields = after.headers()["ratelimit"].to_str().unwrap();
    assert!(fields.contains("r=98"), "{fields}");
}

/// Polls `fut` once.
fn poll_once<F: std::future::Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    let waker = futures_util::task::noop_waker_ref();
    std::pin::Pin::new(fut).poll(&mut Context::from_waker(waker))
}

#[tokio::test(start_paused = true)]
async fn a_place_handed_to_a_waiter_that_goes_away_in_that_instant_goes_to_the_next() {
    for keyed in [false, true] {
        let layer = ConcurrencyLimitLayer::new(1).queue(2, Duration::from_secs(10));
        let (svc, tracked): (
            tower::util::BoxCloneService<_, _, _>,
            Box<dyn Fn() -> usize>,
        ) = if keyed {
            let layer = layer.key(Header::new("x-key"));
            let svc = tower::util::BoxCloneService::new(layer.layer(handler()));
            (svc, Box::new(move || layer.tracked_keys()))
        } else {
            (
                tower::util::BoxCloneService::new(layer.clone().layer(handler())),
                Box::new(|| 0),
            )
        };
        let held = send(&svc, req("a", 200)).await;
        let mut first = Box::pin(svc.clone().oneshot(req("a", 200)));
        let mut second = Box::pin(svc.clone().oneshot(req("a", 200)));
        assert!(poll_once(&mut first).is_pending());
        assert!(poll_once(&mut second).is_pending());
        // The place goes to the first waiter, which goes away before it runs.
        drop(held);
        drop(first);
        let resp = second.await.unwrap();
        assert_eq!(resp.status(), 200, "keyed: {keyed}");
        drop(resp);
        // Nothing leaked: one place, free, and no key left behind.
        let again = send(&svc, req("a", 200)).await;
        assert_eq!(again.status(), 200);
        // A third waits its 10 s and is refused: the place is held by the one in flight.
        let refused = if keyed { 429 } else { 503 };
        assert_eq!(send(&svc, req("a", 200)).await.status(), refused);
        drop(again);
        assert_eq!(tracked(), 0);
    }
}

/// Globally and per key; the second waiter starts once the one in flight is done, and a
/// limit per key forgets its key after.
#[tokio::test(start_paused = true)]
async fn a_place_a_cancelled_waiter_hands_back_after_the_maximum_was_lowered_pays_the_debt() {
    let global = ConcurrencyLimitLayer::new(2).queue(2, Duration::from_secs(10));
    let handle = global.handle().unwrap();
    cancelled_after_the_change(global.clone().layer(handler()), handle, "global").await;
    assert_eq!(global.in_flight(), 0);
    let keyed = ConcurrencyLimitLayer::new(2)
        .queue(2, Duration::from_secs(10))
        .key(Header::new("x-key"));
    let handle = keyed.handle().unwrap();
    cancelled_after_the_change(keyed.clone().layer(handler()), handle, "keyed").await;
    assert_eq!(keyed.tracked_keys(), 0);
}

async fn cancelled_after_the_change<S>(svc: S, handle: tollgate::ConcurrencyHandle, what: &str)
where
    S: Service<Request<()>, Error = Infallible> + Clone + Send + 'static,
    S::Response: Send,
    S::Future: Send,
{
    let a = send(&svc, req("k", 200)).await;
    let b = send(&svc, req("k", 200)).await;
    let mut first = Box::pin(svc.clone().oneshot(req("k", 200)));
    let mut second = Box::pin(svc.clone().oneshot(req("k", 200)));
    assert!(poll_once(&mut first).is_pending());
    assert!(poll_once(&mut second).is_pending());
    // A's place goes to the first waiter; then the maximum becomes 1, with b in flight.
    drop(a);
    handle.set_max(1).unwrap();
    // The first waiter goes away before it runs: its place pays the debt.
    drop(first);
    assert!(
        poll_once(&mut second).is_pending(),
        "{what}: a second request started beside b under a maximum of 1"
    );
    // B is done: one place under the maximum of 1, and it goes to the waiter.
    drop(b);
    let resp = second.await;
    assert!(resp.is_ok(), "{what}");
    drop(resp);
}

/// A place handed to a waiter just before the maximum came down, to a waiter that had not
/// run yet: it pays the debt instead of starting, and the waiter starts once the requests in
/// flight are under the new maximum.
#[tokio::test(start_paused = true)]
async fn a_waiter_handed_a_place_before_the_maximum_came_down_starts_only_under_the_new_one() {
    let global = ConcurrencyLimitLayer::new(2).queue(2, Duration::from_secs(10));
    let handle = global.handle().unwrap();
    handed_before_the_change(global.layer(handler()), handle, "global").await;
    let keyed = ConcurrencyLimitLayer::new(2)
        .queue(2, Duration::from_secs(10))
        .key(Header::new("x-key"));
    let handle = keyed.handle().unwrap();
    handed_before_the_change(keyed.layer(handler()), handle, "keyed").await;
}

async fn handed_before_the_change<S>(svc: S, handle: tollgate::ConcurrencyHandle, what: &str)
where
    S: Service<Request<()>, Error = Infallible> + Clone + Send + 'static,
    S::Response: Send,
    S::Future: Send,
{
    let a = send(&svc, req("k", 200)).await;
    let b = send(&svc, req("k", 200)).await;
    let mut waiter = Box::pin(svc.clone().oneshot(req("k", 200)));
    assert!(poll_once(&mut waiter).is_pending());
    // A's place is handed to the waiter, which has not run when the maximum becomes 1.
    drop(a);
    handle.set_max(1).unwrap();
    assert!(
        poll_once(&mut waiter).is_pending(),
        "{what}: the waiter started beside b under a maximum of 1"
    );
    drop(b);
    assert!(waiter.await.is_ok(), "{what}");
}

/// Answers `200` with the `x-used` header the request asks for.
fn reporting() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    service_fn(|r: Request<()>| async move {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        if let Some(used) = r.headers().get("x-used") {
            resp.headers_mut().insert("x-used", used.clone());
        }
        Ok::<_, Infallible>(resp)
    })
}

fn used(n: u32) -> Request<()> {
    Request::get("/")
        .header("x-used", n.to_string())
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_settling_layer_outside_holds_a_waiter_s_reservation_and_gives_it_back_when_the_queue_turns_it_away(
) {
    // One a minute, settled at what the response reports; one place, one waiting 100 ms.
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(Quota::per_minute(1))
                .clock(Clock::tokio())
                .settle(tollgate::rate_limit::settle::ActualCost::header("x-used")),
        )
        .layer(ConcurrencyLimitLayer::new(1).queue(1, Duration::from_millis(100)))
        .service(reporting());
    // In flight, settled at 0: it holds the place and nothing of the quota.
    let held = send(&svc, used(0)).await;
    assert_eq!(held.status(), 200);
    let waiter = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, used(1)).await.status() }
    });
    tokio::task::yield_now().await;
    // The waiter holds the one unit while it waits: a third is refused by the rate limit.
    assert_eq!(send(&svc, used(1)).await.status(), 429);
    // Turned away after its 100 ms, it gives its unit back.
    assert_eq!(waiter.await.unwrap(), 503);
    drop(held);
    assert_eq!(send(&svc, used(1)).await.status(), 200);
    assert_eq!(send(&svc, used(1)).await.status(), 429);
}
