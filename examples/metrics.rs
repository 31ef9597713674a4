//! Metrics: every decision of the layers, served at `/metrics` for Prometheus, with a stricter
//! limit tried out in shadow mode next to the one enforced.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' localhost:3000/api; done; echo
//! curl -s localhost:3000/metrics | grep '^tollgate_decisions_total' | grep -v ' 0$'
//! ```
//!
//! * The loop prints `200` ten times, then `429 429`: 10 requests per client, then 1 a second.
//! * The scrape shows the enforced policy `"api"` at `outcome="allowed"` 10 and
//!   `outcome="limited"` 2, and the shadow policy `"api-strict"` (5 per client, in dry-run mode)
//!   at `outcome="allowed"` 5 and `outcome="limited"` 7 under `dry_run="true"`: what the
//!   stricter limit would have turned away, while nobody was turned away by it.
//!
//! `/report` is limited to 2 at once (4 more wait up to 2 s), `/upstream` is shaped to 5
//! requests a second: their series (`tollgate_concurrency_*`, `tollgate_shape_*`) move when
//! they are under load, e.g. with `scripts/loadtest`.
//!
//! Serves on `127.0.0.1:3000`, or on the address in `ADDR`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tollgate::{key, Clock, ConcurrencyLimitLayer, Policy, Quota, RateLimitLayer, ShapeLayer};

/// The app; `clock` is a parameter so that the tests can run it on a manual clock. The layers
/// resolve their metric handles when the router is built: install the recorder first.
pub fn app(metrics: PrometheusHandle, clock: Clock) -> Router {
    let enforced = RateLimitLayer::new(Policy::new("api", Quota::per_second(1).burst(10)))
        .key(key::PeerIp)
        .clock(clock.clone());
    // Tried out before it is enforced: decided and counted, never rejecting.
    let shadow = RateLimitLayer::new(Policy::new("api-strict", Quota::per_second(1).burst(5)))
        .key(key::PeerIp)
        .clock(clock)
        .dry_run(true);
    let reports = ConcurrencyLimitLayer::new(2)
        .queue(4, Duration::from_secs(2))
        .name("reports");
    let upstream = ShapeLayer::new(Quota::per_second(5)).name("upstream");

    Router::new()
        .route("/api", get(|| async { "ok\n" }).layer((shadow, enforced)))
        .route(
            "/report",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                "report\n"
            })
            .layer(reports),
        )
        .route("/upstream", get(|| async { "ok\n" }).layer(upstream))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    println!("try: curl -s http://{local}/api; curl -s http://{local}/metrics");
    let app = app(metrics, Clock::default());
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
