//! A live change of a banned key's quotas (docs/design.md section 3, "The penalty box punishes
//! the client's own traffic", and "A live quota change judges what a key stored; it never
//! rewrites it"): the ban's `Retry-After` is the time a retry is admitted as measured at the
//! ban, with the quotas then in force, and a change during the ban does not rewrite it. Once
//! the ban is over, the quotas in force decide: a raise may admit a retry sooner than it was
//! told, and after a lowering a retry at the time told is judged by the new quotas, a refusal
//! being a strike told the new time. In memory and on a real redis-server.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::{Clock, ManualClock, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

use crate::common::account::rig::Handler;
use crate::common::stores::Store;

const SEC: Duration = Duration::from_secs(1);

crate::over_both_stores!(
    a_raise_during_a_ban_keeps_its_retry_after_and_decides_once_the_ban_is_over,
    a_lowering_during_a_ban_keeps_its_retry_after_and_judges_the_retry_by_the_new_quotas,
);

/// The status and `Retry-After` of a request for `mallory`.
async fn send<S>(svc: &S) -> (StatusCode, Option<String>)
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    let req = Request::post("/login")
        .header("x-key", "mallory")
        .body(())
        .unwrap();
    let resp = svc.clone().oneshot(req).await.unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status(), retry)
}

/// `login`, 2 a minute (burst 2); 3 refusals within 60 s ban for 10 s. Two admitted and two
/// refused at the start, the third refusal 1 s later bans `mallory`: the ban is 10 s, the quota
/// admits a retry 29 s later (one request per 30 s), and that is the `Retry-After`.
async fn banned<S: Store>(s: &S) -> (S::Layer, ManualClock, S::Service) {
    let (clock, time): (Clock, ManualClock) = Clock::manual();
    let l = s.on(
        RateLimitLayer::new(Policy::new("login", Quota::per_minute(2)))
            .key(Header::new("x-key"))
            .clock(clock)
            .penalty_box(PenaltyBox::new(3, 60 * SEC, 10 * SEC)),
    );
    let svc = l.clone().layer(Handler::default());
    for want in [200, 200, 429, 429] {
        assert_eq!(send(&svc).await.0, want);
    }
    time.advance(SEC);
    assert_eq!(
        send(&svc).await,
        (StatusCode::TOO_MANY_REQUESTS, Some("29".to_owned()))
    );
    assert_eq!(s.ban_left(&l, "login", "mallory").await, Some(10 * SEC));
    (l, time, svc)
}

async fn a_raise_during_a_ban_keeps_its_retry_after_and_decides_once_the_ban_is_over(
    s: &impl Store,
) {
    let (l, time, svc) = banned(s).await;
    // One a second, burst 60: the key's stored time (60 s ahead of the start) is judged by it.
    s.apply(&l, Policy::new("login", Quota::per_minute(60)));
    time.advance(4 * SEC);
    // Still banned: told what the ban measured, not rewritten by the change.
    assert_eq!(
        send(&svc).await,
        (StatusCode::TOO_MANY_REQUESTS, Some("25".to_owned()))
    );
    // The ban over (11 s after the start), the raised quota admits: 49 s ahead plus 1 s is
    // within its 60 s.
    time.advance(6 * SEC);
    assert_eq!(s.ban_left(&l, "login", "mallory").await, None);
    assert_eq!(send(&svc).await.0, StatusCode::OK);
}

async fn a_lowering_during_a_ban_keeps_its_retry_after_and_judges_the_retry_by_the_new_quotas(
    s: &impl Store,
) {
    let (l, time, svc) = banned(s).await;
    // One a minute, burst 1.
    s.apply(&l, Policy::new("login", Quota::per_minute(1)));
    time.advance(4 * SEC);
    assert_eq!(
        send(&svc).await,
        (StatusCode::TOO_MANY_REQUESTS, Some("25".to_owned()))
    );
    // The retry as told, 30 s after the start: the stored time is 60 s ahead of the start, a
    // request adds 60 s, and the new tolerance is 60 s, so it is admitted 30 s later. A strike,
    // the first of a new run: no ban.
    time.advance(25 * SEC);
    assert_eq!(
        send(&svc).await,
        (StatusCode::TOO_MANY_REQUESTS, Some("30".to_owned()))
    );
    assert_eq!(s.ban_left(&l, "login", "mallory").await, None);
    time.advance(30 * SEC);
    assert_eq!(send(&svc).await.0, StatusCode::OK);
}
