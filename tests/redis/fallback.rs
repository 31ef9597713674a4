//! The local fallback of the Redis store (`FailMode::Local`): while Redis does not answer, each
//! limiter decides in memory on its quotas scaled to the share, and Redis decides again once
//! it answers. Against a real `redis-server` started by each test (see
//! `common/redis_server.rs`), killed, paused or never there (a closed port).
//!
//! Pins docs/design.md section 3 ("Redis": fall back locally).

#![cfg(feature = "redis")]

use crate::common;

use std::time::{Duration, Instant};

use tokio::time::{pause, resume};

use common::capture::Captured;
use common::redis_server::{free_port, RedisServer};
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore, Share};
use tollgate::{Clock, ConfigError, Decision, Outcome, Quota, RateLimiter};

/// The stores' timeout: long enough for a loaded machine to get Redis's answer, since a
/// decision Redis should make must not fall back because the test was held back. The outages
/// run on tokio's paused clock, where the timeout passes as soon as nothing else can happen,
/// and exactly: a wait the test asserts is never the machine's speed. Longer than the
/// connection's own timeout (1 s), so a decision cut at exactly this was cut by the store.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Tokio's timers fire on whole milliseconds: a timeout ends within one of its due time.
const TICK: Duration = Duration::from_millis(1);

/// A store on a loopback port nobody listens on, deciding locally at `share`.
fn unreachable(share: f64) -> RedisStore {
    RedisStore::open(&format!("redis://127.0.0.1:{}", free_port()))
        .unwrap()
        .timeout(TIMEOUT)
        .on_failure(FailMode::local(share))
}

fn limiter(store: RedisStore, quotas: &[Quota], name: &str, clock: Clock) -> RedisRateLimiter<u64> {
    quotas[1..]
        .iter()
        .fold(
            RedisRateLimiter::<u64>::builder(store, quotas[0].clone()).name(name.to_owned()),
            |b, q| b.quota(q.clone()),
        )
        .clock(clock)
        .build()
}

/// A decision during an outage, and that it came within the timeout: on tokio's paused clock,
/// which moves only when nothing else can happen, so the bound is exact whatever the load.
async fn timed(limiter: &RedisRateLimiter<u64>, key: u64, cost: u32) -> Decision {
    let t = tokio::time::Instant::now();
    let d = limiter.check_n(&key, cost).await;
    let took = t.elapsed();
    assert!(took <= TIMEOUT + TICK, "a decision took {took:?}");
    d
}

/// Polls with cost-0 decisions (which take nothing, from Redis or locally) until Redis
/// decides again.
async fn until_redis_decides(limiter: &RedisRateLimiter<u64>, key: u64) -> Decision {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = limiter.peek(&key).await;
        if !d.is_degraded() {
            return d;
        }
        assert!(Instant::now() < deadline, "Redis not used again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Each kind of quota, at half its count and burst: the policy, and the same quotas written
/// out at half by hand.
fn halves() -> Vec<(&'static str, Vec<Quota>, Vec<Quota>)> {
    let min = Duration::from_secs(60);
    vec![
        (
            "gcra",
            vec![Quota::per_minute(8).burst(12)],
            vec![Quota::per_minute(4).burst(6)],
        ),
        (
            "fixed",
            vec![Quota::fixed_window(8, min)],
            vec![Quota::fixed_window(4, min)],
        ),
        (
            "log",
            vec![Quota::sliding_log(8, min)],
            vec![Quota::sliding_log(4, min)],
        ),
        (
            "counter",
            vec![Quota::sliding_window(8, min)],
            vec![Quota::sliding_window(4, min)],
        ),
        (
            "warm",
            vec![Quota::per_minute(8).warm_up(min, 3)],
            vec![Quota::per_minute(4).warm_up(min, 3)],
        ),
        (
            "two",
            vec![Quota::per_second(3), Quota::sliding_log(10, min)],
            // 1.5 per second rounds down to 1.
            vec![Quota::per_second(1), Quota::sliding_log(5, min)],
        ),
        (
            "tiny",
            vec![Quota::per_hour(1)],
            // Half of one an hour: one every two hours.
            vec![Quota::new(1, Duration::from_secs(7_200))],
        ),
    ]
}

fn memory(quotas: &[Quota], clock: Clock) -> RateLimiter<u64> {
    quotas[1..]
        .iter()
        .fold(RateLimiter::builder(quotas[0].clone()), |b, q| {
            b.quota(q.clone())
        })
        .clock(clock)
        .build()
}

/// Redis never reachable: every decision comes within the timeout, from the fallback, and is
/// exactly the decision of a memory limiter on the halved quotas, step by step: a flood of one
/// key admits exactly half the burst, and the rest follows the scaled rate.
#[tokio::test(start_paused = true)]
async fn a_closed_port_decides_every_kind_locally_at_the_share_within_the_timeout() {
    let _serial = serial().await;
    let store = unreachable(0.5);
    // (ms since the start, cost)
    let mut steps: Vec<(u64, u32)> = vec![(0, 1); 15];
    steps.extend([
        (1_000, 1),
        (7_500, 1),
        (15_000, 2),
        (15_001, 1),
        (31_000, 1),
        (45_000, 1),
        (61_000, 1),
        (61_000, 1),
        (90_000, 3),
        (200_000, 1),
        (200_000, 1),
        (200_000, 1),
        (200_000, 1),
        (200_000, 1),
    ]);
    for (name, policy, halved) in halves() {
        let (clock, time) = Clock::manual();
        let fallback = limiter(store.clone(), &policy, name, clock.clone());
        let twin = memory(&halved, clock);
        let start = time.now();
        let policy_burst = policy.iter().map(Quota::burst_size).min().unwrap();
        let mut flood_admitted = 0;
        for (i, &(at, cost)) in steps.iter().enumerate() {
            time.advance(start + Duration::from_millis(at) - time.now());
            let d = timed(&fallback, 1, cost).await;
            let want = twin.check_n(&1, cost);
            let ctx = format!("{name} step {i} (t = {at} ms, cost {cost})");
            assert!(d.is_degraded() && d.is_local(), "{ctx}");
            if want.outcome() == Outcome::Exceeds && cost <= policy_burst {
                // Above the halved burst, within the policy's: not now, maybe once Redis is back.
                assert_eq!(d.outcome(), Outcome::Limited, "{ctx}");
                assert_eq!(d.retry_after(), Some(Duration::from_secs(1)), "{ctx}");
            } else {
                assert_eq!(d.outcome(), want.outcome(), "{ctx}");
                assert_eq!(d.retry_after(), want.retry_after(), "{ctx}");
            }
            assert_eq!(d.states(), want.states(), "{ctx}");
            if i < 15 && d.is_allowed() {
                flood_admitted += 1;
            }
        }
        let burst = halved.iter().map(Quota::burst_size).min().unwrap();
        // Half the burst exactly (for the warm-up quota, what the halved quota's cold key
        // admits: its first requests cost more).
        let cold = if name == "warm" { 2 } else { burst };
        assert_eq!(flood_admitted, cold, "{name}");
        // Another key has its own state.
        assert!(timed(&fallback, 2, 1).await.is_allowed(), "{name}");
    }
}

/// A flood of concurrent callers on one key, from many tasks on many threads: the fallback
/// admits exactly the share of the burst, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_flood_during_an_outage_gets_exactly_the_share() {
    let _serial = serial().await;
    let limiter = limiter(
        unreachable(0.25),
        &[Quota::per_hour(100)],
        "flood",
        Clock::system(),
    );
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.check(&7).await })
        })
        .collect();
    let mut admitted = 0;
    for c in calls {
        let d = c.await.unwrap();
        assert!(d.is_local());
        admitted += u32::from(d.is_allowed());
    }
    assert_eq!(admitted, 25);
}

/// Redis killed mid-traffic, then restarted without its data: the fallback admits its share
/// during the outage, and once Redis answers it decides from its (empty) state: one burst,
/// no more, and nothing the fallback admitted is added on top.
#[tokio::test]
async fn redis_killed_then_restarted_empty_decides_again_with_no_extra_burst_nor_fresh_share() {
    let _serial = serial().await;
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(TIMEOUT)
        .on_failure(FailMode::local(0.5))
        // Every decision asks Redis: none is answered by a rejection it cached.
        .deny_cache(0);
    let (clock, _time) = Clock::manual();
    let limiter = limiter(store, &[Quota::per_hour(10)], "killed", clock);
    for n in 1..=4 {
        let d = limiter.check(&1).await;
        assert!(d.is_allowed() && !d.is_degraded());
        assert_eq!(d.remaining(), 10 - n);
    }

    server.kill();
    pause();
    let during: Vec<Decision> = {
        let mut v = Vec::new();
        for _ in 0..10 {
            v.push(timed(&limiter, 1, 1).await);
        }
        v
    };
    assert!(during.iter().all(|d| d.is_local()));
    assert_eq!(during.iter().filter(|d| d.is_allowed()).count(), 5);
    let last = during.last().unwrap();
    assert_eq!(last.outcome(), Outcome::Limited);
    // The halved quota: 5 per hour, one back every 12 minutes.
    assert_eq!(last.retry_after(), Some(Duration::from_secs(720)));
    resume();

    server.restart();
    let d = until_redis_decides(&limiter, 1).await;
    // A restart lost the key: Redis starts it from its full burst.
    assert_eq!(d.remaining(), 10);
    let mut after = 0;
    for _ in 0..20 {
        let d = limiter.check(&1).await;
        assert!(!d.is_degraded());
        after += u32::from(d.is_allowed());
    }
    assert_eq!(after, 10);

    // A second outage finds the fallback's state as the first left it: no fresh share.
    server.kill();
    pause();
    let d = timed(&limiter, 1, 1).await;
    assert!(d.is_local());
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(720)));
}

/// Redis paused (SIGSTOP): every decision times out and the fallback decides, at its share.
/// Resumed (SIGCONT): Redis decides again, from the state it kept, and never admits beyond
/// its quota: the requests that timed out may still have run there (they were sent), which
/// only makes it stricter.
#[tokio::test]
async fn redis_paused_falls_back_within_the_timeout_and_resumed_decides_from_its_state() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(TIMEOUT)
        .on_failure(FailMode::local(0.5));
    let (clock, _time) = Clock::manual();
    let limiter = limiter(store, &[Quota::per_hour(10)], "paused", clock);
    let mut by_redis = 0;
    for _ in 0..6 {
        let d = limiter.check(&1).await;
        assert!(d.is_allowed() && !d.is_degraded());
        by_redis += 1;
    }

    server.pause();
    pause();
    let mut local = 0;
    for _ in 0..10 {
        let t = tokio::time::Instant::now();
        let d = limiter.check(&1).await;
        // The timeout path: each decision waits the whole timeout, and no more.
        let took = t.elapsed();
        assert!(took >= TIMEOUT && took <= TIMEOUT + TICK, "{took:?}");
        assert!(d.is_local());
        local += u32::from(d.is_allowed());
    }
    assert_eq!(local, 5);
    resume();

    server.resume();
    let _ = until_redis_decides(&limiter, 1).await;
    for _ in 0..10 {
        let d = limiter.check(&1).await;
        assert!(!d.is_degraded(), "Redis decides after the pause");
        by_redis += u32::from(d.is_allowed());
    }
    // The ten calls that timed out were on the connection: Redis ran them once resumed, and
    // they spent the 4 left. Stricter, never looser: nothing more is admitted after.
    assert_eq!(by_redis, 6);
    let d = limiter.peek(&1).await;
    assert!(!d.is_degraded());
    assert_eq!(d.remaining(), 0);
}

/// The plain forms panic at the caller's line on a share out of range, as every plain form of
/// a setting does (crate docs, "Bad settings"); the `try_` forms return the error.
#[test]
#[should_panic(expected = "above 0 and at most 1")]
fn a_plain_local_share_out_of_range_panics() {
    let _ = FailMode::local(1.5);
}

#[test]
#[should_panic(expected = "tollgate:")]
fn a_plain_share_of_none_in_zero_panics() {
    let _ = Share::one_in(0);
}

#[test]
#[should_panic(expected = "above 0 and at most 1")]
fn a_plain_share_of_nan_panics() {
    let _ = Share::new(f64::NAN);
}

#[test]
fn shares_outside_zero_to_one_are_a_configuration_error() {
    for bad in [0.0, -0.0, -0.5, 1.000_001, 2.0, f64::NAN, f64::INFINITY] {
        let err = FailMode::try_local(bad).unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidFallbackShare(_)),
            "{bad}: {err:?}"
        );
        assert!(
            err.to_string().contains("above 0 and at most 1"),
            "{bad}: {err}"
        );
        assert!(Share::try_new(bad).is_err());
    }
    assert!(matches!(
        Share::try_one_in(0),
        Err(ConfigError::InvalidFallbackShare(_))
    ));
    for good in [f64::MIN_POSITIVE, 0.001, 0.5, 1.0] {
        assert_eq!(FailMode::local(good), FailMode::Local(Share::new(good)));
    }
    assert_eq!(Share::one_in(3).get(), 1.0 / 3.0);
}

/// A quota whose scaled form does not fit the clock (its count rounds down more than its
/// burst, so its tolerance grows) is refused when the limiter is built, not while serving.
#[tokio::test]
async fn a_quota_that_cannot_be_scaled_is_refused_at_build_time() {
    let _serial = serial().await;
    // Count 3, burst 6 over 2e18 ns: a tolerance of twice the period, within the clock's
    // range (2^62 ns); halved, count 1 and burst 3: three periods, beyond it.
    let quota = Quota::new(3, Duration::from_nanos(2_000_000_000_000_000_000)).burst(6);
    let err = RedisRateLimiter::<u64>::builder(unreachable(0.5), quota.clone())
        .try_build()
        .unwrap_err();
    assert_eq!(err, ConfigError::ToleranceTooLong);
    // At a share that keeps the count, it builds.
    assert!(RedisRateLimiter::<u64>::builder(unreachable(1.0), quota)
        .try_build()
        .is_ok());
}

/// Quotas changed while serving are scaled for the fallback too.
#[tokio::test(start_paused = true)]
async fn changed_quotas_are_scaled_for_the_fallback() {
    let _serial = serial().await;
    let (clock, _time) = Clock::manual();
    let limiter = limiter(unreachable(0.5), &[Quota::per_hour(10)], "changed", clock);
    limiter.set_quotas([Quota::per_hour(4)]).unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u32::from(timed(&limiter, 1, 1).await.is_allowed());
    }
    assert_eq!(admitted, 2);
}

/// A cost above the policy's burst can never be admitted, by Redis or by the fallback.
#[tokio::test(start_paused = true)]
async fn a_cost_above_the_policy_burst_never_fits_in_the_fallback_either() {
    let _serial = serial().await;
    let (clock, _time) = Clock::manual();
    let limiter = limiter(unreachable(0.5), &[Quota::per_hour(10)], "cost", clock);
    let d = timed(&limiter, 1, 11).await;
    assert_eq!(d.outcome(), Outcome::Exceeds);
    assert!(d.is_local());
    let d = timed(&limiter, 1, 6).await;
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    let d = timed(&limiter, 1, 5).await;
    assert!(d.is_allowed());
}

/// An outage is a few lines in the log, saying that the fallback decides, however many
/// decisions it takes; and one line when Redis is back.
#[tokio::test]
async fn an_outage_logs_the_fallback_in_a_few_lines() {
    let _serial = serial().await;
    let (out, _guard) = capture();
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(TIMEOUT)
        .on_failure(FailMode::Local(Share::one_in(4)));
    let (clock, _time) = Clock::manual();
    let limiter = limiter(store, &[Quota::per_hour(100)], "logged", clock);
    assert!(!limiter.check(&1).await.is_degraded());
    server.pause();
    pause();
    for _ in 0..5 {
        assert!(timed(&limiter, 1, 1).await.is_local());
    }
    resume();
    server.resume();
    let _ = until_redis_decides(&limiter, 1).await;
    let text = out.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate::redis"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains("Redis unavailable, deciding in this process at 25% of each quota"),
        "{text}"
    );
    assert!(lines[1].contains("Redis available again"), "{text}");
}

mod http_layer {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use http::{Request, Response, StatusCode};
    use tollgate::key::Header;
    use tollgate::{Policy, RateLimitLayer};
    use tower::ServiceExt;

    fn req(key: &str) -> Request<Body> {
        Request::get("/")
            .header("x-key", key)
            .body(Body::empty())
            .unwrap()
    }

    fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
        resp.headers().get(name).map(|v| v.to_str().unwrap())
    }

    async fn handler(d: Option<Decision>) -> String {
        match d {
            Some(d) if d.is_local() => format!("local, remaining {}", d.remaining()),
            Some(d) if d.is_degraded() => "degraded".into(),
            Some(d) => format!("remaining {}", d.remaining()),
            None => "none".into(),
        }
    }

    async fn body(resp: Response<Body>) -> String {
        let b = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        String::from_utf8(b.to_vec()).unwrap()
    }

    /// Redis unreachable, half of 4 per minute decided locally: the answers carry the fields
    /// of the halved quota, and the rejection is a 429 with the local Retry-After, not a 503.
    #[tokio::test]
    async fn a_local_rejection_is_a_429_with_retry_after_and_the_fields_of_the_scaled_quota() {
        let _serial = serial().await;
        let (clock, time) = Clock::manual();
        let app = Router::new().route("/", get(handler)).layer(
            RateLimitLayer::new(Policy::new("api", Quota::per_minute(4)))
                .key(Header::new("x-key"))
                .clock(clock)
                .store(unreachable(0.5)),
        );
        let resp = app.clone().oneshot(req("alice")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit-policy"), Some("\"api\";q=2;w=60"));
        assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=1;t=30"));
        assert_eq!(body(resp).await, "local, remaining 1");
        let resp = app.clone().oneshot(req("alice")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=0;t=60"));

        let resp = app.clone().oneshot(req("alice")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&resp, "retry-after"), Some("30"));
        assert_eq!(header(&resp, "ratelimit-policy"), Some("\"api\";q=2;w=60"));
        assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=0;t=60"));

        // Another key has its own local state; time gives back what the scaled rate allows.
        let resp = app.clone().oneshot(req("bob")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        time.advance(Duration::from_secs(30));
        let resp = app.clone().oneshot(req("alice")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=0;t=60"));
    }

    /// A change through the layer's handle reaches the fallback: its decisions and its
    /// fields are those of the new quotas, scaled.
    #[tokio::test]
    async fn a_change_while_serving_is_scaled_for_the_fallback_and_its_fields() {
        let _serial = serial().await;
        let (clock, _time) = Clock::manual();
        let layer = RateLimitLayer::new(Policy::new("api", Quota::per_minute(4)))
            .key(Header::new("x-key"))
            .clock(clock)
            .store(unreachable(0.5));
        let handle = layer.handle().unwrap();
        let app = Router::new().route("/", get(handler)).layer(layer);
        handle.set_default_quotas([Quota::per_minute(8)]).unwrap();
        for left in (0..4).rev() {
            let resp = app.clone().oneshot(req("k")).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(header(&resp, "ratelimit-policy"), Some("\"api\";q=4;w=60"));
            let want = format!("\"api\";r={left};t={}", 15 * (4 - left));
            assert_eq!(header(&resp, "ratelimit"), Some(want.as_str()));
        }
        let resp = app.clone().oneshot(req("k")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&resp, "retry-after"), Some("15"));
    }

    /// A layer that counts only failures: during the outage the fallback reserves each
    /// request's cost, and gives it back when the response does not count, as Redis would;
    /// a layer inside that rejects gets the cost given back too.
    #[tokio::test]
    async fn the_fallback_gives_back_what_count_if_does_not_count() {
        let _serial = serial().await;
        let (clock, _time) = Clock::manual();
        let app = Router::new()
            .route(
                "/",
                get(|h: http::HeaderMap| async move {
                    if h.contains_key("x-fail") {
                        StatusCode::UNAUTHORIZED
                    } else {
                        StatusCode::OK
                    }
                }),
            )
            .layer(
                RateLimitLayer::new(Policy::new("login", Quota::per_minute(4)))
                    .key(Header::new("x-key"))
                    .clock(clock)
                    .count_if(|r| r.status == StatusCode::UNAUTHORIZED)
                    .store(unreachable(0.5)),
            );
        let fail = || {
            Request::get("/")
                .header("x-key", "k")
                .header("x-fail", "1")
                .body(Body::empty())
                .unwrap()
        };
        // Successes cost nothing, however many.
        for _ in 0..10 {
            let resp = app.clone().oneshot(req("k")).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            // The fields after settling: nothing taken.
            assert_eq!(header(&resp, "ratelimit"), Some("\"login\";r=2;t=0"));
        }
        // Two failures spend the halved quota.
        for _ in 0..2 {
            assert_eq!(
                app.clone().oneshot(fail()).await.unwrap().status(),
                StatusCode::UNAUTHORIZED
            );
        }
        let resp = app.clone().oneshot(req("k")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&resp, "retry-after"), Some("30"));
    }

    /// Stacked: what the fallback admitted is given back to it when a layer inside rejects.
    #[tokio::test]
    async fn the_fallback_gets_back_what_an_inner_layer_rejected() {
        let _serial = serial().await;
        let (clock, _time) = Clock::manual();
        let inner = RateLimitLayer::new(Policy::new("inner", Quota::per_minute(1)))
            .key(Header::new("x-key"))
            .clock(clock.clone());
        let outer = RateLimitLayer::new(Policy::new("outer", Quota::per_minute(4)))
            .key(Header::new("x-key"))
            .clock(clock)
            .store(unreachable(0.5));
        let app = Router::new()
            .route("/", get(handler))
            .layer(inner)
            .layer(outer);
        assert_eq!(
            app.clone().oneshot(req("k")).await.unwrap().status(),
            StatusCode::OK
        );
        // The inner layer rejects (its own Retry-After of 60 s) every time: the outer one,
        // whose halved quota is 2, never runs out.
        for _ in 0..5 {
            let resp = app.clone().oneshot(req("k")).await.unwrap();
            assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(header(&resp, "retry-after"), Some("60"));
        }
    }
}

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs this file's tests one at a time: outages, and servers killed, paused and restarted.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A subscriber of this thread for the events of `tollgate::redis` at `INFO` and above,
/// whatever other tests' threads log meanwhile (see `common::capture::capture`).
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    common::capture::capture(tracing::Level::INFO)
}

#[tokio::test]
async fn ten_instances_at_a_tenth_of_five_a_minute_admit_the_quota_plus_one_each_at_most() {
    // A login limit of 5 a minute, ten instances at a tenth each, Redis unreachable: each
    // instance's share is one request per 2 minutes, burst 1.
    let (clock, time) = Clock::manual();
    let fleet: Vec<_> = (0..10)
        .map(|i| {
            let store = unreachable(0.1).probe_every(Duration::from_secs(60));
            limiter(
                store,
                &[Quota::per_minute(5)],
                &format!("login{i}"),
                clock.clone(),
            )
        })
        .collect();
    let mut admitted = Vec::new();
    for second in 0..=600u64 {
        for l in &fleet {
            let d = l.check(&1).await;
            assert!(d.is_local());
            if d.is_allowed() {
                admitted.push(second);
            }
        }
        time.advance(Duration::from_secs(1));
    }
    // 10 at once (the burst of one each), then 5 a minute: 10 at each even minute.
    assert_eq!(admitted.len(), 60);
    assert_eq!(admitted.iter().filter(|&&s| s < 60).count(), 10);
    assert_eq!(
        admitted.iter().filter(|&&s| (60..120).contains(&s)).count(),
        0
    );
    // The documented bound, n × max(1, ⌊burst / n⌋) + rate × t, over every span.
    for (i, &start) in admitted.iter().enumerate() {
        for (j, &end) in admitted.iter().enumerate().skip(i) {
            assert!((j - i + 1) as u64 <= 10 + 5 * (end - start) / 60);
        }
    }
}

/// The race that once took the first line of an outage out of the capture: a log line first
/// reached on a thread without a subscriber (another test's outage), while this thread's
/// capture is the only subscriber registered, must still be captured when this thread
/// reaches it.
#[test]
fn a_line_first_reached_on_another_thread_is_still_captured() {
    fn line() {
        tracing::warn!(target: "tollgate::redis", "a line first reached elsewhere");
    }
    let (out, _guard) = capture();
    std::thread::spawn(line).join().unwrap();
    line();
    let text = out.text();
    assert!(text.contains("a line first reached elsewhere"), "{text:?}");
}
