//! A live change under which a limit's requests count longer (a sliding log or counter
//! widened, a warm-up curve changed) lengthens the expiry in Redis of every key of the limit,
//! touched by a request after the change or not, to when the memory store would forget it:
//! across many `SCAN` batches, for the keys of that limit only (not another limit's whose
//! name the first one's would match as a pattern, nor a penalty box's), exactly under the
//! latest quotas when changes follow each other, and alike when several instances make the
//! same change. A key's time to live runs on the server's clock: each bound allows for the
//! real time the test takes.
//!
//! Pins docs/design.md section 3 ("A live quota change judges what a key stored", "Redis").
#![cfg(feature = "redis")]

use crate::common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Quota, RateLimiter};

const SEC: Duration = Duration::from_secs(1);

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(5 * SEC)
        .deny_cache(0)
}

fn limiter(
    store: &RedisStore,
    name: &str,
    clock: &Clock,
    quotas: &[Quota],
) -> RedisRateLimiter<u32> {
    quotas[1..]
        .iter()
        .fold(
            RedisRateLimiter::<u32>::builder(store.clone(), quotas[0].clone())
                .name(name.to_owned())
                .clock(clock.clone()),
            |b, q| b.quota(q.clone()),
        )
        .build()
}

/// A sliding log and a sliding counter of 3 per `window`.
fn windows(window: Duration) -> Vec<Quota> {
    vec![
        Quota::sliding_log(3, window),
        Quota::sliding_window(3, window),
    ]
}

/// The times to live of `names`, in ms (-2: no key, -1: no expiry).
async fn pttls(server: &RedisServer, names: &[Vec<u8>]) -> Vec<i64> {
    let mut conn = crate::common::redis_server::connection(server).await;
    let mut pipe = redis::pipe();
    for n in names {
        pipe.cmd("PTTL").arg(n);
    }
    pipe.query_async(&mut conn).await.unwrap()
}

/// Whether a key's time to live `ttl` (ms, on the server's clock) is the `expected` one set
/// at or after `since`, less the real time gone by since then: the test's steps run on a
/// manual clock, the server's time goes on (and on a loaded machine, by seconds).
fn lives(ttl: i64, expected: i64, since: Instant) -> bool {
    let gone_by = i64::try_from(since.elapsed().as_millis()).unwrap();
    ttl <= expected && ttl >= expected - gone_by - 1
}

/// A manual clock far from its start, so that a change has a time before it.
fn clock() -> Clock {
    let (clock, time) = Clock::manual();
    time.advance(100 * SEC);
    clock
}

#[tokio::test]
async fn every_key_of_a_widened_limit_outlives_its_requests_and_no_other_keys_expiry_moves() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    // A name that is a pattern matching the other limit's ("2:w*:" would match "2:wx:").
    let widened = limiter(&store, "w*", &clock, &windows(SEC));
    let other = limiter(&store, "wx", &clock, &windows(SEC));
    // A penalty box whose key names start as the widened limit's would, after "ban:".
    let banning = RedisRateLimiter::<u32>::builder(store.clone(), Quota::per_minute(1))
        .name("w*")
        .clock(clock.clone())
        .penalty_box(PenaltyBox::new(1, 60 * SEC, 600 * SEC))
        .build();
    // More keys than a few SCAN batches hold.
    let keys: Vec<u32> = (0..1_700).collect();
    for &k in &keys {
        assert!(widened.check(&k).await.is_allowed());
    }
    for k in 0..10 {
        assert!(other.check(&k).await.is_allowed());
    }
    assert!(banning.strike(&7).await.is_some());
    let names: Vec<Vec<u8>> = keys.iter().map(|k| widened.redis_key(k)).collect();
    let others: Vec<Vec<u8>> = (0..10).map(|k| other.redis_key(&k)).collect();
    let ban_before = pttls(&server, &[ban_key("w*", 7)]).await[0];
    assert!(ban_before > 590_000, "{ban_before}");

    let since = Instant::now();
    widened.set_quotas(windows(10 * SEC)).unwrap();
    widened.until_expiry_lengthened().await;
    // The counter's request counts for two widths (its window and the next one's weight).
    for (k, ttl) in pttls(&server, &names).await.into_iter().enumerate() {
        assert!(lives(ttl, 20_000, since), "key {k}: {ttl} ms");
    }
    for ttl in pttls(&server, &others).await {
        assert!((0..=2_000).contains(&ttl), "another limit's key: {ttl} ms");
    }
    let ban_after = pttls(&server, &[ban_key("w*", 7)]).await[0];
    assert!(ban_after <= ban_before, "{ban_before} -> {ban_after}");
}

/// The penalty key of `key` under the limit `name` (src/redis/ban.rs).
fn ban_key(name: &str, key: u32) -> Vec<u8> {
    format!("tollgate:ban:{}:{name}:{key}", name.len()).into_bytes()
}

#[tokio::test]
async fn changes_that_follow_each_other_leave_each_key_the_expiry_of_the_latest_quotas() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    let first = limiter(&store, "steps", &clock, &windows(SEC));
    // A second instance of the same limit, making the same changes.
    let second = limiter(&store, "steps", &clock, &windows(SEC));
    for k in 0..600 {
        assert!(first.check(&k).await.is_allowed());
    }
    let names: Vec<Vec<u8>> = (0..600).map(|k| first.redis_key(&k)).collect();
    // Widened twice (the second walk takes over from the first), then narrowed: the keys
    // live until their requests stop counting under 5 s windows, no longer.
    let since = Instant::now();
    for l in [&first, &second] {
        l.set_quotas(windows(3 * SEC)).unwrap();
        l.set_quotas(windows(20 * SEC)).unwrap();
        l.set_quotas(windows(5 * SEC)).unwrap();
    }
    for l in [&first, &second] {
        l.until_expiry_lengthened().await;
    }
    for (k, ttl) in pttls(&server, &names).await.into_iter().enumerate() {
        assert!(lives(ttl, 10_000, since), "key {k}: {ttl} ms");
    }
    // Narrowed again: no walk, and no key's expiry shortened (what is kept longer than it
    // counts decides as a key never seen).
    first.set_quotas(windows(SEC)).unwrap();
    first.until_expiry_lengthened().await;
    for (k, ttl) in pttls(&server, &names).await.into_iter().enumerate() {
        assert!(lives(ttl, 10_000, since), "key {k}: {ttl} ms");
    }
}

/// 10 a minute (one every 6 s, burst 10) warming up over `period` with `cold_factor`.
fn warm(period: Duration, cold_factor: u32) -> Quota {
    Quota::per_minute(10).warm_up(period, cold_factor)
}

/// The time to live, in ms from `now` (µs), of a warm-up key stored as `[tat, deficit]` (µs)
/// under a curve of `period` (µs) and `cold_factor`: until it is fully cold, when the curve has
/// regained its deficit (src/algo/warmup.rs `Curve::cold_in`), and 1 µs more (the script's
/// rounding), in whole ms rounded up.
fn cold_in_ms(now: u64, [tat, deficit]: [u64; 2], period: u64, cold_factor: u64) -> i64 {
    let max = period / 2 + 2 * period / (cold_factor + 1);
    let idle = tat + deficit.min(max) * period / max + 1;
    i64::try_from((idle - now).div_ceil(1_000)).unwrap()
}

/// The words of a key written by the general script, in µs.
async fn words(server: &RedisServer, name: &[u8]) -> [u64; 2] {
    let mut conn = crate::common::redis_server::connection(server).await;
    let raw: String = redis::cmd("GET")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap();
    let w: Vec<u64> = raw.split(' ').map(|w| w.parse().unwrap()).collect();
    [w[0], w[1]]
}

#[tokio::test]
async fn a_warm_key_whose_curve_changed_lives_until_the_new_curve_makes_it_cold() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    let redis = limiter(&store, "warm", &clock, &[warm(120 * SEC, 3)]);
    let memory = RateLimiter::<u32>::builder(warm(120 * SEC, 3))
        .clock(clock.clone())
        .build();
    let since = Instant::now();
    for _ in 0..10 {
        assert_eq!(
            redis.check(&1).await.is_allowed(),
            memory.check(&1).is_allowed()
        );
    }
    let name = redis.redis_key(&1);
    let stored = words(&server, &name).await;
    let ttl_before = pttls(&server, std::slice::from_ref(&name)).await[0];
    let now = 100_000_000;
    let cold_before = cold_in_ms(now, stored, 120_000_000, 3);
    assert!(lives(ttl_before, cold_before, since), "{ttl_before} ms");
    // The cold factor grows (and the period doubles): the deficit is regained about twice as
    // slowly, and the memory store keeps the key that much longer.
    let then = warm(240 * SEC, 100);
    let since = Instant::now();
    redis.set_quotas([then.clone()]).unwrap();
    memory.set_quotas([then]).unwrap();
    redis.until_expiry_lengthened().await;
    let ttl = pttls(&server, std::slice::from_ref(&name)).await[0];
    let cold = cold_in_ms(now, stored, 240_000_000, 100);
    assert!(
        cold > ttl_before + 10_000,
        "{cold} ms, {ttl_before} ms before"
    );
    assert!(
        lives(ttl, cold, since),
        "the key lives {ttl} ms, its deficit is regained in {cold} ms"
    );
    // The walk wrote nothing: the key's state is as the requests left it.
    assert_eq!(words(&server, &name).await, stored);
    assert_eq!(memory.len(), 1);
}

/// A walk whose call Redis does not answer stops, says so in one line, and is no outage: the
/// decisions go on on Redis, and none is logged as failed.
#[tokio::test]
async fn a_walk_redis_does_not_answer_stops_with_one_line_and_no_outage() {
    let (out, _guard) = common::capture::capture(tracing::Level::INFO);
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    let l = limiter(&store, "paused", &clock, &windows(SEC));
    assert!(l.check(&1).await.is_allowed());
    server.pause();
    l.set_quotas(windows(10 * SEC)).unwrap();
    l.until_expiry_lengthened().await;
    server.resume();
    let d = l.check(&1).await;
    assert!(d.is_allowed() && !d.is_degraded(), "{d:?}");
    let text = out.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate::redis"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("stopped lengthening"), "{text}");
    assert!(lines[0].contains("SCAN failed"), "{text}");
}

/// Through a layer: a change of its policy by its handle starts the walk, and a key no
/// request touches after it lives until its requests stop counting under the wider windows.
#[tokio::test]
async fn a_layers_change_by_its_handle_lengthens_the_expiry_of_its_keys() {
    use tollgate::key::Header;
    use tollgate::{Policy, RateLimitLayer};
    use tower::{Layer, ServiceExt};
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    let policy = |w| Policy::new("api", windows(w)[0].clone()).quota(windows(w)[1].clone());
    let layer = RateLimitLayer::new(policy(SEC))
        .key(Header::new("x-key"))
        .clock(clock)
        .store(store);
    let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::new(),
        )))
    }));
    let req = http::Request::get("/")
        .header("x-key", "k")
        .body(())
        .unwrap();
    assert_eq!(svc.clone().oneshot(req).await.unwrap().status(), 200);
    let since = Instant::now();
    layer.handle().unwrap().apply(&policy(10 * SEC)).unwrap();
    let limiter = layer.limiter("api").unwrap().unwrap();
    limiter.until_expiry_lengthened().await;
    let key: Box<[u8]> = b"k"[..].into();
    let ttl = pttls(&server, &[limiter.redis_key(&key)]).await[0];
    assert!(lives(ttl, 20_000, since), "{ttl} ms");
}

mod property {
    //! Any window quotas, any requests on a few keys, any change of the windows: after the
    //! walk, every key lives at least until its requests stop counting under the new quotas
    //! by the memory store's account (each quota's `reset_after`, the time until its state is
    //! idle), and never longer than under the wider of the old and new windows.

    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    #[test]
    fn after_any_change_of_windows_every_key_lives_while_its_requests_count() {
        let server = RedisServer::start();
        let rt = common::twins::runtime();
        let store = rt.block_on(store(&server));
        let mut runner = TestRunner::new(Config::with_cases(48));
        let case = std::cell::Cell::new(0u32);
        let ms = Duration::from_millis;
        runner
            .run(
                &(
                    (1u32..5, 200u64..3_000, 1u32..5, 200u64..3_000),
                    prop::collection::vec((0u64..1_500, 0u32..4, 1u32..3), 1..40),
                    (200u64..8_000, 200u64..8_000),
                ),
                |((la, wa, lb, wb), ops, (wa2, wb2))| {
                    case.set(case.get() + 1);
                    let quotas = |a: u64, b: u64| {
                        vec![
                            Quota::sliding_log(la, ms(a)),
                            Quota::sliding_window(lb, ms(b)),
                        ]
                    };
                    let (clock, time) = Clock::manual();
                    time.advance(100 * SEC);
                    let name = format!("walk-{}", case.get());
                    let redis =
                        rt.block_on(async { limiter(&store, &name, &clock, &quotas(wa, wb)) });
                    let memory = RateLimiter::<u32>::builder(quotas(wa, wb)[0].clone())
                        .quota(quotas(wa, wb)[1].clone())
                        .clock(clock.clone())
                        .build();
                    for &(gap, key, cost) in &ops {
                        time.advance(ms(gap));
                        let r = rt.block_on(redis.check_n(&key, cost));
                        let m = memory.check_n(&key, cost);
                        prop_assert_eq!(r.is_allowed(), m.is_allowed());
                    }
                    memory.set_quotas(quotas(wa2, wb2)).unwrap();
                    let since = Instant::now();
                    rt.block_on(async {
                        redis.set_quotas(quotas(wa2, wb2)).unwrap();
                        redis.until_expiry_lengthened().await;
                    });
                    let names: Vec<Vec<u8>> = (0..4).map(|k| redis.redis_key(&k)).collect();
                    let ttls = rt.block_on(pttls(&server, &names));
                    // The longest a key's requests may count under either windows.
                    let longest = 2 * wa.max(wb).max(wa2).max(wb2);
                    for (k, ttl) in (0..4u32).zip(ttls) {
                        let counts = memory
                            .peek(&k)
                            .states()
                            .iter()
                            .map(|s| s.reset_after())
                            .max()
                            .unwrap_or_default();
                        let counts = i64::try_from(counts.as_millis()).unwrap();
                        let gone_by = i64::try_from(since.elapsed().as_millis()).unwrap();
                        if counts > 0 {
                            prop_assert!(
                                ttl >= counts - gone_by - 1,
                                "key {k}: lives {ttl} ms, counts {counts} ms"
                            );
                        }
                        prop_assert!(
                            ttl <= i64::try_from(longest).unwrap() + 1,
                            "key {k}: {ttl} ms"
                        );
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
}

/// A change made on a thread outside any Tokio runtime (a configuration reload) walks the
/// keys in the runtime the limiter was built in.
#[tokio::test]
async fn a_change_made_outside_a_runtime_walks_in_the_limiters() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let clock = clock();
    let l = limiter(&store, "reloaded", &clock, &windows(SEC));
    assert!(l.check(&1).await.is_allowed());
    let changing = l.clone();
    let since = Instant::now();
    std::thread::spawn(move || changing.set_quotas(windows(10 * SEC)).unwrap())
        .join()
        .unwrap();
    l.until_expiry_lengthened().await;
    let ttl = pttls(&server, &[l.redis_key(&1)]).await[0];
    assert!(lives(ttl, 20_000, since), "{ttl} ms");
}
