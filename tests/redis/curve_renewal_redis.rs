//! A live change of a warm-up curve at any instant, on a real redis-server beside the memory
//! store (docs/design.md section 3, "A live quota change": a key idle under the quotas in
//! force at the change is a new key). The memory store makes such keys new at the change;
//! Redis, whose key may outlive that instant (its time to live is rounded up to whole
//! milliseconds), is told when the curve changed and what it was, and decides them as new
//! keys too. Changes are drawn at random instants and at the very microsecond a key goes idle
//! (and one before, one after), with admissions, refunds and settlements between.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::{connection, RedisServer, ServerClock};
use common::twins::{self, Twins};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tollgate::Quota;

const SEC: Duration = Duration::from_secs(1);

/// Three curves of one rate (the burst and warm-up differ), and a GCRA quota beside them.
fn quotas(curve: u8) -> Vec<Quota> {
    let warm = match curve {
        0 => Quota::per_second(1).burst(1).warm_up(4 * SEC, 3),
        1 => Quota::per_second(1).burst(2).warm_up(2 * SEC, 10),
        _ => Quota::per_second(1).burst(1).warm_up(8 * SEC, 2),
    };
    vec![warm, Quota::per_second(50)]
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost.
    Send(u32),
    Wait(u64),
    /// A change to this curve now.
    Change(u8),
    /// The clock moved to the microsecond the key goes idle under the curve in force, plus
    /// this (-1, 0 or 1 µs), then a change to this curve.
    ChangeAtIdle(i8, u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3).prop_map(Op::Send),
        2 => (0u64..3_000_000).prop_map(Op::Wait),
        1 => (0u8..3).prop_map(Op::Change),
        3 => (-1i8..=1, 0u8..3).prop_map(|(d, c)| Op::ChangeAtIdle(d, c)),
    ]
}

/// The curve's numbers in µs: its period and `max` (src/algo/warmup.rs `Curve`).
fn curve_numbers(curve: u8) -> (u64, u64) {
    let (period, cold): (u64, u64) = match curve {
        0 => (4_000_000, 3),
        1 => (2_000_000, 10),
        _ => (8_000_000, 2),
    };
    (period, period / 2 + 2 * period / (cold + 1))
}

#[test]
fn a_change_of_curve_at_any_instant_decides_alike_on_both_stores() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(tollgate::redis::RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(5 * SEC);
    let conn = rt.block_on(connection(&server));
    let case = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config::with_cases(64));
    runner
        .run(
            &(0u8..3, prop::collection::vec(op(), 1..24)),
            |(start, ops)| {
                case.set(case.get() + 1);
                let t = Twins::new(&store, format!("renew{}", case.get()), &quotas(start));
                t.time.advance(100 * SEC);
                let mut curve = start;
                rt.block_on(async {
                    let mut server_clock = ServerClock::watch(&conn).await;
                    let outcome = async {
                        for op in ops {
                            match op {
                                Op::Send(cost) => {
                                    let r = t.redis.check_n(&0, cost).await;
                                    let m = t.memory.check_n(&0, cost);
                                    prop_assert!(!r.is_degraded());
                                    prop_assert_eq!(r, m, "cost {}", cost);
                                }
                                Op::Wait(us) => t.time.advance(Duration::from_micros(us)),
                                Op::Change(c) | Op::ChangeAtIdle(_, c) => {
                                    if let Op::ChangeAtIdle(d, _) = op {
                                        // The key's words in Redis (µs): the TAT and the deficit.
                                        let raw: Option<String> = redis::cmd("GET")
                                            .arg(t.redis.redis_key(&0))
                                            .query_async(&mut conn.clone())
                                            .await
                                            .unwrap();
                                        if let Some(raw) = raw {
                                            let w: Vec<u64> = raw
                                                .split(' ')
                                                .map(|w| w.parse().unwrap())
                                                .collect();
                                            let (period, max) = curve_numbers(curve);
                                            let cold = (w[1].min(max) * period).div_ceil(max);
                                            let idle = (w[0] + if w[1] == 0 { 0 } else { cold })
                                                .saturating_add_signed(i64::from(d));
                                            let now = t.time.now().as_micros() as u64;
                                            if idle > now {
                                                t.time.advance(Duration::from_micros(idle - now));
                                            }
                                        }
                                    }
                                    curve = c;
                                    t.set_quotas(&quotas(c));
                                }
                            }
                            server_clock.keep_all().await;
                        }
                        let r = t.redis.check_n(&0, 0).await;
                        prop_assert_eq!(r, t.memory.check_n(&0, 0));
                        Ok(())
                    }
                    .await;
                    server_clock.judge(outcome).await
                })
            },
        )
        .unwrap();
}
