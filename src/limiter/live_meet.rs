//! Live quota changes where they meet the two-word shape (a policy of one fixed window,
//! sliding counter or warm-up quota, in a table and as the single key of `()`), refunds and
//! settlements, and the bounded table: every decision is that of a key of a table that never
//! forgets, judged by the quotas in force, and new after a change when it was idle under the
//! quotas the change replaced.

use std::time::Duration;

use proptest::prelude::*;

use super::live::Limits;
use crate::algo::{self, KeyState, Rule};
use crate::decision::Reservation;
use crate::store::OnFull;
use crate::{Clock, Decision, Quota, RateLimiter};

#[derive(Debug, Clone)]
enum Op {
    /// A check of this cost on this key (key 0 is also the single key of `()`).
    Check(u8, u32),
    Wait(u64),
    /// Puts the policy of this index in force.
    Change(usize),
    /// Gives back up to this many units of the last admission not yet given back.
    Refund(u32),
    /// Settles the last admission at this actual cost.
    Settle(u32),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 0u32..4).prop_map(|(k, c)| Op::Check(k, c)),
        3 => prop_oneof![0u64..700, 0u64..30_000].prop_map(Op::Wait),
        2 => (0usize..4).prop_map(Op::Change),
        1 => (1u32..4).prop_map(Op::Refund),
        1 => (0u32..7).prop_map(Op::Settle),
        1 => Just(Op::Evict),
    ]
}

/// Four policies of each shape to change among, narrower, wider, lower and higher than
/// one another: one quota of each kind kept in two words (fixed window, sliding counter,
/// warm-up), a sliding log, kinds mixed, one GCRA quota and two.
fn policies() -> Vec<[Vec<Quota>; 4]> {
    let ms = Duration::from_millis;
    let gcra = |n: u32, b: u32| Quota::new(n, ms(1000)).burst(b);
    vec![
        [
            vec![Quota::fixed_window(3, ms(1000))],
            vec![Quota::fixed_window(5, ms(2000))],
            vec![Quota::fixed_window(2, ms(500))],
            vec![Quota::fixed_window(6, ms(1000))],
        ],
        [
            vec![Quota::sliding_window(3, ms(1000))],
            vec![Quota::sliding_window(5, ms(2000))],
            vec![Quota::sliding_window(2, ms(500))],
            vec![Quota::sliding_window(8, ms(3000))],
        ],
        [
            vec![Quota::new(3, ms(1000)).warm_up(ms(10_000), 3)],
            vec![Quota::new(5, ms(1000)).warm_up(ms(4_000), 2)],
            vec![Quota::new(2, ms(1000)).warm_up(ms(20_000), 4)],
            vec![Quota::new(3, ms(1000)).burst(5).warm_up(ms(10_000), 3)],
        ],
        [
            vec![Quota::sliding_log(3, ms(1000))],
            vec![Quota::sliding_log(5, ms(2000))],
            vec![Quota::sliding_log(2, ms(500))],
            vec![Quota::sliding_log(8, ms(3000))],
        ],
        [
            vec![
                gcra(2, 3),
                Quota::sliding_window(5, ms(2000)),
                Quota::sliding_log(4, ms(1500)),
            ],
            vec![
                gcra(5, 2),
                Quota::sliding_window(3, ms(500)),
                Quota::sliding_log(2, ms(500)),
            ],
            vec![
                gcra(1, 4),
                Quota::sliding_window(8, ms(3000)),
                Quota::sliding_log(6, ms(3000)),
            ],
            vec![
                gcra(3, 3),
                Quota::sliding_window(2, ms(1000)),
                Quota::sliding_log(5, ms(1000)),
            ],
        ],
        [
            vec![gcra(2, 3)],
            vec![gcra(5, 2)],
            vec![gcra(1, 4)],
            vec![Quota::per_minute(30).burst(5)],
        ],
        [
            vec![gcra(2, 3), Quota::per_minute(30).burst(5)],
            vec![gcra(5, 2), Quota::per_minute(10).burst(3)],
            vec![gcra(1, 4), Quota::per_minute(90).burst(6)],
            vec![gcra(3, 3), Quota::per_minute(20).burst(2)],
        ],
    ]
}

fn limiter<K>(quotas: &[Quota], clock: &Clock, max_keys: usize, on_full: OnFull) -> RateLimiter<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync,
{
    super::test_builder(quotas, clock)
        .max_keys(max_keys)
        .on_full(on_full)
        .build()
}

/// A key of a table that never forgets: its state under the rules in force, made new at a
/// change of quotas when it is idle under the quotas it replaces.
#[derive(Default)]
struct Model {
    keys: [KeyState; 3],
}

impl Model {
    /// Makes every key idle at `now` under `rules` new.
    fn renew_idle(&mut self, rules: &[Rule], now: u64) {
        for key in &mut self.keys {
            if key.idle_at(rules) <= now {
                *key = KeyState::default();
            }
        }
    }

    fn check(&mut self, rules: &[Rule], key: u8, now: u64, cost: u32) -> Decision {
        algo::decide(rules, &mut self.keys[usize::from(key)], now, cost).0
    }

    fn settle(&mut self, rules: &[Rule], key: u8, now: u64, taken: &Reservation, actual: u32) {
        let state = &mut self.keys[usize::from(key)];
        match actual.cmp(&taken.cost) {
            std::cmp::Ordering::Less => state.refund(rules, now, taken, taken.cost - actual),
            std::cmp::Ordering::Greater => state.charge(rules, now, actual - taken.cost),
            std::cmp::Ordering::Equal => {}
        }
    }
}

/// The limiters under test, each with its model: the single key of `()` (key 0 only), a
/// table with room for every key, and a table of one key that refuses new keys when full.
struct Under {
    direct: RateLimiter<()>,
    keyed: RateLimiter<u8>,
    bounded: RateLimiter<u8>,
    models: [Model; 3],
}

impl Under {
    /// The decisions of the limiters that hold `key` (the single key of `()` holds key 0).
    fn check(&self, key: u8, cost: u32) -> [Option<Decision>; 3] {
        [
            (key == 0).then(|| self.direct.check_n(&(), cost)),
            Some(self.keyed.check_n(&key, cost)),
            Some(self.bounded.check_n(&key, cost)),
        ]
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A policy of any shape (one quota in two words, a sliding log, kinds mixed, GCRA
    /// quotas), changed while serving (narrowed, widened, its limit or its warm-up curve
    /// changed, a window narrowed then widened), with refunds, settlements and sweeps between:
    /// the single key of `()` and every key of a table decide as a key that is never
    /// forgotten, judged by the quotas in force; a table of one key that refuses new keys
    /// decides so too, or refuses a key for want of room.
    #[test]
    fn a_key_changed_live_decides_as_a_key_never_forgotten(
        kind in 0usize..7,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let policies = policies().swap_remove(kind);
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(10));
        let mut under = Under {
            direct: limiter(&policies[0], &clock, 1, OnFull::EvictNearestIdle),
            keyed: limiter(&policies[0], &clock, 3, OnFull::EvictNearestIdle),
            bounded: limiter(&policies[0], &clock, 1, OnFull::RejectNewKeys),
            models: Default::default(),
        };
        let mut rules: Vec<Rule> = Limits::new(policies[0].clone()).rules.to_vec();
        // The last admission of each limiter not yet given back: key, what it took.
        let mut last: [Option<(u8, Reservation)>; 3] = [None, None, None];
        for (step, op) in ops.iter().enumerate() {
            let now = clock.now();
            match *op {
                Op::Check(key, cost) => {
                    let got = under.check(key, cost);
                    for (i, d) in got.iter().enumerate() {
                        let Some(d) = d else { continue };
                        if i == 2 && d.is_store_full() {
                            continue;
                        }
                        let want = under.models[i].check(&rules, key, now, cost);
                        prop_assert_eq!(d, &want, "limiter {} at step {}", i, step);
                        if d.is_allowed() && cost > 0 {
                            last[i] = Some((key, Reservation::of(d, cost)));
                        }
                    }
                }
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::Change(p) => {
                    let q = policies[p].clone();
                    under.direct.set_quotas(q.clone()).unwrap();
                    under.keyed.set_quotas(q.clone()).unwrap();
                    under.bounded.set_quotas(q.clone()).unwrap();
                    // A key idle under the quotas in force is a new key under the new ones.
                    for model in &mut under.models {
                        model.renew_idle(&rules, now);
                    }
                    let mut new = Limits::new(q).rules.to_vec();
                    Rule::replacing(&mut new, &rules, now);
                    rules = new;
                }
                Op::Refund(units) => {
                    for (i, l) in last.iter_mut().enumerate() {
                        if let Some((key, taken)) = l.take() {
                            let units = units.min(taken.cost);
                            match i {
                                0 => under.direct.refund(&(), &taken, units),
                                1 => under.keyed.refund(&key, &taken, units),
                                _ => under.bounded.refund(&key, &taken, units),
                            }
                            under.models[i].keys[usize::from(key)]
                                .refund(&rules, now, &taken, units);
                        }
                    }
                }
                Op::Settle(actual) => {
                    for (i, l) in last.iter_mut().enumerate() {
                        if let Some((key, taken)) = l.take() {
                            let after = match i {
                                0 => under.direct.settle(&(), &taken, actual),
                                1 => under.keyed.settle(&key, &taken, actual),
                                _ => under.bounded.settle(&key, &taken, actual),
                            };
                            under.models[i].settle(&rules, key, now, &taken, actual);
                            if !(i == 2 && after.is_store_full()) {
                                let want = under.models[i].check(&rules, key, now, 0);
                                prop_assert_eq!(after, want, "settle of limiter {} at step {}", i, step);
                            }
                        }
                    }
                }
                Op::Evict => {
                    under.direct.evict_idle();
                    under.keyed.evict_idle();
                    under.bounded.evict_idle();
                }
            }
        }
    }
}

/// A request larger than a burst can never pass and carries no wait, whatever the shape of
/// the policy: under several GCRA quotas too, where another quota would also deny it for a
/// while, the decision is the one the general state makes (it once kept that quota's wait).
#[test]
fn a_request_that_can_never_pass_carries_no_wait_under_several_gcra_quotas() {
    let quotas = [
        Quota::new(5, Duration::from_secs(1)).burst(2),
        Quota::per_minute(10).burst(3),
    ];
    let (clock, _time) = Clock::manual();
    let keyed = limiter::<u8>(&quotas, &clock, 3, OnFull::EvictNearestIdle);
    let direct = limiter::<()>(&quotas, &clock, 1, OnFull::EvictNearestIdle);
    let rules = Limits::new(quotas.to_vec()).rules.to_vec();
    let mut model = Model::default();
    let now = clock.now();
    for cost in [1, 3] {
        let want = model.check(&rules, 0, now, cost);
        assert_eq!(keyed.check_n(&0, cost), want);
        assert_eq!(direct.check_n(&(), cost), want);
    }
    let d = keyed.check_n(&0, 3);
    assert_eq!(d.outcome(), crate::Outcome::Exceeds);
    assert_eq!(d.retry_after(), None);
}

/// Threads checking a key while another flips its quota between a lower limit and a higher
/// one, the clock standing still: however the checks and changes interleave, in the
/// two-word shape (fixed window, sliding counter), the GCRA shapes, a sliding log and kinds
/// mixed (whose checks find the quotas in force among those their thread decided with
/// last), on a table's key and on the single key of `()`, no more is ever admitted than the
/// higher limit allows.
#[test]
fn checks_racing_changes_never_admit_more_than_the_higher_limit() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let s = Duration::from_secs(1);
    let pairs = [
        (
            vec![Quota::fixed_window(3, s)],
            vec![Quota::fixed_window(6, s)],
        ),
        (
            vec![Quota::sliding_window(3, s)],
            vec![Quota::sliding_window(6, s)],
        ),
        (
            vec![Quota::per_minute(1).burst(3)],
            vec![Quota::per_minute(1).burst(6)],
        ),
        (
            vec![Quota::sliding_log(3, s)],
            vec![Quota::sliding_log(6, s)],
        ),
        (
            vec![Quota::fixed_window(3, s), Quota::sliding_log(3, s)],
            vec![Quota::fixed_window(6, s), Quota::sliding_log(6, s)],
        ),
    ];
    for (low, high) in pairs {
        for round in 0..10 {
            let (clock, time) = Clock::manual();
            time.advance(Duration::from_secs(10));
            let keyed = limiter::<u8>(&low, &clock, 4, OnFull::EvictNearestIdle);
            let direct = limiter::<()>(&low, &clock, 1, OnFull::EvictNearestIdle);
            let (kept, kept_direct) = (AtomicU32::new(0), AtomicU32::new(0));
            let done = AtomicBool::new(false);
            std::thread::scope(|scope| {
                for _ in 0..2 {
                    scope.spawn(|| {
                        while !done.load(Ordering::Relaxed) {
                            if keyed.check(&1).is_allowed() {
                                kept.fetch_add(1, Ordering::Relaxed);
                            }
                            if direct.check(&()).is_allowed() {
                                kept_direct.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
                for i in 0..200 {
                    let q = if (i + round) % 2 == 0 { &high } else { &low };
                    keyed.set_quotas(q.clone()).unwrap();
                    direct.set_quotas(q.clone()).unwrap();
                    std::thread::yield_now();
                }
                done.store(true, Ordering::Relaxed);
            });
            let (k, d) = (kept.into_inner(), kept_direct.into_inner());
            assert!(k <= 6 && d <= 6, "{low:?}/{high:?}: {k} and {d} admitted");
            // Under the higher limit, the key is spent to it, whatever it took before.
            keyed.set_quotas(high.clone()).unwrap();
            direct.set_quotas(high.clone()).unwrap();
            let more = (0..10).filter(|_| keyed.check(&1).is_allowed()).count() as u32;
            let more_direct = (0..10).filter(|_| direct.check(&()).is_allowed()).count() as u32;
            assert_eq!(k + more, 6, "{low:?}/{high:?}");
            assert_eq!(d + more_direct, 6, "{low:?}/{high:?}");
        }
    }
}

/// Threads checking keys idle under the curve in force while another flips between two
/// warm-up curves of one rate and burst, the clock standing still: a change makes a key new
/// only while it is idle, under the key's own lock, never once a racing check has admitted it,
/// so no key is admitted more than the burst, on a table's keys and on the single key of `()`,
/// and every key is admitted at least once.
#[test]
fn checks_racing_changes_of_curve_never_admit_more_than_the_burst() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let s = Duration::from_secs(1);
    let a = Quota::per_second(5).burst(4).warm_up(2 * s, 3);
    let b = Quota::per_second(5).burst(4).warm_up(5 * s, 2);
    for round in 0..10 {
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(10));
        let keyed = limiter::<u8>(
            std::slice::from_ref(&a),
            &clock,
            8,
            OnFull::EvictNearestIdle,
        );
        let direct = limiter::<()>(
            std::slice::from_ref(&a),
            &clock,
            1,
            OnFull::EvictNearestIdle,
        );
        for k in 0..4 {
            assert!(keyed.check(&k).is_allowed());
        }
        assert!(direct.check(&()).is_allowed());
        // Idle under the curve in force: the next change makes every key new.
        time.advance(Duration::from_secs(60));
        let kept: [AtomicU32; 5] = Default::default();
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for t in 0..2u8 {
                let (keyed, direct, kept, done) = (&keyed, &direct, &kept, &done);
                scope.spawn(move || {
                    // Every key is checked a few times, however late the thread starts.
                    for n in 0u32.. {
                        if n >= 16 && done.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = (n as u8 ^ t) % 4;
                        if keyed.check(&k).is_allowed() {
                            kept[usize::from(k)].fetch_add(1, Ordering::Relaxed);
                        }
                        if direct.check(&()).is_allowed() {
                            kept[4].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            for i in 0..200 {
                let q = if (i + round) % 2 == 0 { &b } else { &a };
                keyed.set_quotas([q.clone()]).unwrap();
                direct.set_quotas([q.clone()]).unwrap();
                std::thread::yield_now();
            }
            done.store(true, Ordering::Relaxed);
        });
        for (k, n) in kept.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            assert!((1..=4).contains(&n), "key {k}: {n} admitted");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A table of one key that refuses new keys tells a refused key when to come back: the
    /// time the tracked key goes idle. Through live changes of any shape (windows widened
    /// after the key stored its idle time, warm-up curves changed), a refused key that comes
    /// back at that time, nothing else happening, finds room.
    #[test]
    fn a_key_refused_for_want_of_room_finds_room_when_it_was_told(
        kind in 0usize..7,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let policies = policies().swap_remove(kind);
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(10));
        let bounded = limiter::<u8>(&policies[0], &clock, 1, OnFull::RejectNewKeys);
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Check(key, cost) => {
                    let d = bounded.check_n(&key, cost);
                    if d.is_store_full() {
                        let Some(wait) = d.retry_after() else { continue };
                        if wait > Duration::from_secs(3600) {
                            continue;
                        }
                        time.advance(wait);
                        let again = bounded.check_n(&key, 0);
                        prop_assert!(
                            !again.is_store_full(),
                            "step {}: told {:?}, still full: {:?}", step, wait, again
                        );
                    }
                }
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::Change(p) => bounded.set_quotas(policies[p].clone()).unwrap(),
                Op::Evict => {
                    bounded.evict_idle();
                }
                Op::Refund(_) | Op::Settle(_) => {}
            }
        }
    }
}

/// Threads that check a key and give back half of what they were admitted, while another
/// flips its window between a lower limit and a higher one, the clock standing still: a
/// window counts exactly what was admitted and not given back, whatever the limit in force
/// when each was taken or given back, on a table's key and on the single key of `()`.
#[test]
fn refunds_racing_changes_give_back_exactly_what_was_taken() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let s = Duration::from_secs(1);
    let pairs = [
        (Quota::fixed_window(3, s), Quota::fixed_window(8, s)),
        (Quota::sliding_window(3, s), Quota::sliding_window(8, s)),
    ];
    for (low, high) in pairs {
        for round in 0..10 {
            let (clock, time) = Clock::manual();
            time.advance(Duration::from_secs(10));
            let keyed = limiter::<u8>(std::slice::from_ref(&low), &clock, 4, OnFull::default());
            let direct = limiter::<()>(std::slice::from_ref(&low), &clock, 1, OnFull::default());
            let (held, held_direct) = (AtomicU32::new(0), AtomicU32::new(0));
            let done = AtomicBool::new(false);
            std::thread::scope(|scope| {
                for t in 0..2u32 {
                    let (keyed, direct, held, held_direct, done) =
                        (&keyed, &direct, &held, &held_direct, &done);
                    scope.spawn(move || {
                        let mut i = t;
                        while !done.load(Ordering::Relaxed) {
                            i += 1;
                            let d = keyed.check_n(&1, 1);
                            if d.is_allowed() {
                                if i % 2 == 0 {
                                    keyed.refund(&1, &Reservation::of(&d, 1), 1);
                                } else {
                                    held.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            let d = direct.check_n(&(), 1);
                            if d.is_allowed() {
                                if i % 2 == 0 {
                                    direct.refund(&(), &Reservation::of(&d, 1), 1);
                                } else {
                                    held_direct.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    });
                }
                for i in 0..300 {
                    let q = if (i + round) % 2 == 0 { &high } else { &low };
                    keyed.set_quotas([q.clone()]).unwrap();
                    direct.set_quotas([q.clone()]).unwrap();
                    std::thread::yield_now();
                }
                done.store(true, Ordering::Relaxed);
            });
            let (k, d) = (held.into_inner(), held_direct.into_inner());
            keyed.set_quotas([high.clone()]).unwrap();
            direct.set_quotas([high.clone()]).unwrap();
            let more = (0..20).filter(|_| keyed.check(&1).is_allowed()).count() as u32;
            let more_direct = (0..20).filter(|_| direct.check(&()).is_allowed()).count() as u32;
            assert_eq!(k + more, 8, "{low:?}/{high:?}: {k} held");
            assert_eq!(d + more_direct, 8, "{low:?}/{high:?}: {d} held");
        }
    }
}
