//! Different limits on different routes, stacked with one for the whole API.
//!
//! ```text
//! cargo run --example per_route
//! curl -i -X POST localhost:3000/login      # 5 per minute per client IP
//! curl -i localhost:3000/api/items -H 'x-api-key: k1'   # 100/s, burst 200, per API key
//! ```

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use http::StatusCode;
use tollgate::{key, MissingKey, Policy, Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    // Login attempts: per client IP, 5 per minute.
    let login_limit =
        RateLimitLayer::new(Policy::new("login", Quota::per_minute(5))).key(key::PeerIp::new());

    // The API: per API key, 100 per second with bursts of 200, and 100 000 per day.
    // Requests without a key are answered 401 before any handler runs.
    let api_limit = RateLimitLayer::new(
        Policy::new("api", Quota::per_second(100).burst(200))
            .quota(Quota::per_day(100_000).named("api-daily")),
    )
    .key(key::Header::new("x-api-key"))
    .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
    .skip_path("/health");

    let app = Router::new()
        .route(
            "/login",
            post(|| async { "logged in\n" }).layer(login_limit),
        )
        .route("/api/items", get(|| async { "[]\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(api_limit);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  POST /login       5/min per IP (and the API limit)");
    println!("  GET  /api/items   100/s burst 200 + 100000/day per x-api-key");
    println!("  GET  /health      not limited");
    println!("try: curl -i -H 'x-api-key: k1' http://{local}/api/items");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
