//! Bounds that hold on every path: `max_keys` is one bound for everything a layer tracks per
//! key, a reservation settled from the response needs a place like any other request, and
//! `OnFull::RejectNewKeys` turns new keys away whatever their cost. Manual clock throughout.
//!
//! Pins docs/design.md section 3 ("One bound per layer").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate::key::PeerIp;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, ManualClock, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

const SEC: Duration = Duration::from_secs(1);

/// A handler that reports the cost the request asks for (`x-cost`) as its [`ActualCost`].
#[derive(Clone, Default)]
struct Reporting(Arc<AtomicUsize>);

impl Reporting {
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Service<Request<()>> for Reporting {
    type Response = Response<Bytes>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Bytes>, Infallible>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        let cost = req
            .headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let mut resp = Response::new(Bytes::from_static(b"ok"));
        if let Some(c) = cost {
            resp.extensions_mut().insert(ActualCost(c));
        }
        std::future::ready(Ok(resp))
    }
}

/// A request from `10.0.0.<n>` whose response reports `cost`.
fn from(n: u8, cost: u32) -> Request<()> {
    let mut req = Request::builder()
        .uri("/")
        .header("x-cost", cost.to_string())
        .body(())
        .unwrap();
    let addr: SocketAddr = ([10, 0, 0, n], 40_000).into();
    req.extensions_mut().insert(addr);
    req
}

async fn send<S>(svc: &S, req: Request<()>) -> (StatusCode, Option<String>)
where
    S: Service<Request<()>, Response = Response<Bytes>, Error = Infallible> + Clone,
{
    let resp = svc.clone().oneshot(req).await.unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status(), retry)
}

fn setup() -> (Clock, ManualClock, Reporting) {
    let (clock, time) = Clock::manual();
    (clock, time, Reporting::default())
}

/// 100 per hour per client (one every 36 s), nothing reserved, the cost settled from the
/// response; at most three clients tracked.
fn settled(clock: &Clock, on_full: OnFull) -> RateLimitLayer<PeerIp> {
    RateLimitLayer::new(Quota::per_hour(100))
        .key(PeerIp)
        .clock(clock.clone())
        .max_keys(3)
        .on_full(on_full)
        .cost(|_| 0)
        .settle(ActualCost::of)
}

#[tokio::test]
async fn a_zero_reservation_of_a_new_key_does_not_pass_a_full_table() {
    let (clock, time, handler) = setup();
    let svc = settled(&clock, OnFull::RejectNewKeys).layer(handler.clone());
    let mut served = 0;
    for n in 1..=50 {
        let (status, retry) = send(&svc, from(n, 1)).await;
        if status == StatusCode::OK {
            served += 1;
        } else {
            // Turned away until the first tracked client is idle: its one unit, 36 s.
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "client {n}");
            assert_eq!(retry.as_deref(), Some("36"), "client {n}");
        }
    }
    assert_eq!(served, 3);
    assert_eq!(handler.calls(), 3);
    // A tracked client is still served on a full table; a new one once a place is free.
    assert_eq!(send(&svc, from(1, 1)).await.0, StatusCode::OK);
    assert_eq!(
        send(&svc, from(4, 1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    time.advance(36 * SEC);
    assert_eq!(send(&svc, from(4, 1)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_zero_reservation_evicts_like_any_new_key_by_default() {
    let (clock, _time, handler) = setup();
    let svc = settled(&clock, OnFull::EvictNearestIdle).layer(handler.clone());
    for n in 1..=50 {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK, "client {n}");
    }
    assert_eq!(handler.calls(), 50);
}

#[tokio::test]
async fn a_settled_debt_stands_on_a_full_table() {
    let (clock, time, handler) = setup();
    let svc = settled(&clock, OnFull::RejectNewKeys).layer(handler.clone());
    // Client 1 reports 150 units: 50 more than the hour's burst, a debt of 150 × 36 s.
    assert_eq!(send(&svc, from(1, 150)).await.0, StatusCode::OK);
    assert_eq!(send(&svc, from(2, 1)).await.0, StatusCode::OK);
    assert_eq!(send(&svc, from(3, 1)).await.0, StatusCode::OK);
    // Its next reservation (0) passes once the debt is paid down to the burst: 50 × 36 s.
    let (status, retry) = send(&svc, from(1, 1)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("1800"));
    time.advance(1800 * SEC);
    assert_eq!(send(&svc, from(1, 1)).await.0, StatusCode::OK);
}

/// One request a minute per client; three refusals within ten minutes ban for a minute.
fn guarded(clock: &Clock, max_keys: usize, on_full: OnFull) -> RateLimitLayer<PeerIp> {
    RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock.clone())
        .max_keys(max_keys)
        .on_full(on_full)
        .penalty_box(tollgate::penalty::PenaltyBox::new(3, 600 * SEC, 60 * SEC))
}

#[tokio::test]
async fn max_keys_counts_quota_state_and_penalty_records_together() {
    let (clock, time, handler) = setup();
    let layer = guarded(&clock, 4, OnFull::RejectNewKeys);
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    // Two clients, each with quota state and a strike on record: four entries, the bound.
    for n in [1, 2] {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK);
        assert_eq!(
            send(&svc, from(n, 1)).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(penalties.len(), 2);
    // A third client finds no place, until the quota state of the first goes idle (60 s).
    let (status, retry) = send(&svc, from(3, 1)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("60"));
    time.advance(60 * SEC);
    assert_eq!(send(&svc, from(3, 1)).await.0, StatusCode::OK);
    // The strikes stand: they go idle when their run ends.
    assert_eq!(penalties.len(), 2);
}

#[tokio::test]
async fn a_strike_takes_the_place_of_quota_state_and_bans_on_a_full_table() {
    let (clock, _time, handler) = setup();
    let layer = guarded(&clock, 3, OnFull::EvictNearestIdle);
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    // Three clients fill the bound with quota state.
    for n in [1, 2, 3] {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK);
    }
    // Three strikes against client 9 (found by the handler, say): its record takes the place
    // of quota state, and the third bans.
    let key = tollgate::key::IpKey::from(std::net::IpAddr::from([10, 0, 0, 9]));
    assert_eq!(
        penalties.strike(&key),
        tollgate::penalty::Strike::Counted(1)
    );
    assert_eq!(
        penalties.strike(&key),
        tollgate::penalty::Strike::Counted(2)
    );
    assert!(matches!(
        penalties.strike(&key),
        tollgate::penalty::Strike::Banned { offence: 1, .. }
    ));
    assert_eq!(penalties.len(), 1);
    let (status, retry) = send(&svc, from(9, 1)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("60"));
    // New clients still find a place: they evict quota state, never the ban.
    for n in 10..40 {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK, "client {n}");
    }
    assert_eq!(penalties.ban_left(&key), Some(60 * SEC));
}

#[tokio::test]
async fn under_reject_new_keys_a_strike_does_not_evict_quota_state() {
    let (clock, _time, handler) = setup();
    let layer = guarded(&clock, 2, OnFull::RejectNewKeys);
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    for n in [1, 2] {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK);
    }
    // Refused by its quota, client 1 would strike, but tracked keys keep their exact state.
    assert_eq!(
        send(&svc, from(1, 1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(penalties.len(), 0);
    assert_eq!(
        send(&svc, from(2, 1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn an_idle_penalty_record_makes_room_for_a_new_key() {
    let (clock, time, handler) = setup();
    // Strikes count for 2 s; quota state lasts a minute.
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock.clone())
        .max_keys(3)
        .on_full(OnFull::RejectNewKeys)
        .penalty_box(tollgate::penalty::PenaltyBox::new(3, 2 * SEC, 60 * SEC));
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    // Client 1: quota state and a strike; client 2: quota state. Three places taken.
    assert_eq!(send(&svc, from(1, 1)).await.0, StatusCode::OK);
    assert_eq!(
        send(&svc, from(1, 1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&svc, from(2, 1)).await.0, StatusCode::OK);
    let (status, retry) = send(&svc, from(3, 1)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The first entry to go idle is the strike's, when its run ends.
    assert_eq!(retry.as_deref(), Some("2"));
    time.advance(2 * SEC);
    // Its place is the new client's, though it is in the other table.
    assert_eq!(send(&svc, from(3, 1)).await.0, StatusCode::OK);
    assert_eq!(penalties.len(), 0);
}

#[tokio::test]
async fn max_keys_is_one_bound_over_the_tiers_of_a_layer() {
    let (clock, time, handler) = setup();
    // Two tiers, chosen by path; two keys in all.
    let svc = RateLimitLayer::new(tollgate::Policy::new("free", Quota::per_minute(1)))
        .tier(tollgate::Policy::new("pro", Quota::per_minute(2)))
        .select_tier(|head| (head.uri.path() == "/pro").then_some("pro"))
        .key(PeerIp)
        .clock(clock)
        .max_keys(2)
        .on_full(OnFull::RejectNewKeys)
        .layer(handler.clone());
    let at = |path: &str, n: u8| {
        let mut req = from(n, 1);
        *req.uri_mut() = path.parse().unwrap();
        req
    };
    assert_eq!(send(&svc, at("/", 1)).await.0, StatusCode::OK);
    assert_eq!(send(&svc, at("/pro", 2)).await.0, StatusCode::OK);
    // Each tier holds one key: the layer's two places are taken, in either tier.
    let (status, retry) = send(&svc, at("/", 3)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The first place to free is the pro key's (half a minute), in the other tier.
    assert_eq!(retry.as_deref(), Some("30"));
    assert_eq!(
        send(&svc, at("/pro", 3)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    time.advance(30 * SEC);
    assert_eq!(send(&svc, at("/", 3)).await.0, StatusCode::OK);
}

#[tokio::test]
async fn bans_never_take_every_place_from_new_clients() {
    let (clock, _time, handler) = setup();
    // One refusal bans for an hour; four places in all.
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .max_keys(4)
        .penalty_box(tollgate::penalty::PenaltyBox::new(1, 60 * SEC, 3600 * SEC));
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    // Twenty attackers get themselves banned: records take at most half the places.
    for n in 100..120 {
        send(&svc, from(n, 1)).await;
        send(&svc, from(n, 1)).await;
    }
    assert_eq!(penalties.len(), 2);
    // New clients are still served, in the other half.
    for n in 1..30 {
        assert_eq!(send(&svc, from(n, 1)).await.0, StatusCode::OK, "client {n}");
    }
    assert_eq!(penalties.len(), 2);
}
