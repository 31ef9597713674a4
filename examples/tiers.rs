//! Tiers: VIP API keys get 100 requests/s, everyone else 10/s, each key counted on its own.
//!
//! ```text
//! cargo run --example tiers
//! curl -i localhost:3000/ -H 'x-api-key: vip_alice'
//! curl -i localhost:3000/ -H 'x-api-key: bob'
//! ```

use axum::{routing::get, Router};
use http::StatusCode;
use tollgate::{key, Decision, MissingKey, Policy, Quota, RateLimitLayer};

/// Stands for a lookup in your customer database.
fn is_vip(api_key: &[u8]) -> bool {
    api_key.starts_with(b"vip_")
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    let limit = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
        .tier(Policy::new("vip", Quota::per_second(100)))
        .key(key::Header::new("x-api-key"))
        .select_tier(|req| {
            let key = req.headers.get("x-api-key")?;
            is_vip(key.as_bytes()).then_some("vip")
        })
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));

    let app = Router::new()
        .route(
            "/",
            get(|d: Decision| async move { format!("{} of {} left\n", d.remaining(), d.limit()) }),
        )
        .layer(limit);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  vip_* API keys: 100/s; other keys: 10/s; no key: 401");
    println!("try: curl -i -H 'x-api-key: vip_alice' http://{local}/");
    axum::serve(listener, app).await
}
