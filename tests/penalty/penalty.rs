//! The penalty box: strikes, bans, escalation, forgiveness, races at the threshold and a
//! client that waits as told, run over both stores (`tests/common/stores.rs`: the same body
//! through the HTTP layer in memory and on a real redis-server); then, on the memory store,
//! numeric edges, hooks, the bounded table of offenders against a reference model, and the
//! allow list on every layer. `penalty_redis.rs` has what only Redis has. Manual clock
//! throughout: every wait and every `Retry-After` below is exact.
//!
//! Pins docs/design.md section 3 ("The penalty box punishes the client's own traffic", "One bound
//! per layer").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tollgate::key::{ClientIp, Header, PeerIp};
use tollgate::penalty::{PenaltyBox, Strike};
use tollgate::response::{OnReject, RejectionKind};
use tollgate::{
    Clock, ConcurrencyLimitLayer, ConfigError, ManualClock, Outcome, Policy, Quota, RateLimitLayer,
    ShapeLayer,
};
use tower::{Layer, Service, ServiceExt};

use crate::common::account::rig::Handler;
use crate::common::stores::{Memory, Store};

const SEC: Duration = Duration::from_secs(1);

/// A handler that counts the requests that reach it.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Service<Request<()>> for Counted {
    type Response = Response<Bytes>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Bytes>, Infallible>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(Bytes::from_static(b"ok"))))
    }
}

fn from(ip: &str) -> Request<()> {
    from_with(ip, None)
}

fn from_with(ip: &str, xff: Option<&str>) -> Request<()> {
    let mut b = Request::builder().uri("/login");
    if let Some(x) = xff {
        b = b.header("x-forwarded-for", x);
    }
    let mut req = b.body(()).unwrap();
    let addr: SocketAddr = match ip.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, 40_000),
        Err(_) => ip.parse().unwrap(),
    };
    req.extensions_mut().insert(addr);
    req
}

/// Per peer IP, 2 per minute (burst 2); 3 rejections within 60 s ban for 10 s, doubling up to
/// 35 s; offences forgotten after 100 s without a ban.
fn login(clock: &Clock) -> RateLimitLayer<PeerIp> {
    RateLimitLayer::new(Quota::per_minute(2))
        .key(PeerIp)
        .clock(clock.clone())
        .penalty_box(
            PenaltyBox::new(3, 60 * SEC, 10 * SEC)
                .max_ban(35 * SEC)
                .forget_after(100 * SEC),
        )
}

struct Seen {
    status: StatusCode,
    retry_after: Option<String>,
    ratelimit: Option<String>,
}

/// What a client sees of the answer to `req`, on either store's service.
async fn send<S, B>(svc: &S, req: Request<()>) -> Seen
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    let resp = svc.clone().oneshot(req).await.unwrap();
    let get = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Seen {
        status: resp.status(),
        retry_after: get("retry-after"),
        ratelimit: get("ratelimit"),
    }
}

/// Sends `n` requests made by `req`; the statuses.
async fn repeat<S, B>(svc: &S, req: impl Fn() -> Request<()>, n: usize) -> Vec<u16>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(svc, req()).await.status.as_u16());
    }
    out
}

/// Sends `n` requests from `ip`; the statuses.
async fn burst<S>(svc: &S, ip: &str, n: usize) -> Vec<u16>
where
    S: Service<Request<()>, Response = Response<Bytes>, Error = Infallible> + Clone,
{
    repeat(svc, || from(ip), n).await
}

fn setup() -> (Clock, ManualClock, Counted) {
    let (clock, time) = Clock::manual();
    (clock, time, Counted::default())
}

// ---------------------------------------------------------------------------------------------
// The rules of the box, over both stores (`tests/common/stores.rs`): the same body through the
// HTTP layer, keyed by `x-key`, in memory and on a real redis-server.

crate::over_both_stores!(
    m_minus_one_rejections_then_quiet_never_ban,
    exactly_m_rejections_ban_for_d_with_an_exact_retry_after_and_agreeing_fields,
    a_banned_key_reaches_no_handler_and_consumes_no_quota,
    repeat_offences_escalate_and_stop_at_the_cap,
    offences_are_forgotten_after_the_quiet_period,
    after_the_ban_the_key_is_served_normally,
    requests_racing_at_the_threshold_make_one_ban_of_d(flavor = "multi_thread", worker_threads = 2),
    one_strike_bans_when_m_is_1,
    a_ban_longer_than_the_quota_is_the_retry_after_and_the_fields_reset,
    zero_settings_are_configuration_errors,
    strikes_recorded_outside_the_layer_ban_the_key,
    window_quotas_are_banned_in_the_same_decision,
);

/// Keyed by `x-key`, counting every response; `policy` named `login` unless it names itself.
fn on<S: Store>(s: &S, policy: impl Into<Policy>, clock: &Clock, penalty: PenaltyBox) -> S::Layer {
    s.on(keyed(policy, clock).penalty_box(penalty))
}

fn keyed(policy: impl Into<Policy>, clock: &Clock) -> RateLimitLayer<Header> {
    RateLimitLayer::new(policy)
        .key(Header::new("x-key"))
        .clock(clock.clone())
}

/// 2 per minute (burst 2); 3 rejections within 60 s ban for 10 s, doubling up to 35 s;
/// offences forgotten after 100 s without a ban.
fn login_box() -> PenaltyBox {
    PenaltyBox::new(3, 60 * SEC, 10 * SEC)
        .max_ban(35 * SEC)
        .forget_after(100 * SEC)
}

/// [`login_box`] on `s`, policy `login`.
fn login_on<S: Store>(s: &S, clock: &Clock) -> S::Layer {
    on(
        s,
        Policy::new("login", Quota::per_minute(2)),
        clock,
        login_box(),
    )
}

/// A request for `key`, answered `200` by the handler when admitted.
fn key_req(key: &str) -> Request<()> {
    Request::post("/login")
        .header("x-key", key)
        .body(())
        .unwrap()
}

/// What a client sees of the answer to a request for `key`.
async fn seen<S>(svc: &S, key: &str) -> Seen
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    send(svc, key_req(key)).await
}

/// The statuses of `n` requests for `key`.
async fn statuses<S>(svc: &S, key: &str, n: usize) -> Vec<u16>
where
    S: Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone,
{
    repeat(svc, || key_req(key), n).await
}

/// How many of `all` were served.
fn served(all: &[Vec<u16>]) -> usize {
    all.iter().flatten().filter(|s| **s == 200).count()
}

async fn m_minus_one_rejections_then_quiet_never_ban(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let svc = login_on(s, &clock).layer(Handler::default());
    // Two admitted, two rejected: two strikes of the three a ban needs.
    let first = statuses(&svc, "mallory", 4).await;
    assert_eq!(first, [200, 200, 429, 429]);
    // Quiet past the 60 s run: the run is over, and the quota is full again.
    time.advance(60 * SEC);
    let second = statuses(&svc, "mallory", 4).await;
    assert_eq!(second, [200, 200, 429, 429]);
    time.advance(60 * SEC);
    let third = statuses(&svc, "mallory", 2).await;
    assert_eq!(third, [200, 200]);
    assert_eq!(served(&[first, second, third]), 6);
}

async fn exactly_m_rejections_ban_for_d_with_an_exact_retry_after_and_agreeing_fields(
    s: &impl Store,
) {
    let (clock, time) = Clock::manual();
    let l = login_on(s, &clock);
    let svc = l.clone().layer(Handler::default());
    assert_eq!(statuses(&svc, "mallory", 4).await, [200, 200, 429, 429]);
    // The ban is 10 s, but the quota admits the request only 29 s from now (one request per
    // 30 s): Retry-After is when a retry is admitted, the later of the two.
    time.advance(SEC);
    let third = seen(&svc, "mallory").await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.retry_after.as_deref(), Some("29"));
    // r=0, and t no sooner than the ban's end.
    assert_eq!(third.ratelimit.as_deref(), Some("\"login\";r=0;t=60"));
    // 4 s later: 6 s of ban left, 25 s until the quota admits, exactly.
    time.advance(4 * SEC);
    let banned = seen(&svc, "mallory").await;
    assert_eq!(banned.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(banned.retry_after.as_deref(), Some("25"));
    assert_eq!(s.ban_left(&l, "login", "mallory").await, Some(6 * SEC));
    // Another client is not affected.
    assert_eq!(statuses(&svc, "alice", 1).await, [200]);
    // After the ban, and the quota's 60 s: the full burst, nothing was taken during the ban.
    time.advance(55 * SEC);
    assert_eq!(statuses(&svc, "mallory", 3).await, [200, 200, 429]);
}

async fn a_banned_key_reaches_no_handler_and_consumes_no_quota(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let policy = Policy::new("burst", Quota::per_second(1).burst(3));
    let svc =
        on(s, policy, &clock, PenaltyBox::new(1, 60 * SEC, 100 * SEC)).layer(Handler::default());
    let mut all = vec![statuses(&svc, "mallory", 4).await];
    assert_eq!(all[0], [200, 200, 200, 429]);
    // A thousand requests during the ban: none served, none counted against the quota.
    for _ in 0..1000 {
        all.push(statuses(&svc, "mallory", 1).await);
        assert_eq!(all.last().unwrap(), &[429]);
        time.advance(Duration::from_millis(99));
    }
    assert_eq!(served(&all), 3);
    // 99 s in; 1 s later the ban is over and the full burst is there.
    time.advance(SEC);
    assert_eq!(statuses(&svc, "mallory", 4).await, [200, 200, 200, 429]);
}

async fn repeat_offences_escalate_and_stop_at_the_cap(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let l = login_on(s, &clock);
    let svc = l.clone().layer(Handler::default());
    let mut bans = Vec::new();
    for _ in 0..5 {
        // Spend the quota, then three rejections: the third bans.
        let mut last = None;
        for _ in 0..5 {
            let seen = seen(&svc, "mallory").await;
            if seen.status == StatusCode::TOO_MANY_REQUESTS {
                last = seen.retry_after;
            }
        }
        let ban = s.ban_left(&l, "login", "mallory").await.unwrap().as_secs();
        // The answer waits for the ban and for the quota (30 s until one request is back).
        assert_eq!(last, Some(ban.max(30).to_string()));
        bans.push(ban);
        // Wait the ban out, and long enough for the quota to be full (60 s), but less than
        // the 100 s after which offences are forgotten.
        time.advance(Duration::from_secs(ban.max(60)));
    }
    assert_eq!(bans, [10, 20, 35, 35, 35]);
    // 100 s of quiet after the last ban ended: the next is the first again.
    time.advance(100 * SEC);
    let again = statuses(&svc, "mallory", 5).await;
    assert_eq!(again, [200, 200, 429, 429, 429]);
    assert_eq!(s.ban_left(&l, "login", "mallory").await, Some(10 * SEC));
}

async fn offences_are_forgotten_after_the_quiet_period(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let l = login_on(s, &clock);
    let svc = l.clone().layer(Handler::default());
    let ban = || async {
        let statuses = statuses(&svc, "mallory", 5).await;
        assert_eq!(statuses, [200, 200, 429, 429, 429]);
        s.ban_left(&l, "login", "mallory").await.unwrap().as_secs()
    };
    assert_eq!(ban().await, 10);
    // The ban ends at 10 s; offences are kept until 110 s.
    time.advance(109 * SEC);
    assert_eq!(ban().await, 20);
    // That ban ends 20 s later; quiet for 100 s after it: the next ban is the first again.
    time.advance(120 * SEC);
    assert_eq!(ban().await, 10);
}

async fn after_the_ban_the_key_is_served_normally<S: Store>(s: &S) {
    // The store's smallest step of time.
    let tick = Duration::from_nanos(S::TICK_NS as u64);
    let (clock, time) = Clock::manual();
    let svc = login_on(s, &clock).layer(Handler::default());
    let banned = statuses(&svc, "mallory", 5).await;
    assert_eq!(banned, [200, 200, 429, 429, 429]);
    time.advance(10 * SEC - tick);
    assert_eq!(statuses(&svc, "mallory", 1).await, [429]);
    time.advance(tick);
    // The quota has not refilled yet (one per 30 s): a plain rate-limit rejection, one strike.
    let seen = seen(&svc, "mallory").await;
    assert_eq!(seen.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.retry_after.as_deref(), Some("20"));
    time.advance(20 * SEC);
    assert_eq!(statuses(&svc, "mallory", 1).await, [200]);
}

async fn requests_racing_at_the_threshold_make_one_ban_of_d(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    // Two instances of the service (on Redis, two processes' layers on one server).
    let a = login_on(s, &clock);
    let b = s.instance(
        &a,
        keyed(Policy::new("login", Quota::per_minute(2)), &clock).penalty_box(login_box()),
    );
    let svcs = [
        a.clone().layer(Handler::default()),
        b.layer(Handler::default()),
    ];
    assert_eq!(statuses(&svcs[0], "mallory", 4).await, [200, 200, 429, 429]);
    // 64 requests at once, each of which could be the third strike.
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let svc = svcs[i % 2].clone();
            tokio::spawn(async move { svc.oneshot(key_req("mallory")).await.unwrap() })
        })
        .collect();
    for t in tasks {
        let resp = t.await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        // The ban is 10 s; the quota admits one request 30 s from now.
        assert_eq!(resp.headers()["retry-after"], "30");
    }
    // One ban, the first: racers that struck during it did not escalate it.
    assert_eq!(s.ban_left(&a, "login", "mallory").await, Some(10 * SEC));
    assert_eq!(s.strike(&a, "login", "mallory").await, Some(10 * SEC));
}

async fn one_strike_bans_when_m_is_1(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let policy = Policy::new("login", Quota::per_minute(1));
    let svc = on(s, policy, &clock, PenaltyBox::new(1, SEC, 7 * SEC)).layer(Handler::default());
    let first = seen(&svc, "mallory").await;
    assert_eq!(first.status, StatusCode::OK);
    let second = seen(&svc, "mallory").await;
    // Banned for 7 s, but the quota admits the next request only in 60 s.
    assert_eq!(second.retry_after.as_deref(), Some("60"));
}

async fn a_ban_longer_than_the_quota_is_the_retry_after_and_the_fields_reset(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let policy = Policy::new("login", Quota::per_minute(1));
    let svc =
        on(s, policy, &clock, PenaltyBox::new(2, 60 * SEC, 300 * SEC)).layer(Handler::default());
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(seen(&svc, "mallory").await);
    }
    assert_eq!(all[0].status, StatusCode::OK);
    assert_eq!(all[1].retry_after.as_deref(), Some("60"));
    for banned in &all[2..] {
        assert_eq!(banned.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(banned.retry_after.as_deref(), Some("300"));
        assert_eq!(banned.ratelimit.as_deref(), Some("\"login\";r=0;t=300"));
    }
}

async fn zero_settings_are_configuration_errors(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let bad = [
        (PenaltyBox::new(0, SEC, SEC), "strikes must be at least 1"),
        (
            PenaltyBox::new(1, Duration::ZERO, SEC),
            "the window for strikes must be longer than zero",
        ),
        (
            PenaltyBox::new(1, SEC, Duration::ZERO),
            "the ban must be longer than zero",
        ),
        (
            PenaltyBox::new(1, SEC, 10 * SEC).max_ban(9 * SEC),
            "max_ban must be at least the first ban",
        ),
    ];
    for (penalty, why) in bad {
        let layer = on(s, Quota::per_second(1), &clock, penalty);
        assert_eq!(
            s.validate(&layer).err(),
            Some(ConfigError::InvalidPenaltyBox(why))
        );
    }
    let ok_status = PenaltyBox::new(1, SEC, SEC).status(StatusCode::OK);
    let layer = on(s, Quota::per_second(1), &clock, ok_status);
    assert_eq!(
        s.validate(&layer).err(),
        Some(ConfigError::InvalidStatus(200))
    );
}

async fn strikes_recorded_outside_the_layer_ban_the_key(s: &impl Store) {
    let (clock, _time) = Clock::manual();
    let policy = Policy::new("login", Quota::per_second(100));
    let l = on(s, policy, &clock, PenaltyBox::new(2, 60 * SEC, 30 * SEC));
    let svc = l.clone().layer(Handler::default());
    // Two failed logins, found by the handler after the layer admitted them.
    assert_eq!(statuses(&svc, "mallory", 1).await, [200]);
    assert_eq!(s.strike(&l, "login", "mallory").await, None);
    assert_eq!(statuses(&svc, "mallory", 1).await, [200]);
    assert_eq!(s.strike(&l, "login", "mallory").await, Some(30 * SEC));
    let seen = seen(&svc, "mallory").await;
    assert_eq!(seen.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.retry_after.as_deref(), Some("30"));
    s.pardon(&l, "login", "mallory").await;
    assert_eq!(s.ban_left(&l, "login", "mallory").await, None);
    assert_eq!(statuses(&svc, "mallory", 1).await, [200]);
}

async fn window_quotas_are_banned_in_the_same_decision(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let policy = Policy::new("windows", Quota::sliding_log(2, 60 * SEC))
        .quota(Quota::fixed_window(5, 3600 * SEC));
    let svc =
        on(s, policy, &clock, PenaltyBox::new(2, 60 * SEC, 30 * SEC)).layer(Handler::default());
    assert_eq!(statuses(&svc, "mallory", 4).await, [200, 200, 429, 429]);
    let banned = seen(&svc, "mallory").await;
    // Banned for 30 s; the log admits a request when its window has passed, 60 s from now.
    assert_eq!(banned.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(banned.retry_after.as_deref(), Some("60"));
    // Every quota says none left, each until its own reset, none before the ban's end.
    assert_eq!(
        banned.ratelimit.as_deref(),
        Some("\"windows\";r=0;t=60, \"windows-5-per-1h\";r=0;t=3600")
    );
    // After the ban and the log's window: two more (the hour has used four of its five).
    time.advance(60 * SEC);
    assert_eq!(statuses(&svc, "mallory", 3).await, [200, 200, 429]);
}

/// Any quota, any penalty box, a client that sometimes waits as told, sometimes less,
/// sometimes more: a request sent when the last refusal said a retry is admitted (or later)
/// is admitted. The body of the property on both stores; `name` is the policy's, one per case.
async fn a_client_that_waits_as_told_is_always_admitted(
    s: &impl Store,
    name: String,
    (count, period, strikes, ban, waits): (u32, u64, u32, u64, Vec<u8>),
) -> Result<(), TestCaseError> {
    let (clock, time) = Clock::manual();
    let secs = Duration::from_secs;
    let policy = Policy::new(name, Quota::new(count, secs(period)));
    let penalty = PenaltyBox::new(strikes, secs(600), secs(ban)).max_ban(secs(3600));
    let svc = on(s, policy, &clock, penalty).layer(Handler::default());
    // The wait the last refusal told, while the client has not sent since.
    let mut told: Option<u64> = None;
    for (i, w) in waits.into_iter().enumerate() {
        let (wait, polite) = match (w, told) {
            (_, None) | (0, _) => (0, false),
            (1, Some(r)) => (r, true),
            (2, Some(r)) => (r / 2, false),
            (_, Some(r)) => (r + 7, true),
        };
        time.advance(secs(wait));
        let seen = seen(&svc, "mallory").await;
        if polite {
            prop_assert_eq!(
                seen.status,
                StatusCode::OK,
                "request {}, waited {} s",
                i,
                wait
            );
        }
        told = (seen.status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| seen.retry_after.unwrap().parse().unwrap());
    }
    Ok(())
}

fn waits() -> impl Strategy<Value = (u32, u64, u32, u64, Vec<u8>)> {
    (
        1u32..4,
        1u64..120,
        1u32..4,
        1u64..200,
        prop::collection::vec(0u8..4, 1..40),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_client_that_waits_as_told_is_always_admitted_in_memory(case in waits()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(a_client_that_waits_as_told_is_always_admitted(
            &Memory, "polite".into(), case,
        ))?;
    }
}

/// The property on a real redis-server: one server for every case, a policy of its own per
/// case.
#[cfg(feature = "redis")]
#[test]
fn a_client_that_waits_as_told_is_always_admitted_on_redis() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let case = std::cell::Cell::new(0u32);
    TestRunner::new(Config::with_cases(32))
        .run(&waits(), |waits| {
            case.set(case.get() + 1);
            rt.block_on(async {
                let name = format!("polite-{}", case.get());
                let outcome = a_client_that_waits_as_told_is_always_admitted(&redis, name, waits);
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
}

#[test]
#[should_panic(expected = "penalty box: the ban must be longer than zero")]
fn a_zero_ban_panics_when_the_layer_is_applied() {
    let layer = RateLimitLayer::new(Quota::per_second(1)).penalty_box(PenaltyBox::new(
        3,
        SEC,
        Duration::ZERO,
    ));
    let _ = layer.layer(Counted::default());
}

#[tokio::test]
async fn bans_near_the_end_of_time_saturate_instead_of_overflowing() {
    let (clock, time, handler) = setup();
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, SEC, Duration::MAX).max_ban(Duration::MAX));
    let svc = layer.layer(handler.clone());
    assert_eq!(burst(&svc, "192.0.2.1", 2).await, [200, 429]);
    let seen = send(&svc, from("192.0.2.1")).await;
    // At most 15 digits (RFC 8941 integers), never a wrapped small number.
    // The longest wait a clock of 64-bit nanoseconds holds (584 years), rounded up.
    assert_eq!(seen.retry_after.as_deref(), Some("18446744074"));
    time.advance(Duration::from_secs(1 << 40));
    assert_eq!(burst(&svc, "192.0.2.1", 1).await, [429]);
    assert_eq!(handler.calls(), 1);
}

#[tokio::test]
async fn sixty_offences_double_exactly_without_overflow() {
    let (clock, time) = Clock::manual();
    let boxed = PenaltyBox::new(1, SEC, Duration::from_nanos(1)).max_ban(Duration::MAX);
    let penalties = tollgate::penalty::Penalties::<u8>::try_new(&boxed, clock, 10).unwrap();
    for offence in 1..=60u32 {
        let expected = Duration::from_nanos(1 << (offence - 1));
        assert_eq!(
            penalties.strike(&1),
            Strike::Banned {
                ban: expected,
                offence
            }
        );
        time.advance(expected);
    }
}

#[tokio::test]
async fn the_ban_status_and_kind_reach_the_rejection_hook() {
    let (clock, _time, handler) = setup();
    let hook = OnReject::new(|r| {
        let body = format!("{} {:?}", r.kind().code(), r.retry_after());
        let mut resp = Response::new(Bytes::from(body));
        *resp.status_mut() = r.status();
        resp
    });
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .on_reject(hook)
        .penalty_box(PenaltyBox::new(1, SEC, 5 * SEC).status(StatusCode::FORBIDDEN));
    let svc = layer.layer(handler);
    assert_eq!(burst(&svc, "192.0.2.1", 1).await, [200]);
    let resp = svc.clone().oneshot(from("192.0.2.1")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // The wait until a retry is admitted: the quota's minute outlasts the 5 s ban.
    assert_eq!(resp.body(), "banned Some(60s)");
}

#[tokio::test]
async fn ban_entries_stay_while_banned_and_go_once_forgotten() {
    let (clock, time) = Clock::manual();
    let boxed = PenaltyBox::new(1, SEC, 10 * SEC).forget_after(20 * SEC);
    let penalties = tollgate::penalty::Penalties::<u32>::try_new(&boxed, clock, 4).unwrap();
    for k in 0..4 {
        assert!(matches!(penalties.strike(&k), Strike::Banned { .. }));
    }
    // The table is full of banned keys: a fifth key's strike cannot evict one.
    assert_eq!(penalties.strike(&4), Strike::NotRecorded);
    assert_eq!(penalties.len(), 4);
    for k in 0..4 {
        assert_eq!(penalties.ban_left(&k), Some(10 * SEC));
    }
    // Bans over, offences remembered until 30 s; then the entries are idle and make room.
    time.advance(30 * SEC);
    assert!(matches!(
        penalties.strike(&4),
        Strike::Banned { offence: 1, .. }
    ));
    assert!(penalties.len() <= 4);
}

#[tokio::test]
async fn a_banned_decision_says_banned() {
    let (clock, _time, handler) = setup();
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, SEC, 5 * SEC))
        .on_reject(OnReject::new(|r| {
            assert_eq!(r.kind(), RejectionKind::Banned);
            let d = r.decision().unwrap();
            assert_eq!(d.outcome(), Outcome::Banned);
            assert_eq!(d.remaining(), 0);
            // Until a retry is admitted: the ban (5 s) and the quota (60 s).
            assert_eq!(d.retry_after(), Some(60 * SEC));
            Response::new(Bytes::new())
        }));
    let svc = layer.layer(handler);
    burst(&svc, "192.0.2.1", 3).await;
}

#[tokio::test]
async fn a_ban_inside_gives_back_what_the_layer_outside_took() {
    let (clock, _time, handler) = setup();
    let outer = RateLimitLayer::new(Quota::per_minute(3).named("outer")).clock(clock.clone());
    let inner = login(&clock);
    let svc = tower::ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(handler.clone());
    // Two served, then the inner layer rejects and bans; the outer quota gives each back.
    assert_eq!(
        burst(&svc, "192.0.2.1", 20).await,
        [
            200, 200, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429, 429,
            429, 429, 429
        ]
    );
    // The outer layer still has its third request for another client.
    assert_eq!(burst(&svc, "192.0.2.2", 2).await, [200, 429]);
    assert_eq!(handler.calls(), 3);
}

// ---------------------------------------------------------------------------------------------
// The allow list, on every layer.

#[tokio::test]
async fn an_allowed_range_is_never_limited_or_banned() {
    let (clock, _time, handler) = setup();
    let layer = login(&clock).allow_ip("203.0.113.0/24");
    let svc = layer.layer(handler.clone());
    let statuses = burst(&svc, "203.0.113.9", 50).await;
    assert!(statuses.iter().all(|s| *s == 200));
    // IPv4-mapped IPv6 peers are the same addresses.
    let mapped = burst(&svc, "[::ffff:203.0.113.10]:1234", 10).await;
    assert!(mapped.iter().all(|s| *s == 200));
    // Outside the range: limited as usual.
    assert_eq!(burst(&svc, "198.51.100.1", 3).await, [200, 200, 429]);
    // Allowed requests carry no RateLimit fields (they were not counted).
    let seen = send(&svc, from("203.0.113.9")).await;
    assert_eq!(seen.ratelimit, None);
}

#[tokio::test]
async fn a_spoofed_forwarded_header_is_not_an_allowed_address() {
    let (clock, _time, handler) = setup();
    // Keyed by the peer: no header is ever believed.
    let svc = login(&clock)
        .allow_ip("203.0.113.0/24")
        .layer(handler.clone());
    let spoofed = || from_with("198.51.100.1", Some("203.0.113.9"));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(&svc, spoofed()).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);

    // Keyed by ClientIp behind 10.0.0.0/8: believed from the proxy, not from a client.
    let behind = RateLimitLayer::new(Quota::per_minute(1))
        .key(ClientIp::new().trust_proxy("10.0.0.0/8"))
        .clock(clock)
        .allow_ip("203.0.113.0/24")
        .layer(handler.clone());
    for _ in 0..5 {
        let through_proxy = from_with("10.0.0.2", Some("203.0.113.9"));
        assert_eq!(send(&behind, through_proxy).await.status, StatusCode::OK);
    }
    let direct = || from_with("198.51.100.7", Some("203.0.113.9"));
    assert_eq!(send(&behind, direct()).await.status, StatusCode::OK);
    assert_eq!(
        send(&behind, direct()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn an_allowed_key_is_never_limited() {
    let (clock, _time, handler) = setup();
    let svc = RateLimitLayer::new(Quota::per_minute(1))
        .key(Header::new("x-api-key"))
        .allow_key(b"internal"[..].into())
        .clock(clock)
        .layer(handler.clone());
    let req = |k: &str| Request::builder().header("x-api-key", k).body(()).unwrap();
    for _ in 0..10 {
        assert_eq!(send(&svc, req("internal")).await.status, StatusCode::OK);
    }
    assert_eq!(send(&svc, req("other")).await.status, StatusCode::OK);
    assert_eq!(
        send(&svc, req("other")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn allow_list_mistakes_are_configuration_errors() {
    let bad = RateLimitLayer::new(Quota::per_second(1)).allow_ip("203.0.113.0/33");
    assert_eq!(
        bad.validate().err(),
        Some(ConfigError::InvalidAllowedIp("203.0.113.0/33".into()))
    );
    // A key of the type before `.key(..)` cannot follow.
    let early = RateLimitLayer::new(Quota::per_second(1))
        .allow_key(())
        .key(PeerIp);
    assert_eq!(early.validate().err(), Some(ConfigError::AllowKeyBeforeKey));
    // Ranges do follow, in any order.
    let ranges_first = ConcurrencyLimitLayer::new(1)
        .allow_ip("10.0.0.0/8")
        .key(PeerIp);
    assert!(ranges_first.validate().is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_concurrency_layer_lets_allowed_clients_past_a_full_limit() {
    let handler = tower::service_fn(|_req: Request<()>| async {
        std::future::pending::<()>().await;
        Ok::<_, Infallible>(Response::new(Bytes::new()))
    });
    let svc = ConcurrencyLimitLayer::new(1)
        .allow_ip("203.0.113.0/24")
        .allow_ip("2001:db8::/32")
        .layer(handler);
    // One request holds the only permit.
    let mut holder = svc.clone();
    let _held = holder.call(from("198.51.100.1"));
    let mut other = svc.clone();
    let refused = other.call(from("198.51.100.2")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Allowed clients go straight to the (pending) handler.
    for ip in ["203.0.113.5", "[2001:db8::1]:80", "[::ffff:203.0.113.6]:80"] {
        let mut s = svc.clone();
        let fut = s.call(from(ip));
        // A rejection would be ready at once; the handler never answers.
        let polled = tokio::time::timeout(Duration::from_secs(1), fut).await;
        assert!(polled.is_err(), "{ip} should have reached the handler");
    }
}

#[tokio::test(start_paused = true)]
async fn the_shape_layer_does_not_delay_allowed_keys() {
    let handler = Counted::default();
    let svc = ShapeLayer::new(Quota::per_second(1))
        .key(Header::new("x-user"))
        .allow_key(b"ops"[..].into())
        .layer(handler.clone());
    let req = |k: &str| Request::builder().header("x-user", k).body(()).unwrap();
    let start = tokio::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(send(&svc, req("ops")).await.status, StatusCode::OK);
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Others are spaced as usual: the second waits 1 s.
    send(&svc, req("user")).await;
    send(&svc, req("user")).await;
    assert_eq!(start.elapsed(), SEC);
}

// ---------------------------------------------------------------------------------------------
// Retry-After is when a retry is admitted; only the client's own traffic is an offence; a
// repeat offender's record outlasts a flood of one-off strikes.

#[tokio::test]
async fn a_client_that_waits_as_told_is_admitted_and_never_banned_again() {
    let (clock, time, handler) = setup();
    // One request an hour; one strike bans for 10 s.
    let svc = RateLimitLayer::new(Quota::per_hour(1))
        .key(PeerIp)
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 10 * SEC))
        .layer(handler.clone());
    for round in 0..6 {
        assert_eq!(burst(&svc, "192.0.2.1", 1).await, [200], "round {round}");
        let refused = send(&svc, from("192.0.2.1")).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        // The ban (10 s) is over long before the quota admits: the answer is the quota's hour,
        // and the fields agree with it.
        assert_eq!(refused.retry_after.as_deref(), Some("3600"));
        assert_eq!(
            refused.ratelimit.as_deref(),
            Some("\"1-per-1h\";r=0;t=3600")
        );
        // Asked again during the ban: the same time, counted down.
        time.advance(5 * SEC);
        let banned = send(&svc, from("192.0.2.1")).await;
        assert_eq!(banned.retry_after.as_deref(), Some("3595"));
        time.advance(3595 * SEC);
    }
    assert_eq!(handler.calls(), 6);
}

#[tokio::test]
async fn a_banned_grpc_call_is_pushed_back_until_a_retry_is_admitted() {
    let (clock, time, handler) = setup();
    let svc = RateLimitLayer::new(Quota::per_hour(1))
        .key(PeerIp)
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 10 * SEC))
        .layer(handler.clone());
    let call = || {
        let mut req = from("192.0.2.1");
        req.headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        req
    };
    assert_eq!(send(&svc, call()).await.status, StatusCode::OK);
    for wait in [3_600_000, 3_599_000] {
        let resp = svc.clone().oneshot(call()).await.unwrap();
        assert_eq!(resp.headers()["grpc-status"], "8");
        // The hour of the quota, not the 10 s of the ban.
        assert_eq!(
            resp.headers()["grpc-retry-pushback-ms"],
            wait.to_string().as_str()
        );
        time.advance(SEC);
    }
    time.advance(3_598 * SEC);
    assert_eq!(send(&svc, call()).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_retry_after_the_ban_but_before_the_quota_is_struck_again() {
    let (clock, time, handler) = setup();
    let layer = RateLimitLayer::new(Quota::per_hour(1))
        .key(PeerIp)
        .clock(clock)
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 10 * SEC));
    let penalties = layer.penalties().unwrap().unwrap();
    let key = tollgate::key::IpKey::from("192.0.2.1".parse::<std::net::IpAddr>().unwrap());
    let svc = layer.layer(handler.clone());
    assert_eq!(burst(&svc, "192.0.2.1", 2).await, [200, 429]);
    // Not waiting as told: after the ban, the quota refuses, which is the second offence.
    time.advance(10 * SEC);
    let refused = send(&svc, from("192.0.2.1")).await;
    assert_eq!(refused.retry_after.as_deref(), Some("3590"));
    assert_eq!(penalties.ban_left(&key), Some(20 * SEC));
}

#[tokio::test]
async fn a_new_key_turned_away_by_a_full_table_is_not_struck() {
    let (clock, time, handler) = setup();
    // Two keys at most, new keys turned away; three strikes ban.
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .max_keys(2)
        .on_full(tollgate::store::OnFull::RejectNewKeys)
        .penalty_box(PenaltyBox::new(3, 600 * SEC, 120 * SEC));
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    assert_eq!(burst(&svc, "192.0.2.1", 1).await, [200]);
    assert_eq!(burst(&svc, "192.0.2.2", 1).await, [200]);
    // Full: the new client is turned away three times, for the server's state, not its own.
    for _ in 0..3 {
        let seen = send(&svc, from("192.0.2.3")).await;
        assert_eq!(seen.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(seen.retry_after.as_deref(), Some("60"));
    }
    assert_eq!(penalties.len(), 0);
    // Room again a minute later: served.
    time.advance(60 * SEC);
    assert_eq!(burst(&svc, "192.0.2.3", 1).await, [200]);
    assert_eq!(handler.calls(), 3);
}

#[tokio::test]
async fn a_dry_run_records_no_strikes() {
    let (clock, _time, handler) = setup();
    let layer = RateLimitLayer::new(Quota::per_minute(1))
        .key(PeerIp)
        .clock(clock)
        .dry_run(true)
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 600 * SEC));
    let penalties = layer.penalties().unwrap().unwrap();
    let svc = layer.layer(handler.clone());
    assert_eq!(burst(&svc, "192.0.2.1", 5).await, [200; 5]);
    assert_eq!(penalties.len(), 0);
    assert_eq!(handler.calls(), 5);
}

#[test]
fn a_repeat_offenders_record_outlasts_one_off_strikes_of_new_keys() {
    let (clock, time) = Clock::manual();
    // Two strikes within a minute ban for 10 s; offences forgotten an hour after a ban.
    let boxed = PenaltyBox::new(2, 60 * SEC, 10 * SEC).forget_after(3600 * SEC);
    let penalties = tollgate::penalty::Penalties::<&str>::try_new(&boxed, clock, 4).unwrap();
    penalties.strike(&"mallory");
    assert!(matches!(
        penalties.strike(&"mallory"),
        Strike::Banned { offence: 1, .. }
    ));
    time.advance(11 * SEC);
    assert_eq!(penalties.ban_left(&"mallory"), None);
    // Three other keys are banned; a fourth strikes once and finds no room: mallory's record
    // (her ban is over, her offence is not forgotten) does not give way to a one-off strike.
    for k in ["a", "b", "c"] {
        penalties.strike(&k);
        assert!(matches!(penalties.strike(&k), Strike::Banned { .. }));
    }
    assert_eq!(penalties.strike(&"d"), Strike::NotRecorded);
    assert_eq!(penalties.len(), 4);
    // Her next two strikes are her second offence: twice the ban.
    assert_eq!(penalties.strike(&"mallory"), Strike::Counted(1));
    assert_eq!(
        penalties.strike(&"mallory"),
        Strike::Banned {
            ban: 20 * SEC,
            offence: 2
        }
    );
}

#[test]
fn keys_with_strikes_only_give_way_before_a_repeat_offender() {
    let (clock, time) = Clock::manual();
    let boxed = PenaltyBox::new(2, 60 * SEC, 10 * SEC).forget_after(3600 * SEC);
    let penalties = tollgate::penalty::Penalties::<&str>::try_new(&boxed, clock, 2).unwrap();
    penalties.strike(&"mallory");
    penalties.strike(&"mallory");
    time.advance(11 * SEC);
    // One key with one strike; a new key's strike takes its place, never mallory's.
    assert_eq!(penalties.strike(&"a"), Strike::Counted(1));
    for k in ["b", "c", "d", "e"] {
        assert_eq!(penalties.strike(&k), Strike::Counted(1));
    }
    assert_eq!(penalties.strike(&"mallory"), Strike::Counted(1));
    assert!(matches!(
        penalties.strike(&"mallory"),
        Strike::Banned { offence: 2, .. }
    ));
}

#[test]
fn a_key_banned_by_its_first_strike_may_take_the_place_of_an_offence_on_record() {
    let (clock, time) = Clock::manual();
    let boxed = PenaltyBox::new(1, 60 * SEC, 10 * SEC).forget_after(3600 * SEC);
    let penalties = tollgate::penalty::Penalties::<&str>::try_new(&boxed, clock, 1).unwrap();
    assert!(matches!(
        penalties.strike(&"mallory"),
        Strike::Banned { .. }
    ));
    // While she is banned, no room for anyone.
    assert_eq!(penalties.strike(&"a"), Strike::NotRecorded);
    time.advance(10 * SEC);
    // Her ban over, a ban now outranks an offence on record.
    assert!(matches!(
        penalties.strike(&"a"),
        Strike::Banned { offence: 1, .. }
    ));
    assert_eq!(penalties.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// The penalty state against a small reference model, on random histories.

mod model {
    use super::*;
    use tollgate::penalty::Penalties;

    /// Every strike and ban of one key, kept whole; the rules re-derived from the history.
    #[derive(Default, Clone)]
    struct History {
        /// Strikes that counted, with the time of each.
        counted: Vec<u64>,
        /// Bans: (start, end, offence).
        bans: Vec<(u64, u64, u32)>,
    }

    const STRIKES: u32 = 3;
    const WITHIN: u64 = 10;
    const BAN: u64 = 4;
    const MAX_BAN: u64 = 20;
    const FORGET: u64 = 30;

    impl History {
        fn strike(&mut self, t: u64) -> Strike {
            if let Some(&(_, end, _)) = self.bans.last() {
                if end > t {
                    return Strike::AlreadyBanned(Duration::from_secs(end - t));
                }
            }
            // The current run: counted strikes after the last ban, from the first of a run.
            let since_ban = self.bans.last().map_or(0, |b| b.0 + 1);
            let mut run_start = None;
            let mut in_run = 0;
            for &s in self.counted.iter().filter(|&&s| s >= since_ban) {
                match run_start {
                    Some(r) if s < r + WITHIN => in_run += 1,
                    _ => {
                        run_start = Some(s);
                        in_run = 1;
                    }
                }
            }
            if run_start.is_some_and(|r| t >= r + WITHIN) {
                in_run = 0;
            }
            self.counted.push(t);
            if in_run + 1 < STRIKES {
                return Strike::Counted(in_run + 1);
            }
            let offence = match self.bans.last() {
                Some(&(_, end, n)) if t < end + FORGET => n + 1,
                _ => 1,
            };
            let length = (0..offence - 1).fold(BAN, |l, _| (l * 2).min(MAX_BAN));
            self.bans.push((t, t + length, offence));
            Strike::Banned {
                ban: Duration::from_secs(length),
                offence,
            }
        }
    }

    impl History {
        /// The start of the run open at `t`, if any: counted strikes after the last ban.
        fn run_start(&self, t: u64) -> Option<u64> {
            let since_ban = self.bans.last().map_or(0, |b| b.0 + 1);
            let mut run_start = None;
            for &s in self.counted.iter().filter(|&&s| s >= since_ban) {
                match run_start {
                    Some(r) if s < r + WITHIN => {}
                    _ => run_start = Some(s),
                }
            }
            run_start.filter(|&r| t < r + WITHIN)
        }

        fn ban_left(&self, t: u64) -> Option<u64> {
            self.bans
                .last()
                .and_then(|&(_, end, _)| (end > t).then(|| end - t))
        }

        /// The end of the last ban while its offence is not forgotten at `t`.
        fn on_record(&self, t: u64) -> Option<u64> {
            self.bans
                .last()
                .and_then(|&(_, end, _)| (t < end + FORGET).then_some(end))
        }

        /// Whether the key holds a place no one-off strike may take: banned, or an offence on
        /// record.
        fn kept(&self, t: u64) -> bool {
            self.ban_left(t).is_some() || self.on_record(t).is_some()
        }
    }

    /// What the flood test does at one step.
    #[derive(Debug, Clone)]
    enum Act {
        /// A key never seen before strikes once.
        OneOff,
        /// A known offender strikes (three times at once when it has nothing on record, so that
        /// it is never left with strikes only, the one state a one-off strike may evict).
        Offend(usize),
    }

    fn act() -> impl Strategy<Value = Act> {
        prop_oneof![
            2 => Just(Act::OneOff),
            3 => (0usize..6).prop_map(Act::Offend),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Six offenders and a flood of one-off strikes on a table of four places: every
        /// offender's strikes, bans, doublings, cap and forgiveness agree with the model as if
        /// the table were unbounded (a ban or an offence on record is never evicted), a one-off
        /// strike is recorded exactly when some place holds nothing of that kind, and the
        /// table never holds more than four.
        #[test]
        fn offenders_keep_their_record_through_a_flood_of_one_off_strikes(
            steps in prop::collection::vec((act(), 0u64..7), 1..150),
        ) {
            const PLACES: usize = 4;
            let (clock, time) = Clock::manual();
            let s = Duration::from_secs;
            let boxed = PenaltyBox::new(STRIKES, s(WITHIN), s(BAN))
                .max_ban(s(MAX_BAN))
                .forget_after(s(FORGET));
            let penalties = Penalties::<u32>::try_new(&boxed, clock, PLACES).unwrap();
            let mut models = vec![History::default(); 6];
            let mut next_one_off = 100u32;
            let mut t = 0;
            for (i, (act, dt)) in steps.into_iter().enumerate() {
                t += dt;
                time.advance(s(dt));
                let kept = models.iter().filter(|m| m.kept(t)).count();
                match act {
                    Act::OneOff => {
                        next_one_off += 1;
                        let expected = if kept < PLACES {
                            Strike::Counted(1)
                        } else {
                            Strike::NotRecorded
                        };
                        prop_assert_eq!(
                            penalties.strike(&next_one_off), expected, "step {} at {} s", i, t
                        );
                    }
                    Act::Offend(k) => {
                        let m = &mut models[k];
                        // A lone strike only while its run ends before the record would be
                        // forgotten (it is then never left with strikes only).
                        let lone = m.ban_left(t).is_some()
                            || m.on_record(t).is_some_and(|end| t + WITHIN < end + FORGET);
                        let room = m.kept(t) || m.run_start(t).is_some() || kept < PLACES;
                        for _ in 0..if lone { 1 } else { STRIKES } {
                            let expected = if room { m.strike(t) } else { Strike::NotRecorded };
                            prop_assert_eq!(
                                penalties.strike(&(k as u32)), expected,
                                "step {}, offender {} at {} s", i, k, t
                            );
                        }
                    }
                }
                prop_assert!(penalties.len() <= PLACES);
                for (k, m) in models.iter().enumerate() {
                    prop_assert_eq!(
                        penalties.ban_left(&(k as u32)),
                        m.ban_left(t).map(s),
                        "offender {} at {} s", k, t
                    );
                }
            }
        }

        #[test]
        fn strikes_agree_with_the_model(steps in prop::collection::vec((0u8..3, 0u64..8), 1..120)) {
            let (clock, time) = Clock::manual();
            let s = Duration::from_secs;
            let boxed = PenaltyBox::new(STRIKES, s(WITHIN), s(BAN))
                .max_ban(s(MAX_BAN))
                .forget_after(s(FORGET));
            let penalties = Penalties::<u8>::try_new(&boxed, clock, 1000).unwrap();
            let mut models = vec![History::default(); 3];
            let mut t = 0;
            for (i, (key, dt)) in steps.into_iter().enumerate() {
                t += dt;
                time.advance(s(dt));
                let expected = models[usize::from(key)].strike(t);
                prop_assert_eq!(penalties.strike(&key), expected, "step {} at {} s", i, t);
            }
        }
    }
}
