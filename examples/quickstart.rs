//! The quickstart: `GET /` limited per client IP to 1 request per second, burst 5.
//!
//! ```text
//! cargo run --example quickstart
//! for i in $(seq 7); do curl -si localhost:3000/ | grep -iE '^(HTTP|retry-after|ratelimit)'; done
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`. Five `200 OK`s, each with the
//! body `Hello! You may send N more request(s) right now.` (N = 4, 3, 2, 1, 0), then
//! `429 Too Many Requests` with `retry-after: 1`: the README shows the headers line by line.
//!
//! `key::PeerIp` reads the client's address from axum's `ConnectInfo`, so the app is served
//! with `into_make_service_with_connect_info::<SocketAddr>()`. Served without it, every request
//! has no key and gets the missing-key answer (`400 Bad Request` by default).

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{key, Clock, Decision, Policy, Quota, RateLimitLayer};

async fn hello(decision: Decision) -> String {
    format!(
        "Hello! You may send {} more request(s) right now.\n",
        decision.remaining()
    )
}

/// The app. `clock` is a parameter so that the tests can run it on a manual clock; a server
/// passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    let per_ip = RateLimitLayer::new(Policy::new("per-ip", Quota::per_second(1).burst(5)))
        .key(key::PeerIp)
        .clock(clock);
    Router::new().route("/", get(hello).layer(per_ip))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate quickstart listening on http://{local}");
    println!("  GET /   limited per client IP: 1 request/s, burst 5");
    println!();
    println!("Try it (five 200s, then 429s with Retry-After):");
    println!("  for i in $(seq 7); do curl -si http://{local}/ | grep -iE '^(HTTP|retry-after|ratelimit)'; done");
    // PeerIp needs the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app(Clock::default()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
