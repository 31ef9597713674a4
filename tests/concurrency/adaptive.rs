//! Adaptive concurrency limits and priority shedding, on a paused clock against a simulated
//! backend: `capacity` requests are served in `BASE`; above that, latency grows in proportion
//! to the requests in flight (they queue for the `capacity` workers).
//!
//! Pins docs/design.md section 1 ("Concurrency limit").

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tollgate::concurrency::{Aimd, Gradient2, Priority, Shares, Vegas};
use tollgate::{key, ConcurrencyLimitLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

const BASE: Duration = Duration::from_millis(10);

/// The simulated backend: its capacity can change while it runs.
#[derive(Clone, Default)]
struct Backend {
    in_flight: Arc<AtomicUsize>,
    capacity: Arc<AtomicUsize>,
    /// The most requests of each class (by the `x-class` header) seen in flight at once.
    peak: Arc<Mutex<[usize; 3]>>,
    by_class: Arc<[AtomicUsize; 3]>,
}

impl Backend {
    fn new(capacity: usize) -> Self {
        let b = Backend::default();
        b.capacity.store(capacity, Ordering::SeqCst);
        b
    }

    fn latency(&self, n: usize) -> Duration {
        let c = self.capacity.load(Ordering::SeqCst).max(1);
        if n <= c {
            BASE
        } else {
            BASE * n as u32 / c as u32
        }
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<()>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future = impl Send,
    > + Clone {
        let b = self.clone();
        service_fn(move |req: Request<()>| {
            let b = b.clone();
            async move {
                let class = class_of(&req);
                let n = b.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                let c = b.by_class[class].fetch_add(1, Ordering::SeqCst) + 1;
                {
                    let mut peak = b.peak.lock().unwrap();
                    peak[class] = peak[class].max(c);
                }
                tokio::time::sleep(b.latency(n)).await;
                b.by_class[class].fetch_sub(1, Ordering::SeqCst);
                b.in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        })
    }
}

fn class_of<B>(req: &Request<B>) -> usize {
    match req.headers().get("x-class").map(|v| v.as_bytes()) {
        Some(b"critical") => 2,
        Some(b"sheddable") => 0,
        _ => 1,
    }
}

fn classify(head: &key::RequestHead<'_>) -> Priority {
    match head.headers.get("x-class").map(|v| v.as_bytes()) {
        Some(b"critical") => Priority::Critical,
        Some(b"sheddable") => Priority::Sheddable,
        _ => Priority::Normal,
    }
}

#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    ok: usize,
    rejected: usize,
}

/// `clients` closed-loop clients of `class` send requests until `until`; a rejected client
/// waits 10 ms before trying again.
fn clients<S>(svc: S, class: &'static str, clients: usize, until: Instant) -> Arc<Mutex<Tally>>
where
    S: Service<Request<()>, Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let tally = Arc::new(Mutex::new(Tally::default()));
    for _ in 0..clients {
        let svc = svc.clone();
        let tally = tally.clone();
        tokio::spawn(async move {
            while Instant::now() < until {
                let req = Request::builder()
                    .header("x-class", class)
                    .body(())
                    .unwrap();
                let resp = svc.clone().oneshot(req).await.unwrap();
                if resp.status() == StatusCode::OK {
                    resp.into_body().collect().await.unwrap();
                    tally.lock().unwrap().ok += 1;
                } else {
                    tally.lock().unwrap().rejected += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
    }
    tally
}

/// The layer's limit every 100 ms, from now until `until`.
async fn trace<E: tollgate::key::KeyExtractor>(
    layer: &ConcurrencyLimitLayer<E>,
    until: Instant,
) -> Vec<usize> {
    let mut limits = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        limits.push(layer.limit());
    }
    limits
}

fn range(xs: &[usize]) -> (usize, usize) {
    (
        xs.iter().copied().min().unwrap_or(0),
        xs.iter().copied().max().unwrap_or(0),
    )
}

#[tokio::test(start_paused = true)]
async fn gradient2_comes_down_from_far_above_capacity_within_three_seconds() {
    let backend = Backend::new(20);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Gradient2::new(500, 4, 1000));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(10);
    let tally = clients(svc, "normal", 200, until);
    let limits = trace(&layer, until).await;
    // After 3 s (the first probe of the no-load latency comes after 10 round trips), the
    // limit stays between the capacity and twice the capacity.
    let settled = range(&limits[30..]);
    assert!(settled.0 >= 20 && settled.1 <= 40, "{limits:?}");
    let latency = layer.latency().unwrap();
    assert!(latency <= BASE * 2, "{latency:?}");
    // Goodput: at least 90% of the backend's capacity (20 / 10 ms = 2000/s) over 9 s.
    assert!(
        tally.lock().unwrap().ok >= 16_200,
        "{:?}",
        tally.lock().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn gradient2_grows_from_far_below_capacity_within_one_second() {
    let backend = Backend::new(50);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Gradient2::new(4, 4, 1000));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(10);
    let _tally = clients(svc, "normal", 300, until);
    let limits = trace(&layer, until).await;
    let settled = range(&limits[10..]);
    assert!(settled.0 >= 50 && settled.1 <= 100, "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn gradient2_follows_a_step_change_of_capacity_within_two_seconds() {
    let backend = Backend::new(20);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Gradient2::new(20, 4, 1000));
    let svc = layer.layer(backend.service());
    let start = Instant::now();
    let until = start + Duration::from_secs(15);
    let _tally = clients(svc, "normal", 300, until);
    let capacity = backend.capacity.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_secs(5)).await;
        capacity.store(80, Ordering::SeqCst);
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        capacity.store(10, Ordering::SeqCst);
    });
    let limits = trace(&layer, until).await;
    let at_20 = range(&limits[10..50]);
    let at_80 = range(&limits[70..100]);
    let at_10 = range(&limits[120..]);
    assert!(at_20.0 >= 20 && at_20.1 <= 40, "{limits:?}");
    assert!(at_80.0 >= 80 && at_80.1 <= 160, "{limits:?}");
    assert!(at_10.0 >= 10 && at_10.1 <= 20, "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn vegas_comes_down_from_far_above_capacity_within_one_and_a_half_seconds() {
    let backend = Backend::new(20);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Vegas::new(500, 4, 1000));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(10);
    let tally = clients(svc, "normal", 200, until);
    let limits = trace(&layer, until).await;
    // After 1.5 s (the no-load latency is measured after 10 round trips of 100 ms), the
    // limit stays where 3 to 6 requests queue in the backend: 23 to 26, with some room.
    let settled = range(&limits[15..]);
    assert!(settled.0 >= 20 && settled.1 <= 30, "{limits:?}");
    let latency = layer.latency().unwrap();
    assert!(latency <= BASE * 3 / 2, "{latency:?}");
    // Goodput: at least 90% of the backend's capacity (2000/s) over 9 s.
    let ok = tally.lock().unwrap().ok;
    assert!(ok >= 16_200, "{ok}");
}

#[tokio::test(start_paused = true)]
async fn vegas_grows_from_far_below_capacity_within_half_a_second() {
    let backend = Backend::new(50);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Vegas::new(4, 4, 1000));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(10);
    let _tally = clients(svc, "normal", 300, until);
    let limits = trace(&layer, until).await;
    let settled = range(&limits[5..]);
    assert!(settled.0 >= 50 && settled.1 <= 65, "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn vegas_follows_a_step_of_capacity_up_within_half_a_second_and_down_within_four() {
    let backend = Backend::new(20);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(Vegas::new(20, 4, 1000));
    let svc = layer.layer(backend.service());
    let start = Instant::now();
    let until = start + Duration::from_secs(20);
    let _tally = clients(svc, "normal", 300, until);
    let capacity = backend.capacity.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_secs(5)).await;
        capacity.store(80, Ordering::SeqCst);
        tokio::time::sleep_until(start + Duration::from_secs(10)).await;
        capacity.store(10, Ordering::SeqCst);
    });
    let limits = trace(&layer, until).await;
    // Up is + beta per round trip; down is − log10(limit) per round trip: slower.
    let at_20 = range(&limits[15..50]);
    let at_80 = range(&limits[55..100]);
    let at_10 = range(&limits[140..]);
    assert!(at_20.0 >= 20 && at_20.1 <= 30, "{limits:?}");
    assert!(at_80.0 >= 75 && at_80.1 <= 100, "{limits:?}");
    assert!(at_10.0 >= 10 && at_10.1 <= 20, "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn aimd_stays_between_the_capacity_and_its_timeout() {
    let backend = Backend::new(20);
    // Slower than 2 × BASE counts as a failure: the limit stays under 2 × capacity.
    let aimd = Aimd::default().initial(200).timeout(BASE * 2);
    let layer = ConcurrencyLimitLayer::new(1000).adaptive(aimd);
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(10);
    let _tally = clients(svc, "normal", 200, until);
    let limits = trace(&layer, until).await;
    let settled = range(&limits[20..]);
    assert!(settled.0 >= 20 && settled.1 <= 45, "{limits:?}");
}

#[tokio::test(start_paused = true)]
async fn critical_requests_keep_their_share_under_a_flood_of_the_others() {
    let backend = Backend::new(1000);
    let layer = ConcurrencyLimitLayer::new(20).priority(classify);
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(5);
    let sheddable = clients(svc.clone(), "sheddable", 100, until);
    let normal = clients(svc.clone(), "normal", 100, until);
    // Two critical clients: ⌈20 / 10⌉ = 2 places are theirs alone.
    let critical = clients(svc, "critical", 2, until);
    tokio::time::sleep_until(until + Duration::from_secs(1)).await;

    let critical = *critical.lock().unwrap();
    assert_eq!(critical.rejected, 0);
    // Never rejected, 10 ms each: 500 requests in 5 s per client.
    assert_eq!(critical.ok, 1000);
    let peak = *backend.peak.lock().unwrap();
    assert_eq!(
        peak[0], 10,
        "sheddable requests never hold more than half the limit"
    );
    assert!(
        peak[1] <= 18,
        "normal requests never more than 90%: {peak:?}"
    );
    assert!(sheddable.lock().unwrap().ok > 0 && normal.lock().unwrap().ok > 0);
    assert!(layer.sheds() > 0);
}

#[tokio::test(start_paused = true)]
async fn critical_requests_keep_a_configured_share_under_a_flood_of_the_others() {
    let backend = Backend::new(1000);
    // Under 20: sheddable ≤ 5, sheddable and normal ≤ 12, so 8 places are critical's alone.
    let layer = ConcurrencyLimitLayer::new(20)
        .priority(classify)
        .shares(Shares::new(0.25, 0.6));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(5);
    let sheddable = clients(svc.clone(), "sheddable", 100, until);
    let normal = clients(svc.clone(), "normal", 100, until);
    let critical = clients(svc, "critical", 8, until);
    tokio::time::sleep_until(until + Duration::from_secs(1)).await;

    let critical = *critical.lock().unwrap();
    assert_eq!(critical.rejected, 0);
    assert_eq!(critical.ok, 8 * 500);
    let peak = *backend.peak.lock().unwrap();
    assert_eq!(
        peak[0], 5,
        "sheddable requests never hold more than a quarter"
    );
    assert!(
        peak[1] <= 12,
        "normal requests never more than 60%: {peak:?}"
    );
    assert!(peak[0] + peak[1] <= 17, "{peak:?}");
    assert!(sheddable.lock().unwrap().ok > 0 && normal.lock().unwrap().ok > 0);
}

/// Requests admitted and still in flight.
type Held<S> = Vec<std::pin::Pin<Box<tower::util::Oneshot<S, Request<()>>>>>;

/// Sends `classes` in order to `svc`, holding every admitted request; the statuses of the
/// rejected ones, by class.
fn admit_in_order<S>(
    svc: &S,
    classes: impl IntoIterator<Item = &'static str>,
) -> (Held<S>, Vec<(&'static str, StatusCode)>)
where
    S: Service<Request<()>, Response = Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>>
        + Clone,
    S::Error: std::fmt::Debug,
{
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for class in classes {
        let req = Request::builder()
            .header("x-class", class)
            .body(())
            .unwrap();
        let mut fut = Box::pin(svc.clone().oneshot(req));
        match futures_poll(&mut fut) {
            Some(resp) => statuses.push((class, resp.unwrap().status())),
            None => held.push(fut),
        }
    }
    (held, statuses)
}

fn holding() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    // Requests that hold their place until the test ends.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    service_fn(move |_: Request<()>| {
        let g = gate.clone();
        async move {
            let _ = g.acquire().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn configured_shares_are_exact_for_requests_that_arrive_together() {
    let layer = ConcurrencyLimitLayer::new(20)
        .priority(classify)
        .shares(Shares::new(0.25, 0.6));
    let svc = layer.layer(holding());
    let classes = ["sheddable"; 30]
        .into_iter()
        .chain(["normal"; 30])
        .chain(["critical"; 10]);
    let (held, statuses) = admit_in_order(&svc, classes);
    let rejected = |c: &str| statuses.iter().filter(|(k, _)| *k == c).count();
    // 5 sheddable (a quarter of 20), normal up to 12 (7 more), critical up to 20 (8 more).
    assert_eq!(held.len(), 20);
    assert_eq!(
        (
            rejected("sheddable"),
            rejected("normal"),
            rejected("critical")
        ),
        (25, 23, 2)
    );
    assert_eq!(layer.sheds(), 48);
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_one_is_critical_only_by_default_and_shared_at_full_shares() {
    let classes = || ["sheddable", "normal", "critical", "critical"];
    // Default: ⌊0.5⌋ = ⌊0.9⌋ = 0, the one place is critical's.
    let layer = ConcurrencyLimitLayer::new(1).priority(classify);
    let svc = layer.layer(holding());
    let (held, statuses) = admit_in_order(&svc, classes());
    assert_eq!(held.len(), 1);
    assert_eq!(
        statuses.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        ["sheddable", "normal", "critical"]
    );
    assert_eq!(layer.sheds(), 2);
    // All of it to every class: the first request takes it, whatever its class.
    let layer = ConcurrencyLimitLayer::new(1)
        .priority(classify)
        .shares(Shares::new(1.0, 1.0));
    let svc = layer.layer(holding());
    let (held, statuses) = admit_in_order(&svc, classes());
    assert_eq!(held.len(), 1);
    assert_eq!(
        statuses.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        ["normal", "critical", "critical"]
    );
    // A share over the normal share, not a number, or zero is an error before any layer.
    assert!(Shares::try_new(1.0, 0.5).is_err());
    assert!(Shares::try_new(f64::NAN, 1.0).is_err());
    assert!(Shares::try_new(0.0, 0.0).is_err());
}

#[tokio::test(start_paused = true)]
async fn shares_are_exact_for_requests_that_arrive_together() {
    // Requests that hold their place until released.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let inner = service_fn(move |_: Request<()>| {
        let g = g.clone();
        async move {
            let _ = g.acquire().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let layer = ConcurrencyLimitLayer::new(20).priority(classify);
    let svc = layer.layer(inner);
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for class in ["sheddable"; 30]
        .into_iter()
        .chain(["normal"; 30])
        .chain(["critical"; 5])
    {
        let req = Request::builder()
            .header("x-class", class)
            .body(())
            .unwrap();
        let mut fut = Box::pin(svc.clone().oneshot(req));
        match futures_poll(&mut fut) {
            Some(resp) => statuses.push((class, resp.unwrap().status())),
            None => held.push(fut),
        }
    }
    // 10 sheddable (half of 20), then normal up to 18, then critical up to 20.
    assert_eq!(held.len(), 20);
    let rejected = |c: &str| statuses.iter().filter(|(k, _)| *k == c).count();
    assert_eq!(rejected("sheddable"), 20);
    assert_eq!(rejected("normal"), 22);
    assert_eq!(rejected("critical"), 3);
    assert!(statuses
        .iter()
        .all(|(_, s)| *s == StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(layer.sheds(), 42);
    assert_eq!(layer.in_flight(), 20);
    drop(held);
    assert_eq!(layer.in_flight(), 0);
}

/// Polls once: the layer decides in the first poll whether a request has its place.
fn futures_poll<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = std::task::Waker::from(Arc::new(Noop));
    let mut cx = std::task::Context::from_waker(&waker);
    match std::pin::Pin::new(fut).poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

#[tokio::test(start_paused = true)]
async fn one_adaptive_limit_is_shared_by_every_key() {
    let backend = Backend::new(20);
    let layer = ConcurrencyLimitLayer::new(1000)
        .adaptive(Gradient2::new(500, 4, 1000))
        .key(key::Header::new("x-class"));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(5);
    let _a = clients(svc.clone(), "sheddable", 100, until);
    let _b = clients(svc, "normal", 100, until);
    let limits = trace(&layer, until).await;
    // Two keys, one limit: each key may have the limit in flight, so it settles near half
    // the capacity.
    let settled = range(&limits[30..]);
    assert!(settled.0 >= 10 && settled.1 <= 30, "{limits:?}");
    assert!(layer.in_flight() <= 2 * layer.limit());
}

#[tokio::test(start_paused = true)]
async fn waiters_get_the_places_of_a_growing_limit() {
    let backend = Backend::new(50);
    let layer = ConcurrencyLimitLayer::new(1000)
        .adaptive(Gradient2::new(4, 4, 1000))
        .queue(1000, Duration::from_secs(10));
    let svc = layer.layer(backend.service());
    let until = Instant::now() + Duration::from_secs(5);
    let tally = clients(svc, "normal", 100, until);
    let limits = trace(&layer, until).await;
    assert!(range(&limits[10..]).0 >= 50, "{limits:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(tally.lock().unwrap().rejected, 0);
    assert_eq!(layer.in_flight(), 0);
    assert_eq!(layer.waiting(), 0);
}

#[test]
fn the_limit_before_use_is_the_initial_one_within_max() {
    let layer = ConcurrencyLimitLayer::new(8).adaptive(Gradient2::new(20, 4, 100));
    assert_eq!(layer.limit(), 8);
    let layer = ConcurrencyLimitLayer::new(100).adaptive(Aimd::default().initial(30));
    assert_eq!(layer.limit(), 30);
    assert_eq!(layer.latency(), None);
    assert_eq!(layer.sheds(), 0);
    assert_eq!(ConcurrencyLimitLayer::new(5).limit(), 5);
}

fn answering(
    status: StatusCode,
) -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(move |_: Request<()>| async move {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        *resp.status_mut() = status;
        Ok::<_, Infallible>(resp)
    })
}

#[tokio::test(start_paused = true)]
async fn a_503_from_the_service_backs_the_limit_off() {
    let layer = ConcurrencyLimitLayer::new(100).adaptive(Aimd::default().initial(10));
    let svc = layer.layer(answering(StatusCode::SERVICE_UNAVAILABLE));
    let resp = svc.oneshot(Request::new(())).await.unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(layer.limit(), 9);
}

#[tokio::test(start_paused = true)]
async fn a_response_dropped_before_its_end_teaches_nothing() {
    let layer = ConcurrencyLimitLayer::new(100).adaptive(Aimd::default().initial(2));
    let svc = layer.layer(answering(StatusCode::OK));
    // Dropped unread (the client went away): no sample.
    drop(svc.clone().oneshot(Request::new(())).await.unwrap());
    assert_eq!(
        (layer.limit(), layer.latency(), layer.in_flight()),
        (2, None, 0)
    );
    // Read to the end: a sample, and the limit (half of it in use) grows.
    let resp = svc.oneshot(Request::new(())).await.unwrap();
    resp.into_body().collect().await.unwrap();
    assert_eq!(layer.limit(), 3);
    assert_eq!(layer.latency(), Some(Duration::from_nanos(1)));
}

#[test]
fn every_builder_order_keeps_the_adaptive_limit_and_the_classifier() {
    let shares = Shares::new(0.2, 0.7);
    let a = ConcurrencyLimitLayer::new(50)
        .adaptive(Gradient2::new(7, 1, 100))
        .shares(shares)
        .priority(classify)
        .key(key::Header::new("x-key"));
    let b = ConcurrencyLimitLayer::new(50)
        .key(key::Header::new("x-key"))
        .priority(classify)
        .adaptive(Gradient2::new(7, 1, 100))
        .shares(shares);
    assert_eq!((a.limit(), b.limit()), (7, 7));
    let dbg = format!("{a:?}");
    assert!(
        dbg.contains("adaptive: true")
            && dbg.contains("priority: true")
            && dbg.contains("Shares { sheddable: 0.2, normal: 0.7 }"),
        "{dbg}"
    );
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    // Numeric edges: bounds of 0 count as 1, an initial limit of 0 too.
    assert_eq!(
        ConcurrencyLimitLayer::new(50)
            .adaptive(Gradient2::new(0, 0, 0))
            .limit(),
        1
    );
    assert!(ConcurrencyLimitLayer::new(0)
        .adaptive(Aimd::default())
        .validate()
        .is_err());
}
