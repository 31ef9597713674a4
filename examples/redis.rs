//! Two instances of a service sharing one limit through Redis.
//!
//! ```text
//! redis-server --port 6379 --save "" --appendonly no &
//! cargo run --example redis --features redis
//! ```
//!
//! Two routers in one process stand for two instances of a service, each with its own
//! connection to Redis: requests alternate between them, and together they get exactly the
//! burst of the shared limit (5 per API key), then 429s. Then both serve, on `127.0.0.1:3001`
//! and `127.0.0.1:3002`, so `curl -H 'x-api-key: k' localhost:3001/` and the same on 3002
//! count against one limit. Redis is taken from `REDIS_URL` (default `redis://127.0.0.1:6379`).
//!
//! The seven requests print five `200 OK`s (`RateLimit: "api";r=4;...` down to `r=0`), then
//! two `429 Too Many Requests`. The handler answers `hello; N more right now`. When Redis does
//! not answer, each instance decides alone on half the limit (`FailMode::local(0.5)`: two
//! instances, 2 per minute each, 5 × 0.5 rounded down), and the handler answers
//! `hello; N more right now, decided here: Redis did not answer`. Outages are logged through
//! `tracing` (set up here with `tracing-subscriber`): stop the redis-server while the example
//! serves and the log says so, once, then once per 10 s, then once when Redis is back.

use axum::body::Body;
use axum::{routing::get, Router};
use http::Request;
use tollgate::key::Header;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::{Decision, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

async fn hello(decision: Decision) -> String {
    if decision.is_local() {
        // Redis did not answer: this instance decided on its share of the limit.
        format!(
            "hello; {} more right now, decided here: Redis did not answer\n",
            decision.remaining()
        )
    } else {
        format!("hello; {} more right now\n", decision.remaining())
    }
}

/// One instance of the service: its own connection, the shared policy name.
pub async fn instance(url: &str) -> Result<Router, Box<dyn std::error::Error>> {
    // Two instances: while Redis is down, each enforces half the limit on its own.
    let store = RedisStore::connect(url)
        .await?
        .on_failure(FailMode::local(0.5));
    let limit = RateLimitLayer::new(Policy::new("api", Quota::per_minute(5)))
        .key(Header::new("x-api-key"))
        .store(store);
    // `route_layer`: unknown paths stay 404 and cost no Redis round trip.
    Ok(Router::new().route("/", get(hello)).route_layer(limit))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Without a subscriber the outage logs go nowhere.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let (a, b) = match tokio::try_join!(instance(&url), instance(&url)) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("cannot connect to Redis at {url}: {e}");
            eprintln!("start one with:   redis-server --port 6379 --save \"\" --appendonly no");
            eprintln!("(install it with: apt-get install -y redis-server), or set REDIS_URL");
            std::process::exit(1);
        }
    };

    // A fresh key for this run, so that the demo starts from a full burst.
    let key = format!("demo-{}", std::process::id());
    println!("7 requests with x-api-key: {key}, alternating between instance A and B:");
    for i in 0..7 {
        let (name, app) = if i % 2 == 0 { ("A", &a) } else { ("B", &b) };
        let req = Request::get("/")
            .header("x-api-key", &key)
            .body(Body::empty())?;
        let resp = app.clone().oneshot(req).await?;
        let ratelimit = resp
            .headers()
            .get("ratelimit")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        println!("  {name}: {}  RateLimit: {ratelimit}", resp.status());
    }

    let la = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    let lb = tokio::net::TcpListener::bind("127.0.0.1:3002").await?;
    println!();
    println!("instance A on http://127.0.0.1:3001, instance B on http://127.0.0.1:3002");
    println!("  curl -i -H 'x-api-key: k' http://127.0.0.1:3001/   (5 per minute, shared)");
    tokio::try_join!(axum::serve(la, a), axum::serve(lb, b))?;
    Ok(())
}
