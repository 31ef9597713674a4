//! The quickstart: `GET /` limited per client IP to 1 request per second, burst 5.
//!
//! ```text
//! cargo run --example quickstart
//! for i in $(seq 7); do curl -si localhost:3000/ | head -n 1; done
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`.

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::{key, Decision, Policy, Quota, RateLimitLayer};

async fn hello(decision: Decision) -> String {
    format!(
        "Hello! You may send {} more request(s) right now.\n",
        decision.remaining()
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    let per_ip = RateLimitLayer::new(Policy::new("per-ip", Quota::per_second(1).burst(5)))
        .key(key::PeerIp::new());

    let app = Router::new().route("/", get(hello).layer(per_ip));

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate quickstart listening on http://{local}");
    println!("  GET /   limited per client IP: 1 request/s, burst 5");
    println!();
    println!("Try it (five 200s, then 429s with Retry-After):");
    println!(
        "  for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{local}/; done"
    );
    println!("  curl -i http://{local}/");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
