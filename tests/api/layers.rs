#![cfg(feature = "axum")]
//! What every layer shares: builder calls give the same layer in any order, settings that
//! cannot follow a change are errors, invalid values name the caller's line, default names
//! tell layers apart, and layers stack on one route.
//!
//! Pins docs/design.md section 2 (one shared state wherever a layer is applied) and section 4 (the
//! builder).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::{Request, Response, StatusCode};
use tollgate::key::Header;
use tollgate::{
    Clock, ConcurrencyLimitLayer, ConfigError, MissingKey, Policy, Quota, RateLimitLayer,
    ShapeLayer,
};
use tower::{Service, ServiceBuilder, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn bare() -> Request<Body> {
    Request::post("/login").body(Body::empty()).unwrap()
}

async fn status_of<S>(svc: S, req: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    svc.oneshot(req).await.unwrap().status()
}

fn header(resp: &Response<Body>, name: &str) -> String {
    let values: Vec<_> = resp.headers().get_all(name).iter().collect();
    values
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::test(start_paused = true)]
async fn rate_limit_keeps_the_missing_key_policy_set_before_the_key() {
    let before = RateLimitLayer::new(Quota::per_second(1))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .key(Header::new("x-api-key"));
    let after = RateLimitLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    for layer in [before, after] {
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        assert_eq!(status_of(svc, bare()).await, StatusCode::UNAUTHORIZED);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_keeps_the_missing_key_policy_set_before_the_key() {
    let before = ConcurrencyLimitLayer::new(1)
        .on_missing_key(MissingKey::Allow)
        .key(Header::new("x-api-key"));
    let after = ConcurrencyLimitLayer::new(1)
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Allow);
    for layer in [before, after] {
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let resp = svc.oneshot(bare()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn shape_keeps_the_missing_key_policy_set_before_the_key() {
    let before = ShapeLayer::new(Quota::per_second(1))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .key(Header::new("x-api-key"));
    let after = ShapeLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    for layer in [before, after] {
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        assert_eq!(status_of(svc, bare()).await, StatusCode::UNAUTHORIZED);
    }
}

#[test]
fn a_shared_key_set_before_the_key_type_changed_is_an_error_in_every_layer() {
    let rate = RateLimitLayer::new(Quota::per_second(1))
        .on_missing_key(MissingKey::UseKey(()))
        .key(Header::new("x-api-key"));
    assert_eq!(
        rate.validate().unwrap_err(),
        ConfigError::MissingKeyBeforeKey
    );
    let conc = ConcurrencyLimitLayer::new(1)
        .on_missing_key(MissingKey::UseKey(()))
        .key(Header::new("x-api-key"));
    assert_eq!(
        conc.validate().unwrap_err(),
        ConfigError::MissingKeyBeforeKey
    );
    let shape = ShapeLayer::new(Quota::per_second(1))
        .on_missing_key(MissingKey::UseKey(()))
        .key(Header::new("x-api-key"));
    assert_eq!(
        shape.validate().unwrap_err(),
        ConfigError::MissingKeyBeforeKey
    );
    // Set again for the new key type: fine.
    let fixed = RateLimitLayer::new(Quota::per_second(1))
        .on_missing_key(MissingKey::UseKey(()))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::UseKey(Box::from(&b"anonymous"[..])));
    assert!(fixed.validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn every_other_setting_survives_the_key_change_in_either_order() {
    // Rejection hook, headers and clock set before `key` still apply after it.
    let hook = tollgate::response::OnReject::new(|r| {
        let mut resp = r.default_response();
        *resp.status_mut() = StatusCode::IM_A_TEAPOT;
        resp
    });
    let layer = RateLimitLayer::new(Quota::per_second(1))
        .on_reject(hook)
        .legacy_headers(true)
        .clock(Clock::tokio())
        .key(Header::new("x-api-key"));
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let req = || {
        Request::get("/")
            .header("x-api-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    let first = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(header(&first, "x-ratelimit-limit"), "1");
    let second = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(second.status(), StatusCode::IM_A_TEAPOT);
}

#[test]
#[should_panic(expected = "(set at tests/api/layers.rs:")]
fn an_invalid_value_panics_naming_the_line_that_set_it() {
    let layer = ConcurrencyLimitLayer::new(0);
    let _ = Router::<()>::new().route("/", post(|| async { "" }).layer(layer));
}

#[test]
#[should_panic(expected = "(set at tests/api/layers.rs:")]
fn an_invalid_name_panics_naming_the_line_that_set_it() {
    let layer = RateLimitLayer::new(Quota::per_second(1)).name("a\"b");
    let _ = Router::<()>::new().route("/", post(|| async { "" }).layer(layer));
}

#[test]
fn invalid_values_are_still_reported_by_validate_for_configuration() {
    assert_eq!(
        ConcurrencyLimitLayer::new(0).validate().unwrap_err(),
        ConfigError::InvalidConcurrency(0)
    );
    // A valid value given later replaces the invalid one.
    let fixed = RateLimitLayer::new(Quota::per_second(1))
        .name("a\"b")
        .name("ok");
    assert!(fixed.validate().is_ok());
    let renamed = RateLimitLayer::new(Policy::new("a\"b", Quota::per_second(1))).name("ok");
    assert!(renamed.validate().is_ok());
    let dup = RateLimitLayer::new(Policy::new("a", Quota::per_second(1)))
        .tier(Policy::new("b", Quota::per_second(2)))
        .tier(Policy::new("a", Quota::per_second(3)));
    assert_eq!(
        dup.validate().unwrap_err(),
        ConfigError::DuplicateTier("a".into())
    );
}

#[tokio::test(start_paused = true)]
async fn two_layers_without_names_say_which_limit_answered() {
    let outer = RateLimitLayer::new(Quota::per_minute(100)).clock(Clock::tokio());
    let inner = RateLimitLayer::new(Quota::per_second(5)).clock(Clock::tokio());
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service_fn(ok);
    let resp = svc.oneshot(bare()).await.unwrap();
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        "\"5-per-1s\";q=5;w=1, \"100-per-1m\";q=100;w=60"
    );
}

#[tokio::test(start_paused = true)]
async fn two_rate_limits_stack_on_one_method_router_as_a_tuple() {
    let per_client = RateLimitLayer::new(Quota::per_minute(100)).clock(Clock::tokio());
    let login = RateLimitLayer::new(Quota::per_minute(1)).clock(Clock::tokio());
    // `(outer, inner)`: the first layer of the tuple sees the request first.
    let app = Router::new().route(
        "/login",
        post(|| async { "welcome" }).layer((per_client, login)),
    );
    assert_eq!(status_of(app.clone(), bare()).await, StatusCode::OK);
    let resp = app.oneshot(bare()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        "\"1-per-1m\";q=1;w=60, \"100-per-1m\";q=100;w=60"
    );
}

#[tokio::test(start_paused = true)]
async fn tiers_are_chosen_by_names_that_live_at_run_time() {
    let plans: HashMap<String, String> = HashMap::from([("k-vip".into(), "vip".into())]);
    let layer = RateLimitLayer::new(Policy::new("free", Quota::per_minute(1)))
        .tier(Policy::new("vip", Quota::per_minute(3)))
        .key(Header::new("x-api-key"))
        .clock(Clock::tokio())
        .select_tier(move |req| {
            let key = req.headers.get("x-api-key")?.to_str().ok()?;
            plans.get(key).cloned()
        });
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let req = |key: &str| {
        Request::get("/")
            .header("x-api-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let vip = svc.clone().oneshot(req("k-vip")).await.unwrap();
    assert_eq!(header(&vip, "ratelimit-policy"), "\"vip\";q=3;w=60");
    let free = svc.clone().oneshot(req("k-free")).await.unwrap();
    assert_eq!(header(&free, "ratelimit-policy"), "\"free\";q=1;w=60");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_tier_name_falls_back_to_the_default_policy() {
    let layer = RateLimitLayer::new(Policy::new("free", Quota::per_minute(1)))
        .tier(Policy::new("vip", Quota::per_minute(3)))
        .clock(Clock::tokio())
        .select_tier(|_| Some(String::from("gold")));
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    for _ in 0..2 {
        let resp = svc.clone().oneshot(bare()).await.unwrap();
        assert_eq!(header(&resp, "ratelimit-policy"), "\"free\";q=1;w=60");
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_limit_keyed_by_global_stays_one_global_limit_with_503() {
    let layer = ConcurrencyLimitLayer::new(1).key(tollgate::key::Global);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(move |_req: Request<Body>| {
            let rx = rx.clone();
            async move {
                if let Some(rx) = rx.lock().await.take() {
                    let _ = rx.await;
                }
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        });
    let first = tokio::spawn(svc.clone().oneshot(bare()));
    tokio::task::yield_now().await;
    let second = svc.clone().oneshot(bare()).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(layer.tracked_keys(), 0);
    tx.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
}
