//! Where the account of a key, the bound on tracked keys and the penalty box meet, in memory:
//! refunds and settlements after live quota changes, on a full table and under a ban. Each
//! case on the manual clock, with exact numbers.

mod common;

use std::time::Duration;

use common::account::rig::{Reply, Rig};
use http::StatusCode;
use tollgate::key::Header;
use tollgate::rate_limit::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, ManualClock, PenaltyBox, Policy, Quota, RateLimitLayer};
use tower::Layer;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

const OK: Reply = Reply {
    status: 200,
    actual: None,
};
const FAILED: Reply = Reply {
    status: 401,
    actual: None,
};

fn manual() -> (Clock, ManualClock) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    (clock, time)
}

/// One policy `p` of `quota`, keyed by `x-key`, costing `x-cost`; a `200` does not count, and
/// a response that counts settles the cost it reports.
fn layer(quota: Quota, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(Policy::new("p", quota))
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .cost(|h| {
            h.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .count_if(|res| res.status != StatusCode::OK)
        .settle(ActualCost::of)
}

macro_rules! rig {
    ($l:expr) => {{
        let l = $l.clone();
        Rig::new(move |h| l.layer(h))
    }};
}

/// Admits and answers one request of `cost` for `key` with `reply`; whether it was admitted.
async fn one<S>(rig: &mut Rig<S>, key: &str, cost: u32, reply: Reply) -> bool
where
    S: tower::Service<
        http::Request<()>,
        Response = http::Response<http_body_util::Full<bytes::Bytes>>,
        Error = std::convert::Infallible,
    >,
{
    match rig.send(key, cost).await {
        Some(id) => {
            rig.answer(id, reply).await;
            true
        }
        None => false,
    }
}

// ---- a widened window meets the bounded table ----

/// A sliding log widened from 1 s to 10 s: the entries of 0 s count until 10 s. A zero
/// reservation of a new key on the full table at 2 s makes room, and must not drop a key
/// whose entries still count (its stored idle time, 1 s, was measured under the old width).
#[tokio::test]
async fn a_zero_reservation_on_a_full_table_after_a_widened_log_drops_no_key_that_counts() {
    for on_full in [OnFull::EvictNearestIdle, OnFull::RejectNewKeys] {
        let (clock, time) = manual();
        let l = layer(Quota::sliding_log(2, S), &clock)
            .max_keys(2)
            .on_full(on_full);
        let mut rig = rig!(l);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "b", 1, FAILED).await);
        time.advance(500 * MS);
        l.handle()
            .unwrap()
            .set_policy(Policy::new("p", Quota::sliding_log(2, 10 * S)))
            .unwrap();
        time.advance(1_500 * MS);
        // A cost-0 request of a new key: it needs a place (a settlement may charge it).
        one(&mut rig, "c", 0, OK).await;
        // "a" holds 2 entries of 0 s inside the 10 s window.
        assert!(!one(&mut rig, "a", 1, FAILED).await, "{on_full:?}");
    }
}

/// The same widened log, met by a settlement of a new key on the full table.
#[tokio::test]
async fn a_settled_charge_on_a_full_table_after_a_widened_log_drops_no_key_that_counts() {
    for on_full in [OnFull::EvictNearestIdle, OnFull::RejectNewKeys] {
        let (clock, time) = manual();
        let l = layer(Quota::sliding_log(2, S), &clock)
            .max_keys(2)
            .on_full(on_full);
        let mut rig = rig!(l);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "a", 1, FAILED).await);
        assert!(one(&mut rig, "b", 1, OK).await);
        time.advance(500 * MS);
        l.handle()
            .unwrap()
            .set_policy(Policy::new("p", Quota::sliding_log(2, 10 * S)))
            .unwrap();
        time.advance(1_500 * MS);
        one(
            &mut rig,
            "c",
            0,
            Reply {
                status: 401,
                actual: Some(1),
            },
        )
        .await;
        assert!(!one(&mut rig, "a", 1, FAILED).await, "{on_full:?}");
    }
}

/// The same widened log, met by the penalty box: a strike needs a place in the bound the
/// box shares with the quota state, and the quota table, asked for idle entries, must judge
/// them by the widened window too.
#[tokio::test]
async fn a_strike_on_a_full_shared_bound_after_a_widened_log_drops_no_key_that_counts() {
    let (clock, time) = manual();
    let l = layer(Quota::sliding_log(2, S), &clock)
        .max_keys(4)
        .on_full(OnFull::RejectNewKeys)
        .penalty_box(PenaltyBox::new(3, 60 * S, 10 * S));
    let mut rig = rig!(l);
    assert!(one(&mut rig, "a", 1, FAILED).await);
    assert!(one(&mut rig, "a", 1, FAILED).await);
    assert!(one(&mut rig, "b", 1, FAILED).await);
    assert!(one(&mut rig, "c", 1, FAILED).await);
    time.advance(500 * MS);
    l.handle()
        .unwrap()
        .set_policy(Policy::new("p", Quota::sliding_log(2, 10 * S)))
        .unwrap();
    time.advance(1_500 * MS);
    assert!(one(&mut rig, "d", 1, FAILED).await);
    // The bound is full; "a" is refused (2 entries of 0 s in 10 s), a strike that needs room.
    assert!(!one(&mut rig, "a", 1, FAILED).await);
    assert!(!one(&mut rig, "a", 1, FAILED).await);
    assert!(!one(&mut rig, "b", 2, FAILED).await);
}
