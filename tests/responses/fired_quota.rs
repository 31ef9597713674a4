#![cfg(all(feature = "metrics", feature = "axum"))]
//! The quota that fired, found from the decision only when something reads it: the decision
//! count's `quota` label, the rejection event's `quota` field and the dry-run record's quota
//! name the same quota of several, whichever of them fired, for a limit and for a cost that
//! never fits, enforced and in dry-run, on the memory store and on Redis, and each of two
//! stacked layers names its own.
//!
//! Pins docs/design.md section 3 ("Observability").

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::key::Header;
use tollgate::observe::DryRunRejection;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::common::capture::capture;

/// Answers with the dry-run records the request carries, as `policy/quota/status` lines.
async fn echo(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let lines: Vec<String> = DryRunRejection::all(req.extensions())
        .iter()
        .map(|r| {
            format!(
                "{}/{}/{}",
                r.policy(),
                r.quota().unwrap_or("-"),
                r.status().as_u16()
            )
        })
        .collect();
    Ok(Response::new(Body::from(lines.join(";"))))
}

fn from(path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-client", "a")
        .body(Body::empty())
        .unwrap()
}

async fn call<S>(svc: &mut S, req: Request<Body>) -> (StatusCode, String)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let resp = svc.ready().await.unwrap().call(req).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Every decision counted so far, as `policy/quota/outcome/dry_run` and its total.
fn decisions(snap: &Snapshotter, seen: &mut HashMap<String, u64>) -> HashMap<String, u64> {
    for (key, _, _, value) in snap.snapshot().into_vec() {
        let key = key.key();
        if key.name() != "tollgate_decisions_total" {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        let name = format!(
            "{}/{}/{}/{}",
            label("policy"),
            label("quota"),
            label("outcome"),
            label("dry_run")
        );
        if let DebugValue::Counter(n) = value {
            *seen.entry(name).or_default() += n;
        }
    }
    seen.iter()
        .filter(|(_, &n)| n > 0)
        .map(|(k, &n)| (k.clone(), n))
        .collect()
}

/// Three quotas, the last the tightest per hour, the middle one the smallest burst: a fourth
/// request is limited by `api-hour`, and a request of cost 60 never fits `api-minute` (nor
/// `api-hour`: the first listed that it never fits is named).
fn policy(name: &'static str) -> Policy {
    Policy::new(name, Quota::per_second(100).burst(100))
        .quota(Quota::per_minute(50).named(format!("{name}-minute")))
        .quota(Quota::per_hour(3).burst(3).named(format!("{name}-hour")))
}

fn layer(name: &'static str, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(policy(name))
        .key(Header::new("x-client"))
        .cost(|req| if req.uri.path() == "/big" { 60 } else { 1 })
        .clock(clock.clone())
}

/// The `quota` field of each rejection event (`target`) in `text`, in order.
fn event_quotas(text: &str, target: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(target))
        .map(|l| {
            let from = l.find("quota=\"").map(|i| i + 7).unwrap_or(l.len());
            let to = l[from..].find('"').map_or(l.len(), |i| from + i);
            l[from..to].to_owned()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_limit_and_a_cost_that_never_fits_name_the_quota_that_fired_in_every_report() {
    let (out, _guard) = capture(tracing::Level::DEBUG);
    let (clock, _time) = Clock::manual();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    // A dry-run layer outside an enforced one, each with its own policy.
    // Built under the recorder: a layer takes its meters when it is applied.
    let mut svc = metrics::with_local_recorder(&recorder, || {
        ServiceBuilder::new()
            .layer(layer("outer", &clock).dry_run(true))
            .layer(layer("inner", &clock))
            .service_fn(echo)
    });
    for _ in 0..3 {
        assert_eq!(call(&mut svc, from("/")).await, (StatusCode::OK, "".into()));
    }
    // Both limited by their hour: the outer one records it, the inner one refuses.
    let (status, _) = call(&mut svc, from("/")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // A cost of 60: never fits either minute quota, which is named before the hour.
    let (status, _) = call(&mut svc, from("/big")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let mut seen = HashMap::new();
    let counted = decisions(&snap, &mut seen);
    let expected: HashMap<String, u64> = [
        ("outer//allowed/true", 3),
        ("outer/outer-hour/limited/true", 1),
        ("outer/outer-minute/never_fits/true", 1),
        ("inner//allowed/false", 3),
        ("inner/inner-hour/limited/false", 1),
        ("inner/inner-minute/never_fits/false", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(counted, expected);
    let text = out.text();
    assert_eq!(
        event_quotas(&text, "tollgate::dry_run"),
        ["outer-hour", "outer-minute"],
        "{text}"
    );
    assert_eq!(
        event_quotas(&text, "tollgate::reject"),
        ["inner-hour", "inner-minute"],
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_record_names_the_quota_that_fired_of_each_stacked_layer() {
    let (clock, _time) = Clock::manual();
    let mut svc = ServiceBuilder::new()
        .layer(layer("outer", &clock).dry_run(true))
        .layer(layer("inner", &clock).dry_run(true))
        .service_fn(echo);
    for _ in 0..3 {
        assert_eq!(call(&mut svc, from("/")).await, (StatusCode::OK, "".into()));
    }
    assert_eq!(
        call(&mut svc, from("/")).await,
        (
            StatusCode::OK,
            "outer/outer-hour/429;inner/inner-hour/429".into()
        )
    );
    assert_eq!(
        call(&mut svc, from("/big")).await,
        (
            StatusCode::OK,
            "outer/outer-minute/429;inner/inner-minute/429".into()
        )
    );
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::common::redis_server::RedisServer;
    use std::time::Duration;
    use tollgate::redis::RedisStore;

    #[tokio::test]
    async fn on_redis_the_count_the_event_and_the_record_name_the_same_quotas() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let (out, _guard) = capture(tracing::Level::DEBUG);
        let (clock, _time) = Clock::manual();
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let mut svc = metrics::with_local_recorder(&recorder, || {
            ServiceBuilder::new()
                .layer(layer("outer", &clock).store(store.clone()).dry_run(true))
                .layer(layer("inner", &clock).store(store.clone()))
                .service_fn(echo)
        });
        for _ in 0..3 {
            assert_eq!(call(&mut svc, from("/")).await, (StatusCode::OK, "".into()));
        }
        let (status, _) = call(&mut svc, from("/")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let (status, _) = call(&mut svc, from("/big")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let mut seen = HashMap::new();
        let counted = decisions(&snap, &mut seen);
        let expected: HashMap<String, u64> = [
            ("outer//allowed/true", 3),
            ("outer/outer-hour/limited/true", 1),
            ("outer/outer-minute/never_fits/true", 1),
            ("inner//allowed/false", 3),
            ("inner/inner-hour/limited/false", 1),
            ("inner/inner-minute/never_fits/false", 1),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
        assert_eq!(counted, expected);
        let text = out.text();
        assert_eq!(
            event_quotas(&text, "tollgate::dry_run"),
            ["outer-hour", "outer-minute"],
            "{text}"
        );
        assert_eq!(
            event_quotas(&text, "tollgate::reject"),
            ["inner-hour", "inner-minute"],
            "{text}"
        );
    }
}
