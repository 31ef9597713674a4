//! The shortcuts of a check against the long way round: a policy of one quota decided in the
//! check itself (the single GCRA quota's word in place, a table's lookup inlined), a quota
//! read without loading the policy, a window found without a search and a decision written
//! in place, each held to the same quota beside two GCRA quotas that never bind (the general
//! state), to a key of a table that never forgets, to a bounded table turning new keys away,
//! and to the account model (tests/common/account.rs): on every kind, with times on the
//! windows' edges, costs of 0 and above the limit, live changes that narrow and widen, and
//! threads racing changes and checks.
//!
//! Pins docs/design.md section 1 ("Other kinds") and section 3 ("A live quota change",
//! "Keyed state").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::key::Header;
use tollgate::penalty::PenaltyBox;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, Decision, Outcome, Policy, Quota, RateLimitLayer, RateLimiter};
use tower::Layer;

use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
use crate::common::account::{Account, Kind, Taken};

const MS: u64 = 1_000_000;
const MSD: Duration = Duration::from_millis(1);
/// The clock's reading right after `manual()` (1 000 s past its start, read one nanosecond on).
const START: u64 = 1_000_000_000_001;

/// Quota kinds: 0 GCRA, 1 fixed window, 2 sliding log, 3 sliding counter, 4 warm-up (and 5,
/// past this: a warm-up quota whose changes move its curve, see [`quota`]).
const KINDS: u8 = 5;

/// The model's quota of `kind` (0 to 3) in setting `v` (0 to 2): every width and interval a
/// multiple of 100 ms, so that waits on a 100 ms grid land on the windows' edges.
fn model_kind(kind: u8, v: u8) -> Kind {
    let (limit, width) = [(4, 400), (6, 800), (2, 200)][usize::from(v % 3)];
    let (limit, width) = (limit, width * MS);
    match kind {
        0 => Kind::Gcra {
            interval: width / limit,
            burst: limit,
        },
        1 => Kind::Fixed { limit, width },
        2 => Kind::Log { limit, width },
        _ => Kind::Counter { limit, width },
    }
}

/// The crate's quota of `kind` in setting `v`. A warm-up quota (4) keeps one curve and
/// changes its rate and burst; kind 5 is a warm-up quota whose settings change its curve too
/// (warm-up period and cold factor), which is only tested on keys never forgotten (a change
/// of curve after a sweep is the known exception of `RateLimiter::set_quotas`).
fn quota(kind: u8, v: u8) -> Quota {
    let (rate, burst) = [(5, 4), (10, 6), (2, 2)][usize::from(v % 3)];
    match kind {
        4 => Quota::per_second(rate)
            .burst(burst)
            .warm_up(Duration::from_millis(800), 3),
        5 => {
            let (period, cold) = [(800, 3), (300, 2), (1_500, 7)][usize::from(v % 3)];
            Quota::per_second(rate)
                .burst(burst)
                .warm_up(Duration::from_millis(period), cold)
        }
        _ => model_kind(kind, v).quota(),
    }
}

/// Two GCRA quotas that never bind a cost a quota of [`quota`] can admit: beside it they
/// put the policy in the general state and leave its decisions alone.
fn padded(kind: u8, v: u8) -> Vec<Quota> {
    vec![
        quota(kind, v),
        Quota::new(1, Duration::from_nanos(1)).burst(u32::MAX),
        Quota::new(1_000, Duration::from_nanos(1_000)).burst(u32::MAX - 1),
    ]
}

fn build<K: std::hash::Hash + Eq + Clone + Send + Sync>(
    quotas: Vec<Quota>,
    clock: &Clock,
    max_keys: Option<usize>,
) -> RateLimiter<K> {
    let mut b = RateLimiter::<K>::builder(quotas[0].clone()).clock(clock.clone());
    for q in &quotas[1..] {
        b = b.quota(q.clone());
    }
    if let Some(n) = max_keys {
        b = b.max_keys(n).on_full(OnFull::RejectNewKeys);
    }
    b.build()
}

/// What a decision says of its first quota: outcome, wait, and that quota's limit, remaining
/// and reset.
fn first(d: &Decision) -> (Outcome, Option<Duration>, u64, u64, Duration) {
    let s = d.states()[0];
    (
        d.outcome(),
        d.retry_after(),
        s.limit(),
        s.remaining(),
        s.reset_after(),
    )
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost for this key.
    Check(u8, u32),
    /// Steps of 100 ms, then a nanosecond more or less (`-1`, `0`, `1`).
    Wait(u64, i8),
    /// The quota in this setting, at once for every limiter and the model.
    Change(u8),
    /// Idle keys forgotten.
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (
            0u8..4,
            prop_oneof![6 => 0u32..4, 1 => 5u32..8, 1 => Just(u32::MAX)]
        )
            .prop_map(|(k, c)| Op::Check(k, c)),
        4 => (0u64..9, prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(n, d)| Op::Wait(n, d)),
        1 => (0u8..3).prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

/// One history of `ops` on a quota of `kind` in setting `start`, decided by:
/// * the `()` key (key 0 only) and a key of a table: the policy of one quota, the shortcuts;
/// * the same quota beside two that never bind: the general state;
/// * a table of at most two keys that turns new keys away, against a table that never
///   forgets fed the same requests but those turned away (but for a warm-up curve that
///   changes, kind 5, which is never swept);
/// * for kinds 0 to 3, an account of the model per key (the clock 1 000 s on).
///
/// All say the same, request by request, and at every step a peek of key 0 agrees, with the
/// clock 1 000 s on, at its first instant (`at` 0) or in its last hour (`at` 2).
fn the_shortcuts_decide_as_the_general_state(
    kind: u8,
    start: u8,
    at: u8,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    match at {
        // The clock's first instant: 0, the time a key never seen stores.
        0 => time.set(Duration::ZERO),
        // Its last hour.
        2 => time.set(Duration::from_nanos(u64::MAX - 3_600_000_000_000)),
        _ => {}
    }
    let modelled = kind < 4 && at == 1;
    let one: RateLimiter<()> = build(vec![quota(kind, start)], &clock, None);
    let table: RateLimiter<u8> = build(vec![quota(kind, start)], &clock, None);
    let general: RateLimiter<u8> = build(padded(kind, start), &clock, None);
    let bounded: RateLimiter<u8> = build(vec![quota(kind, start)], &clock, Some(2));
    let mirror: RateLimiter<u8> = build(vec![quota(kind, start)], &clock, None);
    let mut models: Vec<Account> = (0..4)
        .map(|_| Account::new(vec![model_kind(kind, start)]))
        .collect();
    let mut now = START;
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Check(key, cost) => {
                let d = table.check_n(&key, cost);
                if key == 0 {
                    let o = one.check_n(&(), cost);
                    prop_assert_eq!(first(&o), first(&d), "op {}: the () key", i);
                    prop_assert_eq!(o.states(), d.states(), "op {}", i);
                }
                let g = general.check_n(&key, cost);
                prop_assert_eq!(first(&g), first(&d), "op {}: the general state", i);
                let b = bounded.check_n(&key, cost);
                if kind == 5 {
                    // The bounded table forgets idle keys by itself.
                } else if b.is_store_full() {
                    prop_assert!(!b.is_allowed() && cost > 0, "op {}: {:?}", i, b);
                } else {
                    let m = mirror.check_n(&key, cost);
                    prop_assert_eq!(first(&b), first(&m), "op {}: the bounded table", i);
                }
                if modelled {
                    let (said, _) = models[usize::from(key)].admit(now, cost);
                    prop_assert_eq!(d.is_allowed(), said.allowed, "op {}: model", i);
                    prop_assert_eq!(d.states()[0].remaining(), said.remaining[0], "op {}", i);
                }
            }
            Op::Wait(steps, nudge) => {
                let ns = (steps * 100 * MS).saturating_add_signed(i64::from(nudge));
                time.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Op::Change(v) => {
                one.set_quotas([quota(kind, v)]).unwrap();
                table.set_quotas([quota(kind, v)]).unwrap();
                general.set_quotas(padded(kind, v)).unwrap();
                bounded.set_quotas([quota(kind, v)]).unwrap();
                mirror.set_quotas([quota(kind, v)]).unwrap();
                for m in &mut models {
                    m.set_quotas(now, vec![model_kind(kind, v)]);
                }
            }
            Op::Evict if kind == 5 => {}
            Op::Evict => {
                // How many keys each still tracks: the slot may count itself a moment after
                // a table forgot the same history (as in meet_slot.rs).
                let (x, y) = (one.evict_idle(), table.evict_idle());
                prop_assert!(y <= 4 && x <= 1, "{} {}", x, y);
                general.evict_idle();
                prop_assert!(bounded.evict_idle() <= 2);
            }
        }
        let d = table.peek(&0);
        prop_assert_eq!(first(&one.peek(&())), first(&d), "op {}: peek", i);
        prop_assert_eq!(first(&general.peek(&0)), first(&d), "op {}: peek", i);
        if kind != 5 {
            let (b, m) = (first(&bounded.peek(&0)), first(&mirror.peek(&0)));
            prop_assert_eq!(b, m, "op {}: the bounded table", i);
        }
        if modelled {
            let said = models[0].peek(now);
            prop_assert_eq!(d.is_allowed(), said.allowed, "op {}: model peek", i);
            prop_assert_eq!(d.states()[0].remaining(), said.remaining[0], "op {}", i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_shortcuts_of_every_kind_decide_as_the_general_state_and_the_model(
        kind in 0u8..=KINDS,
        start in 0u8..3,
        at in prop_oneof![1 => Just(0u8), 4 => Just(1u8), 1 => Just(2u8)],
        ops in prop::collection::vec(op(), 1..80),
    ) {
        the_shortcuts_decide_as_the_general_state(kind, start, at, ops)?;
    }
}

/// A request exactly at a window's end and a log entry exactly at the window's start: the
/// fixed window opens a new window, the log's oldest entry no longer counts, the counter
/// moves the current count to the previous window, on the shortcut and the general state.
#[test]
fn a_request_exactly_at_a_windows_end_is_judged_by_the_next_window() {
    for kind in 1u8..4 {
        let (clock, time) = manual();
        let one: RateLimiter<()> = build(vec![quota(kind, 0)], &clock, None);
        let general: RateLimiter<()> = build(padded(kind, 0), &clock, None);
        // Setting 0: 4 in 400 ms. Two at 0, two at 100 ms: full.
        for step in [0, 100] {
            time.advance(Duration::from_millis(step));
            for _ in 0..2 {
                assert!(one.check(&()).is_allowed());
                assert!(general.check(&()).is_allowed());
            }
        }
        // One nanosecond before the end of the window opened at 0: still full.
        time.advance(Duration::from_nanos(300 * MS - 1));
        let (o, g) = (one.check(&()), general.check(&()));
        assert_eq!(first(&o), first(&g), "kind {kind}");
        assert!(!o.is_allowed(), "kind {kind}");
        // Exactly at its end: the fixed window is new, the log's entries at 0 have left.
        time.advance(Duration::from_nanos(1));
        let (o, g) = (one.peek(&()), general.peek(&()));
        assert_eq!(first(&o), first(&g), "kind {kind}");
        let remaining = o.states()[0].remaining();
        match kind {
            // A new window: all 4.
            1 => assert_eq!(remaining, 4),
            // The two at 0 are out of [400, 800): the two at 100 ms still count.
            2 => assert_eq!(remaining, 2),
            // The current window [0, 400) becomes the previous one, wholly overlapping the
            // sliding window at its start: 4 weigh 4.
            _ => assert_eq!(remaining, 0),
        }
        let (o, g) = (one.check_n(&(), 2), general.check_n(&(), 2));
        assert_eq!(first(&o), first(&g), "kind {kind}");
        assert_eq!(o.is_allowed(), kind != 3, "kind {kind}");
    }
}

/// Threads check fresh keys of a table and peek the `()` key while another replaces the
/// quota back and forth: every decision is the one of the old quota or of the new one,
/// whole, never numbers of both, for every kind.
#[test]
fn checks_racing_live_changes_are_judged_by_one_quota_whole() {
    for kind in 0..KINDS {
        let (a, b) = (quota(kind, 0), quota(kind, 1));
        let (clock, _time) = manual();
        // Each quota's answer to a fresh key's first request, and to a peek of the `()` key
        // after a request of 2 under `a`.
        let answers = |q: &Quota| {
            let fresh: RateLimiter<u64> = build(vec![q.clone()], &clock, None);
            let slot: RateLimiter<()> = build(vec![a.clone()], &clock, None);
            assert!(slot.check_n(&(), 2).is_allowed());
            slot.set_quotas([q.clone()]).unwrap();
            (first(&fresh.check(&0)), first(&slot.peek(&())))
        };
        let (fa, fb) = (answers(&a), answers(&b));
        assert_ne!(fa.0, fb.0, "kind {kind}: the two quotas must answer apart");
        assert_ne!(fa.1, fb.1, "kind {kind}");
        let table: RateLimiter<u64> = build(vec![a.clone()], &clock, None);
        let slot: RateLimiter<()> = build(vec![a.clone()], &clock, None);
        assert!(slot.check_n(&(), 2).is_allowed());
        let done = AtomicBool::new(false);
        // Changes made so far: a thread checks at most `PER_CHANGE` fresh keys for each, so
        // that the keys a change visits stay bounded however the threads are scheduled.
        let changed = AtomicU64::new(0);
        const PER_CHANGE: u64 = 16;
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (table, slot, done, changed) = (&table, &slot, &done, &changed);
                s.spawn(move || {
                    let mut key = t << 40;
                    while !done.load(Ordering::Relaxed) {
                        if key - (t << 40) >= (changed.load(Ordering::Relaxed) + 1) * PER_CHANGE {
                            std::thread::yield_now();
                            continue;
                        }
                        key += 1;
                        let d = first(&table.check(&key));
                        assert!(d == fa.0 || d == fb.0, "kind {kind}: {d:?}");
                        let p = first(&slot.peek(&()));
                        assert!(p == fa.1 || p == fb.1, "kind {kind}: {p:?}");
                    }
                });
            }
            // A change of a warm-up curve visits every tracked key (it renews those idle under
            // the old curve), as does a change of a sliding window's or log's width (it measures
            // when each goes idle again), and the threads add a key at every check: fewer
            // changes, and a bounded number of keys per change, keep the race short.
            let changes = if matches!(kind, 2..=4) { 400 } else { 4_000 };
            for i in 0..changes {
                let q = if i % 2 == 0 { &b } else { &a };
                table.set_quotas([q.clone()]).unwrap();
                slot.set_quotas([q.clone()]).unwrap();
                changed.fetch_add(1, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
        });
    }
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
enum Step {
    /// A request of this cost (held in flight when admitted).
    Send(u32),
    /// The `i`-th request in flight answers: refunded (200), kept (401) or settled at a cost.
    Answer(usize, Option<Option<u32>>),
    /// As [`Op::Wait`].
    Wait(u64, i8),
    /// As [`Op::Change`].
    Change(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => prop_oneof![6 => 0u32..4, 1 => 5u32..8, 1 => Just(u32::MAX)].prop_map(Step::Send),
        4 => (
            0usize..8,
            prop::option::of(prop::option::of(prop_oneof![9 => 0u32..9, 1 => Just(u32::MAX)]))
        )
            .prop_map(|(i, r)| Step::Answer(i, r)),
        4 => (0u64..9, prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(n, d)| Step::Wait(n, d)),
        1 => (0u8..3).prop_map(Step::Change),
    ]
}

/// One key's requests through three layers that settle: without keys (the `()` key's
/// shortcut), keyed (a table's), and keyed on the quota beside two that never bind (the
/// general state), and for kinds 0 to 3 the account model: refunds and settlements, above
/// and below the cost, that land on a window's edge or after a change, give back and charge
/// alike on all; in a dry run every request is let through, and a would-be refusal takes and
/// settles nothing on any of them.
async fn refunds_on_the_shortcuts_give_back_as_the_general_state(
    kind: u8,
    start: u8,
    dry_run: bool,
    penalty: bool,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    // The model knows no bans: with a penalty box that can ban (no dry run), the layers are
    // held to each other.
    let modelled = kind < 4 && (dry_run || !penalty);
    let (clock, time) = manual();
    let layer = |quotas: Vec<Quota>| {
        let l = RateLimitLayer::new(policy(&quotas))
            .clock(clock.clone())
            .cost(cost_of)
            .count_if(|res| res.status != http::StatusCode::OK)
            .settle(ActualCost::of)
            .dry_run(dry_run);
        if penalty {
            l.penalty_box(PenaltyBox::new(
                3,
                Duration::from_secs(1),
                Duration::from_millis(500),
            ))
        } else {
            l
        }
    };
    let global = layer(vec![quota(kind, start)]);
    let keyed = layer(vec![quota(kind, start)]).key(Header::new("x-key"));
    let padded_keyed = layer(padded(kind, start)).key(Header::new("x-key"));
    let (one, table, general) = (
        global.limiter("p").unwrap().unwrap(),
        keyed.limiter("p").unwrap().unwrap(),
        padded_keyed.limiter("p").unwrap().unwrap(),
    );
    let mut rigs = (
        Rig::new(|h| global.layer(h)),
        Rig::new(|h| keyed.layer(h)),
        Rig::new(|h| padded_keyed.layer(h)),
    );
    let mut model = Account::new(vec![model_kind(kind, start)]);
    let mut now = START;
    let mut in_flight = Vec::new();
    let mut pads_bind = false;
    let key: Box<[u8]> = b"k"[..].into();
    for (i, s) in steps.into_iter().enumerate() {
        match s {
            Step::Send(cost) => {
                let x = rigs.0.send("k", cost).await;
                let y = rigs.1.send("k", cost).await;
                let z = rigs.2.send("k", cost).await;
                prop_assert_eq!(x.is_some(), y.is_some(), "step {}: send {}", i, cost);
                prop_assert!(!dry_run || y.is_some(), "step {}: a dry run refused", i);
                if !pads_bind {
                    prop_assert_eq!(z.is_some(), y.is_some(), "step {}: send {}", i, cost);
                }
                let (said, t) = model.admit(now, cost);
                if modelled && !dry_run {
                    prop_assert_eq!(y.is_some(), said.allowed, "step {}: model", i);
                }
                // A would-be refusal let through by a dry run reserved nothing, and settles
                // nothing.
                let t = said.allowed.then(|| t.unwrap_or(Taken::nothing()));
                if let (Some(x), Some(y)) = (x, y) {
                    in_flight.push((x, y, z, t));
                } else if let Some(z) = z {
                    rigs.2.answer(z, OK).await;
                }
            }
            Step::Answer(n, reply) => {
                if in_flight.is_empty() {
                    continue;
                }
                let (x, y, z, t) = in_flight.remove(n % in_flight.len());
                let reply = match reply {
                    None => OK,
                    Some(None) => FAILED,
                    Some(Some(n)) => settles(n),
                };
                let actual = match (reply.status, reply.actual) {
                    (200, _) => 0,
                    (_, Some(n)) => n,
                    (_, None) => t.as_ref().map_or(0, |t| t.cost),
                };
                if let Some(t) = &t {
                    model.settle(now, t, actual);
                }
                rigs.0.answer(x, reply).await;
                rigs.1.answer(y, reply).await;
                if let Some(z) = z {
                    rigs.2.answer(z, reply).await;
                }
                // The pads hold at most `u32::MAX` ns ahead of now: a debt that large binds
                // them, and the general state's policy is no longer the quota alone.
                pads_bind |= actual > 1_000;
            }
            Step::Wait(steps, nudge) => {
                let ns = (steps * 100 * MS).saturating_add_signed(i64::from(nudge));
                time.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Step::Change(v) => {
                one.set_quotas([quota(kind, v)]).unwrap();
                table.set_quotas([quota(kind, v)]).unwrap();
                general.set_quotas(padded(kind, v)).unwrap();
                model.set_quotas(now, vec![model_kind(kind, v)]);
            }
        }
        let d = table.peek(&key);
        prop_assert_eq!(first(&one.peek(&())), first(&d), "step {}: the () key", i);
        if !pads_bind {
            prop_assert_eq!(first(&general.peek(&key)), first(&d), "step {}: general", i);
        }
        if modelled {
            let said = model.peek(now);
            prop_assert_eq!(d.is_allowed(), said.allowed, "step {}: model", i);
            prop_assert_eq!(d.states()[0].remaining(), said.remaining[0], "step {}", i);
        }
        if penalty {
            let ban = global.penalties().unwrap().unwrap().ban_left(&());
            let keyed_ban = keyed.penalties().unwrap().unwrap().ban_left(&key);
            prop_assert_eq!(ban, keyed_ban, "step {}: ban", i);
            if !pads_bind {
                let general_ban = padded_keyed.penalties().unwrap().unwrap().ban_left(&key);
                prop_assert_eq!(general_ban, keyed_ban, "step {}: ban", i);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn refunds_and_settlements_on_the_shortcuts_give_back_as_the_general_state_and_the_model(
        kind in 0u8..=KINDS,
        start in 0u8..3,
        dry_run in prop::bool::weighted(0.3),
        penalty in prop::bool::weighted(0.3),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(refunds_on_the_shortcuts_give_back_as_the_general_state(
            kind, start, dry_run, penalty, steps,
        ))?;
    }
}

/// A change judges what a key stored and never rewrites it (`RateLimiter::set_quotas`): a GCRA
/// key keeps its time across a change of interval, so what a faster quota admitted keeps its
/// own, smaller price. At one instant, 4 under 1 per 100 ms (burst 4) take 400 ms, and 4 more
/// under 1 per 200 ms (burst 6) fill the new tolerance of 1.2 s: 8 in all, where either quota
/// alone admits 6 at most, and the key is then exactly the new burst period ahead, no more.
/// The same on the single key's shortcut and on the general state.
#[test]
fn a_change_of_interval_prices_what_came_before_at_its_own_interval() {
    let (clock, _time) = manual();
    let fast = Quota::new(1, Duration::from_millis(100)).burst(4);
    let slow = Quota::new(1, Duration::from_millis(200)).burst(6);
    let one: RateLimiter<()> = build(vec![fast.clone()], &clock, None);
    let general: RateLimiter<()> = build(
        vec![
            fast.clone(),
            padded(0, 0)[1].clone(),
            padded(0, 0)[2].clone(),
        ],
        &clock,
        None,
    );
    let admitted = |l: &RateLimiter<()>| (0..10).filter(|_| l.check(&()).is_allowed()).count();
    let mut counts = [admitted(&one), admitted(&general)];
    one.set_quotas([slow.clone()]).unwrap();
    let mut padded_slow = vec![slow];
    padded_slow.extend(padded(0, 0).into_iter().skip(1));
    general.set_quotas(padded_slow).unwrap();
    counts[0] += admitted(&one);
    counts[1] += admitted(&general);
    assert_eq!(counts, [8, 8]);
    for l in [&one, &general] {
        let d = l.check_n(&(), 0);
        assert_eq!(d.states()[0].reset_after(), Duration::from_millis(1200));
    }
}

/// Threads admitting on one key (the `()` key's word, and keys of a table) while another
/// flips the single GCRA quota between 1 per 100 ms (burst 4) and 1 per 200 ms (burst 6):
/// each admission moves the key's time by the interval of the quota that judged it (told
/// by its limit), none is lost (the key's time afterwards is the sum), and the sum never
/// passes the larger burst's tolerance (1.2 s).
#[test]
fn admissions_racing_changes_of_the_single_gcra_quota_each_move_the_key_by_their_own_interval() {
    let a = Quota::new(1, Duration::from_millis(100)).burst(4);
    let b = Quota::new(1, Duration::from_millis(200)).burst(6);
    let interval = |limit: u64| match limit {
        4 => 100 * MS,
        6 => 200 * MS,
        other => panic!("a limit of neither quota: {other}"),
    };
    let (clock, _time) = manual();
    let one: RateLimiter<()> = build(vec![a.clone()], &clock, None);
    let table: RateLimiter<u32> = build(vec![a.clone()], &clock, None);
    for round in 0..150u32 {
        let moved = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                let (one, table, moved) = (&one, &table, &moved);
                s.spawn(move || {
                    for _ in 0..8 {
                        let d = if round == 0 {
                            one.check(&())
                        } else {
                            table.check(&round)
                        };
                        if d.is_allowed() {
                            let t = interval(d.states()[0].limit());
                            moved.fetch_add(t, Ordering::Relaxed);
                        }
                    }
                });
            }
            for i in 0..8 {
                let q = if (round + i) % 2 == 0 { &b } else { &a };
                one.set_quotas([q.clone()]).unwrap();
                table.set_quotas([q.clone()]).unwrap();
            }
        });
        let after = if round == 0 {
            one.peek(&())
        } else {
            table.peek(&round)
        };
        let moved = moved.load(Ordering::Relaxed);
        assert_eq!(
            after.states()[0].reset_after(),
            Duration::from_nanos(moved),
            "round {round}"
        );
        assert!(moved <= 1_200 * MS, "round {round}: {moved}");
    }
}

/// What had left a sliding window when a change came stays gone (`RateLimiter::set_quotas`),
/// with the clock's first reading (0) as with any other: a log entry at 0, gone from a window
/// of 400 ms at 400 ms, must not count again when the window widens to 800 ms; a counter's
/// count of a window opened at 0, gone from windows of 200 ms at 400 ms, must not count
/// again when they widen to 400 ms; likewise when the first request comes 1 ns later. A
/// change records as gone the times before a bound (`Window::gone`, `gone_cur`, and the
/// scripts' arguments), so a bound of 0 marks nothing and a bound of 1 marks the clock's
/// first reading: were the record inclusive with 0 for "nothing gone", what was recorded at
/// 0 would count again, while a key forgotten while idle between the two changes is new,
/// and forgetting it would change the next decision (as
/// `the_shortcuts_of_every_kind_decide_as_the_general_state_and_the_model` found with the
/// clock at its first instant). Every tollgate clock can read 0: a manual clock before it is
/// moved, tokio's and the system clock at their first instant.
#[test]
fn what_left_a_sliding_window_at_a_change_stays_gone_from_the_clocks_first_instant() {
    let mut remaining = Vec::new();
    for first_at in [1, 0] {
        // The log: an entry at the first request, 4 in 400 ms, then 4 in 800 ms.
        let (clock, time) = Clock::manual();
        time.set(Duration::from_nanos(first_at));
        let log: RateLimiter<()> = build(vec![Quota::sliding_log(4, 400 * MSD)], &clock, None);
        assert!(log.check(&()).is_allowed());
        time.advance(400 * MSD);
        log.set_quotas([Quota::sliding_log(4, 800 * MSD)]).unwrap();
        remaining.push(log.peek(&()).remaining());
        // The counter: 6 in 800 ms, then 2 in 200 ms and 4 in 400 ms, both at 400 ms.
        let (clock, time) = Clock::manual();
        time.set(Duration::from_nanos(first_at));
        let counter: RateLimiter<()> =
            build(vec![Quota::sliding_window(6, 800 * MSD)], &clock, None);
        assert!(counter.check(&()).is_allowed());
        time.advance(400 * MSD);
        counter
            .set_quotas([Quota::sliding_window(2, 200 * MSD)])
            .unwrap();
        counter
            .set_quotas([Quota::sliding_window(4, 400 * MSD)])
            .unwrap();
        remaining.push(counter.peek(&()).remaining());
    }
    // The log's and the counter's, with the first request at 1 ns, then at 0.
    assert_eq!(remaining, [4, 4, 4, 4]);
}

/// The same on a Redis store, beside the memory store on one manual clock, with a change
/// exactly at the width (what was recorded at the first reading is gone) and 1 ns before it
/// (it still counts): the scripts' bound, in whole microseconds, keeps the entries and
/// windows the memory store keeps, whether the first request comes at 0 or 1 µs (Redis
/// keeps times in whole microseconds). Widths in seconds, so that no key expires in Redis
/// while the test runs.
#[cfg(feature = "redis")]
#[test]
fn what_left_a_sliding_window_at_a_change_stays_gone_from_the_clocks_first_instant_in_redis() {
    use crate::common::redis_server::RedisServer;
    use crate::common::twins::{self, Twins};
    use tollgate::redis::RedisStore;

    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt.block_on(RedisStore::connect(&server.url())).unwrap();
    let s = Duration::from_secs(1);
    let mut remaining = Vec::new();
    let mut case = 0;
    for first_at in [0, 1_000] {
        for early in [0, 1] {
            let change_at = Duration::from_nanos(400_000_000_000 + first_at - early);
            // The log: 4 in 400 s, then 4 in 800 s.
            // The counter: 6 in 800 s, then 2 in 200 s and 4 in 400 s, both at 400 s.
            let kinds = [
                (
                    Quota::sliding_log(4, 400 * s),
                    vec![vec![Quota::sliding_log(4, 800 * s)]],
                ),
                (
                    Quota::sliding_window(6, 800 * s),
                    vec![
                        vec![Quota::sliding_window(2, 200 * s)],
                        vec![Quota::sliding_window(4, 400 * s)],
                    ],
                ),
            ];
            for (first, changes) in kinds {
                case += 1;
                let twins = Twins::new(&store, format!("zero-{case}"), &[first]);
                twins.time.set(Duration::from_nanos(first_at));
                let (r, m) = twins.decide(&rt, Duration::ZERO, 0, 1).unwrap();
                assert!(r.is_allowed() && m.is_allowed(), "case {case}");
                twins.time.set(change_at);
                for quotas in changes {
                    twins.set_quotas(&quotas);
                }
                let (r, m) = twins.decide(&rt, Duration::ZERO, 0, 0).unwrap();
                assert_eq!(r.remaining(), m.remaining(), "case {case}");
                remaining.push(m.remaining());
            }
        }
    }
    // Log and counter, first at 0 then at 1 µs, each changed at the width and 1 ns before.
    assert_eq!(remaining, [4, 4, 3, 3, 4, 4, 3, 3]);
}

#[derive(Debug, Clone)]
enum Stacked {
    /// A request of this cost, answered 200 at once when it reaches the handler.
    Send(u32),
    /// As [`Op::Wait`].
    Wait(u64, i8),
    /// As [`Op::Change`], for the outer layer.
    Change(u8),
}

fn stacked() -> impl Strategy<Value = Stacked> {
    prop_oneof![
        6 => prop_oneof![6 => 0u32..4, 1 => 5u32..8, 1 => Just(u32::MAX)].prop_map(Stacked::Send),
        4 => (0u64..9, prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(n, d)| Stacked::Wait(n, d)),
        1 => (0u8..3).prop_map(Stacked::Change),
    ]
}

/// An outer layer of one quota of `kind` over an inner keyed layer (3 per 300 ms, fixed
/// window): the outer without keys (the `()` key's shortcut), keyed (a table's), and keyed
/// beside two quotas that never bind (the general state). A request the inner layer rejects
/// gives back what the outer took, at once: each outer keeps the account of the model that
/// refunds the whole cost at the rejection, and the three admit alike. In a dry run the
/// outer lets every request through, and one it would have refused gives nothing back.
async fn the_give_back_of_an_inner_rejection_on_the_shortcuts(
    kind: u8,
    start: u8,
    dry_run: bool,
    steps: Vec<Stacked>,
) -> Result<(), TestCaseError> {
    let (clock, time) = manual();
    let outer = |quotas: Vec<Quota>| {
        RateLimitLayer::new(policy(&quotas))
            .clock(clock.clone())
            .cost(cost_of)
            .dry_run(dry_run)
    };
    let inner = || {
        RateLimitLayer::new(Policy::new(
            "i",
            Quota::fixed_window(3, Duration::from_millis(300)),
        ))
        .clock(clock.clone())
        .cost(cost_of)
        .key(Header::new("x-key"))
    };
    let global = outer(vec![quota(kind, start)]);
    let keyed = outer(vec![quota(kind, start)]).key(Header::new("x-key"));
    let padded_keyed = outer(padded(kind, start)).key(Header::new("x-key"));
    let (one, table, general) = (
        global.limiter("p").unwrap().unwrap(),
        keyed.limiter("p").unwrap().unwrap(),
        padded_keyed.limiter("p").unwrap().unwrap(),
    );
    let mut rigs = (
        Rig::new(|h| global.layer(inner().layer(h))),
        Rig::new(|h| keyed.layer(inner().layer(h))),
        Rig::new(|h| padded_keyed.layer(inner().layer(h))),
    );
    let reference = inner();
    let reference = reference.limiter("i").unwrap().unwrap();
    let mut model = Account::new(vec![model_kind(kind, start)]);
    let mut now = START;
    let key: Box<[u8]> = b"k"[..].into();
    for (i, s) in steps.into_iter().enumerate() {
        match s {
            Stacked::Send(cost) => {
                let x = rigs.0.send("k", cost).await;
                let y = rigs.1.send("k", cost).await;
                let z = rigs.2.send("k", cost).await;
                prop_assert_eq!(x.is_some(), y.is_some(), "step {}: send {}", i, cost);
                prop_assert_eq!(z.is_some(), y.is_some(), "step {}: send {}", i, cost);
                if let (Some(x), Some(y), Some(z)) = (x, y, z) {
                    prop_assert_eq!(rigs.0.answer(x, OK).await, 200);
                    prop_assert_eq!(rigs.1.answer(y, OK).await, 200);
                    prop_assert_eq!(rigs.2.answer(z, OK).await, 200);
                }
                // The inner layer is asked only when the outer admitted, or let the request
                // through in a dry run (then took nothing, and gives nothing back).
                let (said, t) = model.admit(now, cost);
                if kind < 4 {
                    if said.allowed || dry_run {
                        let passed = reference.check_n(&key, cost).is_allowed();
                        prop_assert_eq!(y.is_some(), passed, "step {}: inner", i);
                        if !passed {
                            if let (true, Some(t)) = (said.allowed, &t) {
                                model.refund(now, t, cost);
                            }
                        }
                    } else {
                        prop_assert!(y.is_none(), "step {}: model refused", i);
                    }
                }
            }
            Stacked::Wait(steps, nudge) => {
                let ns = (steps * 100 * MS).saturating_add_signed(i64::from(nudge));
                time.advance(Duration::from_nanos(ns));
                now += ns;
            }
            Stacked::Change(v) => {
                one.set_quotas([quota(kind, v)]).unwrap();
                table.set_quotas([quota(kind, v)]).unwrap();
                general.set_quotas(padded(kind, v)).unwrap();
                model.set_quotas(now, vec![model_kind(kind, v)]);
            }
        }
        let d = table.peek(&key);
        prop_assert_eq!(first(&one.peek(&())), first(&d), "step {}: the () key", i);
        prop_assert_eq!(first(&general.peek(&key)), first(&d), "step {}: general", i);
        if kind < 4 {
            let said = model.peek(now);
            prop_assert_eq!(d.is_allowed(), said.allowed, "step {}: model", i);
            prop_assert_eq!(d.states()[0].remaining(), said.remaining[0], "step {}", i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_inner_rejection_gives_back_on_the_shortcuts_as_on_the_general_state_and_the_model(
        kind in 0u8..=KINDS,
        start in 0u8..3,
        dry_run in prop::bool::weighted(0.3),
        steps in prop::collection::vec(stacked(), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(the_give_back_of_an_inner_rejection_on_the_shortcuts(
            kind, start, dry_run, steps,
        ))?;
    }
}

/// Threads admitting on one key (the `()` key's slot, and keys of a table) while another
/// flips a fixed window, sliding log or sliding counter between 4 and 6 per window, at one
/// instant: never more than 6 admitted, and none lost (what remains afterwards, under the
/// quota left in force, is its limit less the admissions).
#[test]
fn admissions_racing_changes_of_a_window_quota_count_each_once() {
    for kind in 1u8..4 {
        let (a, b) = (quota(kind, 0), quota(kind, 1));
        let (clock, _time) = manual();
        let one: RateLimiter<()> = build(vec![a.clone()], &clock, None);
        let table: RateLimiter<u32> = build(vec![a.clone()], &clock, None);
        for round in 0..60u32 {
            let admitted = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    let (one, table, admitted) = (&one, &table, &admitted);
                    s.spawn(move || {
                        for _ in 0..6 {
                            let d = if round == 0 {
                                one.check(&())
                            } else {
                                table.check(&round)
                            };
                            admitted.fetch_add(u64::from(d.is_allowed()), Ordering::Relaxed);
                        }
                    });
                }
                for i in 0..8 {
                    let q = if (round + i) % 2 == 0 { &b } else { &a };
                    one.set_quotas([q.clone()]).unwrap();
                    table.set_quotas([q.clone()]).unwrap();
                }
            });
            // The last change put `b` (6 per window) in force in odd rounds, `a` (4) in even.
            let limit = if round % 2 == 1 { 6 } else { 4 };
            let after = if round == 0 {
                one.peek(&())
            } else {
                table.peek(&round)
            };
            let admitted = admitted.load(Ordering::Relaxed);
            assert!(admitted <= 6, "kind {kind}, round {round}: {admitted}");
            assert_eq!(
                after.states()[0].remaining(),
                limit - admitted.min(limit),
                "kind {kind}, round {round}"
            );
        }
    }
}
