//! Traffic shaping on a server: requests are delayed and forwarded at a fixed rate instead of
//! being refused, until the queue is full.
//!
//! ```text
//! cargo run --example shaping
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`, and prints `curl` lines to try:
//!
//! * `GET /` — everyone shares one queue, 2 requests per second, at most 4 waiting. Eight at
//!   once: one is served at once, four are served 0.5 s apart (at +0.5, +1.0, +1.5 and
//!   +2.0 s), three are refused at once with `429` and `retry-after`.
//! * `GET /per-ip` — one queue per client IP, 5 per second; the first 3 after idle go at once,
//!   then one every 0.2 s, at most 6 waiting and never longer than 1.5 s (nginx
//!   `limit_req burst=8 delay=2`). Ten at once from one client: 3 at once, 6 spaced 0.2 s
//!   apart, one refused with `429`.
//!
//! Each shaper is a layer of its own route, so unknown paths stay `404`. The per-IP
//! queue keys by `key::PeerIp`, which needs the server to be served with
//! `into_make_service_with_connect_info::<SocketAddr>()`; without it every request to
//! `/per-ip` gets `400 Bad Request` (no client address, the default missing-key answer).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tokio::time::Instant;
use tollgate::{key, Quota, ShapeLayer};

/// The app. Shaping waits on tokio's timer and reads tokio's clock, so the tests run it under
/// a paused clock.
pub fn app() -> Router {
    let started = Instant::now();
    let served_at =
        move || async move { format!("served at +{:.3}s\n", started.elapsed().as_secs_f64()) };

    // Everyone together: 2 per second, up to 4 waiting (the last about 2 s), the rest get 429.
    let shared = ShapeLayer::new(Quota::per_second(2))
        .max_waiting(4)
        .name("shared");

    // Per client IP: 5 per second; 3 at once after idle, then spaced out; at most 6 waiting
    // and never longer than 1.5 s.
    let per_ip = ShapeLayer::new(Quota::per_second(5))
        .no_delay_burst(2)
        .max_waiting(6)
        .max_wait(Duration::from_millis(1500))
        .key(key::PeerIp)
        .name("per-ip");

    Router::new()
        .route("/", get(served_at).layer(shared))
        .route("/per-ip", get(served_at).layer(per_ip))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate shaping example listening on http://{local}");
    println!("  GET /        one queue for everyone: 2 requests/s, at most 4 waiting");
    println!("  GET /per-ip  one queue per client IP: 5 requests/s, 3 at once after idle");
    println!();
    println!("Eight at once: one now, four spaced 0.5 s apart, three refused with 429:");
    println!(
        "  for i in $(seq 8); do curl -s -o /dev/null -w '%{{http_code}} after %{{time_total}}s\\n' http://{local}/ & done; wait"
    );
    println!("Headers of a refusal (Retry-After, RateLimit-Policy, RateLimit):");
    println!("  for i in $(seq 6); do curl -s -o /dev/null http://{local}/ & done; sleep 0.1; curl -si http://{local}/; wait");
    println!("Per IP, ten at once: three now, six spaced 0.2 s apart, one refused with 429:");
    println!(
        "  for i in $(seq 10); do curl -s -o /dev/null -w '%{{http_code}} after %{{time_total}}s\\n' http://{local}/per-ip & done; wait"
    );
    // PeerIp needs the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app().into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
