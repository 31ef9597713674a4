//! Leased quota on Redis: instances on separate connections hammering one key never admit more
//! than the limit, fall short of it by at most what they may hold, and ask Redis far less
//! often; leases expire, go back, and are not used after a change of quotas or with a
//! penalty box.
//!
//! Pins docs/design.md section 3 ("Redis": leases).
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::redis::{Lease, RedisRateLimiter, RedisStore};
use tollgate::{Clock, ConfigError, ManualClock, Quota};

const MAX_BATCH: u32 = 50;

async fn store(server: &RedisServer, lease: Option<Lease>, deny_cache: bool) -> RedisStore {
    let s = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2));
    let s = if deny_cache { s } else { s.deny_cache(0) };
    match lease {
        Some(l) => s.lease(l),
        None => s,
    }
}

/// `n` instances of one policy: `quota`, and a daily quota that never limits here but keeps
/// the key alive. The limiters send the manual clock's time while Redis expires keys on its
/// own: a key a few units ahead would live a few real milliseconds, and a slow moment of the
/// test would see Redis forget it (and admit again what it had admitted). The daily quota puts
/// the key's expiry seconds away from its first request.
async fn instances(
    server: &RedisServer,
    n: usize,
    quota: &Quota,
    clock: &Clock,
    lease: Option<Lease>,
    deny_cache: bool,
) -> Vec<RedisRateLimiter<&'static str>> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(
            RedisRateLimiter::builder(store(server, lease, deny_cache).await, quota.clone())
                .quota(Quota::per_day(100_000).burst(100_000))
                .name("hot")
                .clock(clock.clone())
                .build(),
        );
    }
    v
}

struct Run {
    admitted: u64,
    decisions: u64,
    allowance: u64,
    calls: u64,
}

/// Three instances, each sending `per_step` requests for one key every `step` of a manual
/// clock, for `seconds`; checks at every step that the total admitted stays within the
/// limit's allowance (burst + rate × elapsed).
async fn hammer(
    server: &RedisServer,
    lease: Option<Lease>,
    deny_cache: bool,
    per_step: u32,
    seconds: u64,
) -> Run {
    // 1000 per second, bursts of 500.
    let quota = Quota::per_second(1000).burst(500);
    let (clock, time): (Clock, ManualClock) = Clock::manual();
    let fleet = instances(server, 3, &quota, &clock, lease, deny_cache).await;
    let calls_before = server.calls("evalsha");
    let step = Duration::from_millis(5);
    let steps = seconds * 200;
    let (mut admitted, mut decisions) = (0u64, 0u64);
    let started = std::time::Instant::now();
    for s in 0..steps {
        for limiter in &fleet {
            for _ in 0..per_step {
                decisions += 1;
                let d = limiter.check(&"tenant").await;
                assert!(!d.is_degraded(), "{d:?}");
                if d.is_allowed() {
                    admitted += 1;
                }
            }
        }
        let allowance = 500 + s * 5;
        assert!(
            admitted <= allowance,
            "{admitted} admitted by step {s}, allowance {allowance}, after {:?} real time",
            started.elapsed()
        );
        time.advance(step);
    }
    Run {
        admitted,
        decisions,
        allowance: 500 + (steps - 1) * 5,
        calls: server.calls("evalsha") - calls_before,
    }
}

#[tokio::test]
async fn instances_hammering_one_key_stay_within_the_limit_and_ask_redis_less() {
    let server = RedisServer::start();
    let lease = Lease::new(MAX_BATCH, Duration::from_millis(100));
    // 3 instances × 20 requests per 5 ms: 12 000 per second against a limit of 1 000.
    let leased = hammer(&server, Some(lease), true, 20, 10).await;
    server.cli(&["FLUSHALL"]);
    server.cli(&["FLUSHALL"]);
    let deny_only = hammer(&server, None, true, 20, 10).await;
    server.cli(&["FLUSHALL"]);
    let plain = hammer(&server, None, false, 20, 10).await;
    let per_decision = |r: &Run| r.calls as f64 / r.decisions as f64;
    for (name, r) in [
        ("lease and deny cache", &leased),
        ("deny cache alone", &deny_only),
        ("neither", &plain),
    ] {
        eprintln!(
            "{name}: {} admitted of {}, {} calls for {} decisions ({:.4})",
            r.admitted,
            r.allowance,
            r.calls,
            r.decisions,
            per_decision(r)
        );
    }
    // Short of the allowance by at most what the instances may hold.
    assert!(
        leased.admitted + 3 * u64::from(MAX_BATCH) >= leased.allowance,
        "{} admitted of {}",
        leased.admitted,
        leased.allowance
    );
    assert!(per_decision(&leased) <= 0.1, "{}", per_decision(&leased));
    assert!(per_decision(&plain) >= 0.99, "{}", per_decision(&plain));
    assert_eq!(plain.admitted, plain.allowance);
}

#[tokio::test]
async fn instances_below_the_limit_are_served_mostly_from_their_leases() {
    let server = RedisServer::start();
    let lease = Lease::new(MAX_BATCH, Duration::from_millis(100));
    // 3 × 1 request per 5 ms: 600 per second, under the limit: every request is admitted.
    let run = hammer(&server, Some(lease), true, 1, 5).await;
    assert_eq!(run.admitted, run.decisions);
    let per_decision = run.calls as f64 / run.decisions as f64;
    eprintln!(
        "below the limit: {} calls for {} decisions ({per_decision:.4})",
        run.calls, run.decisions
    );
    assert!(per_decision <= 0.1, "{per_decision}");
}

#[tokio::test]
async fn an_idle_instance_holds_nothing_usable_after_the_hold_and_never_gives_it_back() {
    let server = RedisServer::start();
    let quota = Quota::per_minute(60).burst(20);
    let (clock, time) = Clock::manual();
    let lease = Lease::new(8, Duration::from_millis(100));
    let fleet = instances(&server, 2, &quota, &clock, Some(lease), true).await;
    let (a, b) = (&fleet[0], &fleet[1]);
    // A takes batches 1, 2, 4, 8: 15 units for 8 requests, 7 held.
    for _ in 0..8 {
        assert!(a.check(&"k").await.is_allowed());
    }
    assert_eq!(b.peek(&"k").await.remaining(), 5);
    // Those 7 are not usable by A after the hold, nor given back with A's next request:
    // Redis restores them by time alone.
    time.advance(Duration::from_millis(100));
    let d = a.check(&"k").await;
    assert!(d.is_allowed());
    assert_eq!(b.peek(&"k").await.remaining(), 20 - 8 - 7 - 1);
    // A shutting down gives back what its live lease holds: batches 2 and 4 for 3 requests.
    for _ in 0..3 {
        let _ = a.check(&"k").await;
    }
    a.return_leases().await;
    assert_eq!(b.peek(&"k").await.remaining(), 20 - 8 - 7 - 1 - 3);
}

#[tokio::test]
async fn no_lease_survives_a_change_of_quotas() {
    let server = RedisServer::start();
    let quota = Quota::per_minute(60).burst(20);
    let (clock, _time) = Clock::manual();
    let lease = Lease::new(8, Duration::from_secs(10));
    let fleet = instances(&server, 1, &quota, &clock, Some(lease), true).await;
    let a = &fleet[0];
    for _ in 0..8 {
        assert!(a.check(&"k").await.is_allowed());
    }
    let leased = a.leased();
    assert!(leased > 0);
    a.set_quotas([
        Quota::per_minute(60).burst(10),
        Quota::per_day(100_000).burst(100_000),
    ])
    .unwrap();
    // Held under the old quotas: the next request asks Redis.
    let calls = server.calls("evalsha");
    assert!(!a.check(&"k").await.is_allowed());
    assert_eq!(a.leased(), leased);
    assert!(server.calls("evalsha") > calls);
}

#[tokio::test]
async fn a_penalty_box_or_a_window_quota_is_not_leased() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let lease = Lease::new(8, Duration::from_secs(1));
    let window = RedisRateLimiter::<&str>::builder(
        store(&server, Some(lease), true).await,
        Quota::fixed_window(100, Duration::from_secs(1)),
    )
    .name("window")
    .clock(clock.clone())
    .build();
    let banned = RedisRateLimiter::<&str>::builder(
        store(&server, Some(lease), true).await,
        Quota::per_second(100),
    )
    .name("banned")
    .clock(clock.clone())
    .penalty_box(tollgate::penalty::PenaltyBox::new(
        3,
        Duration::from_secs(1),
        Duration::from_secs(10),
    ))
    .build();
    for _ in 0..20 {
        let _ = window.check(&"k").await;
        let _ = banned.check(&"k").await;
    }
    assert_eq!(window.leased(), 0);
    assert_eq!(banned.leased(), 0);
}

#[tokio::test]
async fn bad_lease_settings_are_refused_when_the_limiter_is_built() {
    let server = RedisServer::start();
    for (lease, what) in [
        (Lease::new(0, Duration::from_millis(100)), "max_batch"),
        (Lease::new(10, Duration::ZERO), "hold"),
        (Lease::new(10, Duration::from_secs(3600)), "hold"),
        (
            Lease::new(10, Duration::from_millis(100)).max_keys(0),
            "max_keys",
        ),
    ] {
        let err = RedisRateLimiter::<&str>::builder(
            store(&server, Some(lease), true).await,
            Quota::per_second(10),
        )
        .try_build()
        .unwrap_err();
        assert!(matches!(err, ConfigError::InvalidLease(_)), "{err:?}");
        assert!(err.to_string().contains(what), "{err}");
    }
}

#[tokio::test]
async fn after_redis_lost_the_key_only_what_was_held_is_admitted_beyond_the_fresh_burst() {
    let server = RedisServer::start();
    let quota = Quota::per_minute(60).burst(20);
    let (clock, _time) = Clock::manual();
    let lease = Lease::new(8, Duration::from_secs(10));
    let fleet = instances(&server, 3, &quota, &clock, Some(lease), true).await;
    // Each instance takes batches of 1, 2 then 4 (7 units) for 3 requests: 9 admitted, 21 > 20
    // asked for, so the last batch of one instance is refused; whatever, at most 20 in all.
    let mut admitted = 0;
    for limiter in &fleet {
        for _ in 0..3 {
            admitted += u32::from(limiter.check(&"k").await.is_allowed());
        }
    }
    server.cli(&["FLUSHALL"]);
    // With the clock stopped, the fleet admits a fresh burst plus what it still held.
    for _ in 0..40 {
        for limiter in &fleet {
            admitted += u32::from(limiter.check(&"k").await.is_allowed());
        }
    }
    assert!(admitted <= 20 + 20, "{admitted}");
    assert!(admitted >= 20, "{admitted}");
}

#[tokio::test]
async fn during_an_outage_the_held_units_and_the_local_share_are_all_that_is_admitted() {
    let mut server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_millis(100))
        .on_failure(tollgate::redis::FailMode::local(0.5))
        .lease(Lease::new(8, Duration::from_secs(10)));
    let limiter = RedisRateLimiter::<&str>::builder(store, Quota::per_minute(60).burst(20))
        .name("outage")
        .clock(clock)
        .build();
    // Batches of 1, 2 and 4 for four requests: three units held.
    for _ in 0..4 {
        assert!(limiter.check(&"k").await.is_allowed());
    }
    server.kill();
    let mut admitted = 0;
    for _ in 0..15 {
        let d = limiter.check(&"k").await;
        admitted += u32::from(d.is_allowed());
    }
    // The three held, then half the burst from the local fallback, charged one by one (a
    // batch asked of a Redis that does not answer is not charged to the fallback).
    assert_eq!(admitted, 3 + 10);
}

#[tokio::test]
async fn the_edges_of_every_lease_setting_build_and_stay_within_the_burst() {
    let server = RedisServer::start();
    for lease in [
        Lease::new(1, Duration::from_millis(1)),
        Lease::new(u32::MAX, Duration::from_secs(60)),
        Lease::new(u32::MAX, Duration::from_millis(1)).max_keys(1),
        Lease::new(1, Duration::from_secs(60)).max_keys(usize::MAX),
    ] {
        let (clock, _time) = Clock::manual();
        let l = RedisRateLimiter::<&str>::builder(
            store(&server, Some(lease), true).await,
            Quota::per_minute(60).burst(20),
        )
        .quota(Quota::per_day(100_000).burst(100_000))
        .name(format!("edge-{}-{:?}", lease.max_batch(), lease.hold()))
        .clock(clock)
        .try_build()
        .unwrap_or_else(|e| panic!("{lease:?}: {e}"));
        // The clock stands still: exactly the burst, however large a batch may be.
        let mut admitted = 0;
        for _ in 0..60 {
            admitted += u32::from(l.check(&"k").await.is_allowed());
        }
        assert_eq!(admitted, 20, "{lease:?}");
        l.return_leases().await;
        assert_eq!(l.peek(&"k").await.remaining(), 0, "{lease:?}");
    }
}
