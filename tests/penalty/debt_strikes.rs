//! The penalty box beside a layer that settles: a request charged past its limit when it
//! settles was admitted, so it is no strike; each request the debt then refuses is one strike,
//! counted once; and the ban's `Retry-After` is the later of its end and the time the debt
//! lets a retry pass. Over both stores (`tests/common/stores.rs`), on the manual clock.
//!
//! Pins docs/design.md section 3 ("The penalty box punishes the client's own traffic", "An
//! account per key": a larger settled cost is a debt that stands).

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use tollgate::penalty::PenaltyBox;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

use crate::common::account::rig::Handler;
use crate::common::stores::Store;

const SEC: Duration = Duration::from_secs(1);

crate::over_both_stores!(
    a_debt_settled_past_the_limit_is_no_strike_and_each_refusal_it_causes_is_one,
    a_debt_that_outlasts_the_ban_is_the_retry_time_of_the_banned_answer,
);

/// 2 a minute per `x-key` (burst 2, one per 30 s), settled at the `x-actual` the response
/// reports; two strikes within a minute ban for `ban`.
fn layer(clock: &Clock, ban: Duration) -> RateLimitLayer<tollgate::key::Header> {
    RateLimitLayer::new(Policy::new("debt", Quota::per_minute(2)))
        .key(tollgate::key::Header::new("x-key"))
        .clock(clock.clone())
        .settle(ActualCost::header("x-actual"))
        .penalty_box(PenaltyBox::new(2, 60 * SEC, ban))
}

/// The status and `Retry-After` of a request for `key` whose response reports `actual`.
async fn send<S, B>(svc: &S, key: &str, actual: Option<u32>) -> (u16, Option<String>)
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    let mut req = Request::post("/").header("x-key", key);
    if let Some(n) = actual {
        req = req.header("x-actual", n.to_string());
    }
    let resp = svc.clone().oneshot(req.body(()).unwrap()).await.unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), retry)
}

async fn a_debt_settled_past_the_limit_is_no_strike_and_each_refusal_it_causes_is_one(
    s: &impl Store,
) {
    let (clock, _time) = Clock::manual();
    let l = s.on(layer(&clock, 600 * SEC));
    let svc = l.clone().layer(Handler::default());
    // Reserved 1, settled at 10: the key's time is 300 s ahead, 240 s past its burst.
    assert_eq!(send(&svc, "k", Some(10)).await, (200, None));
    // Refused by the debt: one strike, not two.
    assert_eq!(send(&svc, "k", None).await, (429, Some("270".into())));
    assert_eq!(s.ban_left(&l, "debt", "k").await, None);
    // The second refusal is the second strike: banned for 600 s, the later of the two.
    assert_eq!(send(&svc, "k", None).await, (429, Some("600".into())));
    assert_eq!(s.ban_left(&l, "debt", "k").await, Some(600 * SEC));
}

async fn a_debt_that_outlasts_the_ban_is_the_retry_time_of_the_banned_answer(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let l = s.on(layer(&clock, 10 * SEC));
    let svc = l.clone().layer(Handler::default());
    assert_eq!(send(&svc, "k", Some(10)).await, (200, None));
    assert_eq!(send(&svc, "k", None).await, (429, Some("270".into())));
    assert_eq!(send(&svc, "k", None).await, (429, Some("270".into())));
    assert_eq!(s.ban_left(&l, "debt", "k").await, Some(10 * SEC));
    // Banned 10 s, in debt 270 s: told the debt's time, then judged by the debt alone.
    time.advance(20 * SEC);
    assert_eq!(send(&svc, "k", None).await, (429, Some("250".into())));
    time.advance(250 * SEC);
    assert_eq!(send(&svc, "k", None).await, (200, None));
}
