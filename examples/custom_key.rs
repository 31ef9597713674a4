//! A custom key: count requests per tenant (first path segment) and per client IP together,
//! behind a trusted reverse proxy, with a JSON rejection body.
//!
//! ```text
//! cargo run --example custom_key
//! curl -i localhost:3000/acme/orders
//! ```

use std::net::SocketAddr;

use axum::{routing::get, Router};
use bytes::Bytes;
use http::Response;
use tollgate::key::{self, ClientIp, RequestHead};
use tollgate::response::{OnReject, Rejection};
use tollgate::{Quota, RateLimitLayer};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());

    let tenant = key::from_fn(|req: &RequestHead<'_>| {
        let segment = req.uri.path().split('/').nth(1)?;
        (!segment.is_empty()).then(|| segment.to_owned())
    });
    // Behind a proxy on loopback: X-Forwarded-For is believed only when it comes from there.
    let client = ClientIp::new().trust_loopback();

    let json = OnReject::new(|r: &Rejection<'_>| {
        let secs = r.retry_after().map_or(0, |d| d.as_secs_f64().ceil() as u64);
        Response::builder()
            .status(r.status())
            .header("content-type", "application/json")
            .body(Bytes::from(format!(
                "{{\"error\":\"rate_limited\",\"retry_after\":{secs}}}\n"
            )))
            .unwrap_or_else(|_| r.default_response())
    });

    let limit = RateLimitLayer::new(Quota::per_second(2).burst(4))
        .key((tenant, client))
        .on_reject(json);

    let app = Router::new()
        .route("/{tenant}/orders", get(|| async { "orders\n" }))
        .layer(limit);

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  GET /{{tenant}}/orders   2/s burst 4 per (tenant, client IP)");
    println!("try: for i in $(seq 6); do curl -s http://{local}/acme/orders; done");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
