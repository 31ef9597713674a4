//! A key of one sliding-log quota (the log's path of its own: one entry per instant at which
//! requests were admitted) through refunds and settlements that arrive late, requests at one
//! instant and on the windows' edges, live changes of the width and the limit, and the key
//! forgotten whenever it is idle and coming back: in memory by `evict_idle` and by a table of
//! one key giving its place to another key, on Redis by the key deleted (as its time to live
//! would). At every step the layer decides and reports as the account model
//! (`tests/common/account.rs`, one entry per request), which never forgets a key: forgetting
//! an idle key changes no decision, and a late refund of a forgotten key's request gives back
//! nothing that a later request took.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change", "Keyed state").

use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::OnFull;
use tollgate::{Decision, RateLimitHandle};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{layer, Boxed};

const MS: u64 = 1_000_000;

/// The log in setting `v`: (limit, width) of (4, 400 ms), (6, 800 ms) or (2, 200 ms).
fn kind(v: u8) -> Kind {
    let (limit, width) = [(4, 400), (6, 800), (2, 200)][usize::from(v % 3)];
    Kind::Log {
        limit,
        width: width * MS,
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost (held in flight when admitted).
    Send(u32),
    /// The `i`-th request in flight answers: given back (200), kept (401) or settled at a
    /// cost.
    Answer(usize, Option<Option<u32>>),
    /// The clock moves by this many steps of 100 ms, nudged by this many ticks (a window's
    /// edge, and either side of it).
    Wait(u64, i8),
    Change(u8),
    /// When the model says the key is idle, the store forgets it.
    Forget,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![6 => 0u32..4, 1 => 4u32..8].prop_map(Op::Send),
        4 => (0usize..8, prop::option::of(prop::option::of(0u32..9)))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        4 => (0u64..6, prop_oneof![4 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(n, d)| Op::Wait(n, d)),
        1 => (0u8..3).prop_map(Op::Change),
        2 => Just(Op::Forget),
    ]
}

/// What a store does to the key under test beyond the layer.
#[allow(async_fn_in_trait)]
trait Side {
    /// The store's smallest time step, in ns.
    const TICK: u64;
    /// Reads the key without spending.
    async fn peek(&self) -> Decision;
    /// Forgets the idle key.
    async fn forget(&self, rig: &mut Rig<Boxed>);
    /// Keeps the key for as long as the test reads it.
    async fn keep(&self);
}

fn remaining(d: &Decision) -> u64 {
    d.states()[0].remaining()
}

async fn the_log_keeps_the_account_through_forgetting(
    side: &impl Side,
    rig: &mut Rig<Boxed>,
    handle: &RateLimitHandle,
    time: &tollgate::ManualClock,
    start: u8,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut model = Account::new(vec![kind(start)]);
    let mut now = 1_000_000_000_001u64;
    let mut in_flight: Vec<(u64, Taken)> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Send(cost) => {
                let (said, t) = model.admit(now, cost);
                let got = rig.send("k", cost).await;
                prop_assert_eq!(got.is_some(), said.allowed, "step {}: send {}", i, cost);
                if let Some(id) = got {
                    in_flight.push((id, t.unwrap_or(Taken::nothing())));
                }
            }
            Op::Answer(n, reply) => {
                if in_flight.is_empty() {
                    continue;
                }
                let (id, t) = in_flight.remove(n % in_flight.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                let actual = match (reply.status, reply.actual) {
                    (200, _) => 0,
                    (_, Some(n)) => n,
                    (_, None) => t.cost,
                };
                model.settle(now, &t, actual);
                rig.answer(id, reply).await;
            }
            Op::Wait(steps, nudge) => {
                let ns =
                    (steps * 100 * MS).saturating_add_signed(i64::from(nudge) * tick(side) as i64);
                time.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Op::Change(v) => {
                handle.set_default_quotas([kind(v).quota()]).unwrap();
                model.set_quotas(now, vec![kind(v)]);
            }
            Op::Forget => {
                let Kind::Log { limit, .. } = model.quotas[0] else {
                    unreachable!()
                };
                if model.peek(now).remaining == [limit] {
                    side.forget(rig).await;
                }
            }
        }
        side.keep().await;
        let d = side.peek().await;
        // A read may set the key's expiry too.
        side.keep().await;
        let said = model.peek(now);
        prop_assert_eq!(remaining(&d), said.remaining[0], "step {}", i);
        prop_assert_eq!(d.is_allowed(), said.allowed, "step {}", i);
    }
    Ok(())
}

fn tick<S: Side>(_: &S) -> u64 {
    S::TICK
}

/// Memory: a table of one key; forgetting is `evict_idle`, then a request of another key
/// that takes the only place (the key under test gets it back at its next request).
struct OnMemory {
    lim: tollgate::RateLimiter<Box<[u8]>>,
}

impl Side for OnMemory {
    const TICK: u64 = 1;
    async fn peek(&self) -> Decision {
        self.lim.peek(&b"k"[..].into())
    }
    async fn forget(&self, rig: &mut Rig<Boxed>) {
        self.lim.evict_idle();
        if let Some(id) = rig.send("other", 1).await {
            rig.answer(id, FAILED).await;
        }
        assert_eq!(self.lim.len(), 1);
    }
    async fn keep(&self) {}
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_log_key_forgotten_whenever_idle_decides_as_the_model_in_memory(
        start in 0u8..3,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (clock, time) = manual();
            let l = layer(&[kind(start).quota()], "log", &clock)
                .max_keys(1)
                .on_full(OnFull::EvictNearestIdle);
            let handle = l.handle().unwrap();
            let side = OnMemory { lim: l.limiter("log").unwrap().unwrap() };
            let mut rig = Rig::new(|h| Boxed::new(l.layer(h)));
            the_log_keeps_the_account_through_forgetting(&side, &mut rig, &handle, &time, start, ops)
                .await
        })?;
    }
}

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use crate::common::redis_server::{connection, RedisServer};
    use tollgate::redis::{RedisRateLimiter, RedisStore};

    /// Redis: forgetting is the key deleted, as its time to live running out would.
    struct OnRedis {
        lim: RedisRateLimiter<Box<[u8]>>,
        conn: redis::aio::MultiplexedConnection,
    }

    impl OnRedis {
        fn key(&self) -> Vec<u8> {
            self.lim.redis_key(&b"k"[..].into())
        }
    }

    impl Side for OnRedis {
        const TICK: u64 = 1_000;
        async fn peek(&self) -> Decision {
            self.lim.check_n(&b"k"[..].into(), 0).await
        }
        async fn forget(&self, _: &mut Rig<Boxed>) {
            let _: i64 = redis::cmd("DEL")
                .arg(self.key())
                .query_async(&mut self.conn.clone())
                .await
                .unwrap();
        }
        async fn keep(&self) {
            let _: i64 = redis::cmd("PERSIST")
                .arg(self.key())
                .query_async(&mut self.conn.clone())
                .await
                .unwrap();
        }
    }

    /// One server for every case, a policy name of its own per case.
    #[test]
    fn a_log_key_forgotten_whenever_idle_decides_as_the_model_on_redis() {
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
        let mut runner = TestRunner::new(Config::with_cases(64));
        let case = std::cell::Cell::new(0u32);
        let strategy = (0u8..3, prop::collection::vec(op(), 1..60));
        runner
            .run(&strategy, |(start, ops)| {
                case.set(case.get() + 1);
                let name = format!("log{}", case.get());
                rt.block_on(async {
                    let (clock, time) = manual();
                    let l = layer(&[kind(start).quota()], &name, &clock).store(store.clone());
                    let handle = l.handle().unwrap();
                    let side = OnRedis {
                        lim: l.limiter(&name).unwrap().unwrap(),
                        conn: conn.clone(),
                    };
                    let mut rig = Rig::new(|h| Boxed::new(l.layer(h)));
                    the_log_keeps_the_account_through_forgetting(
                        &side, &mut rig, &handle, &time, start, ops,
                    )
                    .await
                })
            })
            .unwrap();
    }
}
