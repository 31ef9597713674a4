//! Runs N requests through a `RateLimitLayer` service (memory store, 10 000 client IPs, no
//! HTTP server), with and without a penalty box, for instruction counts of one request:
//!
//! ```text
//! cargo build --profile bench -p tollgate-bench --example bench_penalty
//! valgrind --tool=callgrind --toggle-collect='bench_penalty::run*' \
//!     target/release/examples/bench_penalty admit-box 200000
//! ```
//!
//! Kinds: `admit` / `admit-box` (the quota never reached, without / with a penalty box),
//! `reject` / `banned` (every request rejected: by the quota without a penalty box, and by a
//! ban with one), `allowed` (every client in the allow list). Only `run` is meant to be
//! collected, so setup (building the layer, banning the keys) stays out of the counts.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tollgate::penalty::PenaltyBox;
use tollgate::{key, Quota, RateLimitLayer};
use tower::{Layer, Service};

const KEYS: usize = 10_000;

fn requests() -> Vec<Request<()>> {
    (0..KEYS as u32)
        .map(|i| {
            let mut req = Request::new(());
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i));
            req.extensions_mut().insert(SocketAddr::new(ip, 40_000));
            req
        })
        .collect()
}

/// Polls a future that is ready at once (the memory store never waits).
fn now<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(
        futures_util::task::noop_waker_ref(),
    )) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the memory store answers at once"),
    }
}

#[inline(never)]
fn run<S>(svc: &mut S, reqs: &[Request<()>], n: u64) -> u64
where
    S: Service<Request<()>, Response = Response<Bytes>, Error = Infallible>,
{
    let mut ok = 0;
    let mut i = 0;
    for _ in 0..n {
        let mut req = Request::new(());
        *req.extensions_mut() = reqs[i].extensions().clone();
        let resp = now(svc.call(black_box(req))).unwrap_or_else(|e| match e {});
        ok += u64::from(black_box(resp).status().is_success());
        i += 1;
        if i == reqs.len() {
            i = 0;
        }
    }
    ok
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "admit".into());
    let n: u64 = args.next().map_or(200_000, |s| s.parse().expect("N"));
    let handler = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Bytes::from_static(b"ok")))
    });
    let open = || Quota::per_second(1).burst(u32::MAX);
    let closed = || Quota::per_hour(1);
    let penalty = || PenaltyBox::new(1, Duration::from_secs(60), Duration::from_secs(3600));
    let reqs = requests();

    let layer = match kind.as_str() {
        "admit" => RateLimitLayer::new(open()).key(key::PeerIp),
        "admit-box" => RateLimitLayer::new(open())
            .key(key::PeerIp)
            .penalty_box(penalty()),
        "reject" => RateLimitLayer::new(closed()).key(key::PeerIp),
        "banned" => RateLimitLayer::new(closed())
            .key(key::PeerIp)
            .penalty_box(penalty()),
        "allowed" => RateLimitLayer::new(closed())
            .key(key::PeerIp)
            .allow_ip("10.0.0.0/8"),
        other => panic!("unknown kind {other}"),
    };
    let mut svc = layer.layer(handler);
    // Spend each key's quota (and, with a penalty box, ban it) before measuring.
    if matches!(kind.as_str(), "reject" | "banned") {
        run(&mut svc, &reqs, 2 * KEYS as u64);
    }
    let started = std::time::Instant::now();
    let ok = run(&mut svc, &reqs, n);
    let per = started.elapsed() / u32::try_from(n).unwrap_or(u32::MAX);
    println!("{kind}: {ok} of {n} served, {per:?} per request");
}
