//! A live change through the layer's handle while requests are served on other threads. Each
//! request comes from a key never seen, so it is admitted with the whole limit but one left;
//! the handler reports the decision it reads (`Decision`, `Decisions`). The quota that decides
//! a request (read from atomics for a fixed window or a sliding counter, from the whole set
//! for GCRA) is whole, one of the two policies, and is the one the handler reads and the
//! `RateLimit` field reports; `RateLimit-Policy` is the policy of that same quota, even for a
//! request decided while a change is being made (`q` is always `r + 1`); once the changes
//! stop, both fields are the last policy's.
//!
//! Pins docs/design.md section 2 (`RateLimit-Policy` and `RateLimit`, one list item per
//! quota) and section 3 ("A live quota change": from the next decision on).
#![cfg(feature = "axum")]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate::key::Header;
use tollgate::{Clock, Decision, Decisions, Policy, Quota, RateLimitHandle, RateLimitLayer};
use tower::ServiceExt;

/// The limit the handler read, and how many decisions the request carries.
async fn handler(d: Decision, all: Decisions) -> String {
    format!("{} {}", d.limit(), all.len())
}

fn field<'a>(resp: &'a http::Response<axum::body::Body>, name: &str) -> &'a str {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The number after `k=` in a field's value.
fn number(value: &str, k: &str) -> u64 {
    let at = value.find(k).unwrap_or_else(|| panic!("{k} in {value}")) + k.len();
    let digits: String = value[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// The changes made, and of each of two servers the changes made before the last request it
/// finished had started: the next change waits until both finished a request started after
/// the last, so that each policy serves each server and no request is answered after two
/// changes or more (its fields are then the policy's in force, see `RateLimitHandle`).
#[derive(Clone)]
struct Turns(Arc<[AtomicU64; 3]>);

impl Turns {
    fn new() -> Self {
        Turns(Arc::new(Default::default()))
    }

    /// Before a request: the changes made so far.
    fn start(&self) -> u64 {
        self.0[2].load(Ordering::SeqCst)
    }

    /// After `server`'s request that started after `change` changes.
    fn done(&self, server: usize, change: u64) {
        self.0[server].store(change, Ordering::SeqCst);
    }

    /// After a change: waits for both servers' turns (or for a server that stopped).
    async fn changed<T>(&self, servers: &[tokio::task::JoinHandle<T>]) {
        let made = self.0[2].fetch_add(1, Ordering::SeqCst) + 1;
        while self.0[..2].iter().any(|s| s.load(Ordering::SeqCst) < made)
            && !servers.iter().any(|s| s.is_finished())
        {
            tokio::task::yield_now().await;
        }
    }
}

/// Two threads serve new keys while the test flips the policy between `a` and `b` (the same
/// kind, limits 4 and 8): every response's `r` is one less than the limit of a whole quota,
/// the one whose decision the handler read, and its `q` is one of the two limits; after the
/// last change, `q` and `r` are the last policy's. Returns how many responses carried a `q`
/// of the other policy than their decision (none may).
async fn flips_agree(a: Quota, b: Quota) -> u32 {
    flips_agree_on(a, b, |layer| {
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    })
    .await
}

/// [`flips_agree`] on the store `on` puts the layer on, with the layer's handle.
async fn flips_agree_on(
    a: Quota,
    b: Quota,
    on: impl FnOnce(RateLimitLayer<Header>) -> (Router, RateLimitHandle),
) -> u32 {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new("api", a.clone()))
        .key(Header::new("x-key"))
        .clock(clock);
    let (app, handle) = on(layer);
    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let turns = Turns::new();
    let mut servers = Vec::new();
    for server in 0..2 {
        let (app, done, next, turns) = (app.clone(), done.clone(), next.clone(), turns.clone());
        servers.push(tokio::spawn(async move {
            let mut seen = [0u32; 3];
            while !done.load(Ordering::Relaxed) {
                let change = turns.start();
                let key = next.fetch_add(1, Ordering::Relaxed).to_string();
                let req = Request::builder()
                    .uri("/")
                    .header("x-key", key)
                    .body(axum::body::Body::empty())
                    .unwrap();
                let resp = app.clone().oneshot(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let q = number(field(&resp, "ratelimit-policy"), "q=");
                let r = number(field(&resp, "ratelimit"), "r=");
                assert!(q == 4 || q == 8, "{q}");
                assert!(r + 1 == 4 || r + 1 == 8, "{r}");
                let body = axum::body::to_bytes(resp.into_body(), 1 << 10)
                    .await
                    .unwrap();
                assert_eq!(
                    std::str::from_utf8(&body).unwrap(),
                    format!("{} 1", r + 1),
                    "the handler's decision"
                );
                seen[usize::from(r + 1 == 8)] += 1;
                seen[2] += u32::from(r + 1 != q);
                turns.done(server, change);
                tokio::task::yield_now().await;
            }
            seen
        }));
    }
    for i in 0..300 {
        let q = if i % 2 == 0 { b.clone() } else { a.clone() };
        handle.set_default_quotas([q]).unwrap();
        turns.changed(&servers).await;
    }
    done.store(true, Ordering::Relaxed);
    let mut seen = [0u32; 3];
    for s in servers {
        for (all, got) in seen.iter_mut().zip(s.await.unwrap()) {
            *all += got;
        }
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    // The last change put `a` (limit 4) in force.
    let req = Request::builder()
        .uri("/")
        .header("x-key", "after")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(number(field(&resp, "ratelimit-policy"), "q="), 4);
    assert_eq!(number(field(&resp, "ratelimit"), "r="), 3);
    seen[2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_fixed_window_changed_while_serving_reports_the_quota_that_decided_to_the_handler_and_in_both_fields(
) {
    let s = Duration::from_secs(1);
    let mismatched = flips_agree(Quota::fixed_window(4, s), Quota::fixed_window(8, s)).await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy is not their decision's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_sliding_counter_changed_while_serving_reports_the_quota_that_decided_to_the_handler_and_in_both_fields(
) {
    let s = Duration::from_secs(1);
    let mismatched = flips_agree(Quota::sliding_window(4, s), Quota::sliding_window(8, s)).await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy is not their decision's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_gcra_quota_changed_while_serving_reports_the_quota_that_decided_to_the_handler_and_in_both_fields(
) {
    let mismatched = flips_agree(Quota::per_second(4), Quota::per_second(8)).await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy is not their decision's"
    );
}

/// On Redis the decision comes in the response future, after a round trip: its fields are
/// still those of the quotas that decided it.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_gcra_quota_changed_while_serving_on_redis_reports_the_quota_that_decided_in_both_fields()
{
    let server = crate::common::redis_server::RedisServer::start();
    let store = tollgate::redis::RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let on_redis = |layer: RateLimitLayer<Header>| {
        let layer = layer.store(store).name("live-fields");
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    };
    let mismatched = flips_agree_on(Quota::per_second(4), Quota::per_second(8), on_redis).await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy is not their decision's"
    );
}

/// Two threads serve new keys on a still clock while the test cycles the policy through
/// `quotas` (of one kind, each change of the limit or of the window's width alone). A new
/// key's first request is admitted with its quota's whole limit but one left and its whole
/// width to reset, so the `RateLimit` field (`r`, `t`) names the quota that judged it: its
/// `RateLimit-Policy` (`q`, `w`) must be that quota's. Returns how many responses carried
/// another's (none may), after checking that every quota judged some.
async fn cycles_judged_by(
    quotas: &[Quota],
    on: impl FnOnce(RateLimitLayer<Header>) -> (Router, RateLimitHandle),
) -> u32 {
    let (clock, _time) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new("api", quotas[0].clone()))
        .key(Header::new("x-key"))
        .clock(clock);
    let (app, handle) = on(layer);
    let done = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let turns = Turns::new();
    let mut servers = Vec::new();
    for server in 0..2 {
        let (app, done, next, turns) = (app.clone(), done.clone(), next.clone(), turns.clone());
        servers.push(tokio::spawn(async move {
            // (limit, width) of the quota that judged, and whether the policy sent agreed.
            let mut judged = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let change = turns.start();
                let key = next.fetch_add(1, Ordering::Relaxed).to_string();
                let req = Request::builder()
                    .uri("/")
                    .header("x-key", key)
                    .body(axum::body::Body::empty())
                    .unwrap();
                let resp = app.clone().oneshot(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                let policy = field(&resp, "ratelimit-policy");
                let (q, w) = (number(policy, "q="), number(policy, "w="));
                let ratelimit = field(&resp, "ratelimit");
                let (r, t) = (number(ratelimit, "r="), number(ratelimit, "t="));
                judged.push(((r + 1, t), (q, w) == (r + 1, t)));
                turns.done(server, change);
                tokio::task::yield_now().await;
            }
            judged
        }));
    }
    // Each change of a window's width visits every key tracked (one per request): more
    // changes make the test quadratic, and 200 find every kind of mismatch the figures made.
    for i in 1..=200 {
        let q = quotas[i % quotas.len()].clone();
        handle.set_default_quotas([q]).unwrap();
        turns.changed(&servers).await;
    }
    done.store(true, Ordering::Relaxed);
    let mut judged = Vec::new();
    for s in servers {
        judged.extend(s.await.unwrap());
    }
    let figures: Vec<(u64, u64)> = quotas
        .iter()
        .map(|q| (u64::from(q.burst_size()), q.period().as_secs()))
        .collect();
    for (by, _) in &judged {
        assert!(
            figures.contains(by),
            "judged by {by:?}, not one of {figures:?}"
        );
    }
    for f in &figures {
        assert!(judged.iter().any(|(by, _)| by == f), "{f:?} judged none");
    }
    judged.iter().filter(|(_, agreed)| !agreed).count() as u32
}

/// The limit, then the width alone, then the limit, then the width alone: two of each four
/// changes leave every figure a new key's state shows but the reset.
fn cycle(kind: fn(u32, Duration) -> Quota) -> Vec<Quota> {
    let (one, two) = (Duration::from_secs(1), Duration::from_secs(2));
    vec![kind(4, one), kind(4, two), kind(8, two), kind(8, one)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_fixed_window_whose_width_alone_changes_while_serving_sends_the_policy_that_judged_each_request(
) {
    let mismatched = cycles_judged_by(&cycle(Quota::fixed_window), |layer| {
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    })
    .await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy did not judge them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_sliding_log_whose_width_alone_changes_while_serving_sends_the_policy_that_judged_each_request(
) {
    let mismatched = cycles_judged_by(&cycle(Quota::sliding_log), |layer| {
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    })
    .await;
    assert_eq!(
        mismatched, 0,
        "responses whose RateLimit-Policy did not judge them"
    );
}

/// On Redis, whose decision comes after a round trip, for a fixed window and a sliding log.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn windows_whose_width_alone_changes_while_serving_on_redis_send_the_policy_that_judged_each_request(
) {
    let server = crate::common::redis_server::RedisServer::start();
    for (name, kind) in [
        (
            "width-fixed",
            Quota::fixed_window as fn(u32, Duration) -> Quota,
        ),
        ("width-log", Quota::sliding_log),
    ] {
        let store = tollgate::redis::RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let on_redis = |layer: RateLimitLayer<Header>| {
            let layer = layer.store(store).name(name);
            let handle = layer.handle().unwrap();
            (Router::new().route("/", get(handler)).layer(layer), handle)
        };
        let mismatched = cycles_judged_by(&cycle(kind), on_redis).await;
        assert_eq!(
            mismatched, 0,
            "{name}: responses whose RateLimit-Policy did not judge them"
        );
    }
}
