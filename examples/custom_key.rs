//! A custom key: count requests per tenant (first path segment) and per client IP together,
//! behind a trusted reverse proxy, with a JSON rejection body.
//!
//! ```text
//! cargo run --example custom_key
//! for i in $(seq 5); do curl -s localhost:3000/acme/orders; done
//! curl -s localhost:3000/globex/orders
//! curl -s localhost:3000/acme/orders -H 'x-forwarded-for: 203.0.113.7'
//! curl -i localhost:3000/
//! ```
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`. `GET /{tenant}/orders` admits 2
//! requests per second with bursts of 4 per (tenant, client IP):
//!
//! * the loop prints `orders` four times, then the JSON rejection
//!   `{"error":"rate_limited","message":"Too Many Requests","retry_after":1}` (status `429`);
//! * another tenant from the same client has its own limit: `orders`;
//! * another client behind the proxy (curl on loopback stands for the proxy, which is trusted)
//!   has its own limit too: `orders`;
//! * `GET /` is no route: `404`, not a rate-limit answer (the limit is a `route_layer`).
//!
//! The rejection hook answers every kind of rejection in JSON with the rejection's own status
//! and reason code, so a missing key would read `{"error":"missing_key",...}` with its `400`,
//! never a `rate_limited` body. `ClientIp` starts from the TCP peer, so the server is served
//! with `into_make_service_with_connect_info::<SocketAddr>()`; without it every request would
//! get the missing-key answer (`400`).

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::key::{self, ClientIp, RequestHead};
use tollgate::response::{OnReject, Rejection};
use tollgate::{Clock, Quota, RateLimitLayer};

/// The app. `clock` is a parameter so that the tests can run it on a manual clock; a server
/// passes `Clock::default()`.
pub fn app(clock: Clock) -> Router {
    let tenant = key::from_fn(|req: &RequestHead<'_>| {
        let segment = req.uri.path().split('/').nth(1)?;
        (!segment.is_empty()).then(|| segment.to_owned())
    });
    // Behind a proxy on loopback: X-Forwarded-For is believed only when it comes from there.
    let client = ClientIp::new().trust_loopback();

    // `{"error":"<reason code>","message":"...","retry_after":<seconds or null>}`, in the
    // rejection's own status. For a body of your own, build it from `r.status()`,
    // `r.reason()` and `r.retry_after_secs()`.
    let json = OnReject::new(|r: &Rejection<'_>| r.json_response());

    let limit = RateLimitLayer::new(Quota::per_second(2).burst(4))
        .key((tenant, client))
        .on_reject(json)
        .clock(clock);

    Router::new()
        .route("/{tenant}/orders", get(|| async { "orders\n" }))
        .route_layer(limit)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("  GET /{{tenant}}/orders   2/s burst 4 per (tenant, client IP)");
    println!("try: for i in $(seq 5); do curl -s http://{local}/acme/orders; done");
    // ClientIp starts from the peer address: serve with ConnectInfo.
    axum::serve(
        listener,
        app(Clock::default()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
