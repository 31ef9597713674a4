//! An adaptive concurrency limit whose limit moves while permits are held and requests wait.
//! A response that ends and teaches the algorithm a lower limit pays the debt with its own
//! place: it is not handed to a waiter. Over random arrivals, latencies and failures, under
//! each algorithm, globally and per key (one limit learnt from every key), no request enters
//! with more of its key in flight than the highest limit in force at that instant (a waiter
//! handed a place may start after another response, ending at the same instant, lowered the
//! limit: it was let in under the higher one, and requests in flight are never cut short).
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
use tollgate::key::Header;
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

type Boxed = tower::util::BoxCloneService<
    Request<()>,
    Response<tollgate::concurrency::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// Runs `arrivals` through `svc`, request `i` of key `i % keys`, and returns every time a
/// request reached the handler with more of its key in flight than the highest limit in force
/// at that instant (`limit` reads the limit in force): (request, in flight, limit).
async fn run(
    svc: impl FnOnce(service_fn_of::Handler) -> Boxed,
    limit: Arc<dyn Fn() -> usize + Send + Sync>,
    arrivals: Vec<Arrival>,
    keys: usize,
) -> Vec<(usize, usize, usize)> {
    let start = tokio::time::Instant::now();
    let over = Arc::new(Mutex::new(Vec::new()));
    let highest = Arc::new(Mutex::new(Highest {
        last: limit(),
        ..Highest::default()
    }));
    // Per key, the requests that reached the handler and whose body is not read to its end.
    let flying = Arc::new(Mutex::new(vec![0usize; keys]));
    let handler = {
        let (limit, over, highest, flying) =
            (limit.clone(), over.clone(), highest.clone(), flying.clone());
        service_fn_of::handler(move |r: Request<()>| {
            let (limit, over, highest, flying) =
                (limit.clone(), over.clone(), highest.clone(), flying.clone());
            async move {
                let id: usize = r.headers()["x-id"].to_str().unwrap().parse().unwrap();
                let took: u64 = r.headers()["x-took"].to_str().unwrap().parse().unwrap();
                let fails = r.headers().contains_key("x-fails");
                let n = {
                    let mut flying = flying.lock().unwrap();
                    flying[id % keys] += 1;
                    flying[id % keys]
                };
                let most = highest.lock().unwrap().see(limit());
                if n > most {
                    over.lock().unwrap().push((id, n, most));
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
    let svc = svc(handler);
    let tasks: Vec<_> = arrivals
        .into_iter()
        .enumerate()
        .map(|(i, (at, took, fails))| {
            let (svc, limit, highest, flying) =
                (svc.clone(), limit.clone(), highest.clone(), flying.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                let mut req = Request::get("/")
                    .header("x-key", (i % keys).to_string())
                    .header("x-id", i.to_string())
                    .header("x-took", took.to_string());
                if fails {
                    req = req.header("x-fails", "1");
                }
                let resp = svc.oneshot(req.body(()).unwrap()).await.unwrap();
                let reached = resp.status() != StatusCode::TOO_MANY_REQUESTS
                    && !resp.headers().contains_key("retry-after");
                // Read to the end: each response teaches the algorithm, and its place is free.
                let _ = resp.into_body().collect().await;
                if reached {
                    flying.lock().unwrap()[i % keys] -= 1;
                }
                highest.lock().unwrap().see(limit());
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let over = over.lock().unwrap().clone();
    over
}

/// The handler's type, boxed, so that a layer with a key and one without wrap the same.
mod service_fn_of {
    use super::*;

    pub type Handler = tower::util::BoxCloneService<Request<()>, Response<Full<Bytes>>, Infallible>;

    pub fn handler<F, Fut>(f: F) -> Handler
    where
        F: FnMut(Request<()>) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>>
            + Send
            + 'static,
    {
        Handler::new(service_fn(f))
    }
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
        keyed in any::<bool>(),
    ) {
        let layer = ConcurrencyLimitLayer::new(16).queue(64, Duration::from_secs(10));
        let layer = match algorithm {
            0 => layer.adaptive(Aimd::default().initial(initial).range(1, 16)),
            1 => layer.adaptive(Vegas::new(initial, 1, 16)),
            _ => layer.adaptive(Gradient2::new(initial, 1, 16)),
        };
        let over = if keyed {
            // One limit learnt from every key, each key held to it.
            let layer = layer.key(Header::new("x-key"));
            let limit: Arc<dyn Fn() -> usize + Send + Sync> = Arc::new({
                let layer = layer.clone();
                move || layer.limit()
            });
            paused().block_on(run(move |h| Boxed::new(layer.layer(h)), limit, arrivals, 3))
        } else {
            let limit: Arc<dyn Fn() -> usize + Send + Sync> = Arc::new({
                let layer = layer.clone();
                move || layer.limit()
            });
            paused().block_on(run(move |h| Boxed::new(layer.layer(h)), limit, arrivals, 1))
        };
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
