//! A key's account (docs/design.md section 3, "An account per key" and "A live quota
//! change"): refunds and settlements give back what their own request took and only what
//! still counts; quota changes judge the stored state and never rewrite it.
//!
//! The first cases and the property test run over both stores (`tests/common/stores.rs`): the
//! same body through the HTTP layer (whose responses refund and settle) on memory and on a
//! real redis-server, against the reference model in `tests/common/account.rs`. The cases
//! after them drive the memory limiter directly; `account_redis.rs` has what only Redis has.
//! Every case on the manual clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::account::rig::{failures, manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};
use crate::common::stores::{Memory, Store};
use proptest::prelude::*;
use tollgate::{Clock, Outcome, Policy, Quota, RateLimiter};
use tower::Layer;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

crate::over_both_stores!(
    late_refunds_of_a_passed_window_never_double_a_limit_of_any_kind,
    a_log_refund_removes_its_own_entry_not_the_newest,
    a_refund_gives_back_what_it_took_not_todays_interval,
    a_settled_debt_stands_when_the_burst_is_lowered,
);

// ---- 1. late refunds ----

async fn late_refunds_of_a_passed_window_never_double_a_limit_of_any_kind(s: &impl Store) {
    for (i, quota) in [
        Quota::fixed_window(3, 10 * S),
        Quota::sliding_log(3, 10 * S),
        Quota::sliding_window(3, 10 * S),
        Quota::new(3, 10 * S),
    ]
    .into_iter()
    .enumerate()
    {
        let (clock, time) = manual();
        let l = s.layer(std::slice::from_ref(&quota), &format!("late{i}"), &clock);
        let mut rig = Rig::new(|h| l.layer(h));
        // Three slow successful logins at 0 s, held while failures come.
        let mut slow = Vec::new();
        for _ in 0..3 {
            slow.push(rig.send("login", 1).await.unwrap());
        }
        // A failure at 5 s (GCRA has earned one back by then; no window has).
        time.advance(5 * S);
        let mut counted = failures(&mut rig, "login", 1).await;
        // At 10 s their window has passed: failures, then the late successes answer.
        time.advance(5 * S);
        counted += failures(&mut rig, "login", 3).await;
        for id in slow {
            assert_eq!(rig.answer(id, OK).await, 200);
        }
        counted += failures(&mut rig, "login", 3).await;
        assert_eq!(counted, 3, "{quota:?}");
    }
}

// ---- 2. a log refund removes its own entry ----

async fn a_log_refund_removes_its_own_entry_not_the_newest(s: &impl Store) {
    let (clock, time) = manual();
    let l = s.layer(&[Quota::sliding_log(2, 10 * S)], "own", &clock);
    let mut rig = Rig::new(|h| l.layer(h));
    let slow = rig.send("login", 1).await.unwrap();
    time.advance(5 * S);
    assert_eq!(failures(&mut rig, "login", 1).await, 1);
    time.advance(S);
    rig.answer(slow, OK).await;
    assert_eq!(failures(&mut rig, "login", 1).await, 1);
    // The failures of 5 s and 6 s fill the window until 15 s.
    time.advance(4 * S);
    assert_eq!(failures(&mut rig, "login", 1).await, 0);
    let d = s.peek(&s.limiter(&l, "own"), "login").await;
    assert_eq!(d.reset_after(), 6 * S);
}

// ---- 3. a refund is sized by the quota of its admission ----

async fn a_refund_gives_back_what_it_took_not_todays_interval(s: &impl Store) {
    let (clock, _time) = manual();
    let l = s.layer(&[Quota::per_minute(60)], "sized", &clock);
    let mut rig = Rig::new(|h| l.layer(h));
    assert_eq!(failures(&mut rig, "login", 50).await, 50);
    let mut in_flight = Vec::new();
    for _ in 0..10 {
        in_flight.push(rig.send("login", 1).await.unwrap());
    }
    s.apply(&l, Policy::new("sized", Quota::per_minute(5)));
    for id in in_flight {
        rig.answer(id, OK).await;
    }
    // Each success gave back its own second: the 50 failures stand, 50 s ahead, and the
    // next fits the new tolerance (60 s) 2 s from now.
    assert_eq!(failures(&mut rig, "login", 5).await, 0);
    let d = s.check(&s.limiter(&l, "sized"), "login").await;
    assert_eq!(d.retry_after(), Some(2 * S));
}

// ---- 4. a debt stands through a change ----

async fn a_settled_debt_stands_when_the_burst_is_lowered(s: &impl Store) {
    let (clock, _time) = manual();
    let l = s.layer(&[Quota::per_minute(100)], "debt", &clock);
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("api", 1).await.unwrap();
    rig.answer(id, settles(250)).await;
    // 250 tokens at 600 ms: 150 s ahead.
    s.apply(&l, Policy::new("debt", Quota::per_minute(100).burst(50)));
    let d = s.check(&s.limiter(&l, "debt"), "api").await;
    assert_eq!(d.reset_after(), 150 * S);
    // The next one fits the new tolerance (30 s) once 150.6 s - 30 s have passed.
    assert_eq!(d.retry_after(), Some(120_600 * MS));
}

// ---- 5. no free burst from a change ----

#[test]
fn flipping_the_burst_down_and_up_admits_nothing_more() {
    let (clock, _time) = manual();
    let l = RateLimiter::<u8>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    let mut admitted = 0;
    for burst in [10, 5, 10, 5, 10] {
        l.set_quotas([Quota::per_second(10).burst(burst)]).unwrap();
        while l.check(&1).is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
}

#[test]
fn fifty_threads_on_one_key_while_the_burst_flips_admit_at_most_the_larger_burst() {
    let (clock, _time) = manual();
    let l = RateLimiter::<u8>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    let admitted = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let (l, admitted, done) = (l.clone(), admitted.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    if l.check(&1).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    for i in 0..200 {
        let burst = if i % 2 == 0 { 5 } else { 10 };
        l.set_quotas([Quota::per_second(10).burst(burst)]).unwrap();
        std::thread::yield_now();
    }
    done.store(true, Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    assert!(admitted.load(Ordering::Relaxed) <= 10);
}

// ---- 6. windows changed in the right window; eviction changes nothing ----

#[test]
fn a_new_fixed_window_period_applies_from_the_keys_next_window() {
    let (clock, time) = manual();
    let l = RateLimiter::<u8>::builder(Quota::fixed_window(1, Duration::from_secs(3_600)))
        .clock(clock.clone())
        .build();
    assert!(l.check(&1).is_allowed());
    l.set_quotas([Quota::fixed_window(1, S)]).unwrap();
    assert_eq!(l.check(&1).retry_after(), Some(Duration::from_secs(3_600)));

    let l = RateLimiter::<u8>::builder(Quota::fixed_window(1, S))
        .clock(clock)
        .build();
    assert!(l.check(&1).is_allowed());
    l.set_quotas([Quota::fixed_window(1, Duration::from_secs(3_600))])
        .unwrap();
    assert_eq!(l.check(&1).retry_after(), Some(S));
    time.advance(S);
    assert!(l.check(&1).is_allowed());
    assert_eq!(l.check(&1).retry_after(), Some(Duration::from_secs(3_600)));
}

#[test]
fn evicting_idle_keys_after_a_sliding_window_is_widened_changes_no_decision() {
    for (narrow, wide) in [
        (Quota::sliding_log(1, S), Quota::sliding_log(1, 10 * S)),
        (
            Quota::sliding_window(1, S),
            Quota::sliding_window(1, 10 * S),
        ),
    ] {
        let (clock, time) = manual();
        let build = || {
            RateLimiter::<u8>::builder(narrow.clone())
                .clock(clock.clone())
                .build()
        };
        let (swept, kept) = (build(), build());
        for l in [&swept, &kept] {
            assert!(l.check(&1).is_allowed());
            l.set_quotas([wide.clone()]).unwrap();
        }
        time.advance(2 * S);
        swept.evict_idle();
        for _ in 0..3 {
            let (a, b) = (swept.check(&1), kept.check(&1));
            assert_eq!(a, b, "{narrow:?}");
            assert_eq!(a.outcome(), Outcome::Limited);
            time.advance(3 * S);
            swept.evict_idle();
        }
    }
}

#[test]
fn what_left_a_narrowed_window_stays_gone_when_it_is_widened_again() {
    for (wide, narrow) in [
        (Quota::sliding_log(1, 10 * S), Quota::sliding_log(1, S)),
        (
            Quota::sliding_window(1, 10 * S),
            Quota::sliding_window(1, S),
        ),
    ] {
        let (clock, time) = manual();
        let build = || {
            RateLimiter::<u8>::builder(wide.clone())
                .clock(clock.clone())
                .build()
        };
        let (swept, kept) = (build(), build());
        for l in [&swept, &kept] {
            assert!(l.check(&1).is_allowed());
            l.set_quotas([narrow.clone()]).unwrap();
        }
        // Gone from the narrow window at 3 s (and, once a decision has seen it so, from the
        // table of one of them).
        time.advance(3 * S);
        assert!(swept.peek(&1).is_allowed());
        assert_eq!(swept.evict_idle(), 0);
        for l in [&swept, &kept] {
            l.set_quotas([wide.clone()]).unwrap();
        }
        let (a, b) = (swept.check(&1), kept.check(&1));
        assert_eq!(a, b, "{wide:?}");
        assert!(a.is_allowed());
    }
}

// ---- 7. peeks, warm-up, the clock's end ----

#[test]
fn a_peek_after_a_lowered_burst_reports_the_time_spent() {
    let (clock, _time) = manual();
    let l = RateLimiter::<u8>::builder(Quota::per_second(10))
        .clock(clock)
        .build();
    while l.check(&1).is_allowed() {}
    l.set_quotas([Quota::per_second(10).burst(5)]).unwrap();
    let d = l.peek(&1);
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.retry_after(), Some(500 * MS));
    assert_eq!(d.remaining(), 0);
}

#[test]
fn warm_up_with_cold_factor_one_decides_as_plain_gcra_through_a_change() {
    let (clock, time) = manual();
    let plain = RateLimiter::<u8>::builder(Quota::per_second(10))
        .clock(clock.clone())
        .build();
    let warm = RateLimiter::<u8>::builder(Quota::per_second(10).warm_up(10 * S, 1))
        .clock(clock)
        .build();
    // Both spent (1 s ahead), then the burst lowered to 2: the same 900 ms wait.
    for _ in 0..10 {
        assert!(plain.check(&1).is_allowed() && warm.check(&1).is_allowed());
    }
    plain.set_quotas([Quota::per_second(10).burst(2)]).unwrap();
    warm.set_quotas([Quota::per_second(10).burst(2).warm_up(10 * S, 1)])
        .unwrap();
    assert_eq!(plain.check(&1).retry_after(), Some(900 * MS));
    assert_eq!(warm.check(&1).retry_after(), Some(900 * MS));
    for step in 0..40u32 {
        if step == 12 {
            plain.set_quotas([Quota::per_second(10)]).unwrap();
            warm.set_quotas([Quota::per_second(10).warm_up(10 * S, 1)])
                .unwrap();
        }
        let (a, b) = (plain.check(&1), warm.check(&1));
        assert_eq!(a.outcome(), b.outcome(), "step {step}");
        assert_eq!(a.retry_after(), b.retry_after(), "step {step}");
        assert_eq!(a.reset_after(), b.reset_after(), "step {step}");
        time.advance(Duration::from_millis(u64::from(step % 7) * 37));
    }
}

#[test]
fn a_fixed_window_at_the_clocks_last_nanosecond_admits_nothing_as_gcra() {
    let (clock, time) = Clock::manual();
    time.set(Duration::from_nanos(u64::MAX - 10));
    for q in [Quota::fixed_window(3, S), Quota::per_second(3)] {
        let l = RateLimiter::<u8>::builder(q.clone())
            .clock(clock.clone())
            .build();
        assert_eq!(l.check(&1).outcome(), Outcome::Limited, "{q:?}");
    }
}

// ---- the model, against the HTTP layer on both stores ----

/// Positions: GCRA, fixed window, sliding log, sliding counter; two settings each.
fn kinds(variant: [bool; 4]) -> Vec<Kind> {
    const MS: u64 = 1_000_000;
    vec![
        if variant[0] {
            Kind::Gcra {
                interval: 200 * MS,
                burst: 5,
            }
        } else {
            Kind::Gcra {
                interval: 500 * MS,
                burst: 3,
            }
        },
        if variant[1] {
            Kind::Fixed {
                limit: 6,
                width: 2_000 * MS,
            }
        } else {
            Kind::Fixed {
                limit: 4,
                width: 700 * MS,
            }
        },
        if variant[2] {
            Kind::Log {
                limit: 5,
                width: 1_500 * MS,
            }
        } else {
            Kind::Log {
                limit: 7,
                width: 3_000 * MS,
            }
        },
        if variant[3] {
            Kind::Counter {
                limit: 6,
                width: 1_000 * MS,
            }
        } else {
            Kind::Counter {
                limit: 4,
                width: 2_500 * MS,
            }
        },
    ]
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// A request of this cost (held in flight when admitted).
    Send(u32),
    /// The `i`-th request in flight answers: refunded (200), kept (401) or settled at a cost.
    Answer(usize, Option<Option<u32>>),
    Wait(u64),
    /// New settings for the positions set.
    Change([bool; 4]),
    Evict,
    Peek,
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u32..4).prop_map(Op::Send),
        4 => (0usize..8, prop::option::of(prop::option::of(0u32..9)))
            .prop_map(|(i, r)| Op::Answer(i, r)),
        3 => (0u64..1_200).prop_map(Op::Wait),
        1 => any::<[bool; 4]>().prop_map(Op::Change),
        1 => Just(Op::Evict),
        1 => Just(Op::Peek),
    ]
}

fn remaining(d: &tollgate::Decision) -> Vec<u64> {
    d.states().iter().map(|s| s.remaining()).collect()
}

/// Admissions, late refunds, settlements above and below the cost, live changes and
/// eviction, in the order of `ops`, on the HTTP layer of `s`: it decides as the model, and
/// reports the same remaining per quota, at every step.
pub(crate) async fn the_layer_keeps_the_account_of_the_model(
    s: &impl Store,
    name: &str,
    start: [bool; 4],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quotas: Vec<Quota> = kinds(start).iter().map(Kind::quota).collect();
    let l = s.layer(&quotas, name, &clock);
    let lim = s.limiter(&l, name);
    let mut rig = Rig::new(|h| l.layer(h));
    let mut model = Account::new(kinds(start));
    // The model's time is the clock's (1 000 s and 1 ns at the start): as everywhere in the
    // crate, 0 is "never", never a time a request is seen at.
    let mut now = 1_000_000_000_001u64;
    let mut taken = Vec::new();
    for op in ops {
        match op {
            Op::Send(cost) => {
                let (said, t) = model.admit(now, cost);
                let got = rig.send("k", cost).await;
                prop_assert_eq!(got.is_some(), said.allowed, "send {}", cost);
                if let Some(id) = got {
                    taken.push((id, t.unwrap_or(Taken::nothing())));
                }
            }
            Op::Answer(i, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (id, t) = taken.remove(i % taken.len());
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
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * 1_000_000;
            }
            Op::Change(v) => {
                let new: Vec<Quota> = kinds(v).iter().map(Kind::quota).collect();
                s.set_quotas(&lim, new);
                model.set_quotas(now, kinds(v));
            }
            Op::Evict => s.evict_idle(&lim),
            Op::Peek => {}
        }
        s.keep(&lim, "k").await;
        let d = s.peek(&lim, "k").await;
        let said = model.peek(now);
        prop_assert_eq!(remaining(&d), said.remaining);
        prop_assert_eq!(d.is_allowed(), said.allowed);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(Memory::CASES))]

    /// The model's property on the memory store.
    #[test]
    fn the_memory_layer_keeps_the_account_of_the_model(
        start in any::<[bool; 4]>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(the_layer_keeps_the_account_of_the_model(&Memory, "p", start, ops))?;
    }
}

/// The model's property on a real redis-server: one server for every case, a policy name
/// of its own per case.
#[cfg(feature = "redis")]
#[test]
fn the_redis_layer_keeps_the_account_of_the_model() {
    use crate::common::stores::OnRedis;
    use proptest::test_runner::{Config, TestRunner};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(OnRedis::start());
    let mut runner = TestRunner::new(Config::with_cases(OnRedis::CASES));
    let case = std::cell::Cell::new(0u32);
    let strategy = (any::<[bool; 4]>(), prop::collection::vec(op(), 1..60));
    runner
        .run(&strategy, |(start, ops)| {
            case.set(case.get() + 1);
            let name = format!("model{}", case.get());
            rt.block_on(async {
                let outcome = the_layer_keeps_the_account_of_the_model(&redis, &name, start, ops);
                redis.judge(outcome.await).await
            })
        })
        .unwrap();
}

#[test]
fn a_warm_up_quotas_reset_is_the_time_until_its_backlog_is_clear() {
    // Guava's example: 2 per second, burst 1, warming up over 3 s with a cold factor 3.
    let (clock, time) = manual();
    let quota = Quota::per_second(2).burst(1).warm_up(3 * S, 3);
    let l = RateLimiter::<u8>::builder(quota).clock(clock).build();
    // From cold, the first request costs 1.333 s: the backlog clears then, and the next
    // request is admitted exactly then.
    let d = l.check(&1);
    assert!(d.is_allowed());
    assert_eq!(d.reset_after(), Duration::from_micros(1_333_334));
    time.advance(Duration::from_micros(1_333_333));
    assert!(!l.check(&1).is_allowed());
    time.advance(Duration::from_micros(1));
    assert!(l.check(&1).is_allowed());
}
