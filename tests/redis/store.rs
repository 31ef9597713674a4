//! The Redis store against a real `redis-server` (started by each test, see
//! `common/redis_server.rs`): the same table of cases as the memory store, shared limits
//! across instances, outages, Redis Cluster, the deny cache and the HTTP layer.
//!
//! Pins docs/design.md section 1 and section 3 ("Redis").

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use common::spec;
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore};
use tollgate::{Clock, Outcome, Quota};

fn limiter_for(
    store: RedisStore,
    quotas: &[Quota],
    name: &str,
    clock: Clock,
) -> RedisRateLimiter<&'static str> {
    let mut b = RedisRateLimiter::<&str>::builder(store, quotas[0].clone())
        .name(name.to_owned())
        .clock(clock);
    for q in &quotas[1..] {
        b = b.quota(q.clone());
    }
    b.build()
}

/// Runs the table on limiters made by `make` (one per case); returns the failures.
async fn run_table(make: impl Fn(&spec::Case, usize, Clock) -> RedisRateLimiter<&'static str>) {
    let mut failures = Vec::new();
    for (n, case) in spec::cases().iter().enumerate() {
        let (clock, time) = Clock::manual();
        let limiter = make(case, n, clock);
        let start = time.now();
        for (i, step) in case.steps.iter().enumerate() {
            let target = start + Duration::from_millis(step.at_ms);
            time.advance(target - time.now());
            let d = limiter.check_n(&step.key, step.cost).await;
            assert!(
                !d.is_degraded(),
                "case {:?} step {i}: Redis failed",
                case.name
            );
            if let Err(e) = spec::check(case, i, &d) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn redis_store_follows_the_table_of_cases() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    run_table(|case, n, clock| {
        limiter_for(store.clone(), &case.quotas, &format!("case{n}"), clock)
    })
    .await;
}

#[tokio::test]
async fn redis_store_follows_the_table_of_cases_without_the_deny_cache() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0);
    run_table(|case, n, clock| {
        limiter_for(store.clone(), &case.quotas, &format!("case{n}"), clock)
    })
    .await;
}

#[tokio::test]
async fn two_instances_with_their_own_connections_share_one_limit_exactly() {
    let server = RedisServer::start();
    let make = |store: RedisStore| {
        RedisRateLimiter::<String>::builder(store, Quota::per_hour(10).burst(10))
            .quota(Quota::per_second(100).burst(50))
            .name("shared")
            .build()
    };
    // Separate connections: as two processes would have. The server's clock decides.
    let a = make(RedisStore::connect(&server.url()).await.unwrap());
    let b = make(RedisStore::connect(&server.url()).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..40 {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(
            async move { l.check(&"user-1".to_owned()).await },
        ));
    }
    let mut admitted = 0;
    for t in tasks {
        let d = t.await.unwrap();
        assert!(!d.is_degraded());
        admitted += usize::from(d.is_allowed());
    }
    assert_eq!(admitted, 10);
    let d = b.peek(&"user-1".to_owned()).await;
    assert_eq!(d.remaining(), 0);
    // The per-second quota refills on the server's clock while the test runs: at least 40.
    assert!((40..=50).contains(&d.states()[1].remaining()), "{d:?}");
    // The other instance sees the same state; another key is untouched.
    assert_eq!(a.check(&"user-2".to_owned()).await.remaining(), 9);
    let key = String::from_utf8(a.redis_key(&"user-1".to_owned())).unwrap();
    assert_eq!(key, "tollgate:6:shared:user-1");
    let ttl: i64 = server.cli(&["PTTL", &key]).unwrap().trim().parse().unwrap();
    // Idle again after 10 × 6 min: the key expires then.
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
}

#[tokio::test]
async fn a_multi_quota_key_is_decided_through_a_cluster_connection() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    // The whole table, multi-quota cases included, each case under its own name (so keys
    // land on different nodes).
    run_table(|case, n, clock| {
        limiter_for(store.clone(), &case.quotas, &format!("case{n}"), clock)
    })
    .await;
    // A second connection to the cluster sees the same state.
    let other = RedisStore::connect_cluster(urls.iter().map(String::as_str))
        .await
        .unwrap();
    let make = |store: RedisStore| {
        RedisRateLimiter::<(&str, u32)>::builder(store, Quota::per_hour(3))
            .quota(Quota::per_second(10).burst(2))
            .name("cluster")
            .build()
    };
    let (a, b) = (make(store.clone()), make(other));
    let mut used_nodes = std::collections::HashSet::new();
    for user in 0..20 {
        let key = ("user", user);
        assert!(a.check(&key).await.is_allowed());
        assert!(b.check(&key).await.is_allowed());
        let d = a.check(&key).await;
        // The per-second quota (burst 2) rejects the third at once; the hourly one keeps 1.
        assert_eq!(d.outcome(), Outcome::Limited);
        assert_eq!(
            d.states().iter().map(|s| s.remaining()).collect::<Vec<_>>(),
            [1, 0]
        );
        let name = String::from_utf8(a.redis_key(&key)).unwrap();
        let node = cluster
            .nodes
            .iter()
            .position(|n| n.cli(&["EXISTS", &name]).is_some_and(|o| o.trim() == "1"));
        used_nodes.insert(node.expect("the key is on one node"));
    }
    assert!(used_nodes.len() > 1, "keys spread over the masters");
}

/// CRC16/XMODEM of `bytes`, modulo 16384: the slot Redis Cluster gives a name without a tag.
fn slot_of_whole_name(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[tokio::test]
async fn client_bytes_never_choose_the_cluster_slot() {
    // The reference value of the Redis Cluster specification.
    assert_eq!(slot_of_whole_name(b"123456789"), 0x31C3);
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let store = RedisStore::connect_cluster(urls.iter().map(String::as_str))
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let limiter = RedisRateLimiter::<String>::builder(store, Quota::per_hour(3))
        .quota(Quota::per_second(10).burst(2))
        .name("api")
        .build();
    let keyslot = |name: &str| -> u16 {
        let out = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", name]).unwrap();
        out.trim().parse().unwrap()
    };
    let hot = keyslot("hot");
    let mut slots = std::collections::BTreeSet::new();
    let mut nodes = std::collections::BTreeSet::new();
    // A client sends keys that would all be tagged `{hot}`.
    for i in 0..30 {
        let key = format!("{{hot}}{i}");
        let d = limiter.check_n(&key, 2).await;
        assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
        // Both quotas live in the one Redis key: one slot for all of them.
        assert_eq!(d.states().len(), 2);
        let name = String::from_utf8(limiter.redis_key(&key)).unwrap();
        assert_eq!(name, format!("tollgate:3:api:{{}}{{hot}}{i}"));
        // Redis hashes the whole name, as the specification says for an empty first tag.
        let slot = keyslot(&name);
        assert_eq!(slot, slot_of_whole_name(name.as_bytes()), "{name}");
        slots.insert(slot);
        let node = cluster
            .nodes
            .iter()
            .position(|n| n.cli(&["EXISTS", &name]).is_some_and(|o| o.trim() == "1"));
        nodes.insert(node.expect("the key is on one node"));
    }
    assert!(!slots.contains(&hot));
    assert_eq!(slots.len(), 30);
    assert_eq!(nodes.len(), 3);
}

#[tokio::test]
async fn the_deny_cache_answers_known_rejections_without_a_round_trip() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_hour(2)).build();
    assert!(limiter.check(&7).await.is_allowed());
    assert!(limiter.check(&7).await.is_allowed());
    let first = limiter.check(&7).await;
    assert_eq!(first.outcome(), Outcome::Limited);
    for _ in 0..100 {
        let d = limiter.check(&7).await;
        assert_eq!(d.outcome(), Outcome::Limited);
        // Counted down locally, never later than Redis would say.
        assert!(d.retry_after() <= first.retry_after());
        assert!(d.retry_after() > Some(Duration::from_secs(1790)));
    }
    // A larger cost is rejected locally too; a peek always asks.
    assert!(!limiter.check_n(&7, 2).await.is_allowed());
    assert_eq!(limiter.peek(&7).await.remaining(), 0);
    assert_eq!(limiter.local_rejections(), 101);
    // Three decisions and the peek reached Redis; 101 round trips saved.
    assert_eq!(server.calls("evalsha"), 4);
    // Another key is not affected.
    assert!(limiter.check(&8).await.is_allowed());
}

#[tokio::test]
async fn the_deny_cache_never_outlives_the_rejection() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (clock, time) = Clock::manual();
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_second(10).burst(1))
        .clock(clock)
        .build();
    assert!(limiter.check(&1).await.is_allowed());
    assert!(!limiter.check(&1).await.is_allowed());
    time.advance(Duration::from_millis(99));
    assert!(!limiter.check(&1).await.is_allowed());
    assert_eq!(limiter.local_rejections(), 1);
    time.advance(Duration::from_millis(1));
    assert!(limiter.check(&1).await.is_allowed());
    assert_eq!(server.calls("evalsha"), 3);
}

/// A limiter of one request per hour on `store`, on a manual clock.
fn hourly(store: RedisStore, clock: Clock) -> RedisRateLimiter<u64> {
    RedisRateLimiter::<u64>::builder(store, Quota::per_hour(1))
        .clock(clock)
        .build()
}

/// Decides `check` until Redis answers (a restarted server is reconnected to in the
/// background; the first decisions after a restart may fail).
async fn answered(limiter: &RedisRateLimiter<u64>, key: u64) -> tollgate::Decision {
    for _ in 0..200 {
        let d = limiter.check(&key).await;
        if !d.is_degraded() {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("Redis did not answer again");
}

#[tokio::test]
async fn after_a_restart_without_persistence_a_cached_rejection_lasts_the_max_age_only() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let (clock, time) = Clock::manual();
    let limiter = hourly(store, clock);
    assert!(limiter.check(&1).await.is_allowed());
    let rejected = limiter.check(&1).await;
    assert_eq!(rejected.retry_after(), Some(Duration::from_secs(3600)));
    // Redis restarts empty: it would admit key 1 again.
    server.restart();
    time.advance(Duration::from_millis(999));
    let cached = limiter.check(&1).await;
    assert_eq!(cached.outcome(), Outcome::Limited);
    assert_eq!(limiter.local_rejections(), 1);
    // One second after the rejection was asked for, the limiter asks Redis again.
    time.advance(Duration::from_millis(1));
    let d = answered(&limiter, 1).await;
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    assert_eq!(limiter.local_rejections(), 1);
}

#[tokio::test]
async fn after_flushall_a_cached_rejection_lasts_the_max_age_only() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (clock, time) = Clock::manual();
    let limiter = hourly(store, clock);
    assert!(limiter.check(&1).await.is_allowed());
    assert!(!limiter.check(&1).await.is_allowed());
    server.cli(&["FLUSHALL"]).unwrap();
    time.advance(Duration::from_millis(999));
    assert!(!limiter.check(&1).await.is_allowed());
    time.advance(Duration::from_millis(1));
    assert!(limiter.check(&1).await.is_allowed());
    // Two rejections reached Redis or the cache, one of them locally; three decisions on Redis.
    assert_eq!(limiter.local_rejections(), 1);
    assert_eq!(server.calls("evalsha"), 3);
}

#[tokio::test]
async fn two_instances_agree_again_within_the_max_age_after_redis_lost_a_key() {
    let server = RedisServer::start();
    let a_store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .deny_cache_max_age(Duration::from_millis(250));
    let b_store = RedisStore::connect(&server.url()).await.unwrap();
    let (clock, time) = Clock::manual();
    let quota = Quota::per_hour(2);
    let a = RedisRateLimiter::<u64>::builder(a_store, quota.clone())
        .clock(clock.clone())
        .build();
    let b = RedisRateLimiter::<u64>::builder(b_store, quota)
        .clock(clock)
        .build();
    assert!(a.check(&1).await.is_allowed());
    assert!(a.check(&1).await.is_allowed());
    assert!(!a.check(&1).await.is_allowed());
    // The key is lost (as by eviction); instance B gets the fresh burst.
    time.advance(Duration::from_millis(100));
    let name = String::from_utf8(a.redis_key(&1)).unwrap();
    server.cli(&["DEL", &name]).unwrap();
    assert_eq!(b.check(&1).await.remaining(), 1);
    // A still answers its cached rejection until 250 ms after it asked...
    time.advance(Duration::from_millis(149));
    assert!(!a.check(&1).await.is_allowed());
    assert_eq!(a.local_rejections(), 1);
    // ...then agrees with Redis and B: the one request left is admitted, and B sees it.
    time.advance(Duration::from_millis(1));
    let d = a.check(&1).await;
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert!(!b.check(&1).await.is_allowed());
}

#[tokio::test]
async fn a_zero_max_age_asks_redis_for_every_decision() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .deny_cache_max_age(Duration::ZERO);
    let (clock, _time) = Clock::manual();
    let limiter = hourly(store, clock);
    for _ in 0..5 {
        let _ = limiter.check(&1).await;
    }
    assert_eq!(limiter.local_rejections(), 0);
    assert_eq!(server.calls("evalsha"), 5);
}

#[tokio::test]
async fn waiters_on_redis_stand_in_one_line_and_each_asks_at_most_twice() {
    use std::future::Future;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    // The server's clock decides; 100 waiters take about one second.
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_second(100).burst(1)).build();
    let polls = Arc::new(AtomicU64::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let (l, polls, order) = (limiter.clone(), polls.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let mut wait = Box::pin(l.until_ready(&1));
            let d = std::future::poll_fn(|cx| {
                polls.fetch_add(1, Ordering::Relaxed);
                wait.as_mut().poll(cx)
            })
            .await;
            assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
            order.lock().unwrap().push(i);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // First come, first served.
    assert_eq!(*order.lock().unwrap(), (0..100).collect::<Vec<_>>());
    // Only the head asks: once to learn its wait, once when it is over (the first waiter
    // is admitted at once). Everyone else stays parked until its turn.
    let asked = server.calls("evalsha") + limiter.local_rejections();
    assert!(asked <= 1 + 2 * 99, "{asked} decisions");
    // Each waiter is polled on arrival, at its turn, on Redis's reply, when its sleep ends and
    // on the second reply: 5 (measured: 493 for the 100), with room for a spurious wake of
    // the connection; waking every waiter at each admission would cost thousands.
    let polls = polls.load(Ordering::Relaxed);
    assert!(polls <= 6 * 100, "{polls} polls");
}

/// Decides `check` over and over for `period`, returning every decision with its duration.
async fn traffic(
    limiter: &RedisRateLimiter<u64>,
    period: Duration,
) -> Vec<(tollgate::Decision, Duration)> {
    let end = std::time::Instant::now() + period;
    let mut out = Vec::new();
    while std::time::Instant::now() < end {
        let t = std::time::Instant::now();
        let d = limiter.check(&1).await;
        out.push((d, t.elapsed()));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    out
}

/// Kills Redis mid-traffic, checks every decision during the outage against `mode`, restarts
/// Redis on the same port and waits for decisions to come from it again.
async fn outage_follows(mode: FailMode) {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(50);
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(timeout)
        .on_failure(mode);
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_hour(100_000)).build();
    let before = traffic(&limiter, Duration::from_millis(100)).await;
    assert!(before
        .iter()
        .all(|(d, _)| d.is_allowed() && !d.is_degraded()));

    server.kill();
    let during = traffic(&limiter, Duration::from_millis(300)).await;
    for (d, took) in &during {
        // Cut by the timeout, not hanging: the margin is for a test binary that shares two
        // cores with the rest of its group, not a speed claim.
        assert!(
            *took < timeout + Duration::from_millis(250),
            "a call took {took:?}"
        );
        assert!(d.is_degraded());
        match mode {
            FailMode::Open => assert!(d.is_allowed()),
            FailMode::Closed => {
                assert_eq!(d.outcome(), Outcome::Limited);
                assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
            }
            // Covered by tests/redis/fallback.rs.
            FailMode::Local(_) => assert!(d.is_local()),
        }
    }

    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let t = std::time::Instant::now();
        let d = limiter.check(&1).await;
        assert!(t.elapsed() < timeout + Duration::from_millis(50));
        if !d.is_degraded() {
            // A fresh server: the key starts from its full burst again.
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 99_999);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "Redis not used again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn redis_killed_mid_traffic_fail_open_admits_within_the_timeout_then_recovers() {
    outage_follows(FailMode::Open).await;
}

#[tokio::test]
async fn redis_killed_mid_traffic_fail_closed_rejects_within_the_timeout_then_recovers() {
    outage_follows(FailMode::Closed).await;
}

#[tokio::test]
async fn a_hung_redis_costs_each_decision_at_most_the_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(50);
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(timeout)
        .on_failure(FailMode::Closed);
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_hour(100)).build();
    assert!(limiter.check(&1).await.is_allowed());
    server.pause();
    // Concurrent callers on the one connection: none waits longer than the timeout.
    let calls = (0..20).map(|_| {
        let l = limiter.clone();
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let d = l.check(&1).await;
            (d, t.elapsed())
        })
    });
    for call in calls.collect::<Vec<_>>() {
        let (d, took) = call.await.unwrap();
        assert!(d.is_degraded() && !d.is_allowed());
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(250),
            "{took:?}"
        );
    }
    server.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while limiter.check(&1).await.is_degraded() {
        assert!(std::time::Instant::now() < deadline, "Redis not used again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_unreachable_redis_at_startup_follows_the_failure_policy() {
    let port = common::redis_server::free_port();
    let store = RedisStore::open(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(50));
    let open = RedisRateLimiter::<u64>::builder(store.clone(), Quota::per_second(1))
        .name("open")
        .build();
    let closed =
        RedisRateLimiter::<u64>::builder(store.on_failure(FailMode::Closed), Quota::per_second(1))
            .name("closed")
            .build();
    for _ in 0..3 {
        let d = open.check(&1).await;
        assert!(d.is_allowed() && d.is_degraded());
        let d = closed.check(&1).await;
        assert!(!d.is_allowed() && d.is_degraded());
    }
}

mod http_layer {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use http::{Request, Response, StatusCode};
    use tollgate::key::Header;
    use tollgate::{Decision, Policy, RateLimitLayer};
    use tower::ServiceExt;

    fn req(key: &str, cost: u32) -> Request<Body> {
        Request::get("/")
            .header("x-key", key)
            .header("x-cost", cost.to_string())
            .body(Body::empty())
            .unwrap()
    }

    fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
        resp.headers().get(name).map(|v| v.to_str().unwrap())
    }

    async fn handler(d: Option<Decision>) -> String {
        match d {
            Some(d) if d.is_degraded() => "degraded".into(),
            Some(d) => format!("remaining {}", d.remaining()),
            None => "none".into(),
        }
    }

    fn app(policy: Policy, store: RedisStore, clock: Clock) -> Router {
        Router::new().route("/", get(handler)).layer(
            RateLimitLayer::new(policy)
                .key(Header::new("x-key"))
                .cost(|r| {
                    r.headers
                        .get("x-cost")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                })
                .clock(clock)
                .store(store),
        )
    }

    /// The table of cases through an axum router on Redis: statuses, Retry-After, RateLimit.
    #[tokio::test]
    async fn the_layer_on_redis_follows_the_table_of_cases() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(2));
        for (n, case) in spec::cases().iter().enumerate() {
            let mut policy = Policy::new(format!("http{n}"), case.quotas[0].clone());
            for q in &case.quotas[1..] {
                policy = policy.quota(q.clone());
            }
            let (clock, time) = Clock::manual();
            let app = app(policy, store.clone(), clock);
            let start = time.now();
            for (i, step) in case.steps.iter().enumerate() {
                time.advance(start + Duration::from_millis(step.at_ms) - time.now());
                let resp = app.clone().oneshot(req(step.key, step.cost)).await.unwrap();
                let ctx = format!("case {:?} step {i}", case.name);
                let e = &step.expect;
                let want = match e.outcome {
                    Outcome::Allowed => StatusCode::OK,
                    _ => StatusCode::TOO_MANY_REQUESTS,
                };
                assert_eq!(resp.status(), want, "{ctx}");
                match (e.outcome, e.retry_after_ms) {
                    (Outcome::Limited, Some(ms)) => {
                        let secs = ms.div_ceil(1000).max(1).to_string();
                        assert_eq!(header(&resp, "retry-after"), Some(secs.as_str()), "{ctx}");
                    }
                    (Outcome::Limited, None) => {
                        assert!(header(&resp, "retry-after").is_some(), "{ctx}")
                    }
                    _ => assert_eq!(header(&resp, "retry-after"), None, "{ctx}"),
                }
                let rl = header(&resp, "ratelimit").expect("RateLimit on every response");
                if let Some(r) = &e.remaining {
                    let got: Vec<u64> = rl
                        .split(", ")
                        .map(|item| {
                            let r = item.split(";r=").nth(1).unwrap();
                            r.split(';').next().unwrap().parse().unwrap()
                        })
                        .collect();
                    assert_eq!(&got, r, "{ctx}: {rl}");
                }
                assert!(header(&resp, "ratelimit-policy").is_some(), "{ctx}");
            }
        }
    }

    #[tokio::test]
    async fn too_many_requests_get_429_with_headers_and_the_handler_sees_the_decision() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let app = app(
            Policy::new("api", Quota::per_minute(2)),
            store,
            Clock::system(),
        );
        let resp = app.clone().oneshot(req("alice", 1)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit-policy"), Some("\"api\";q=2;w=60"));
        assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=1;t=30"));
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"remaining 1");
        assert_eq!(
            app.clone().oneshot(req("alice", 1)).await.unwrap().status(),
            200
        );
        // Rejected by Redis, then by the deny cache: the same answer.
        for _ in 0..2 {
            let resp = app.clone().oneshot(req("alice", 1)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(header(&resp, "retry-after"), Some("30"));
            assert_eq!(header(&resp, "ratelimit"), Some("\"api\";r=0;t=60"));
        }
        assert_eq!(server.calls("evalsha"), 3);
        assert_eq!(app.oneshot(req("bob", 1)).await.unwrap().status(), 200);
    }

    #[tokio::test]
    async fn redis_down_fail_closed_is_503_and_fail_open_passes_without_ratelimit_fields() {
        let port = common::redis_server::free_port();
        let store = RedisStore::open(&format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .timeout(Duration::from_millis(50));
        let policy = Policy::new("api", Quota::per_second(1));
        let closed = app(
            policy.clone(),
            store.clone().on_failure(FailMode::Closed),
            Clock::system(),
        );
        let t = std::time::Instant::now();
        let resp = closed.oneshot(req("alice", 1)).await.unwrap();
        assert!(t.elapsed() < Duration::from_millis(100));
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&resp, "retry-after"), Some("1"));
        assert_eq!(header(&resp, "ratelimit"), None);

        let open = app(policy, store.on_failure(FailMode::Open), Clock::system());
        let resp = open.oneshot(req("alice", 1)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(header(&resp, "ratelimit"), None);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(&body[..], b"degraded");
    }

    #[tokio::test]
    async fn tiers_never_share_state_in_redis() {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let layer = RateLimitLayer::new(Policy::new("free", Quota::per_hour(1)))
            .tier(Policy::new("vip", Quota::per_hour(1)))
            .key(Header::new("x-key"))
            .select_tier(|r| r.headers.get("x-vip").map(|_| "vip"))
            .store(store);
        let app = Router::new().route("/", get(handler)).layer(layer);
        let vip = |key: &str| {
            Request::get("/")
                .header("x-key", key)
                .header("x-vip", "1")
                .body(Body::empty())
                .unwrap()
        };
        assert_eq!(
            app.clone().oneshot(req("k", 1)).await.unwrap().status(),
            200
        );
        assert_eq!(app.clone().oneshot(vip("k")).await.unwrap().status(), 200);
        assert_eq!(
            app.clone().oneshot(req("k", 1)).await.unwrap().status(),
            429
        );
        assert_eq!(app.oneshot(vip("k")).await.unwrap().status(), 429);
    }
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again_by_the_next_decision() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = RedisRateLimiter::<()>::builder(store, Quota::per_hour(10)).build();
    assert_eq!(limiter.check(&()).await.remaining(), 9);
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    let d = limiter.check(&()).await;
    assert!(!d.is_degraded());
    assert_eq!(d.remaining(), 8);
    // NOSCRIPT, SCRIPT LOAD, EVALSHA: then one call per decision again.
    assert_eq!(limiter.check(&()).await.remaining(), 7);
    assert_eq!(server.calls("evalsha"), 4);
}

/// Every decision script is loaded again after a flush: a policy of window kinds (the script
/// of quotas without warm-up) and one with warm-up (the general script) decide on, counting
/// from what Redis kept.
#[tokio::test]
async fn a_flushed_script_of_every_kind_is_loaded_again_by_the_next_decision() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let window = Duration::from_secs(3_600);
    let plain = RedisRateLimiter::<()>::builder(store.clone(), Quota::sliding_log(10, window))
        .quota(Quota::fixed_window(20, window))
        .name("plain")
        .build();
    let general = RedisRateLimiter::<()>::builder(
        store,
        Quota::per_hour(10).warm_up(Duration::from_secs(60), 3),
    )
    .name("general")
    .build();
    let plain_before = plain.check(&()).await.remaining();
    let general_before = general.check(&()).await.remaining();
    server.cli(&["SCRIPT", "FLUSH"]).unwrap();
    for (limiter, before) in [(&plain, plain_before), (&general, general_before)] {
        let d = limiter.check(&()).await;
        assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
        assert!(d.remaining() < before, "{before} -> {}", d.remaining());
    }
}

#[tokio::test]
async fn rates_finer_than_a_microsecond_are_a_configuration_error() {
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let err = RedisRateLimiter::<u64>::builder(
        store.clone(),
        Quota::new(2_000, Duration::from_millis(1)),
    )
    .try_build()
    .unwrap_err();
    assert!(
        matches!(err, tollgate::ConfigError::RateTooHighForStore { .. }),
        "{err}"
    );
    // One per microsecond is fine; 3 per second is rounded up to whole microseconds.
    assert!(
        RedisRateLimiter::<u64>::builder(store, Quota::per_second(1_000_000))
            .quota(Quota::per_second(3))
            .try_build()
            .is_ok()
    );
}

#[tokio::test]
async fn memory_bounds_set_before_a_redis_store_are_an_error() {
    use tollgate::{store::OnFull, ConfigError, RateLimitLayer};
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let before = RateLimitLayer::new(Quota::per_second(1))
        .max_keys(10)
        .store(store.clone());
    assert_eq!(
        before.validate().unwrap_err(),
        ConfigError::MemoryOnly("max_keys")
    );
    // After `.store(..)` they are not methods at all: see the compile-fail example on
    // `RateLimitLayer::max_keys`.
    let after = RateLimitLayer::new(Quota::per_second(1))
        .on_full(OnFull::default())
        .store(store.clone());
    assert_eq!(
        after.validate().unwrap_err(),
        ConfigError::MemoryOnly("on_full")
    );
    let plain = RateLimitLayer::new(Quota::per_second(1)).store(store);
    assert!(plain.validate().is_ok());
}
