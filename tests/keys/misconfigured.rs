#![cfg(feature = "axum")]
//! A server set up so that no request can have a key (an IP key served without ConnectInfo) is
//! a server bug: every layer logs it as an error once, naming the fix, and answers each
//! request with its configured missing-key answer.
//!
//! Pins docs/design.md section 2 (a request without a key is never a 500).

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tollgate::key::{ClientIp, PeerIp};
use tollgate::{ConcurrencyLimitLayer, MissingKey, Quota, RateLimitLayer, ShapeLayer};
use tower::{Layer, Service, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps the message of every error event.
#[derive(Clone, Default)]
struct Errors {
    messages: Arc<Mutex<Vec<String>>>,
    next_id: Arc<AtomicU64>,
}

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Errors {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::ERROR {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.messages.lock().unwrap().push(message);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

/// A request as a server without ConnectInfo hands it over: no peer address anywhere.
fn without_connect_info() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

async fn statuses<S, B>(mut svc: S, n: usize) -> Vec<StatusCode>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    let mut out = Vec::new();
    for _ in 0..n {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(without_connect_info())
            .await
            .unwrap();
        out.push(resp.status());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_peer_key_without_connect_info_is_logged_once_per_layer() {
    let errors = Errors::default();
    let _guard = common::capture::own(errors.clone());

    let unauthorized = MissingKey::Reject(StatusCode::UNAUTHORIZED);
    let rate = RateLimitLayer::new(Quota::per_second(1_000))
        .key(PeerIp::new())
        .on_missing_key(unauthorized.clone());
    let shape = ShapeLayer::new(Quota::per_second(1_000)).key(PeerIp::new());
    let concurrency = ConcurrencyLimitLayer::new(10).key(ClientIp::new());

    // Two services of one layer (as a server clones them per connection) log once together.
    let rate_svc = rate.layer(tower::service_fn(ok));
    assert_eq!(
        statuses(rate_svc.clone(), 50).await,
        vec![StatusCode::UNAUTHORIZED; 50]
    );
    assert_eq!(
        statuses(rate_svc, 50).await,
        vec![StatusCode::UNAUTHORIZED; 50]
    );
    assert_eq!(errors.messages.lock().unwrap().len(), 1);

    let shape_svc = shape.layer(tower::service_fn(ok));
    assert_eq!(
        statuses(shape_svc, 50).await,
        vec![StatusCode::BAD_REQUEST; 50]
    );
    assert_eq!(errors.messages.lock().unwrap().len(), 2);

    let concurrency_svc = concurrency.layer(tower::service_fn(ok));
    assert_eq!(
        statuses(concurrency_svc, 50).await,
        vec![StatusCode::BAD_REQUEST; 50]
    );

    let messages = errors.messages.lock().unwrap().clone();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    for m in &messages {
        assert!(m.contains("into_make_service_with_connect_info"), "{m}");
        assert!(m.contains("logged once per layer"), "{m}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_missing_peer_is_logged_even_when_the_policy_lets_requests_through() {
    let errors = Errors::default();
    let _guard = common::capture::own(errors.clone());
    let svc = RateLimitLayer::new(Quota::per_second(1))
        .key(PeerIp::new())
        .on_missing_key(MissingKey::Allow)
        .layer(tower::service_fn(ok));
    assert_eq!(statuses(svc, 5).await, vec![StatusCode::OK; 5]);
    assert_eq!(errors.messages.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_without_the_header_is_not_a_server_error() {
    let errors = Errors::default();
    let _guard = common::capture::own(errors.clone());
    let svc = RateLimitLayer::new(Quota::per_second(1))
        .key(tollgate::key::Header::new("x-api-key"))
        .layer(tower::service_fn(ok));
    assert_eq!(statuses(svc, 5).await, vec![StatusCode::BAD_REQUEST; 5]);
    assert!(errors.messages.lock().unwrap().is_empty());
}
