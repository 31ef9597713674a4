#![cfg(feature = "metrics")]
//! The one rejection path where it meets the rest: every layer, with and without a rejection
//! hook, counts each rejection once under its outcome (not twice, not zero) and answers it
//! with its status and fields; a penalty box's strike that bans is counted as the ban; a
//! rejection of an inner rate limit carries the outer layer's fields and gives back what the
//! outer layer took. Each case is read as one list of observations, so that a difference
//! shows every number at once.
//!
//! Pins docs/design.md section 2 and section 3 ("Observability", "Stacked layers are all or
//! nothing", "The penalty box punishes the client's own traffic").

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::response::{OnReject, Rejection, RejectionKind};
use tollgate::{
    Clock, ConcurrencyLimitLayer, MissingKey, Policy, Quota, RateLimitLayer, ShapeLayer,
};
use tower::{Layer, Service, ServiceExt};

/// The decisions counted so far, by `policy/outcome/dry_run`, every quota label summed.
struct Counts {
    snapshotter: Snapshotter,
    seen: BTreeMap<String, u64>,
}

impl Counts {
    fn read(&mut self) -> BTreeMap<String, u64> {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
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
                "{}/{}/{}",
                label("policy"),
                label("outcome"),
                label("dry_run")
            );
            if let DebugValue::Counter(n) = value {
                *self.seen.entry(name).or_default() += n;
            }
        }
        self.seen.retain(|_, n| *n > 0);
        self.seen.clone()
    }
}

/// Builds `make`'s layer under a fresh recorder.
fn recorded<L>(make: impl FnOnce() -> L) -> (L, Counts) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let layer = metrics::with_local_recorder(&recorder, make);
    let counts = Counts {
        snapshotter,
        seen: BTreeMap::new(),
    };
    (layer, counts)
}

/// A hook that notes the kind of every rejection it answers, and answers with the default.
fn noting() -> (OnReject, Arc<Mutex<Vec<RejectionKind>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let hook = OnReject::new(move |r: &Rejection<'_>| {
        log.lock().unwrap().push(r.kind());
        r.default_response()
    });
    (hook, seen)
}

fn from(client: Option<&str>) -> Request<Bytes> {
    let mut req = Request::get("/");
    if let Some(c) = client {
        req = req.header("x-client", c);
    }
    req.body(Bytes::new()).unwrap()
}

fn grpc_from(client: &str) -> Request<Bytes> {
    Request::post("/svc/Method")
        .header("x-client", client)
        .header("content-type", "application/grpc")
        .body(Bytes::new())
        .unwrap()
}

/// One response as `status retry-after ratelimit-policy | ratelimit | grpc-status`.
fn seen<B>(resp: &Response<B>) -> String {
    let h = |name: &str| {
        resp.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{} ra={} pol={} rl={} grpc={}",
        resp.status().as_u16(),
        h("retry-after"),
        h("ratelimit-policy"),
        h("ratelimit"),
        h("grpc-status"),
    )
}

async fn ok(_req: Request<Bytes>) -> Result<Response<Bytes>, Infallible> {
    Ok(Response::new(Bytes::new()))
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_counts_each_rejection_once_with_or_without_a_hook() {
    for with_hook in [false, true] {
        let (hook, log) = noting();
        let (clock, _time) = Clock::manual();
        let (layer, mut counts) = recorded(|| {
            let layer = RateLimitLayer::new(Policy::new("rl", Quota::per_second(1)))
                .key(Header::new("x-client"))
                .cost(|head| if head.uri.path() == "/big" { 5 } else { 1 })
                .on_missing_key(MissingKey::reject(401))
                .clock(clock);
            let layer = if with_hook {
                layer.on_reject(hook)
            } else {
                layer
            };
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let mut svc = layer.layer(tower::service_fn(ok));
        let mut got = Vec::new();
        for req in [from(Some("a")), from(Some("a")), from(None)] {
            got.push(seen(&svc.ready().await.unwrap().call(req).await.unwrap()));
        }
        let big = Request::get("/big")
            .header("x-client", "b")
            .body(Bytes::new())
            .unwrap();
        got.push(seen(&svc.ready().await.unwrap().call(big).await.unwrap()));
        got.push(seen(
            &svc.ready()
                .await
                .unwrap()
                .call(grpc_from("a"))
                .await
                .unwrap(),
        ));
        let expected = [
            r#"200 ra= pol="rl";q=1;w=1 rl="rl";r=0;t=1 grpc="#,
            r#"429 ra=1 pol="rl";q=1;w=1 rl="rl";r=0;t=1 grpc="#,
            "401 ra= pol= rl= grpc=",
            r#"429 ra= pol="rl";q=1;w=1 rl="rl";r=1;t=0 grpc="#,
            r#"200 ra=1 pol="rl";q=1;w=1 rl="rl";r=0;t=1 grpc=8"#,
        ];
        assert_eq!(got, expected, "hook: {with_hook}");
        let counts = counts.read();
        let expected: BTreeMap<String, u64> = [
            ("rl/allowed/false", 1),
            ("rl/limited/false", 2),
            ("rl/missing_key/false", 1),
            ("rl/never_fits/false", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counts, expected, "hook: {with_hook}");
        let hooked = log.lock().unwrap().len();
        assert_eq!(hooked, if with_hook { 4 } else { 0 });
    }
}

#[tokio::test(start_paused = true)]
async fn a_strike_that_bans_is_counted_once_as_the_ban_and_answered_with_the_box_status() {
    for (status, grpc) in [(429, "8"), (403, "7")] {
        let (hook, log) = noting();
        let (clock, time) = Clock::manual();
        let (layer, mut counts) = recorded(|| {
            let boxed = PenaltyBox::new(2, Duration::from_secs(60), Duration::from_secs(30))
                .status(StatusCode::from_u16(status).unwrap());
            let layer = RateLimitLayer::new(Policy::new("pb", Quota::per_second(1)))
                .key(Header::new("x-client"))
                .clock(clock)
                .penalty_box(boxed)
                .on_reject(hook);
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let mut svc = layer.layer(tower::service_fn(ok));
        let mut got = Vec::new();
        for _ in 0..4 {
            let resp = svc
                .ready()
                .await
                .unwrap()
                .call(from(Some("a")))
                .await
                .unwrap();
            got.push(seen(&resp));
        }
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(grpc_from("a"))
            .await
            .unwrap();
        got.push(seen(&resp));
        // Another key is not touched by the ban.
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some("b")))
            .await
            .unwrap();
        got.push(seen(&resp));
        time.advance(Duration::from_secs(31));
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some("a")))
            .await
            .unwrap();
        got.push(seen(&resp));
        let ban = format!("{status} ra=30 pol=\"pb\";q=1;w=1 rl=\"pb\";r=0;t=30 grpc=");
        let expected = [
            r#"200 ra= pol="pb";q=1;w=1 rl="pb";r=0;t=1 grpc="#.to_owned(),
            r#"429 ra=1 pol="pb";q=1;w=1 rl="pb";r=0;t=1 grpc="#.to_owned(),
            ban.clone(),
            ban.clone(),
            format!("200 ra=30 pol=\"pb\";q=1;w=1 rl=\"pb\";r=0;t=30 grpc={grpc}"),
            r#"200 ra= pol="pb";q=1;w=1 rl="pb";r=0;t=1 grpc="#.to_owned(),
            r#"200 ra= pol="pb";q=1;w=1 rl="pb";r=0;t=1 grpc="#.to_owned(),
        ];
        assert_eq!(got, expected, "status {status}");
        let counts = counts.read();
        let expected: BTreeMap<String, u64> = [
            ("pb/allowed/false", 3),
            ("pb/banned/false", 3),
            ("pb/limited/false", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counts, expected, "status {status}");
        use RejectionKind::*;
        assert_eq!(*log.lock().unwrap(), [RateLimited, Banned, Banned, Banned]);
    }
}

#[tokio::test(start_paused = true)]
async fn concurrency_and_shaping_count_each_rejection_once_with_or_without_a_hook() {
    for with_hook in [false, true] {
        let (hook, log) = noting();
        let (layer, mut counts) = recorded(|| {
            let layer = ConcurrencyLimitLayer::new(1)
                .key(Header::new("x-client"))
                .on_missing_key(MissingKey::reject(401))
                .name("cc");
            let layer = if with_hook {
                layer.on_reject(hook.clone())
            } else {
                layer
            };
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let gate = Arc::new(tokio::sync::Notify::new());
        let g = gate.clone();
        let svc = layer.layer(tower::service_fn(move |req: Request<Bytes>| {
            let g = g.clone();
            async move {
                g.notified().await;
                ok(req).await
            }
        }));
        let first = tokio::spawn(svc.clone().oneshot(from(Some("a"))));
        tokio::task::yield_now().await;
        let mut got = Vec::new();
        for req in [from(Some("a")), from(None), grpc_from("a")] {
            got.push(seen(&svc.clone().oneshot(req).await.unwrap()));
        }
        gate.notify_one();
        drop(first.await.unwrap().unwrap());
        let expected = [
            r#"429 ra=1 pol="cc";q=1;qu="concurrent-requests" rl= grpc="#,
            r#"401 ra= pol="cc";q=1;qu="concurrent-requests" rl= grpc="#,
            r#"200 ra=1 pol="cc";q=1;qu="concurrent-requests" rl= grpc=8"#,
        ];
        assert_eq!(got, expected, "hook: {with_hook}");
        let expected: BTreeMap<String, u64> = [
            ("cc/allowed/false", 1),
            ("cc/limited/false", 2),
            ("cc/missing_key/false", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counts.read(), expected, "hook: {with_hook}");

        let (layer, mut counts) = recorded(|| {
            let layer = ShapeLayer::new(Quota::per_second(1))
                .key(Header::new("x-client"))
                .on_missing_key(MissingKey::reject(401))
                .max_waiting(1)
                .name("sh");
            let layer = if with_hook {
                layer.on_reject(hook)
            } else {
                layer
            };
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let svc = layer.layer(tower::service_fn(ok));
        let mut waiting = Vec::new();
        for _ in 0..2 {
            waiting.push(tokio::spawn(svc.clone().oneshot(from(Some("a")))));
        }
        tokio::task::yield_now().await;
        let mut got = Vec::new();
        for req in [from(Some("a")), from(None), grpc_from("a")] {
            got.push(seen(&svc.clone().oneshot(req).await.unwrap()));
        }
        for w in waiting {
            assert_eq!(w.await.unwrap().unwrap().status(), StatusCode::OK);
        }
        let expected = [
            r#"429 ra=1 pol="sh";q=2;w=2 rl="sh";r=0;t=2 grpc="#,
            "401 ra= pol= rl= grpc=",
            r#"200 ra=1 pol="sh";q=2;w=2 rl="sh";r=0;t=2 grpc=8"#,
        ];
        assert_eq!(got, expected, "hook: {with_hook}");
        let expected: BTreeMap<String, u64> = [
            ("sh/allowed/false", 1),
            ("sh/delayed/false", 1),
            ("sh/missing_key/false", 1),
            ("sh/queue_full/false", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counts.read(), expected, "hook: {with_hook}");
        let hooked = log.lock().unwrap().len();
        assert_eq!(hooked, if with_hook { 6 } else { 0 });
    }
}

#[tokio::test(start_paused = true)]
async fn an_inner_rejection_carries_the_outer_fields_is_counted_once_and_gives_back_the_outer_take()
{
    let (clock, _time) = Clock::manual();
    let (outer, mut outer_counts) = recorded(|| {
        let l = RateLimitLayer::new(Policy::new("outer", Quota::per_second(10).burst(5)))
            .key(Header::new("x-client"))
            .clock(clock.clone());
        let _ = l.clone().validate().unwrap();
        l
    });
    let (inner, mut inner_counts) = recorded(|| {
        let l = RateLimitLayer::new(Policy::new("inner", Quota::per_second(1)))
            .key(Header::new("x-client"))
            .clock(clock.clone());
        let _ = l.clone().validate().unwrap();
        l
    });
    let mut svc = outer.layer(inner.layer(tower::service_fn(ok)));
    let mut got = Vec::new();
    for _ in 0..3 {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some("a")))
            .await
            .unwrap();
        got.push(seen(&resp));
    }
    let expected = [
        r#"200 ra= pol="inner";q=1;w=1, "outer";q=10;w=1 rl="inner";r=0;t=1, "outer";r=4;t=1 grpc="#,
        r#"429 ra=1 pol="inner";q=1;w=1, "outer";q=10;w=1 rl="inner";r=0;t=1, "outer";r=3;t=1 grpc="#,
        r#"429 ra=1 pol="inner";q=1;w=1, "outer";q=10;w=1 rl="inner";r=0;t=1, "outer";r=3;t=1 grpc="#,
    ];
    assert_eq!(got, expected);
    let expected: BTreeMap<String, u64> = [("outer/allowed/false", 3)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(outer_counts.read(), expected);
    let expected: BTreeMap<String, u64> = [("inner/allowed/false", 1), ("inner/limited/false", 2)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(inner_counts.read(), expected);
}

/// The same history on Redis, where the strikes and the ban live in the script: the same
/// answers, the same counts, the same hook calls as the memory store's.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_strike_that_bans_on_redis_is_counted_and_answered_as_on_memory() {
    use crate::common::redis_server::RedisServer;
    use tollgate::redis::RedisStore;
    let server = RedisServer::start();
    for (status, grpc) in [(429, "8"), (403, "7")] {
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let (hook, log) = noting();
        let (clock, time) = Clock::manual();
        let name = format!("pb{status}");
        let (layer, mut counts) = recorded(|| {
            let boxed = PenaltyBox::new(2, Duration::from_secs(60), Duration::from_secs(30))
                .status(StatusCode::from_u16(status).unwrap());
            let layer = RateLimitLayer::new(Policy::new(name.clone(), Quota::per_second(1)))
                .key(Header::new("x-client"))
                .clock(clock)
                .penalty_box(boxed)
                .on_reject(hook)
                .store(store);
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let mut svc = layer.layer(tower::service_fn(ok));
        let mut got = Vec::new();
        for _ in 0..4 {
            let resp = svc
                .ready()
                .await
                .unwrap()
                .call(from(Some("a")))
                .await
                .unwrap();
            got.push(seen(&resp));
        }
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(grpc_from("a"))
            .await
            .unwrap();
        got.push(seen(&resp));
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some("b")))
            .await
            .unwrap();
        got.push(seen(&resp));
        time.advance(Duration::from_secs(31));
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some("a")))
            .await
            .unwrap();
        got.push(seen(&resp));
        let pol = format!("\"{name}\";q=1;w=1");
        let ban = format!("{status} ra=30 pol={pol} rl=\"{name}\";r=0;t=30 grpc=");
        let expected = [
            format!("200 ra= pol={pol} rl=\"{name}\";r=0;t=1 grpc="),
            format!("429 ra=1 pol={pol} rl=\"{name}\";r=0;t=1 grpc="),
            ban.clone(),
            ban.clone(),
            format!("200 ra=30 pol={pol} rl=\"{name}\";r=0;t=30 grpc={grpc}"),
            format!("200 ra= pol={pol} rl=\"{name}\";r=0;t=1 grpc="),
            format!("200 ra= pol={pol} rl=\"{name}\";r=0;t=1 grpc="),
        ];
        assert_eq!(got, expected, "status {status}");
        let expected: BTreeMap<String, u64> = [
            (format!("{name}/allowed/false"), 3),
            (format!("{name}/banned/false"), 3),
            (format!("{name}/limited/false"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(counts.read(), expected, "status {status}");
        use RejectionKind::*;
        assert_eq!(*log.lock().unwrap(), [RateLimited, Banned, Banned, Banned]);
    }
}

/// A store that cannot be reached, failing closed: each request is refused once as the store
/// being unavailable (503; gRPC `UNAVAILABLE`), counted once as `fail_closed`, without rate
/// fields that would claim to know the key's state; in dry-run mode counted the same and let
/// through.
#[cfg(feature = "redis")]
#[tokio::test]
async fn an_unreachable_store_failing_closed_refuses_each_request_once_as_unavailable() {
    use tollgate::redis::{FailMode, RedisStore};
    let port = crate::common::redis_server::free_port();
    for dry_run in [false, true] {
        let store = RedisStore::open(&format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_millis(50))
            .on_failure(FailMode::Closed);
        let (hook, log) = noting();
        let (layer, mut counts) = recorded(|| {
            let layer = RateLimitLayer::new(Policy::new("down", Quota::per_second(1)))
                .key(Header::new("x-client"))
                .on_reject(hook)
                .dry_run(dry_run)
                .store(store);
            let _ = layer.clone().validate().unwrap();
            layer
        });
        let mut svc = layer.layer(tower::service_fn(ok));
        let mut got = Vec::new();
        for req in [from(Some("a")), from(Some("a")), grpc_from("a")] {
            got.push(seen(&svc.ready().await.unwrap().call(req).await.unwrap()));
        }
        let expected: Vec<String> = if dry_run {
            vec!["200 ra= pol= rl= grpc=".to_owned(); 3]
        } else {
            vec![
                "503 ra=1 pol= rl= grpc=".to_owned(),
                "503 ra=1 pol= rl= grpc=".to_owned(),
                "200 ra=1 pol= rl= grpc=14".to_owned(),
            ]
        };
        assert_eq!(got, expected, "dry run: {dry_run}");
        let expected: BTreeMap<String, u64> = [(format!("down/fail_closed/{dry_run}"), 3)]
            .into_iter()
            .collect();
        assert_eq!(counts.read(), expected, "dry run: {dry_run}");
        let hooked = log.lock().unwrap().clone();
        let expected = if dry_run {
            vec![]
        } else {
            vec![RejectionKind::StoreUnavailable; 3]
        };
        assert_eq!(hooked, expected, "dry run: {dry_run}");
    }
}

/// A new key turned away because the table is full of active keys: refused once, counted once
/// as limited, answered with the time until a place frees up, and no strike against it (the
/// server's state, not the key's traffic), however often it comes back.
#[tokio::test(start_paused = true)]
async fn a_full_table_refuses_a_new_key_once_per_request_without_a_strike() {
    use tollgate::store::OnFull;
    let (hook, log) = noting();
    let (clock, _time) = Clock::manual();
    let (layer, mut counts) = recorded(|| {
        let boxed = PenaltyBox::new(1, Duration::from_secs(60), Duration::from_secs(30));
        let layer = RateLimitLayer::new(Policy::new("full", Quota::per_minute(1)))
            .key(Header::new("x-client"))
            .clock(clock)
            .max_keys(1)
            .on_full(OnFull::RejectNewKeys)
            .penalty_box(boxed)
            .on_reject(hook);
        let _ = layer.clone().validate().unwrap();
        layer
    });
    let mut svc = layer.layer(tower::service_fn(ok));
    let mut got = Vec::new();
    for client in ["a", "b", "b", "b"] {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(from(Some(client)))
            .await
            .unwrap();
        got.push(seen(&resp));
    }
    let resp = svc
        .ready()
        .await
        .unwrap()
        .call(grpc_from("b"))
        .await
        .unwrap();
    got.push(seen(&resp));
    let full = r#"429 ra=60 pol="full";q=1;w=60 rl="full";r=0;t=60 grpc="#;
    let expected = [
        r#"200 ra= pol="full";q=1;w=60 rl="full";r=0;t=60 grpc="#,
        full,
        full,
        full,
        r#"200 ra=60 pol="full";q=1;w=60 rl="full";r=0;t=60 grpc=8"#,
    ];
    assert_eq!(got, expected);
    let expected: BTreeMap<String, u64> = [("full/allowed/false", 1), ("full/limited/false", 4)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(counts.read(), expected);
    assert_eq!(*log.lock().unwrap(), [RejectionKind::RateLimited; 4]);
}

/// A rate limit outside a concurrency limit and outside a shaping layer: the inner layer's
/// rejection (503, 429) carries the outer fields and gives back what the outer layer took, so
/// requests turned away inside cost the client nothing outside.
#[tokio::test(start_paused = true)]
async fn an_outer_rate_limit_gives_back_what_an_inner_concurrency_or_shaping_refusal_took() {
    let (clock, _time) = Clock::manual();
    let outer = || {
        RateLimitLayer::new(Policy::new("outer", Quota::per_minute(3)))
            .key(Header::new("x-client"))
            .clock(clock.clone())
    };
    // Concurrency 1 inside: the first request holds the permit.
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let inner =
        ConcurrencyLimitLayer::new(1).layer(tower::service_fn(move |req: Request<Bytes>| {
            let g = g.clone();
            async move {
                g.notified().await;
                ok(req).await
            }
        }));
    let svc = outer().layer(inner);
    let first = tokio::spawn(svc.clone().oneshot(from(Some("a"))));
    tokio::task::yield_now().await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(seen(&svc.clone().oneshot(from(Some("a"))).await.unwrap()));
    }
    gate.notify_one();
    drop(first.await.unwrap().unwrap());
    let refused = r#"503 ra=1 pol="outer";q=3;w=60 rl="outer";r=1;t=40 grpc="#;
    assert_eq!(got, [refused; 3]);

    // A shaping queue of one inside: the second waits, the third is refused.
    let inner = ShapeLayer::new(Quota::per_second(1))
        .max_waiting(1)
        .layer(tower::service_fn(ok));
    let svc = outer().layer(inner);
    // The outer fields of the two refused: what the admission left (0), given back after,
    // so the fourth request is admitted outside as the third was.
    let mut got = Vec::new();
    let first = svc.clone().oneshot(from(Some("c"))).await.unwrap();
    got.push(seen(&first));
    let second = tokio::spawn(svc.clone().oneshot(from(Some("c"))));
    tokio::task::yield_now().await;
    for _ in 0..2 {
        got.push(seen(&svc.clone().oneshot(from(Some("c"))).await.unwrap()));
    }
    got.push(seen(&second.await.unwrap().unwrap()));
    let expected = [
        r#"200 ra= pol="shape-1-per-1s";q=2;w=2, "outer";q=3;w=60 rl="shape-1-per-1s";r=1;t=1, "outer";r=2;t=20 grpc="#,
        r#"429 ra=1 pol="shape-1-per-1s";q=2;w=2, "outer";q=3;w=60 rl="shape-1-per-1s";r=0;t=2, "outer";r=0;t=60 grpc="#,
        r#"429 ra=1 pol="shape-1-per-1s";q=2;w=2, "outer";q=3;w=60 rl="shape-1-per-1s";r=0;t=2, "outer";r=0;t=60 grpc="#,
        r#"200 ra= pol="shape-1-per-1s";q=2;w=2, "outer";q=3;w=60 rl="shape-1-per-1s";r=0;t=2, "outer";r=1;t=40 grpc="#,
    ];
    assert_eq!(got, expected);
}

/// The store unreachable, its local fallback deciding on half of each quota: a rejection of
/// the fallback is one `local_limited` count and one hook call, answered with the fields of
/// the scaled quota it decided on.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_local_fallback_rejection_is_counted_once_and_answered_with_the_scaled_fields() {
    use tollgate::redis::{FailMode, RedisStore};
    let port = crate::common::redis_server::free_port();
    let store = RedisStore::open(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(50))
        .on_failure(FailMode::local(0.5));
    let (hook, log) = noting();
    let (clock, _time) = Clock::manual();
    let (layer, mut counts) = recorded(|| {
        let layer = RateLimitLayer::new(Policy::new("local", Quota::per_minute(4)))
            .key(Header::new("x-client"))
            .clock(clock)
            .on_reject(hook)
            .store(store);
        let _ = layer.clone().validate().unwrap();
        layer
    });
    let mut svc = layer.layer(tower::service_fn(ok));
    let mut got = Vec::new();
    for req in [
        from(Some("a")),
        from(Some("a")),
        from(Some("a")),
        grpc_from("a"),
    ] {
        got.push(seen(&svc.ready().await.unwrap().call(req).await.unwrap()));
    }
    let expected = [
        r#"200 ra= pol="local";q=2;w=60 rl="local";r=1;t=30 grpc="#,
        r#"200 ra= pol="local";q=2;w=60 rl="local";r=0;t=60 grpc="#,
        r#"429 ra=30 pol="local";q=2;w=60 rl="local";r=0;t=60 grpc="#,
        r#"200 ra=30 pol="local";q=2;w=60 rl="local";r=0;t=60 grpc=8"#,
    ];
    assert_eq!(got, expected);
    let expected: BTreeMap<String, u64> = [
        ("local/local_allowed/false", 2),
        ("local/local_limited/false", 2),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(counts.read(), expected);
    assert_eq!(*log.lock().unwrap(), [RejectionKind::RateLimited; 2]);
}
