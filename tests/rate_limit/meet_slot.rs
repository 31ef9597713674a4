//! The small slots where they meet the rest: a policy of one fixed window, sliding counter,
//! sliding log, warm-up or GCRA quota (kept in a slot of one or two words), and the single
//! slot of a limit without keys (`RateLimiter<()>`, a layer without `.key`), against a key of
//! a table and the reference model (tests/common/account.rs): through live changes of count
//! and window, refunds and settlements that arrive after a change, eviction, peeks, costs up
//! to `u32::MAX`, and a clock near its start and near its end.
//!
//! Pins docs/design.md section 1 ("Other kinds") and section 3 ("An account per key", "A
//! live quota change", "Keyed state").

use std::time::Duration;

use proptest::prelude::*;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{Clock, Decision, Policy, Quota, RateLimitLayer, RateLimiter};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};

const MS: u64 = 1_000_000;

/// One quota of `kind` (0 GCRA, 1 fixed window, 2 sliding log, 3 sliding counter) in one of
/// two settings.
fn one(kind: u8, variant: bool) -> Kind {
    match (kind, variant) {
        (0, true) => Kind::Gcra {
            interval: 200 * MS,
            burst: 5,
        },
        (0, false) => Kind::Gcra {
            interval: 500 * MS,
            burst: 3,
        },
        (1, true) => Kind::Fixed {
            limit: 6,
            width: 2_000 * MS,
        },
        (1, false) => Kind::Fixed {
            limit: 4,
            width: 700 * MS,
        },
        (2, true) => Kind::Log {
            limit: 5,
            width: 1_500 * MS,
        },
        (2, false) => Kind::Log {
            limit: 7,
            width: 3_000 * MS,
        },
        (3, true) => Kind::Counter {
            limit: 6,
            width: 1_000 * MS,
        },
        _ => Kind::Counter {
            limit: 4,
            width: 2_500 * MS,
        },
    }
}

/// The policy of `kinds`, each in its setting of `variant`.
fn kinds(kinds: &[u8], variant: &[bool; 2]) -> Vec<Kind> {
    kinds
        .iter()
        .zip(variant)
        .map(|(&k, &v)| one(k, v))
        .collect()
}

fn cost_of(h: &tollgate::key::RequestHead<'_>) -> u32 {
    h.headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

fn policy(quotas: &[Quota]) -> Policy {
    quotas[1..]
        .iter()
        .fold(Policy::new("p", quotas[0].clone()), |p, q| {
            p.quota(q.clone())
        })
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost (held in flight when admitted).
    Send(u32),
    /// The `i`-th request in flight answers: refunded (200), kept (401) or settled at a cost.
    Answer(usize, Option<Option<u32>>),
    Wait(u64),
    /// New settings for the quotas (same kinds).
    Change([bool; 2]),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => prop_oneof![9 => 0u32..4, 1 => Just(u32::MAX)].prop_map(Op::Send),
        4 => (
            0usize..8,
            prop::option::of(prop::option::of(prop_oneof![9 => 0u32..9, 1 => Just(u32::MAX)]))
        )
            .prop_map(|(i, r)| Op::Answer(i, r)),
        3 => (0u64..1_200).prop_map(Op::Wait),
        1 => any::<[bool; 2]>().prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

fn remaining(d: &Decision) -> Vec<u64> {
    d.states().iter().map(|s| s.remaining()).collect()
}

/// The same history on a layer without keys (one slot), on a keyed layer (a key of a table)
/// and on the model: the same admissions and the same remaining per quota at every step, and
/// the two limiters track and forget the key alike.
async fn the_single_slot_keeps_the_account_of_the_model(
    shape: &[u8],
    start: [bool; 2],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let quotas: Vec<Quota> = kinds(shape, &start).iter().map(Kind::quota).collect();
    let base = || {
        RateLimitLayer::new(policy(&quotas))
            .clock(clock.clone())
            .cost(cost_of)
            .count_if(|res| res.status != http::StatusCode::OK)
            .settle(ActualCost::of)
    };
    let global = base();
    let keyed = base().key(Header::new("x-key"));
    let (one, table) = (
        global.limiter("p").unwrap().unwrap(),
        keyed.limiter("p").unwrap().unwrap(),
    );
    let mut a = Rig::new(|h| global.layer(h));
    let mut b = Rig::new(|h| keyed.layer(h));
    let mut model = Account::new(kinds(shape, &start));
    let mut now = 1_000_000_000_001u64;
    let mut taken = Vec::new();
    let key: Box<[u8]> = b"k"[..].into();
    for op in ops {
        match op {
            Op::Send(cost) => {
                let (said, t) = model.admit(now, cost);
                let (x, y) = (a.send("k", cost).await, b.send("k", cost).await);
                prop_assert_eq!(x.is_some(), said.allowed, "send {}", cost);
                prop_assert_eq!(y.is_some(), said.allowed, "send {}", cost);
                if let (Some(x), Some(y)) = (x, y) {
                    taken.push((x, y, t.unwrap_or(Taken::nothing())));
                }
            }
            Op::Answer(i, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (x, y, t) = taken.remove(i % taken.len());
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
                a.answer(x, reply).await;
                b.answer(y, reply).await;
            }
            Op::Wait(ms) => {
                time.advance(Duration::from_millis(ms));
                now += ms * 1_000_000;
            }
            Op::Change(v) => {
                let new: Vec<Quota> = kinds(shape, &v).iter().map(Kind::quota).collect();
                one.set_quotas(new.clone()).unwrap();
                table.set_quotas(new).unwrap();
                model.set_quotas(now, kinds(shape, &v));
            }
            Op::Evict => {
                // As in the test below: never fewer than a table after sweeping.
                let (x, y) = (one.evict_idle(), table.evict_idle());
                prop_assert!(
                    y <= x && x <= 1,
                    "evict_idle: {} for the slot, {} for the table",
                    x,
                    y
                );
                prop_assert_eq!(one.len(), x);
            }
        }
        let (d, e) = (one.peek(&()), table.peek(&key));
        let said = model.peek(now);
        prop_assert_eq!(remaining(&d), said.remaining.clone());
        prop_assert_eq!(remaining(&e), said.remaining);
        prop_assert_eq!(d.is_allowed(), said.allowed);
        prop_assert_eq!(d, e);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Each kind alone (the slot of one or two words; the log's general state), and a fixed
    /// window beside a counter (the general state).
    #[test]
    fn a_single_slot_of_each_small_shape_keeps_the_account_of_the_model(
        shape in prop_oneof![
            Just(vec![0u8]), Just(vec![1u8]), Just(vec![2u8]), Just(vec![3u8]),
            Just(vec![1u8, 3u8]),
        ],
        start in any::<[bool; 2]>(),
        ops in prop::collection::vec(op(), 1..50),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(the_single_slot_keeps_the_account_of_the_model(&shape, start, ops))?;
    }
}

/// The policy of test `kind`: one quota of a kind that one or two words hold, or (5) two
/// GCRA quotas, or (6) a sliding log beside a warm-up quota, in two settings.
fn small(kind: u8, variant: bool) -> Vec<Quota> {
    match kind {
        5 => vec![
            small_one(0, variant)[0].clone(),
            Quota::per_minute(if variant { 20 } else { 9 }),
        ],
        6 => vec![
            small_one(3, variant)[0].clone(),
            small_one(4, !variant)[0].clone(),
        ],
        k => small_one(k, variant),
    }
}

fn small_one(kind: u8, variant: bool) -> Vec<Quota> {
    vec![small_quota(kind, variant)]
}

/// A quota of each kind that one or two words hold, in two settings.
fn small_quota(kind: u8, variant: bool) -> Quota {
    let s = Duration::from_secs(1);
    match (kind, variant) {
        (0, v) => Quota::per_second(if v { 5 } else { 2 }).burst(if v { 3 } else { 4 }),
        (1, v) => Quota::fixed_window(if v { 3 } else { 5 }, if v { s } else { 3 * s }),
        (2, v) => Quota::sliding_window(if v { 3 } else { 5 }, if v { 2 * s } else { s }),
        (3, v) => Quota::sliding_log(if v { 3 } else { 4 }, if v { s } else { 2 * s }),
        // Two curves: rate, period and cold factor all change.
        (_, v) => Quota::per_second(if v { 4 } else { 2 })
            .burst(if v { 4 } else { 2 })
            .warm_up(if v { 4 * s } else { 2 * s }, if v { 3 } else { 2 }),
    }
}

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync>(
    quotas: &[Quota],
    clock: &Clock,
) -> RateLimiter<K> {
    quotas[1..]
        .iter()
        .fold(RateLimiter::builder(quotas[0].clone()), |b, q| {
            b.quota(q.clone())
        })
        .clock(clock.clone())
        .build()
}

#[derive(Debug, Clone)]
enum Step {
    Check(u32),
    Wait(u64),
    Change(bool),
    Evict,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => prop_oneof![9 => 0u32..4, 1 => Just(u32::MAX)].prop_map(Step::Check),
        3 => (0u64..2_500).prop_map(Step::Wait),
        1 => any::<bool>().prop_map(Step::Change),
        1 => Just(Step::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The single slot of `RateLimiter<()>` and a key of a table decide alike, warm-up
    /// included, through live changes and eviction, with the clock at its first nanoseconds
    /// or its last hours, and say alike how many keys they track.
    #[test]
    fn the_single_slot_and_a_key_of_a_table_agree_from_the_clocks_start_to_its_end(
        kind in 0u8..7,
        start in any::<bool>(),
        at in 0u8..3,
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let (clock, time) = Clock::manual();
        match at {
            // The clock's first instant: 0, the time a key never seen stores.
            0 => time.set(Duration::ZERO),
            1 => {}
            _ => time.set(Duration::from_nanos(u64::MAX - 3_600_000_000_000)),
        }
        let direct: RateLimiter<()> = limiter(&small(kind, start), &clock);
        let keyed: RateLimiter<u8> = limiter(&small(kind, start), &clock);
        for s in &steps {
            match *s {
                Step::Check(cost) => {
                    prop_assert_eq!(direct.check_n(&(), cost), keyed.check_n(&7, cost));
                }
                Step::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Step::Change(v) => {
                    direct.set_quotas(small(kind, v)).unwrap();
                    keyed.set_quotas(small(kind, v)).unwrap();
                }
                Step::Evict => {
                    // The slot never forgets a key whose entry a table still holds after
                    // sweeping. It may hold one the table swept before a change that lags
                    // its sweeps (a table sweeps a shard when it is due, not when the key
                    // goes idle): a key idle then is idle under any later quotas.
                    let (a, b) = (direct.evict_idle(), keyed.evict_idle());
                    prop_assert!(b <= a && a <= 1, "evict_idle: {} for the slot, {} for the table", a, b);
                    prop_assert_eq!(direct.len(), a);
                }
            }
            prop_assert_eq!(direct.peek(&()), keyed.peek(&7));
        }
    }
}

/// A change of kind, or of the number of quotas, would leave the slot's shape: refused on
/// either path, and the slot decides on as before.
#[test]
fn a_change_of_kind_or_of_the_number_of_quotas_is_refused_and_the_slot_decides_on() {
    let s = Duration::from_secs(1);
    let (clock, _time) = Clock::manual();
    let direct = RateLimiter::<()>::builder(Quota::fixed_window(2, s))
        .clock(clock.clone())
        .build();
    let keyed = RateLimiter::<u8>::builder(Quota::fixed_window(2, s))
        .clock(clock)
        .build();
    assert!(direct.check(&()).is_allowed());
    assert!(keyed.check(&7).is_allowed());
    for change in [
        vec![Quota::sliding_window(2, s)],
        vec![Quota::sliding_log(2, s)],
        vec![Quota::per_second(2)],
        vec![Quota::per_second(2).warm_up(3 * s, 2)],
        vec![Quota::fixed_window(2, s), Quota::sliding_window(5, 2 * s)],
    ] {
        let (a, b) = (
            direct.set_quotas(change.clone()).unwrap_err(),
            keyed.set_quotas(change).unwrap_err(),
        );
        assert_eq!(a, b);
    }
    let (a, b) = (direct.check(&()), keyed.check(&7));
    assert_eq!(a, b);
    assert!(a.is_allowed());
    let (a, b) = (direct.check(&()), keyed.check(&7));
    assert_eq!(a, b);
    assert!(!a.is_allowed());
}

/// A sliding window widened while the key's request is in it: the key's state counts under
/// the new window after it left the old one, so the single slot, like a key of a table, is
/// still tracked when idle keys are forgotten (it counted 0 before, the table 1).
#[test]
fn a_single_slot_whose_window_was_widened_is_tracked_until_the_new_window_passes() {
    let s = Duration::from_secs(1);
    for (narrow, wide) in [
        (Quota::sliding_log(1, s), Quota::sliding_log(1, 10 * s)),
        (
            Quota::sliding_window(1, s),
            Quota::sliding_window(1, 10 * s),
        ),
    ] {
        let (clock, time) = Clock::manual();
        let direct = RateLimiter::<()>::builder(narrow.clone())
            .clock(clock.clone())
            .build();
        let keyed = RateLimiter::<u8>::builder(narrow.clone())
            .clock(clock)
            .build();
        assert!(direct.check(&()).is_allowed());
        assert!(keyed.check(&7).is_allowed());
        direct.set_quotas([wide.clone()]).unwrap();
        keyed.set_quotas([wide]).unwrap();
        time.advance(2 * s);
        assert_eq!(
            (direct.evict_idle(), keyed.evict_idle()),
            (1, 1),
            "{narrow:?}"
        );
        assert_eq!((direct.len(), keyed.len()), (1, 1), "{narrow:?}");
        let (a, b) = (direct.check(&()), keyed.check(&7));
        assert_eq!(a, b);
        assert!(!a.is_allowed());
        // Once the widened window has passed, both forget the key.
        time.advance(30 * s);
        assert_eq!(
            (direct.evict_idle(), keyed.evict_idle()),
            (0, 0),
            "{narrow:?}"
        );
    }
}

/// A warm-up quota alone (kept in two words) and the same quota beside a GCRA quota that never
/// binds (the general state): the same admissions, waits and warm-up state through refunds,
/// settlements above and below the cost, live changes of the curve and of the rate, and
/// eviction.
async fn warm_up_in_two_words_keeps_the_account_of_the_general_state(
    start: [bool; 2],
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let warm = |v: [bool; 2]| small_quota(4, v[0]).burst(if v[1] { 3 } else { 5 });
    let loose = Quota::per_second(1_000_000).burst(1_000_000);
    let two = crate::common::stores::layer(&[warm(start)], "two", &clock);
    let any = crate::common::stores::layer(&[warm(start), loose.clone()], "any", &clock);
    let (l2, la) = (
        two.limiter("two").unwrap().unwrap(),
        any.limiter("any").unwrap().unwrap(),
    );
    let mut a = Rig::new(|h| two.layer(h));
    let mut b = Rig::new(|h| any.layer(h));
    let mut taken = Vec::new();
    let key: Box<[u8]> = b"k"[..].into();
    for op in ops {
        match op {
            Op::Send(cost) => {
                let (x, y) = (a.send("k", cost).await, b.send("k", cost).await);
                prop_assert_eq!(x.is_some(), y.is_some(), "send {}", cost);
                if let (Some(x), Some(y)) = (x, y) {
                    taken.push((x, y));
                }
            }
            Op::Answer(i, reply) => {
                if taken.is_empty() {
                    continue;
                }
                let (x, y) = taken.remove(i % taken.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                a.answer(x, reply).await;
                b.answer(y, reply).await;
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Change(v) => {
                l2.set_quotas([warm(v)]).unwrap();
                la.set_quotas([warm(v), loose.clone()]).unwrap();
            }
            Op::Evict => {
                l2.evict_idle();
                la.evict_idle();
            }
        }
        let (d, e) = (l2.peek(&key), la.peek(&key));
        prop_assert_eq!(d.is_allowed(), e.is_allowed());
        prop_assert_eq!(d.retry_after(), e.retry_after());
        prop_assert_eq!(d.states()[0], e.states()[0]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn warm_up_in_two_words_decides_as_in_the_general_state_through_changes_and_refunds(
        start in any::<[bool; 2]>(),
        ops in prop::collection::vec(op(), 1..50),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(warm_up_in_two_words_keeps_the_account_of_the_general_state(start, ops))?;
    }
}

/// A warm-up key idle under its curve, dropped by a sweep, and then the curve changes: the
/// dropped key is new (fully cold), and so is a key kept in the table, which a change of curve
/// makes new when it is idle under the curve it replaces (else the kept key, judged by the new
/// curve from its stored deficit, would not be cold yet: an admission 638 ms ahead against
/// 708 ms), so evicting idle keys changes no decision under any later change.
#[test]
fn a_warm_up_key_swept_before_a_change_of_curve_decides_as_a_kept_one() {
    let s = Duration::from_secs(1);
    let before = || Quota::per_second(2).burst(2).warm_up(5 * s, 2);
    let after = || Quota::per_second(4).burst(4).warm_up(3 * s, 3);
    let (clock, time) = Clock::manual();
    let swept: RateLimiter<u8> = limiter(&[before()], &clock);
    let kept: RateLimiter<u8> = limiter(&[before()], &clock);
    let ms = Duration::from_millis;
    for (wait, cost) in [(0, 2), (2_302, 2), (2_971, 0)] {
        time.advance(ms(wait));
        assert_eq!(swept.check_n(&7, cost), kept.check_n(&7, cost));
        swept.evict_idle();
    }
    // Idle under the first curve: swept.
    assert_eq!(swept.len(), 0);
    swept.set_quotas([after()]).unwrap();
    kept.set_quotas([after()]).unwrap();
    assert_eq!(swept.check(&7), kept.check(&7));
}

/// A change of warm-up curve makes a key idle under the curve in force a new key, and keeps a
/// key that is not: on every shape (the quota alone or beside another, in a table or as the
/// single key of `()`), the idle key is no longer tracked and decides as a key never seen
/// under the new curve, and a table of one key that refuses new keys has room again; a key
/// still warm is tracked and judged from what it stored.
#[test]
fn a_warm_up_key_idle_at_a_change_of_curve_is_a_new_key_on_every_shape() {
    let s = Duration::from_secs(1);
    let before = Quota::per_second(2).burst(2).warm_up(5 * s, 2);
    let after = Quota::per_second(4).burst(4).warm_up(3 * s, 3);
    let loose = Quota::per_second(1_000).burst(1_000);
    for extra in [vec![], vec![loose]] {
        let with = |q: &Quota| [vec![q.clone()], extra.clone()].concat();
        let (clock, time) = Clock::manual();
        let fresh: RateLimiter<u8> = limiter(&with(&after), &clock);
        let keyed: RateLimiter<u8> = limiter(&with(&before), &clock);
        let direct: RateLimiter<()> = limiter(&with(&before), &clock);
        let bounded: RateLimiter<u8> = with(&before)[1..]
            .iter()
            .fold(RateLimiter::builder(before.clone()), |b, q| {
                b.quota(q.clone())
            })
            .clock(clock.clone())
            .max_keys(1)
            .on_full(tollgate::store::OnFull::RejectNewKeys)
            .build();
        // Warm, then idle under the first curve (back to cold within its 5 s period).
        assert!(keyed.check_n(&1, 2).is_allowed());
        assert!(direct.check_n(&(), 2).is_allowed());
        assert!(bounded.check_n(&1, 2).is_allowed());
        // A change of curve while the key is warm makes the table sweep late for the new
        // curve's period (a request decided under the old curve while the change is made may
        // store a time the new one makes later), so a full table keeps the key once idle.
        time.advance(2 * s);
        bounded.set_quotas(with(&after)).unwrap();
        bounded.set_quotas(with(&before)).unwrap();
        time.advance(4 * s);
        assert!(bounded.check(&2).is_store_full(), "{extra:?}");
        keyed.set_quotas(with(&after)).unwrap();
        direct.set_quotas(with(&after)).unwrap();
        bounded.set_quotas(with(&after)).unwrap();
        assert_eq!((keyed.len(), direct.len(), bounded.len()), (0, 0, 0));
        let new = fresh.peek(&9);
        assert_eq!(keyed.peek(&1), new, "{extra:?}");
        assert_eq!(direct.peek(&()), new, "{extra:?}");
        assert!(bounded.check(&2).is_allowed(), "{extra:?}");
        // A key still warm at the change is kept, and judged from what it stored: warmer
        // than a new key, it pays less for its next request.
        assert!(keyed.check_n(&1, 2).is_allowed());
        assert!(direct.check_n(&(), 2).is_allowed());
        time.advance(s);
        keyed.set_quotas(with(&before)).unwrap();
        direct.set_quotas(with(&before)).unwrap();
        assert_eq!((keyed.len(), direct.len()), (1, 1), "{extra:?}");
        assert_eq!(keyed.peek(&1), direct.peek(&()), "{extra:?}");
    }
}
