//! The penalty box where only Redis has something to say (a real `redis-server` per test, see
//! `common/redis_server.rs`); the rules both stores keep run over both in `penalty.rs`: bans
//! cached locally, state loss, the names of the keys, clusters, and the script against the
//! memory box on a random history. Manual clock: the time is sent to the script, so every
//! wait below is exact.
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
async fn a_ban_is_answered_from_the_local_cache_for_up_to_a_second() {
    let (server, limiter, time) = setup().await;
    assert_eq!(outcomes(&limiter, 1, 5).await, [A, A, L, L, B]);
    // While banned: answered from the local ban cache for up to 1 s, then by Redis.
    let calls = server.calls("evalsha");
    time.advance(4 * SEC);
    let d = limiter.check(&1).await;
    assert_eq!((d.outcome(), d.retry_after()), (B, Some(26 * SEC)));
    assert_eq!(server.calls("evalsha"), calls + 1);
    let d = limiter.check(&1).await;
    assert_eq!((d.outcome(), d.retry_after()), (B, Some(26 * SEC)));
    assert_eq!(server.calls("evalsha"), calls + 1, "answered locally");
    assert_eq!(limiter.ban_left(&1).await, Some(6 * SEC));
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
