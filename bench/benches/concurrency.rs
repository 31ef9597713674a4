//! tollgate's `ConcurrencyLimitLayer` against tower's `GlobalConcurrencyLimitLayer`.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench concurrency
//! # shorter, while developing:
//! cargo bench -p tollgate-bench --bench concurrency -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Each request goes through a `tower::ServiceBuilder` stack around a trivial service that
//! answers with a one-chunk `Full<Bytes>` body: `ready().await`, `call(request).await`, then
//! the body is read to its end and dropped, as a server would. Everything runs on a
//! current-thread tokio runtime. The limit (1024) is never reached.
//!
//! * `global/tollgate`: `ConcurrencyLimitLayer::new(1024)`, the permit held by the response
//!   body (the default) and given back with its last frame.
//! * `global/tower`: `GlobalConcurrencyLimitLayer::new(1024)`, which takes the permit in
//!   `poll_ready` and gives it back when the response future completes (it does not track the
//!   body).
//! * `global/none`: the bare service, for scale.
//! * `rejecting/tollgate`: the same layer with its only place held, so every request is
//!   answered `503` with `Retry-After` by the layer. `rejecting/plain_503`: a service that
//!   answers the same response itself. Under a flood the rejection path is the hot path.
//! * `keyed/one_key` and `keyed/10k_keys`: tollgate keyed by a request header, one key hammered
//!   or 10 000 keys visited round-robin. Every request creates and drops its key's semaphore in
//!   the second case, since no key has anything else in flight.
//! * `keyed_2_threads/...`: the same on two threads at once, each with its own runtime and
//!   keys; the figure is wall time / total requests.

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tollgate::{key, ConcurrencyLimitLayer};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

const LIMIT: usize = 1024;

fn hello(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// One request through `svc`, its body read to the end and dropped.
async fn one<S, B>(svc: &mut S, req: Request<()>)
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let svc = match svc.ready().await {
        Ok(svc) => svc,
        Err(never) => match never {},
    };
    let resp = match svc.call(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    let body = resp.into_body().collect().await.expect("a body");
    black_box(body);
}

/// Times `iters` requests in one `block_on`, as criterion's async bencher would.
fn run<S, B>(
    rt: &tokio::runtime::Runtime,
    svc: &mut S,
    iters: u64,
    req: impl Fn(usize) -> Request<()>,
) -> Duration
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = Instant::now();
        for i in 0..iters as usize {
            one(svc, req(i)).await;
        }
        start.elapsed()
    })
}

fn global(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("global");
    let plain = |_| black_box(Request::new(()));

    let mut ours = ServiceBuilder::new()
        .layer(ConcurrencyLimitLayer::new(LIMIT))
        .service(service_fn(hello));
    g.bench_function("tollgate", |b| {
        b.iter_custom(|n| run(&rt, &mut ours, n, plain))
    });

    let mut tower = ServiceBuilder::new()
        .layer(GlobalConcurrencyLimitLayer::new(LIMIT))
        .service(service_fn(hello));
    g.bench_function("tower", |b| {
        b.iter_custom(|n| run(&rt, &mut tower, n, plain))
    });

    let mut bare = service_fn(hello);
    g.bench_function("none", |b| b.iter_custom(|n| run(&rt, &mut bare, n, plain)));
    g.finish();
}

fn busy(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(b"Service Unavailable\n")));
    *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = resp.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    std::future::ready(Ok(resp))
}

fn rejecting(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("rejecting");
    let plain = |_| black_box(Request::new(()));

    let layer = ConcurrencyLimitLayer::new(1);
    let mut ours = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(hello));
    // One response whose body is never read holds the only place.
    let held = rt.block_on(async {
        let svc = ours.ready().await.expect("ready");
        svc.call(Request::new(())).await.expect("a response")
    });
    g.bench_function("tollgate", |b| {
        b.iter_custom(|n| run(&rt, &mut ours, n, plain))
    });
    assert_eq!(layer.in_flight(), 1);
    drop(held);

    let mut direct = service_fn(busy);
    g.bench_function("plain_503", |b| {
        b.iter_custom(|n| run(&rt, &mut direct, n, plain))
    });
    g.finish();
}

fn keyed_requests(n: usize, prefix: &str) -> Vec<HeaderValue> {
    (0..n)
        .map(|i| HeaderValue::from_str(&format!("{prefix}{i}")).expect("a header value"))
        .collect()
}

fn request(key: &HeaderValue) -> Request<()> {
    let mut req = Request::new(());
    req.headers_mut().insert("x-api-key", key.clone());
    req
}

fn keyed(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("keyed");
    for (name, n) in [("one_key", 1), ("10k_keys", 10_000)] {
        let layer = ConcurrencyLimitLayer::new(LIMIT).key(key::Header::new("x-api-key"));
        let mut svc = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(hello));
        let keys = keyed_requests(n, "client-");
        g.bench_function(name, |b| {
            b.iter_custom(|n| run(&rt, &mut svc, n, |i| request(&keys[i % keys.len()])))
        });
        assert_eq!(layer.tracked_keys(), 0);
    }
    g.finish();
}

fn keyed_2_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_2_threads");
    for (name, n) in [("one_key_each", 1), ("10k_keys_each", 10_000)] {
        let layer = ConcurrencyLimitLayer::new(LIMIT).key(key::Header::new("x-api-key"));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let barrier = Barrier::new(2);
                let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
                    let workers: Vec<_> = ["a-", "b-"]
                        .into_iter()
                        .map(|prefix| {
                            let (layer, barrier) = (layer.clone(), &barrier);
                            s.spawn(move || {
                                let rt = runtime();
                                let mut svc = ServiceBuilder::new()
                                    .layer(layer)
                                    .service(service_fn(hello));
                                let keys = keyed_requests(n, prefix);
                                barrier.wait();
                                let start = Instant::now();
                                rt.block_on(async {
                                    for i in 0..iters as usize {
                                        one(&mut svc, request(&keys[i % keys.len()])).await;
                                    }
                                });
                                (start, Instant::now())
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| w.join().expect("a worker"))
                        .collect()
                });
                let start = spans.iter().map(|s| s.0).min().expect("two spans");
                let end = spans.iter().map(|s| s.1).max().expect("two spans");
                // Wall time per request, over both threads' requests.
                (end - start) / 2
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(2));
    targets = global, rejecting, keyed, keyed_2_threads
}
criterion_main!(benches);
