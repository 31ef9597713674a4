//! Two stacked layers on ONE Redis name (so one quota state and one penalty box per key),
//! each with its own cost per request and its own burst (one rate), either of them (or both,
//! or neither) in dry run, both with the penalty box: every request through both, at random times, against a model of one
//! GCRA account and one penalty box. Only an enforcing layer's own refusals are strikes (a
//! dry run's would-be refusals never are, however many); a ban either layer's strikes earn is
//! read by both (the enforcing one refuses, the dry run lets through and takes nothing); a
//! request the inner layer refuses gives back what the outer one took; a dry run's admissions
//! take from the shared quota as any others do.
//!
//! Pins docs/design.md section 3 ("The penalty box punishes the client's own traffic",
//! "Stacked layers are all or nothing", "Observability": dry-run never rejects) and the
//! name rule of `RedisRateLimiterBuilder::name` (limiters named alike share their keys).
#![cfg(feature = "redis")]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use proptest::prelude::*;
use tollgate::key::{Header, RequestHead};
use tollgate::penalty::PenaltyBox;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::redis_server::{connection, RedisServer};
use crate::common::stores::Boxed;

const US: u64 = 1_000;
/// One request per 100 ms; the outer layer's burst is 4, the inner one's 4 or 6 (limiters
/// named alike share their keys whatever their quotas: each judges the one state by its own).
const T: u64 = 100_000 * US;
const BURST: u64 = 4;
/// Three strikes within 2.05 s ban for 1.53 s, twice as long each time: no time of the test,
/// on its 100 ms grid, falls within 20 ms of the end of a run or a ban (a Redis key expires
/// on the server's clock, which runs on between the two layers' calls of one request).
const STRIKES: u32 = 3;
const WITHIN: u64 = 2_050_000 * US;
const BAN: u64 = 1_530_000 * US;

fn quota(burst: u64) -> Quota {
    Quota::new(1, Duration::from_nanos(T)).burst(burst as u32)
}

fn penalty_box() -> PenaltyBox {
    PenaltyBox::new(
        STRIKES,
        Duration::from_nanos(WITHIN),
        Duration::from_nanos(BAN),
    )
}

fn cost_of(name: &'static str) -> impl Fn(&RequestHead<'_>) -> u32 + Clone + Send + Sync {
    move |h| {
        h.headers
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    }
}

/// The model: one GCRA account and one penalty box for the key.
#[derive(Debug, Default)]
struct Model {
    tat: u64,
    /// (start, strikes) of the open run.
    run: Option<(u64, u32)>,
    ban_until: u64,
    bans: u32,
}

impl Model {
    /// Takes `c` at `now` if it fits a burst of `burst`: the slice's length taken, or `None`
    /// when refused.
    fn take(&mut self, now: u64, c: u64, burst: u64) -> Option<u64> {
        let base = self.tat.max(now);
        if c > burst || base + c * T - now > burst * T {
            return None;
        }
        if c > 0 {
            self.tat = base + c * T;
        }
        Some(c * T)
    }

    /// Gives back a slice of `len` taken at `now` (all of it still ahead of now).
    fn give_back(&mut self, now: u64, len: u64) {
        if self.tat > now {
            self.tat = self.tat.saturating_sub(len).max(now);
        }
    }

    fn banned(&self, now: u64) -> bool {
        now < self.ban_until
    }

    fn strike(&mut self, now: u64) {
        if self.banned(now) {
            return;
        }
        let count = match self.run {
            Some((start, n)) if now < start + WITHIN => n + 1,
            _ => {
                self.run = Some((now, 1));
                1
            }
        };
        if let Some(run) = &mut self.run {
            run.1 = count;
        }
        if count == STRIKES {
            self.bans += 1;
            self.ban_until = now + (BAN << (self.bans - 1));
            self.run = None;
        }
    }

    fn remaining(&self, now: u64) -> u64 {
        (BURST * T).saturating_sub(self.tat.saturating_sub(now)) / T
    }
}

/// What one layer does with a request of `c` at `now`: `Some(taken)` when it passes the
/// request on (having taken that much), `None` when it refuses it.
fn layer_step(m: &mut Model, dry: bool, burst: u64, now: u64, c: u64) -> Option<u64> {
    if m.banned(now) {
        return if dry { Some(0) } else { None };
    }
    match m.take(now, c, burst) {
        Some(taken) => Some(taken),
        None if dry => Some(0),
        None => {
            m.strike(now);
            None
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request costing this much in the outer layer and this much in the inner one.
    Send(u32, u32),
    /// The clock moves by this many steps of 100 ms.
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let cost = prop_oneof![8 => 0u32..4, 2 => 4u32..7, 1 => Just(7u32)];
    prop_oneof![
        5 => (cost.clone(), cost).prop_map(|(a, b)| Op::Send(a, b)),
        2 => (0u64..12).prop_map(Op::Wait),
    ]
}

fn handler() -> Boxed {
    Boxed::new(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }))
}

fn layer(
    name: &str,
    clock: &Clock,
    store: &RedisStore,
    cost: &'static str,
    dry: bool,
    burst: u64,
) -> RateLimitLayer<Header, RedisStore> {
    RateLimitLayer::new(Policy::new(name.to_owned(), quota(burst)))
        .key(Header::new("x-key"))
        .cost(cost_of(cost))
        .clock(clock.clone())
        .penalty_box(penalty_box())
        .dry_run(dry)
        .store(store.clone())
}

async fn case(
    store: &RedisStore,
    conn: &redis::aio::MultiplexedConnection,
    name: &str,
    dry: (bool, bool),
    inner_burst: u64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let outer = layer(name, &clock, store, "x-outer", dry.0, BURST);
    let inner = layer(name, &clock, store, "x-inner", dry.1, inner_burst);
    let svc = Boxed::new(outer.layer(Boxed::new(inner.layer(handler()))));
    // Reads the shared state: a limiter of the same name and quota, without a penalty box.
    let reader = RedisRateLimiter::<Box<[u8]>>::builder(store.clone(), quota(BURST))
        .name(name.to_owned())
        .clock(clock.clone())
        .build();
    let bans = outer.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = b"mallory"[..].into();
    // The quota key and the penalty key expire on the server's clock, which the manual one
    // does not move: kept for as long as the case reads them.
    let quota_key = reader.redis_key(&key);
    let ban_key = format!("tollgate:ban:{}:{name}:mallory", name.len());
    assert!(quota_key.starts_with(b"tollgate:"));
    let mut m = Model::default();
    let mut now = time.now().as_nanos() as u64;
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Send(a, b) => {
                let expect = match layer_step(&mut m, dry.0, BURST, now, u64::from(a)) {
                    None => 429,
                    Some(took) => match layer_step(&mut m, dry.1, inner_burst, now, u64::from(b)) {
                        Some(_) => 200,
                        None => {
                            m.give_back(now, took);
                            429
                        }
                    },
                };
                let req = Request::get("/")
                    .header("x-key", "mallory")
                    .header("x-outer", a.to_string())
                    .header("x-inner", b.to_string())
                    .body(())
                    .unwrap();
                let status = svc.clone().oneshot(req).await.unwrap().status().as_u16();
                prop_assert_eq!(status, expect, "step {}: costs {} and {}", i, a, b);
            }
            Op::Wait(n) => {
                time.advance(Duration::from_nanos(n * T));
                now += n * T;
            }
        }
        let left = bans.ban_left(&key).await;
        let want = m.banned(now).then(|| m.ban_until - now);
        prop_assert_eq!(
            left.map(|d| d.as_micros() as u64),
            want.map(|w| w / US),
            "step {}: ban",
            i
        );
        let d = reader.check_n(&key, 0).await;
        prop_assert_eq!(d.remaining(), m.remaining(now), "step {}: remaining", i);
        // After the reads, which may set an expiry too.
        for k in [&quota_key[..], ban_key.as_bytes()] {
            let _: i64 = redis::cmd("PERSIST")
                .arg(k)
                .query_async(&mut conn.clone())
                .await
                .unwrap();
        }
    }
    Ok(())
}

/// One server for every case, a name of its own per case.
#[test]
fn stacked_layers_on_one_name_strike_only_for_an_enforcing_layers_own_refusals() {
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let (store, conn) = rt.block_on(async {
        let store = RedisStore::connect(&server.url())
            .await
            .unwrap()
            .timeout(Duration::from_secs(5));
        let conn = connection(&server).await;
        (store, conn)
    });
    let mut runner = TestRunner::new(Config::with_cases(96));
    let n = std::cell::Cell::new(0u32);
    let strategy = (
        any::<(bool, bool)>(),
        prop_oneof![Just(BURST), Just(6u64)],
        prop::collection::vec(op(), 1..80),
    );
    runner
        .run(&strategy, |(dry, burst, ops)| {
            n.set(n.get() + 1);
            let name = format!("shared{}", n.get());
            rt.block_on(case(&store, &conn, &name, dry, burst, ops))
        })
        .unwrap();
}

/// A log quota (a sorted set) and a GCRA quota (a string) stacked on one name meet on one
/// Redis key of two types: the inner layer's decision is an error about that key, which
/// refuses the request as unavailable (503) however often, is never a strike, and gives back
/// what the outer layer took.
#[tokio::test]
async fn two_kinds_on_one_name_are_a_key_error_that_never_strikes_and_gives_back() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, time) = manual();
    let with = |q: Quota| {
        RateLimitLayer::new(Policy::new("mixed", q))
            .key(Header::new("x-key"))
            .clock(clock.clone())
            .penalty_box(PenaltyBox::new(
                2,
                Duration::from_secs(60),
                Duration::from_secs(60),
            ))
            .store(store.clone())
    };
    let outer = with(Quota::sliding_log(3, Duration::from_secs(1)));
    let inner = with(Quota::per_second(3));
    let svc = Boxed::new(outer.layer(Boxed::new(inner.layer(handler()))));
    let send = |k: &'static str| {
        let svc = svc.clone();
        async move {
            let req = Request::get("/").header("x-key", k).body(()).unwrap();
            svc.oneshot(req).await.unwrap().status().as_u16()
        }
    };
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(send("mallory").await);
        time.advance(Duration::from_millis(10));
    }
    // Two refusals within a minute would ban: none is a strike.
    assert_eq!(seen, [503; 6]);
    let lim = outer.limiter("mixed").unwrap().unwrap();
    let key: Box<[u8]> = b"mallory"[..].into();
    assert_eq!(lim.ban_left(&key).await, None);
    // Every entry the log took was given back: the key is gone, and the log has its 3.
    let name = String::from_utf8(lim.redis_key(&key)).unwrap();
    assert_eq!(server.cli(&["EXISTS", &name]).as_deref(), Some("0\n"));
    assert_eq!(lim.check_n(&key, 0).await.remaining(), 3);
    // Every key of the name meets the same error.
    assert_eq!(send("alice").await, 503);
}
