//! The penalty box on Redis (a real `redis-server` per test, see `common/redis_server.rs`):
//! the same rules as in memory, decided with the quotas in one script call; races of parallel
//! requests at the threshold; bans cached locally; state loss. Manual clock: the time is sent
//! to the script, so every wait below is exact.
//!
//! Pins docs/design.md section 3 ("The penalty box punishes the client's own traffic", "Redis").

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, ConfigError, ManualClock, Outcome, Quota};

const SEC: Duration = Duration::from_secs(1);

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// 2 per minute; 3 rejections within 60 s ban for 10 s, doubling up to 35 s; offences
/// forgotten 100 s after a ban ends.
fn login(store: RedisStore, clock: Clock) -> RedisRateLimiter<u64> {
    RedisRateLimiter::<u64>::builder(store, Quota::per_minute(2))
        .name("login")
        .clock(clock)
        .penalty_box(
            PenaltyBox::new(3, 60 * SEC, 10 * SEC)
                .max_ban(35 * SEC)
                .forget_after(100 * SEC),
        )
        .build()
}

/// The outcomes of `n` checks of `key`.
async fn outcomes(limiter: &RedisRateLimiter<u64>, key: u64, n: usize) -> Vec<Outcome> {
    let mut out = Vec::new();
    for _ in 0..n {
        let d = limiter.check(&key).await;
        assert!(!d.is_degraded());
        out.push(d.outcome());
    }
    out
}

use Outcome::{Allowed as A, Banned as B, Limited as L};

async fn setup() -> (RedisServer, RedisRateLimiter<u64>, ManualClock) {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let limiter = login(store(&server).await, clock);
    (server, limiter, time)
}

#[tokio::test]
async fn m_minus_one_rejections_then_quiet_never_ban_on_redis() {
    let (_server, limiter, time) = setup().await;
    assert_eq!(outcomes(&limiter, 1, 4).await, [A, A, L, L]);
    time.advance(60 * SEC);
    assert_eq!(outcomes(&limiter, 1, 4).await, [A, A, L, L]);
    time.advance(60 * SEC);
    assert_eq!(outcomes(&limiter, 1, 2).await, [A, A]);
}

#[tokio::test]
async fn exactly_m_rejections_ban_for_d_and_the_ban_consumes_nothing_on_redis() {
    let (server, limiter, time) = setup().await;
    assert_eq!(outcomes(&limiter, 1, 4).await, [A, A, L, L]);
    time.advance(SEC);
    let third = limiter.check(&1).await;
    assert_eq!(third.outcome(), B);
    // Banned for 10 s; the quota admits a request 29 s from now: the later is the answer.
    assert_eq!(third.retry_after(), Some(29 * SEC));
    assert_eq!(third.remaining(), 0);
    // While banned: answered from the local ban cache for up to 1 s, then by Redis.
    let calls = server.calls("evalsha");
    time.advance(4 * SEC);
    let d = limiter.check(&1).await;
    assert_eq!((d.outcome(), d.retry_after()), (B, Some(25 * SEC)));
    assert_eq!(server.calls("evalsha"), calls + 1);
    let d = limiter.check(&1).await;
    assert_eq!((d.outcome(), d.retry_after()), (B, Some(25 * SEC)));
    assert_eq!(server.calls("evalsha"), calls + 1, "answered locally");
    assert_eq!(limiter.ban_left(&1).await, Some(6 * SEC));
    // Another key is not affected.
    assert_eq!(outcomes(&limiter, 2, 1).await, [A]);
    // After the ban, and the quota's 60 s: the full burst, nothing was taken during the ban.
    time.advance(55 * SEC);
    assert_eq!(outcomes(&limiter, 1, 3).await, [A, A, L]);
}

#[tokio::test]
async fn repeat_offences_escalate_and_stop_at_the_cap_on_redis() {
    let (_server, limiter, time) = setup().await;
    let mut bans = Vec::new();
    for _ in 0..5 {
        let mut ban = None;
        for _ in 0..5 {
            let d = limiter.check(&1).await;
            if d.outcome() == B {
                ban = limiter.ban_left(&1).await;
                // The answer waits for the ban and for the quota (30 s to one request).
                assert_eq!(d.retry_after(), ban.map(|b| b.max(30 * SEC)));
                break;
            }
        }
        let ban = ban.unwrap();
        bans.push(ban.as_secs());
        time.advance(ban.max(60 * SEC));
    }
    assert_eq!(bans, [10, 20, 35, 35, 35]);
    // 100 s of quiet after the last ban ended: the next is the first again.
    time.advance(100 * SEC);
    assert_eq!(outcomes(&limiter, 1, 5).await, [A, A, L, L, B]);
    assert_eq!(limiter.ban_left(&1).await, Some(10 * SEC));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_at_the_threshold_make_one_ban_of_d_on_redis() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    // Two instances of the service on one Redis.
    let a = login(store(&server).await, clock.clone());
    let b = login(store(&server).await, clock);
    assert_eq!(outcomes(&a, 1, 4).await, [A, A, L, L]);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let l = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { l.check(&1).await })
        })
        .collect();
    for t in tasks {
        let d = t.await.unwrap();
        // Banned for 10 s; the quota admits one request 30 s from now.
        assert_eq!((d.outcome(), d.retry_after()), (B, Some(30 * SEC)));
    }
    // One ban, the first: strikes racing it did not escalate it.
    assert_eq!(a.ban_left(&1).await, Some(10 * SEC));
}

#[tokio::test]
async fn strikes_recorded_outside_the_decision_ban_on_redis() {
    let (_server, limiter, time) = setup().await;
    assert_eq!(limiter.strike(&7).await, None);
    assert_eq!(limiter.strike(&7).await, None);
    assert_eq!(limiter.strike(&7).await, Some(10 * SEC));
    assert_eq!(outcomes(&limiter, 7, 1).await, [B]);
    limiter.pardon(&7).await;
    assert_eq!(limiter.ban_left(&7).await, None);
    assert_eq!(outcomes(&limiter, 7, 1).await, [A]);
    time.advance(SEC);
}

#[tokio::test]
async fn a_restart_without_persistence_forgets_bans_within_the_max_age() {
    let (mut server, limiter, time) = setup().await;
    assert_eq!(outcomes(&limiter, 1, 5).await, [A, A, L, L, B]);
    // Redis loses everything: the ban is gone with it. This instance still answers its cached
    // ban for what is left of the 1 s it trusts a cached answer.
    server.restart();
    time.advance(Duration::from_millis(999));
    assert_eq!(limiter.check(&1).await.outcome(), B);
    time.advance(Duration::from_millis(1));
    let mut d = limiter.check(&1).await;
    for _ in 0..200 {
        if !d.is_degraded() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        d = limiter.check(&1).await;
    }
    assert_eq!(d.outcome(), A, "{d:?}");
}

#[tokio::test]
async fn penalty_keys_never_share_a_name_with_quota_keys() {
    let (server, limiter, _time) = setup().await;
    assert_eq!(outcomes(&limiter, 1, 3).await, [A, A, L]);
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    assert_eq!(keys, ["tollgate:5:login:1", "tollgate:ban:5:login:1"]);
}

#[tokio::test]
async fn a_zero_ban_is_a_configuration_error_on_redis_too() {
    let server = RedisServer::start();
    let built = RedisRateLimiter::<u64>::builder(store(&server).await, Quota::per_minute(2))
        .penalty_box(PenaltyBox::new(3, SEC, Duration::ZERO))
        .try_build();
    assert_eq!(
        built.err(),
        Some(ConfigError::InvalidPenaltyBox(
            "the ban must be longer than zero"
        ))
    );
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn the_http_layer_on_redis_answers_a_ban_with_its_retry_after() {
    use axum::body::Body;
    use http::{Request, StatusCode};
    use tollgate::{key, RateLimitLayer};
    use tower::ServiceExt;

    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let app = axum::Router::new()
        .route("/login", axum::routing::post(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(tollgate::Policy::new("login", Quota::per_minute(1)))
                .key(key::Header::new("x-user"))
                .clock(clock)
                .penalty_box(PenaltyBox::new(2, 60 * SEC, 300 * SEC))
                .store(store(&server).await),
        );
    let mut seen = Vec::new();
    for _ in 0..4 {
        let req = Request::post("/login")
            .header("x-user", "mallory")
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let h = |n: &str| {
            resp.headers()
                .get(n)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        seen.push((resp.status(), h("retry-after"), h("ratelimit")));
    }
    assert_eq!(seen[0].0, StatusCode::OK);
    assert_eq!(seen[1].1.as_deref(), Some("60"));
    for banned in &seen[2..] {
        assert_eq!(banned.0, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(banned.1.as_deref(), Some("300"));
        assert_eq!(banned.2.as_deref(), Some("\"login\";r=0;t=300"));
    }
}

#[tokio::test]
async fn the_script_agrees_with_the_memory_penalty_box_on_a_random_history() {
    use tollgate::penalty::{Penalties, Strike};
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let boxed = PenaltyBox::new(3, 10 * SEC, 4 * SEC)
        .max_ban(20 * SEC)
        .forget_after(30 * SEC);
    let redis = RedisRateLimiter::<u64>::builder(store(&server).await, Quota::per_minute(2))
        .clock(clock.clone())
        .penalty_box(boxed.clone())
        .build();
    let memory = Penalties::<u64>::try_new(&boxed, clock, 100).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut bans = 0;
    for step in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let key = seed % 3;
        time.advance(Duration::from_millis(250 * ((seed >> 8) % 16)));
        let expected = match memory.strike(&key) {
            Strike::Banned { ban, .. } => {
                bans += 1;
                Some(ban)
            }
            Strike::AlreadyBanned(left) => Some(left),
            _ => None,
        };
        assert_eq!(redis.strike(&key).await, expected, "step {step}");
    }
    // The history went through bans, escalations and forgiveness.
    assert!(bans >= 10, "{bans} bans");
}

#[tokio::test]
async fn on_a_cluster_the_penalty_box_needs_a_hash_tag_in_the_prefix() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    // Without a tag the quota key and the penalty key could be on two nodes.
    let (clock, time) = Clock::manual();
    for prefix in ["tollgate:", "app{}:", "app{:"] {
        let built =
            RedisRateLimiter::<u64>::builder(store.clone().prefix(prefix), Quota::per_minute(2))
                .penalty_box(PenaltyBox::new(3, 60 * SEC, 10 * SEC))
                .try_build();
        assert!(
            matches!(built, Err(ConfigError::InvalidPenaltyBox(_))),
            "{prefix}"
        );
    }
    let limiter = login(store.prefix("app{1}:"), clock);
    for key in 0..6u64 {
        assert_eq!(
            outcomes(&limiter, key, 5).await,
            [A, A, L, L, B],
            "key {key}"
        );
    }
    time.advance(10 * SEC);
    assert_eq!(limiter.ban_left(&0).await, None);
}

#[tokio::test]
async fn window_quotas_are_banned_in_the_same_script_call() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let limiter =
        RedisRateLimiter::<u64>::builder(store(&server).await, Quota::sliding_log(2, 60 * SEC))
            .quota(Quota::fixed_window(5, 3600 * SEC))
            .name("windows")
            .clock(clock)
            .penalty_box(PenaltyBox::new(2, 60 * SEC, 30 * SEC))
            .build();
    assert_eq!(outcomes(&limiter, 1, 4).await, [A, A, L, B]);
    let d = limiter.check(&1).await;
    // Banned for 30 s; the log admits a request when its window has passed, 60 s from now.
    assert_eq!((d.outcome(), d.retry_after()), (B, Some(60 * SEC)));
    assert!(d.states().iter().all(|s| s.remaining() == 0));
    assert!(d.states().iter().all(|s| s.reset_after() >= 30 * SEC));
    // After the ban and the log's window: two more (the hour has used four of its five).
    time.advance(60 * SEC);
    assert_eq!(outcomes(&limiter, 1, 3).await, [A, A, L]);
}

/// Any quota, any penalty box, a client that sometimes waits as told, sometimes less, sometimes
/// more: a request sent when the last refusal said a retry is admitted (or later) is admitted.
#[test]
fn a_client_that_waits_as_told_is_always_admitted_on_redis() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(store(&server));
    let case = std::cell::Cell::new(0u32);
    let strategy = (
        1u32..4,
        1u64..120,
        1u32..4,
        1u64..200,
        prop::collection::vec(0u8..4, 1..30),
    );
    TestRunner::new(Config::with_cases(32))
        .run(&strategy, |(count, period, strikes, ban, waits)| {
            case.set(case.get() + 1);
            let (clock, time) = Clock::manual();
            let limiter = RedisRateLimiter::<u64>::builder(
                store.clone(),
                Quota::new(count, Duration::from_secs(period)),
            )
            .name(format!("polite-{}", case.get()))
            .clock(clock)
            .penalty_box(
                PenaltyBox::new(strikes, 600 * SEC, Duration::from_secs(ban)).max_ban(3600 * SEC),
            )
            .build();
            rt.block_on(async {
                let mut told: Option<Duration> = None;
                for (i, w) in waits.into_iter().enumerate() {
                    let (wait, polite) = match (w, told) {
                        (_, None) | (0, _) => (Duration::ZERO, false),
                        (1, Some(r)) => (r, true),
                        (2, Some(r)) => (r / 2, false),
                        (_, Some(r)) => (r + 7 * SEC, true),
                    };
                    time.advance(wait);
                    let d = limiter.check(&1).await;
                    prop_assert!(!d.is_degraded());
                    if polite {
                        prop_assert!(d.is_allowed(), "request {}, waited {:?}: {:?}", i, wait, d);
                    }
                    told = if d.is_allowed() {
                        None
                    } else {
                        d.retry_after()
                    };
                }
                Ok(())
            })
        })
        .unwrap();
}
