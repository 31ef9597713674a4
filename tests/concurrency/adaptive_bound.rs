//! An adaptive concurrency limit whose limit moves while permits are held and requests wait.
//! A response that ends and teaches the algorithm a lower limit pays the debt with its own
//! place: it is not handed to a waiter. Over random arrivals, latencies and failures, under
//! each algorithm, no request enters with more in flight than the highest limit in force at
//! that instant (a waiter handed a place may start after another response, ending at the same
//! instant, lowered the limit: it was let in under the higher one, and requests in flight are
//! never cut short).
//!
//! Pins docs/design.md section 1 ("Concurrency limit": at most `max` requests in flight).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tollgate::concurrency::{Aimd, Gradient2, Vegas};
use tollgate::ConcurrencyLimitLayer;
use tower::{service_fn, Layer, ServiceExt};

/// A request: its arrival (ms), how long the handler takes (ms), and whether it answers 503.
type Arrival = (u64, u64, bool);

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec((0u64..20, 1u64..80, prop::bool::weighted(0.3)), 1..60).prop_map(|v| {
        let mut at = 0;
        v.into_iter()
            .map(|(gap, took, fails)| {
                at += gap;
                (at, took, fails)
            })
            .collect()
    })
}

/// The highest limit in force at the current instant: the limit carried into it, and every
/// limit seen during it.
#[derive(Default)]
struct Highest {
    at: Option<tokio::time::Instant>,
    last: usize,
    most: usize,
}

impl Highest {
    /// Sees `limit` now; the highest in force at this instant.
    fn see(&mut self, limit: usize) -> usize {
        let now = tokio::time::Instant::now();
        if self.at != Some(now) {
            self.at = Some(now);
            self.most = self.last;
        }
        self.last = limit;
        self.most = self.most.max(limit);
        self.most
    }
}

/// Runs `arrivals` through `layer` and returns every time a request reached the handler with
/// more in flight than the highest limit in force at that instant: (request, in flight,
/// limit).
async fn run(layer: ConcurrencyLimitLayer, arrivals: Vec<Arrival>) -> Vec<(usize, usize, usize)> {
    let start = tokio::time::Instant::now();
    let over = Arc::new(Mutex::new(Vec::new()));
    let highest = Arc::new(Mutex::new(Highest {
        last: layer.limit(),
        ..Highest::default()
    }));
    let handler = {
        let (layer, over, highest) = (layer.clone(), over.clone(), highest.clone());
        service_fn(move |r: Request<()>| {
            let (layer, over, highest) = (layer.clone(), over.clone(), highest.clone());
            async move {
                let id: usize = r.headers()["x-id"].to_str().unwrap().parse().unwrap();
                let took: u64 = r.headers()["x-took"].to_str().unwrap().parse().unwrap();
                let fails = r.headers().contains_key("x-fails");
                // This request holds one of the places in flight.
                let n = layer.in_flight();
                let limit = highest.lock().unwrap().see(layer.limit());
                if n > limit {
                    over.lock().unwrap().push((id, n, limit));
                }
                tokio::time::sleep(Duration::from_millis(took)).await;
                let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                if fails {
                    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                }
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let svc = layer.clone().layer(handler);
    let tasks: Vec<_> = arrivals
        .into_iter()
        .enumerate()
        .map(|(i, (at, took, fails))| {
            let (svc, layer, highest) = (svc.clone(), layer.clone(), highest.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                let mut req = Request::get("/")
                    .header("x-id", i.to_string())
                    .header("x-took", took.to_string());
                if fails {
                    req = req.header("x-fails", "1");
                }
                let resp = svc.oneshot(req.body(()).unwrap()).await.unwrap();
                // Read to the end: each response teaches the algorithm.
                let _ = resp.into_body().collect().await;
                highest.lock().unwrap().see(layer.limit());
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let over = over.lock().unwrap().clone();
    over
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_request_enters_with_more_in_flight_than_the_highest_adaptive_limit_of_its_instant(
        arrivals in arrivals(),
        algorithm in 0u8..3,
        initial in 1usize..8,
    ) {
        let layer = ConcurrencyLimitLayer::new(16).queue(64, Duration::from_secs(10));
        let layer = match algorithm {
            0 => layer.adaptive(Aimd::default().initial(initial).range(1, 16)),
            1 => layer.adaptive(Vegas::new(initial, 1, 16)),
            _ => layer.adaptive(Gradient2::new(initial, 1, 16)),
        };
        let over = paused().block_on(run(layer, arrivals));
        prop_assert!(over.is_empty(), "(request, in flight, limit): {over:?}");
    }
}

/// A response whose body is never read holds its place.
fn answering() -> impl tower::Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(|r: Request<()>| async move {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
        if r.headers().contains_key("x-fails") {
            *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        Ok::<_, Infallible>(resp)
    })
}

#[tokio::test(start_paused = true)]
async fn a_response_that_lowers_the_limit_pays_the_debt_with_its_place_instead_of_handing_it_to_a_waiter(
) {
    let layer = ConcurrencyLimitLayer::new(16)
        .adaptive(Aimd::default().initial(4).range(1, 16))
        .queue(8, Duration::from_secs(10));
    let svc = layer.clone().layer(answering());
    let failing = Request::get("/").header("x-fails", "1").body(()).unwrap();
    let first = svc.clone().oneshot(failing).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(svc.clone().oneshot(Request::new(())).await.unwrap());
    }
    let waiter = tokio::spawn({
        let svc = svc.clone();
        async move { svc.oneshot(Request::new(())).await.unwrap().status() }
    });
    tokio::task::yield_now().await;
    assert_eq!((layer.in_flight(), layer.waiting()), (4, 1));
    // The 503 read to its end: the limit backs off to 3, with 3 still in flight.
    let _ = first.into_body().collect().await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(layer.limit(), 3);
    assert_eq!(
        (layer.in_flight(), layer.waiting()),
        (3, 1),
        "the place of the response went to the waiter"
    );
    // The next place given back goes to the waiter.
    drop(held.pop());
    assert_eq!(waiter.await.unwrap(), StatusCode::OK);
}
