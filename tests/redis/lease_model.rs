//! Leases never give back what Redis already refilled: a unit is used at most `hold` after
//! Redis granted it, the units of an expired lease are never returned, and the fleet never
//! admits more than `burst + rate × (t + hold)` over any span `t`, whatever the instances do
//! (join, leave without a word, give back at shutdown). Several instances on separate
//! connections, a manual clock, a real `redis-server`.
//!
//! Pins docs/design.md section 3 ("Redis": a leased unit is used at most its hold after Redis
//! granted it).

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::redis::{Lease, RedisRateLimiter, RedisStore};
use tollgate::{Clock, ManualClock, Quota};

const HOLD: Duration = Duration::from_millis(100);
const BURST: u64 = 40;
/// 60 per minute: one per second.
const INTERVAL_MS: u64 = 1_000;

/// An instance on a connection of its own. Without a deny cache: every refusal is Redis's,
/// so that what comes back to Redis shows at once.
async fn instance(server: &RedisServer, clock: &Clock) -> RedisRateLimiter<&'static str> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .lease(Lease::new(16, HOLD));
    // The daily quota never limits here; it keeps the key alive on Redis's own clock while
    // the test's clock runs ahead.
    RedisRateLimiter::builder(store, Quota::per_minute(60).burst(BURST as u32))
        .quota(Quota::per_day(1_000_000).burst(1_000_000))
        .name("model")
        .clock(clock.clone())
        .build()
}

/// Admits one request at a time on `limiter` until it holds a lease of 16 (15 left after the
/// request that took it); how many it admitted.
async fn grow_a_lease(limiter: &RedisRateLimiter<&'static str>) -> u64 {
    let mut admitted = 0;
    // Batches 1, 2, 4, 8, 16: 31 units, the last batch with 15 left after its request.
    while admitted < 16 {
        assert!(limiter.check(&"k").await.is_allowed());
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn units_of_an_expired_lease_are_not_given_back_at_shutdown() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = instance(&server, &clock).await;
    let b = instance(&server, &clock).await;
    grow_a_lease(&a).await;
    // 100 s later the key is full again by time alone; B spends the burst.
    time.advance(Duration::from_secs(100));
    let mut admitted = 0;
    while b.check(&"k").await.is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, BURST);
    // A shuts down and gives back what it holds: nothing, its lease is long expired.
    a.return_leases().await;
    let mut more = 0;
    while b.check(&"k").await.is_allowed() {
        more += 1;
    }
    assert_eq!(more, 0);
    // Nor does an instance's next request for the key an hour after its lease expired.
    let c = instance(&server, &clock).await;
    time.advance(Duration::from_secs(100));
    grow_a_lease(&c).await;
    time.advance(Duration::from_secs(3_600));
    let mut burst = 0;
    while b.check(&"k").await.is_allowed() {
        burst += 1;
    }
    assert_eq!(burst, BURST);
    assert!(!c.check(&"k").await.is_allowed());
    assert!(!b.check(&"k").await.is_allowed());
}

#[tokio::test]
async fn units_of_a_live_lease_go_back_at_shutdown() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = instance(&server, &clock).await;
    let b = instance(&server, &clock).await;
    grow_a_lease(&a).await;
    time.advance(Duration::from_millis(50));
    a.return_leases().await;
    // A admitted 16 and took 31 (1 + 2 + 4 + 8 + 16): the 15 left went back, so B gets the
    // burst less the 16 A admitted.
    let mut admitted = 0;
    while b.check(&"k").await.is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, BURST - 16);
}

#[derive(Debug, Clone, Copy)]
enum Act {
    /// The instance decides a request of this cost.
    Check(u32),
    /// The instance decides requests of cost 1 until one is refused.
    Flood,
    /// The instance gives back its leases (a shutdown), and a new one takes its place.
    Return,
    /// The instance goes away without a word (a crash), and a new one takes its place.
    Crash,
}

/// The clock moves on by `advance` ms, then instance `who` acts.
#[derive(Debug, Clone, Copy)]
struct Op {
    advance: u64,
    who: usize,
    act: Act,
}

fn op() -> impl Strategy<Value = Op> {
    let act = prop_oneof![
        10 => (1..=3u32).prop_map(Act::Check),
        5 => Just(Act::Flood),
        3 => Just(Act::Return),
        1 => Just(Act::Crash),
    ];
    // Mostly at the same instant; sometimes within a hold, about a second, or long enough
    // for the key to refill.
    let advance = prop_oneof![
        12 => Just(0u64),
        3 => 1..50u64,
        2 => 900..1_100u64,
        3 => 41_000..120_000u64,
    ];
    (advance, 0..3usize, act).prop_map(|(advance, who, act)| Op { advance, who, act })
}

/// Runs `ops` on three instances and returns every admission: (time in ms, units).
async fn run(server: &RedisServer, ops: &[Op]) -> Vec<(u64, u64)> {
    let (clock, time): (Clock, ManualClock) = Clock::manual();
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(instance(server, &clock).await);
    }
    let mut now = 0;
    let mut admitted = Vec::new();
    for op in ops {
        time.advance(Duration::from_millis(op.advance));
        now += op.advance;
        let i = op.who;
        match op.act {
            Act::Check(cost) => {
                if fleet[i].check_n(&"k", cost).await.is_allowed() {
                    admitted.push((now, u64::from(cost)));
                }
            }
            Act::Flood => {
                while fleet[i].check(&"k").await.is_allowed() {
                    admitted.push((now, 1));
                }
            }
            Act::Return => {
                fleet[i].return_leases().await;
                fleet[i] = instance(server, &clock).await;
            }
            Act::Crash => fleet[i] = instance(server, &clock).await,
        }
    }
    admitted
}

/// The most units admitted over a span of `t` ms: `burst + rate × (t + hold)`, rounded down.
fn bound(t: u64) -> u64 {
    BURST + (t + HOLD.as_millis() as u64) / INTERVAL_MS
}

#[test]
fn the_fleet_never_admits_more_than_burst_plus_rate_times_the_span_and_a_hold() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(op(), 1..60), |ops| {
            server.cli(&["FLUSHALL"]).unwrap();
            let admitted = rt.block_on(run(&server, &ops));
            for (i, &(start, _)) in admitted.iter().enumerate() {
                let mut sum = 0;
                for &(end, units) in &admitted[i..] {
                    sum += units;
                    prop_assert!(
                        sum <= bound(end - start),
                        "{sum} admitted from {start} ms to {end} ms"
                    );
                }
            }
            Ok(())
        })
        .unwrap();
}

/// An instance with `Lease::new(16, 120 ms)` and a timeout of 400 ms.
async fn slow_instance(server: &RedisServer, name: &'static str) -> RedisRateLimiter<u32> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(400))
        .lease(Lease::new(16, Duration::from_millis(120)));
    RedisRateLimiter::builder(store, Quota::per_second(1_000))
        .name(name)
        .build()
}

#[tokio::test]
async fn every_leased_decision_waits_at_most_the_timeout_while_redis_hangs() {
    let server = RedisServer::start();
    let limiter = slow_instance(&server, "hang").await;
    // The key is hot: batches of several units; then the lease is empty.
    for _ in 0..8 {
        assert!(limiter.check(&1).await.is_allowed());
    }
    limiter.return_leases().await;
    // Redis hangs (SIGSTOP); the test's clock is tokio's, paused, so that the times below are
    // exact: it moves only when every task waits.
    server.pause();
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let d = l.check(&1).await;
                (d.is_degraded(), start.elapsed())
            })
        })
        .collect();
    let mut waits = Vec::new();
    for t in tasks {
        let (degraded, took) = t.await.unwrap();
        assert!(degraded);
        waits.push(took);
    }
    server.resume();
    // The timeout, to tokio's timer resolution (a millisecond, rounded up).
    assert!(
        waits.iter().all(|w| *w <= Duration::from_millis(401)),
        "{waits:?}"
    );
}

#[tokio::test]
async fn return_leases_of_a_hundred_keys_takes_at_most_one_timeout_while_redis_hangs() {
    let server = RedisServer::start();
    let limiter = slow_instance(&server, "shutdown").await;
    // Two requests per key: the second takes a batch of two and holds one unit.
    for key in 0..100 {
        assert!(limiter.check(&key).await.is_allowed());
        assert!(limiter.check(&key).await.is_allowed());
    }
    server.pause();
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    limiter.return_leases().await;
    let took = start.elapsed();
    server.resume();
    // One timeout for all, to tokio's timer resolution (a millisecond, rounded up).
    assert!(took <= Duration::from_millis(401), "{took:?}");
}

#[tokio::test]
async fn another_instance_giving_back_is_seen_by_a_cached_rejection_within_its_max_age() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let quota = Quota::per_hour(10);
    // A: no lease, a deny cache trusted for 250 ms. B: leases of up to 4.
    let a_store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache_max_age(Duration::from_millis(250));
    let b_store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .lease(Lease::new(4, Duration::from_secs(10)));
    let build = |store: RedisStore| {
        RedisRateLimiter::<&'static str>::builder(store, quota.clone())
            .quota(Quota::per_day(1_000_000).burst(1_000_000))
            .name("given-back")
            .clock(clock.clone())
            .build()
    };
    let (a, b) = (build(a_store), build(b_store));
    // B admits 4 and took batches 1, 2 and 4: 7 units, 3 held.
    for _ in 0..4 {
        assert!(b.check(&"k").await.is_allowed());
    }
    // A gets the 3 left, then Redis refuses it, and A caches that.
    for _ in 0..3 {
        assert!(a.check(&"k").await.is_allowed());
    }
    assert!(!a.check(&"k").await.is_allowed());
    b.return_leases().await;
    // A cannot know: it refuses locally until 250 ms after it asked...
    time.advance(Duration::from_millis(249));
    assert!(!a.check(&"k").await.is_allowed());
    assert_eq!(a.local_rejections(), 1);
    // ...then asks Redis, and gets the units B gave back.
    time.advance(Duration::from_millis(1));
    let mut more = 0;
    while a.check(&"k").await.is_allowed() {
        more += 1;
    }
    assert_eq!(more, 3);
}
