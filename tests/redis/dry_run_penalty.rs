//! A dry-run layer with a penalty box: its quotas' refusals are no strikes, on Redis as in
//! memory (the same bodies over both stores), whatever the quota kinds and whether the
//! request was limited or could never pass; a ban recorded otherwise is still reported and
//! let through; and on one Redis name, a dry-run layer beside an enforcing one adds nothing
//! to the strikes the enforcing one counts.
//!
//! Pins docs/design.md section 3 ("The penalty box punishes the client's own traffic": not
//! dry-run).
#![cfg(feature = "redis")]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::observe::DryRunRejection;
use tollgate::penalty::PenaltyBox;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::ServiceExt;

use crate::common::stores::{self, Boxed, Store};

const SEC: Duration = Duration::from_secs(1);

/// Two refusals within a minute ban for 30 s.
fn two_strikes() -> PenaltyBox {
    PenaltyBox::new(2, 60 * SEC, 30 * SEC)
}

/// 2 a minute and at most 3 in any minute, keyed by `x-key`, costing `x-cost`, named `name`.
fn keyed(name: &str, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(
        Policy::new(name.to_owned(), Quota::per_minute(2)).quota(Quota::sliding_log(3, 60 * SEC)),
    )
    .key(Header::new("x-key"))
    .cost(stores::x_cost)
    .clock(clock.clone())
    .penalty_box(two_strikes())
}

/// A handler that answers `200`, naming in `x-dry` what a dry run would have refused.
fn reporting() -> Boxed {
    Boxed::new(tower::service_fn(|r: Request<()>| async move {
        let mut resp = Response::new(Full::new(Bytes::new()));
        if let Some(d) = DryRunRejection::first(r.extensions()) {
            let code = d.kind().code();
            resp.headers_mut().insert("x-dry", code.parse().unwrap());
        }
        Ok::<_, Infallible>(resp)
    }))
}

/// The status of a request of `cost` for `key`, and what a dry run would have refused.
async fn send(svc: &Boxed, key: &str, cost: u32) -> (u16, Option<String>) {
    let req = Request::get("/")
        .header("x-key", key)
        .header("x-cost", cost.to_string())
        .body(())
        .unwrap();
    let resp: Response<Full<Bytes>> = svc.clone().oneshot(req).await.unwrap();
    let dry = resp
        .headers()
        .get("x-dry")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), dry)
}

async fn a_dry_run_layer_never_bans_and_the_same_layer_enforcing_does(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let dry = s.on(keyed("dry", &clock).dry_run(true));
    let svc = s.around(&dry, reporting());
    // Two admitted, then refusals every one (and one that can never pass): all served.
    assert_eq!(send(&svc, "mallory", 1).await, (200, None));
    assert_eq!(send(&svc, "mallory", 1).await, (200, None));
    for _ in 0..6 {
        let seen = send(&svc, "mallory", 1).await;
        assert_eq!(seen, (200, Some("rate_limited".to_owned())));
    }
    let never = send(&svc, "mallory", 5).await;
    assert_eq!(never, (200, Some("cost_exceeds_burst".to_owned())));
    assert_eq!(s.ban_left(&dry, "dry", "mallory").await, None);
    // A minute on, the run of strikes would be over anyway: still no ban, and served.
    time.advance(60 * SEC);
    assert_eq!(send(&svc, "mallory", 1).await, (200, None));
    assert_eq!(s.ban_left(&dry, "dry", "mallory").await, None);

    // The same layer enforcing: the second refusal bans for 30 s.
    let enforcing = s.on(keyed("enforcing", &clock));
    let svc = s.around(&enforcing, reporting());
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(send(&svc, "mallory", 1).await.0);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(
        s.ban_left(&enforcing, "enforcing", "mallory").await,
        Some(30 * SEC)
    );
}

async fn a_ban_recorded_outside_a_dry_run_layer_is_reported_and_let_through(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let dry = s.on(keyed("outside", &clock).dry_run(true));
    let svc = s.around(&dry, reporting());
    assert_eq!(s.strike(&dry, "outside", "mallory").await, None);
    assert_eq!(s.strike(&dry, "outside", "mallory").await, Some(30 * SEC));
    for _ in 0..3 {
        assert_eq!(
            send(&svc, "mallory", 1).await,
            (200, Some("banned".to_owned()))
        );
    }
    // The ban is the one recorded: the refusals behind it made it no longer.
    assert_eq!(s.ban_left(&dry, "outside", "mallory").await, Some(30 * SEC));
    // Another key is decided by the quotas, and never banned.
    for _ in 0..2 {
        assert_eq!(send(&svc, "alice", 1).await, (200, None));
    }
    for _ in 0..4 {
        let seen = send(&svc, "alice", 1).await;
        assert_eq!(seen, (200, Some("rate_limited".to_owned())));
    }
    assert_eq!(s.ban_left(&dry, "outside", "alice").await, None);
}

crate::over_both_stores!(
    a_dry_run_layer_never_bans_and_the_same_layer_enforcing_does,
    a_ban_recorded_outside_a_dry_run_layer_is_reported_and_let_through,
);

/// On one Redis name, a dry-run layer and an enforcing one share the quota and the penalty
/// keys: only the enforcing layer's refusals are strikes, however many the dry run sees.
#[tokio::test]
async fn a_dry_run_layer_on_the_name_of_an_enforcing_one_adds_no_strike_to_its_count() {
    let s = stores::OnRedis::start().await;
    let (clock, time) = Clock::manual();
    let enforcing = s.on(keyed("shared", &clock));
    let dry = s.on(keyed("shared", &clock).dry_run(true));
    let (enforced, shadow) = (
        s.around(&enforcing, reporting()),
        s.around(&dry, reporting()),
    );
    assert_eq!(send(&enforced, "mallory", 1).await, (200, None));
    assert_eq!(send(&shadow, "mallory", 1).await, (200, None));
    // The quota is spent for both: one strike from the enforcing layer, none from the dry
    // run's many refusals.
    assert_eq!(send(&enforced, "mallory", 1).await.0, 429);
    for _ in 0..5 {
        let seen = send(&shadow, "mallory", 1).await;
        assert_eq!(seen, (200, Some("rate_limited".to_owned())));
    }
    assert_eq!(s.ban_left(&enforcing, "shared", "mallory").await, None);
    // The enforcing layer's second refusal bans; the dry run then reports the ban.
    time.advance(SEC);
    assert_eq!(send(&enforced, "mallory", 1).await.0, 429);
    assert_eq!(
        s.ban_left(&enforcing, "shared", "mallory").await,
        Some(30 * SEC)
    );
    assert_eq!(
        send(&shadow, "mallory", 1).await,
        (200, Some("banned".to_owned()))
    );
}
