//! Different limits on different routes: a login limit per client IP, and an API limit per
//! API key that the login route is not under.
//!
//! ```text
//! cargo run --example per_route
//! curl -i -X POST localhost:3000/login
//! curl -i localhost:3000/api/items -H 'x-api-key: k1'
//! curl -i localhost:3000/api/items
//! curl -i localhost:3000/health
//! curl -i localhost:3000/nope
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`:
//!
//! * `POST /login`: `200 logged in`, 5 per minute per client IP (`ratelimit-policy:
//!   "login";q=5;w=60`); the sixth in a minute gets `429` with `retry-after: 12`. No API key
//!   needed: the API limit is not on this route.
//! * `GET /api/items` with `x-api-key`: `200 []`, 100 per second with bursts of 200 and
//!   100 000 per day, per API key (`ratelimit-policy: "api";q=200;w=2, "api-daily";q=100000;w=86400`).
//! * `GET /api/items` without `x-api-key`: `401 Unauthorized`.
//! * `GET /health`: `200 ok`, not limited, no `RateLimit` fields.
//! * `GET /nope`: `404 Not Found`, untouched by any limit.
//!
//! The API limit is a `route_layer` on the nested `/api` router, so it runs only for the
//! routes of that router: a request for an unknown path stays a `404`, and `/login` and
//! `/health` are not under it. The login limit keys by `key::PeerIp`, which needs the server
//! to be served with `into_make_service_with_connect_info::<SocketAddr>()`; without it every
//! login would get `400 Bad Request` (no client address, the default missing-key answer).

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use tollgate::{key, Clock, MissingKey, Policy, Quota, RateLimitLayer};

/// The app. `clock` is a parameter so that the tests can run it on a manual clock; a server
/// passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    // Login attempts: per client IP, 5 per minute.
    let login_limit = RateLimitLayer::new(Policy::new("login", Quota::per_minute(5)))
        .key(key::PeerIp)
        .clock(clock.clone());

    // The API: per API key, 100 per second with bursts of 200, and 100 000 per day.
    // Requests without a key are answered 401 before any handler runs.
    let api_limit = RateLimitLayer::new(
        // Each quota named, so clients see which one they ran into.
        Policy::new("api", Quota::per_second(100).burst(200).named("api"))
            .quota(Quota::per_day(100_000).named("api-daily")),
    )
    .key(key::Header::new("x-api-key"))
    .on_missing_key(MissingKey::reject(401))
    .clock(clock);

    let api = Router::new()
        .route("/items", get(|| async { "[]\n" }))
        // `route_layer`: only the routes above; an unknown `/api/...` path stays a 404.
        .route_layer(api_limit);

    Router::new()
        .route(
            "/login",
            post(|| async { "logged in\n" }).route_layer(login_limit),
        )
        .route("/health", get(|| async { "ok\n" }))
        .nest("/api", api)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  POST /login       5/min per client IP, no API key needed");
    println!("  GET  /api/items   100/s burst 200 + 100000/day per x-api-key; 401 without one");
    println!("  GET  /health      not limited");
    println!("try: curl -i -X POST http://{local}/login");
    println!("     curl -i -H 'x-api-key: k1' http://{local}/api/items");
    // PeerIp needs the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app(Clock::default()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
