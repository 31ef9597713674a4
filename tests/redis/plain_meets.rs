//! The script of quotas without warm-up (src/redis/plain.lua) meets the general one
//! (src/redis/gcra.lua, which a limiter with a penalty box always runs) on the same keys: two
//! Redis limiters of one name, one plain and one with a penalty box that never bans, take
//! turns on the same keys, with reports (cost 0) and live changes of the quotas (windows
//! widened and narrowed, counts raised and lowered while keys hold state), and decide as one
//! memory limiter on the same manual clock does, to the request and to every report; on a
//! store that lends units (`Lease`) too, which a policy with a window quota never does.
//!
//! Windows are seconds long, so that the keys' times to live (on the server's clock) outlast
//! the test's steps (on the manual clock).
//!
//! Further modules: the same through layers (refunds, settlements), under a layer that rejects
//! inside, with a penalty box that bans, and in dry-run mode.
//!
//! Pins docs/design.md section 3 ("Redis"): both stores keep the same account, whichever
//! script writes a key and whichever reads it next.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::twins;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{Lease, RedisRateLimiter, RedisStore};
use tollgate::{Clock, Decision, Outcome, Quota, RateLimiter};

#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` (0: a report) for key `k`, through the plain limiter (false) or the
    /// one with a penalty box (true).
    Check(bool, u8, u32),
    /// The clock moves on, in ms.
    Wait(u64),
    /// Every limiter takes the quotas of this variant.
    Change(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 0u8..2, prop_oneof![3 => 1u32..4, 1 => Just(0u32)])
            .prop_map(|(b, k, c)| Op::Check(b, k, c)),
        3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
        1 => (0usize..4).prop_map(Op::Change),
    ]
}

/// One quota: kind (0 GCRA, 1 fixed window, 2 sliding log, 3 sliding counter), count, and a
/// window per unit of the count in tens of ms (so that a GCRA interval is whole ms).
type Spec = (u8, u32, u64);

fn spec() -> impl Strategy<Value = Spec> {
    (0u8..4, 1u32..6, 30u64..100)
}

/// The quotas of `specs` in variant `v`: 0 as given, 1 windows widened 5/2, 2 narrowed 2/5,
/// 3 counts lowered by one (at least 1) and raised by one in turn.
fn quotas(specs: &[Spec], v: usize) -> Vec<Quota> {
    specs
        .iter()
        .enumerate()
        .map(|(i, &(kind, count, tens))| {
            let ms = match v {
                1 => tens * 25,
                2 => tens * 4,
                _ => tens * 10,
            };
            let count = match v {
                3 if i % 2 == 0 => count.saturating_sub(1).max(1),
                3 => count + 1,
                _ => count,
            };
            let w = Duration::from_millis(ms * u64::from(count));
            match kind {
                0 => Quota::new(count, w),
                1 => Quota::fixed_window(count, w),
                2 => Quota::sliding_log(count, w),
                _ => Quota::sliding_window(count, w),
            }
        })
        .collect()
}

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

#[test]
fn both_scripts_on_one_key_decide_as_memory_through_live_changes_and_reports() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(Duration::from_secs(2))
        // Two instances take turns on one key: a rejection cached by one would stand (as its
        // docs allow) while the other admits.
        .deny_cache(0);
    let mut runner = TestRunner::new(Config::with_cases(512));
    let case_no = std::cell::Cell::new(0u32);
    runner
        .run(
            &(
                prop::collection::vec(spec(), 1..=3),
                prop::collection::vec(op(), 1..60),
                // The clock's start: near 0 nothing left a window before a change.
                prop_oneof![Just(0u64), 0u64..100_000],
                // The plain limiter's store lends units (which window quotas never do).
                any::<bool>(),
            ),
            |(specs, ops, start, leased)| {
                case_no.set(case_no.get() + 1);
                let name = format!("plain-meets-{}", case_no.get());
                let first = quotas(&specs, 0);
                let (clock, time) = Clock::manual();
                time.advance(Duration::from_millis(start));
                let windows = specs.iter().any(|s| s.0 != 0);
                let lending = store
                    .clone()
                    .lease(Lease::new(8, Duration::from_millis(100)));
                let build = |penalty: bool| {
                    let on = if leased && windows && !penalty {
                        &lending
                    } else {
                        &store
                    };
                    let mut b = RedisRateLimiter::<u8>::builder(on.clone(), first[0].clone())
                        .name(name.clone())
                        .clock(clock.clone());
                    for q in &first[1..] {
                        b = b.quota(q.clone());
                    }
                    if penalty {
                        // Never bans: every rejection is a strike, a million are needed.
                        b = b.penalty_box(PenaltyBox::new(
                            1_000_000,
                            Duration::from_secs(1),
                            Duration::from_secs(1),
                        ));
                    }
                    b.build()
                };
                let plain = build(false);
                let boxed = build(true);
                let mut m = RateLimiter::<u8>::builder(first[0].clone()).clock(clock.clone());
                for q in &first[1..] {
                    m = m.quota(q.clone());
                }
                let memory = m.build();
                for (i, op) in ops.iter().enumerate() {
                    match *op {
                        Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                        Op::Change(v) => {
                            let qs = quotas(&specs, v);
                            plain.set_quotas(qs.clone()).unwrap();
                            boxed.set_quotas(qs.clone()).unwrap();
                            memory.set_quotas(qs).unwrap();
                        }
                        Op::Check(with_box, key, cost) => {
                            let limiter = if with_box { &boxed } else { &plain };
                            let got = rt.block_on(limiter.check_n(&key, cost));
                            if got.is_degraded() {
                                return Err(TestCaseError::fail(format!(
                                    "Redis failed at step {i}"
                                )));
                            }
                            let want = memory.check_n(&key, cost);
                            prop_assert_eq!(seen(&got), seen(&want), "step {}: {:?}", i, op);
                        }
                    }
                }
                Ok(())
            },
        )
        .unwrap();
}

/// A limiter of `quotas` named `name` on `store`, on `clock`, plain or with a penalty box
/// that never bans (so that the general script decides).
fn limiter(
    store: &RedisStore,
    name: &str,
    clock: &Clock,
    quotas: &[Quota],
    penalty: bool,
) -> RedisRateLimiter<u8> {
    let mut b = RedisRateLimiter::<u8>::builder(store.clone(), quotas[0].clone())
        .name(name.to_owned())
        .clock(clock.clone());
    for q in &quotas[1..] {
        b = b.quota(q.clone());
    }
    if penalty {
        b = b.penalty_box(PenaltyBox::new(
            1_000_000,
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
    }
    b.build()
}

/// The sliding quotas a widening test runs over: a log, a counter, each next to a fixed
/// window, 2 per `secs` seconds.
fn sliding(secs: u64) -> [Vec<Quota>; 2] {
    let w = Duration::from_secs(secs);
    [
        vec![Quota::fixed_window(5, w), Quota::sliding_log(2, w)],
        vec![Quota::fixed_window(5, w), Quota::sliding_window(2, w)],
    ]
}

/// The key's time to live in ms, on the server's clock (-2: no key).
async fn pttl(server: &RedisServer, limiter: &RedisRateLimiter<u8>, key: u8) -> i64 {
    let mut conn = crate::common::redis_server::connection(server).await;
    redis::cmd("PTTL")
        .arg(limiter.redis_key(&key))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Fills key 0 under 1 s windows on one script, widens them to 10 s on every limiter, then
/// runs `then` (a request of that cost, or nothing) on the other or the same script; returns each
/// limiter's key time to live in ms and the state's reset time as memory reports it.
async fn widened_then(
    penalty_first: bool,
    penalty_then: bool,
    then: Option<u32>,
) -> Vec<(i64, Duration)> {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
        .deny_cache(0);
    let mut out = Vec::new();
    for (i, (narrow, wide)) in sliding(1).into_iter().zip(sliding(10)).enumerate() {
        let (clock, time) = Clock::manual();
        // Far from the clock's start, so that the change has a time before it.
        time.advance(Duration::from_secs(100));
        let name = format!("widened-{i}");
        let first = limiter(&store, &name, &clock, &narrow, penalty_first);
        let second = limiter(&store, &name, &clock, &narrow, penalty_then);
        let memory = RateLimiter::<u8>::builder(narrow[0].clone())
            .quota(narrow[1].clone())
            .clock(clock.clone())
            .build();
        assert!(first.check_n(&0, 2).await.is_allowed());
        assert!(memory.check_n(&0, 2).is_allowed());
        for l in [&first, &second] {
            l.set_quotas(wide.clone()).unwrap();
        }
        memory.set_quotas(wide.clone()).unwrap();
        if then.is_none() {
            // The walk each change started over the limit's keys, both over the same key.
            for l in [&first, &second] {
                l.until_expiry_lengthened().await;
            }
        }
        if let Some(then) = then {
            let got = second.check_n(&0, then).await;
            let want = memory.check_n(&0, then);
            assert_eq!(seen(&got), seen(&want));
        }
        let counts = memory.peek(&0).states()[1].reset_after();
        out.push((pttl(&server, &second, 0).await, counts));
    }
    out
}

#[tokio::test]
async fn a_rejection_after_a_widening_keeps_the_key_while_its_requests_count_on_both_scripts() {
    for (a, b) in [(false, false), (false, true), (true, false), (true, true)] {
        for (ttl, counts) in widened_then(a, b, Some(1)).await {
            // The log's entry counts for 10 s, the counter's count for 20 s (current and
            // previous window); Redis's clock went on a little while the test ran.
            let counts = counts.as_millis() as i64;
            assert!(
                ttl > counts - 1_000 && ttl <= counts,
                "scripts {a}/{b}: the key lives {ttl} ms, its requests count {counts} ms"
            );
        }
    }
}

#[tokio::test]
async fn a_report_after_a_widening_keeps_the_key_while_its_requests_count_on_both_scripts() {
    for (a, b) in [(false, false), (false, true), (true, false), (true, true)] {
        for (ttl, counts) in widened_then(a, b, Some(0)).await {
            let counts = counts.as_millis() as i64;
            assert!(
                ttl > counts - 1_000 && ttl <= counts,
                "scripts {a}/{b}: the key lives {ttl} ms, its requests count {counts} ms"
            );
        }
    }
}

/// No request touches the key after the change: the walk the change started over the
/// limit's keys lengthens its expiry to when its requests stop counting under the wider
/// windows (the memory store keeps it as long), and the walks of two instances applying the
/// same change set the same expiry.
#[tokio::test]
async fn an_idle_key_outlives_a_widening_while_its_requests_count() {
    for (ttl, counts) in widened_then(false, false, None).await {
        let counts = counts.as_millis() as i64;
        assert!(
            ttl > counts - 1_000 && ttl <= counts,
            "the key lives {ttl} ms, its requests count {counts} ms"
        );
    }
}

mod through_layers {
    //! Two layers of one name on one Redis, one plain and one with a penalty box that never
    //! bans, take turns on the same keys: requests on either script, refunds and settlements
    //! on the general one, live changes; one memory layer keeps the account they must keep.

    use super::*;
    use common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
    use common::stores;
    use tollgate::{Policy, RateLimitHandle, RateLimitLayer};
    use tower::Layer;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of `cost` for key `k` through the penalty-box layer (true) or the plain
        /// one, held in flight when admitted.
        Send(bool, usize, u32),
        /// The request in flight at this index (modulo) is answered: a success (given back),
        /// a failure (counted), or a failure settling `n`.
        Answer(usize, Option<u32>, bool),
        Wait(u64),
        Change(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (any::<bool>(), 0usize..2, 0u32..4).prop_map(|(b, k, c)| Op::Send(b, k, c)),
            4 => (0usize..8, 0u32..9, any::<bool>())
                .prop_map(|(i, n, ok)| Op::Answer(i, Some(n), ok)),
            1 => (0usize..8).prop_map(|i| Op::Answer(i, None, false)),
            3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
            1 => (0usize..4).prop_map(Op::Change),
        ]
    }

    const KEYS: [&str; 2] = ["a", "b"];

    pub(super) fn policy(name: &str, specs: &[Spec], v: usize) -> Policy {
        let qs = quotas(specs, v);
        qs[1..]
            .iter()
            .fold(Policy::new(name.to_owned(), qs[0].clone()), |p, q| {
                p.quota(q.clone())
            })
    }

    /// A store on `server` for the cases of one test, run on `rt`; with `deny_cache` off where
    /// two instances take turns on one key (a rejection cached by one would stand, as its
    /// docs allow, after the other admitted).
    pub(super) fn connected(
        rt: &tokio::runtime::Runtime,
        server: &RedisServer,
        deny_cache: bool,
    ) -> RedisStore {
        let store = rt
            .block_on(RedisStore::connect(&server.url()))
            .unwrap()
            .timeout(Duration::from_secs(5));
        if deny_cache {
            store
        } else {
            store.deny_cache(0)
        }
    }

    /// The quotas of version `v` applied to every layer of one name.
    pub(super) fn apply_to<const N: usize>(handles: [RateLimitHandle; N], p: &Policy) {
        for h in handles {
            h.apply(p).unwrap();
        }
    }

    /// After op `i`, every key reads the same on both stores.
    pub(super) async fn peeks_agree(
        memory: &RateLimiter<Box<[u8]>>,
        redis: &RedisRateLimiter<Box<[u8]>>,
        i: usize,
    ) -> Result<(), TestCaseError> {
        for key in KEYS {
            let k = stores::key(key);
            let (a, b) = (memory.peek(&k), redis.peek(&k).await);
            prop_assert!(!b.is_degraded(), "op {}: Redis failed", i);
            prop_assert_eq!(seen(&a), seen(&b), "op {}: peek of {}", i, key);
        }
        Ok(())
    }

    async fn run(
        store: &RedisStore,
        case: u32,
        specs: &[Spec],
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let (clock, time) = manual();
        let name = format!("plain-layers-{case}");
        let first = quotas(specs, 0);
        let memory = stores::layer(&first, &name, &clock);
        let plain: RateLimitLayer<_, _> = stores::layer(&first, &name, &clock).store(store.clone());
        let boxed = stores::layer(&first, &name, &clock)
            .store(store.clone())
            .penalty_box(PenaltyBox::new(
                1_000_000,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ));
        let mem_limiter = memory.limiter(&name).unwrap().unwrap();
        let redis_limiter = plain.limiter(&name).unwrap().unwrap();
        let mut m = Rig::new(|h| memory.clone().layer(h));
        let mut rigs = [
            Rig::new(|h| plain.clone().layer(h)),
            Rig::new(|h| boxed.clone().layer(h)),
        ];
        // (memory id, which Redis layer, its id) of each admitted request in flight.
        let mut flying: Vec<(u64, usize, u64)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Send(b, k, cost) => {
                    let w = usize::from(b);
                    let x = m.send(KEYS[k], cost).await;
                    let y = rigs[w].send(KEYS[k], cost).await;
                    prop_assert_eq!(x.is_some(), y.is_some(), "op {}: admitted", i);
                    if let (Some(x), Some(y)) = (x, y) {
                        flying.push((x, w, y));
                    }
                }
                Op::Answer(j, settle, ok) => {
                    if flying.is_empty() {
                        continue;
                    }
                    let (x, w, y) = flying.remove(j % flying.len());
                    let reply: Reply = match (settle, ok) {
                        (_, true) => OK,
                        (None, false) => FAILED,
                        (Some(n), false) => settles(n),
                    };
                    let (a, b) = (m.answer(x, reply).await, rigs[w].answer(y, reply).await);
                    prop_assert_eq!(a, b, "op {}: answer", i);
                }
                Op::Wait(n) => time.advance(Duration::from_millis(n)),
                Op::Change(v) => {
                    let p = policy(&name, specs, v);
                    apply_to(
                        [
                            memory.handle().unwrap(),
                            plain.handle().unwrap(),
                            boxed.handle().unwrap(),
                        ],
                        &p,
                    );
                }
            }
            peeks_agree(&mem_limiter, &redis_limiter, i).await?;
        }
        Ok(())
    }

    #[test]
    fn both_scripts_keep_the_memory_account_through_refunds_settlements_and_changes() {
        let server = RedisServer::start();
        let rt = twins::runtime();
        let store = connected(&rt, &server, false);
        let mut runner = TestRunner::new(Config::with_cases(128));
        let case = std::cell::Cell::new(0u32);
        runner
            .run(
                &(
                    prop::collection::vec(spec(), 1..=3),
                    prop::collection::vec(op(), 1..50),
                ),
                |(specs, ops)| {
                    case.set(case.get() + 1);
                    rt.block_on(run(&store, case.get(), &specs, &ops))
                },
            )
            .unwrap();
    }
}

mod stacked {
    //! A layer of window quotas on Redis (its requests on the script of quotas without
    //! warm-up) outside a layer in memory that rejects what its own small quota does not
    //! hold: what the inner layer turns away, the outer gives back (through the general
    //! script), and the outer account stays the memory twin's, through live changes.

    use super::through_layers::{apply_to, connected, peeks_agree, policy};
    use super::*;
    use common::account::rig::{manual, Rig};
    use common::stores;
    use tower::Layer;

    #[derive(Debug, Clone)]
    enum Op {
        Send(usize, u32),
        Wait(u64),
        Change(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..2, 0u32..4).prop_map(|(k, c)| Op::Send(k, c)),
            3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
            1 => (0usize..4).prop_map(Op::Change),
        ]
    }

    const KEYS: [&str; 2] = ["a", "b"];

    async fn run(
        store: &RedisStore,
        case: u32,
        specs: &[Spec],
        inner: &[Spec],
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let (clock, time) = manual();
        let name = format!("plain-stacked-{case}");
        let first = quotas(specs, 0);
        let small = quotas(inner, 0);
        let memory = stores::layer(&first, &name, &clock);
        let redis = stores::layer(&first, &name, &clock).store(store.clone());
        let (inner_m, inner_r) = (
            stores::layer(&small, "inner", &clock),
            stores::layer(&small, "inner", &clock),
        );
        let mem_limiter = memory.limiter(&name).unwrap().unwrap();
        let redis_limiter = redis.limiter(&name).unwrap().unwrap();
        let mut m = Rig::new(|h| memory.clone().layer(inner_m.clone().layer(h)));
        let mut r = Rig::new(|h| redis.clone().layer(inner_r.clone().layer(h)));
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Send(k, cost) => {
                    let x = m.send(KEYS[k], cost).await;
                    let y = r.send(KEYS[k], cost).await;
                    prop_assert_eq!(x.is_some(), y.is_some(), "op {}: admitted", i);
                    if let (Some(x), Some(y)) = (x, y) {
                        // Counted: a failure keeps what it took.
                        let (a, b) = (
                            m.answer(x, common::account::rig::FAILED).await,
                            r.answer(y, common::account::rig::FAILED).await,
                        );
                        prop_assert_eq!(a, b, "op {}: answer", i);
                    }
                }
                Op::Wait(n) => time.advance(Duration::from_millis(n)),
                Op::Change(v) => {
                    let p = policy(&name, specs, v);
                    apply_to([memory.handle().unwrap(), redis.handle().unwrap()], &p);
                }
            }
            peeks_agree(&mem_limiter, &redis_limiter, i).await?;
        }
        Ok(())
    }

    #[test]
    fn an_outer_window_layer_on_redis_gives_back_what_an_inner_layer_rejects_as_memory_does() {
        let server = RedisServer::start();
        let rt = twins::runtime();
        let store = connected(&rt, &server, true);
        let mut runner = TestRunner::new(Config::with_cases(128));
        let case = std::cell::Cell::new(0u32);
        runner
            .run(
                &(
                    prop::collection::vec(spec(), 1..=3),
                    prop::collection::vec(spec(), 1..=2),
                    prop::collection::vec(op(), 1..50),
                ),
                |(specs, inner, ops)| {
                    case.set(case.get() + 1);
                    rt.block_on(run(&store, case.get(), &specs, &inner, &ops))
                },
            )
            .unwrap();
    }
}

mod banned {
    //! A layer of window quotas with a penalty box that bans, on Redis (the general script
    //! inside the penalty box) and in memory: the same requests are admitted, banned and
    //! counted, through live changes.

    use super::through_layers::{apply_to, connected, policy};
    use super::*;
    use common::account::rig::{manual, Rig, FAILED, OK};
    use common::stores;
    use tower::Layer;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of `cost` for key `k`, answered at once: a failure (counted) or not.
        Send(usize, u32, bool),
        Wait(u64),
        Change(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..2, 0u32..4, any::<bool>()).prop_map(|(k, c, f)| Op::Send(k, c, f)),
            3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
            1 => (0usize..4).prop_map(Op::Change),
        ]
    }

    const KEYS: [&str; 2] = ["a", "b"];

    async fn run(
        store: &RedisStore,
        case: u32,
        specs: &[Spec],
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let (clock, time) = manual();
        let name = format!("plain-banned-{case}");
        let first = quotas(specs, 0);
        let penalty = PenaltyBox::new(2, Duration::from_secs(3), Duration::from_secs(2));
        let memory = stores::layer(&first, &name, &clock).penalty_box(penalty.clone());
        let redis = stores::layer(&first, &name, &clock)
            .store(store.clone())
            .penalty_box(penalty);
        let mut m = Rig::new(|h| memory.clone().layer(h));
        let mut r = Rig::new(|h| redis.clone().layer(h));
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Send(k, cost, failed) => {
                    let x = m.send(KEYS[k], cost).await;
                    let y = r.send(KEYS[k], cost).await;
                    prop_assert_eq!(x.is_some(), y.is_some(), "op {}: admitted", i);
                    if let (Some(x), Some(y)) = (x, y) {
                        let reply = if failed { FAILED } else { OK };
                        let (a, b) = (m.answer(x, reply).await, r.answer(y, reply).await);
                        prop_assert_eq!(a, b, "op {}: answer", i);
                    }
                }
                Op::Wait(n) => time.advance(Duration::from_millis(n)),
                Op::Change(v) => {
                    let p = policy(&name, specs, v);
                    apply_to([memory.handle().unwrap(), redis.handle().unwrap()], &p);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn a_window_policy_with_a_penalty_box_bans_on_redis_as_in_memory() {
        let server = RedisServer::start();
        let rt = twins::runtime();
        let store = connected(&rt, &server, true);
        let mut runner = TestRunner::new(Config::with_cases(128));
        let case = std::cell::Cell::new(0u32);
        runner
            .run(
                &(
                    prop::collection::vec(spec(), 1..=3),
                    prop::collection::vec(op(), 1..50),
                ),
                |(specs, ops)| {
                    case.set(case.get() + 1);
                    rt.block_on(run(&store, case.get(), &specs, &ops))
                },
            )
            .unwrap();
    }
}

mod dry_run {
    //! A dry-run layer of window quotas on Redis lets every request through and keeps the
    //! account a dry-run layer in memory keeps: what it would have admitted is taken (and
    //! given back or settled through the general script), what it would have rejected takes
    //! nothing, through live changes.

    use super::through_layers::{apply_to, connected, peeks_agree, policy};
    use super::*;
    use common::account::rig::{manual, settles, Reply, Rig, FAILED, OK};
    use common::stores;
    use tower::Layer;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request of `cost` for key `k`, answered at once: a success (given back), a
        /// failure (counted), or a failure settling `n`.
        Send(usize, u32, Option<u32>, bool),
        Wait(u64),
        Change(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..2, 0u32..4, prop::option::of(0u32..9), any::<bool>())
                .prop_map(|(k, c, n, ok)| Op::Send(k, c, n, ok)),
            3 => prop_oneof![0u64..300, 0u64..4_000].prop_map(Op::Wait),
            1 => (0usize..4).prop_map(Op::Change),
        ]
    }

    const KEYS: [&str; 2] = ["a", "b"];

    async fn run(
        store: &RedisStore,
        case: u32,
        specs: &[Spec],
        ops: &[Op],
    ) -> Result<(), TestCaseError> {
        let (clock, time) = manual();
        let name = format!("plain-dry-{case}");
        let first = quotas(specs, 0);
        let memory = stores::layer(&first, &name, &clock).dry_run(true);
        let redis = stores::layer(&first, &name, &clock)
            .store(store.clone())
            .dry_run(true);
        let mem_limiter = memory.limiter(&name).unwrap().unwrap();
        let redis_limiter = redis.limiter(&name).unwrap().unwrap();
        let mut m = Rig::new(|h| memory.clone().layer(h));
        let mut r = Rig::new(|h| redis.clone().layer(h));
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Send(k, cost, settle, ok) => {
                    let x = m.send(KEYS[k], cost).await;
                    let y = r.send(KEYS[k], cost).await;
                    prop_assert!(x.is_some() && y.is_some(), "op {}: let through", i);
                    if let (Some(x), Some(y)) = (x, y) {
                        let reply: Reply = match (settle, ok) {
                            (_, true) => OK,
                            (None, false) => FAILED,
                            (Some(n), false) => settles(n),
                        };
                        let (a, b) = (m.answer(x, reply).await, r.answer(y, reply).await);
                        prop_assert_eq!(a, b, "op {}: answer", i);
                    }
                }
                Op::Wait(n) => time.advance(Duration::from_millis(n)),
                Op::Change(v) => {
                    let p = policy(&name, specs, v);
                    apply_to([memory.handle().unwrap(), redis.handle().unwrap()], &p);
                }
            }
            peeks_agree(&mem_limiter, &redis_limiter, i).await?;
        }
        Ok(())
    }

    #[test]
    fn a_dry_run_window_layer_on_redis_keeps_the_memory_account() {
        let server = RedisServer::start();
        let rt = twins::runtime();
        let store = connected(&rt, &server, true);
        let mut runner = TestRunner::new(Config::with_cases(128));
        let case = std::cell::Cell::new(0u32);
        runner
            .run(
                &(
                    prop::collection::vec(spec(), 1..=3),
                    prop::collection::vec(op(), 1..50),
                ),
                |(specs, ops)| {
                    case.set(case.get() + 1);
                    rt.block_on(run(&store, case.get(), &specs, &ops))
                },
            )
            .unwrap();
    }
}
