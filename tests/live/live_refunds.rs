//! Requests that `count_if` gives back, on several threads, while the quota of their one key
//! changes between 4 and 6 per window: a fixed window and a sliding counter (read from
//! atomics under a sequence number), on the single key of `Global` and on a table's key. The
//! clock stands still, so every request lands in one window: what the counted requests took
//! stays taken and each uncounted one gives back exactly what it took, so the counted ones
//! never pass the larger count, and once the changes stop at 6 the key admits exactly what
//! the counted ones left. The same with requests that settle a cost of their own after their
//! response, more or less than they reserved.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change").
#![cfg(feature = "axum")]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate::key::{Global, Header};
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

/// 200 for a request that counts, 500 for one that `count_if` gives back.
async fn handler(h: http::HeaderMap) -> StatusCode {
    if h.contains_key("x-fail") {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

fn req(fail: bool) -> Request<axum::body::Body> {
    let mut b = Request::builder().uri("/").header("x-key", "k");
    if fail {
        b = b.header("x-fail", "1");
    }
    b.body(axum::body::Body::empty()).unwrap()
}

/// Runs the race on a layer of `quota(4)` changed to `quota(6)` and back; `global`: the key
/// of `Global`, else a header's.
async fn race(quota: fn(u32) -> Quota, global: bool) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let layer = RateLimitLayer::new(Policy::new("api", quota(4)))
        .clock(clock)
        .count_if(|r| r.status.is_success());
    let (app, handle) = if global {
        let layer = layer.key(Global);
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    } else {
        let layer = layer.key(Header::new("x-key"));
        let handle = layer.handle().unwrap();
        (Router::new().route("/", get(handler)).layer(layer), handle)
    };
    let done = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU32::new(0));
    let sent = Arc::new(AtomicU32::new(0));
    let mut servers = Vec::new();
    for t in 0..2u32 {
        let (app, done, counted, sent) = (app.clone(), done.clone(), counted.clone(), sent.clone());
        servers.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !done.load(Ordering::Relaxed) {
                // Mostly requests given back, a counted one now and then.
                let fail = (i + t) % 5 != 0;
                i += 1;
                let resp = app.clone().oneshot(req(fail)).await.unwrap();
                sent.fetch_add(1, Ordering::Relaxed);
                if resp.status() == StatusCode::OK {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for i in 0..300 {
        let at = sent.load(Ordering::Relaxed);
        let q = if i % 2 == 0 { quota(6) } else { quota(4) };
        handle.set_default_quotas([q]).unwrap();
        while sent.load(Ordering::Relaxed) < at + 2 && !servers.iter().any(|s| s.is_finished()) {
            tokio::task::yield_now().await;
        }
    }
    done.store(true, Ordering::Relaxed);
    for s in servers {
        s.await.unwrap();
    }
    // The last change put 6 in force.
    let counted = counted.load(Ordering::Relaxed);
    assert!((1..=6).contains(&counted), "{counted} counted");
    let mut more = 0;
    while app.clone().oneshot(req(false)).await.unwrap().status() == StatusCode::OK {
        more += 1;
        assert!(more <= 6);
    }
    assert_eq!(counted + more, 6, "{counted} counted, then {more}");
}

fn fixed(n: u32) -> Quota {
    Quota::fixed_window(n, Duration::from_secs(60))
}

fn counter(n: u32) -> Quota {
    Quota::sliding_window(n, Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_fixed_window_changed_while_requests_are_given_back_keeps_an_exact_account() {
    race(fixed, true).await;
    race(fixed, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_sliding_counter_changed_while_requests_are_given_back_keeps_an_exact_account() {
    race(counter, true).await;
    race(counter, false).await;
}

/// The actual cost the request asks for, settled from its response.
async fn settled(h: http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let actual: u32 = h
        .get("x-actual")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut resp = "ok".into_response();
    resp.extensions_mut()
        .insert(tollgate::rate_limit::settle::ActualCost(actual));
    resp
}

/// Requests that reserve 2 and settle 0, 1 or 3 (a debt over the limit), on two threads,
/// while a fixed window on the key of `Global` changes between 4 and 6: once the changes stop
/// at 6, the key holds exactly what the admitted requests settled, so requests reserving 2
/// and settling 1 are admitted while that and 2 fit in 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_fixed_window_changed_while_requests_settle_keeps_an_exact_account() {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let layer = RateLimitLayer::new(Policy::new("api", fixed(4)))
        .clock(clock)
        .cost(|_| 2)
        .settle(tollgate::rate_limit::settle::ActualCost::of)
        .key(Global);
    let handle = layer.handle().unwrap();
    let app = Router::new().route("/", get(settled)).layer(layer);
    let send = move |actual: u32| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .uri("/")
                .header("x-actual", actual.to_string())
                .body(axum::body::Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    let done = Arc::new(AtomicBool::new(false));
    let used = Arc::new(AtomicU32::new(0));
    let sent = Arc::new(AtomicU32::new(0));
    let mut servers = Vec::new();
    for t in 0..2u32 {
        let (send, done, used, sent) = (send.clone(), done.clone(), used.clone(), sent.clone());
        servers.push(tokio::spawn(async move {
            let mut i = t;
            while !done.load(Ordering::Relaxed) {
                // Mostly nothing, now and then 1, rarely a debt of 3.
                let actual = [0, 0, 0, 1, 0, 0, 0, 0, 0, 3][(i % 10) as usize];
                i += 1;
                if send(actual).await == StatusCode::OK {
                    used.fetch_add(actual, Ordering::Relaxed);
                }
                sent.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }));
    }
    for i in 0..300 {
        let at = sent.load(Ordering::Relaxed);
        let q = if i % 2 == 0 { fixed(6) } else { fixed(4) };
        handle.set_default_quotas([q]).unwrap();
        while sent.load(Ordering::Relaxed) < at + 2 && !servers.iter().any(|s| s.is_finished()) {
            tokio::task::yield_now().await;
        }
    }
    done.store(true, Ordering::Relaxed);
    for s in servers {
        s.await.unwrap();
    }
    let used = used.load(Ordering::Relaxed);
    // Admitted only while what it reserves fits in 6, each request in flight settling 3 goes
    // one over: the two threads' requests, admitted together at 2 settled, leave at most 8.
    assert!(used <= 8, "{used}");
    let mut more = 0;
    while send(1).await == StatusCode::OK {
        more += 1;
        assert!(more <= 6);
    }
    assert_eq!(
        more,
        5u32.saturating_sub(used),
        "{used} settled, then {more}"
    );
}
