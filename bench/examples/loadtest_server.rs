//! The server side of the HTTP load test (`scripts/loadtest`): one Axum hello-world app in one
//! of several configurations, chosen by the first argument.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example loadtest_server -- <config> [addr]
//! ```
//!
//! | config | what it serves |
//! |---|---|
//! | `bare` | the app alone |
//! | `plain_429` | the app answering every request `429` itself (the floor of the 429 path) |
//! | `noop_layer` | + a layer that does nothing (`tower::util::MapRequestLayer` passing the request on): what any layer on an Axum route costs |
//! | `floor_fields` | + a layer that only appends two constant values as `RateLimit-Policy` and `RateLimit`, as long as ours: the floor of a layer that sends the fields |
//! | `floor_429` | + a layer that answers every request itself with `429` and the three fields `tollgate_429` sends, as constants: the floor of a layer that rejects with the fields |
//! | `tollgate` | + `RateLimitLayer` keyed by peer IP, limit never reached |
//! | `tollgate_429` | + `RateLimitLayer` keyed by peer IP, every request rejected |
//! | `tollgate_noheaders` | `tollgate` without the `RateLimit` header fields |
//! | `tollgate_global` | `tollgate` with one key for all requests (`key::Global`) |
//! | `settle_count` | `tollgate` counting only `4xx` responses: every request's cost is given back after its `200` |
//! | `settle_charge` | `tollgate` reserving 1 per request and settling 2 after the response: every request is charged 1 more |
//! | `governor` | + `tower_governor` keyed by peer IP, limit never reached (no header fields) |
//! | `governor_429` | + `tower_governor` keyed by peer IP, every request rejected |
//! | `axgov` | + `axum-governor` keyed by peer IP, limit never reached (draft header fields) |
//! | `axgov_429` | + `axum-governor` keyed by peer IP, every request rejected |
//! | `conc_tollgate` | + `ConcurrencyLimitLayer` (permit held until the body ends), never full |
//! | `conc_tower` | + tower's `GlobalConcurrencyLimitLayer`, never full |
//! | `shape` | + `ShapeLayer` per IP, never delaying |
//! | `stacked` | + rate limit per IP, shaping per IP and a global concurrency limit, none reached |
//! | `stacked_builder` | `stacked` as one `tower::ServiceBuilder` in one `Router::layer`, as the crate's docs recommend |
//! | `tollgate_dry_run` | `tollgate_429` in dry-run mode: every request would be rejected, none is |
//! | `<config>_metrics` | `<config>` with a Prometheus recorder installed (build with `--features metrics`): `tollgate`, `tollgate_429`, `tollgate_dry_run`, `shape`, `conc_tollgate`, `stacked` |
//!
//! `tollgate`, `shape` and `conc_tollgate` are the three layers of `stacked` alone, configured
//! the same way, so that the cost of the stack can be set against the sum of its parts.
//!
//! The server runs a one-thread tokio runtime, so pinning it to one core with `taskset`
//! measures the cost per request on that core, and its CPU time (`/proc/PID/stat`) divided by
//! the requests served is its cost per request.

use std::net::SocketAddr;
use std::sync::Arc;

use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::{routing::get, Router};
use axum_governor::nz;
use tollgate::ShapeLayer;
use tollgate::{key, ConcurrencyLimitLayer, Quota, RateLimitLayer};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::util::{MapRequestLayer, MapResponseLayer};
use tower::Service;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_governor::GovernorLayer;

async fn hello() -> &'static str {
    "Hello, World!"
}

/// The names of the fields, checked when compiled (as tollgate's are), not per request.
const POLICY_NAME: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT_NAME: HeaderName = HeaderName::from_static("ratelimit");

/// The values `tollgate` sends for its quota (the same bytes), made once: `floor_fields` only
/// clones them, as the cheapest layer that sends the fields would.
fn floor_values() -> (HeaderValue, HeaderValue) {
    static VALUES: std::sync::OnceLock<(HeaderValue, HeaderValue)> = std::sync::OnceLock::new();
    VALUES
        .get_or_init(|| {
            (
                HeaderValue::from_static("\"100000000-per-1s\";q=100000000;w=1"),
                HeaderValue::from_static("\"100000000-per-1s\";r=99999999;t=1"),
            )
        })
        .clone()
}

/// `floor_429`: answers every request with the bytes `tollgate_429` sends, from constants,
/// without deciding anything.
#[derive(Clone)]
struct Floor429<S>(S);

impl<S: Service<Request, Response = Response>> Service<Request> for Floor429<S> {
    type Response = Response;
    type Error = S::Error;
    type Future = std::future::Ready<Result<Response, S::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request) -> Self::Future {
        const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
        const RETRY: HeaderValue = HeaderValue::from_static("86400");
        const POLICY: HeaderValue = HeaderValue::from_static("\"1-per-1d\";q=1;w=86400");
        const RATELIMIT: HeaderValue = HeaderValue::from_static("\"1-per-1d\";r=0;t=86400");
        let mut res = Response::new(Body::from("Too Many Requests\n"));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, TEXT);
        headers.insert(header::RETRY_AFTER, RETRY);
        headers.append(POLICY_NAME, POLICY);
        headers.append(RATELIMIT_NAME, RATELIMIT);
        std::future::ready(Ok(res))
    }
}

fn app(config: &str) -> Option<Router> {
    let base = Router::new().route("/", get(hello));
    let never = || Quota::per_second(100_000_000).burst(100_000_000);
    let always = || Quota::per_day(1).burst(1);
    let conc = || ConcurrencyLimitLayer::new(1024);
    let shape = || {
        ShapeLayer::new(Quota::per_second(100_000_000))
            .key(key::PeerIp::new())
            .max_waiting(1024)
    };
    Some(match config {
        "bare" => base,
        "plain_429" => Router::new().route(
            "/",
            get(|| async { (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n") }),
        ),
        "noop_layer" => base.layer(MapRequestLayer::new(|req: Request| req)),
        "floor_fields" => base.layer(MapResponseLayer::new(|mut res: Response| {
            let (policy, ratelimit) = floor_values();
            let headers = res.headers_mut();
            headers.append(POLICY_NAME, policy);
            headers.append(RATELIMIT_NAME, ratelimit);
            res
        })),
        "floor_429" => base.layer(tower::layer::layer_fn(Floor429)),
        "tollgate" => base.layer(RateLimitLayer::new(never()).key(key::PeerIp::new())),
        "tollgate_429" => base.layer(RateLimitLayer::new(always()).key(key::PeerIp::new())),
        "tollgate_dry_run" => base.layer(
            RateLimitLayer::new(always())
                .key(key::PeerIp::new())
                .dry_run(true),
        ),
        "tollgate_noheaders" => base.layer(
            RateLimitLayer::new(never())
                .key(key::PeerIp::new())
                .ratelimit_headers(false),
        ),
        "tollgate_global" => base.layer(RateLimitLayer::new(never())),
        "settle_count" => base.layer(
            RateLimitLayer::new(never())
                .key(key::PeerIp::new())
                .count_if(|res| res.status.is_client_error()),
        ),
        "settle_charge" => base.layer(
            RateLimitLayer::new(never())
                .key(key::PeerIp::new())
                .settle(|_| Some(2)),
        ),
        "governor" | "governor_429" => {
            let mut b = GovernorConfigBuilder::default().key_extractor(PeerIpKeyExtractor);
            if config == "governor" {
                b.per_nanosecond(1).burst_size(100_000_000);
            } else {
                b.per_second(86_400).burst_size(1);
            }
            let conf = Arc::new(b.finish()?);
            base.layer(GovernorLayer::new(conf))
        }
        "axgov" | "axgov_429" => {
            let quota = if config == "axgov" {
                axum_governor::Quota::requests_per_second(nz!(1_000_000_000u32))
                    .burst(nz!(100_000_000u32))
            } else {
                axum_governor::Quota::seconds_per_request(nz!(86_400u32))
            };
            let conf = axum_governor::GovernorConfigBuilder::default()
                .with_extractor(axum_governor::extractor::PeerIp::default())
                .expect_connect_info()
                .quota_default(quota)
                .finish()
                .ok()?;
            base.layer(axum_governor::GovernorLayer::new(conf))
        }
        "conc_tollgate" => base.layer(conc()),
        "conc_tower" => base.layer(GlobalConcurrencyLimitLayer::new(1024)),
        "shape" => base.layer(shape()),
        "stacked" => base
            .layer(conc())
            .layer(shape())
            .layer(RateLimitLayer::new(never()).key(key::PeerIp::new())),
        // The first layer of a `ServiceBuilder` is the outermost: the same order as `stacked`.
        "stacked_builder" => base.layer(
            tower::ServiceBuilder::new()
                .layer(RateLimitLayer::new(never()).key(key::PeerIp::new()))
                .layer(shape())
                .layer(conc()),
        ),
        _ => return None,
    })
}

/// `<config>_metrics`: `<config>` with a Prometheus recorder installed before it is built.
#[cfg(feature = "metrics")]
fn with_metrics(config: String) -> String {
    match config.strip_suffix("_metrics") {
        Some(base) => {
            let installed =
                metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder();
            if let Err(e) = installed {
                eprintln!("cannot install the Prometheus recorder: {e}");
                std::process::exit(2);
            }
            base.to_owned()
        }
        None => config,
    }
}

#[cfg(not(feature = "metrics"))]
fn with_metrics(config: String) -> String {
    if config.ends_with("_metrics") {
        eprintln!("{config} needs the `metrics` feature: --features metrics");
        std::process::exit(2);
    }
    config
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let config = with_metrics(args.next().unwrap_or_else(|| "bare".to_owned()));
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // Inside the runtime: axum-governor starts its key sweeper when the layer is built.
        let Some(app) = app(&config) else {
            eprintln!("unknown configuration {config:?}; see the file's docs for the list");
            std::process::exit(2);
        };
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("{config} listening on {}", listener.local_addr()?);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    })
}
