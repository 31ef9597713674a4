//! The Redis store attacked where its promises meet other features: key names that could
//! collide, give-backs that could come after their lease expired, state lost under a lease,
//! the local fallback with tiny quotas and many instances, and quotas changed while serving.
//! Each test gives exact numbers; those that need a server start a real `redis-server`.

#![cfg(feature = "redis")]

mod common;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::key::{self, Global, Header, KeyExtractor, KeyExtractorExt, PeerIp, Route};
use tollgate::redis::{FailMode, Lease, RedisKey, RedisRateLimiter, RedisStore, Share};
use tollgate::{Clock, ManualClock, Quota};

/// A closure extractor, named `name`.
fn named(name: &str) -> impl KeyExtractor<Key = u8> + Clone {
    key::from_fn(|_: &key::RequestHead<'_>| Some(1u8)).named(name)
}

#[test]
fn named_extractors_whose_names_hold_commas_or_parentheses_describe_different_keys() {
    // Two `or` chains that differ in which name holds the separator.
    let a = named("p,named:q").or(named("r"));
    let b = named("p").or(named("q,named:r"));
    assert_ne!(a.describe(), b.describe());
    // The same with tuples, and a name that closes the tuple early.
    let a = (named("a,named:b"), named("c"));
    let b = (named("a"), named("b,named:c"));
    assert_ne!(a.describe(), b.describe());
    let a = (named("x),(named:y"), named("z"));
    let b = ((named("x"), named("y")), named("z"));
    assert_ne!(a.describe(), b.describe());
    // A plain name reads as given.
    assert_eq!(named("tenant").describe().as_deref(), Some("named:tenant"));
}

#[test]
fn empty_names_and_names_with_colons_or_hashes_never_describe_a_built_in_extractor() {
    let built_in = [
        Global.describe(),
        Route.describe(),
        PeerIp.describe(),
        Header::new("route").describe(),
        Header::new("x-a").describe(),
    ];
    for name in [
        "",
        "route",
        "global",
        "header:x-a",
        "peer-ip/64",
        "a#b",
        "a:b",
    ] {
        let d = named(name).describe();
        assert!(!built_in.contains(&d), "{name:?}: {d:?}");
    }
    // A header named like an extractor is still a header.
    assert_eq!(
        Header::new("route").describe().as_deref(),
        Some("header:route")
    );
    // Names alike describe alike (the promise of `named`); different ones never.
    assert_eq!(named("").describe(), named("").describe());
    assert_ne!(named("").describe(), named(" ").describe());
}

#[test]
fn nested_tuples_and_flat_tuples_describe_different_keys() {
    let flat = (Route, Global, PeerIp);
    let left = ((Route, Global), PeerIp);
    let right = (Route, (Global, PeerIp));
    let all = [flat.describe(), left.describe(), right.describe()];
    assert_eq!(all[0].as_deref(), Some("(route,global,peer-ip/64)"));
    assert_eq!(all[1].as_deref(), Some("((route,global),peer-ip/64)"));
    assert_eq!(all[2].as_deref(), Some("(route,(global,peer-ip/64))"));
    // `or` is not a tuple, whichever side is first.
    assert_ne!(Route.or(Global).describe(), (Route, Global).describe());
    assert_ne!(Route.or(Global).describe(), Global.or(Route).describe());
}

/// The clock of the give-back test, moved on by [`StepKey`] when armed.
static STEP: OnceLock<Mutex<Option<(ManualClock, Duration)>>> = OnceLock::new();
static ARMED: AtomicBool = AtomicBool::new(false);

/// A key whose first Redis name written while [`ARMED`] moves the clock on: a give-back that
/// takes that long to reach Redis, so that the ones after it leave after their lease ends.
#[derive(Clone, Debug)]
struct StepKey(u32);

impl PartialEq for StepKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for StepKey {}
impl Hash for StepKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl RedisKey for StepKey {
    fn write_key(&self, out: &mut Vec<u8>) {
        if ARMED.swap(false, Ordering::SeqCst) {
            if let Some((time, by)) = &*STEP.get_or_init(Mutex::default).lock().unwrap() {
                time.advance(*by);
            }
        }
        self.0.write_key(out)
    }
}

#[tokio::test]
async fn return_leases_never_sends_a_give_back_after_its_lease_expired() {
    const KEYS: u32 = 300;
    const HOLD: Duration = Duration::from_millis(100);
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    *STEP.get_or_init(Mutex::default).lock().unwrap() = Some((time.clone(), HOLD * 2));
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5))
        .deny_cache(0)
        .lease(Lease::new(2, HOLD));
    // One per minute, burst 10: Redis restores nothing worth a unit within the test.
    let quota = Quota::per_hour(60).burst(10);
    let a = RedisRateLimiter::<StepKey>::builder(store.clone(), quota.clone())
        .name("steps")
        .clock(clock.clone())
        .build();
    // Per key: a request alone, then one that takes a batch of 2 and holds 1.
    for k in 0..KEYS {
        assert!(a.check(&StepKey(k)).await.is_allowed());
        assert!(a.check(&StepKey(k)).await.is_allowed());
    }
    assert_eq!(a.leased(), 0);
    // The first give-back reaches Redis two holds later: every other lease has expired by
    // the time its give-back would leave.
    ARMED.store(true, Ordering::SeqCst);
    a.return_leases().await;
    ARMED.store(false, Ordering::SeqCst);
    let plain = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .deny_cache(0);
    let reader = RedisRateLimiter::<StepKey>::builder(plain, quota)
        .name("steps")
        .clock(clock)
        .build();
    let mut remaining = [0u32; 11];
    for k in 0..KEYS {
        let left = reader.peek(&StepKey(k)).await.remaining() as usize;
        remaining[left] += 1;
    }
    // 3 taken of 10 per key, 1 of them given back in time: one key at 8, the rest at 7.
    let mut expected = [0u32; 11];
    expected[8] = 1;
    expected[7] = KEYS - 1;
    assert_eq!(remaining, expected);
}

/// An instance of `per_minute(60).burst(40)` leasing batches of up to 16 for 100 ms, on a
/// connection of its own and without a deny cache (every refusal is Redis's).
async fn leasing(server: &RedisServer, clock: &Clock) -> RedisRateLimiter<&'static str> {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .lease(Lease::new(16, Duration::from_millis(100)));
    RedisRateLimiter::builder(store, Quota::per_minute(60).burst(40))
        .name("flushed")
        .clock(clock.clone())
        .build()
}

/// Admits requests on `limiter` until it holds 15 units (batches 1, 2, 4, 8, 16: 31 taken).
async fn hold_fifteen(limiter: &RedisRateLimiter<&'static str>) {
    for _ in 0..16 {
        assert!(limiter.check(&"k").await.is_allowed());
    }
}

/// Admits requests of cost 1 for `"k"` until one is refused; how many.
async fn flood(limiter: &RedisRateLimiter<&'static str>) -> u32 {
    let mut admitted = 0;
    while limiter.check(&"k").await.is_allowed() {
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn a_give_back_into_a_flushed_key_never_lifts_it_above_its_burst() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    let b = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    // Redis loses every key while A holds 15 units of a live lease.
    server.cli(&["FLUSHALL"]).unwrap();
    time.advance(Duration::from_millis(50));
    a.return_leases().await;
    // The key is at its burst again, and the 15 given back add nothing to it.
    assert_eq!(flood(&b).await, 40);
    assert_eq!(flood(&a).await, 0);
}

#[tokio::test]
async fn a_give_back_after_a_restart_never_lifts_the_key_above_its_burst() {
    let mut server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    server.restart();
    time.advance(Duration::from_millis(50));
    // The connection comes back on its own; the give-back may be lost on the way, never more.
    a.return_leases().await;
    let b = leasing(&server, &clock).await;
    assert_eq!(flood(&b).await, 40);
}

#[tokio::test]
async fn units_held_when_redis_loses_the_key_are_still_spent_within_their_hold() {
    let server = RedisServer::start();
    let (clock, time) = Clock::manual();
    let a = leasing(&server, &clock).await;
    let b = leasing(&server, &clock).await;
    hold_fifteen(&a).await;
    server.cli(&["FLUSHALL"]).unwrap();
    // B gets a whole burst from the emptied key; A still spends the 15 Redis granted before.
    assert_eq!(flood(&b).await, 40);
    let mut from_lease = 0;
    while a.check(&"k").await.is_allowed() {
        from_lease += 1;
    }
    assert_eq!(from_lease, 15);
    // One hold later nothing is left anywhere.
    time.advance(Duration::from_millis(100));
    assert_eq!(flood(&a).await, 0);
    assert_eq!(flood(&b).await, 0);
}

/// A store whose Redis never answers (a port nothing listens on), falling back to `share`.
fn unreachable(share: Share) -> RedisStore {
    let port = common::redis_server::free_port();
    RedisStore::open(&format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .timeout(Duration::from_millis(200))
        .on_failure(FailMode::Local(share))
}

#[tokio::test]
async fn ten_instances_at_a_tenth_of_five_per_minute_admit_ten_at_once_then_five_per_minute() {
    let (clock, time) = Clock::manual();
    let instances: Vec<RedisRateLimiter<&'static str>> = (0..10)
        .map(|_| {
            RedisRateLimiter::builder(
                unreachable(Share::one_in(10).unwrap()),
                Quota::per_minute(5),
            )
            .name("login")
            .clock(clock.clone())
            .build()
        })
        .collect();
    // Each instance: burst max(1, ⌊5 / 10⌋) = 1, then one per 2 minutes.
    let mut per_minute = Vec::new();
    for minute in 0..=10 {
        if minute > 0 {
            time.advance(Duration::from_secs(60));
        }
        let mut admitted = 0;
        for i in &instances {
            loop {
                let d = i.check(&"k").await;
                assert!(d.is_degraded() && d.is_local());
                if !d.is_allowed() {
                    break;
                }
                admitted += 1;
            }
        }
        per_minute.push(admitted);
    }
    assert_eq!(per_minute, [10, 0, 10, 0, 10, 0, 10, 0, 10, 0, 10]);
    // The documented bound over the 10 minutes: 10 × 1 + 5 per minute × 10 = 60, exactly.
    assert_eq!(per_minute.iter().sum::<u32>(), 60);
}
