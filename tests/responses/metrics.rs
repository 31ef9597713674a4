#![cfg(all(feature = "metrics", feature = "axum"))]
//! The metrics of every layer, read through `metrics-util`'s debugging recorder: decisions by
//! outcome labelled by policy and quota (never by key), tracked keys, concurrency in flight
//! and waiting, shaping queue and delays, Redis calls.
//!
//! Each test builds its layers under its own recorder (`metrics::with_local_recorder`): the
//! handles are resolved when a layer is built, and keep counting into that recorder.
//!
//! Pins docs/design.md section 3 ("Observability").

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::key::Header;
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Service, ServiceBuilder, ServiceExt};

#[cfg(feature = "redis")]
use crate::common;

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

fn from(client: &str) -> Request<Body> {
    Request::get("/")
        .header("x-client", client)
        .body(Body::empty())
        .unwrap()
}

/// Reads what a recorder recorded. The debugging recorder's snapshots take the values out
/// (counters and gauges back to 0, histograms emptied), so the reader adds each snapshot to
/// what it read before: counters and the gauges moved by increments and decrements read as
/// their totals. (`tollgate_keys` is set, not moved: read it once.)
struct Reader {
    snapshotter: Snapshotter,
    seen: Mutex<HashMap<String, V>>,
}

/// A series' total so far.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// Builds `make`'s layer under a fresh recorder; the reader reads what it records.
fn recorded<L: Clone>(make: impl FnOnce() -> L, build: impl Fn(&L)) -> (L, Reader) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, || {
        let layer = make();
        build(&layer);
        layer
    });
    let reader = Reader {
        snapshotter,
        seen: Mutex::default(),
    };
    (layer, reader)
}

impl Reader {
    /// Every series so far, named `name{k=v,...}` with its labels sorted.
    fn all(&self) -> HashMap<String, V> {
        let mut seen = self.seen.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let value = match value {
                DebugValue::Counter(n) => V::Counter(n),
                DebugValue::Gauge(g) => V::Gauge(g.into_inner()),
                DebugValue::Histogram(h) => {
                    V::Histogram(h.into_iter().map(|f| f.into_inner()).collect())
                }
            };
            let total = match (seen.remove(&name), value) {
                (Some(V::Counter(a)), V::Counter(b)) => V::Counter(a + b),
                (Some(V::Gauge(a)), V::Gauge(b)) => V::Gauge(a + b),
                (Some(V::Histogram(mut a)), V::Histogram(b)) => {
                    a.extend(b);
                    V::Histogram(a)
                }
                (_, v) => v,
            };
            seen.insert(name, total);
        }
        seen.clone()
    }
}

/// The value of the series `name` whose labels include `labels`; `None` if there is none.
/// Panics if several series match.
fn value(snap: &Reader, name: &str, labels: &[(&str, &str)]) -> Option<V> {
    let found: Vec<V> = snap
        .all()
        .into_iter()
        .filter(|(key, _)| {
            key.starts_with(&format!("{name}{{"))
                && labels.iter().all(|(k, v)| {
                    let inner = &key[name.len() + 1..key.len() - 1];
                    inner.split(',').any(|l| l == format!("{k}={v}"))
                })
        })
        .map(|(_, v)| v)
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.into_iter().next()
}

fn counter(snap: &Reader, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snap, name, labels) {
        Some(V::Counter(n)) => n,
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

fn gauge(snap: &Reader, name: &str, labels: &[(&str, &str)]) -> f64 {
    match value(snap, name, labels) {
        Some(V::Gauge(g)) => g,
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

/// Every value a histogram recorded.
fn histogram(snap: &Reader, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match value(snap, name, labels) {
        Some(V::Histogram(v)) => v,
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

const DECISIONS: &str = "tollgate_decisions_total";

fn decisions(snap: &Reader, policy: &str, quota: &str, outcome: &str, dry: &str) -> u64 {
    counter(
        snap,
        DECISIONS,
        &[
            ("policy", policy),
            ("quota", quota),
            ("outcome", outcome),
            ("dry_run", dry),
        ],
    )
}

async fn status<S, B>(svc: &mut S, req: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap().status()
}

#[tokio::test(start_paused = true)]
async fn rate_limit_decisions_are_counted_by_outcome_and_quota_never_by_key() {
    let (clock, _time) = Clock::manual();
    let (layer, snap) = recorded(
        || {
            RateLimitLayer::new(
                Policy::new("api", Quota::per_second(10).burst(2))
                    .quota(Quota::per_hour(100).named("api-hour")),
            )
            .key(Header::new("x-client"))
            .cost(|req| if req.uri.path() == "/big" { 50 } else { 1 })
            .on_missing_key(MissingKey::reject(401))
            .clock(clock)
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    // Every series exists at 0 from the start.
    assert_eq!(decisions(&snap, "api", "", "allowed", "false"), 0);
    assert_eq!(decisions(&snap, "api", "api", "limited", "false"), 0);
    for client in ["alice", "bob", "carol"] {
        for _ in 0..3 {
            status(&mut svc, from(client)).await;
        }
    }
    let big = Request::get("/big")
        .header("x-client", "dave")
        .body(Body::empty())
        .unwrap();
    assert_eq!(status(&mut svc, big).await, StatusCode::TOO_MANY_REQUESTS);
    let bare = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(status(&mut svc, bare).await, StatusCode::UNAUTHORIZED);

    assert_eq!(decisions(&snap, "api", "", "allowed", "false"), 6);
    assert_eq!(decisions(&snap, "api", "api", "limited", "false"), 3);
    assert_eq!(decisions(&snap, "api", "api-hour", "limited", "false"), 0);
    // A cost of 50 is over both bursts: the first quota listed is named.
    assert_eq!(decisions(&snap, "api", "api", "never_fits", "false"), 1);
    assert_eq!(
        decisions(&snap, "api", "api-hour", "never_fits", "false"),
        0
    );
    assert_eq!(decisions(&snap, "api", "", "missing_key", "false"), 1);
    // Set on the last rejection that had a key: alice, bob, carol and dave's empty state.
    let keys = gauge(
        &snap,
        "tollgate_keys",
        &[("layer", "rate_limit"), ("policy", "api")],
    );
    assert_eq!(keys, 3.0);
    // No label of any series carries a key.
    for name in snap.all().keys() {
        for client in ["alice", "bob", "carol", "dave"] {
            assert!(!name.contains(client), "{name}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_shadow_layer_counts_what_it_would_reject_under_dry_run_true() {
    let (layer, snap) = recorded(
        || {
            RateLimitLayer::new(Policy::new("shadow", Quota::per_second(1).burst(2)))
                .clock(Clock::tokio())
                .dry_run(true)
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    for _ in 0..5 {
        assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    }
    assert_eq!(decisions(&snap, "shadow", "", "allowed", "true"), 2);
    assert_eq!(decisions(&snap, "shadow", "shadow", "limited", "true"), 3);
    assert!(value(&snap, DECISIONS, &[("dry_run", "false")]).is_none());
}

/// A handler that reports its request cost 30.
async fn costs_30(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let mut resp = Response::new(Body::empty());
    resp.headers_mut()
        .insert("x-used", http::HeaderValue::from_static("30"));
    Ok(resp)
}

/// 1 per second, burst 10, each request reserving 1 and settling what `x-used` says.
fn settling(clock: Clock, dry_run: bool) -> RateLimitLayer<Header> {
    RateLimitLayer::new(Policy::new("tokens", Quota::per_second(1).burst(10)))
        .key(Header::new("x-client"))
        .settle(tollgate::rate_limit::settle::ActualCost::header("x-used"))
        .clock(clock)
        .dry_run(dry_run)
}

#[tokio::test(start_paused = true)]
async fn a_settled_charge_into_debt_adds_no_decision_and_the_next_request_is_counted_limited() {
    let (clock, time) = Clock::manual();
    let (layer, snap) = recorded(
        || settling(clock, false),
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(costs_30);
    // Reserves 1, admitted; settles 30: 20 seconds beyond the burst.
    assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    assert_eq!(decisions(&snap, "tokens", "", "allowed", "false"), 1);
    assert_eq!(decisions(&snap, "tokens", "tokens", "limited", "false"), 0);
    time.advance(Duration::from_secs(20));
    assert_eq!(
        status(&mut svc, from("a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(decisions(&snap, "tokens", "", "allowed", "false"), 1);
    assert_eq!(decisions(&snap, "tokens", "tokens", "limited", "false"), 1);
    // The debt paid off: admitted again.
    time.advance(Duration::from_secs(1));
    assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    assert_eq!(decisions(&snap, "tokens", "", "allowed", "false"), 2);
    assert_eq!(decisions(&snap, "tokens", "tokens", "limited", "false"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_settles_what_it_admits_and_nothing_for_a_would_be_rejection() {
    let (clock, time) = Clock::manual();
    let (layer, snap) = recorded(
        || settling(clock, true),
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(costs_30);
    // Admitted and settled at 30: the key is in debt as if enforced.
    assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    // Would-be rejections: let through, reserving nothing, so their 30 is not charged.
    for _ in 0..3 {
        time.advance(Duration::from_secs(5));
        assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    }
    assert_eq!(decisions(&snap, "tokens", "", "allowed", "true"), 1);
    assert_eq!(decisions(&snap, "tokens", "tokens", "limited", "true"), 3);
    // 21 seconds after the first request its debt alone is paid off (three more charges of
    // 30 would have pushed it 90 seconds further).
    time.advance(Duration::from_secs(6));
    assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    assert_eq!(decisions(&snap, "tokens", "", "allowed", "true"), 2);
    assert_eq!(decisions(&snap, "tokens", "tokens", "limited", "true"), 3);
    assert!(value(&snap, DECISIONS, &[("dry_run", "false")]).is_none());
}

#[tokio::test(start_paused = true)]
async fn concurrency_counts_in_flight_waiting_and_wait_time() {
    let (layer, snap) = recorded(
        || {
            ConcurrencyLimitLayer::new(1)
                .queue(1, Duration::from_secs(5))
                .name("db")
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let labels = [("policy", "db"), ("dry_run", "false")];
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |_req: Request<Body>| {
            let g = g.clone();
            async move {
                g.notified().await;
                ok(_req).await
            }
        });
    let first = tokio::spawn(svc.clone().oneshot(from("a")));
    tokio::task::yield_now().await;
    let second = tokio::spawn(svc.clone().oneshot(from("a")));
    tokio::task::yield_now().await;
    assert_eq!(gauge(&snap, "tollgate_concurrency_in_flight", &labels), 1.0);
    assert_eq!(gauge(&snap, "tollgate_concurrency_waiting", &labels), 1.0);
    // The queue (1) is full.
    assert_eq!(
        svc.clone().oneshot(from("a")).await.unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    gate.notify_one();
    drop(first.await.unwrap().unwrap());
    tokio::task::yield_now().await;
    gate.notify_one();
    drop(second.await.unwrap().unwrap());
    assert_eq!(gauge(&snap, "tollgate_concurrency_in_flight", &labels), 0.0);
    assert_eq!(gauge(&snap, "tollgate_concurrency_waiting", &labels), 0.0);
    assert_eq!(
        histogram(&snap, "tollgate_concurrency_wait_seconds", &labels),
        [2.0]
    );
    assert_eq!(decisions(&snap, "db", "", "allowed", "false"), 1);
    assert_eq!(decisions(&snap, "db", "", "waited", "false"), 1);
    assert_eq!(decisions(&snap, "db", "", "queue_full", "false"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_times_out_is_counted_limited_with_its_wait() {
    let (layer, snap) = recorded(
        || {
            ConcurrencyLimitLayer::new(1)
                .queue(4, Duration::from_millis(300))
                .name("q")
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let labels = [("policy", "q"), ("dry_run", "false")];
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(move |req: Request<Body>| {
            let g = g.clone();
            async move {
                g.notified().await;
                ok(req).await
            }
        });
    let first = tokio::spawn(svc.clone().oneshot(from("a")));
    tokio::task::yield_now().await;
    let resp = svc.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    gate.notify_one();
    drop(first.await.unwrap().unwrap());
    assert_eq!(decisions(&snap, "q", "", "limited", "false"), 1);
    assert_eq!(
        histogram(&snap, "tollgate_concurrency_wait_seconds", &labels),
        [0.3]
    );
    assert_eq!(gauge(&snap, "tollgate_concurrency_waiting", &labels), 0.0);
}

#[tokio::test(start_paused = true)]
async fn shaping_counts_delays_and_the_queue_it_holds() {
    let (layer, snap) = recorded(
        || {
            ShapeLayer::new(Quota::per_second(1))
                .name("up")
                .max_waiting(2)
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let labels = [("policy", "up"), ("dry_run", "false")];
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(tokio::spawn(svc.clone().oneshot(from("a"))));
    }
    tokio::task::yield_now().await;
    assert_eq!(gauge(&snap, "tollgate_shape_queue_length", &labels), 2.0);
    assert_eq!(
        svc.clone().oneshot(from("a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(gauge(&snap, "tollgate_shape_queue_length", &labels), 0.0);
    let mut delays = histogram(&snap, "tollgate_shape_delay_seconds", &labels);
    delays.sort_by(f64::total_cmp);
    assert_eq!(delays, [0.0, 1.0, 2.0]);
    assert_eq!(decisions(&snap, "up", "", "allowed", "false"), 1);
    assert_eq!(decisions(&snap, "up", "", "delayed", "false"), 2);
    assert_eq!(decisions(&snap, "up", "", "queue_full", "false"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_shaper_reports_the_delays_it_would_have_given() {
    let (layer, snap) = recorded(
        || {
            ShapeLayer::new(Quota::per_second(1))
                .name("up")
                .max_waiting(1)
                .dry_run(true)
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let labels = [("policy", "up"), ("dry_run", "true")];
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    for _ in 0..3 {
        assert_eq!(status(&mut svc, from("a")).await, StatusCode::OK);
    }
    assert_eq!(gauge(&snap, "tollgate_shape_queue_length", &labels), 1.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(gauge(&snap, "tollgate_shape_queue_length", &labels), 0.0);
    let mut delays = histogram(&snap, "tollgate_shape_delay_seconds", &labels);
    delays.sort_by(f64::total_cmp);
    assert_eq!(delays, [0.0, 1.0]);
    assert_eq!(decisions(&snap, "up", "", "delayed", "true"), 1);
    assert_eq!(decisions(&snap, "up", "", "queue_full", "true"), 1);
}

#[test]
fn a_named_limiter_counts_its_decisions_and_an_unnamed_one_does_not() {
    let (clock, _time) = Clock::manual();
    let (limiters, snap) = recorded(
        || {
            let named = tollgate::RateLimiter::<u32>::builder(Quota::per_second(1).burst(2))
                .quota(Quota::per_minute(10).named("jobs-minute"))
                .name("jobs")
                .clock(clock.clone())
                .build();
            let unnamed = tollgate::RateLimiter::<u32>::builder(Quota::per_second(1))
                .clock(clock.clone())
                .build();
            (named, unnamed)
        },
        |_| {},
    );
    let (named, unnamed) = limiters;
    for job in 0..3 {
        let _ = named.check(&7);
        let _ = unnamed.check(&job);
    }
    // A cost of 0 only reports.
    let _ = named.peek(&7);
    assert!(named.check_n(&7, 11).outcome() == tollgate::Outcome::Exceeds);
    let limiter = [("layer", "limiter"), ("policy", "jobs")];
    let of = |outcome: &str, quota: &str| {
        let mut labels = limiter.to_vec();
        labels.extend([("outcome", outcome), ("quota", quota)]);
        counter(&snap, DECISIONS, &labels)
    };
    assert_eq!(of("allowed", ""), 2);
    assert_eq!(of("limited", "jobs"), 1);
    assert_eq!(of("never_fits", "jobs"), 1);
    assert_eq!(of("never_fits", "jobs-minute"), 0);
    assert_eq!(gauge(&snap, "tollgate_keys", &limiter), 1.0);
    // The unnamed limiter made no series at all.
    let all = snap.all();
    assert!(all.keys().all(|k| k.contains("policy=jobs")), "{all:?}");
}

#[tokio::test(start_paused = true)]
async fn the_limiters_of_a_layer_are_counted_once_by_the_layer() {
    let (layer, snap) = recorded(
        || RateLimitLayer::new(Policy::new("once", Quota::per_second(1))),
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let mut svc = ServiceBuilder::new().layer(layer.clone()).service_fn(ok);
    status(&mut svc, from("a")).await;
    let _ = layer.limiter("once").unwrap().unwrap().check(&());
    assert_eq!(decisions(&snap, "once", "", "allowed", "false"), 1);
    assert!(value(&snap, DECISIONS, &[("layer", "limiter")]).is_none());
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use common::redis_server::RedisServer;
    use tollgate::redis::{FailMode, RedisStore};

    /// A key of the wrong type is an error about that key, not an outage: counted as
    /// `error="key"`, and the request refused as unavailable even when the store fails open.
    #[tokio::test]
    async fn a_key_error_is_counted_as_its_own_error_and_refused_as_unavailable() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .on_failure(FailMode::Open);
        let policy = "p-key";
        let (layer, snap) = recorded(
            || RateLimitLayer::new(Policy::new(policy, Quota::per_second(10))).store(store),
            |l| {
                let _ = l.clone().validate().unwrap();
            },
        );
        let limiter = layer.limiter(policy).unwrap().unwrap();
        let name = String::from_utf8(limiter.redis_key(&())).unwrap();
        server.cli(&["HSET", &name, "f", "v"]).unwrap();
        let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        for _ in 0..3 {
            let got = status(&mut svc, from("a")).await;
            assert_eq!(got, StatusCode::SERVICE_UNAVAILABLE);
        }
        let errors = [("policy", policy), ("error", "key")];
        assert_eq!(counter(&snap, "tollgate_redis_errors_total", &errors), 3);
        assert_eq!(decisions(&snap, policy, "", "fail_closed", "false"), 3);
    }

    /// Redis is paused and never answers in time: each call is a timeout and a degraded
    /// decision, counted as fail open or fail closed.
    #[tokio::test]
    async fn redis_failures_are_counted_by_kind_and_by_the_failure_policy() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        server.pause();
        for (mode, outcome, expected) in [
            (FailMode::Open, "fail_open", StatusCode::OK),
            (
                FailMode::Closed,
                "fail_closed",
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        ] {
            let policy = format!("p-{outcome}");
            let store = store
                .clone()
                .timeout(Duration::from_millis(20))
                .on_failure(mode);
            let (layer, snap) = recorded(
                || {
                    RateLimitLayer::new(Policy::new(policy.clone(), Quota::per_second(1)))
                        .store(store)
                },
                |l| {
                    let _ = l.clone().validate().unwrap();
                },
            );
            let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
            for i in 0..3 {
                assert_eq!(status(&mut svc, from("a")).await, expected, "{outcome} {i}");
            }
            assert_eq!(decisions(&snap, &policy, "", outcome, "false"), 3);
            let errors = [("policy", policy.as_str()), ("error", "timeout")];
            assert_eq!(counter(&snap, "tollgate_redis_errors_total", &errors), 3);
            let calls = histogram(
                &snap,
                "tollgate_redis_call_duration_seconds",
                &[("policy", policy.as_str())],
            );
            assert_eq!(calls.len(), 3);
        }
        server.resume();
    }

    /// Redis unreachable with the local fallback: each decision is counted as the fallback
    /// made it, `local_allowed` or `local_limited`, beside the Redis errors.
    #[tokio::test]
    async fn local_fallback_decisions_are_counted_as_local() {
        let port = common::redis_server::free_port();
        let store = RedisStore::open(&format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_millis(50))
            .on_failure(FailMode::local(0.5));
        let (clock, _time) = Clock::manual();
        let (layer, snap) = recorded(
            || {
                RateLimitLayer::new(Policy::new("local", Quota::per_minute(4)))
                    .clock(clock.clone())
                    .store(store.clone())
            },
            |l| {
                let _ = l.clone().validate().unwrap();
            },
        );
        let mut svc = ServiceBuilder::new().layer(layer).service_fn(ok);
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(status(&mut svc, from("a")).await);
        }
        assert_eq!(got, [200, 200, 429, 429, 429]);
        assert_eq!(decisions(&snap, "local", "", "local_allowed", "false"), 2);
        assert_eq!(decisions(&snap, "local", "", "local_limited", "false"), 3);
        assert_eq!(decisions(&snap, "local", "", "fail_open", "false"), 0);
        assert_eq!(decisions(&snap, "local", "local", "limited", "false"), 0);

        // A Redis limiter used directly counts its own decisions the same way.
        let (limiter, snap) = recorded(
            || {
                tollgate::redis::RedisRateLimiter::<u32>::builder(store, Quota::per_hour(2))
                    .name("mail")
                    .clock(clock)
                    .build()
            },
            |_| {},
        );
        for _ in 0..3 {
            assert!(limiter.check(&1).await.is_local());
        }
        let labels = |outcome| {
            [
                ("layer", "limiter"),
                ("policy", "mail"),
                ("outcome", outcome),
                ("quota", ""),
            ]
        };
        assert_eq!(counter(&snap, DECISIONS, &labels("local_allowed")), 1);
        assert_eq!(counter(&snap, DECISIONS, &labels("local_limited")), 2);
    }

    #[tokio::test]
    async fn a_redis_limiter_counts_its_decisions_and_calls() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let (limiter, snap) = recorded(
            || {
                tollgate::redis::RedisRateLimiter::<u32>::builder(store, Quota::per_hour(1))
                    .name("mail")
                    .build()
            },
            |_| {},
        );
        for _ in 0..3 {
            let _ = limiter.check(&1).await;
        }
        let labels = |outcome, quota| {
            [
                ("layer", "limiter"),
                ("policy", "mail"),
                ("outcome", outcome),
                ("quota", quota),
            ]
        };
        assert_eq!(counter(&snap, DECISIONS, &labels("allowed", "")), 1);
        assert_eq!(counter(&snap, DECISIONS, &labels("limited", "mail")), 2);
        let calls = histogram(
            &snap,
            "tollgate_redis_call_duration_seconds",
            &[("policy", "mail")],
        );
        // The deny cache answered the third without a call.
        assert_eq!(calls.len(), 2);
        assert_eq!(
            counter(
                &snap,
                "tollgate_redis_errors_total",
                &[("policy", "mail"), ("error", "timeout")]
            ),
            0
        );
    }

    /// A shadow instance and an enforcing one share a Redis limit: the shadow instance's
    /// would-be rejections consume nothing, so the enforcing one sees only the requests that
    /// enforcement would have admitted.
    #[tokio::test]
    async fn a_shadow_instance_on_redis_consumes_only_what_it_admits() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let (clock, _time) = Clock::manual();
        let quota = Quota::per_hour(1).burst(3);
        let (shadow, snap) = recorded(
            || {
                RateLimitLayer::new(Policy::new("shared", quota.clone()))
                    .store(store.clone())
                    .clock(clock.clone())
                    .dry_run(true)
            },
            |l| {
                let _ = l.clone().validate().unwrap();
            },
        );
        let enforcing = RateLimitLayer::new(Policy::new("shared", quota))
            .store(store)
            .clock(clock);
        let mut shadow_svc = ServiceBuilder::new().layer(shadow).service_fn(ok);
        let mut enforcing_svc = ServiceBuilder::new().layer(enforcing).service_fn(ok);
        // The shadow instance sees a flood of 10: it admits 3 and would reject 7.
        for _ in 0..10 {
            assert_eq!(status(&mut shadow_svc, from("a")).await, StatusCode::OK);
        }
        assert_eq!(decisions(&snap, "shared", "", "allowed", "true"), 3);
        assert_eq!(decisions(&snap, "shared", "shared", "limited", "true"), 7);
        // The 3 it admitted took the burst; the 7 took nothing (an hour later, one is back).
        assert_eq!(
            status(&mut enforcing_svc, from("a")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// Answers after `d` (on the paused clock).
async fn slow(d: Duration) -> Result<Response<Body>, Infallible> {
    tokio::time::sleep(d).await;
    Ok(Response::new(Body::empty()))
}

#[tokio::test(start_paused = true)]
async fn an_adaptive_limit_reports_its_limit_latency_and_sheds() {
    use tollgate::concurrency::{Aimd, Priority};
    // Every request takes 100 ms, twice AIMD's timeout: each completion lowers the limit.
    let (layer, snap) = recorded(
        || {
            ConcurrencyLimitLayer::new(100)
                .adaptive(
                    Aimd::default()
                        .initial(40)
                        .timeout(Duration::from_millis(50)),
                )
                .name("backend")
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    // Gauges are read once each: the reader adds up its snapshots, which suits gauges moved
    // up and down, not gauges set to a value.
    let labels = [("policy", "backend"), ("dry_run", "false")];
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|_req: Request<Body>| slow(Duration::from_millis(100)));
    for _ in 0..3 {
        let resp = svc.clone().oneshot(from("a")).await.unwrap();
        drop(http_body_util::BodyExt::collect(resp.into_body()).await);
    }
    let limit = layer.limit();
    assert!(limit < 40, "AIMD backed off: {limit}");
    assert_eq!(
        gauge(&snap, "tollgate_concurrency_limit", &labels),
        limit as f64
    );
    let latency = layer.latency().expect("measured").as_secs_f64();
    assert_eq!(
        gauge(&snap, "tollgate_concurrency_latency_seconds", &labels),
        latency
    );
    assert!((latency - 0.1).abs() < 1e-9, "{latency}");

    // Priorities: of 2 places, a sheddable request may take 1; the second is shed.
    let (shedding, snap) = recorded(
        || {
            ConcurrencyLimitLayer::new(2)
                .priority(|_| Priority::Sheddable)
                .name("search")
        },
        |l| {
            let _ = l.clone().validate().unwrap();
        },
    );
    let labels = [("policy", "search"), ("dry_run", "false")];
    let svc = ServiceBuilder::new()
        .layer(shedding.clone())
        .service_fn(|_req: Request<Body>| slow(Duration::from_secs(1)));
    let first = tokio::spawn(svc.clone().oneshot(from("a")));
    tokio::task::yield_now().await;
    let second = svc.clone().oneshot(from("a")).await.unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shedding.sheds(), 1);
    assert_eq!(
        counter(&snap, "tollgate_concurrency_sheds_total", &labels),
        1
    );
    // Set when the layer was built; a limit without an algorithm never moves.
    assert_eq!(gauge(&snap, "tollgate_concurrency_limit", &labels), 2.0);
    drop(first.await.unwrap().unwrap());
}
