//! Tiers: VIP API keys get 100 requests/s, everyone else 10/s, each key counted on its own.
//!
//! ```text
//! cargo run --example tiers
//! curl -i localhost:3000/ -H 'x-api-key: vip_alice'
//! curl -i localhost:3000/ -H 'x-api-key: bob'
//! curl -i localhost:3000/
//! ```
//!
//! * With a `vip_` key: `200`, body `99 of 100 left`, `ratelimit-policy: "vip";q=100;w=1`.
//! * With any other key: `200`, body `9 of 10 left`, `ratelimit-policy: "free";q=10;w=1`.
//! * Without a key: `401 Unauthorized`.
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`. The limit is a `route_layer`, so
//! unknown paths stay `404`.

use axum::{routing::get, Router};
use tollgate::{key, Clock, Decision, MissingKey, Policy, Quota, RateLimitLayer};

/// Stands for a lookup in your customer database.
fn is_vip(api_key: &[u8]) -> bool {
    api_key.starts_with(b"vip_")
}

/// The app. `clock` is a parameter so that the tests can run it on a manual clock; a server
/// passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    let limit = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
        .tier(Policy::new("vip", Quota::per_second(100)))
        .key(key::Header::new("x-api-key"))
        .select_tier(|req| {
            let key = req.headers.get("x-api-key")?;
            is_vip(key.as_bytes()).then_some("vip")
        })
        .on_missing_key(MissingKey::reject(401))
        .clock(clock);

    Router::new()
        .route(
            "/",
            get(|d: Decision| async move { format!("{} of {} left\n", d.remaining(), d.limit()) }),
        )
        .route_layer(limit)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  vip_* API keys: 100/s; other keys: 10/s; no key: 401");
    println!("try: curl -i -H 'x-api-key: vip_alice' http://{local}/");
    // Keyed by a header only: no ConnectInfo needed.
    axum::serve(listener, app(Clock::default())).await
}
