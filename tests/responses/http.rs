#![cfg(feature = "axum")]
//! docs/design.md section 2 through the HTTP layer: statuses, headers, composition with axum.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use common::spec;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::{self, Header, PeerIp};
use tollgate::response::{OnReject, Rejection, RejectionKind};
use tollgate::{Clock, ConfigError, Decision, MissingKey, Outcome, Policy, Quota, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn get_req(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The table of cases, through the layer: cost from a header, key from a header.
#[tokio::test(start_paused = true)]
async fn http_layer_follows_the_table_of_cases() {
    for case in spec::cases() {
        let mut policy = Policy::new("p", case.quotas[0].clone());
        for q in &case.quotas[1..] {
            policy = policy.quota(q.clone());
        }
        let layer = RateLimitLayer::new(policy)
            .key(Header::new("x-key"))
            .cost(|req| {
                req.headers
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
            .clock(Clock::tokio());
        let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let start = tokio::time::Instant::now();
        for (i, step) in case.steps.iter().enumerate() {
            tokio::time::sleep_until(start + Duration::from_millis(step.at_ms)).await;
            let req = Request::get("/")
                .header("x-key", step.key)
                .header("x-cost", step.cost.to_string())
                .body(Body::empty())
                .unwrap();
            let resp = svc.clone().oneshot(req).await.unwrap();
            let ctx = format!("case {:?} step {i}", case.name);
            let e = &step.expect;
            let want = match e.outcome {
                Outcome::Allowed => StatusCode::OK,
                _ => StatusCode::TOO_MANY_REQUESTS,
            };
            assert_eq!(resp.status(), want, "{ctx}");
            // Retry-After: whole seconds rounded up, never 0; absent when waiting cannot help.
            let retry = header(&resp, "retry-after");
            match (e.outcome, e.retry_after_ms) {
                (Outcome::Limited, Some(ms)) => {
                    let secs = ms.div_ceil(1000).max(1).to_string();
                    assert_eq!(retry, Some(secs.as_str()), "{ctx}");
                }
                (Outcome::Limited, None) => assert!(retry.is_some(), "{ctx}"),
                _ => assert_eq!(retry, None, "{ctx}"),
            }
            // RateLimit: one item per quota with r = remaining.
            let rl = header(&resp, "ratelimit").expect("RateLimit on every response");
            assert_eq!(rl.split(", ").count(), case.quotas.len(), "{ctx}");
            if let Some(r) = &e.remaining {
                let got: Vec<u64> = rl
                    .split(", ")
                    .map(|item| {
                        let r = item.split(";r=").nth(1).unwrap();
                        r.split(';').next().unwrap().parse().unwrap()
                    })
                    .collect();
                assert_eq!(&got, r, "{ctx}: {rl}");
            }
            assert!(header(&resp, "ratelimit-policy").is_some(), "{ctx}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn headers_follow_draft_10_one_item_per_quota() {
    let layer = RateLimitLayer::new(
        Policy::new("api", Quota::per_second(10).burst(20))
            .quota(Quota::per_day(10_000).named("daily")),
    )
    .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some("\"api\";q=20;w=2, \"daily\";q=10000;w=86400")
    );
    assert_eq!(
        header(&resp, "ratelimit"),
        Some("\"api\";r=19;t=1, \"daily\";r=9999;t=9")
    );
    assert_eq!(header(&resp, "x-ratelimit-limit"), None);
}

/// One rate limit over every route, stacked over a named concurrency limit on one of them
/// and over two more rate limits on another (which append through the same place in the
/// code as the outer one): every response, whichever routes came before it, lists each of
/// its layers' items once, innermost first, and the outer limit's `RateLimit` counts every
/// request.
#[tokio::test(start_paused = true)]
async fn stacked_and_lone_responses_of_one_layer_list_every_item_on_every_request() {
    let (clock, _time) = Clock::manual();
    let limit = |name: &'static str| {
        RateLimitLayer::new(Policy::new(name, Quota::per_second(100))).clock(clock.clone())
    };
    let app = Router::new()
        .route(
            "/workers",
            get(|| async { "ok" }).layer(tollgate::ConcurrencyLimitLayer::new(4).name("workers")),
        )
        .route(
            "/limits",
            get(|| async { "ok" }).layer(
                ServiceBuilder::new()
                    .layer(limit("route"))
                    .layer(limit("inner")),
            ),
        )
        .route("/alone", get(|| async { "ok" }))
        .route_layer(limit("api"));
    let paths = [
        "/workers", "/alone", "/workers", "/workers", "/limits", "/alone", "/limits", "/workers",
        "/alone", "/alone", "/limits", "/workers",
    ];
    let (mut route, mut inner) = (100, 100);
    for (i, path) in paths.into_iter().enumerate() {
        let resp = app.clone().oneshot(get_req(path)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{i} {path}");
        let api = "\"api\";q=100;w=1";
        let (policy, ratelimit) = match path {
            "/workers" => (
                vec!["\"workers\";q=4;qu=\"concurrent-requests\"", api],
                vec![],
            ),
            "/limits" => {
                route -= 1;
                inner -= 1;
                (
                    vec!["\"inner\";q=100;w=1", "\"route\";q=100;w=1", api],
                    vec![
                        format!("\"inner\";r={inner};t=1"),
                        format!("\"route\";r={route};t=1"),
                    ],
                )
            }
            _ => (vec![api], vec![]),
        };
        let listed = |name: &str| -> Vec<String> {
            resp.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(listed("ratelimit-policy"), policy, "{i} {path}");
        let mut expected = ratelimit;
        expected.push(format!("\"api\";r={};t=1", 99 - i));
        assert_eq!(listed("ratelimit"), expected, "{i} {path}");
    }
}

#[tokio::test(start_paused = true)]
async fn legacy_headers_only_on_request() {
    let layer = RateLimitLayer::new(Quota::per_minute(5))
        .legacy_headers(true)
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(header(&resp, "x-ratelimit-limit"), Some("5"));
    assert_eq!(header(&resp, "x-ratelimit-remaining"), Some("4"));
    assert_eq!(header(&resp, "x-ratelimit-reset"), Some("12"));
    assert!(header(&resp, "ratelimit").is_some());
}

#[tokio::test(start_paused = true)]
async fn retry_after_rounds_up_sub_second_waits() {
    let layer = RateLimitLayer::new(Quota::per_second(10).burst(1)).clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        200
    );
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), Some("1"));
    assert_eq!(
        header(&resp, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"Too Many Requests\n");
}

#[tokio::test(start_paused = true)]
async fn one_layer_value_is_one_shared_state_across_routes() {
    let layer = RateLimitLayer::new(Quota::per_minute(2)).clock(Clock::tokio());
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .layer(layer.clone());
    let other = Router::new()
        .route("/c", get(|| async { "c" }))
        .layer(layer);
    assert_eq!(
        app.clone().oneshot(get_req("/a")).await.unwrap().status(),
        200
    );
    assert_eq!(
        app.clone().oneshot(get_req("/b")).await.unwrap().status(),
        200
    );
    assert_eq!(
        other.clone().oneshot(get_req("/c")).await.unwrap().status(),
        429
    );
    // A second layer value is a second limit.
    let fresh = Router::new()
        .route("/d", get(|| async { "d" }))
        .layer(RateLimitLayer::new(Quota::per_minute(2)).clock(Clock::tokio()));
    assert_eq!(fresh.oneshot(get_req("/d")).await.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn works_under_route_layer_and_method_router_layer() {
    let per_route = RateLimitLayer::new(Quota::per_minute(1))
        .key(key::Route)
        .clock(Clock::tokio());
    let app = Router::new()
        .route(
            "/login",
            post(|| async { "in" })
                .layer(RateLimitLayer::new(Quota::per_minute(1)).clock(Clock::tokio())),
        )
        .route("/users/{id}", get(|| async { "user" }))
        .route_layer(per_route);
    let login = || Request::post("/login").body(Body::empty()).unwrap();
    assert_eq!(app.clone().oneshot(login()).await.unwrap().status(), 200);
    assert_eq!(app.clone().oneshot(login()).await.unwrap().status(), 429);
    // Route keys use the matched route, so /users/1 and /users/2 share one bucket.
    assert_eq!(
        app.clone()
            .oneshot(get_req("/users/1"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        app.clone()
            .oneshot(get_req("/users/2"))
            .await
            .unwrap()
            .status(),
        429
    );
    // route_layer does not apply to unmatched paths.
    assert_eq!(
        app.clone()
            .oneshot(get_req("/nope"))
            .await
            .unwrap()
            .status(),
        404
    );
}

#[test]
fn the_inner_error_type_is_preserved() {
    fn error_of<S: tower::Service<Request<Body>, Error = Infallible>>(_: &S) {}
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Quota::per_second(1)))
        .service_fn(ok);
    error_of(&svc);
    #[derive(Debug)]
    struct MyError;
    let failing = ServiceBuilder::new()
        .layer(RateLimitLayer::new(Quota::per_second(1)))
        .service_fn(|_req: Request<Body>| async { Err::<Response<Body>, _>(MyError) });
    fn my_error_of<S: tower::Service<Request<Body>, Error = MyError>>(_: &S) {}
    my_error_of(&failing);
}

#[tokio::test(start_paused = true)]
async fn missing_key_policies() {
    let reject = RateLimitLayer::new(Quota::per_minute(1))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let svc = ServiceBuilder::new().layer(reject).service_fn(ok);
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(resp.status(), 401);

    let default = RateLimitLayer::new(Quota::per_minute(1)).key(PeerIp::new());
    let svc = ServiceBuilder::new().layer(default).service_fn(ok);
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        400
    );

    let allow = RateLimitLayer::new(Quota::per_minute(1))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::Allow);
    let svc = ServiceBuilder::new().layer(allow).service_fn(ok);
    for _ in 0..3 {
        assert_eq!(
            svc.clone().oneshot(get_req("/")).await.unwrap().status(),
            200
        );
    }

    let shared = RateLimitLayer::new(Quota::per_minute(1))
        .key(Header::new("x-api-key"))
        .on_missing_key(MissingKey::UseKey(b"anonymous".to_vec().into()));
    let svc = ServiceBuilder::new().layer(shared).service_fn(ok);
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        200
    );
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        429
    );
}

#[tokio::test(start_paused = true)]
async fn tiers_choose_a_policy_per_request() {
    let layer = RateLimitLayer::new(Policy::new("free", Quota::per_minute(1)))
        .tier(Policy::new("vip", Quota::per_minute(3)))
        .key(Header::new("x-api-key"))
        .select_tier(|req| {
            let vip = req
                .headers
                .get("x-api-key")
                .is_some_and(|k| k.as_bytes().starts_with(b"vip_"));
            vip.then_some("vip")
        })
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let with_key = |k: &str| {
        Request::get("/")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    let statuses = |k: &'static str| {
        let svc = svc.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..4 {
                out.push(
                    svc.clone()
                        .oneshot(with_key(k))
                        .await
                        .unwrap()
                        .status()
                        .as_u16(),
                );
            }
            out
        }
    };
    assert_eq!(statuses("free_1").await, [200, 429, 429, 429]);
    assert_eq!(statuses("vip_1").await, [200, 200, 200, 429]);
    let resp = svc.clone().oneshot(with_key("vip_2")).await.unwrap();
    assert_eq!(header(&resp, "ratelimit-policy"), Some("\"vip\";q=3;w=60"));
}

#[tokio::test(start_paused = true)]
async fn skipped_requests_are_not_counted() {
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .skip_method(Method::OPTIONS)
        .skip_path("/health")
        .skip_if(|req| req.headers.contains_key("x-internal"))
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    for _ in 0..3 {
        let opt = Request::options("/").body(Body::empty()).unwrap();
        let resp = svc.clone().oneshot(opt).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "ratelimit"), None);
        assert_eq!(
            svc.clone()
                .oneshot(get_req("/health"))
                .await
                .unwrap()
                .status(),
            200
        );
        let internal = Request::get("/")
            .header("x-internal", "1")
            .body(Body::empty())
            .unwrap();
        assert_eq!(svc.clone().oneshot(internal).await.unwrap().status(), 200);
    }
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        200
    );
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        429
    );
}

#[tokio::test(start_paused = true)]
async fn custom_rejection_keeps_the_standard_headers() {
    let hook = OnReject::new(|r: &Rejection<'_>| {
        assert_eq!(r.kind(), RejectionKind::RateLimited);
        assert_eq!(r.policy(), Some("1-per-1m"));
        Response::builder()
            .status(r.status())
            .header("content-type", "application/json")
            .body(Bytes::from_static(br#"{"error":"slow down"}"#))
            .unwrap()
    });
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .on_reject(hook)
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    svc.clone().oneshot(get_req("/")).await.unwrap();
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "content-type"), Some("application/json"));
    assert_eq!(header(&resp, "retry-after"), Some("60"));
    assert!(header(&resp, "ratelimit").is_some());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], br#"{"error":"slow down"}"#);
}

#[tokio::test(start_paused = true)]
async fn cost_above_burst_is_429_without_a_lying_retry_after() {
    let layer = RateLimitLayer::new(Quota::per_second(10).burst(5))
        .cost(|_| 6)
        .clock(Clock::tokio());
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let resp = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(header(&resp, "retry-after"), None);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        b"Too Many Requests: the request costs more than the limit allows\n"
    );
}

#[tokio::test(start_paused = true)]
async fn handlers_can_read_the_decision() {
    let app = Router::new()
        .route(
            "/",
            get(|d: Decision| async move { format!("{} left", d.remaining()) }),
        )
        .route(
            "/optional",
            get(|d: Option<Decision>| async move { format!("{:?}", d.map(|d| d.is_unlimited())) }),
        )
        .layer(
            RateLimitLayer::new(Quota::per_minute(3))
                .skip_path("/optional")
                .clock(Clock::tokio()),
        );
    let body = |resp: Response<Body>| async move {
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    };
    assert_eq!(
        body(app.clone().oneshot(get_req("/")).await.unwrap()).await,
        "2 left"
    );
    assert_eq!(
        body(app.clone().oneshot(get_req("/optional")).await.unwrap()).await,
        "Some(true)"
    );
}

#[test]
fn invalid_configuration_is_a_typed_error_at_build_time() {
    let five = Policy::new("p", Quota::per_second(1))
        .quota(Quota::per_second(2))
        .quota(Quota::per_second(3))
        .quota(Quota::per_second(4))
        .quota(Quota::per_second(5));
    let err = RateLimitLayer::new(five).validate().unwrap_err();
    assert_eq!(err, ConfigError::TooManyQuotas { got: 5, max: 4 });

    let dup = RateLimitLayer::new(Policy::new("a", Quota::per_second(1)))
        .tier(Policy::new("a", Quota::per_second(2)));
    assert_eq!(
        dup.validate().unwrap_err(),
        ConfigError::DuplicateTier("a".into())
    );

    let bad_name = RateLimitLayer::new(Policy::new("a\"b", Quota::per_second(1)));
    assert!(matches!(
        bad_name.validate().unwrap_err(),
        ConfigError::InvalidName(_)
    ));

    let zero = RateLimitLayer::new(Quota::per_second(1)).max_keys(0);
    assert_eq!(zero.validate().unwrap_err(), ConfigError::ZeroMaxKeys);

    let ok_status = RateLimitLayer::new(Quota::per_second(1))
        .key(PeerIp::new())
        .on_missing_key(MissingKey::Reject(StatusCode::OK));
    assert_eq!(
        ok_status.validate().unwrap_err(),
        ConfigError::InvalidStatus(200)
    );
}

#[test]
#[should_panic(
    expected = "tollgate: invalid RateLimitLayer: a rate-limit policy holds at most 4 quotas"
)]
fn an_invalid_layer_panics_when_the_app_is_assembled_not_per_request() {
    let layer = RateLimitLayer::new(Quota::per_second(1))
        .quota(Quota::per_second(2))
        .quota(Quota::per_second(3))
        .quota(Quota::per_second(4))
        .quota(Quota::per_second(5));
    let _ = Router::<()>::new()
        .route("/", get(|| async { "" }))
        .layer(layer);
}

/// A real server on loopback, with `ConnectInfo`, and a raw HTTP/1.1 client.
#[tokio::test]
async fn quickstart_over_loopback_with_connect_info() {
    let limit = RateLimitLayer::new(Policy::new("per-ip", Quota::per_second(1).burst(5)))
        .key(PeerIp::new());
    let app = Router::new().route("/", get(|| async { "hello" }).layer(limit));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let mut statuses = Vec::new();
    let mut last = String::new();
    for _ in 0..7 {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = String::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut raw))
            .await
            .expect("the server answers")
            .unwrap();
        statuses.push(raw[9..12].to_owned());
        last = raw.to_ascii_lowercase();
    }
    server.abort();
    // Real time passes between requests; 7 requests take far less than a second here, but
    // allow one earned-back request on a very slow machine.
    let allowed = statuses.iter().filter(|s| *s == "200").count();
    assert!((5..=6).contains(&allowed), "{statuses:?}");
    assert_eq!(statuses[..5], ["200"; 5]);
    assert_eq!(statuses[6], "429");
    assert!(last.contains("retry-after: 1\r\n"), "{last}");
    assert!(
        last.contains("ratelimit-policy: \"per-ip\";q=5;w=5\r\n"),
        "{last}"
    );
    assert!(last.contains("ratelimit: \"per-ip\";r=0;t="), "{last}");
}
