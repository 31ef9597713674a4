//! The mechanism under [`RateLimiter`](super::RateLimiter): the quotas in force and every key's
//! state, in this process.
//!
//! # Implementation details
//! A policy's quotas are read in one of three shapes: one GCRA quota (a key's whole state is
//! one word, updated by compare-and-swap), several GCRA quotas, or quotas of any kinds. A key
//! type with a single value (`()` above all) keeps its one slot without a table, lock or map.
//! [`State`] is one of the three shapes, each [`Slots`] in a table or direct; its methods are
//! the only place that picks among them.

use std::hash::Hash;
use std::sync::Arc;

use crate::algo::gcra::Gcra;
use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Reservation};
use crate::keyed::{Bound, Entry, Table};
use crate::quota::Quota;
use crate::store::memory::{Lag, Many, MemoryStore, Mixed, One, Slot};
use crate::store::OnFull;

use super::live::Live;

/// A set of quotas and the numbers the algorithms take from them, swapped as one.
pub(super) struct Limits {
    pub(super) quotas: Arc<[Quota]>,
    /// The quotas as GCRA when every quota is one (else empty).
    pub(super) gcras: Box<[Gcra]>,
    pub(super) rules: Box<[Rule]>,
}

impl Limits {
    pub(super) fn new(quotas: Vec<Quota>) -> Self {
        let rules: Box<[Rule]> = quotas.iter().map(Quota::rule).collect();
        let gcras: Box<[Gcra]> = rules.iter().filter_map(Rule::as_gcra).copied().collect();
        Limits {
            quotas: quotas.into(),
            gcras,
            rules,
        }
    }
}

/// The keys' state of one shape, in a bounded table ([`MemoryStore`]) or in one slot for the
/// single key of a zero-sized key type ([`Direct`]): what a limiter does with either.
trait Keys<K, V: Slot> {
    fn decide(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) -> Decision;
    fn reserve(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) -> Decision;
    fn refund(&self, key: &K, rules: &V::Rules, now: u64, taken: &Reservation, units: u32);
    fn charge(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32);
    fn len(&self, now: u64) -> usize;
    fn evict_idle(&self, now: u64) -> usize;
    /// The table and the time it sweeps at when the clock says `now`; none for one slot.
    fn table(&self, now: u64) -> Option<(&Table<K, V>, u64)>;
}

impl<K: Hash + Eq + Clone, V: Slot + Entry> Keys<K, V> for MemoryStore<K, V> {
    #[inline]
    fn decide(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) -> Decision {
        MemoryStore::decide(self, key, rules, clock, now, cost)
    }

    fn reserve(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) -> Decision {
        MemoryStore::reserve(self, key, rules, clock, now, cost)
    }

    fn refund(&self, key: &K, rules: &V::Rules, now: u64, taken: &Reservation, units: u32) {
        MemoryStore::refund(self, key, rules, now, taken, units)
    }

    fn charge(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) {
        MemoryStore::charge(self, key, rules, clock, now, cost)
    }

    fn len(&self, _now: u64) -> usize {
        MemoryStore::len(self)
    }

    fn evict_idle(&self, now: u64) -> usize {
        MemoryStore::evict_idle(self, now)
    }

    fn table(&self, now: u64) -> Option<(&Table<K, V>, u64)> {
        Some((MemoryStore::table(self), self.sweep_time(now)))
    }
}

/// The one slot of the single key of a zero-sized key type (`()` above all): no table, no
/// lock, no map. It decides as the key of a table and is forgotten when a table's sweep would
/// drop the key: once it is idle at the table's sweep time, which lags the clock for a while
/// after a window is widened ([`Lag`]), so that a key whose state still counts is counted.
struct Direct<V> {
    slot: V,
    lag: Lag,
}

impl<V: Slot> Direct<V> {
    fn new(slot: V) -> Self {
        Direct {
            slot,
            lag: Lag::default(),
        }
    }

    /// Whether a table would keep the key after sweeping at `now`.
    fn tracked(&self, now: u64) -> bool {
        self.slot.horizon() > self.lag.sweep_time(now)
    }
}

impl<K, V: Slot> Keys<K, V> for Direct<V> {
    #[inline]
    fn decide(&self, _: &K, rules: &V::Rules, _: &Clock, now: u64, cost: u32) -> Decision {
        self.slot.decide(rules, now, cost)
    }

    /// The single key always has its place.
    fn reserve(&self, _: &K, rules: &V::Rules, _: &Clock, now: u64, cost: u32) -> Decision {
        self.slot.decide(rules, now, cost)
    }

    fn refund(&self, _: &K, rules: &V::Rules, now: u64, taken: &Reservation, units: u32) {
        self.slot.refund(rules, now, taken, units)
    }

    fn charge(&self, _: &K, rules: &V::Rules, _: &Clock, now: u64, cost: u32) {
        self.slot.charge(rules, now, cost)
    }

    fn len(&self, now: u64) -> usize {
        usize::from(self.tracked(now))
    }

    fn evict_idle(&self, now: u64) -> usize {
        usize::from(self.tracked(now))
    }

    fn table(&self, _: u64) -> Option<(&Table<K, V>, u64)> {
        None
    }
}

/// Every key's state, in the shape of the policy's quotas.
pub(super) struct State<K>(Shape<K>);

/// One shape of three (one GCRA quota, several, any kinds), in a table or direct: one match
/// picks among the six, as one tag.
enum Shape<K> {
    One(MemoryStore<K, One>),
    Many(MemoryStore<K, Many>),
    /// Quotas of other kinds than GCRA among them.
    Mixed(MemoryStore<K, Mixed>),
    DirectOne(Direct<One>),
    DirectMany(Direct<Many>),
    DirectMixed(Direct<Mixed>),
}

/// Runs `$body` on the [`Keys`] of `$state` bound to `$slots`, and with `$limits`, with
/// `$rules` bound to its quotas as that shape reads them: the one place that picks among the
/// six.
macro_rules! with_slots {
    ($state:expr, |$slots:ident| $body:expr) => {
        match $state {
            Shape::One($slots) => $body,
            Shape::Many($slots) => $body,
            Shape::Mixed($slots) => $body,
            Shape::DirectOne($slots) => $body,
            Shape::DirectMany($slots) => $body,
            Shape::DirectMixed($slots) => $body,
        }
    };
    ($state:expr, $limits:expr, |$slots:ident, $rules:ident| $body:expr) => {
        match $state {
            Shape::One($slots) => {
                let $rules = &$limits.gcras[0];
                $body
            }
            Shape::Many($slots) => {
                let $rules = &*$limits.gcras;
                $body
            }
            Shape::Mixed($slots) => {
                let $rules = &*$limits.rules;
                $body
            }
            Shape::DirectOne($slots) => {
                let $rules = &$limits.gcras[0];
                $body
            }
            Shape::DirectMany($slots) => {
                let $rules = &*$limits.gcras;
                $body
            }
            Shape::DirectMixed($slots) => {
                let $rules = &*$limits.rules;
                $body
            }
        }
    };
}

impl<K: Hash + Eq + Clone + Send + Sync> State<K> {
    /// The state for `limits`, a table of at most `max_keys` keys, or one slot when `K` has a
    /// single value.
    pub(super) fn new(limits: &Limits, max_keys: usize, on_full: OnFull) -> Self {
        let direct = std::mem::size_of::<K>() == 0;
        State(if limits.gcras.len() < limits.rules.len() {
            if direct {
                Shape::DirectMixed(Direct::new(Mixed::idle()))
            } else {
                Shape::Mixed(MemoryStore::new(max_keys, on_full))
            }
        } else if limits.gcras.len() == 1 {
            if direct {
                Shape::DirectOne(Direct::new(One::idle()))
            } else {
                Shape::One(MemoryStore::new(max_keys, on_full))
            }
        } else if direct {
            Shape::DirectMany(Direct::new(Many::idle()))
        } else {
            Shape::Many(MemoryStore::new(max_keys, on_full))
        })
    }

    /// Decides a request of `cost` for `key` at `now` (read from `clock`).
    #[inline]
    pub(super) fn decide(
        &self,
        limits: &Limits,
        key: &K,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        with_slots!(&self.0, limits, |s, rules| s
            .decide(key, rules, clock, now, cost))
    }

    /// As [`decide`](Self::decide), with the quotas read from `live`: a policy of GCRA
    /// quotas only takes their numbers without loading the whole set.
    #[inline]
    pub(super) fn decide_live(
        &self,
        live: &Live,
        key: &K,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        let mut gcras = [Gcra::new(1, 1); crate::decision::MAX_QUOTAS];
        match &self.0 {
            Shape::One(s) => s.decide(key, &live.one(), clock, now, cost),
            Shape::Many(s) => match live.gcras(&mut gcras) {
                Some(n) => s.decide(key, &gcras[..n], clock, now, cost),
                None => s.decide(key, &live.load().gcras, clock, now, cost),
            },
            _ => self.decide(&live.load(), key, clock, now, cost),
        }
    }

    /// As [`decide`](Self::decide), but a cost of 0 needs a place for the key like any other
    /// cost (see `MemoryStore::reserve`).
    pub(super) fn reserve(
        &self,
        limits: &Limits,
        key: &K,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        with_slots!(&self.0, limits, |s, rules| s
            .reserve(key, rules, clock, now, cost))
    }

    /// Gives back `units` of what `taken` took for `key`.
    pub(super) fn refund(
        &self,
        limits: &Limits,
        key: &K,
        now: u64,
        taken: &Reservation,
        units: u32,
    ) {
        with_slots!(&self.0, limits, |s, rules| s
            .refund(key, rules, now, taken, units))
    }

    /// Takes `cost` from `key` whatever its state.
    pub(super) fn charge(&self, limits: &Limits, key: &K, clock: &Clock, now: u64, cost: u32) {
        with_slots!(&self.0, limits, |s, rules| s
            .charge(key, rules, clock, now, cost))
    }

    /// The number of tracked keys at `now`.
    pub(super) fn len(&self, now: u64) -> usize {
        with_slots!(&self.0, |s| Keys::<K, _>::len(s, now))
    }

    /// Forgets every idle key at `now`; how many are still tracked.
    pub(super) fn evict_idle(&self, now: u64) -> usize {
        with_slots!(&self.0, |s| Keys::<K, _>::evict_idle(s, now))
    }

    /// Tells the table that the rules `new` replace `old` at `now`: a key may stay idle
    /// later than it stored (a window was widened: see `MemoryStore::widen`).
    pub(super) fn replacing(&self, old: &[Rule], new: &[Rule], now: u64) {
        let widening = || crate::algo::widening(old, new, now);
        match &self.0 {
            Shape::Mixed(s) => {
                let (lag, until) = widening();
                s.widen(now, lag, until);
            }
            Shape::DirectMixed(d) => {
                let (lag, until) = widening();
                d.lag.widen(now, lag, until);
            }
            _ => {}
        }
    }

    /// Counts the keys in `bound`; whether there is a table to count.
    pub(super) fn share(&self, bound: &Arc<Bound>) -> bool {
        with_slots!(&self.0, |s| Keys::<K, _>::table(s, 0)
            .map(|(t, _)| t.share(bound.clone())))
        .is_some()
    }

    /// The single key's slot of a single GCRA quota, decided inline.
    #[inline]
    pub(super) fn direct_one(&self) -> Option<&One> {
        match &self.0 {
            Shape::DirectOne(d) => Some(&d.slot),
            _ => None,
        }
    }
}

/// The keys' room in a bound shared with other tables (see `keyed::Room`).
impl<K: Hash + Eq + Clone + Send + Sync> State<K> {
    pub(super) fn drop_idle(&self, now: u64) -> bool {
        with_slots!(&self.0, |s| Keys::<K, _>::table(s, now)
            .is_some_and(|(t, at)| t.drop_idle(at)))
    }

    pub(super) fn evict(&self, now: u64, rank: u8, spare: Option<u64>) -> bool {
        with_slots!(&self.0, |s| Keys::<K, _>::table(s, now)
            .is_some_and(|(t, at)| t.evict_for_other(at, rank, spare)))
    }

    pub(super) fn idle_in(&self, now: u64) -> u64 {
        with_slots!(&self.0, |s| Keys::<K, _>::table(s, now)
            .map_or(u64::MAX, |(t, at)| t.idle_in(at)))
    }
}

/// Decides the single GCRA quota `g` on `slot` (a single key's).
#[inline]
pub(super) fn decide_one(slot: &One, g: &Gcra, now: u64, cost: u32) -> Decision {
    slot.decide(g, now, cost)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::decision::Reservation;
    use crate::{Clock, Decision, Quota, RateLimiter};

    #[derive(Debug, Clone)]
    enum Op {
        Check(u32),
        Wait(u64),
        /// Gives back up to this many units of the last admission not yet given back.
        Refund(u32),
        /// Settles the last admission at this actual cost.
        Settle(u32),
        Evict,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..4).prop_map(Op::Check),
            2 => (0u64..700).prop_map(Op::Wait),
            1 => (1u32..4).prop_map(Op::Refund),
            1 => (0u32..7).prop_map(Op::Settle),
            1 => Just(Op::Evict),
        ]
    }

    /// A policy of each shape: one GCRA quota, several, and kinds other than GCRA among them.
    fn shapes() -> [Vec<Quota>; 3] {
        [
            vec![Quota::per_second(5)],
            vec![Quota::per_second(5), Quota::per_minute(20)],
            vec![
                Quota::per_second(5),
                Quota::sliding_window(8, Duration::from_secs(2)),
                Quota::fixed_window(6, Duration::from_secs(1)),
                Quota::sliding_log(7, Duration::from_millis(1500)),
            ],
        ]
    }

    fn limiter<K>(quotas: &[Quota], clock: &Clock) -> RateLimiter<K>
    where
        K: std::hash::Hash + Eq + Clone + Send + Sync,
    {
        quotas[1..]
            .iter()
            .fold(RateLimiter::builder(quotas[0].clone()), |b, q| {
                b.quota(q.clone())
            })
            .clock(clock.clone())
            .build()
    }

    proptest! {
        /// The single key of a zero-sized key type keeps one slot, without a table: in every
        /// shape of policy it decides, refunds, settles and is forgotten exactly as one key of
        /// a table, over any sequence of requests and waits.
        #[test]
        fn the_single_slot_decides_as_a_key_of_a_table_in_every_shape(
            ops in prop::collection::vec(op(), 1..60)
        ) {
            for quotas in shapes() {
                let (clock, time) = Clock::manual();
                time.advance(Duration::from_secs(10));
                let direct = limiter::<()>(&quotas, &clock);
                let keyed = limiter::<u8>(&quotas, &clock);
                let mut last: Option<(Decision, Decision, u32)> = None;
                for op in &ops {
                    match *op {
                        Op::Check(cost) => {
                            let (a, b) = (direct.check_n(&(), cost), keyed.check_n(&7, cost));
                            prop_assert_eq!(a, b);
                            if a.is_allowed() && cost > 0 {
                                last = Some((a, b, cost));
                            }
                        }
                        Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                        Op::Refund(units) => {
                            if let Some((a, b, cost)) = last.take() {
                                let units = units.min(cost);
                                direct.refund(&(), &Reservation::of(&a, cost), units);
                                keyed.refund(&7, &Reservation::of(&b, cost), units);
                            }
                        }
                        Op::Settle(actual) => {
                            if let Some((a, b, cost)) = last.take() {
                                let x = direct.settle(&(), &Reservation::of(&a, cost), actual);
                                let y = keyed.settle(&7, &Reservation::of(&b, cost), actual);
                                prop_assert_eq!(x, y);
                            }
                        }
                        Op::Evict => prop_assert_eq!(direct.evict_idle(), keyed.evict_idle()),
                    }
                    prop_assert_eq!(direct.peek(&()), keyed.peek(&7));
                }
            }
        }
    }
}
