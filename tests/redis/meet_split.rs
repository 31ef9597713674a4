//! While Redis answers, what decides a request is the script alone: the store's failure
//! policy (admit, refuse, or a local share), its cache of known rejections and bans, and the
//! penalty box's cache change no decision (src/redis/decide.rs, fallback.rs, deny.rs, ban.rs).
//! On a real redis-server, layers that differ only in those settings, each under its own
//! policy name, decide random requests of two keys alike, with refunds, settlements, debts,
//! bans and live changes, and peeks and bans read alike after every step.
//!
//! Pins docs/design.md section 3 ("Redis", "The penalty box punishes the client's own
//! traffic").

#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
use common::redis_server::RedisServer;
use common::stores;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{FailMode, RedisStore};
use tollgate::{Policy, Quota};
use tower::Layer;

#[derive(Debug, Clone)]
enum Op {
    Send(usize, u32),
    /// The request in flight at this index (modulo): a success (given back), a failure
    /// (counted), or a failure settling `n` (a debt above the cost).
    Answer(usize, Option<u32>, bool),
    Wait(u64),
    /// The burst becomes this.
    Change(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..2, 0u32..4).prop_map(|(k, c)| Op::Send(k, c)),
        4 => (0usize..8, 0u32..9, any::<bool>()).prop_map(|(i, n, ok)| Op::Answer(i, Some(n), ok)),
        1 => (0usize..8).prop_map(|i| Op::Answer(i, None, false)),
        3 => prop_oneof![0u64..300, 0u64..5_000].prop_map(Op::Wait),
        1 => (2u32..6).prop_map(Op::Change),
    ]
}

const KEYS: [&str; 2] = ["a", "b"];

/// GCRA quotas only, so that the cache of known rejections answers some of them.
fn quotas(burst: u32) -> Vec<Quota> {
    vec![
        Quota::new(burst, Duration::from_secs(2)).burst(burst),
        Quota::new(20, Duration::from_secs(60)),
    ]
}

type Seen = (tollgate::Outcome, Option<Duration>, Vec<(u64, Duration)>);

fn seen(d: &tollgate::Decision) -> Seen {
    (
        d.outcome(),
        d.retry_after(),
        d.states()
            .iter()
            .map(|s| (s.remaining(), s.reset_after()))
            .collect(),
    )
}

async fn run(
    stores_: &[RedisStore],
    case: u32,
    penalty: bool,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let mut layers = Vec::new();
    let mut rigs = Vec::new();
    let mut limiters = Vec::new();
    for (j, store) in stores_.iter().enumerate() {
        let name = format!("split{case}x{j}");
        let mut l = stores::layer(&quotas(3), &name, &clock);
        if penalty {
            l = l.penalty_box(PenaltyBox::new(
                3,
                Duration::from_secs(10),
                Duration::from_secs(4),
            ));
        }
        let l = l.store(store.clone());
        limiters.push(l.limiter(&name).unwrap().unwrap());
        rigs.push(Rig::new(|h| l.clone().layer(h)));
        layers.push((l, name));
    }
    let mut flying: Vec<Vec<u64>> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Send(k, cost) => {
                let mut ids = Vec::new();
                for rig in &mut rigs {
                    ids.push(rig.send(KEYS[k], cost).await);
                }
                let admitted = ids[0].is_some();
                for (j, id) in ids.iter().enumerate() {
                    prop_assert_eq!(id.is_some(), admitted, "op {}: store {} admitted", i, j);
                }
                if admitted {
                    flying.push(ids.into_iter().flatten().collect());
                }
            }
            Op::Answer(x, settle, ok) => {
                if flying.is_empty() {
                    continue;
                }
                let ids = flying.remove(x % flying.len());
                let reply: Reply = match (settle, ok) {
                    (_, true) => OK,
                    (None, false) => FAILED,
                    (Some(n), false) => settles(n),
                };
                let mut statuses = Vec::new();
                for (rig, id) in rigs.iter_mut().zip(ids) {
                    statuses.push(rig.answer(id, reply).await);
                }
                prop_assert!(
                    statuses.iter().all(|s| *s == statuses[0]),
                    "op {}: {:?}",
                    i,
                    statuses
                );
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Change(burst) => {
                for (l, name) in &layers {
                    let qs = quotas(burst);
                    let p = Policy::new(name.clone(), qs[0].clone()).quota(qs[1].clone());
                    l.handle().unwrap().apply(&p).unwrap();
                }
            }
        }
        for key in KEYS {
            let k = stores::key(key);
            let first = limiters[0].peek(&k).await;
            let ban = limiters[0].ban_left(&k).await;
            prop_assert!(!first.is_degraded(), "op {}: Redis failed", i);
            for (j, l) in limiters.iter().enumerate().skip(1) {
                prop_assert_eq!(
                    seen(&l.peek(&k).await),
                    seen(&first),
                    "op {}: {} {}",
                    i,
                    j,
                    key
                );
                prop_assert_eq!(
                    l.ban_left(&k).await,
                    ban,
                    "op {}: ban of {} ({})",
                    i,
                    key,
                    j
                );
            }
        }
    }
    Ok(())
}

/// Three stores on one server: failing closed without caches, failing open with the cache of
/// known rejections (and of bans), and deciding a local share on failure with the cache.
#[test]
fn failure_policies_and_caches_change_no_decision_while_redis_answers() {
    let server = RedisServer::start();
    let rt = common::twins::runtime();
    let connect = |mode: FailMode, cache: usize| {
        rt.block_on(RedisStore::connect(&server.url()))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .on_failure(mode)
            .deny_cache(cache)
    };
    let all = [
        connect(FailMode::Closed, 0),
        connect(FailMode::Open, 10_000),
        connect(FailMode::local(0.5), 10_000),
    ];
    let mut runner = TestRunner::new(Config::with_cases(64));
    let case = std::cell::Cell::new(0u32);
    runner
        .run(
            &(any::<bool>(), prop::collection::vec(op(), 1..50)),
            |(penalty, ops)| {
                case.set(case.get() + 1);
                rt.block_on(run(&all, case.get(), penalty, &ops))
            },
        )
        .unwrap();
}

/// A ban whose retry the quotas put later than its end (1 per 10 s, a ban of 4 s on the
/// third refusal): each instance that caches bans keeps telling the quotas' retry after
/// `ban_left` or `strike` asked Redis about the ban alone, so that a client waiting as told is
/// admitted and struck no more; with and without the cache alike.
#[tokio::test]
async fn asking_for_a_ban_alone_never_shortens_the_retry_a_cached_ban_tells() {
    let server = RedisServer::start();
    for (i, cache) in [0usize, 1_000].into_iter().enumerate() {
        for (j, strike_during) in [false, true].into_iter().enumerate() {
            let store = RedisStore::connect(&server.url())
                .await
                .unwrap()
                .timeout(Duration::from_secs(5))
                .deny_cache(cache);
            let (clock, time) = manual();
            let limiter = tollgate::redis::RedisRateLimiter::<u8>::builder(
                store,
                Quota::new(1, Duration::from_secs(10)),
            )
            .name(format!("told{i}x{j}"))
            .clock(clock)
            .penalty_box(PenaltyBox::new(
                3,
                Duration::from_secs(60),
                Duration::from_secs(4),
            ))
            .build();
            assert!(limiter.check(&1).await.is_allowed());
            time.advance(Duration::from_secs(1));
            let told: Vec<_> = [
                limiter.check(&1).await,
                limiter.check(&1).await,
                limiter.check(&1).await,
            ]
            .iter()
            .map(|d| (d.outcome(), d.retry_after()))
            .collect();
            let nine = Some(Duration::from_secs(9));
            assert_eq!(
                told,
                [
                    (tollgate::Outcome::Limited, nine),
                    (tollgate::Outcome::Limited, nine),
                    (tollgate::Outcome::Banned, nine),
                ],
                "cache {cache}"
            );
            // Asked about the ban alone (4 s), or struck during it (which does not count).
            if strike_during {
                // How long the key is banned, as `ban_left` and the memory store's
                // `Strike::AlreadyBanned` say: the ban, not the quotas' retry.
                assert_eq!(limiter.strike(&1).await, Some(Duration::from_secs(4)));
            } else {
                assert_eq!(limiter.ban_left(&1).await, Some(Duration::from_secs(4)));
            }
            // The key is still told the quotas' retry.
            let d = limiter.check(&1).await;
            assert_eq!(
                (d.outcome(), d.retry_after()),
                (tollgate::Outcome::Banned, nine),
                "cache {cache}, after ban_left"
            );
            // Waiting as told is admitted.
            time.advance(Duration::from_secs(9));
            let d = limiter.check(&1).await;
            assert!(d.is_allowed(), "cache {cache}: {:?}", d.outcome());
        }
    }
}
