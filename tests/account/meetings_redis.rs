#![cfg(feature = "redis")]
//! Where the account of a key, leases, the penalty box and the Redis key's life meet, on a
//! real redis-server: refunds and settlements of leased admissions, of keys whose state was
//! flushed or expired, and during a key error. Each case on the manual clock, with exact
//! numbers.
//!
//! Pins docs/design.md section 3 ("An account per key", "The penalty box punishes the client's own
//! traffic", "Redis").

use crate::common;

use std::time::Duration;

use common::account::rig::{failures, manual, Reply, Rig, FAILED, OK};
use common::redis_server::{connection, RedisServer, ServerClock};
use common::stores;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::Lease;
use tollgate::{Policy, Quota, RateLimitLayer};
use tower::Layer;

use crate::account_redis::{layer, store, Limit};

const S: Duration = Duration::from_secs(1);

// ---- leased admissions, then count_if refunds ----

/// GCRA 3 per 10 s (and a daily quota that keeps the key alive) on a store that leases hot
/// keys: three slow successes at 0 s, a failure at 5 s, failures at 10 s, then the late
/// successes answer, then more failures. The successes' slices have passed by 10 s: their
/// refunds give nothing back, leased or not, and 3 failures are counted in all.
#[tokio::test]
async fn late_refunds_of_leased_admissions_never_double_a_limit() {
    let server = RedisServer::start();
    for (i, lease) in [None, Some(Lease::new(50, Duration::from_secs(60)))]
        .into_iter()
        .enumerate()
    {
        let store = match lease {
            Some(l) => store(&server).await.lease(l),
            None => store(&server).await,
        };
        let (clock, time) = manual();
        let l = layer(
            &store,
            &format!("lease{i}"),
            &[
                Quota::new(3, 10 * S),
                Quota::per_day(100_000).burst(100_000),
            ],
            &clock,
        );
        let mut rig = Rig::new(|h| l.layer(h));
        let mut slow = Vec::new();
        for _ in 0..3 {
            slow.push(rig.send("login", 1).await.unwrap());
        }
        time.advance(5 * S);
        let mut counted = failures(&mut rig, "login", 1).await;
        time.advance(5 * S);
        counted += failures(&mut rig, "login", 3).await;
        for id in slow {
            assert_eq!(rig.answer(id, OK).await, 200);
        }
        counted += failures(&mut rig, "login", 3).await;
        assert_eq!(counted, 3, "lease {lease:?}");
    }
}

fn redis_name(l: &Limit, name: &str, k: &str) -> String {
    let limiter = l.limiter(name).unwrap().unwrap();
    let key: Box<[u8]> = k.as_bytes().into();
    String::from_utf8(limiter.redis_key(&key)).unwrap()
}

// ---- a key error during a refund or a settlement ----

/// The key's value turns into another type while requests are in flight: their refund and
/// their settlement meet `WRONGTYPE`. The handler's response stands (the error is about the
/// key, not the request's answer), and the key's next request is refused as unavailable.
#[tokio::test]
async fn a_key_error_during_a_refund_or_a_settlement_keeps_the_handlers_response() {
    let server = RedisServer::start();
    let store = store(&server).await;
    for (i, quota) in [Quota::new(3, 10 * S), Quota::sliding_log(3, 10 * S)]
        .into_iter()
        .enumerate()
    {
        let (clock, _time) = manual();
        let name = format!("keyerr{i}");
        let l = layer(&store, &name, std::slice::from_ref(&quota), &clock);
        let mut rig = Rig::new(|h| l.layer(h));
        let refunded = rig.send("k", 1).await.unwrap();
        let settled = rig.send("k", 1).await.unwrap();
        let redis_key = redis_name(&l, &name, "k");
        server.cli(&["DEL", &redis_key]).unwrap();
        server.cli(&["HSET", &redis_key, "f", "v"]).unwrap();
        assert_eq!(rig.answer(refunded, OK).await, 200, "{quota:?}");
        let charged = Reply {
            status: 401,
            actual: Some(3),
        };
        assert_eq!(rig.answer(settled, charged).await, 401, "{quota:?}");
        let key: Box<[u8]> = b"k".as_slice().into();
        let d = l.limiter(&name).unwrap().unwrap().peek(&key).await;
        assert!(!d.is_allowed() && d.is_degraded(), "{quota:?}");
        assert_eq!(server.cli(&["TYPE", &redis_key]).unwrap().trim(), "hash");
    }
}

// ---- refunds of a key whose Redis state was lost ----

/// GCRA 3 per 10 s: three slow successes in flight at 0 s; Redis loses the key (FLUSHALL, or
/// its expiry: a DEL); at 1 s the key starts afresh, and three failures pass; then the slow
/// successes answer: their reservations name slices of the lost state, and what of them is
/// still ahead of now (2.33 s + 3.33 s + 3.33 s) comes off the new state, so two more
/// failures pass. Five counted against a limit of 3: the loss is worth at most one burst,
/// never more.
#[tokio::test]
async fn refunds_after_redis_lost_the_key_give_back_at_most_one_burst() {
    let server = RedisServer::start();
    let store = store(&server).await;
    for (i, lose) in [["FLUSHALL", ""], ["DEL", "key"]].into_iter().enumerate() {
        let (clock, time) = manual();
        let name = format!("lost{i}");
        let l = layer(&store, &name, &[Quota::new(3, 10 * S)], &clock);
        let mut rig = Rig::new(|h| l.layer(h));
        let slow = [
            rig.send("login", 1).await.unwrap(),
            rig.send("login", 1).await.unwrap(),
            rig.send("login", 1).await.unwrap(),
        ];
        let redis_key = redis_name(&l, &name, "login");
        match lose {
            ["FLUSHALL", _] => server.cli(&["FLUSHALL"]).unwrap(),
            _ => server.cli(&["DEL", &redis_key]).unwrap(),
        };
        time.advance(S);
        let mut counted = failures(&mut rig, "login", 4).await;
        assert_eq!(counted, 3);
        for id in slow {
            assert_eq!(rig.answer(id, OK).await, 200);
        }
        counted += failures(&mut rig, "login", 4).await;
        assert_eq!(counted, 5, "{lose:?}");
    }
}

/// A sliding log written by an earlier layout (one member per unit, without costs) is
/// forgotten by the script; a refund that arrives for it finds nothing of its own and
/// takes nothing from the requests admitted since.
#[tokio::test]
async fn a_refund_meeting_a_log_of_an_older_layout_takes_nothing_from_later_requests() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = manual();
    let l = layer(&store, "old", &[Quota::sliding_log(3, 10 * S)], &clock);
    let mut rig = Rig::new(|h| l.layer(h));
    let slow = rig.send("login", 1).await.unwrap();
    let redis_key = redis_name(&l, "old", "login");
    server.cli(&["DEL", &redis_key]).unwrap();
    // The earlier layout: `<time>:<index>` members, times in microseconds.
    server
        .cli(&["ZADD", &redis_key, "1000000000", "1000000000:0"])
        .unwrap();
    time.advance(S);
    assert_eq!(failures(&mut rig, "login", 4).await, 3);
    assert_eq!(rig.answer(slow, OK).await, 200);
    assert_eq!(failures(&mut rig, "login", 1).await, 0);
}

// ---- memory and Redis side by side, with a penalty box ----

mod side_by_side {
    use super::*;
    use crate::meetings::told::{handler, seen as send};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use tollgate::penalty::PenaltyBox;

    #[derive(Debug, Clone)]
    enum Op {
        Request { cost: u32, actual: u32 },
        Wait { ms: u64 },
        Change { count: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u32..4, 0u32..9).prop_map(|(cost, actual)| Op::Request { cost, actual }),
            2 => (0u64..4_000).prop_map(|ms| Op::Wait { ms }),
            // Counts that divide 4 s into whole microseconds, as Redis counts time.
            1 => prop::sample::select(vec![2u32, 4, 5, 8]).prop_map(|count| Op::Change { count }),
        ]
    }

    fn quotas(kind: u8, count: u32) -> Vec<Quota> {
        match kind {
            0 => vec![Quota::new(count, 4 * S).burst(count)],
            1 => vec![Quota::fixed_window(count, 4 * S)],
            2 => vec![Quota::sliding_log(count, 4 * S)],
            3 => vec![Quota::sliding_window(count, 4 * S)],
            _ => vec![
                Quota::new(count, 4 * S).burst(count),
                Quota::sliding_log(count + 2, 10 * S),
            ],
        }
    }

    fn policy(name: &str, qs: Vec<Quota>) -> Policy {
        qs[1..]
            .iter()
            .fold(Policy::new(name.to_owned(), qs[0].clone()), |p, q| {
                p.quota(q.clone())
            })
    }

    /// A penalty box over every kind and a mixed policy, with settled debts and live
    /// changes (raised and lowered): the memory layer and the Redis layer answer every
    /// request alike (status, Retry-After, RateLimit fields), bans included.
    #[test]
    fn memory_and_redis_ban_and_tell_alike() {
        let server = RedisServer::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = rt.block_on(store(&server));
        let conn = rt.block_on(connection(&server));
        let mut runner = TestRunner::new(Config::with_cases(48));
        let case = std::cell::Cell::new(0u32);
        let strategy = (0u8..5, prop::collection::vec(op(), 1..40));
        runner
            .run(&strategy, |(kind, ops)| {
                case.set(case.get() + 1);
                let name = format!("side{}", case.get());
                rt.block_on(async {
                    // The quota and penalty keys' times to live run on the server's clock, the
                    // decisions on the manual one: every key persists after each step, and a
                    // case in which the server expired one before that is void.
                    let mut server_clock = ServerClock::watch(&conn).await;
                    let outcome = async {
                        let (clock, time) = manual();
                        let build = |qs: Vec<Quota>| {
                            RateLimitLayer::new(policy(&name, qs))
                                .key(Header::new("x-key"))
                                .clock(clock.clone())
                                .cost(stores::x_cost)
                                .settle(ActualCost::header("x-actual"))
                                .penalty_box(PenaltyBox::new(2, 6 * S, 2 * S))
                        };
                        let mem = build(quotas(kind, 4));
                        let red = build(quotas(kind, 4)).store(store.clone());
                        let mut m = mem.clone().layer(tower::service_fn(handler));
                        let mut r = red.clone().layer(tower::service_fn(handler));
                        for op in ops {
                            match op {
                                Op::Request { cost, actual } => {
                                    let a = send(&mut m, cost, actual).await;
                                    let b = send(&mut r, cost, actual).await;
                                    prop_assert_eq!(a, b, "cost {} actual {}", cost, actual);
                                }
                                Op::Wait { ms } => time.advance(Duration::from_millis(ms)),
                                Op::Change { count } => {
                                    let p = policy(&name, quotas(kind, count));
                                    mem.handle().unwrap().apply(&p).unwrap();
                                    red.handle().unwrap().apply(&p).unwrap();
                                }
                            }
                            server_clock.keep_all().await;
                        }
                        Ok(())
                    }
                    .await;
                    server_clock.judge(outcome).await
                })
            })
            .unwrap();
    }
}

// ---- leased admissions, refunds and settlements on random interleavings ----

#[derive(Debug, Clone)]
enum LeaseOp {
    Send(u32),
    /// Answer the request in flight at this index: OK (refunded), failed (counted), or
    /// failed settling this cost.
    Answer(usize, Option<Option<u32>>),
}

fn lease_op() -> impl proptest::strategy::Strategy<Value = LeaseOp> {
    use proptest::prelude::*;
    prop_oneof![
        5 => (1u32..4).prop_map(LeaseOp::Send),
        4 => (0usize..8, prop::option::of(prop::option::of(0u32..9)))
            .prop_map(|(i, r)| LeaseOp::Answer(i, r)),
    ]
}

/// On a stopped clock every slice is still ahead: whatever the batches, the order in which
/// leased requests are answered, refunds and settlements (debts included), once the leases
/// are returned Redis holds exactly what was counted, 500 ms per unit; and the counted units
/// admitted never pass the burst except by settled debts.
#[test]
fn leased_refunds_and_settlements_leave_exactly_what_was_counted() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt
        .block_on(store(&server))
        .lease(Lease::new(4, Duration::from_secs(60)));
    let mut runner = TestRunner::new(Config::with_cases(64));
    let case = std::cell::Cell::new(0u32);
    let leased = std::cell::Cell::new(0u64);
    let strategy = prop::collection::vec(lease_op(), 1..60);
    runner
        .run(&strategy, |ops| {
            case.set(case.get() + 1);
            let name = format!("leased{}", case.get());
            rt.block_on(async {
                let (clock, _time) = manual();
                // 2 per second, burst 6: 500 ms per unit.
                let l = layer(&store, &name, &[Quota::per_second(2).burst(6)], &clock);
                let lim = l.limiter(&name).unwrap().unwrap();
                let mut rig = Rig::new(|h| l.layer(h));
                let mut flying: Vec<(u64, u32)> = Vec::new();
                // Units held by requests in flight, units counted for good, and what the
                // answered requests kept of their reservations (without settled charges).
                let (mut held, mut counted, mut kept) = (0u64, 0u64, 0u64);
                // Whether a settlement put the key in debt (it stands on a stopped clock).
                let mut debt = false;
                for op in ops {
                    match op {
                        LeaseOp::Send(cost) => {
                            if let Some(id) = rig.send("k", cost).await {
                                // A debt stands: nothing is admitted after it, leased or not.
                                prop_assert!(!debt, "admitted in debt");
                                flying.push((id, cost));
                                held += u64::from(cost);
                                prop_assert!(held + kept <= 6, "held {} kept {}", held, kept);
                            }
                        }
                        LeaseOp::Answer(i, reply) => {
                            if flying.is_empty() {
                                continue;
                            }
                            let (id, cost) = flying.remove(i % flying.len());
                            held -= u64::from(cost);
                            let (reply, units) = match reply {
                                None => (OK, 0),
                                Some(None) => (FAILED, cost),
                                Some(Some(n)) => (
                                    Reply {
                                        status: 401,
                                        actual: Some(n),
                                    },
                                    n,
                                ),
                            };
                            counted += u64::from(units);
                            kept += u64::from(units.min(cost));
                            debt |= counted > 6;
                            rig.answer(id, reply).await;
                        }
                    }
                }
                for (id, _) in std::mem::take(&mut flying) {
                    rig.answer(id, OK).await;
                }
                leased.set(leased.get() + lim.leased());
                lim.return_leases().await;
                let key: Box<[u8]> = b"k".as_slice().into();
                let d = lim.peek(&key).await;
                prop_assert_eq!(
                    d.states()[0].reset_after(),
                    Duration::from_millis(500 * counted)
                );
                Ok(())
            })
        })
        .unwrap();
    assert!(leased.get() > 0);
}

/// A leased key settled into debt: the units this instance still holds of it are not
/// handed out past the debt (a debt stands, leased or not), and go back to Redis.
#[tokio::test]
async fn a_debt_settled_on_a_leased_key_stops_the_lease() {
    let server = RedisServer::start();
    let store = store(&server)
        .await
        .lease(Lease::new(8, Duration::from_secs(60)));
    let (clock, _time) = manual();
    let l = layer(&store, "debt", &[Quota::per_second(2).burst(6)], &clock);
    let lim = l.limiter("debt").unwrap().unwrap();
    let mut rig = Rig::new(|h| l.layer(h));
    // Batches of 1, 2 and 4 units: four requests admitted, three units held.
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(rig.send("k", 1).await.unwrap());
    }
    assert!(lim.leased() > 0);
    // One settles at 6: 5 more than it reserved, over the burst.
    let first = ids.remove(0);
    rig.answer(
        first,
        Reply {
            status: 401,
            actual: Some(6),
        },
    )
    .await;
    assert_eq!(rig.send("k", 1).await, None);
    for id in ids {
        rig.answer(id, OK).await;
    }
    lim.return_leases().await;
    // Redis holds exactly the 6 units counted: 3 s.
    let key: Box<[u8]> = b"k".as_slice().into();
    assert_eq!(lim.peek(&key).await.states()[0].reset_after(), 3 * S);
}

/// GCRA 3 per 4 s with a penalty box (2 strikes in 6 s ban 2 s, doubling): a charge of 7
/// (9.33 s ahead), then refusals: a first ban at 0 s (2 s, told 5.33 s), a second at 2 s
/// (4 s, until 6 s, told 6.67 s for its cost of 1). At 6 s the ban is over and a peek (cost
/// 0, 3.33 s ahead, within the 4 s tolerance) is admitted, in memory and on Redis alike: the
/// instance's cache of bans answers until the ban ends, not until the retry it told.
#[tokio::test]
async fn a_cached_ban_ends_with_the_ban_not_with_the_retry_it_told() {
    use http::Request;
    use tollgate::penalty::PenaltyBox;
    use tower::ServiceExt;
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, time) = manual();
    let build = || {
        RateLimitLayer::new(Policy::new("cached", Quota::new(3, 4 * S).burst(3)))
            .key(Header::new("x-key"))
            .clock(clock.clone())
            .cost(stores::x_cost)
            .settle(ActualCost::header("x-actual"))
            .penalty_box(PenaltyBox::new(2, 6 * S, 2 * S))
    };
    let handler = tower::service_fn(|r: Request<()>| async move {
        let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::new()));
        resp.headers_mut()
            .insert("x-actual", r.headers()["x-actual"].clone());
        Ok::<_, std::convert::Infallible>(resp)
    });
    let mem = build().layer(handler);
    let red = build().store(store).layer(handler);
    let both = |cost: u32, actual: u32| {
        let req = move || {
            Request::get("/")
                .header("x-key", "k")
                .header("x-cost", cost.to_string())
                .header("x-actual", actual.to_string())
                .body(())
                .unwrap()
        };
        let (m, r) = (mem.clone(), red.clone());
        async move {
            let a = m.oneshot(req()).await.unwrap();
            let b = r.oneshot(req()).await.unwrap();
            let retry = |x: &http::Response<_>| {
                x.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            assert_eq!(
                (a.status(), retry(&a)),
                (b.status(), retry(&b)),
                "cost {cost} actual {actual}"
            );
            (a.status().as_u16(), retry(&a))
        }
    };
    assert_eq!(both(0, 7).await, (200, None));
    assert_eq!(both(0, 0).await, (429, Some("6".into())));
    assert_eq!(both(0, 0).await, (429, Some("6".into())));
    time.advance(2 * S);
    assert_eq!(both(0, 0).await, (429, Some("4".into())));
    assert_eq!(both(1, 0).await, (429, Some("5".into())));
    time.advance(3_232 * Duration::from_millis(1));
    assert_eq!(both(0, 0).await, (429, Some("2".into())));
    time.advance(768 * Duration::from_millis(1));
    assert_eq!(both(0, 0).await, (200, None));
}
