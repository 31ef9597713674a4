//! Warm-up in Redis: the script's integer arithmetic against the memory store's, on random
//! quotas (warm-up periods from a millisecond to weeks, where the script's products exceed
//! 2^53 and it multiplies bit by bit), to the request and to the microsecond; and what Redis
//! keeps for a key.
//!
//! Pins docs/design.md section 1 ("Other kinds": warm-up) and section 3 ("Redis").
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{connection, RedisServer, ServerClock};
use common::twins::{self, Twins};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Outcome, Quota};

/// A warm-up quota whose interval is whole milliseconds, beside an optional plain one.
fn quotas() -> impl Strategy<Value = Vec<Quota>> {
    let warm = (
        1u32..8,
        1u64..400,
        1u32..6,
        prop_oneof![1u64..5_000, 5_000u64..3_000_000_000],
        1u32..12,
    )
        .prop_map(|(count, ms, burst, warm_ms, cold)| {
            Quota::new(count, Duration::from_millis(ms * u64::from(count)))
                .burst(burst)
                .warm_up(Duration::from_millis(warm_ms), cold)
        });
    // Rates whose interval is whole microseconds, as the script keeps it.
    let plain = proptest::option::of(prop::sample::select(vec![1u32, 2, 4, 5, 10]));
    (warm, plain).prop_map(|(w, plain)| match plain {
        Some(n) => vec![w, Quota::per_second(n)],
        None => vec![w],
    })
}

/// (gap before the request in ms, key, cost)
fn requests() -> impl Strategy<Value = Vec<(u64, u8, u32)>> {
    let gap = prop_oneof![0u64..600, 0u64..20_000];
    prop::collection::vec((gap, 0u8..2, 0u32..4), 1..60)
}

type Seen = (Outcome, Option<Duration>, Vec<u64>, Vec<Duration>);

fn seen(d: &tollgate::Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after(),
        d.states().iter().map(|s| s.remaining()).collect(),
        d.states().iter().map(|s| s.reset_after()).collect(),
    )
}

#[test]
fn the_script_decides_warm_up_as_the_memory_store_does() {
    compare(
        "warm",
        128,
        (quotas(), Just(None::<(usize, Vec<Quota>)>), requests()),
    );
}

#[test]
fn quotas_replaced_while_serving_decide_warm_up_as_the_memory_store_does() {
    let change = (quotas(), 0usize..60).prop_map(|(q, at)| Some((at, q)));
    compare("warm-live", 64, (quotas(), change, requests()));
}

/// Runs `cases` random cases of (quotas, an optional change of them before request `at`,
/// requests) on Redis and in memory side by side: every decision alike, through the change
/// too (a key idle at a change of curve is new on both, docs/design.md section 3). The
/// decisions run on the manual clock, and every Redis key persists after each step: a case in
/// which the server expired one on its own clock before that is void (`ServerClock`).
fn compare(
    name: &str,
    cases: u32,
    strategy: impl Strategy<Value = (Vec<Quota>, Option<(usize, Vec<Quota>)>, Vec<(u64, u8, u32)>)>,
) {
    let server = RedisServer::start();
    let rt = twins::runtime();
    // A timeout no loaded machine reaches: a degraded decision fails the comparison.
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let conn = rt.block_on(connection(&server));
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(&strategy, |(before, change, reqs)| {
            case_no.set(case_no.get() + 1);
            let twins = Twins::new(&store, format!("{name}-{}", case_no.get()), &before);
            let mut server_clock = rt.block_on(ServerClock::watch(&conn));
            let outcome = (|| {
                for (i, &(gap, key, cost)) in reqs.iter().enumerate() {
                    if let Some((at, after)) = &change {
                        if i == *at {
                            // As many quotas, of the same kinds, as a change while serving
                            // needs.
                            let mut after = after.clone();
                            after.truncate(before.len());
                            if after.len() < before.len() {
                                after.push(before[1].clone());
                            }
                            twins.set_quotas(&after);
                        }
                    }
                    let got = twins.decide(&rt, Duration::from_millis(gap), key, cost);
                    rt.block_on(server_clock.keep_all());
                    let Some((redis, memory)) = got else {
                        return Err(TestCaseError::fail(format!("Redis failed at request {i}")));
                    };
                    prop_assert_eq!(seen(&redis), seen(&memory), "request {}", i);
                }
                Ok(())
            })();
            rt.block_on(server_clock.judge(outcome))
        })
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
async fn a_warm_up_key_holds_two_words_and_expires_once_cold_again() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, _time) = Clock::manual();
    let quota = Quota::per_second(1)
        .burst(1)
        .warm_up(Duration::from_secs(4), 3);
    let limiter = RedisRateLimiter::<&str>::builder(store, quota)
        .name("warm")
        .clock(clock)
        .build();
    let key = String::from_utf8(limiter.redis_key(&"k")).unwrap();
    assert!(limiter.check(&"k").await.is_allowed());
    // The TAT 2.5 s ahead, and 1 s of stored permits spent (in µs).
    let words = redis_cli(&server, &["GET", &key]);
    let words: Vec<u64> = words.split(' ').map(|w| w.parse().unwrap()).collect();
    assert_eq!(words.len(), 2);
    assert_eq!(words[1], 1_000_000);
    // Idle, it is back to "never seen" once the TAT has passed and the second of permits is
    // regained (1 s at 1 s per s): 3.5 s, plus 1 µs of rounding up, in whole ms.
    let ttl: i64 = redis_cli(&server, &["PTTL", &key]).parse().unwrap();
    assert!(ttl > 3_000 && ttl <= 3_501, "{ttl}");
}

/// The script's `idiv` and `muldiv`, cut out of it as they are.
fn script_arithmetic() -> String {
    let script = concat!(
        include_str!("../../src/redis/prelude.lua"),
        include_str!("../../src/redis/gcra.lua")
    );
    let cut = |from: &str| {
        let start = script.find(from).expect("function in the script");
        let end = script[start..].find("\nend\n").expect("its end") + start + 5;
        script[start..end].to_owned()
    };
    format!(
        "{}\n{}\nreturn string.format('%.0f', muldiv(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])))",
        cut("local function idiv"),
        cut("local function muldiv")
    )
}

#[test]
fn the_scripts_long_multiplication_is_exact_below_2_to_the_52() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let con = rt.block_on(connection(&server));
    let src = script_arithmetic();
    const LIMIT: u64 = 1 << 52;
    let mut runner = TestRunner::new(Config::with_cases(512));
    runner
        .run(
            &(
                prop_oneof![1u64..1 << 20, 1u64..LIMIT],
                prop_oneof![1u64..1 << 20, 1u64..LIMIT],
                prop_oneof![1u64..1 << 20, 1u64..LIMIT],
            ),
            |(x, y, d)| {
                let exact = u128::from(x) * u128::from(y) / u128::from(d);
                // The script's contract: a result below 2^53.
                if exact >= 1 << 53 {
                    return Ok(());
                }
                let got: String = rt
                    .block_on(
                        redis::cmd("EVAL")
                            .arg(&src)
                            .arg(0)
                            .arg(x)
                            .arg(y)
                            .arg(d)
                            .query_async(&mut con.clone()),
                    )
                    .unwrap();
                prop_assert_eq!(got.parse::<u128>().unwrap(), exact, "{} * {} / {}", x, y, d);
                Ok(())
            },
        )
        .unwrap();
}

#[tokio::test]
async fn extreme_warm_up_settings_stay_exact_in_the_script() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let max = tollgate::warmup::MAX_WARM_UP_PERIOD;
    for (i, quota) in [
        Quota::per_second(1).warm_up(max, 3),
        Quota::per_second(1000).burst(1000).warm_up(max, u32::MAX),
        Quota::per_day(1).burst(1 << 15).warm_up(max, 2),
        Quota::per_second(1).warm_up(Duration::from_micros(1), 1),
    ]
    .into_iter()
    .enumerate()
    {
        // The server's own clock (about 1.8e15 µs since 1970), as in production.
        let redis = RedisRateLimiter::<u8>::builder(store.clone(), quota.clone())
            .name(format!("edge-{i}"))
            .build();
        for cost in [0, 1, 2, u32::MAX] {
            let d = redis.check_n(&0, cost).await;
            assert!(
                !d.is_degraded(),
                "quota {i}, cost {cost}: the script failed"
            );
        }
        let d = redis.peek(&0).await;
        assert!(!d.is_degraded());
        assert!(d.remaining() <= u64::from(quota.burst_size()));
    }
}
