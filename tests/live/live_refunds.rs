//! Requests that `count_if` gives back, on several threads, while the quota of their one key
//! changes between 4 and 6 per window: a fixed window and a sliding counter (read from
//! atomics under a sequence number), on the single key of `Global` and on a table's key. The clock stands still, so every request lands in one window: what the
//! counted requests took stays taken and each uncounted one gives back exactly what it took,
//! so the counted ones never pass the larger count, and once the changes stop at 6 the key
//! admits exactly what the counted ones left.
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
