#![cfg(feature = "redis")]
//! A key's account on a real redis-server, where Redis differs from memory (docs/design.md
//! section 3, "An account per key" and "Redis"): the cases `account.rs` runs over both stores
//! are not repeated here. Quota changes judged alike by a Redis limiter and a memory one side
//! by side, warm-up quotas (which the model does not cover) side by side on random
//! sequences, the Redis key's time to live under a widened window, and tasks racing a burst
//! flip.

use std::time::Duration;

use super::account::{op, Op};
use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::redis_server::{connection, RedisServer, ServerClock};
use crate::common::stores::{self, key};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::key::Header;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Outcome, Quota, RateLimitLayer, RateLimiter};
use tower::Layer;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

pub(crate) type Limit = RateLimitLayer<Header, RedisStore>;

/// A store on `server`, whose calls may take 5 s on a loaded machine.
pub(crate) async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5))
}

/// The layer of the shared suites, on Redis, the policy named `name`.
pub(crate) fn layer(store: &RedisStore, name: &str, quotas: &[Quota], clock: &Clock) -> Limit {
    stores::layer(quotas, name, clock).store(store.clone())
}

fn limiter(l: &Limit, name: &str) -> RedisRateLimiter<Box<[u8]>> {
    l.limiter(name).unwrap().unwrap()
}

/// A Redis limiter and a memory one on the same clock, decided side by side.
async fn twins(store: &RedisStore, name: &str, q: Quota, clock: &Clock) -> Twins {
    let redis = RedisRateLimiter::<u8>::builder(store.clone(), q.clone())
        .name(name.to_owned())
        .clock(clock.clone())
        .build();
    let memory = RateLimiter::<u8>::builder(q).clock(clock.clone()).build();
    Twins { redis, memory }
}

struct Twins {
    redis: RedisRateLimiter<u8>,
    memory: RateLimiter<u8>,
}

impl Twins {
    fn set(&self, q: Quota) {
        self.redis.set_quotas([q.clone()]).unwrap();
        self.memory.set_quotas([q]).unwrap();
    }

    async fn check_n(&self, cost: u32) -> tollgate::Decision {
        let (r, m) = (
            self.redis.check_n(&1, cost).await,
            self.memory.check_n(&1, cost),
        );
        assert_eq!(r, m);
        r
    }
}

#[tokio::test]
async fn changes_judge_the_stored_state_alike_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = manual();
    // No free burst: burst 10, 5, 10 on a stopped clock admits 10.
    let t = twins(&store, "flip", Quota::per_second(10), &clock).await;
    let mut admitted = 0;
    for burst in [10, 5, 10, 5, 10] {
        t.set(Quota::per_second(10).burst(burst));
        while t.check_n(1).await.is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    // A peek after a lowered burst: limited for the time spent beyond the new tolerance.
    t.set(Quota::per_second(10).burst(5));
    let d = t.check_n(0).await;
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.retry_after(), Some(500 * MS));

    // A fixed window keeps its end: 1 h then 1 s.
    let t = twins(&store, "fixed", Quota::fixed_window(1, 3_600 * S), &clock).await;
    assert!(t.check_n(1).await.is_allowed());
    t.set(Quota::fixed_window(1, S));
    assert_eq!(t.check_n(1).await.retry_after(), Some(3_600 * S));

    // A log widened after its entry left the old window, and one widened before.
    let t = twins(&store, "log", Quota::sliding_log(1, S), &clock).await;
    assert!(t.check_n(1).await.is_allowed());
    time.advance(2 * S);
    t.set(Quota::sliding_log(1, 10 * S));
    assert!(t.check_n(1).await.is_allowed());
    t.set(Quota::sliding_log(1, 20 * S));
    time.advance(15 * S);
    assert_eq!(t.check_n(1).await.retry_after(), Some(5 * S));
}

/// Bytes of a Redis log key and the server's time for one script call, per request cost:
/// printed, not asserted (`cargo test --all-features --test account -- --ignored
/// --nocapture log_figures`).
#[tokio::test]
#[ignore]
async fn log_figures() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = manual();
    let day = Duration::from_secs(86_400);
    let mut conn = crate::common::redis_server::connection(&server).await;
    for (name, cost, n) in [("ones", 1u32, 10_000u32), ("big", 10_000, 1)] {
        let l = RedisRateLimiter::<u8>::builder(store.clone(), Quota::sliding_log(10_000, day))
            .name(name.to_owned())
            .clock(clock.clone())
            .build();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut conn)
            .await
            .unwrap();
        for _ in 0..n {
            time.advance(Duration::from_micros(10));
            assert!(l.check_n(&1, cost).await.is_allowed());
        }
        let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(100_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut micros = Vec::new();
        for e in &log {
            if let redis::Value::Array(fields) = e {
                if let (Some(redis::Value::Int(us)), Some(redis::Value::Array(cmd))) =
                    (fields.get(2), fields.get(3))
                {
                    if matches!(cmd.first(), Some(redis::Value::BulkString(c)) if c == b"EVALSHA") {
                        micros.push(*us);
                    }
                }
            }
        }
        micros.sort_unstable();
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(l.redis_key(&1))
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
        println!(
            "{n} requests of cost {cost}: {bytes} bytes ({} per request), script median {} µs, max {} µs",
            bytes / i64::from(n),
            micros.get(micros.len() / 2).copied().unwrap_or(0),
            micros.last().copied().unwrap_or(0),
        );
    }
}

/// Warm-up and GCRA quotas, which the model does not cover, side by side: the HTTP layer on
/// memory and on Redis, random admissions, late refunds, settlements and live changes, the
/// same decisions and the same figures at every step.
#[test]
fn the_memory_and_redis_layers_keep_the_same_account_with_warm_up() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(store(&server));
    let conn = rt.block_on(connection(&server));
    let quotas = |v: [bool; 4]| {
        vec![
            // The change keeps the warm-up curve (rate, period, cold factor) and moves the
            // burst. Here the Redis key never expires (the clock is manual), while memory
            // makes a key idle at a change of curve new; and on Redis a key expires when idle
            // under the curve its last write saw, which a later change of curve does not
            // follow. A change of curve is compared in `rate_limit::warmup_redis`, with the
            // Redis keys idle at the change deleted.
            if v[0] {
                Quota::per_second(5).burst(4).warm_up(2 * S, 3)
            } else {
                Quota::per_second(5).burst(8).warm_up(2 * S, 3)
            },
            if v[1] {
                Quota::per_second(10)
            } else {
                Quota::per_second(4).burst(3)
            },
        ]
    };
    let mut runner = TestRunner::new(Config::with_cases(64));
    let case = std::cell::Cell::new(0u32);
    let strategy = (any::<[bool; 4]>(), prop::collection::vec(op(), 1..60));
    runner
        .run(&strategy, |(start, ops)| {
            case.set(case.get() + 1);
            let name = format!("warm{}", case.get());
            rt.block_on(async {
                // The Redis key's time to live runs on the server's clock, the decisions on the
                // manual one: every key persists after each step, and a case in which the
                // server expired one before that (real time running past a time to live on a
                // loaded machine) is void.
                let mut server_clock = ServerClock::watch(&conn).await;
                let outcome = async {
                    let (clock, time) = manual();
                    let on_redis = layer(&store, &name, &quotas(start), &clock);
                    let in_memory = stores::layer(&quotas(start), &name, &clock);
                    let r_lim = limiter(&on_redis, &name);
                    let m_lim: RateLimiter<Box<[u8]>> = in_memory.limiter(&name).unwrap().unwrap();
                    let mut r_rig = Rig::new(|h| on_redis.layer(h));
                    let mut m_rig = Rig::new(|h| in_memory.layer(h));
                    let mut flying: Vec<(u64, u64)> = Vec::new();
                    for op in ops {
                        match op {
                            Op::Send(cost) => {
                                let (r, m) =
                                    (r_rig.send("k", cost).await, m_rig.send("k", cost).await);
                                prop_assert_eq!(r.is_some(), m.is_some(), "send {}", cost);
                                if let (Some(r), Some(m)) = (r, m) {
                                    flying.push((r, m));
                                }
                            }
                            Op::Answer(i, reply) => {
                                if flying.is_empty() {
                                    continue;
                                }
                                let (r, m) = flying.remove(i % flying.len());
                                let reply = match reply {
                                    None => OK,
                                    Some(None) => FAILED,
                                    Some(Some(n)) => settles(n),
                                };
                                r_rig.answer(r, reply).await;
                                m_rig.answer(m, reply).await;
                            }
                            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                            Op::Change(v) => {
                                r_lim.set_quotas(quotas(v)).unwrap();
                                m_lim.set_quotas(quotas(v)).unwrap();
                            }
                            // Exact eviction: dropping idle keys from memory changes no decision.
                            Op::Evict => {
                                m_lim.evict_idle();
                            }
                            Op::Peek => {}
                        }
                        server_clock.keep_all().await;
                        let r = r_lim.check_n(&key("k"), 0).await;
                        let m = m_lim.peek(&key("k"));
                        prop_assert_eq!(r, m);
                    }
                    Ok(())
                }
                .await;
                server_clock.judge(outcome).await
            })
        })
        .unwrap();
}

#[tokio::test]
async fn a_rejection_under_a_widened_window_keeps_the_redis_key_as_long_as_it_counts() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = manual();
    for (name, narrow, wide) in [
        (
            "wlog",
            Quota::sliding_log(2, S),
            Quota::sliding_log(2, 60 * S),
        ),
        (
            "wcounter",
            Quota::sliding_window(2, S),
            Quota::sliding_window(2, 60 * S),
        ),
    ] {
        let l = RedisRateLimiter::<u8>::builder(store.clone(), narrow)
            .name(name.to_owned())
            .clock(clock.clone())
            .build();
        assert!(l.check_n(&1, 2).await.is_allowed());
        l.set_quotas([wide]).unwrap();
        assert!(!l.check(&1).await.is_allowed());
        // The key lives on the server's clock: as long as the wide window sees it.
        let ttl: i64 = server
            .cli(&["PTTL", &String::from_utf8(l.redis_key(&1)).unwrap()])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 50_000, "{name}: {ttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_on_one_redis_key_while_the_burst_flips_admit_at_most_the_larger_burst() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = manual();
    let l = RedisRateLimiter::<u8>::builder(store, Quota::per_second(10))
        .name("flip50".to_owned())
        .clock(clock)
        .build();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let decided = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (l, done, decided) = (l.clone(), done.clone(), decided.clone());
        tasks.spawn(async move {
            let mut admitted = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                admitted += u64::from(l.check(&1).await.is_allowed());
                decided.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            admitted
        });
    }
    // 200 flips, with decisions between each two.
    for i in 0..200u64 {
        let burst = if i % 2 == 0 { 5 } else { 10 };
        l.set_quotas([Quota::per_second(10).burst(burst)]).unwrap();
        while decided.load(std::sync::atomic::Ordering::Relaxed) < (i + 1) * 10 {
            tokio::task::yield_now().await;
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let mut admitted = 0;
    while let Some(n) = tasks.join_next().await {
        admitted += n.unwrap();
    }
    assert!(admitted <= 10, "{admitted}");
}
