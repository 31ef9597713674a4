//! The script of quotas without warm-up (src/redis/plain.lua), which takes its arguments as
//! strings, at the limits of what it is given: counts of `u32::MAX` (a sliding log's most),
//! costs of `u32::MAX` and one below, bursts whose tolerance is near the largest the store
//! takes, windows up to the widest a sliding counter may have at its count, and times near
//! the clock's first instant or decades after it (a client clock far ahead of the server's,
//! whose own clock sets only the keys' lifetimes). Windows and intervals are a second or
//! more, so that a key's time to live on the server's clock outlasts the test's steps on the
//! manual clock. On random sequences of requests, waits and live changes, a Redis limiter
//! decides as a memory limiter on the same manual clock, to the request and every field.
//!
//! Pins docs/design.md section 1 (the decision, every kind) and section 3 ("Redis": one script
//! call decides as memory does).
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::twins::{self, Twins};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Decision, Outcome, Quota, RateLimiter};

type Seen = (Outcome, Option<u128>, Vec<u64>, Vec<Duration>);

/// What a decision reports; the retry time in whole microseconds, rounded up (the script's
/// resolution).
fn seen(d: &Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after().map(|r| r.as_nanos().div_ceil(1000)),
        d.states().iter().map(|s| s.remaining()).collect(),
        d.states().iter().map(|s| s.reset_after()).collect(),
    )
}

const US: fn(u64) -> Duration = Duration::from_micros;

/// Quotas at the limits, each in two variants to change between (same kind).
fn extremes() -> Vec<[Quota; 2]> {
    let s = Duration::from_secs(1);
    vec![
        // The largest count, over one second or three.
        [
            Quota::fixed_window(u32::MAX, s),
            Quota::fixed_window(u32::MAX - 1, 3 * s),
        ],
        // The largest count a sliding log may hold.
        [
            Quota::sliding_log(10_000, s),
            Quota::sliding_log(9_999, 3 * s),
        ],
        // Twice the count times the width in µs just below 2^53.
        [
            Quota::sliding_window(u32::MAX, s),
            Quota::sliding_window(u32::MAX / 2, US(2_000_000)),
        ],
        [
            Quota::sliding_window(1, US((1 << 51) - 1)),
            Quota::sliding_window(2, US((1 << 50) - 1)),
        ],
        // A window of 35 years.
        [
            Quota::fixed_window(3, US(1 << 50)),
            Quota::fixed_window(2, US(1 << 49)),
        ],
        // One per second, a burst of half of u32::MAX (68 years: twice that past today's
        // clock stays below 2^53 µs, which a burst of u32::MAX does not, see below); one per
        // two seconds, a quarter of u32::MAX.
        [
            Quota::per_second(1).burst(u32::MAX / 2),
            Quota::per_second(2).burst(u32::MAX / 2 - 1),
        ],
        [
            Quota::new(1, 2 * s).burst(u32::MAX / 4),
            Quota::new(1, 3 * s).burst(u32::MAX / 4 - 1),
        ],
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Check(u8, u32),
    /// The clock moves on by this many µs.
    Wait(u64),
    Change(usize),
}

fn cost() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..4,
        Just(u32::MAX),
        Just(u32::MAX - 1),
        Just(u32::MAX / 2),
        Just(u32::MAX / 2 + 1),
        any::<u32>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..2, cost()).prop_map(|(k, c)| Op::Check(k, c)),
        3 => prop_oneof![
            0u64..2_000,
            0u64..3_000_000,
            Just(1u64 << 40),
            Just(1u64 << 47),
        ]
        .prop_map(Op::Wait),
        1 => (0usize..2).prop_map(Op::Change),
    ]
}

/// A start near the clock's first instant, or decades on (µs since the epoch in 2023, near
/// the 35 years of `1 << 50` µs, and in 2033: ahead of the server's clock).
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..3,
        Just(1_700_000_000_000_000u64),
        Just((1u64 << 50) - (1 << 45)),
        Just(2_000_000_000_000_000u64),
    ]
}

#[test]
fn the_plain_script_decides_quotas_at_their_limits_as_the_memory_store_does() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let extremes = extremes();
    // Every quota is one the Redis store takes.
    for pair in &extremes {
        for q in pair {
            let built = RedisRateLimiter::<u8>::builder(store.clone(), q.clone())
                .name("probe")
                .try_build();
            assert!(built.is_ok(), "{q:?}: {:?}", built.err());
        }
    }
    let strategy = (
        0..extremes.len(),
        proptest::option::of(0..extremes.len()),
        start(),
        prop::collection::vec(op(), 1..40),
    );
    let mut runner = TestRunner::new(Config::with_cases(64));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(&strategy, |(first, second, start, ops)| {
            case_no.set(case_no.get() + 1);
            // One quota, or two of different extremes (kept in their order when changed).
            let pick = |v: usize| -> Vec<Quota> {
                let mut q = vec![extremes[first][v].clone()];
                if let Some(s) = second {
                    q.push(extremes[s][v].clone());
                }
                q
            };
            let twins = Twins::new(&store, format!("limits-{}", case_no.get()), &pick(0));
            twins.time.advance(US(start));
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Check(key, cost) => {
                        let got = twins.decide(&rt, Duration::ZERO, key, cost);
                        let Some((redis, memory)) = got else {
                            return Err(TestCaseError::fail(format!("Redis failed at op {i}")));
                        };
                        prop_assert_eq!(seen(&redis), seen(&memory), "op {}", i);
                    }
                    Op::Wait(us) => twins.time.advance(US(us)),
                    Op::Change(v) => twins.set_quotas(&pick(v)),
                }
            }
            Ok(())
        })
        .unwrap();
}

/// One per second with a burst of `u32::MAX` (a tolerance of 136 years, which the Redis store
/// takes), at a time of today's clock (1.7 × 10^15 µs since the epoch, and 397 µs: an odd
/// number): a request of the whole burst is admitted, and the same again is told to retry in
/// exactly the burst's 4 294 967 295 s, as the memory store says. Now, the key's lead and the
/// request's cost together (about 10^16 µs) are past 2^53, where Lua's doubles step by 2; the
/// lead and the cost alone are not, and the script adds the cost to the lead. `general`:
/// through the general script (src/redis/gcra.lua), which a limiter with a penalty box runs
/// (this one never bans).
fn burst_of_u32_max(name: &str, general: bool) {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let quota = Quota::per_second(1).burst(u32::MAX);
    let (clock, time) = Clock::manual();
    let mut b = RedisRateLimiter::<u8>::builder(store, quota.clone())
        .name(name.to_owned())
        .clock(clock.clone());
    if general {
        b = b.penalty_box(PenaltyBox::new(
            1_000_000,
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    }
    let redis = b.build();
    let memory = RateLimiter::<u8>::builder(quota).clock(clock).build();
    time.advance(US(1_700_000_000_000_397));
    assert!(rt.block_on(redis.check_n(&1, u32::MAX)).is_allowed());
    assert!(memory.check_n(&1, u32::MAX).is_allowed());
    let r = rt.block_on(redis.check_n(&1, u32::MAX));
    let m = memory.check_n(&1, u32::MAX);
    assert_eq!(
        m.retry_after(),
        Some(Duration::from_secs(u64::from(u32::MAX)))
    );
    assert_eq!(seen(&r), seen(&m));
}

#[test]
fn a_burst_of_u32_max_at_one_per_second_is_told_to_retry_after_its_whole_burst() {
    burst_of_u32_max("burst-plain", false);
}

#[test]
fn a_burst_of_u32_max_at_one_per_second_is_told_to_retry_after_its_whole_burst_by_the_general_script(
) {
    burst_of_u32_max("burst-general", true);
}
