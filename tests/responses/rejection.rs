//! The one rejection path: the rate limit, the concurrency limit and the shaping layer each
//! hand their hook the same `Rejection` (kind, status, wait, policy name, protocol), record
//! the same would-be rejection in dry-run mode, and answer gRPC calls the gRPC way.
//!
//! Pins docs/design.md section 2 and section 3 ("Observability").

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::observe::DryRunRejection;
use tollgate::response::{OnReject, Protocol, Rejection, RejectionKind};
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Layer, Service, ServiceExt};

/// What a hook saw of one rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kind: RejectionKind,
    status: u16,
    retry_after: Option<Duration>,
    policy: Option<String>,
    protocol: Protocol,
}

/// A hook that notes every rejection it answers, and answers with the default response.
fn noting() -> (OnReject, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let hook = OnReject::new(move |r: &Rejection<'_>| {
        log.lock().unwrap().push(Seen {
            kind: r.kind(),
            status: r.status().as_u16(),
            retry_after: r.retry_after(),
            policy: r.policy().map(str::to_owned),
            protocol: r.protocol(),
        });
        r.default_response()
    });
    (hook, seen)
}

/// Answers with the names of the policies whose dry run would have rejected the request.
async fn echo(req: Request<Bytes>) -> Result<Response<Full<Bytes>>, Infallible> {
    let lines: Vec<String> = DryRunRejection::all(req.extensions())
        .iter()
        .map(|r| {
            format!(
                "{:?}/{:?}/{}/{}",
                r.layer(),
                r.kind(),
                r.policy(),
                r.status().as_u16()
            )
        })
        .collect();
    Ok(Response::new(Full::new(Bytes::from(lines.join(";")))))
}

fn keyless(grpc: bool) -> Request<Bytes> {
    let mut req = Request::get("/");
    if grpc {
        req = req.header("content-type", "application/grpc");
    }
    req.body(Bytes::new()).unwrap()
}

fn rate_limit(hook: OnReject, dry_run: bool) -> RateLimitLayer<Header> {
    let (clock, _time) = Clock::manual();
    RateLimitLayer::new(Policy::new("per-client", Quota::per_second(1)))
        .key(Header::new("x-client"))
        .on_missing_key(MissingKey::reject(401))
        .clock(clock)
        .on_reject(hook)
        .dry_run(dry_run)
}

fn concurrency(hook: OnReject, dry_run: bool) -> ConcurrencyLimitLayer<Header> {
    ConcurrencyLimitLayer::new(1)
        .key(Header::new("x-client"))
        .on_missing_key(MissingKey::reject(401))
        .name("in-flight")
        .on_reject(hook)
        .dry_run(dry_run)
}

fn shape(hook: OnReject, dry_run: bool) -> ShapeLayer<Header> {
    ShapeLayer::new(Quota::per_second(1))
        .key(Header::new("x-client"))
        .on_missing_key(MissingKey::reject(401))
        .name("smooth")
        .on_reject(hook)
        .dry_run(dry_run)
}

/// The status and body of one request without a key through `layer`.
async fn keyless_through<L, S, B>(layer: L, grpc: bool) -> (StatusCode, Option<String>, String)
where
    L: Layer<tower::util::ServiceFn<fn(Request<Bytes>) -> Echo>, Service = S>,
    S: Service<Request<Bytes>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Debug,
{
    let handler: fn(Request<Bytes>) -> Echo = |req| Box::pin(echo(req));
    let svc = layer.layer(tower::service_fn(handler));
    let resp = svc.oneshot(keyless(grpc)).await.unwrap();
    let status = resp.status();
    let grpc_status = resp
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        grpc_status,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

type Echo = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>,
>;

fn seen(policy: &str, protocol: Protocol) -> Seen {
    Seen {
        kind: RejectionKind::MissingKey,
        status: 401,
        retry_after: None,
        policy: Some(policy.to_owned()),
        protocol,
    }
}

#[tokio::test(start_paused = true)]
async fn every_layer_hands_its_hook_the_rejection_with_its_kind_status_and_policy_name() {
    for grpc in [false, true] {
        let protocol = if grpc { Protocol::Grpc } else { Protocol::Http };
        let expected_status = if grpc {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        // 16: UNAUTHENTICATED, the gRPC status of a 401.
        let expected_grpc = grpc.then(|| "16".to_owned());

        let (hook, log) = noting();
        let (status, grpc_status, _) = keyless_through(rate_limit(hook, false), grpc).await;
        assert_eq!(
            (status, grpc_status),
            (expected_status, expected_grpc.clone())
        );
        assert_eq!(*log.lock().unwrap(), [seen("per-client", protocol)]);

        let (hook, log) = noting();
        let (status, grpc_status, _) = keyless_through(concurrency(hook, false), grpc).await;
        assert_eq!(
            (status, grpc_status),
            (expected_status, expected_grpc.clone())
        );
        assert_eq!(*log.lock().unwrap(), [seen("in-flight", protocol)]);

        let (hook, log) = noting();
        let (status, grpc_status, _) = keyless_through(shape(hook, false), grpc).await;
        assert_eq!(
            (status, grpc_status),
            (expected_status, expected_grpc.clone())
        );
        assert_eq!(*log.lock().unwrap(), [seen("smooth", protocol)]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_of_every_layer_records_the_rejection_its_hook_would_have_answered() {
    let (hook, log) = noting();
    let (status, _, body) = keyless_through(rate_limit(hook, true), false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "RateLimit/MissingKey/per-client/401");

    let (hook, _) = noting();
    let (status, _, body) = keyless_through(concurrency(hook, true), false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "Concurrency/MissingKey/in-flight/401");

    let (hook, _) = noting();
    let (status, _, body) = keyless_through(shape(hook, true), false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "Shape/MissingKey/smooth/401");

    // A dry run answers nothing: the hook is never called.
    assert!(log.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_rejection_tells_its_hook_how_long_to_wait_and_which_tier_refused() {
    let (hook, log) = noting();
    let (clock, _time) = Clock::manual();
    let mut svc = RateLimitLayer::new(Policy::new("per-client", Quota::per_second(1)))
        .key(Header::new("x-client"))
        .clock(clock)
        .on_reject(hook)
        .layer(tower::service_fn(echo));
    for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let req = Request::get("/")
            .header("x-client", "a")
            .body(Bytes::new())
            .unwrap();
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(resp.status(), expected);
    }
    assert_eq!(
        *log.lock().unwrap(),
        [Seen {
            kind: RejectionKind::RateLimited,
            status: 429,
            retry_after: Some(Duration::from_secs(1)),
            policy: Some("per-client".to_owned()),
            protocol: Protocol::Http,
        }]
    );
}
