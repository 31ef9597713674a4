//! The Redis store attacked where its promises meet other features: key names that could
//! collide, give-backs that could come after their lease expired, state lost under a lease,
//! the local fallback with tiny quotas and many instances, and quotas changed while serving.
//! Each test gives exact numbers; those that need a server start a real `redis-server`.
//!
//! Pins docs/design.md section 3 ("Redis", "An account per key", "A live quota change").

#![cfg(feature = "redis")]

use crate::common;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::key::{self, Global, Header, KeyExtractor, KeyExtractorExt, PeerIp, Route};
use tollgate::redis::{FailMode, Lease, RedisKey, RedisRateLimiter, RedisStore, Share};
use tollgate::{Clock, ManualClock, Quota};

/// A closure extractor, named `name`.
fn named(name: &str) -> impl KeyExtractor<Key = u8> + Clone {
    key::from_fn(|_: &key::RequestHead<'_>| Some(1u8)).named(name)
}

#[test]
fn named_extractors_whose_names_hold_commas_or_parentheses_describe_different_keys() {
    // Two `or` chains that differ in which name holds the separator.
    let a = named("p,named:q").or(named("r"));
    let b = named("p").or(named("q,named:r"));
    assert_ne!(a.describe(), b.describe());
    // The same with tuples, and a name that closes the tuple early.
    let a = (named("a,named:b"), named("c"));
    let b = (named("a"), named("b,named:c"));
    assert_ne!(a.describe(), b.describe());
    let a = (named("x),(named:y"), named("z"));
    let b = ((named("x"), named("y")), named("z"));
    assert_ne!(a.describe(), b.describe());
    // A plain name reads as given.
    assert_eq!(named("tenant").describe().as_deref(), Some("named:tenant"));
}

#[test]
fn empty_names_and_names_with_colons_or_hashes_never_describe_a_built_in_extractor() {
    let built_in = [
        Global.describe(),
        Route.describe(),
        PeerIp.describe(),
        Header::new("route").describe(),
        Header::new("x-a").describe(),
    ];
    for name in [
        "",
        "route",
        "global",
        "header:x-a",
        "peer-ip/64",
        "a#b",
        "a:b",
    ] {
        let d = named(name).describe();
        assert!(!built_in.contains(&d), "{name:?}: {d:?}");
    }
    // A header named like an extractor is still a header.
    assert_eq!(
        Header::new("route").describe().as_deref(),
        Some("header:route")
    );
    // Names alike describe alike (the promise of `named`); different ones never.
    assert_eq!(named("").describe(), named("").describe());
    assert_ne!(named("").describe(), named(" ").describe());
}

#[test]
fn nested_tuples_and_flat_tuples_describe_different_keys() {
    let flat = (Route, Global, PeerIp);
    let left = ((Route, Global), PeerIp);
    let right = (Route, (Global, PeerIp));
    let all = [flat.describe(), left.describe(), right.describe()];
    assert_eq!(all[0].as_deref(), Some("(route,global,peer-ip/64)"));
    assert_eq!(all[1].as_deref(), Some("((route,global),peer-ip/64)"));
    assert_eq!(all[2].as_deref(), Some("(route,(global,peer-ip/64))"));
    // `or` is not a tuple, whichever side is first.
    assert_ne!(Route.or(Global).describe(), (Route, Global).describe());
    assert_ne!(Route.or(Global).describe(), Global.or(Route).describe());
}

/// The clock of the give-back test, moved on by [`StepKey`] when armed.
static STEP: OnceLock<Mutex<Option<(ManualClock, Duration)>>> = OnceLock::new();
static ARMED: AtomicBool = AtomicBool::new(false);

/// A key whose first Redis name written while [`ARMED`] moves the clock on: a give-back that
/// takes that long to reach Redis, so that the ones after it leave after their lease ends.
#[derive(Clone, Debug)]
struct StepKey(u32);

impl PartialEq for StepKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for StepKey {}
impl Hash for StepKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl RedisKey for StepKey {
    fn write_key(&self, out: &mut Vec<u8>) {
        if ARMED.swap(false, Ordering::SeqCst) {
            if let Some((time, by)) = &*STEP.get_or_init(Mutex::default).lock().unwrap() {
                time.advance(*by);
            }
        }
        self.0.write_key(out)
    }
}

#[tokio::test]
async fn return_leases_never_sends_a_give_back_after_its_lease_expired() {
    const KEYS: u32 = 300;
    const HOLD: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    *STEP.get_or_init(Mutex::default).lock().unwrap() = Some((time.clone(), HOLD * 2));
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5))
        .deny_cache(0)
        .lease(Lease::new(2, HOLD));
    // One per minute, burst 10: Redis restores nothing worth a unit within the test.
    let quota = Quota::per_hour(60).burst(10);
    let a = RedisRateLimiter::<StepKey>::builder(store.clone(), quota.clone())
        .name("steps")
        .clock(clock.clone())
        .build();
    // Per key: a request alone, then one that takes a batch of 2 and holds 1.
    for k in 0..KEYS {
        assert!(a.check(&StepKey(k)).await.is_allowed());
        assert!(a.check(&StepKey(k)).await.is_allowed());
    }
    assert_eq!(a.leased(), 0);
    // The first give-back reaches Redis two holds later: every other lease has expired by
    // the time its give-back would leave.
    ARMED.store(true, Ordering::SeqCst);
    a.return_leases().await;
    ARMED.store(false, Ordering::SeqCst);
    let plain = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .deny_cache(0);
    let reader = RedisRateLimiter::<StepKey>::builder(plain, quota)
        .name("steps")
        .clock(clock)
        .build();
    let mut remaining = [0u32; 11];
    for k in 0..KEYS {
        let left = reader.peek(&StepKey(k)).await.remaining() as usize;
        remaining[left] += 1;
    }
    // 3 taken of 10 per key, 1 of them given back in time: one key at 8, the rest at 7.
    let mut expected = [0u32; 11];
    expected[8] = 1;
    expected[7] = KEYS - 1;
    assert_eq!(remaining, expected);
}

/// An instance of `per_minute(60).burst(40)` leasing batches of up to 16 for 100 ms, on a
/// connection of its own and without a deny cache (every refusal is Redis's).
async fn leasing(server: &RedisServer, clock: &Clock) -> RedisRateLimiter<&'static str> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .lease(Lease::new(16, Duration::from_millis(100)));
    RedisRateLimiter::builder(store, Quota::per_minute(60).burst(40))
        .name("flushed")
        .clock(clock.clone())
        .build()
}

/// Admits requests on `limiter` until it holds 15 units (batches 1, 2, 4, 8, 16: 31 taken).
async fn hold_fifteen(limiter: &RedisRateLimiter<&'static str>) {
    for _ in 0..16 {
        assert!(limiter.check(&"k").await.is_allowed());
    }
}

/// Admits requests of cost 1 for `"k"` until one is refused; how many.
async fn flood(limiter: &RedisRateLimiter<&'static str>) -> u32 {
    let mut admitted = 0;
    while limiter.check(&"k").await.is_allowed() {
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn a_give_back_into_a_flushed_key_never_lifts_it_above_its_burst() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    let b = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    // Redis loses every key while A holds 15 units of a live lease.
    server.cli(&["FLUSHALL"]).unwrap();
    time.advance(Duration::from_millis(50));
    a.return_leases().await;
    // The key is at its burst again, and the 15 given back add nothing to it.
    assert_eq!(flood(&b).await, 40);
    assert_eq!(flood(&a).await, 0);
}

#[tokio::test]
async fn a_give_back_after_a_restart_never_lifts_the_key_above_its_burst() {
    let mut server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    server.restart();
    time.advance(Duration::from_millis(50));
    // The connection comes back on its own; the give-back may be lost on the way, never more.
    a.return_leases().await;
    let b = leasing(&server, &clock).await;
    assert_eq!(flood(&b).await, 40);
}

#[tokio::test]
async fn units_held_when_redis_loses_the_key_are_still_spent_within_their_hold() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    let b = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    server.cli(&["FLUSHALL"]).unwrap();
    // B gets a whole burst from the emptied key; A still spends the 15 Redis granted before.
    assert_eq!(flood(&b).await, 40);
    let mut from_lease = 0;
    while a.check(&"k").await.is_allowed() {
        from_lease += 1;
    }
    assert_eq!(from_lease, 15);
    // One hold later nothing is left anywhere.
    time.advance(Duration::from_millis(100));
    assert_eq!(flood(&a).await, 0);
    assert_eq!(flood(&b).await, 0);
}

/// A store whose Redis never answers (a port nothing listens on), falling back to `share`;
/// after its first failure it tries Redis once an hour, so that the fallback decides at once.
fn unreachable(share: Share) -> RedisStore {
    let port = common::redis_server::free_port();
    RedisStore::open(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(200))
        .on_failure(FailMode::Local(share))
        .probe_every(Duration::from_secs(3_600))
}

#[tokio::test]
async fn ten_instances_at_a_tenth_of_five_per_minute_admit_ten_at_once_then_five_per_minute() {
    let (clock, time) = Clock::manual();
    let instances: Vec<RedisRateLimiter<&'static str>> = (0..10)
        .map(|_| {
            RedisRateLimiter::builder(unreachable(Share::one_in(10)), Quota::per_minute(5))
                .name("login")
                .clock(clock.clone())
                .build()
        })
        .collect();
    // Each instance: burst max(1, ⌊5 / 10⌋) = 1, then one per 2 minutes.
    let mut per_minute = Vec::new();
    for minute in 0..=10 {
        if minute > 0 {
            time.advance(Duration::from_secs(60));
        }
        let mut admitted = 0;
        for i in &instances {
            loop {
                let d = i.check(&"k").await;
                assert!(d.is_degraded() && d.is_local());
                if !d.is_allowed() {
                    break;
                }
                admitted += 1;
            }
        }
        per_minute.push(admitted);
    }
    assert_eq!(per_minute, [10, 0, 10, 0, 10, 0, 10, 0, 10, 0, 10]);
    // The documented bound over the 10 minutes: 10 × 1 + 5 per minute × 10 = 60, exactly.
    assert_eq!(per_minute.iter().sum::<u32>(), 60);
}

type Body = http_body_util::Full<bytes::Bytes>;

fn api_req(api_key: &str) -> http::Request<Body> {
    http::Request::get("/")
        .header("x-api-key", api_key)
        .body(Body::default())
        .unwrap()
}

/// A layer of 3 per minute per `x-api-key`, named `api`, on a store that fails as `mode`
/// and probes once per 5 s during an outage.
async fn api_layer(
    server: &RedisServer,
    mode: FailMode,
) -> tollgate::RateLimitLayer<Header, RedisStore> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .on_failure(mode)
        .probe_every(Duration::from_secs(5));
    tollgate::RateLimitLayer::new(tollgate::Policy::new("api", Quota::per_minute(3)))
        .key(Header::new("x-api-key"))
        .store(store)
}

/// The Redis name of the key `api_key` under `layer`'s policy `api`.
fn redis_name(layer: &tollgate::RateLimitLayer<Header, RedisStore>, api_key: &str) -> String {
    let limiter = layer.limiter("api").unwrap().unwrap();
    String::from_utf8(limiter.redis_key(&Box::from(api_key.as_bytes()))).unwrap()
}

/// Makes the Redis key `name` a hash, as another program would.
fn poison_name(port: &str, name: &str) {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", port, "HSET", name, "f", "v"])
        .output()
        .unwrap();
    assert!(out.status.success());
}

async fn status<S>(svc: &mut S, api_key: &str) -> u16
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    let resp = svc
        .ready()
        .await
        .unwrap()
        .call(api_req(api_key))
        .await
        .unwrap();
    resp.status().as_u16()
}

fn ok_service() -> impl tower::Service<
    http::Request<Body>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: http::Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::default()))
    })
}

#[tokio::test]
async fn a_key_error_under_dry_run_lets_the_request_through_and_trips_no_outage() {
    use tower::Layer;
    let server = RedisServer::start();
    let layer = api_layer(&server, FailMode::Closed).await.dry_run(true);
    let port = server.url().rsplit(':').next().unwrap().to_owned();
    poison_name(&port, &redis_name(&layer, "bad"));
    let layer_again = layer.clone();
    let mut svc = layer.layer(ok_service());
    // Dry run never refuses: not the broken key, nor the others after it.
    let statuses = [
        status(&mut svc, "bad").await,
        status(&mut svc, "bad").await,
        status(&mut svc, "good").await,
    ];
    assert_eq!(statuses, [200, 200, 200]);
    // The broken key is still broken: dry run wrote nothing over it.
    let name = redis_name(&layer_again, "bad");
    assert_eq!(server.cli(&["TYPE", &name]).unwrap().trim(), "hash");
}

#[tokio::test]
async fn a_key_error_under_the_local_fallback_is_refused_and_other_keys_stay_on_redis() {
    use tower::Layer;
    let server = RedisServer::start();
    let layer = api_layer(&server, FailMode::local(0.5)).await;
    let port = server.url().rsplit(':').next().unwrap().to_owned();
    poison_name(&port, &redis_name(&layer, "bad"));
    let mut svc = layer.layer(ok_service());
    // The broken key: 503 each time, never decided by the fallback (which would admit 1).
    for _ in 0..3 {
        assert_eq!(status(&mut svc, "bad").await, 503);
    }
    // Another key has its whole quota from Redis (the fallback would give 1 of 3).
    let mut good = Vec::new();
    for _ in 0..4 {
        good.push(status(&mut svc, "good").await);
    }
    assert_eq!(good, [200, 200, 200, 429]);
}

#[tokio::test]
async fn a_refund_that_meets_a_key_error_is_no_outage_for_other_clients() {
    use tower::Layer;
    let server = RedisServer::start();
    let layer = api_layer(&server, FailMode::Closed)
        .await
        .count_if(|res| res.status == http::StatusCode::UNAUTHORIZED);
    let port = server.url().rsplit(':').next().unwrap().to_owned();
    let bad = redis_name(&layer, "bad");
    // The handler breaks the key between the decision and the refund of its success.
    let handler = tower::service_fn(move |req: http::Request<Body>| {
        let (port, bad) = (port.clone(), bad.clone());
        async move {
            if req.headers()["x-api-key"] == "bad" {
                let out = std::process::Command::new("redis-cli")
                    .args(["-p", &port, "DEL", &bad])
                    .output()
                    .unwrap();
                assert!(out.status.success());
                poison_name(&port, &bad);
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::default()))
        }
    });
    let mut svc = layer.layer(handler);
    assert_eq!(status(&mut svc, "bad").await, 200);
    // The refund failed on the broken key: with probing every 5 s and fail-closed, an
    // outage would answer the next requests 503. Another client gets its whole quota.
    let mut good = Vec::new();
    for _ in 0..5 {
        good.push(status(&mut svc, "good").await);
    }
    assert_eq!(good, [200, 200, 200, 200, 200]);
    // The broken key itself is refused as unavailable, whatever its refund did.
    assert_eq!(status(&mut svc, "bad").await, 503);
}

#[tokio::test]
async fn a_share_too_small_to_stretch_the_period_still_builds_and_admits_one_in_over_a_century() {
    let (clock, time) = Clock::manual();
    let share = Share::one_in(u32::MAX);
    for quota in [
        Quota::per_minute(1),
        Quota::per_day(3).burst(1_000),
        Quota::fixed_window(1, Duration::from_secs(86_400)),
        Quota::sliding_log(2, Duration::from_secs(3_600)),
    ] {
        let l = RedisRateLimiter::<&'static str>::builder(unreachable(share), quota.clone())
            .name("tiny")
            .clock(clock.clone())
            .try_build()
            .unwrap_or_else(|e| panic!("{quota:?}: {e}"));
        assert!(l.check(&"k").await.is_allowed(), "{quota:?}");
        time.advance(Duration::from_secs(100 * 365 * 86_400));
        let d = l.check(&"k").await;
        assert!(d.is_local() && !d.is_allowed(), "{quota:?}");
    }
}

/// `n` decisions of cost 1 for `"k"` at once on `l`, with Redis stopped and the tokio clock
/// paused (it moves only to the next timer): how long each waited, in the clock's time.
async fn waits_while_stopped(l: &RedisRateLimiter<&'static str>, n: usize) -> Vec<Duration> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let l = l.clone();
        tasks.spawn(async move {
            let started = tokio::time::Instant::now();
            let _ = l.check(&"k").await;
            started.elapsed()
        });
    }
    let mut waits = Vec::new();
    while let Some(w) = tasks.join_next().await {
        waits.push(w.unwrap());
    }
    waits
}

#[tokio::test]
async fn with_leases_and_redis_stopped_no_decision_waits_longer_than_the_timeout() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let timeout = Duration::from_millis(400);
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(timeout)
        .on_failure(FailMode::local(0.5))
        .lease(Lease::new(8, Duration::from_millis(120)));
    let l = RedisRateLimiter::<&'static str>::builder(store, Quota::per_minute(60).burst(20))
        .name("stopped")
        .clock(clock)
        .build();
    // Batches 1 and 2, then the held unit: the next request asks for a batch of 4.
    for _ in 0..3 {
        assert!(l.check(&"k").await.is_allowed());
    }
    server.pause();
    tokio::time::pause();
    let waits = waits_while_stopped(&l, 6).await;
    // A second round finds the store down: each decides at once or within one timeout.
    let again = waits_while_stopped(&l, 6).await;
    tokio::time::resume();
    server.resume();
    // Tokio's timers fire on whole milliseconds: one timeout is up to 1 ms more here.
    let one = timeout + Duration::from_millis(1);
    assert_eq!(waits.len(), 6);
    assert!(waits.iter().all(|w| *w <= one), "{waits:?}");
    assert!(again.iter().all(|w| *w <= one), "{again:?}");
}

#[tokio::test]
async fn return_leases_of_a_thousand_keys_with_redis_stopped_takes_one_timeout() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let timeout = Duration::from_millis(300);
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(timeout)
        .lease(Lease::new(2, Duration::from_secs(10)));
    let l = RedisRateLimiter::<u32>::builder(store, Quota::per_minute(60).burst(20))
        .name("shutdown")
        .clock(clock)
        .build();
    for k in 0..1_000u32 {
        assert!(l.check(&k).await.is_allowed());
        assert!(l.check(&k).await.is_allowed());
    }
    server.pause();
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    l.return_leases().await;
    let took = started.elapsed();
    tokio::time::resume();
    server.resume();
    // One timeout for all (tokio's timers fire on whole milliseconds), not one per key.
    assert!(took <= timeout + Duration::from_millis(1), "{took:?}");
}

#[test]
fn whatever_the_lease_state_and_failure_mode_a_decision_with_redis_stopped_waits_one_timeout() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let timeout = Duration::from_millis(250);
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    runner
        .run(
            &(
                0..20u32,
                any::<bool>(),
                prop::collection::vec(1..=4u32, 1..10),
                1..=16u32,
                0..3u8,
                any::<bool>(),
            ),
            |(warm, expired, costs, max_batch, mode, penalty)| {
                case.set(case.get() + 1);
                let mode = match mode {
                    0 => FailMode::Open,
                    1 => FailMode::Closed,
                    _ => FailMode::local(0.5),
                };
                let waits = rt.block_on(async {
                    let (clock, time) = Clock::manual();
                    let store = RedisStore::connect(&server.url())
                        .await
                        .unwrap()
                        .timeout(timeout)
                        .on_failure(mode)
                        .lease(Lease::new(max_batch, Duration::from_millis(100)));
                    let mut b = RedisRateLimiter::<&'static str>::builder(
                        store,
                        Quota::per_minute(600).burst(30),
                    )
                    .name(format!("case-{}", case.get()))
                    .clock(clock);
                    if penalty {
                        b = b.penalty_box(tollgate::penalty::PenaltyBox::new(
                            3,
                            Duration::from_secs(60),
                            Duration::from_secs(60),
                        ));
                    }
                    let l = b.build();
                    for _ in 0..warm {
                        let _ = l.check(&"k").await;
                    }
                    if expired {
                        time.advance(Duration::from_millis(100));
                    }
                    server.pause();
                    tokio::time::pause();
                    let mut tasks = tokio::task::JoinSet::new();
                    for cost in costs {
                        let l = l.clone();
                        tasks.spawn(async move {
                            let started = tokio::time::Instant::now();
                            let _ = l.check_n(&"k", cost).await;
                            started.elapsed()
                        });
                    }
                    let mut waits = Vec::new();
                    while let Some(w) = tasks.join_next().await {
                        waits.push(w.unwrap());
                    }
                    tokio::time::resume();
                    server.resume();
                    waits
                });
                // Tokio's timers fire on whole milliseconds.
                let one = timeout + Duration::from_millis(1);
                prop_assert!(waits.iter().all(|w| *w <= one), "{:?}", waits);
                Ok(())
            },
        )
        .unwrap();
}

/// A layer of `quota` per `x-api-key` on its own connection (a process of its own).
async fn process(
    server: &RedisServer,
    policy: tollgate::Policy,
) -> tollgate::RateLimitLayer<Header, RedisStore> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0);
    tollgate::RateLimitLayer::new(policy)
        .key(Header::new("x-api-key"))
        .store(store)
}

/// Requests of `"k"` through `a`, then `b`, until each refuses one: what each admitted.
async fn admitted_by_each(
    a: &tollgate::RateLimitLayer<Header, RedisStore>,
    b: &tollgate::RateLimitLayer<Header, RedisStore>,
) -> [u32; 2] {
    use tower::Layer;
    let mut out = [0; 2];
    for (n, layer) in out.iter_mut().zip([a, b]) {
        let mut svc = layer.clone().layer(ok_service());
        while status(&mut svc, "k").await == 200 {
            *n += 1;
        }
    }
    out
}

#[tokio::test]
async fn an_unnamed_limit_changed_live_keeps_its_names_and_a_process_started_with_the_new_quotas_counts_apart(
) {
    let server = RedisServer::start();
    // Process A was built with 3 per minute and is raised to 5 through its handle; process B
    // starts later from the new configuration, 5 per minute.
    let a = process(&server, Quota::per_minute(3).into()).await;
    a.handle()
        .unwrap()
        .set_default_quotas([Quota::per_minute(5)])
        .unwrap();
    let b = process(&server, Quota::per_minute(5).into()).await;
    let k: Box<[u8]> = Box::from(&b"k"[..]);
    let name_a = a.limiter("3-per-1m").unwrap().unwrap().redis_key(&k);
    let name_b = b.limiter("5-per-1m").unwrap().unwrap().redis_key(&k);
    assert_ne!(name_a, name_b);
    // Each counts in its own key: the fleet admits twice the limit.
    assert_eq!(admitted_by_each(&a, &b).await, [5, 5]);
    // Named, the two processes share one key whatever their quotas were at build.
    let a = process(&server, tollgate::Policy::new("keys", Quota::per_minute(3))).await;
    a.handle()
        .unwrap()
        .set_default_quotas([Quota::per_minute(5)])
        .unwrap();
    let b = process(&server, tollgate::Policy::new("keys", Quota::per_minute(5))).await;
    assert_eq!(admitted_by_each(&a, &b).await, [5, 0]);
}

#[tokio::test]
async fn two_programs_with_unnamed_limiters_of_one_key_type_share_their_keys_and_names_part_them() {
    let server = RedisServer::start();
    let limiter = |name: Option<&'static str>| {
        let server_url = server.url();
        async move {
            let store = RedisStore::connect(&server_url)
                .await
                .unwrap()
                .deny_cache(0);
            let b = RedisRateLimiter::<u64>::builder(store, Quota::per_minute(3));
            match name {
                Some(n) => b.name(n).build(),
                None => b.build(),
            }
        }
    };
    // User 7 in one program, order 7 in another: one key.
    let (users, orders) = (limiter(None).await, limiter(None).await);
    assert_eq!(users.redis_key(&7), orders.redis_key(&7));
    for _ in 0..3 {
        assert!(users.check(&7).await.is_allowed());
    }
    assert!(!orders.check(&7).await.is_allowed());
    // Named, they never meet.
    let (users, orders) = (limiter(Some("users")).await, limiter(Some("orders")).await);
    for _ in 0..3 {
        assert!(users.check(&7).await.is_allowed());
    }
    assert!(orders.check(&7).await.is_allowed());
}

#[test]
fn the_local_fallback_never_admits_more_than_its_burst_plus_the_share_of_the_rate() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let period = prop_oneof![Just(1u64), Just(60), Just(3_600), Just(86_400)];
    // One store per share, down from its first call on.
    let stores = std::cell::RefCell::new(std::collections::HashMap::new());
    runner
        .run(
            &(
                1..=200u32,
                1..=200u32,
                period,
                prop_oneof![1..=1_000u64, (1..=64u64).prop_map(|n| 1_000 / n)],
                prop::collection::vec((0..=3u64, 1..=3u32), 1..60),
            ),
            |(count, burst, period_s, per_mille, steps)| {
                let share = Share::new(per_mille as f64 / 1_000.0);
                let store = stores
                    .borrow_mut()
                    .entry(per_mille)
                    .or_insert_with(|| rt.block_on(async { unreachable(share) }))
                    .clone();
                let quota = Quota::new(count, Duration::from_secs(period_s)).burst(burst);
                let scaled_burst = u64::from(burst) * per_mille / 1_000;
                let admitted = rt.block_on(async {
                    let (clock, time) = Clock::manual();
                    let l = RedisRateLimiter::<&'static str>::builder(store, quota)
                        .name("bound")
                        .clock(clock)
                        .build();
                    let mut admitted = Vec::new();
                    let mut elapsed = 0u128;
                    // Each step: the clock moves on by 0 to 3 tenths of the period, then
                    // requests of one cost until one is refused.
                    for (tenths, cost) in steps {
                        let by = Duration::from_secs(period_s) * tenths as u32 / 10;
                        time.advance(by);
                        elapsed += by.as_nanos();
                        let mut n = 0u64;
                        while l.check_n(&"k", cost).await.is_allowed() {
                            n += u64::from(cost);
                        }
                        admitted.push((elapsed, n));
                    }
                    admitted
                });
                // Over [0, t]: at most max(1, ⌊burst × share⌋) + share × rate × t.
                let mut total = 0u64;
                for (t, n) in admitted {
                    total += n;
                    let rate_part = u128::from(count) * u128::from(per_mille) * t
                        / (1_000 * u128::from(period_s) * 1_000_000_000);
                    let bound = scaled_burst.max(1) + rate_part as u64;
                    prop_assert!(
                        total <= bound,
                        "{} admitted by {} ns, bound {}",
                        total,
                        t,
                        bound
                    );
                }
                Ok(())
            },
        )
        .unwrap();
}

#[tokio::test]
async fn a_key_the_redis_user_may_not_touch_is_refused_and_is_no_outage() {
    let server = RedisServer::start();
    // A Redis user that may only touch the keys of the policy `api`.
    server
        .cli(&[
            "ACL",
            "SETUSER",
            "limited",
            "on",
            ">secret",
            "~tollgate:3:api:*",
            "+@all",
        ])
        .unwrap();
    let url = server.url().replace("redis://", "redis://limited:secret@");
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .on_failure(FailMode::Open)
        .probe_every(Duration::from_secs(5));
    let (clock, _time) = Clock::manual();
    let limiter = |name: &'static str| {
        RedisRateLimiter::<u64>::builder(store.clone(), Quota::per_minute(3))
            .name(name)
            .clock(clock.clone())
            .build()
    };
    let (api, other) = (limiter("api"), limiter("other"));
    assert!(api.check(&1).await.is_allowed());
    // The user may not touch `other`'s keys: that is a misconfiguration, refused every time,
    // never admitted as if Redis were down.
    for _ in 0..3 {
        let d = other.check(&1).await;
        assert!(d.is_degraded() && !d.is_allowed(), "{d:?}");
    }
    // Redis answers the keys it may: no outage, no probing.
    for _ in 0..2 {
        let d = api.check(&1).await;
        assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
    }
    assert!(!api.check(&1).await.is_allowed());
}

#[test]
fn shares_outside_zero_to_one_are_configuration_errors_and_the_edges_inside_are_not() {
    for bad in [
        0.0,
        -0.0,
        -1.0,
        1.0 + f64::EPSILON,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ] {
        assert!(FailMode::try_local(bad).is_err(), "{bad}");
        assert!(Share::try_new(bad).is_err(), "{bad}");
    }
    for good in [f64::MIN_POSITIVE, 1e-300, 0.5, 1.0] {
        assert_eq!(Share::new(good).get(), good);
    }
    assert!(Share::try_one_in(0).is_err());
    assert_eq!(Share::one_in(1).get(), 1.0);
}

#[tokio::test]
async fn two_limits_named_alike_with_quotas_of_other_kinds_are_refused_loudly_not_switched_off() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .on_failure(FailMode::Open);
    let (clock, _time) = Clock::manual();
    let gcra = RedisRateLimiter::<u64>::builder(store.clone(), Quota::per_minute(3))
        .name("login")
        .clock(clock.clone())
        .build();
    let log =
        RedisRateLimiter::<u64>::builder(store, Quota::sliding_log(3, Duration::from_secs(60)))
            .name("login")
            .clock(clock)
            .build();
    assert!(gcra.check(&1).await.is_allowed());
    // Named alike on purpose, they share the key; the other layout is refused, never admitted.
    let mut refused = 0;
    for _ in 0..5 {
        let d = log.check(&1).await;
        assert!(d.is_degraded() && !d.is_allowed(), "{d:?}");
        refused += 1;
    }
    assert_eq!(refused, 5);
    // The GCRA limit still counts its own: 2 more of 3.
    assert!(gcra.check(&1).await.is_allowed());
    assert!(gcra.check(&1).await.is_allowed());
    assert!(!gcra.check(&1).await.is_allowed());
}
