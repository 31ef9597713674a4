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
