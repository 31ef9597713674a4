#![cfg(feature = "axum")]
//! What a new user meets first: a misspelt key that switches a limit off, two stacked layers
//! that share a name, a 405 that spends the quota, stacked layers that give back, and a limit
//! whose store (memory or Redis) is chosen from configuration.
//!
//! Pins docs/design.md section 2 and section 3 ("Stacked layers are all or nothing").

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use common::capture::Captured;
use http::{Method, Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tollgate::key::{Header, KeyExtractorExt, PeerIp};
use tollgate::ShapeLayer;
use tollgate::{Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

/// Events at WARN and above, as text, while the guard lives, whatever other tests' threads
/// log meanwhile (see `common::capture::capture`).
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    common::capture::capture(tracing::Level::WARN)
}

/// The lines of `out` at `level` that contain `text`.
fn lines(out: &Captured, level: &str, text: &str) -> Vec<String> {
    out.text()
        .lines()
        .filter(|l| l.contains(level) && l.contains(text))
        .map(str::to_owned)
        .collect()
}

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

/// A request as a client sends it: an API key in `x-api-key`, from 127.0.0.1.
fn with_api_key() -> Request<Body> {
    let mut req = Request::get("/")
        .header("x-api-key", "k1")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            4000,
        ))));
    req
}

async fn statuses<S, B>(svc: &mut S, n: usize, req: fn() -> Request<Body>) -> Vec<StatusCode>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let resp = svc.ready().await.unwrap().call(req()).await.unwrap();
        out.push(resp.status());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_key_never_found_in_the_first_100_requests_is_one_error_naming_what_it_reads() {
    let (out, _guard) = capture();
    // The client sends `x-api-key`; the layer reads `x-api-kye`.
    let mut allow = RateLimitLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-kye"))
        .on_missing_key(MissingKey::Allow)
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut allow, 99, with_api_key).await,
        [StatusCode::OK; 99]
    );
    assert_eq!(lines(&out, "ERROR", "tollgate"), Vec::<String>::new());
    assert_eq!(
        statuses(&mut allow, 1, with_api_key).await,
        [StatusCode::OK]
    );
    let errors = lines(&out, "ERROR", "tollgate");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    for needed in [
        "not one of the first 100 requests had a key",
        "missing header",
        "the layer keys by header:x-api-kye;",
        "went through unlimited (MissingKey::Allow)",
        "logged once per layer",
    ] {
        assert!(errors[0].contains(needed), "{needed:?} in {}", errors[0]);
    }
    // Once per layer, however many follow.
    assert_eq!(
        statuses(&mut allow, 300, with_api_key).await,
        [StatusCode::OK; 300]
    );
    assert_eq!(lines(&out, "ERROR", "tollgate").len(), 1);

    // Every layer, through the one key resolution they share: each logs once, with its
    // answer.
    let mut reject = RateLimitLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-kye"))
        .on_missing_key(MissingKey::reject(401))
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut reject, 100, with_api_key).await,
        [StatusCode::UNAUTHORIZED; 100]
    );
    let mut shape = ShapeLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-kye"))
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut shape, 100, with_api_key).await,
        [StatusCode::BAD_REQUEST; 100]
    );
    let mut concurrency = ConcurrencyLimitLayer::new(1)
        .key(Header::new("x-api-kye"))
        .on_missing_key(MissingKey::UseKey(b"anonymous"[..].into()))
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut concurrency, 100, with_api_key).await,
        [StatusCode::OK; 100]
    );
    let errors = lines(&out, "ERROR", "tollgate");
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert!(errors[1].contains("each was answered 401"), "{}", errors[1]);
    assert!(errors[2].contains("each was answered 400"), "{}", errors[2]);
    assert!(
        errors[3].contains("each was counted under the one missing-key key"),
        "{}",
        errors[3]
    );
}

#[tokio::test(start_paused = true)]
async fn a_layer_that_has_found_one_key_never_logs_requests_without_one() {
    let (out, _guard) = capture();
    let layer = RateLimitLayer::new(Quota::per_second(1_000))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::reject(401));
    let mut svc = layer.layer(tower::service_fn(ok));
    assert_eq!(statuses(&mut svc, 1, with_api_key).await, [StatusCode::OK]);
    let without = || Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(
        statuses(&mut svc, 300, without).await,
        [StatusCode::UNAUTHORIZED; 300]
    );
    // A key found by the second extractor of `or` is a key found.
    let mut either = RateLimitLayer::new(Quota::per_second(1_000))
        .key(Header::new("x-api-kye").or(PeerIp::new()))
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut either, 200, with_api_key).await[..2],
        [StatusCode::OK; 2]
    );
    // An allowed address is let through before any key is looked for: never counted.
    let mut allowed = RateLimitLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-kye"))
        .allow_ip("127.0.0.1")
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut allowed, 200, with_api_key).await,
        [StatusCode::OK; 200]
    );
    assert_eq!(lines(&out, "ERROR", "tollgate"), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn two_stacked_layers_of_one_name_are_one_warning_and_different_names_none() {
    let (out, _guard) = capture();
    let limit = |name: &'static str| {
        RateLimitLayer::new(Policy::new(name, Quota::per_second(10))).clock(Clock::tokio())
    };

    // Different names, with a concurrency item between them: nothing to say.
    let apart = tower::ServiceBuilder::new()
        .layer(limit("api"))
        .layer(ConcurrencyLimitLayer::new(4).name("workers"))
        .layer(limit("api-burst"))
        .service_fn(ok);
    let resp = apart.oneshot(with_api_key()).await.unwrap();
    assert_eq!(
        policy(&resp),
        [
            r#""api-burst";q=10;w=1"#,
            r#""workers";q=4;qu="concurrent-requests""#,
            r#""api";q=10;w=1"#
        ]
    );
    assert_eq!(lines(&out, "WARN", "tollgate"), Vec::<String>::new());

    // The same name twice: two items a client cannot tell apart, one warning.
    let mut twice = tower::ServiceBuilder::new()
        .layer(limit("api"))
        .layer(limit("api"))
        .service_fn(ok);
    let resp = twice
        .ready()
        .await
        .unwrap()
        .call(with_api_key())
        .await
        .unwrap();
    assert_eq!(policy(&resp), [r#""api";q=10;w=1"#, r#""api";q=10;w=1"#]);
    assert_eq!(
        statuses(&mut twice, 3, with_api_key).await,
        [StatusCode::OK; 3]
    );
    let warnings = lines(&out, "WARN", "tollgate");
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains(r#"two items named "api""#),
        "{}",
        warnings[0]
    );
}

/// 100 requests through a new layer that reads a header no client sends: one error from the
/// crate, logged once per layer.
async fn a_hundred_requests_without_the_key() {
    let mut svc = RateLimitLayer::new(Quota::per_second(1))
        .key(Header::new("x-api-kye"))
        .on_missing_key(MissingKey::Allow)
        .layer(tower::service_fn(ok));
    assert_eq!(
        statuses(&mut svc, 100, with_api_key).await,
        [StatusCode::OK; 100]
    );
}

/// The race that could take a line out of a test's capture: the crate's error first reached
/// on a thread without a subscriber of its own (as another test's thread may be, at any
/// time), while this thread's capture is set, is still captured when this thread reaches it.
#[tokio::test(start_paused = true)]
async fn an_error_first_reached_on_another_thread_is_still_captured() {
    let (out, _guard) = capture();
    std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(a_hundred_requests_without_the_key())
    })
    .join()
    .unwrap();
    assert_eq!(lines(&out, "ERROR", "tollgate"), Vec::<String>::new());
    a_hundred_requests_without_the_key().await;
    let errors = lines(&out, "ERROR", "tollgate");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("not one of the first 100 requests had a key"),
        "{}",
        errors[0]
    );
}

/// The items of a response's `RateLimit-Policy` field, one per field line.
fn policy<B>(resp: &Response<B>) -> Vec<String> {
    resp.headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// `curl -X <method> /` with an API key.
fn call(method: Method) -> Request<Body> {
    let mut req = with_api_key();
    *req.method_mut() = method;
    req
}

async fn route_statuses(app: &Router, methods: &[Method]) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for m in methods {
        let resp = app.clone().oneshot(call(m.clone())).await.unwrap();
        out.push(resp.status());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_405_spends_the_quota_under_method_router_layer_but_not_under_route_layer() {
    let limit = || {
        RateLimitLayer::new(Quota::per_minute(2))
            .key(Header::new("x-api-key"))
            .clock(Clock::tokio())
    };
    let (post, get_) = (Method::POST, Method::GET);

    // `MethodRouter::layer` wraps the 405 too: two POSTs to a GET-only route spend the burst.
    let layered = Router::new().route("/", get(|| async { "ok" }).layer(limit()));
    assert_eq!(
        route_statuses(&layered, &[post.clone(), post.clone(), get_.clone()]).await,
        [
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let resp = layered.clone().oneshot(call(post.clone())).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["allow"], "GET,HEAD");

    // `MethodRouter::route_layer` wraps the routed methods only: a 405 costs nothing.
    let routed = Router::new().route("/", get(|| async { "ok" }).route_layer(limit()));
    assert_eq!(
        route_statuses(
            &routed,
            &[
                post.clone(),
                post.clone(),
                post,
                get_.clone(),
                get_.clone(),
                get_
            ]
        )
        .await,
        [
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::METHOD_NOT_ALLOWED,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_outside_a_full_concurrency_cap_gets_back_what_the_cap_refused() {
    // A handler that holds its request until the test lets it go.
    let gate = Arc::new(Semaphore::new(0));
    let held = {
        let gate = gate.clone();
        move |_req: Request<Body>| {
            let gate = gate.clone();
            async move {
                let _pass = gate.acquire().await;
                Ok::<_, Infallible>(Response::new(Body::from("done")))
            }
        }
    };
    // 3 per minute outside, 1 in flight inside.
    let svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(Quota::per_minute(3)).clock(Clock::tokio()))
        .layer(ConcurrencyLimitLayer::new(1))
        .service_fn(held);

    let first = tokio::spawn(svc.clone().oneshot(with_api_key()));
    tokio::task::yield_now().await;
    let mut refused = Vec::new();
    for _ in 0..3 {
        refused.push(svc.clone().oneshot(with_api_key()).await.unwrap().status());
    }
    // Each refusal by the cap gave back its unit: the rate limit never answers 429, and the
    // quota is still there for the next requests.
    assert_eq!(refused, [StatusCode::SERVICE_UNAVAILABLE; 3]);
    gate.add_permits(10);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(svc.clone().oneshot(with_api_key()).await.unwrap().status());
    }
    assert_eq!(
        after,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// The store chosen from configuration: Redis when a URL is given, memory otherwise. Both arms
/// are one type, `tower::util::Either` of the two layers, usable wherever one layer is.
#[cfg(feature = "redis")]
mod store_from_configuration {
    use super::*;
    use tollgate::redis::RedisStore;
    use tower::util::Either;

    type Limit = Either<RateLimitLayer<Header>, RateLimitLayer<Header, RedisStore>>;

    fn limit(redis_url: Option<&str>) -> Result<Limit, redis::RedisError> {
        let layer = RateLimitLayer::new(Policy::new("api", Quota::per_minute(2)))
            .key(Header::new("x-api-key"));
        Ok(match redis_url {
            Some(url) => Either::Right(layer.store(RedisStore::open(url)?)),
            None => Either::Left(layer),
        })
    }

    async fn three(limit: Limit) -> Vec<(StatusCode, String)> {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(limit);
        let mut out = Vec::new();
        for _ in 0..3 {
            let resp = app.clone().oneshot(with_api_key()).await.unwrap();
            let fields = resp.headers()["ratelimit"].to_str().unwrap().to_owned();
            out.push((resp.status(), fields));
        }
        out
    }

    #[tokio::test]
    async fn memory_or_redis_from_configuration_is_one_type_and_one_behaviour() {
        let server = common::redis_server::RedisServer::start();
        let expected = [
            (StatusCode::OK, r#""api";r=1;t=30"#.to_owned()),
            (StatusCode::OK, r#""api";r=0;t=60"#.to_owned()),
            (
                StatusCode::TOO_MANY_REQUESTS,
                r#""api";r=0;t=60"#.to_owned(),
            ),
        ];
        assert_eq!(three(limit(None).unwrap()).await, expected);
        let redis = limit(Some(&server.url())).unwrap();
        assert!(matches!(redis, Either::Right(_)));
        assert_eq!(three(redis).await, expected);
    }
}
