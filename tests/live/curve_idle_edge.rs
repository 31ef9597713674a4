//! A change of quotas at the instant a key goes idle under the old ones, on a real
//! `redis-server` beside the memory store. Memory makes every key idle at a change of a
//! warm-up curve new (`RateLimiter::set_quotas`). A Redis key's time to live runs to its idle
//! time plus 1 µs, rounded up to whole milliseconds, so a change inside that last millisecond
//! finds the key still stored on a server whose clock is the limiter's (the production
//! setting: the script reads the server's `TIME`); the script is told when the curve changed
//! and what it was, and decides a key idle then as a new one. The manual clock here stands
//! still on the server's side, so the key is still stored at the change just as it would be on
//! a real clock within that millisecond.
//! A key active at a change to a curve that regains more slowly outlives its old time to
//! live on both stores: the change lengthens it in Redis. For every other kind, a key idle
//! under the old quota decides under the new one as a new key does, stored or not, and both
//! stores agree.
//!
//! Pins docs/design.md section 3 ("A live quota change": a key idle under the quotas in force
//! at a change is a new key, and a Redis key that expired while idle decides as a kept one).

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{connection, RedisServer};
use common::twins::{self, Twins};
use tollgate::redis::RedisStore;
use tollgate::{Decision, Outcome, Quota};

const MS: Duration = Duration::from_millis(1);

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

/// One per second, burst 1, warming up over 4 s from a third of the rate: an admission at
/// 10 s leaves the key idle at 13.5 s (its time 2.5 s ahead, and the second of permits it
/// spent regained in one more), and Redis gives it 3 501 ms to live (3.5 s plus 1 µs, rounded
/// up to the millisecond, as pinned by the `rate_limit` group's
/// `warmup_redis::a_warm_up_key_holds_two_words_and_expires_once_cold_again`).
fn old() -> Quota {
    Quota::per_second(1)
        .burst(1)
        .warm_up(Duration::from_secs(4), 3)
}

/// The curve put in force: ten per second, burst 5, warming up over 2 s from a tenth.
fn new() -> Quota {
    Quota::per_second(10)
        .burst(5)
        .warm_up(Duration::from_secs(2), 10)
}

/// The admission at 10 s, then a change to [`new`] `after` it; the next six requests of cost
/// 1, 250 ms apart, decided on both stores: (Redis, memory) for each, and whether Redis still
/// held the key at the change.
fn change_after(server: &RedisServer, name: &str, after: Duration) -> (Vec<(Seen, Seen)>, bool) {
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let twins = Twins::new(&store, name.to_owned(), &[old()]);
    twins.time.advance(Duration::from_secs(10));
    let (r, m) = twins
        .decide(&rt, Duration::ZERO, 0, 1)
        .expect("Redis decides");
    assert!(r.is_allowed() && m.is_allowed());
    twins.time.advance(after);
    let mut conn = rt.block_on(connection(server));
    let held: bool = rt
        .block_on(
            redis::cmd("EXISTS")
                .arg(twins.redis.redis_key(&0))
                .query_async(&mut conn),
        )
        .unwrap();
    twins.set_quotas(&[new()]);
    let mut out = Vec::new();
    for i in 0..6 {
        let gap = if i == 0 { Duration::ZERO } else { 250 * MS };
        let (r, m) = twins.decide(&rt, gap, 0, 1).expect("Redis decides");
        out.push((seen(&r), seen(&m)));
    }
    (out, held)
}

/// A change 1 ms before the key goes idle keeps it on both stores: it is judged by the new
/// curve from what it stored, alike.
#[test]
fn a_change_of_curve_before_the_key_goes_idle_keeps_it_on_both_stores_alike() {
    let server = RedisServer::start();
    let (seen, held) = change_after(&server, "curve-before-idle", Duration::from_millis(3_499));
    assert!(held);
    for (i, (redis, memory)) in seen.iter().enumerate() {
        assert_eq!(redis, memory, "request {i}");
    }
}

/// At the instant the key goes idle under the old curve (13.5 s), memory makes it new: fully
/// cold under the new curve, its first request leaves 0 requests and 876.25 ms to reset. The
/// Redis key, 1 ms from its expiry (its time to live is rounded up to whole ms), is still
/// stored: the script, told when the curve changed and what it was, finds the key idle then
/// and decides it as a new key too.
#[test]
fn a_change_of_curve_at_the_instant_the_key_goes_idle_decides_alike_on_both_stores() {
    let server = RedisServer::start();
    let (seen, held) = change_after(&server, "curve-at-idle", Duration::from_millis(3_500));
    assert!(held);
    for (i, (redis, memory)) in seen.iter().enumerate() {
        assert_eq!(redis, memory, "request {i}");
    }
}

/// A quota of each kind other than warm-up, in two variants (the second's window or interval
/// narrower or wider), whole milliseconds of a second or more.
fn kind(k: u8, wide: bool, count: u32) -> Quota {
    let ms = Duration::from_millis(if wide { 3_000 } else { 1_000 });
    match k {
        0 => Quota::new(count, ms * count).burst(count),
        1 => Quota::fixed_window(count, ms),
        2 => Quota::sliding_log(count, ms),
        _ => Quota::sliding_window(count, ms),
    }
}

/// For a quota of each kind but warm-up, a change at the first millisecond at which a key is
/// idle under the quota in force (while Redis still holds it, its time to live running to the
/// next millisecond or later) decides alike on both stores: what its state says under the
/// new quota is what a new key says, since what left a window stays gone and a time passed
/// is passed under any quota.
#[test]
fn a_change_at_the_first_instant_a_key_is_idle_decides_alike_on_both_stores_for_every_other_kind() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let strategy = (
        0u8..4,
        any::<bool>(),
        1u32..4,
        1u32..4,
        prop::collection::vec((0u64..400, 0u32..3), 1..8),
    );
    let mut runner = TestRunner::new(Config::with_cases(48));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(&strategy, |(k, wide, before, after, reqs)| {
            case_no.set(case_no.get() + 1);
            let old = kind(k, wide, before);
            let twins = Twins::new(
                &store,
                format!("idle-edge-{}", case_no.get()),
                std::slice::from_ref(&old),
            );
            let shadow = tollgate::RateLimiter::<u8>::builder(old)
                .clock(twins.memory.clock().clone())
                .build();
            twins.time.advance(Duration::from_secs(10));
            for &(gap, cost) in &reqs {
                let (r, m) = twins
                    .decide(&rt, Duration::from_millis(gap), 0, cost)
                    .ok_or_else(|| TestCaseError::fail("Redis failed"))?;
                let _ = shadow.check_n(&0, cost);
                prop_assert_eq!(seen(&r), seen(&m));
            }
            let mut waited = 0;
            while shadow.evict_idle() > 0 {
                twins.time.advance(MS);
                waited += 1;
                prop_assert!(waited < 20_000);
            }
            twins.set_quotas(&[kind(k, !wide, after)]);
            for i in 0..6u64 {
                let (r, m) = twins
                    .decide(&rt, Duration::from_millis((i % 2) * 300), 0, 1)
                    .ok_or_else(|| TestCaseError::fail("Redis failed"))?;
                prop_assert_eq!(seen(&r), seen(&m), "request {} after the change", i);
            }
            Ok(())
        })
        .unwrap();
}

/// A change of curve 1 s after the admission, while the key is active under both curves: the
/// key's time to live in Redis was set by the old curve (3 501 ms after the admission). The
/// change lengthens it in the background to when the key is idle under the new curve, which
/// regains more slowly; memory keeps the key warm that long too. On a server whose clock is
/// the limiter's, a key whose time to live ran out is gone: emulated here by deleting the key
/// once the limiter's clock passes it (the server's own clock standing still). One
/// millisecond after the old time to live, both stores still hold the key warm and decide
/// alike (memory r=3, t=127.123ms).
#[test]
fn a_key_active_at_a_change_of_curve_decides_alike_on_both_stores_once_its_time_to_live_ran_out() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    let mut conn = rt.block_on(connection(&server));
    let twins = Twins::new(&store, "curve-expired".to_owned(), &[old()]);
    twins.time.advance(Duration::from_secs(10));
    let (r, m) = twins.decide(&rt, Duration::ZERO, 0, 1).unwrap();
    assert!(r.is_allowed() && m.is_allowed());
    let key = twins.redis.redis_key(&0);
    let ttl: i64 = rt
        .block_on(redis::cmd("PTTL").arg(&key).query_async(&mut conn))
        .unwrap();
    assert!((3_000..=3_501).contains(&ttl), "{ttl}");
    twins.time.advance(Duration::from_secs(1));
    twins.set_quotas(&[new()]);
    rt.block_on(twins.redis.until_expiry_lengthened());
    // What the key has left, 1 s after its admission, on the limiter's clock.
    let left: i64 = rt
        .block_on(redis::cmd("PTTL").arg(&key).query_async(&mut conn))
        .unwrap();
    assert!(left > 2_502, "the change left the key {left} ms");
    // 1 ms past the old time to live (3 501 ms after the admission).
    let later = Duration::from_millis(2_502);
    twins.time.advance(later);
    if u128::try_from(left).unwrap_or(0) <= later.as_millis() {
        let _: i64 = rt
            .block_on(redis::cmd("DEL").arg(&key).query_async(&mut conn))
            .unwrap();
    }
    let (r, m) = twins.decide(&rt, Duration::ZERO, 0, 1).unwrap();
    assert_eq!(seen(&r), seen(&m));
}
