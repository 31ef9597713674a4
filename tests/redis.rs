//! The Redis store against a real `redis-server` (started by each test, see
//! `common/redis_server.rs`): the same table of cases as the memory store, shared limits
//! across instances, outages, Redis Cluster, the deny cache and the HTTP layer.

#![cfg(feature = "redis")]

mod common;

use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use common::spec;
use tollgate::redis::{RedisRateLimiter, RedisStore};
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
    assert_eq!(d.states()[1].remaining, 40);
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
            d.states().iter().map(|s| s.remaining).collect::<Vec<_>>(),
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
