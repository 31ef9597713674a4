//! A store's timeout is how long a decision waits for Redis, whatever it is set to: a server
//! that answers after 700 ms (its clients paused by `CLIENT PAUSE 700` from another
//! connection, which returns at once and holds every later command) decides the
//! request of a store whose timeout is 5 s, and a store whose timeout is 100 ms lets its
//! failure policy decide.
//!
//! Pins docs/design.md section 3 ("Redis": a short timeout, never a hung request) and
//! `RedisStore::timeout`.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{connection, RedisServer};
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore};
use tollgate::Quota;

/// Decides one request of a store with `timeout` while the server holds its clients for
/// 700 ms; whether the decision was degraded (made by the failure policy).
async fn degraded_while_blocked(server: &RedisServer, name: &str, timeout: Duration) -> bool {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(timeout)
        .on_failure(FailMode::Open);
    let limiter = RedisRateLimiter::<&str>::builder(store, Quota::per_second(5))
        .name(name.to_owned())
        .build();
    // Connected and its scripts loaded before the server is blocked.
    assert!(!limiter.check(&"warm").await.is_degraded());
    let mut other = connection(server).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(700)
        .arg("ALL")
        .query_async(&mut other)
        .await
        .unwrap();
    limiter.check(&"k").await.is_degraded()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_a_short_timeout_lets_its_failure_policy_decide_for_a_slow_server() {
    let server = RedisServer::start();
    assert!(degraded_while_blocked(&server, "short", Duration::from_millis(100)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_a_long_timeout_waits_for_a_slow_server() {
    let server = RedisServer::start();
    assert!(!degraded_while_blocked(&server, "long", Duration::from_secs(5)).await);
}
