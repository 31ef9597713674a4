//! Live quota changes where they meet the two-word shape (a policy of one fixed window,
//! sliding counter or warm-up quota, in a table and as the single key of `()`), refunds and
//! settlements, and the bounded table: every decision is that of a key of a table that never
//! forgets, judged by the quotas in force.

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

/// Four policies of one quota of each kind kept in two words, to change among: narrower,
/// wider, lower and higher than one another.
fn policies() -> [[Quota; 4]; 3] {
    let ms = Duration::from_millis;
    [
        [
            Quota::fixed_window(3, ms(1000)),
            Quota::fixed_window(5, ms(2000)),
            Quota::fixed_window(2, ms(500)),
            Quota::fixed_window(6, ms(1000)),
        ],
        [
            Quota::sliding_window(3, ms(1000)),
            Quota::sliding_window(5, ms(2000)),
            Quota::sliding_window(2, ms(500)),
            Quota::sliding_window(8, ms(3000)),
        ],
        [
            Quota::new(3, ms(1000)).warm_up(ms(10_000), 3),
            Quota::new(5, ms(1000)).warm_up(ms(4_000), 2),
            Quota::new(2, ms(1000)).warm_up(ms(20_000), 4),
            Quota::new(3, ms(1000)).burst(5).warm_up(ms(10_000), 3),
        ],
    ]
}

fn limiter<K>(quota: &Quota, clock: &Clock, max_keys: usize, on_full: OnFull) -> RateLimiter<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync,
{
    RateLimiter::builder(quota.clone())
        .clock(clock.clone())
        .max_keys(max_keys)
        .on_full(on_full)
        .build()
}

/// A key of a table that never forgets: its state under the rules in force.
#[derive(Default)]
struct Model {
    keys: [KeyState; 3],
}

impl Model {
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
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// A policy of one quota in two words, changed while serving (narrowed, widened, its
    /// limit or its warm-up curve changed), with refunds, settlements and sweeps between:
    /// the single key of `()` and every key of a table decide as a key that is never
    /// forgotten, judged by the quotas in force; a table of one key that refuses new keys
    /// decides so too, or refuses a key for want of room.
    #[test]
    fn a_two_word_key_changed_live_decides_as_a_key_never_forgotten(
        kind in 0usize..3,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let policies = policies()[kind].clone();
        let (clock, time) = Clock::manual();
        time.advance(Duration::from_secs(10));
        let mut under = Under {
            direct: limiter(&policies[0], &clock, 1, OnFull::EvictNearestIdle),
            keyed: limiter(&policies[0], &clock, 3, OnFull::EvictNearestIdle),
            bounded: limiter(&policies[0], &clock, 1, OnFull::RejectNewKeys),
            models: Default::default(),
        };
        let mut rules: Vec<Rule> = Limits::new(vec![policies[0].clone()]).rules.to_vec();
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
                    under.direct.set_quotas([q.clone()]).unwrap();
                    under.keyed.set_quotas([q.clone()]).unwrap();
                    under.bounded.set_quotas([q.clone()]).unwrap();
                    let mut new = Limits::new(vec![q]).rules.to_vec();
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
