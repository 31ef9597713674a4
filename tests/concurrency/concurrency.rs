//! The concurrency-limit layer, specified by its behaviour.
//!
//! Pins docs/design.md section 1 ("Concurrency limit") and section 2.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tollgate::concurrency::ResponseBody;
use tollgate::key::{self, KeyExtractor};
use tollgate::response::{OnReject, Rejection};
use tollgate::{Clock, ConcurrencyLimitLayer, MissingKey, Quota, RateLimitLayer};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A response body fed chunk by chunk by the test; it ends when its sender is dropped.
struct Chunks(mpsc::UnboundedReceiver<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(c))))
    }
}

/// The rate-limit layer answers in its service's body type.
impl From<Bytes> for Chunks {
    fn from(chunk: Bytes) -> Self {
        let (tx, body) = chunks();
        let _ = tx.send(chunk);
        body
    }
}

fn chunks() -> (mpsc::UnboundedSender<Bytes>, Chunks) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Chunks(rx))
}

/// A request whose body the echo service sends back as the response body, plus its sender.
fn streaming(key: Option<&str>) -> (mpsc::UnboundedSender<Bytes>, Request<Chunks>) {
    let (tx, body) = chunks();
    let mut req = Request::new(body);
    if let Some(k) = key {
        req.headers_mut()
            .insert("x-key", HeaderValue::from_str(k).unwrap());
    }
    (tx, req)
}

/// A request with an empty body that ends at once.
fn request(key: Option<&str>) -> Request<Chunks> {
    streaming(key).1
}

type Echo = tower::util::ServiceFn<
    fn(Request<Chunks>) -> std::future::Ready<Result<Response<Chunks>, Infallible>>,
>;

/// Answers each request with its own body: the test decides when the response ends.
fn echo() -> Echo {
    service_fn(|req: Request<Chunks>| std::future::ready(Ok(Response::new(req.into_body()))))
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

async fn text<B: Body>(resp: Response<B>) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Puts the rejection kind in an `x-kind` header of the default response.
fn kind_header() -> OnReject {
    OnReject::new(|r: &Rejection<'_>| {
        let mut resp = r.default_response();
        let kind = HeaderValue::from_str(&format!("{:?}", r.kind())).unwrap();
        resp.headers_mut().insert("x-kind", kind);
        resp
    })
}

fn by_key() -> impl KeyExtractor<Key = Box<[u8]>> + Clone {
    key::Header::new("x-key")
}

/// Lets spawned tasks run until they block.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

// ---------------------------------------------------------------------------------------------
// The limit

/// Counts the requests between the handler's start and the end of their response body.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Gauge {
    fn enter(self: &Arc<Self>) -> Exit {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        Exit(self.clone())
    }
}

struct Exit(Arc<Gauge>);

impl Drop for Exit {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A body of one chunk that leaves the gauge when it ends or is dropped: when the layer gives
/// its permit back.
struct Gauged(Option<Bytes>, Option<Exit>);

impl Body for Gauged {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let chunk = self.0.take();
        if chunk.is_none() {
            self.1 = None;
        }
        Poll::Ready(chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// 500 clients at once against a limit of 7: each request counts from the handler's start
/// until its body is dropped.
async fn five_hundred_clients(
    layer: ConcurrencyLimitLayer,
    work: fn() -> Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> (Arc<Gauge>, Vec<StatusCode>) {
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let svc = layer.layer(service_fn(move |_: Request<()>| {
        let exit = g.enter();
        async move {
            work().await;
            Ok::<_, Infallible>(Response::new(Gauged(
                Some(Bytes::from_static(b"ok")),
                Some(exit),
            )))
        }
    }));
    let clients: Vec<_> = (0..500)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let resp = send(&svc, Request::new(())).await;
                let status = resp.status();
                resp.into_body().collect().await.unwrap();
                status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in clients {
        statuses.push(c.await.unwrap());
    }
    (gauge, statuses)
}

#[tokio::test(start_paused = true)]
async fn five_hundred_waiting_clients_never_exceed_the_limit_and_all_get_served() {
    let layer = ConcurrencyLimitLayer::new(7).queue(500, Duration::from_secs(3600));
    let (gauge, statuses) = five_hundred_clients(layer.clone(), || {
        Box::pin(tokio::time::sleep(Duration::from_millis(10)))
    })
    .await;
    assert!(statuses.iter().all(|s| *s == StatusCode::OK));
    assert_eq!(gauge.max.load(Ordering::SeqCst), 7);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_clients_on_two_threads_never_exceed_the_limit() {
    let layer = ConcurrencyLimitLayer::new(7);
    let (gauge, statuses) = five_hundred_clients(layer.clone(), || {
        Box::pin(async {
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
        })
    })
    .await;
    assert!(gauge.max.load(Ordering::SeqCst) <= 7);
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let busy = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(ok >= 7, "{ok} served");
    assert_eq!(ok + busy, 500);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn over_a_global_limit_is_503_with_retry_after() {
    let layer = ConcurrencyLimitLayer::new(2);
    let svc = layer.layer(echo());
    let _a = send(&svc, request(None)).await;
    let _b = send(&svc, request(None)).await;
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(
        text(resp).await,
        "Service Unavailable: too many requests in progress\n"
    );
}

#[tokio::test]
async fn retry_after_is_configurable_and_rounded_up() {
    let svc = ConcurrencyLimitLayer::new(1)
        .retry_after(Duration::from_millis(2500))
        .layer(echo());
    let _held = send(&svc, request(None)).await;
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.headers()["retry-after"], "3");
}

#[tokio::test]
async fn a_rejection_hook_builds_the_response_and_retry_after_is_added() {
    let hook = OnReject::new(|r: &Rejection<'_>| {
        Response::builder()
            .status(r.status())
            .header("content-type", "application/json")
            .body(Bytes::from(format!(r#"{{"error":"{:?}"}}"#, r.kind())))
            .unwrap()
    });
    let svc = ConcurrencyLimitLayer::new(1).on_reject(hook).layer(echo());
    let _held = send(&svc, request(None)).await;
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(text(resp).await, r#"{"error":"Concurrency"}"#);
}

#[tokio::test]
async fn clones_and_every_wrapped_service_share_one_limit_but_two_layers_are_two() {
    let layer = ConcurrencyLimitLayer::new(1);
    let route_a = layer.clone().layer(echo());
    let route_b = layer.layer(echo());
    let _held = send(&route_a, request(None)).await;
    assert_eq!(send(&route_b, request(None)).await.status(), 503);

    let other = ConcurrencyLimitLayer::new(1).layer(echo());
    assert_eq!(send(&other, request(None)).await.status(), 200);
}

#[test]
fn a_limit_of_zero_is_a_configuration_error() {
    let err = ConcurrencyLimitLayer::new(0).validate().unwrap_err();
    assert_eq!(err, tollgate::ConfigError::InvalidConcurrency(0));
    assert!(ConcurrencyLimitLayer::new(1).validate().is_ok());
    assert!(ConcurrencyLimitLayer::new(1)
        .name("bad\"name")
        .validate()
        .is_err());
}

// ---------------------------------------------------------------------------------------------
// The permit lives as long as the response body

#[tokio::test]
async fn a_streaming_body_keeps_its_permit_until_the_last_chunk() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(echo());
    let (feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    let mut body = resp.into_body();
    assert!(body.holds_permit());

    feed.send(Bytes::from_static(b"first")).unwrap();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(chunk, "first");
    assert_eq!(layer.in_flight(), 1);
    assert_eq!(send(&svc, request(None)).await.status(), 503);

    feed.send(Bytes::from_static(b"last")).unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(layer.in_flight(), 1);

    drop(feed);
    assert!(body.frame().await.is_none());
    // Released at the end of the stream, before the body itself is dropped.
    assert!(!body.holds_permit());
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, request(None)).await.status(), 200);
}

#[tokio::test]
async fn a_body_that_knows_its_end_releases_with_its_last_frame() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"all of it"))))
    }));
    let mut body = send(&svc, Request::new(())).await.into_body();
    assert_eq!(layer.in_flight(), 1);
    body.frame().await.unwrap().unwrap();
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test]
async fn dropping_the_body_releases_the_permit() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    assert_eq!(layer.in_flight(), 1);
    drop(resp); // the client went away mid-stream
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, request(None)).await.status(), 200);
}

#[tokio::test]
async fn release_on_headers_frees_the_place_before_the_body() {
    let layer = ConcurrencyLimitLayer::new(1).release_on_headers();
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    assert!(!resp.body().holds_permit());
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, request(None)).await.status(), 200);
}

#[tokio::test]
async fn an_inner_error_releases_the_permit_and_is_passed_through() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Err::<Response<Full<Bytes>>, _>("inner failed")
    }));
    let err = svc.clone().oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(err, "inner failed");
    assert_eq!(layer.in_flight(), 0);
}

// ---------------------------------------------------------------------------------------------
// Waiting

#[tokio::test(start_paused = true)]
async fn the_queue_is_first_in_first_out() {
    let layer = ConcurrencyLimitLayer::new(1).queue(10, Duration::from_secs(60));
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let svc = layer.layer(service_fn(move |req: Request<Chunks>| {
        if let Some(id) = req.headers().get("x-key") {
            o.lock().unwrap().push(id.to_str().unwrap().to_owned());
        }
        std::future::ready(Ok::<_, Infallible>(Response::new(req.into_body())))
    }));
    let (feed, req) = streaming(None);
    let held = send(&svc, req).await;

    let mut waiters = Vec::new();
    for id in ["1", "2", "3", "4"] {
        let svc = svc.clone();
        waiters.push(tokio::spawn(async move {
            let resp = send(&svc, request(Some(id))).await;
            resp.into_body().collect().await.unwrap();
        }));
        settle().await;
    }
    assert_eq!(layer.waiting(), 4);
    assert!(order.lock().unwrap().is_empty());

    drop(feed);
    text(held).await;
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["1", "2", "3", "4"]);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_place_as_soon_as_it_frees() {
    let layer = ConcurrencyLimitLayer::new(1).queue(1, Duration::from_secs(60));
    let svc = layer.layer(echo());
    let held = send(&svc, request(None)).await;
    let start = Instant::now();
    let waiter = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, request(None)).await.status() }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(held);
    assert_eq!(waiter.await.unwrap(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_rejected_after_max_wait() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(5, Duration::from_secs(2))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let _held = send(&svc, request(None)).await;

    let start = Instant::now();
    let waiting = send(&svc, request(None));
    tokio::pin!(waiting);
    let early = tokio::time::timeout(Duration::from_millis(1999), &mut waiting).await;
    assert!(early.is_err(), "still waiting just before max_wait");
    assert_eq!(layer.waiting(), 1);

    let resp = waiting.await;
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["x-kind"], "Concurrency");
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(layer.waiting(), 0);
    assert_eq!(layer.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_rejects_at_once() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(2, Duration::from_secs(60))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let held = send(&svc, request(None)).await;
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, request(None)).await.status() })
        })
        .collect();
    settle().await;
    assert_eq!(layer.waiting(), 2);

    let start = Instant::now();
    let resp = send(&svc, request(None)).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["x-kind"], "QueueFull");
    assert_eq!(resp.headers()["retry-after"], "1");

    drop(held);
    for w in waiters {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn a_queue_of_zero_rejects_everything_over_the_limit_as_queue_full() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(0, Duration::from_secs(60))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let _held = send(&svc, request(None)).await;
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.headers()["x-kind"], "QueueFull");
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_frees_its_place_at_once() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(1, Duration::from_secs(60))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let held = send(&svc, request(None)).await;

    let mut cancelled = Box::pin(send(&svc, request(None)));
    let pending = tokio::time::timeout(Duration::from_millis(1), &mut cancelled).await;
    assert!(pending.is_err());
    assert_eq!(layer.waiting(), 1);
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.headers()["x-kind"], "QueueFull");

    drop(cancelled); // the client went away
    assert_eq!(layer.waiting(), 0);

    // Its place is free for the next request, and the permit goes to that one.
    let next = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, request(None)).await.status() }
    });
    settle().await;
    assert_eq!(layer.waiting(), 1);
    drop(held);
    assert_eq!(next.await.unwrap(), StatusCode::OK);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_cancelled_before_its_first_poll_frees_its_place() {
    let layer = ConcurrencyLimitLayer::new(1).queue(1, Duration::from_secs(60));
    let mut svc = layer.layer(echo());
    let _held = send(&svc, request(None)).await;
    svc.ready().await.unwrap();
    let never_polled = svc.call(request(None));
    assert_eq!(layer.waiting(), 1);
    drop(never_polled);
    assert_eq!(layer.waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bound_is_exact_when_requests_race_for_it() {
    let layer = ConcurrencyLimitLayer::new(1)
        .queue(10, Duration::from_secs(3600))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let held = send(&svc, request(None)).await;

    let full = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..200)
        .map(|_| {
            let (svc, full) = (svc.clone(), full.clone());
            tokio::spawn(async move {
                let resp = send(&svc, request(None)).await;
                if resp
                    .headers()
                    .get("x-kind")
                    .is_some_and(|k| k == "QueueFull")
                {
                    full.fetch_add(1, Ordering::SeqCst);
                }
                resp.status()
            })
        })
        .collect();
    while full.load(Ordering::SeqCst) + layer.waiting() < 200 {
        tokio::task::yield_now().await;
    }
    assert_eq!(layer.waiting(), 10);
    assert_eq!(full.load(Ordering::SeqCst), 190);

    drop(held);
    let mut ok = 0;
    for c in clients {
        ok += usize::from(c.await.unwrap() == StatusCode::OK);
    }
    assert_eq!(ok, 10);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// Keys

#[tokio::test]
async fn per_key_limits_are_independent_and_answer_429() {
    let layer = ConcurrencyLimitLayer::new(1).key(by_key());
    let svc = layer.layer(echo());
    let _a = send(&svc, request(Some("a"))).await;
    assert_eq!(send(&svc, request(Some("b"))).await.status(), 200);

    let resp = send(&svc, request(Some("a"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(
        text(resp).await,
        "Too Many Requests: too many requests in progress\n"
    );
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_queue() {
    let layer = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .queue(1, Duration::from_secs(60))
        .on_reject(kind_header());
    let svc = layer.layer(echo());
    let _a = send(&svc, request(Some("a"))).await;
    let _b = send(&svc, request(Some("b"))).await;
    let waiters: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|k| {
            let svc = svc.clone();
            tokio::spawn(async move { send(&svc, request(Some(k))).await.status() })
        })
        .collect();
    settle().await;
    assert_eq!(layer.waiting(), 2);
    let resp = send(&svc, request(Some("a"))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["x-kind"], "QueueFull");
    drop(waiters);
}

#[tokio::test]
async fn keys_with_nothing_in_flight_are_forgotten() {
    let layer = ConcurrencyLimitLayer::new(1).key(by_key());
    let svc = layer.layer(echo());
    let mut held = Vec::new();
    for i in 0..1000 {
        held.push(send(&svc, request(Some(&format!("client-{i}")))).await);
    }
    assert_eq!(layer.tracked_keys(), 1000);
    assert_eq!(layer.in_flight(), 1000);

    // A rejected request does not keep its key alive.
    assert_eq!(send(&svc, request(Some("client-0"))).await.status(), 429);
    assert_eq!(layer.tracked_keys(), 1000);

    held.truncate(10);
    assert_eq!(layer.tracked_keys(), 10);
    held.clear();
    assert_eq!(layer.tracked_keys(), 0);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_hold_and_keys_are_forgotten_when_requests_race() {
    let layer = ConcurrencyLimitLayer::new(2)
        .key(by_key())
        .queue(8, Duration::from_secs(3600));
    let gauges: Arc<Vec<Arc<Gauge>>> = Arc::new((0..8).map(|_| Arc::default()).collect());
    let g = gauges.clone();
    let svc = layer.layer(service_fn(move |req: Request<()>| {
        let i: usize = req.headers()["x-key"].to_str().unwrap().parse().unwrap();
        let exit = g[i].enter();
        async move {
            tokio::task::yield_now().await;
            Ok::<_, Infallible>(Response::new(Gauged(
                Some(Bytes::from_static(b"ok")),
                Some(exit),
            )))
        }
    }));
    let clients: Vec<_> = (0..2000)
        .map(|n| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut req = Request::new(());
                req.headers_mut().insert("x-key", HeaderValue::from(n % 8));
                let resp = send(&svc, req).await;
                let status = resp.status();
                resp.into_body().collect().await.unwrap();
                status
            })
        })
        .collect();
    for c in clients {
        let status = c.await.unwrap();
        assert!(status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS);
    }
    for g in gauges.iter() {
        assert!(g.max.load(Ordering::SeqCst) <= 2);
    }
    assert_eq!(
        (layer.tracked_keys(), layer.in_flight(), layer.waiting()),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_does_not_keep_its_key_alive() {
    let layer = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .queue(4, Duration::from_secs(60));
    let svc = layer.layer(echo());
    let held = send(&svc, request(Some("a"))).await;
    let mut waiter = Box::pin(send(&svc, request(Some("a"))));
    assert!(tokio::time::timeout(Duration::from_millis(1), &mut waiter)
        .await
        .is_err());
    drop(held);
    drop(waiter); // cancelled just as the permit was handed to it
    assert_eq!(
        (layer.tracked_keys(), layer.in_flight(), layer.waiting()),
        (0, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_timing_out_does_not_keep_its_key_alive() {
    let layer = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .queue(4, Duration::from_secs(1));
    let svc = layer.layer(echo());
    let held = send(&svc, request(Some("a"))).await;
    assert_eq!(send(&svc, request(Some("a"))).await.status(), 429);
    assert_eq!(layer.tracked_keys(), 1);
    drop(held);
    assert_eq!(layer.tracked_keys(), 0);
}

#[tokio::test]
async fn a_request_without_a_key_follows_the_missing_key_policy() {
    // Default: 400, no Retry-After (waiting does not help).
    let svc = ConcurrencyLimitLayer::new(1).key(by_key()).layer(echo());
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(resp.headers().get("retry-after").is_none());

    let svc = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .layer(echo());
    assert_eq!(send(&svc, request(None)).await.status(), 401);

    // Allow: through, uncounted.
    let layer = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .on_missing_key(MissingKey::Allow);
    let svc = layer.layer(echo());
    let _a = send(&svc, request(None)).await;
    let _b = send(&svc, request(None)).await;
    assert_eq!(_b.status(), 200);
    assert_eq!(layer.in_flight(), 0);

    // UseKey: all such requests share one key.
    let layer = ConcurrencyLimitLayer::new(1)
        .key(by_key())
        .on_missing_key(MissingKey::UseKey(Box::from(&b"anonymous"[..])));
    let svc = layer.layer(echo());
    let _a = send(&svc, request(None)).await;
    assert_eq!(send(&svc, request(None)).await.status(), 429);
    assert_eq!(send(&svc, request(Some("known"))).await.status(), 200);
}

// ---------------------------------------------------------------------------------------------
// Headers and stacking

#[tokio::test]
async fn the_policy_item_is_off_by_default_and_names_concurrent_requests() {
    let svc = ConcurrencyLimitLayer::new(3).layer(echo());
    assert!(send(&svc, request(None))
        .await
        .headers()
        .get("ratelimit-policy")
        .is_none());

    let svc = ConcurrencyLimitLayer::new(1).name("workers").layer(echo());
    let admitted = send(&svc, request(None)).await;
    let policy = r#""workers";q=1;qu="concurrent-requests""#;
    assert_eq!(admitted.headers()["ratelimit-policy"], policy);
    let rejected = send(&svc, request(None)).await;
    assert_eq!(rejected.status(), 503);
    assert_eq!(rejected.headers()["ratelimit-policy"], policy);
}

fn rate_limit() -> RateLimitLayer {
    RateLimitLayer::new(Quota::per_second(1).burst(3)).clock(Clock::tokio())
}

#[tokio::test(start_paused = true)]
async fn with_the_rate_limit_outside_requests_rejected_inside_give_back_their_cost() {
    let concurrency = ConcurrencyLimitLayer::new(1).name("workers");
    let svc = ServiceBuilder::new()
        .layer(rate_limit())
        .layer(concurrency.clone())
        .service(echo());

    let held = send(&svc, request(None)).await;
    assert_eq!(held.status(), 200);
    // Both layers' policies are listed.
    let policies: Vec<_> = held.headers().get_all("ratelimit-policy").iter().collect();
    assert_eq!(policies.len(), 2, "{policies:?}");
    assert!(held.headers().contains_key("ratelimit"));

    // Each 503 gives back what the rate limit took: however many, the burst of 3 is never
    // spent by requests that were not served.
    for _ in 0..10 {
        assert_eq!(send(&svc, request(None)).await.status(), 503);
    }
    assert_eq!(concurrency.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_the_concurrency_limit_outside_the_rate_limit_counts_only_admitted_requests() {
    let concurrency = ConcurrencyLimitLayer::new(1);
    let svc = ServiceBuilder::new()
        .layer(concurrency.clone())
        .layer(rate_limit())
        .service(echo());

    let held = send(&svc, request(None)).await;
    for _ in 0..5 {
        assert_eq!(send(&svc, request(None)).await.status(), 503);
    }
    drop(held);
    // Only one request reached the rate limit: two more fit in the burst.
    assert_eq!(send(&svc, request(None)).await.status(), 200);
    assert_eq!(send(&svc, request(None)).await.status(), 200);
    let resp = send(&svc, request(None)).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    // Inside the concurrency limit, the rate limit's 429 holds a place until it is sent.
    assert_eq!(concurrency.in_flight(), 1);
    drop(resp);
    assert_eq!(concurrency.in_flight(), 0);
}

// ---------------------------------------------------------------------------------------------
// axum

fn assert_infallible<S, R>(_: &S)
where
    S: Service<R, Error = Infallible>,
{
}

#[tokio::test]
async fn under_axum_the_error_stays_infallible_and_every_layer_method_compiles() {
    use axum::{body::Body as AxumBody, routing::get, Router};
    use tokio::sync::Notify;

    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let limit = ConcurrencyLimitLayer::new(1);
    let app: Router = Router::new()
        .route(
            "/slow",
            get(move || async move {
                g.notified().await;
                "slow"
            }),
        )
        .route(
            "/per-route",
            get(|| async { "ok" }).layer(ConcurrencyLimitLayer::new(2)),
        )
        .route_layer(ConcurrencyLimitLayer::new(8).key(key::Route))
        .layer(rate_limit_axum())
        .layer(limit.clone());
    assert_infallible::<_, Request<AxumBody>>(&app);

    let inner = limit.layer(service_fn(|_: Request<AxumBody>| async {
        Ok::<_, Infallible>(Response::new(AxumBody::from("x")))
    }));
    assert_infallible::<_, Request<AxumBody>>(&inner);

    let get_req = |path: &str| Request::get(path).body(AxumBody::empty()).unwrap();
    let slow = tokio::spawn(app.clone().oneshot(get_req("/slow")));
    while limit.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let busy = app.clone().oneshot(get_req("/per-route")).await.unwrap();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(busy.headers()["retry-after"], "1");

    gate.notify_one();
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(text(slow).await, "slow");
    let resp = app.oneshot(get_req("/per-route")).await.unwrap();
    assert_eq!(text(resp).await, "ok");
    assert_eq!(limit.in_flight(), 0);
}

fn rate_limit_axum() -> RateLimitLayer {
    RateLimitLayer::new(Quota::per_second(100))
}

#[test]
fn the_response_body_converts_from_bytes_like_axum_bodies() {
    fn from_bytes<B: From<Bytes>>() {}
    from_bytes::<ResponseBody<axum::body::Body>>();
    from_bytes::<ResponseBody<Chunks>>();
}

// ---------------------------------------------------------------------------------------------
// Slow clients: how long a body may hold its permit

#[tokio::test(start_paused = true)]
async fn without_max_hold_a_body_that_never_ends_holds_its_permit_for_ever() {
    let layer = ConcurrencyLimitLayer::new(1);
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    tokio::time::sleep(Duration::from_secs(365 * 24 * 3600)).await;
    settle().await;
    assert!(resp.body().holds_permit());
    assert_eq!(layer.in_flight(), 1);
    assert_eq!(send(&svc, request(None)).await.status(), 503);
}

#[tokio::test(start_paused = true)]
async fn max_hold_releases_an_unread_body_at_the_deadline_and_the_body_keeps_streaming() {
    let layer = ConcurrencyLimitLayer::new(1).max_hold(Duration::from_secs(30));
    let svc = layer.layer(echo());
    let (feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    let mut body = resp.into_body();
    assert!(body.holds_permit());

    // The client reads nothing: the body is not polled at all.
    tokio::time::sleep(Duration::from_millis(29_999)).await;
    settle().await;
    assert_eq!(layer.in_flight(), 1);
    assert_eq!(send(&svc, request(None)).await.status(), 503);

    tokio::time::sleep(Duration::from_millis(1)).await;
    settle().await;
    assert!(!body.holds_permit());
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, request(None)).await.status(), 200);

    // The body itself goes on.
    feed.send(Bytes::from_static(b"still here")).unwrap();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(chunk, "still here");
    drop(feed);
    assert!(body.frame().await.is_none());
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn with_max_hold_a_body_that_ends_first_releases_at_its_end_and_the_timer_takes_nothing() {
    let layer = ConcurrencyLimitLayer::new(2).max_hold(Duration::from_secs(30));
    let svc = layer.layer(echo());
    let (feed, req) = streaming(None);
    let mut body = send(&svc, req).await.into_body();
    drop(feed);
    assert!(body.frame().await.is_none());
    assert_eq!(layer.in_flight(), 0);

    // A second request holds its place past the first one's deadline, until its own.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_feed2, req2) = streaming(None);
    let second = send(&svc, req2).await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    settle().await;
    assert!(second.body().holds_permit());
    assert_eq!(layer.in_flight(), 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn with_max_hold_dropping_the_body_releases_at_once() {
    let layer = ConcurrencyLimitLayer::new(1).max_hold(Duration::from_secs(30));
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    assert_eq!(layer.in_flight(), 1);
    drop(resp);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn max_hold_of_zero_releases_with_the_headers() {
    let layer = ConcurrencyLimitLayer::new(1).max_hold(Duration::ZERO);
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    assert!(!resp.body().holds_permit());
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn max_hold_of_duration_max_saturates_and_holds() {
    let layer = ConcurrencyLimitLayer::new(1).max_hold(Duration::MAX);
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let resp = send(&svc, req).await;
    tokio::time::sleep(Duration::from_secs(365 * 24 * 3600)).await;
    settle().await;
    assert!(resp.body().holds_permit());
    assert_eq!(layer.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn max_hold_is_kept_whatever_the_order_of_the_builder_calls() {
    let hold = Duration::from_secs(5);
    let layers = [
        ConcurrencyLimitLayer::new(1).max_hold(hold).key(by_key()),
        ConcurrencyLimitLayer::new(1).key(by_key()).max_hold(hold),
    ];
    for layer in layers {
        let layer = layer.queue(1, Duration::from_secs(1)).release_on_headers();
        let layer = layer.max_hold(hold);
        let svc = layer.layer(echo());
        let (_feed, req) = streaming(Some("a"));
        let _resp = send(&svc, req).await;
        // release_on_headers wins: nothing held.
        assert_eq!(layer.in_flight(), 0);
    }
    for layer in [
        ConcurrencyLimitLayer::new(1).max_hold(hold).key(by_key()),
        ConcurrencyLimitLayer::new(1).key(by_key()).max_hold(hold),
    ] {
        let svc = layer.layer(echo());
        let (_feed, req) = streaming(Some("a"));
        let _resp = send(&svc, req).await;
        assert_eq!(layer.in_flight(), 1);
        tokio::time::sleep(hold).await;
        settle().await;
        assert_eq!(layer.in_flight(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn with_an_adaptive_limit_a_permit_taken_by_max_hold_records_no_sample() {
    let layer = ConcurrencyLimitLayer::new(10)
        .adaptive(tollgate::concurrency::Aimd::default().initial(5))
        .max_hold(Duration::from_secs(30));
    let svc = layer.layer(echo());
    let (_feed, req) = streaming(None);
    let _stuck = send(&svc, req).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(layer.latency(), None);

    // A body that ends before the deadline is measured as before.
    let (feed, req) = streaming(None);
    let mut body = send(&svc, req).await.into_body();
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(feed);
    assert!(body.frame().await.is_none());
    assert_eq!(layer.latency(), Some(Duration::from_millis(20)));
}

#[tokio::test(start_paused = true)]
async fn an_upgrade_gives_its_permit_back_with_the_101() {
    let layer = ConcurrencyLimitLayer::new(1).max_hold(Duration::from_secs(30));
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        Ok::<_, Infallible>(resp)
    }));
    let resp = send(&svc, Request::new(())).await;
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    // The server sees an empty body at its end and drops it: the upgraded connection that
    // follows is not counted.
    assert!(resp.body().is_end_stream());
    drop(resp);
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(send(&svc, Request::new(())).await.status(), 101);
}
