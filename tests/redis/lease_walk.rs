//! The walk that lengthens the expiry of a limit's keys after a live change
//! (src/redis/expiry.rs) where leases are taken (src/redis/lease.rs). A lease is taken only of
//! a policy whose quotas are all GCRA, a change keeps each quota's kind, and no change of a
//! GCRA quota makes a key's requests count longer (its time is the key's, whatever the
//! interval): so a leased limit never walks, and its held units are simply never used after
//! the change. A limit of the same store that cannot lease (a warm-up curve, a sliding log)
//! walks its keys as on a store without leases, and its walk leaves another limit's leased
//! keys, their expiry and the units held of them as they were.
//!
//! Pins docs/design.md section 3 ("A live quota change judges what a key stored", "Redis": a
//! leased unit is used at most its hold after Redis granted it).
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use tollgate::redis::{Lease, RedisRateLimiter, RedisStore};
use tollgate::{Clock, Quota};

const SEC: Duration = Duration::from_secs(1);

/// A store that leases up to 8 units of a hot key for 60 s (the clock is manual: the hold never
/// runs out here), with no deny cache.
async fn leasing(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(5 * SEC)
        .deny_cache(0)
        .lease(Lease::new(8, 60 * SEC))
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

/// A key's value (serialized, whatever its type) and time to live (ms).
async fn stored(server: &RedisServer, name: &[u8]) -> (Option<Vec<u8>>, i64) {
    let mut conn = crate::common::redis_server::connection(server).await;
    redis::pipe()
        .cmd("DUMP")
        .arg(name)
        .cmd("PTTL")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_change_of_a_leased_limit_walks_no_key_and_its_held_units_are_never_used() {
    let server = RedisServer::start();
    let store = leasing(&server).await;
    let (clock, _time) = Clock::manual();
    let hot = limiter(&store, "hot", &clock, &[Quota::per_minute(60).burst(40)]);
    for key in 0..2 {
        for _ in 0..8 {
            assert!(hot.check(&key).await.is_allowed());
        }
    }
    let leased = hot.leased();
    assert!(leased > 0);
    let scans = server.calls("scan");
    // A slower rate, a larger burst: the keys' times stand, no request counts longer.
    hot.set_quotas([Quota::per_minute(30).burst(60)]).unwrap();
    hot.until_expiry_lengthened().await;
    assert_eq!(server.calls("scan"), scans, "no walk");
    // Units held under the old quotas: the next request asks Redis.
    let calls = server.calls("evalsha");
    assert!(hot.check(&0).await.is_allowed());
    assert_eq!(hot.leased(), leased);
    assert!(server.calls("evalsha") > calls);
}

#[tokio::test]
async fn a_walk_on_a_leasing_store_lengthens_its_own_keys_and_leaves_the_leased_ones_of_another_limit(
) {
    let server = RedisServer::start();
    let store = leasing(&server).await;
    let (clock, time) = Clock::manual();
    time.advance(100 * SEC);
    let hot = limiter(&store, "hot", &clock, &[Quota::per_minute(60).burst(40)]);
    // A warm-up curve and a sliding log: neither is leased.
    let wide = limiter(
        &store,
        "wide",
        &clock,
        &[
            Quota::per_minute(10).warm_up(120 * SEC, 3),
            Quota::sliding_log(5, 10 * SEC),
        ],
    );
    for _ in 0..8 {
        assert!(hot.check(&1).await.is_allowed());
    }
    assert!(wide.check(&1).await.is_allowed());
    assert!(wide.check(&1).await.is_allowed());
    assert_eq!(wide.leased(), 0);
    let leased = hot.leased();
    assert!(leased > 0);
    let (hot_value, hot_ttl) = stored(&server, &hot.redis_key(&1)).await;
    let (wide_value, wide_ttl) = stored(&server, &wide.redis_key(&1)).await;
    assert!(hot_value.is_some() && hot_ttl > 0 && wide_ttl > 0);

    // The log widened from 10 s to 10 min: its entries count that long.
    let scans = server.calls("scan");
    wide.set_quotas([
        Quota::per_minute(10).warm_up(120 * SEC, 3),
        Quota::sliding_log(5, 600 * SEC),
    ])
    .unwrap();
    wide.until_expiry_lengthened().await;
    assert!(server.calls("scan") > scans, "a walk");
    let (value, ttl) = stored(&server, &wide.redis_key(&1)).await;
    assert_eq!(value, wide_value, "the walk writes no state");
    assert!(
        ttl > 590_000 && ttl > wide_ttl,
        "{ttl} ms, {wide_ttl} ms before"
    );

    // The leased limit's key is as it was, and its lease still serves without Redis.
    let (value, ttl) = stored(&server, &hot.redis_key(&1)).await;
    assert_eq!(value, hot_value);
    assert!(ttl <= hot_ttl && ttl > 0, "{ttl} ms, {hot_ttl} ms before");
    let calls = server.calls("evalsha");
    assert!(hot.check(&1).await.is_allowed());
    assert_eq!(hot.leased(), leased + 1);
    assert_eq!(server.calls("evalsha"), calls);
}
