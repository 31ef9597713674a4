//! Traffic shaping (docs/design.md section 1, "Shaping"): departures, order, bounds, cancellation, keys,
//! high rates, the polite client side and composition. Every test runs on tokio's paused clock.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate::key::Header;
use tollgate::{Clock, MissingKey, Quota, RateLimitLayer};
use tollgate::{PoliteLayer, ShapeLayer, Shaper};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// Departure log: when each request reached the inner service, and which one it was.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Duration, String)>>>);

impl Log {
    fn record(&self, start: Instant, id: String) {
        self.0.lock().unwrap().push((start.elapsed(), id));
    }

    fn times_ms(&self) -> Vec<u64> {
        let log = self.0.lock().unwrap();
        log.iter().map(|(t, _)| t.as_millis() as u64).collect()
    }

    fn ids(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, id)| id.clone())
            .collect()
    }
}

/// An inner service that logs each departure and answers 200.
fn recorder(
    log: &Log,
    start: Instant,
) -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    let log = log.clone();
    service_fn(move |req: Request<Body>| {
        let id = req
            .headers()
            .get("x-id")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        log.record(start, id);
        async { Ok::<_, Infallible>(Response::new(Body::from("ok"))) }
    })
}

fn req(id: impl ToString) -> Request<Body> {
    Request::get("/")
        .header("x-id", id.to_string())
        .body(Body::empty())
        .unwrap()
}

fn keyed_req(key: &str, id: impl ToString) -> Request<Body> {
    Request::get("/")
        .header("x-key", key)
        .header("x-id", id.to_string())
        .body(Body::empty())
        .unwrap()
}

fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Calls `svc` with each request in order, each then awaited in its own task, all at the
/// current instant. `call` takes the place in the queue, so arrival order is the order given.
async fn send_all<S>(
    svc: &S,
    reqs: Vec<Request<Body>>,
) -> Vec<tokio::task::JoinHandle<Response<Body>>>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut handles = Vec::new();
    for r in reqs {
        let mut svc = svc.clone();
        let fut = svc.ready().await.unwrap().call(r);
        handles.push(tokio::spawn(async move { fut.await.unwrap() }));
    }
    handles
}

async fn statuses(handles: Vec<tokio::task::JoinHandle<Response<Body>>>) -> Vec<u16> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().status().as_u16());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_burst_leaves_exactly_one_interval_apart() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(20))
        .service(recorder(&log, start));
    let handles = send_all(&svc, (0..10).map(req).collect()).await;
    assert_eq!(statuses(handles).await, [200; 10]);
    assert_eq!(
        log.times_ms(),
        [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]
    );
}

#[tokio::test(start_paused = true)]
async fn requests_leave_in_the_order_they_arrived() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(20)).max_waiting(100))
        .service(recorder(&log, start));
    let mut handles = Vec::new();
    // Arrivals spread over time, faster than the rate, so a queue builds up and drains.
    for i in 0..30 {
        handles.extend(send_all(&svc, vec![req(i)]).await);
        tokio::time::sleep(Duration::from_millis(7 * (i % 4))).await;
    }
    statuses(handles).await;
    let expected: Vec<String> = (0..30).map(|i| i.to_string()).collect();
    assert_eq!(log.ids(), expected);
    let times = log.times_ms();
    assert!(
        times.windows(2).all(|w| w[1] - w[0] >= 50),
        "departures closer than one interval: {times:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_answers_429_with_the_time_until_a_place_frees() {
    let start = Instant::now();
    let log = Log::default();
    // One every 10 s; one leaves, one may wait.
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_minute(6)).max_waiting(1))
        .service(recorder(&log, start));
    let handles = send_all(&svc, vec![req(0), req(1)]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resp = svc.clone().oneshot(req(2)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // The waiting request leaves at 10 s: a place frees up in 7 s.
    assert_eq!(header(&resp, "retry-after"), Some("7"));
    // q = 2 requests accepted at once, forwarded over 20 s; none left, idle in 17 s.
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some("\"shape-6-per-1m\";q=2;w=20")
    );
    assert_eq!(
        header(&resp, "ratelimit"),
        Some("\"shape-6-per-1m\";r=0;t=17")
    );
    assert_eq!(
        header(&resp, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(statuses(handles).await, [200, 200]);
    assert_eq!(log.times_ms(), [0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn max_delay_refuses_a_request_that_would_wait_too_long() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_wait(Duration::from_millis(250)))
        .service(recorder(&log, start));
    // Waits of 0, 100, 200 ms are accepted; 300 ms is not, and a place frees in 50 ms.
    let handles = send_all(&svc, (0..4).map(req).collect()).await;
    assert_eq!(statuses(handles).await, [200, 200, 200, 429]);
    assert_eq!(log.times_ms(), [0, 100, 200]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_whole_seconds_rounded_up_and_never_zero() {
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(0))
        .service(recorder(&Log::default(), Instant::now()));
    let handles = send_all(&svc, (0..2).map(req).collect()).await;
    let mut resps = Vec::new();
    for h in handles {
        resps.push(h.await.unwrap());
    }
    assert_eq!(resps[0].status(), StatusCode::OK);
    // `max_queue(0)`: nothing may wait; the slot comes in 100 ms, shown as 1 s.
    assert_eq!(resps[1].status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resps[1], "retry-after"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn the_default_queue_holds_one_period_worth_of_requests() {
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(5)))
        .service(recorder(&Log::default(), Instant::now()));
    let handles = send_all(&svc, (0..6).map(req).collect()).await;
    assert_eq!(statuses(handles).await, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_gives_its_slot_to_the_next() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(10))
        .service(recorder(&log, start));
    // Slots: 0 leaves at once; 1 at 100, 2 at 200, 3 at 300, 4 at 400, 5 at 500 ms.
    let mut handles = send_all(&svc, (0..6).map(req).collect()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Client 1 (the head, waiting for 100 ms) and client 3 (in the middle) go away.
    handles.remove(3).abort();
    handles.remove(1).abort();
    let statuses = statuses(handles).await;
    assert_eq!(statuses, [200; 4]);
    // No holes: 2 takes 1's slot, 4 and 5 move up; still exactly one per 100 ms.
    assert_eq!(log.ids(), ["0", "2", "4", "5"]);
    assert_eq!(log.times_ms(), [0, 100, 200, 300]);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_times_out_does_not_burn_a_slot() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).max_waiting(10))
        .service(recorder(&log, start));
    let first = send_all(&svc, vec![req("a"), req("b")]).await;
    // c gives up after 150 ms, before its slot at 200 ms.
    let impatient = {
        let mut svc = svc.clone();
        let fut = svc.ready().await.unwrap().call(req("c"));
        tokio::spawn(tokio::time::timeout(Duration::from_millis(150), fut))
    };
    let last = send_all(&svc, vec![req("d")]).await;
    assert!(impatient.await.unwrap().is_err(), "c timed out");
    statuses(first).await;
    statuses(last).await;
    assert_eq!(log.ids(), ["a", "b", "d"]);
    assert_eq!(log.times_ms(), [0, 100, 200]);
}

/// After a live change of rate, the client at the head of the queue (kept at its departure,
/// 100 ms) goes away and leaves nobody waiting: the next request leaves one new interval
/// after the last that left, at 40 ms when the rate became one per 40 ms, at 250 ms for one
/// per 250 ms, and at 100 ms for the same rate.
#[tokio::test(start_paused = true)]
async fn after_a_change_of_rate_a_head_that_goes_away_leaves_the_next_one_new_interval_after_the_last(
) {
    for (every, want) in [(40, 40), (100, 100), (250, 250)] {
        let start = Instant::now();
        let log = Log::default();
        let layer = ShapeLayer::new(Quota::per_second(10)).max_waiting(10);
        let handle = layer.handle().unwrap();
        let svc = ServiceBuilder::new()
            .layer(layer)
            .service(recorder(&log, start));
        let a = send_all(&svc, vec![req("a")]).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        let b = send_all(&svc, vec![req("b")]).await;
        tokio::time::sleep(Duration::from_millis(9)).await;
        handle
            .set_quota(Quota::new(1, Duration::from_millis(every)))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        b[0].abort();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let c = send_all(&svc, vec![req("c")]).await;
        assert_eq!(statuses(a).await, [200]);
        assert_eq!(statuses(c).await, [200]);
        assert_eq!(log.ids(), ["a", "c"], "one every {every} ms");
        assert_eq!(log.times_ms(), [0, want], "one every {every} ms");
    }
}

/// The same on the polite client side, whose first call leaves at once without joining the
/// queue: after a change of rate, a caller that gives up at the head of the queue leaves the
/// next call one new interval after the last one made.
#[tokio::test(start_paused = true)]
async fn after_a_change_of_rate_a_polite_caller_that_gives_up_leaves_the_next_call_one_new_interval_after_the_last(
) {
    for (every, want) in [(40, 40), (250, 250)] {
        let start = Instant::now();
        let calls = Arc::new(Mutex::new(Vec::<(u64, u32)>::new()));
        let partner = {
            let calls = calls.clone();
            service_fn(move |id: u32| {
                calls
                    .lock()
                    .unwrap()
                    .push((start.elapsed().as_millis() as u64, id));
                async move { Ok::<_, std::io::Error>(id) }
            })
        };
        let shaper = Shaper::<()>::new(Quota::per_second(10));
        let mut client = ServiceBuilder::new()
            .layer(PoliteLayer::with_shaper(shaper.clone()))
            .service(partner);
        // `call` takes the place in the queue.
        client.ready().await.unwrap().call(0).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let gives_up = tokio::spawn(client.ready().await.unwrap().call(1));
        tokio::time::sleep(Duration::from_millis(9)).await;
        shaper
            .set_quota(Quota::new(1, Duration::from_millis(every)))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        gives_up.abort();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(client.ready().await.unwrap().call(2).await.unwrap(), 2);
        assert_eq!(
            *calls.lock().unwrap(),
            [(0, 0), (want, 2)],
            "one every {every} ms"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_queue_and_rate() {
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(
            ShapeLayer::new(Quota::per_second(10))
                .max_waiting(10)
                .key(Header::new("x-key")),
        )
        .service(recorder(&log, start));
    let mut handles = send_all(
        &svc,
        vec![
            keyed_req("a", "a0"),
            keyed_req("a", "a1"),
            keyed_req("a", "a2"),
            keyed_req("b", "b0"),
            keyed_req("b", "b1"),
        ],
    )
    .await;
    handles.extend(send_all(&svc, vec![keyed_req("c", "c0")]).await);
    statuses(handles).await;
    let mut got: Vec<_> = log.0.lock().unwrap().clone();
    got.sort();
    let ms = |t: u64, id: &str| (Duration::from_millis(t), id.to_owned());
    assert_eq!(
        got,
        [
            ms(0, "a0"),
            ms(0, "b0"),
            ms(0, "c0"),
            ms(100, "a1"),
            ms(100, "b1"),
            ms(200, "a2"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_follows_the_layer_policy() {
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(10)).key(Header::new("x-key")))
        .service(recorder(&Log::default(), Instant::now()));
    let resp = svc.clone().oneshot(req(0)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    let svc = ServiceBuilder::new()
        .layer(
            ShapeLayer::new(Quota::per_second(10))
                .key(Header::new("x-key"))
                .on_missing_key(MissingKey::UseKey(b"anonymous".to_vec().into())),
        )
        .service(recorder(&Log::default(), Instant::now()));
    let handles = send_all(&svc, vec![req(0), keyed_req("anonymous", 1)]).await;
    let start = Instant::now();
    statuses(handles).await;
    // Both in the "anonymous" queue: the second waited one interval.
    assert_eq!(start.elapsed(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn no_delay_burst_forwards_that_many_ahead_of_the_rate_like_nginx_delay() {
    // nginx: rate=10r/s burst=5 delay=2.
    let start = Instant::now();
    let log = Log::default();
    let svc = ServiceBuilder::new()
        .layer(
            ShapeLayer::new(Quota::per_second(10))
                .no_delay_burst(2)
                .max_waiting(3),
        )
        .service(recorder(&log, start));
    let handles = send_all(&svc, (0..7).map(req).collect()).await;
    assert_eq!(statuses(handles).await, [200, 200, 200, 200, 200, 200, 429]);
    assert_eq!(log.times_ms(), [0, 0, 0, 100, 200, 300]);
}

#[tokio::test(start_paused = true)]
async fn a_high_rate_keeps_its_average_over_ten_seconds() {
    // 5 000/s is one every 200 µs, finer than tokio's 1 ms timer: several leave per tick.
    let start = Instant::now();
    let count = Arc::new(Mutex::new(Vec::<Duration>::with_capacity(60_000)));
    let inner = {
        let count = count.clone();
        service_fn(move |_req: Request<Body>| {
            count.lock().unwrap().push(start.elapsed());
            async { Ok::<_, Infallible>(Response::new(Body::empty())) }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(ShapeLayer::new(Quota::per_second(5_000)).max_waiting(1_000))
        .service(inner);
    let end = start + Duration::from_secs(10);
    // Closed loop: 64 clients, each sending again as soon as answered; the queue never empties.
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                while Instant::now() < end {
                    let resp = svc.clone().oneshot(req(0)).await.unwrap();
                    assert_eq!(resp.status(), StatusCode::OK);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let times = count.lock().unwrap();
    let in_window = times
        .iter()
        .filter(|t| **t < Duration::from_secs(10))
        .count();
    let expected = 50_000.0;
    let error = (in_window as f64 - expected).abs() / expected;
    assert!(
        error < 0.005,
        "{in_window} departures in 10 s, expected 50 000 (error {:.3}%)",
        error * 100.0
    );
    // And no burst: never more than one tick's worth (plus one) in any millisecond.
    let mut per_ms = std::collections::HashMap::<u128, u32>::new();
    for t in times.iter() {
        *per_ms.entry(t.as_millis()).or_default() += 1;
    }
    let max = per_ms.values().copied().max().unwrap_or(0);
    assert!(max <= 6, "{max} departures in one millisecond");
}

#[tokio::test(start_paused = true)]
async fn the_polite_client_never_exceeds_the_rate_and_never_refuses() {
    let start = Instant::now();
    let calls = Arc::new(Mutex::new(Vec::<(Duration, u32)>::new()));
    let partner = {
        let calls = calls.clone();
        service_fn(move |id: u32| {
            calls.lock().unwrap().push((start.elapsed(), id));
            async move { Ok::<_, std::io::Error>(id * 2) }
        })
    };
    let client = ServiceBuilder::new()
        .layer(PoliteLayer::new(Quota::per_second(10)))
        .service(partner);
    // 40 callers in 4 waves, some of whom give up early.
    let mut tasks = Vec::new();
    for wave in 0..4u32 {
        for i in 0..10u32 {
            let id = wave * 10 + i;
            let mut client = client.clone();
            let fut = client.ready().await.unwrap().call(id);
            let patience = if id % 7 == 3 {
                Duration::from_millis(150)
            } else {
                Duration::from_secs(60)
            };
            tasks.push(tokio::spawn(async move {
                (id, tokio::time::timeout(patience, fut).await)
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut answered = 0;
    for t in tasks {
        let (id, result) = t.await.unwrap();
        match result {
            Ok(Ok(v)) => {
                assert_eq!(v, id * 2);
                answered += 1;
            }
            Ok(Err(e)) => panic!("the client refused or failed: {e}"),
            Err(_) => assert_eq!(id % 7, 3, "only impatient callers time out"),
        }
    }
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), answered);
    // Never above the rate: consecutive calls at least one interval apart.
    for w in calls.windows(2) {
        assert!(
            w[1].0 - w[0].0 >= Duration::from_millis(100),
            "calls too close: {w:?}"
        );
    }
    // And the callers who gave up did not slow the others: the queue stayed busy.
    let span = calls.last().unwrap().0 - calls[0].0;
    assert_eq!(span, Duration::from_millis(100) * (answered as u32 - 1));
}

#[tokio::test(start_paused = true)]
async fn until_slot_spaces_work_and_is_cancel_safe() {
    let shaper = Shaper::<&str>::new(Quota::per_second(4));
    let start = Instant::now();
    shaper.until_slot(&"jobs").await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    // A slot abandoned in a select (here: a timeout) consumes nothing.
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), shaper.until_slot(&"jobs")).await;
    assert!(gave_up.is_err());
    shaper.until_slot(&"jobs").await;
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    // Other keys are not held up.
    shaper.until_slot(&"mail").await;
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    // The place is taken at the call, not at the first poll.
    let first = shaper.until_slot(&"jobs");
    let second = shaper.until_slot(&"jobs");
    let second = tokio::spawn(async move {
        second.await;
        start.elapsed()
    });
    tokio::task::yield_now().await;
    first.await;
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(second.await.unwrap(), Duration::from_millis(750));
}

#[tokio::test(start_paused = true)]
async fn reserve_applies_the_bounds_and_until_slot_does_not() {
    let shaper = Shaper::<()>::builder(Quota::per_second(10))
        .max_waiting(1)
        .build();
    let a = shaper.reserve(&()).unwrap();
    let b = shaper.reserve(&()).unwrap();
    let full = shaper.reserve(&()).unwrap_err();
    assert_eq!(full.retry_after(), Duration::from_millis(100));
    let polite = shaper.until_slot(&());
    let start = Instant::now();
    a.await;
    b.await;
    polite.await;
    assert_eq!(start.elapsed(), Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_forgotten_and_cost_nothing() {
    let shaper = Shaper::<u32>::new(Quota::per_second(10));
    for k in 0..100 {
        shaper.until_slot(&k).await;
    }
    assert_eq!(shaper.len(), 100);
    assert_eq!(
        shaper.evict_idle(),
        100,
        "every key left less than 100 ms ago"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(shaper.evict_idle(), 0);
    assert!(shaper.is_empty());
}

#[tokio::test(start_paused = true)]
async fn when_every_tracked_key_is_busy_new_keys_are_refused() {
    let layer = ShapeLayer::new(Quota::per_second(1))
        .max_waiting(5)
        .max_keys(1)
        .key(Header::new("x-key"));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(recorder(&Log::default(), Instant::now()));
    // Key a is busy (one request waiting) when b arrives.
    let handles = send_all(
        &svc,
        vec![keyed_req("a", 0), keyed_req("a", 1), keyed_req("b", 2)],
    )
    .await;
    let mut resps = Vec::new();
    for h in handles {
        resps.push(h.await.unwrap());
    }
    let codes: Vec<u16> = resps.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(codes, [200, 200, 429]);
    assert_eq!(header(&resps[2], "retry-after"), Some("1"));
    assert_eq!(layer.shaper().unwrap().len(), 1);
    // Once a is idle, b is tracked in its place.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resp = svc.clone().oneshot(keyed_req("b", 3)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(layer.shaper().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn infallible_is_preserved_under_axum_and_one_layer_is_one_state() {
    let shared = ShapeLayer::new(Quota::per_second(10)).max_waiting(10);
    let app: Router = Router::new()
        .route("/a", get(|| async { "a" }).layer(shared.clone()))
        .route("/b", get(|| async { "b" }).layer(shared))
        .route_layer(ShapeLayer::new(Quota::per_second(1_000)))
        .layer(ShapeLayer::new(Quota::per_second(1_000)));
    fn infallible<S: Service<Request<Body>, Error = Infallible>>(_: &S) {}
    let mut svc = app.into_service::<Body>();
    infallible(&svc);
    let start = Instant::now();
    let a = svc.call(Request::get("/a").body(Body::empty()).unwrap());
    let b = svc.call(Request::get("/b").body(Body::empty()).unwrap());
    let (a, b) = tokio::join!(
        async { (a.await.unwrap().status(), start.elapsed()) },
        async { (b.await.unwrap().status(), start.elapsed()) },
    );
    // /a and /b share one queue: b leaves one interval after a. The outer layers (1 ms apart)
    // hold nothing up beyond that.
    assert_eq!(a, (StatusCode::OK, Duration::ZERO));
    assert_eq!(b, (StatusCode::OK, Duration::from_millis(100)));
}

#[tokio::test(start_paused = true)]
async fn stacks_with_the_rate_limit_layer_in_a_service_builder() {
    let start = Instant::now();
    let log = Log::default();
    // Shaping in front smooths the stream the rate limiter then sees.
    let svc = ServiceBuilder::new()
        .layer(
            ShapeLayer::new(Quota::per_second(10))
                .max_waiting(3)
                .name("smooth"),
        )
        .layer(
            RateLimitLayer::new(Quota::per_second(5).burst(2))
                .name("limit")
                .clock(Clock::tokio()),
        )
        .service(recorder(&log, start));
    let handles = send_all(&svc, (0..5).map(req).collect()).await;
    let mut resps = Vec::new();
    for h in handles {
        resps.push(h.await.unwrap());
    }
    let codes: Vec<u16> = resps.iter().map(|r| r.status().as_u16()).collect();
    // 5th: the shaping queue is full. 3rd and 4th: forwarded at 200 and 300 ms, faster than the
    // limiter's 5/s after its burst of 2, so the limiter refuses one of them.
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    assert_eq!(log.times_ms(), [0, 100, 200]);
    // Both layers' fields are on the shaped responses.
    let policies: Vec<_> = resps[0]
        .headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    // Bursts of 2 and 4 take 0.4 s: not whole seconds, so both state their rate per second.
    assert_eq!(policies, ["\"limit\";q=5;w=1", "\"smooth\";q=10;w=1"]);
    // The shaper's own refusal says when a place frees up.
    assert_eq!(header(&resps[4], "retry-after"), Some("1"));
}

#[test]
fn invalid_settings_are_reported_when_the_layer_is_built() {
    let bad_name = ShapeLayer::new(Quota::per_second(1)).name("a\"b");
    assert!(bad_name.validate().is_err());
    let no_keys = ShapeLayer::new(Quota::per_second(1)).max_keys(0);
    assert!(no_keys.validate().is_err());
    let bad_status = ShapeLayer::new(Quota::per_second(1))
        .key(Header::new("x-key"))
        .on_missing_key(MissingKey::Reject(StatusCode::OK));
    assert!(bad_status.validate().is_err());
}

/// Lost wake-ups would hang here: many threads join, leave and give up on one key at once.
/// Real time, but short: 4 000 slots at 50 000/s is 80 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waiters_on_many_threads_all_get_their_turn() {
    let shaper = Shaper::<()>::new(Quota::per_second(50_000));
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let shaper = shaper.clone();
            let left = left.clone();
            tokio::spawn(async move {
                for i in 0..500 {
                    let slot = shaper.until_slot(&());
                    if (task + i) % 5 == 0 {
                        // Give up at once: it leaves the queue without consuming a slot.
                        drop(slot);
                    } else {
                        slot.await;
                        left.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .expect("every waiter got its turn");
    assert_eq!(left.load(std::sync::atomic::Ordering::Relaxed), 3_200);
    // The one key is idle, or about to be (its last slot was just used).
    assert!(shaper.evict_idle() <= 1);
}
