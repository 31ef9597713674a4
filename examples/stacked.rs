//! A rate limit per client IP in front of concurrency limits.
//!
//! ```text
//! cargo run --example stacked
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`:
//!
//! * every route: at most 5 requests per second per client IP, burst 10 (outermost, so a
//!   rate-limited request never takes nor waits for a worker);
//! * `GET /`: nothing more;
//! * `GET /report` (2 s of work): at most 2 built at once across all clients; 4 more may wait
//!   up to 3 s for their turn, first come first served; the rest get `503` at once;
//! * `GET /api/users`, `GET /api/orders` (1 s of work): at most 3 in flight *per route*, and
//!   `429` over that.
//!
//! What the printed `curl` lines show:
//!
//! * eight reports at once: 2 built at once, 2 served after waiting 2 s, 2 give up after 3 s
//!   in the queue, 2 find the queue full; every rejection is `503` with `retry-after: 1`;
//! * five requests on `/api/users` at once: 3 served, 2 get `429`; `/api/orders` meanwhile
//!   is served;
//! * twelve requests in a row from one client on `/`: ten `200`s, then `429`s.
//!
//! Every limit is a `route_layer` (or a layer of one route), so unknown paths stay `404`. The
//! rate limit keys by `key::PeerIp`, which needs the server to be served with
//! `into_make_service_with_connect_info::<SocketAddr>()`; without it every request gets
//! `400 Bad Request` (no client address, the default missing-key answer).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tollgate::{key, Clock, ConcurrencyLimitLayer, Policy, Quota, RateLimitLayer};

async fn hello() -> &'static str {
    "Hello.\n"
}

async fn report() -> &'static str {
    tokio::time::sleep(Duration::from_secs(2)).await;
    "Here is your report.\n"
}

async fn users() -> &'static str {
    tokio::time::sleep(Duration::from_secs(1)).await;
    "[\"ada\", \"grace\"]\n"
}

async fn orders() -> &'static str {
    tokio::time::sleep(Duration::from_secs(1)).await;
    "[]\n"
}

/// The app. `clock` is the rate limit's clock, a parameter so that the tests can run it on
/// tokio's paused clock; a server passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    // One global limit for the expensive route, with a small queue.
    let report_workers = ConcurrencyLimitLayer::new(2)
        .queue(4, Duration::from_secs(3))
        .name("report-workers");

    // One limit per route: `key::Route` keys requests by their matched route, so each route
    // below gets its own 3 places.
    let per_route = ConcurrencyLimitLayer::new(3).key(key::Route);

    let per_ip = RateLimitLayer::new(Policy::new("per-ip", Quota::per_second(5).burst(10)))
        .key(key::PeerIp)
        .clock(clock);

    let api = Router::new()
        .route("/api/users", get(users))
        .route("/api/orders", get(orders))
        .route_layer(per_route);

    Router::new()
        .route("/", get(hello))
        .route("/report", get(report).layer(report_workers))
        .merge(api)
        // Added last, so outermost: the rate limit decides before any concurrency limit.
        // `route_layer`: the routes above only, so an unknown path stays a 404.
        .route_layer(per_ip)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let code = "-s -o /dev/null -w '%{http_code}\\n'";
    println!("tollgate stacked example listening on http://{local}");
    println!();
    println!("Eight reports at once: 2 built, 2 served after waiting, 2 give up after 3 s");
    println!("in the queue, 2 find the queue full (all rejections are 503 with Retry-After):");
    println!("  for i in $(seq 8); do curl {code} http://{local}/report & done; wait");
    println!();
    println!("Both limits' policies in the headers:");
    println!("  curl -i http://{local}/report");
    println!();
    println!("Five requests on one route: 3 served, 2 get 429; the other route is unaffected:");
    println!("  for i in $(seq 5); do curl {code} http://{local}/api/users & done; curl {code} http://{local}/api/orders; wait");
    println!();
    println!(
        "Twelve requests in a row from one IP: the rate limit answers 429 past its burst of 10:"
    );
    println!("  for i in $(seq 12); do curl {code} http://{local}/; done");
    // PeerIp needs the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app(Clock::default()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
