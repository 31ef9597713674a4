//! The window kinds in Redis: the script against the memory store on random mixed policies
//! (to the nanosecond), and what Redis keeps for a key (a sorted set for the log, members
//! that never collide, expiry when idle).
//!
//! Pins docs/design.md section 1 ("Other kinds") and section 3 ("Redis").
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::twins::{self, Twins};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Outcome, Quota};

/// A quota of any kind whose numbers are whole milliseconds, so that the script's microseconds
/// and the memory store's nanoseconds agree exactly.
fn quota() -> impl Strategy<Value = Quota> {
    (0u8..4, 1u32..8, 1u64..400).prop_map(|(kind, count, ms)| {
        let w = Duration::from_millis(ms * u64::from(count));
        match kind {
            0 => Quota::new(count, w),
            1 => Quota::fixed_window(count, w),
            2 => Quota::sliding_log(count, w),
            _ => Quota::sliding_window(count, w),
        }
    })
}

/// (gap before the request in ms, key, cost)
fn requests() -> impl Strategy<Value = Vec<(u64, u8, u32)>> {
    prop::collection::vec((0u64..600, 0u8..2, 0u32..5), 1..50)
}

type Seen = (Outcome, Option<u128>, Vec<u64>, Vec<Duration>);

/// What a decision reports; the retry time in whole microseconds, rounded up (the script's
/// resolution: the counter's exact retry time may fall between two microseconds).
fn seen(d: &tollgate::Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after().map(|r| r.as_nanos().div_ceil(1000)),
        d.states().iter().map(|s| s.remaining()).collect(),
        d.states().iter().map(|s| s.reset_after()).collect(),
    )
}

#[test]
fn the_script_decides_every_kind_as_the_memory_store_does() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(2));
    let mut runner = TestRunner::new(Config::with_cases(96));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(
            &(prop::collection::vec(quota(), 1..=4), requests()),
            |(quotas, reqs)| {
                case_no.set(case_no.get() + 1);
                let twins = Twins::new(&store, format!("kinds-{}", case_no.get()), &quotas);
                for (i, &(gap, key, cost)) in reqs.iter().enumerate() {
                    let got = twins.decide(&rt, Duration::from_millis(gap), key, cost);
                    let Some((redis, memory)) = got else {
                        return Err(TestCaseError::fail(format!("Redis failed at request {i}")));
                    };
                    prop_assert_eq!(seen(&redis), seen(&memory), "request {}", i);
                }
                Ok(())
            },
        )
        .unwrap();
}

fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn the_log_is_a_sorted_set_with_one_member_per_request_and_vanishes_when_idle() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let (clock, time) = Clock::manual();
    let limiter = RedisRateLimiter::<&str>::builder(store, Quota::per_second(100))
        .quota(Quota::sliding_log(50, Duration::from_secs(2)))
        .name("log")
        .clock(clock)
        .build();
    let key = String::from_utf8(limiter.redis_key(&"k")).unwrap();
    // Twelve units at one instant, in two requests.
    assert!(limiter.check_n(&"k", 5).await.is_allowed());
    assert!(limiter.check_n(&"k", 7).await.is_allowed());
    assert_eq!(redis_cli(&server, &["TYPE", &key]), "zset");
    // Two log members, one per request with its cost, plus the words of the GCRA quota.
    assert_eq!(redis_cli(&server, &["ZCARD", &key]), "3");
    assert_eq!(redis_cli(&server, &["ZCOUNT", &key, "0", "+inf"]), "2");
    assert_eq!(limiter.peek(&"k").await.states()[1].remaining(), 38);
    let ttl: i64 = redis_cli(&server, &["PTTL", &key]).parse().unwrap();
    // Redis counts the time to live on its own clock, which went on while the test ran.
    assert!(ttl > 1_000 && ttl <= 2_000, "expires with the log: {ttl}");
    // A cost above the log's count never passes and writes nothing.
    let d = limiter.check_n(&"k", 51).await;
    assert_eq!(d.outcome(), Outcome::Exceeds);
    assert_eq!(redis_cli(&server, &["ZCARD", &key]), "3");
    // Past the window every entry is gone from the decision, and a peek reports a full log.
    time.advance(Duration::from_secs(2));
    let d = limiter.peek(&"k").await;
    assert_eq!(d.states()[1].remaining(), 50);
    assert_eq!(d.reset_after(), Duration::ZERO);
}

#[tokio::test]
async fn a_window_policy_in_a_string_key_expires_when_idle() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let (clock, _time) = Clock::manual();
    let limiter =
        RedisRateLimiter::<&str>::builder(store, Quota::fixed_window(3, Duration::from_secs(5)))
            .quota(Quota::sliding_window(10, Duration::from_secs(1)))
            .name("win")
            .clock(clock)
            .build();
    let key = String::from_utf8(limiter.redis_key(&"k")).unwrap();
    assert!(limiter.check(&"k").await.is_allowed());
    assert_eq!(redis_cli(&server, &["TYPE", &key]), "string");
    let ttl: i64 = redis_cli(&server, &["PTTL", &key]).parse().unwrap();
    // The fixed window closes at 5 s, the counter's count ages out at 2 s: the later wins.
    assert!(ttl > 4_000 && ttl <= 5_000, "{ttl}");
}

#[test]
fn a_sliding_counter_too_large_for_exact_script_arithmetic_is_a_configuration_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let day = Duration::from_secs(86_400);
    let err = RedisRateLimiter::<u8>::builder(store.clone(), Quota::sliding_window(100_000, day))
        .try_build()
        .unwrap_err();
    assert_eq!(
        err,
        tollgate::ConfigError::WindowTooLongForStore {
            count: 100_000,
            window: day
        }
    );
    assert!(
        RedisRateLimiter::<u8>::builder(store.clone(), Quota::sliding_window(50_000, day))
            .try_build()
            .is_ok()
    );
    // The other window kinds multiply nothing: any count fits.
    for q in [
        Quota::fixed_window(u32::MAX, day),
        Quota::sliding_log(Quota::MAX_LOG_COUNT, day),
    ] {
        assert!(RedisRateLimiter::<u8>::builder(store.clone(), q)
            .try_build()
            .is_ok());
    }
}
