//! What a Redis limiter decides without asking Redis, through live changes of its quotas:
//! the deny cache (a rejection Redis decided, answered locally) and the local fallback (a
//! memory limiter on the quotas at the store's share, while Redis does not answer).
//!
//! * Deny cache: a layer whose limiter caches rejections and one that asks Redis for every
//!   decision, on one server, follow the same requests, give-backs, settlements, direct
//!   checks and changes of rate and burst: every decision (outcome, wait, figures) is the
//!   same, so a rejection cached under the old quotas is judged by the new ones, as Redis
//!   judges the key, and a give-back through the limiter brings its cache up to date.
//! * Local fallback: with Redis never reachable, a limiter changed while it serves decides as
//!   a memory limiter on the same quotas written out at half by hand, changed alike, for
//!   every kind.
//!
//! Pins docs/design.md section 3 ("A live quota change", "Redis": fall back locally) and the
//! deny cache's promise in `RedisRateLimiter` ("never admits what Redis would reject").
#![cfg(feature = "redis")]

use std::time::Duration;

use proptest::prelude::*;
use tollgate::redis::{FailMode, RedisRateLimiter, RedisStore};
use tollgate::{Clock, Decision, Outcome, Quota, RateLimiter};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::redis_server::{connection, free_port, RedisServer};
use crate::common::stores::{layer, Boxed};

const MS: u64 = 1_000_000;

/// The GCRA quotas of setting `v`: one (the one-quota script) or two.
fn gcras(two: bool, v: u8) -> Vec<Quota> {
    let (per, burst) = [(100, 4), (50, 6), (200, 2)][usize::from(v % 3)];
    let first = Quota::new(1, Duration::from_millis(per)).burst(burst);
    if two {
        let slow = [8, 12, 5][usize::from(v % 3)];
        vec![first, Quota::new(slow, Duration::from_secs(10))]
    } else {
        vec![first]
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost through the layers (held in flight when admitted).
    Send(u32),
    /// The `i`-th request in flight answers: given back (200), kept (401) or settled.
    Answer(usize, Option<Option<u32>>),
    /// A check of this cost through each layer's limiter, outside the layers.
    Check(u32),
    /// The clock moves by this many steps of 25 ms, nudged by a microsecond either way.
    Wait(u64, i8),
    Change(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u32..5).prop_map(Op::Send),
        3 => (0usize..6, prop::option::of(prop::option::of(0u32..6)))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        4 => (1u32..5).prop_map(Op::Check),
        3 => (0u64..12, -1i8..=1).prop_map(|(n, d)| Op::Wait(n, d)),
        1 => (0u8..3).prop_map(Op::Change),
    ]
}

/// What a decision says, its flags aside.
fn said(d: &Decision) -> (Outcome, Option<Duration>, Vec<(u64, u64, Duration)>) {
    let states = d.states().iter();
    (
        d.outcome(),
        d.retry_after(),
        states
            .map(|s| (s.limit(), s.remaining(), s.reset_after()))
            .collect(),
    )
}

struct Pair {
    cached: RedisStore,
    asking: RedisStore,
    conn: redis::aio::MultiplexedConnection,
}

impl Pair {
    async fn keep(&self, limiters: &[&RedisRateLimiter<Box<[u8]>>], k: &str) {
        for l in limiters {
            let _: i64 = redis::cmd("PERSIST")
                .arg(l.redis_key(&k.as_bytes().into()))
                .query_async(&mut self.conn.clone())
                .await
                .unwrap();
        }
    }
}

async fn deny_cache_case(
    p: &Pair,
    name: &str,
    two: bool,
    start: u8,
    ops: Vec<Op>,
) -> Result<u64, TestCaseError> {
    let (clock, time) = manual();
    let cached = layer(&gcras(two, start), &format!("{name}-c"), &clock).store(p.cached.clone());
    let asking = layer(&gcras(two, start), &format!("{name}-a"), &clock).store(p.asking.clone());
    let (lc, la) = (
        cached.limiter(&format!("{name}-c")).unwrap().unwrap(),
        asking.limiter(&format!("{name}-a")).unwrap().unwrap(),
    );
    let (hc, ha) = (cached.handle().unwrap(), asking.handle().unwrap());
    let mut rc = Rig::new(|h| Boxed::new(cached.layer(h)));
    let mut ra = Rig::new(|h| Boxed::new(asking.layer(h)));
    let key: Box<[u8]> = b"k"[..].into();
    let mut in_flight = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Send(cost) => {
                let (c, a) = (rc.send("k", cost).await, ra.send("k", cost).await);
                prop_assert_eq!(c.is_some(), a.is_some(), "step {}: send {}", i, cost);
                if let (Some(c), Some(a)) = (c, a) {
                    in_flight.push((c, a));
                }
            }
            Op::Answer(n, reply) => {
                if in_flight.is_empty() {
                    continue;
                }
                let (c, a) = in_flight.remove(n % in_flight.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                rc.answer(c, reply).await;
                ra.answer(a, reply).await;
            }
            Op::Check(cost) => {
                let (c, a) = (lc.check_n(&key, cost).await, la.check_n(&key, cost).await);
                prop_assert_eq!(said(&c), said(&a), "step {}: check {}", i, cost);
            }
            Op::Wait(n, nudge) => {
                let ns = (n * 25 * MS).saturating_add_signed(i64::from(nudge) * 1_000);
                time.advance(Duration::from_nanos(ns));
            }
            Op::Change(v) => {
                hc.set_default_quotas(gcras(two, v)).unwrap();
                ha.set_default_quotas(gcras(two, v)).unwrap();
            }
        }
        // Kept for as long as the case reads them (the keys expire on the server's clock,
        // which the manual one does not move), before and after the peeks, which may set an
        // expiry too.
        p.keep(&[&lc, &la], "k").await;
        let (c, a) = (lc.check_n(&key, 0).await, la.check_n(&key, 0).await);
        p.keep(&[&lc, &la], "k").await;
        prop_assert_eq!(said(&c), said(&a), "step {}: peek", i);
    }
    prop_assert_eq!(la.local_rejections(), 0);
    Ok(lc.local_rejections())
}

/// One server for every case, two names of their own per case.
#[test]
fn a_cached_rejection_decides_as_redis_through_live_changes_and_give_backs() {
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let pair = rt.block_on(async {
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let conn = connection(&server).await;
        Pair {
            // Rejections trusted for a minute: the clock of a case never gets that far.
            cached: store.clone().deny_cache_max_age(Duration::from_secs(60)),
            asking: store.deny_cache(0),
            conn,
        }
    });
    let mut runner = TestRunner::new(Config::with_cases(96));
    let case = std::cell::Cell::new(0u32);
    let local = std::cell::Cell::new(0u64);
    let strategy = (any::<bool>(), 0u8..3, prop::collection::vec(op(), 1..60));
    runner
        .run(&strategy, |(two, start, ops)| {
            case.set(case.get() + 1);
            let name = format!("deny{}", case.get());
            let n = rt.block_on(deny_cache_case(&pair, &name, two, start, ops))?;
            local.set(local.get() + n);
            Ok(())
        })
        .unwrap();
    // The cache did answer.
    assert!(local.get() > 100, "{} local rejections", local.get());
}

// ---- the local fallback ----

/// Each kind in two settings: the policy, and the same at half written out by hand.
fn halves(kind: u8, v: u8) -> (Vec<Quota>, Vec<Quota>) {
    let s = Duration::from_secs(1);
    let w = [s, 2 * s][usize::from(v % 2)];
    let (n, h) = [(8, 4), (13, 6)][usize::from(v % 2)];
    match kind {
        0 => (
            vec![Quota::per_second(n).burst(n + 4)],
            vec![Quota::per_second(h).burst((n + 4) / 2)],
        ),
        1 => (
            vec![Quota::fixed_window(n, w)],
            vec![Quota::fixed_window(h, w)],
        ),
        2 => (
            vec![Quota::sliding_log(n, w)],
            vec![Quota::sliding_log(h, w)],
        ),
        3 => (
            vec![Quota::sliding_window(n, w)],
            vec![Quota::sliding_window(h, w)],
        ),
        4 => (
            vec![Quota::per_second(n).warm_up(w, 3)],
            vec![Quota::per_second(h).warm_up(w, 3)],
        ),
        _ => (
            vec![Quota::per_second(n), Quota::sliding_log(3 * n, w)],
            vec![Quota::per_second(h), Quota::sliding_log(3 * n / 2, w)],
        ),
    }
}

fn memory(quotas: &[Quota], clock: Clock) -> RateLimiter<u64> {
    quotas[1..]
        .iter()
        .fold(RateLimiter::builder(quotas[0].clone()), |b, q| {
            b.quota(q.clone())
        })
        .clock(clock)
        .build()
}

/// Redis never reachable: every decision is the local one on the quotas at half, changed
/// while the limiter serves as its twin in memory is changed, step by step and on two keys.
#[tokio::test]
async fn the_local_fallback_follows_live_changes_at_its_share_for_every_kind() {
    let store = RedisStore::open(&format!("redis://127.0.0.1:{}", free_port()))
        .unwrap()
        .timeout(Duration::from_millis(50))
        .on_failure(FailMode::local(0.5))
        // After the first failure, decided locally at once (no connection tried per call).
        .probe_every(Duration::from_secs(3_600));
    // A fixed sequence of steps (xorshift): the same every run.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for kind in 0..6u8 {
        for round in 0..8 {
            let (clock, time) = Clock::manual();
            let (policy, half) = halves(kind, 0);
            let l = RedisRateLimiter::<u64>::builder(store.clone(), policy[0].clone());
            let l = policy[1..]
                .iter()
                .fold(l, |b, q| b.quota(q.clone()))
                .name(format!("local{kind}-{round}"))
                .clock(clock.clone())
                .build();
            let twin = memory(&half, clock);
            for step in 0..120 {
                let ctx = format!("kind {kind}, round {round}, step {step}");
                match next(10) {
                    0 => {
                        let v = next(2) as u8;
                        let (policy, half) = halves(kind, v);
                        l.set_quotas(policy).unwrap();
                        twin.set_quotas(half).unwrap();
                    }
                    1..=3 => time.advance(Duration::from_millis(next(400))),
                    _ => {
                        let key = next(2);
                        let cost = next(4) as u32;
                        let d = l.check_n(&key, cost).await;
                        let want = twin.check_n(&key, cost);
                        assert!(d.is_degraded() && d.is_local(), "{ctx}");
                        assert_outcome(&d, &want, &l, cost, &ctx);
                        assert_eq!(d.states(), want.states(), "{ctx}");
                    }
                }
            }
        }
    }
}

/// The fallback's outcome is its twin's, except that a cost above the halved burst but
/// within the policy's is not refused for ever: it may pass once Redis is back.
fn assert_outcome(d: &Decision, want: &Decision, l: &RedisRateLimiter<u64>, cost: u32, ctx: &str) {
    let burst = l.quotas().iter().map(Quota::burst_size).min().unwrap();
    if want.outcome() == Outcome::Exceeds && cost <= burst {
        assert_eq!(d.outcome(), Outcome::Limited, "{ctx}");
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)), "{ctx}");
    } else {
        assert_eq!(d.outcome(), want.outcome(), "{ctx}");
        assert_eq!(d.retry_after(), want.retry_after(), "{ctx}");
    }
}
