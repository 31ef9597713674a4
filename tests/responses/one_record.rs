//! A dry-run record tells what a hook is told (docs/design.md section 3, "Observability"):
//! a layer in dry-run mode records, for the request it lets through, the kind, status, wait,
//! reason code and whole seconds that the same layer, rejecting, hands its hook.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::observe::DryRunRejection;
use tollgate::response::{OnReject, Rejection, RejectionKind};
use tollgate::{Clock, ConcurrencyLimitLayer, Policy, Quota, RateLimitLayer, ShapeLayer};
use tower::{Layer, Service, ServiceExt};

/// What one rejection says through the getters a hook and a dry-run record share.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Told {
    kind: RejectionKind,
    status: StatusCode,
    retry_after: Option<Duration>,
    reason: &'static str,
    retry_after_secs: Option<u64>,
}

fn told_to_hook(r: &Rejection<'_>) -> Told {
    Told {
        kind: r.kind(),
        status: r.status(),
        retry_after: r.retry_after(),
        reason: r.reason(),
        retry_after_secs: r.retry_after_secs(),
    }
}

fn recorded(r: &DryRunRejection) -> Told {
    Told {
        kind: r.kind(),
        status: r.status(),
        retry_after: r.retry_after(),
        reason: r.reason(),
        retry_after_secs: r.retry_after_secs(),
    }
}

/// A hook that notes what it is told.
fn noting() -> (OnReject, Arc<Mutex<Vec<Told>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let hook = OnReject::new(move |r: &Rejection<'_>| {
        log.lock().unwrap().push(told_to_hook(r));
        r.default_response()
    });
    (hook, seen)
}

type Handler = fn(Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

/// Answers with what the outermost dry-run record of the request says, in its `Debug` form.
fn echo_record(req: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
    let told = DryRunRejection::first(req.extensions()).map(recorded);
    std::future::ready(Ok(Response::new(Full::new(Bytes::from(format!(
        "{told:?}"
    ))))))
}

/// Sends two requests at once through `layer` and reads the bodies only once both are
/// answered (a concurrency limit holds the first one's place until its body is read), and
/// returns them.
async fn two_at_once<L, S, B>(layer: L) -> Vec<String>
where
    L: Layer<tower::util::ServiceFn<Handler>, Service = S>,
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let handler: Handler = echo_record;
    let svc = layer.layer(tower::service_fn(handler));
    let (a, b) = tokio::join!(
        svc.clone().oneshot(Request::new(())),
        svc.clone().oneshot(Request::new(())),
    );
    let mut bodies = Vec::new();
    for resp in [a, b] {
        let body = http_body_util::BodyExt::collect(resp.unwrap().into_body());
        bodies.push(String::from_utf8(body.await.unwrap().to_bytes().to_vec()).unwrap());
    }
    bodies
}

/// What `layer(hook, false)` tells its hook of the second of two requests, which must be the
/// one rejection; and that `layer(_, true)` lets both through, the second with the same in
/// its dry-run record.
async fn the_record_is_what_the_hook_is_told<L, S, B>(layer: impl Fn(OnReject, bool) -> L) -> Told
where
    L: Layer<tower::util::ServiceFn<Handler>, Service = S>,
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (hook, seen) = noting();
    two_at_once(layer(hook.clone(), false)).await;
    let told = seen.lock().unwrap().clone();
    assert_eq!(told.len(), 1, "{told:?}");
    let bodies = two_at_once(layer(hook, true)).await;
    assert_eq!(bodies, ["None", &format!("{:?}", Some(&told[0]))]);
    // The dry run's would-be rejection never reached the hook.
    assert_eq!(seen.lock().unwrap().len(), 1);
    told[0].clone()
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_record_tells_what_the_hook_of_each_layer_is_told() {
    let (clock, _time) = Clock::manual();
    let told = the_record_is_what_the_hook_is_told(|hook, dry_run| {
        RateLimitLayer::new(Policy::new("p", Quota::per_minute(1)))
            .clock(clock.clone())
            .on_reject(hook)
            .dry_run(dry_run)
    })
    .await;
    assert_eq!(
        told,
        Told {
            kind: RejectionKind::RateLimited,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_secs(60)),
            reason: "rate_limited",
            retry_after_secs: Some(60),
        }
    );

    let told = the_record_is_what_the_hook_is_told(|hook, dry_run| {
        ShapeLayer::new(Quota::per_second(1))
            .max_waiting(0)
            .on_reject(hook)
            .dry_run(dry_run)
    })
    .await;
    assert_eq!(
        (told.kind, told.reason),
        (RejectionKind::QueueFull, "queue_full")
    );

    let told = the_record_is_what_the_hook_is_told(|hook, dry_run| {
        ConcurrencyLimitLayer::new(1)
            .on_reject(hook)
            .dry_run(dry_run)
    })
    .await;
    assert_eq!(
        (told.kind, told.status, told.reason),
        (
            RejectionKind::Concurrency,
            StatusCode::SERVICE_UNAVAILABLE,
            "concurrency_limited"
        )
    );
}
