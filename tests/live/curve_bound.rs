//! A change of warm-up curve sweeps the layer's table while its penalty box holds a ban in
//! the same bound: the keys idle at the change are dropped and their places in the bound
//! freed, the ban keeps its own, and new keys come in exactly as they do when the idle keys
//! are dropped to make room without any change.
//!
//! Pins docs/design.md section 3 ("One bound per layer": `max_keys` counts the entries of
//! every tier and of the penalty box together, a ban is never evicted; "A live quota change":
//! a key idle at a change is new, and forgetting it changes nothing).
#![cfg(feature = "axum")]

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::store::OnFull;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

fn curve(period: u64) -> Quota {
    Quota::per_second(1)
        .burst(1)
        .warm_up(Duration::from_secs(period), 3)
}

/// The statuses of the requests, in order, of a layer of three keys at most that turns new
/// keys away and bans at the first refusal: key `a` is admitted then refused (banned for a
/// minute), `b` admitted, `c` turned away (full); at 14 s, when `a` and `b` are idle (at
/// 13.5 s), the curve changes (or not), then `c`, `d` and `e` come.
async fn statuses(change: bool) -> Vec<StatusCode> {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let layer = RateLimitLayer::new(Policy::new("api", curve(4)))
        .key(Header::new("x-key"))
        .clock(clock)
        .max_keys(3)
        .on_full(OnFull::RejectNewKeys)
        .penalty_box(PenaltyBox::new(
            1,
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
    let handle = layer.handle().unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let send = |key: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .uri("/")
                .header("x-key", key)
                .body(axum::body::Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    let mut out = Vec::new();
    for key in ["a", "a", "b", "c"] {
        out.push(send(key).await);
    }
    time.advance(Duration::from_secs(4));
    if change {
        handle.set_default_quotas([curve(40)]).unwrap();
    }
    for key in ["c", "d", "e", "a"] {
        out.push(send(key).await);
    }
    out
}

#[tokio::test]
async fn a_change_of_curve_frees_the_places_of_idle_keys_and_keeps_the_ban_in_the_bound() {
    let ok = StatusCode::OK;
    let no = StatusCode::TOO_MANY_REQUESTS;
    let without = statuses(false).await;
    // `a` banned at its second request; `c` turned away while `a` (its state and its ban)
    // and `b` fill the three places; at 14 s `c` and `d` take the places of the idle states,
    // `e` finds the ban and both new keys there, and `a` is still banned.
    assert_eq!(without, [ok, no, ok, no, ok, ok, no, no]);
    assert_eq!(statuses(true).await, without);
}
