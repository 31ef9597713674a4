//! The mechanism under [`RateLimiter`](super::RateLimiter): the quotas in force and every key's
//! state, in this process.
//!
//! # Implementation details
//! A policy's quotas are read in one of four shapes: one GCRA quota (a key's whole state is
//! one word, updated by compare-and-swap), several GCRA quotas, one quota of another kind kept
//! in two words (a fixed window, a sliding counter, a warm-up), or quotas of any kinds. A key
//! type with a single value (`()` above all) keeps its one slot without a table, lock or map.
//! [`State`] is one of the four shapes, each [`Keys`] in a table ([`MemoryStore`], the
//! table wrapper: its sweep lag and the paths of a new key) or direct; its methods are the
//! only place that picks among them. Each shape's slot, its state and its read-decide-replace,
//! lives beside its maths in `crate::algo`.

use std::cell::Cell;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::algo::{decision_two, Gcra, Many, Mixed, One, Rule, Slot, Two, TwoKind, WithKind};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome, Reservation};
use crate::keyed::{Absent, Bound, Entry, Full, OnFull, Table};

use super::live::{Limits, Live};

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
    /// Nanoseconds from `now`, a reading of the clock, until the table drops an entry gone
    /// idle (`u64::MAX`: none); none for one slot.
    fn idle_in(&self, now: u64) -> u64;
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

    fn idle_in(&self, now: u64) -> u64 {
        MemoryStore::idle_in(self, now)
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

    fn idle_in(&self, _: u64) -> u64 {
        u64::MAX
    }
}

/// Every key's state, in the shape of the policy's quotas.
pub(super) struct State<K>(Shape<K>);

/// One shape of four (one GCRA quota, several, one quota of another kind kept in two words,
/// any kinds), in a table or direct: one match picks among the eight, as one tag.
enum Shape<K> {
    One(MemoryStore<K, One>),
    Many(MemoryStore<K, Many>),
    /// One quota of another kind than GCRA, kept in two words.
    Two(MemoryStore<K, Two>),
    /// Quotas of other kinds than GCRA among them.
    Mixed(MemoryStore<K, Mixed>),
    DirectOne(Direct<One>),
    DirectMany(Direct<Many>),
    DirectTwo(Direct<Two>),
    DirectMixed(Direct<Mixed>),
}

/// Runs `$body` on the [`Keys`] of `$state` bound to `$slots`, and with `$limits`, with
/// `$rules` bound to its quotas as that shape reads them: the one place that picks among the
/// eight.
macro_rules! with_slots {
    ($state:expr, |$slots:ident| $body:expr) => {
        match $state {
            Shape::One($slots) => $body,
            Shape::Many($slots) => $body,
            Shape::Two($slots) => $body,
            Shape::Mixed($slots) => $body,
            Shape::DirectOne($slots) => $body,
            Shape::DirectMany($slots) => $body,
            Shape::DirectTwo($slots) => $body,
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
            Shape::Two($slots) => {
                let $rules = &$limits.rules[0];
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
            Shape::DirectTwo($slots) => {
                let $rules = &$limits.rules[0];
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
        let two = matches!(&*limits.rules, [rule] if rule.in_two_words());
        State(if limits.gcras.len() < limits.rules.len() && two {
            if direct {
                Shape::DirectTwo(Direct::new(Two::idle()))
            } else {
                Shape::Two(MemoryStore::new(max_keys, on_full))
            }
        } else if limits.gcras.len() < limits.rules.len() {
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

    /// Decides a request of `cost` for `key` at `now` (read from `clock`), with the quotas
    /// read from `live`: a policy of GCRA quotas only, or of one quota kept in two words,
    /// takes its numbers without loading the whole set. One call per shape, so that each
    /// shape's decision is inlined here.
    #[inline]
    pub(super) fn decide_live(
        &self,
        live: &Live,
        key: &K,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        // Each decision is stamped, where it lies, with the generation of the quotas that
        // judged it.
        let generation;
        let mut d = match &self.0 {
            Shape::One(s) => {
                let g;
                (g, generation) = live.one();
                s.decide(key, &g, clock, now, cost)
            }
            Shape::Many(s) => {
                let mut gcras = [Gcra::new(1, 1); crate::decision::MAX_QUOTAS];
                match live.gcras(&mut gcras) {
                    Some((n, g)) => {
                        generation = g;
                        s.decide(key, &gcras[..n], clock, now, cost)
                    }
                    None => {
                        let l = live.load();
                        generation = l.generation;
                        s.decide(key, &l.gcras, clock, now, cost)
                    }
                }
            }
            Shape::Two(s) => return live.with_two(CheckTwo::new(s, key, clock, now, cost)),
            Shape::DirectTwo(d) => return live.with_two(CheckTwo::new(d, key, clock, now, cost)),
            Shape::Mixed(s) => {
                // Written whole where the check returns it, not through the closure.
                let mut d = Decision::unlimited();
                live.with_limits(|l| {
                    s.decide_to(key, &l.rules, clock, now, cost, &mut d);
                    d.stamp(l.generation);
                });
                return d;
            }
            Shape::DirectOne(d) => {
                let g;
                (g, generation) = live.one();
                d.decide(key, &g, clock, now, cost)
            }
            Shape::DirectMany(d) => {
                let l = live.load();
                generation = l.generation;
                d.decide(key, &l.gcras, clock, now, cost)
            }
            // A key type of one value (the only one with this shape) keeps this arm out of
            // the check's line: in line, its registers cost the check of one GCRA quota on
            // that key 3 instructions.
            Shape::DirectMixed(d) if std::mem::size_of::<K>() == 0 => {
                return decide_direct_mixed(d, live, now, cost);
            }
            Shape::DirectMixed(d) => {
                return live.with_limits(|l| {
                    d.decide(key, &l.rules, clock, now, cost)
                        .stamped(l.generation)
                });
            }
        };
        d.stamp(generation);
        d
    }

    /// As [`decide_live`](Self::decide_live), with the quotas in `limits`, but a cost of 0
    /// needs a place for the key like any other cost (see `MemoryStore::reserve`).
    pub(super) fn reserve(
        &self,
        limits: &Limits,
        key: &K,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        let mut d = with_slots!(&self.0, limits, |s, rules| s
            .reserve(key, rules, clock, now, cost));
        d.stamp(limits.generation);
        d
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

    /// Tells the keys that the rules `new` replace `old` at `now`, before `new` is in
    /// force: a key may stay idle later than it stored (a window was widened: see
    /// `MemoryStore::widen`), when a warm-up curve changes, every key idle under `old`
    /// is made new (see [`renews_idle_keys`]), and when a key may go idle earlier than it
    /// stored, every kept key's idle time is measured again under `new` (see
    /// [`remeasures`]).
    pub(super) fn replacing(&self, old: &[Rule], new: &[Rule], now: u64) {
        let widening = || crate::algo::widening(old, new, now);
        let renew = renews_idle_keys(old, new);
        // Whether to visit every key, for a store that lags the clock or not.
        let visit = |lagging: bool| renew || remeasures(old, new, lagging);
        match &self.0 {
            Shape::Two(s) => {
                if visit(s.sweep_time(now) < now) {
                    s.table.drop_where(|slot| {
                        (renew && slot.renew_if_idle(&old[0], now))
                            || remeasured(slot, &new[0], now)
                    });
                }
                let (lag, until) = widening();
                s.widen(now, lag, until);
            }
            Shape::Mixed(s) => {
                if visit(s.sweep_time(now) < now) {
                    s.table.drop_where(|slot| {
                        (renew && slot.renew_if_idle(old, now)) || remeasured(slot, new, now)
                    });
                }
                let (lag, until) = widening();
                s.widen(now, lag, until);
            }
            Shape::DirectTwo(d) => {
                if visit(d.lag.sweep_time(now) < now) {
                    // Made new where a table drops the key.
                    let _ = (renew && d.slot.renew_if_idle(&old[0], now))
                        || d.slot.renew_if_idle(&new[0], now)
                        || remeasured(&d.slot, &new[0], now);
                }
                let (lag, until) = widening();
                d.lag.widen(now, lag, until);
            }
            Shape::DirectMixed(d) => {
                if visit(d.lag.sweep_time(now) < now) {
                    let _ = (renew && d.slot.renew_if_idle(old, now))
                        || d.slot.renew_if_idle(new, now)
                        || remeasured(&d.slot, new, now);
                }
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

    /// The keys of a policy of one GCRA quota, which a check decides inline; none for any
    /// other shape.
    #[inline]
    pub(super) fn one_gcra(&self) -> Option<OneGcra<'_, K>> {
        match &self.0 {
            Shape::DirectOne(d) => Some(OneGcra::Direct(&d.slot)),
            Shape::One(s) => Some(OneGcra::Table(s)),
            _ => None,
        }
    }
}

/// The check of the single key of `()` under a policy of kinds mixed or a sliding log, with
/// the quotas found among those its thread decided with last (see `Live::with_limits`).
#[inline(never)]
fn decide_direct_mixed(d: &Direct<Mixed>, live: &Live, now: u64, cost: u32) -> Decision {
    live.with_limits(|l| d.slot.decide(&l.rules, now, cost).stamped(l.generation))
}

/// Whether replacing the rules `old` with `new` must make every key idle under `old` new:
/// when a warm-up curve changes (its rate, period or cold factor). A kept key's warm-up is
/// judged by the rules in force, so its stored deficit, regained under the new curve, would
/// not be the fully cold state that a key forgotten while idle (or expired on Redis) starts
/// from. Any other change leaves an idle key deciding as a new one.
pub(crate) fn renews_idle_keys(old: &[Rule], new: &[Rule]) -> bool {
    old.iter()
        .zip(new)
        .any(|pair| matches!(pair, (Rule::WarmUp(a), Rule::WarmUp(b)) if a.curve != b.curve))
}

/// Whether replacing the rules `old` with `new` may bring a kept key's idle time earlier
/// than the time stored beside its state, to a time a store sweeping at `lagging` (as if
/// the clock were earlier, see `MemoryStore::widen`) or not finds past: the first write of
/// the key judged by `new` would then move it below its shard's lower bound of idle times,
/// and a full table would pass over the key once idle. Such a change visits every tracked
/// key and measures its idle time again under `new` (see [`remeasured`]), after which writes
/// judged by `new` only move it later.
///
/// A sliding window or log whose width changes, either way, moves it (narrowed, it ends
/// sooner; widened, what had left the narrower window stays gone, so a key idle by the
/// clock whose stored time the lag still counts is new at once); so does a change of warm-up
/// curve, which visits every key for [`renews_idle_keys`] already. Another change of a
/// sliding window or log moves only the times of keys already idle by the clock, which
/// matters only while the store lags it.
fn remeasures(old: &[Rule], new: &[Rule], lagging: bool) -> bool {
    old.iter().zip(new).any(|(o, n)| {
        matches!(o, Rule::SlidingWindow(_) | Rule::SlidingLog(_))
            && (o.reach() != n.reach() || (lagging && o != n))
    })
}

/// Measures when the key of `slot` becomes idle again, judged by `rules`, and keeps the time
/// beside its state, which stays as it is (a refund of nothing); whether that is `now` or
/// before, when a table drops the key: its state is then that of a key never seen under
/// `rules`. (A table that lags the clock might keep it, judged by a wider window's time, but
/// a store that dropped it for room before the lag began could not.)
fn remeasured<V: Slot>(slot: &V, rules: &V::Rules, now: u64) -> bool {
    slot.refund(rules, now, &Reservation::none(), 0);
    slot.horizon() <= now
}

/// The keys of a policy of one GCRA quota (see [`State::one_gcra`]).
pub(super) enum OneGcra<'a, K> {
    /// The single key's slot: its whole state is one word.
    Direct(&'a One),
    /// The table of keys.
    Table(&'a MemoryStore<K, One>),
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
        with_slots!(&self.0, |s| Keys::<K, _>::idle_in(s, now))
    }
}

/// The keys of a policy of one quota kept in two words, decided with that quota as its own
/// kind (see [`TwoKind`]): the kind is read once, with the quota, and nothing else matches on
/// it.
trait KeysTwo<K> {
    fn decide_kind(
        &self,
        key: &K,
        rule: &impl TwoKind,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision;
}

impl<K: Hash + Eq + Clone> KeysTwo<K> for MemoryStore<K, Two> {
    #[inline]
    fn decide_kind(
        &self,
        key: &K,
        rule: &impl TwoKind,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        // As `MemoryStore::decide`, with the quota as its own kind.
        let hash = self.table.hash(key);
        let swept = self.sweep_time(now);
        if let Some(said) = self
            .table
            .get(hash, key, swept, |slot| slot.step_kind(rule, now, cost))
        {
            return decision_two(said, cost);
        }
        self.decide_absent(hash, key, &rule.rule(), clock, now, cost)
    }
}

impl<K> KeysTwo<K> for Direct<Two> {
    #[inline]
    fn decide_kind(&self, _: &K, rule: &impl TwoKind, _: &Clock, now: u64, cost: u32) -> Decision {
        decision_two(self.slot.step_kind(rule, now, cost), cost)
    }
}

/// A check of `key` in the keys `S` of a policy of one quota kept in two words.
struct CheckTwo<'a, K, S> {
    keys: &'a S,
    key: &'a K,
    clock: &'a Clock,
    now: u64,
    cost: u32,
}

impl<'a, K, S: KeysTwo<K>> CheckTwo<'a, K, S> {
    #[inline]
    fn new(keys: &'a S, key: &'a K, clock: &'a Clock, now: u64, cost: u32) -> Self {
        CheckTwo {
            keys,
            key,
            clock,
            now,
            cost,
        }
    }
}

impl<K, S: KeysTwo<K>> WithKind for CheckTwo<'_, K, S> {
    type Out = Decision;

    #[inline]
    fn with<R: TwoKind>(self, rule: &R) -> Decision {
        self.keys
            .decide_kind(self.key, rule, self.clock, self.now, self.cost)
    }
}

/// Decides the single GCRA quota `g` on `slot` (a single key's).
#[inline]
pub(super) fn decide_one(slot: &One, g: &Gcra, now: u64, cost: u32) -> Decision {
    slot.decide(g, now, cost)
}

/// The keys' times, on the crate's keyed table.
///
/// The in-memory store: one word per key for single-quota policies, on the crate's keyed table
/// (`crate::keyed`).
///
/// * **Hot path.** A decision on a tracked key takes its shard's lock for reading and updates the
///   key's time with one compare-and-swap (single quota) or under the key's own small lock
///   (several quotas, so that they change together). Rejections write nothing.
/// * **Idle keys.** A key whose every time is in the past decides exactly like an absent key, so
///   the table drops such entries whenever it needs room or a shard's sweep is due, with no
///   background task. [`crate::RateLimiter::evict_idle`] sweeps every shard on demand.
/// * **Bound.** At most `max_keys` keys are tracked, over the whole store; see [`OnFull`].
pub(crate) struct MemoryStore<K, V> {
    table: Table<K, V>,
    /// How much earlier than the clock the table sweeps, for a while (see [`widen`]).
    ///
    /// [`widen`]: MemoryStore::widen
    lag: Lag,
}

/// How much earlier than the clock a store of keys sweeps for a while after a change of
/// rules that may make a key idle later than it stored (see [`MemoryStore::widen`]): a
/// table's, and the single key's slot, which must forget its key when a table would.
#[derive(Default)]
pub(crate) struct Lag {
    until: AtomicU64,
    by: AtomicU64,
}

impl Lag {
    /// From `now` until `until`, sweep as if the clock were `lag` earlier. Two widenings
    /// that overlap add up, and the later end holds: a key stored before the first and judged
    /// by the rules of the second may become idle as much later as both widened together
    /// (a window narrowed and widened again before the key idles needs the sum of the
    /// steps up, not the largest).
    pub(crate) fn widen(&self, now: u64, lag: u64, until: u64) {
        if lag == 0 {
            return;
        }
        let (was_lag, was_until) = (
            self.by.load(Ordering::Acquire),
            self.until.load(Ordering::Acquire),
        );
        let (lag, until) = if now < was_until {
            (lag.saturating_add(was_lag), until.max(was_until))
        } else {
            (lag, until)
        };
        self.by.store(lag, Ordering::Release);
        self.until.store(until, Ordering::Release);
    }

    /// The time to sweep at when the clock says `now`.
    #[inline]
    pub(crate) fn sweep_time(&self, now: u64) -> u64 {
        if now < self.until.load(Ordering::Acquire) {
            now.saturating_sub(self.by.load(Ordering::Acquire))
        } else {
            now
        }
    }

    /// The first reading of the clock at which the store sweeps at `at` or later (the
    /// inverse of [`sweep_time`](Self::sweep_time)): a key idle at `at` by the table's times
    /// is dropped then, `by` later while lagging, or once the lag ends.
    pub(crate) fn clock_time(&self, at: u64) -> u64 {
        let until = self.until.load(Ordering::Acquire);
        match at.saturating_add(self.by.load(Ordering::Acquire)) {
            lagged if lagged < until => lagged,
            _ => until.max(at),
        }
    }
}

impl<K, V> MemoryStore<K, V>
where
    K: Hash + Eq + Clone,
    V: Slot + crate::keyed::Entry,
{
    pub(crate) fn new(max_keys: usize, on_full: OnFull) -> Self {
        MemoryStore {
            table: Table::new(max_keys, on_full),
            lag: Lag::default(),
        }
    }

    /// Tells the store that from `now` on, until `until`, a key whose idle time was stored
    /// before may become idle up to `lag` later than it says (a sliding window was widened,
    /// or a warm-up curve changed, and such kinds are judged by the rules in force): until
    /// then, the table sweeps as if the clock were `lag` earlier, so that no sweep drops a
    /// key whose state still counts, and eviction changes no decision.
    pub(crate) fn widen(&self, now: u64, lag: u64, until: u64) {
        self.lag.widen(now, lag, until);
    }

    /// The time the table sweeps at when the clock says `now` (see [`widen`](Self::widen)).
    #[inline]
    pub(crate) fn sweep_time(&self, now: u64) -> u64 {
        self.lag.sweep_time(now)
    }

    /// Decides a request of `cost` for `key` at `now`, read from `clock` before the call. A key
    /// that is not tracked is decided at a reading of `clock` taken under the table's lock, so
    /// that a sweep made at a later time than `now` (which may have dropped the key) is never
    /// followed by a decision from an earlier state.
    #[inline]
    pub(crate) fn decide(
        &self,
        key: &K,
        gcras: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        if V::IN_PLACE {
            if std::mem::size_of::<K>() == 0 {
                // A key type of one value keeps its key in a slot of its own, never in a
                // table (`State::new`): its check does not hold this path in line.
                return self.decide_out_of_line(key, gcras, clock, now, cost);
            }
            return self.decide_in_place(key, gcras, clock, now, cost);
        }
        let hash = self.table.hash(key);
        let swept = self.sweep_time(now);
        // The table hands out what the slot said (small), and the decision is built here.
        if let Some(said) = self
            .table
            .get(hash, key, swept, |slot| slot.step(gcras, now, cost))
        {
            return V::decision(gcras, said, now, cost);
        }
        self.decide_absent(hash, key, gcras, clock, now, cost)
    }

    /// [`decide`](Self::decide) for a slot that writes its decision in place
    /// ([`Slot::IN_PLACE`]): into the one the caller returns.
    #[inline]
    fn decide_in_place(
        &self,
        key: &K,
        rules: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        // Written whole by every path below; made in line (a decision allowed on no quota).
        let mut d = Decision::new(
            Outcome::Allowed,
            0,
            Default::default(),
            0,
            Reservation::none(),
        );
        self.decide_to(key, rules, clock, now, cost, &mut d);
        d
    }

    /// [`decide_in_place`](Self::decide_in_place), into `d`, which it writes whole.
    #[inline]
    pub(super) fn decide_to(
        &self,
        key: &K,
        rules: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
        d: &mut Decision,
    ) {
        let hash = self.table.hash(key);
        let swept = self.sweep_time(now);
        if self
            .table
            .get(hash, key, swept, |slot| {
                slot.decide_into(rules, now, cost, d)
            })
            .is_none()
        {
            *d = self.decide_absent(hash, key, rules, clock, now, cost);
        }
    }

    /// [`decide_in_place`](Self::decide_in_place), out of line.
    #[inline(never)]
    fn decide_out_of_line(
        &self,
        key: &K,
        rules: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        self.decide_in_place(key, rules, clock, now, cost)
    }

    /// Gives back `units` of the request that took `taken` from `key` (see
    /// [`Reservation`]); a key without an entry is idle and has nothing to give back.
    pub(crate) fn refund(
        &self,
        key: &K,
        gcras: &V::Rules,
        now: u64,
        taken: &Reservation,
        units: u32,
    ) {
        let hash = self.table.hash(key);
        let swept = self.sweep_time(now);
        self.table.get_lowering(hash, key, swept, |slot| {
            slot.refund(gcras, now, taken, units)
        });
    }

    /// As [`decide`](Self::decide), for a request whose cost may be charged after its
    /// response (a settlement): such a request holds a place for its key even at a cost of 0,
    /// so a key without an entry is admitted only if the table has room for it now. Under
    /// [`OnFull::RejectNewKeys`] a table full of active keys turns it away like any new key.
    pub(crate) fn reserve(
        &self,
        key: &K,
        rules: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        if cost > 0 {
            return self.decide(key, rules, clock, now, cost);
        }
        let hash = self.table.hash(key);
        // The table reads and makes room at the sweep time, as on every path.
        if let Some(d) = self.table.get(hash, key, self.sweep_time(now), |slot| {
            slot.decide(rules, now, 0)
        }) {
            return d;
        }
        let (decision, _) = V::decide_absent(rules, now, 0);
        let at = clock.now().max(now);
        let swept = self.sweep_time(at);
        match self.table.room(swept) {
            Ok(()) => decision,
            Err(full) => V::full(rules, self.full_wait(at, full)),
        }
    }

    /// Takes `cost` from `key` whatever its state (see [`Gcra::charged`]).
    ///
    /// A key without an entry needs a place like any new key, and never one beyond
    /// `max_keys`: under [`OnFull::EvictNearestIdle`] it takes the place of the key nearest to
    /// idle; under [`OnFull::RejectNewKeys`], when every tracked key is active, the charge is
    /// not kept. That key was admitted when its state was that of a key never seen and the
    /// table had room (see [`reserve`](Self::reserve)); losing the debt lets it start from a
    /// full burst again, as an evicted key does.
    pub(crate) fn charge(&self, key: &K, rules: &V::Rules, clock: &Clock, now: u64, cost: u32) {
        let hash = self.table.hash(key);
        let charge = |slot: &V, now: u64| slot.charge(rules, now, cost);
        if self
            .table
            .get(hash, key, self.sweep_time(now), |slot| charge(slot, now))
            .is_some()
        {
            return;
        }
        // The table reads and sweeps at the sweep time; the key is charged at the clock's,
        // the same reading, taken once under the lock.
        let at = Cell::new(now);
        let _ = self.table.upsert(
            hash,
            key,
            false,
            || {
                at.set(clock.now().max(now));
                self.sweep_time(at.get())
            },
            |slot, _| charge(&*slot, at.get()),
            |_| Absent::Insert((), V::charged_absent(rules, at.get(), cost)),
        );
    }

    /// The path of a key without an entry: decided as an idle key; only an admitted request
    /// needs an entry. Kept out of line so the lookup above stays small.
    #[cold]
    #[inline(never)]
    fn decide_absent(
        &self,
        hash: u64,
        key: &K,
        gcras: &V::Rules,
        clock: &Clock,
        now: u64,
        cost: u32,
    ) -> Decision {
        // Rejected whatever the time (a cost above the burst): nothing to insert.
        let (decision, slot) = V::decide_absent(gcras, now, cost);
        if slot.is_none() {
            return decision;
        }
        // The table reads and sweeps at the sweep time; the key is decided at the clock's,
        // the same reading, taken once under the lock.
        let at = Cell::new(now);
        let result = self.table.upsert(
            hash,
            key,
            false,
            || {
                at.set(clock.now().max(now));
                self.sweep_time(at.get())
            },
            |slot, _| slot.decide(gcras, at.get(), cost),
            |_| match V::decide_absent(gcras, at.get(), cost) {
                (d, Some(slot)) => Absent::Insert(d, slot),
                (d, None) => Absent::Done(d),
            },
        );
        match result {
            Ok(d) => d,
            Err(full) => V::full(gcras, self.full_wait(at.get(), full)),
        }
    }

    /// The table of the keys' times.
    pub(crate) fn table(&self) -> &Table<K, V> {
        &self.table
    }

    /// Nanoseconds from `now`, a reading of the clock, until the table drops an entry gone
    /// idle (`u64::MAX`: none): the entries' times are the table's, which sweeps behind the
    /// clock for a while after a widening, so the first of them is told on the clock.
    pub(crate) fn idle_in(&self, now: u64) -> u64 {
        let swept = self.sweep_time(now);
        match self.table.idle_in(swept) {
            u64::MAX => u64::MAX,
            d => self
                .lag
                .clock_time(swept.saturating_add(d))
                .saturating_sub(now),
        }
    }

    /// The wait of a new key turned away by the table when the clock said `now`: until a
    /// place frees, the earlier of the instant the table drops its first entry gone idle (a
    /// time of the table, told on the clock) and the first place to free in another table
    /// sharing its bound.
    fn full_wait(&self, now: u64, full: Full) -> u64 {
        let own = self.lag.clock_time(full.retry_at);
        full_retry(now, own.min(now.saturating_add(full.elsewhere)))
    }

    /// Drops every idle entry now; returns how many keys are still tracked.
    pub(crate) fn evict_idle(&self, now: u64) -> usize {
        self.table.evict_idle(self.sweep_time(now))
    }

    /// The number of tracked keys (idle ones included until they are swept).
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// The wait of a new key turned away because the store is full of active keys: retry when
/// the first tracked key goes idle (`retry_at`, a reading of the clock), since a new key is
/// admitted then.
fn full_retry(now: u64, retry_at: u64) -> u64 {
    retry_at.saturating_sub(now).max(1)
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
        crate::limiter::test_builder(quotas, clock).build()
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

#[cfg(test)]
mod store_tests {
    use super::*;
    use crate::algo::{self, KeyState};

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_decision_read_before_a_later_sweep_never_admits_beyond_the_burst() {
        // 1 per second, burst 1. A thread reads the clock at 0.5 s, then stalls; meanwhile the
        // clock reaches 1 s, the key (spent at 0) is swept as idle, and the stalled thread goes
        // on with its reading of 0.5 s.
        let (clock, hand) = Clock::manual();
        let gcras = Gcra::new(S, S);
        let store = MemoryStore::<u64, One>::new(10, OnFull::EvictNearestIdle);
        hand.set(std::time::Duration::ZERO);
        assert!(store.decide(&7, &gcras, &clock, 0, 1).is_allowed());
        hand.set(std::time::Duration::from_secs(1));
        assert_eq!(store.evict_idle(S), 0);
        assert!(store.decide(&7, &gcras, &clock, S / 2, 1).is_allowed());
        // That admission happened at 1 s at the earliest, so nothing more before 2 s.
        hand.set(std::time::Duration::from_millis(1_500));
        assert!(!store.decide(&7, &gcras, &clock, 3 * S / 2, 1).is_allowed());
        hand.set(std::time::Duration::from_secs(2));
        assert!(store.decide(&7, &gcras, &clock, 2 * S, 1).is_allowed());
    }
    #[test]
    fn a_charge_of_a_new_key_never_passes_max_keys_under_reject_new_keys() {
        let (clock, _hand) = Clock::manual();
        let g = Gcra::new(S, 10 * S);
        let store = MemoryStore::<u64, One>::new(2, OnFull::RejectNewKeys);
        let now = clock.now();
        for key in 0..50 {
            store.charge(&key, &g, &clock, now, 5);
            assert!(store.len() <= 2);
        }
        // The two charges kept stand; the others were not kept.
        let d = store.decide(&0, &g, &clock, now, 6);
        assert!(!d.is_allowed(), "{d:?}");
        let d = store.decide(&0, &g, &clock, now, 5);
        assert!(d.is_allowed(), "{d:?}");
        // A zero reservation of a new key finds no room; of a tracked key it does.
        assert!(store.reserve(&7, &g, &clock, now, 0).is_store_full());
        assert!(store.reserve(&1, &g, &clock, now, 0).is_allowed());
    }

    proptest::proptest! {
        /// Decisions, zero reservations, charges and refunds of random keys at random times:
        /// the table never holds more than `max_keys`, under either policy.
        #[test]
        fn no_path_inserts_past_max_keys(
            reject in proptest::bool::ANY,
            ops in proptest::collection::vec((0u8..4, 0u64..12, 0u32..4, 0u64..3), 1..200),
        ) {
            let (clock, hand) = Clock::manual();
            let on_full = if reject { OnFull::RejectNewKeys } else { OnFull::EvictNearestIdle };
            let rules = [Rule::Gcra(Gcra::new(S, 2 * S)), Rule::Gcra(Gcra::new(2 * S, 4 * S))];
            let store = MemoryStore::<u64, Mixed>::new(3, on_full);
            let mut now = 0;
            for (op, key, cost, dt) in ops {
                now += dt * S / 2;
                hand.set(std::time::Duration::from_nanos(now));
                match op {
                    0 => drop(store.decide(&key, &rules, &clock, now, cost)),
                    1 => drop(store.reserve(&key, &rules, &clock, now, 0)),
                    2 => store.charge(&key, &rules, &clock, now, cost * 5),
                    _ => {
                        let d = store.decide(&key, &rules, &clock, now, cost);
                        let taken = crate::decision::Reservation::of(&d, cost);
                        store.refund(&key, &rules, now, &taken, cost)
                    }
                }
                proptest::prop_assert!(store.len() <= 3, "{} keys", store.len());
            }
        }
    }

    #[test]
    fn a_policy_of_one_quota_in_two_words_keeps_each_key_in_two_words() {
        use crate::quota::Quota;
        use std::time::Duration;
        let second = Duration::from_secs(1);
        for q in [
            Quota::fixed_window(3, second),
            Quota::sliding_window(3, second),
            Quota::new(3, second).warm_up(Duration::from_secs(60), 3),
        ] {
            let limits = Limits::new(vec![q]);
            let keyed = State::<u64>::new(&limits, 10, OnFull::EvictNearestIdle);
            assert!(matches!(keyed.0, Shape::Two(_)));
            let direct = State::<()>::new(&limits, 10, OnFull::EvictNearestIdle);
            assert!(matches!(direct.0, Shape::DirectTwo(_)));
        }
        let log = Limits::new(vec![Quota::sliding_log(3, second)]);
        let keyed = State::<u64>::new(&log, 10, OnFull::EvictNearestIdle);
        assert!(matches!(keyed.0, Shape::Mixed(_)));
    }

    #[test]
    fn a_key_of_any_kinds_takes_no_more_room_in_the_table_than_two_words_and_their_lock() {
        // Two words, their lock and the idle time (32 bytes), and which slot it is.
        assert!(
            std::mem::size_of::<Two>() <= 40,
            "{}",
            std::mem::size_of::<Two>()
        );
        assert_eq!(std::mem::size_of::<Mixed>(), std::mem::size_of::<usize>());
    }

    fn one_quota_in_two_words() -> impl proptest::strategy::Strategy<Value = Rule> {
        use crate::algo::warmup::{Curve, WarmGcra};
        use crate::algo::Window;
        use proptest::prelude::*;
        prop_oneof![
            (1u64..4, 1u64..4).prop_map(|(n, w)| Rule::FixedWindow(Window::new(n, w * S))),
            (1u64..4, 1u64..4).prop_map(|(n, w)| Rule::SlidingWindow(Window::new(n, w * S))),
            (1u64..4, 1u32..4).prop_map(|(b, f)| Rule::WarmUp(WarmGcra::new(
                Curve::new(S, 4 * S, f, 1_000),
                b * S
            ))),
        ]
    }

    proptest::proptest! {
        /// A policy of one quota kept in two words decides, refunds and charges in its own
        /// small slot exactly as the general state of any policy does, through any sequence
        /// (decisions equal, with what each admission took).
        #[test]
        fn a_two_word_slot_keeps_the_account_of_the_general_state(
            rule in one_quota_in_two_words(),
            ops in proptest::collection::vec((0u8..4, 0u32..4, 0u64..4), 1..120),
        ) {
            let (clock, hand) = Clock::manual();
            let rules = [rule];
            let store = MemoryStore::<u64, Two>::new(4, OnFull::EvictNearestIdle);
            let mut model = KeyState::default();
            let mut now = S;
            let mut taken = Vec::new();
            for (op, cost, dt) in ops {
                now += dt * S / 4;
                hand.set(std::time::Duration::from_nanos(now));
                match op {
                    0 | 1 => {
                        let d = store.decide(&1, &rules[0], &clock, now, cost);
                        let (m, _) = algo::decide(&rules, &mut model, now, cost);
                        proptest::prop_assert_eq!(d, m);
                        proptest::prop_assert_eq!(Reservation::of(&d, cost), Reservation::of(&m, cost));
                        if d.is_allowed() {
                            taken.push(Reservation::of(&d, cost));
                        }
                    }
                    2 => {
                        if let Some(t) = taken.pop() {
                            store.refund(&1, &rules[0], now, &t, cost);
                            model.refund(&rules, now, &t, cost);
                        }
                    }
                    _ => {
                        store.charge(&1, &rules[0], &clock, now, cost);
                        model.charge(&rules, now, cost);
                    }
                }
            }
        }

        /// The general slot writes its decision where the store's caller keeps it
        /// (`Slot::IN_PLACE`): through any sequence of checks, refunds and charges on a few
        /// keys of a policy of one or several kinds (a log among them), with keys dropped
        /// when idle, every decision is the general rule's on the key's own state.
        #[test]
        fn the_general_slot_decides_in_place_as_the_general_rule(
            kinds in proptest::collection::vec(0u8..5, 1..4),
            ops in proptest::collection::vec((0u8..4, 0u64..3, 0u32..4, 0u64..4), 1..120),
        ) {
            use crate::algo::warmup::{Curve, WarmGcra};
            use crate::algo::Window;
            let rules: Vec<Rule> = kinds
                .iter()
                .map(|k| match k {
                    0 => Rule::Gcra(Gcra::new(S, 2 * S)),
                    1 => Rule::FixedWindow(Window::new(3, 2 * S)),
                    2 => Rule::SlidingWindow(Window::new(3, 2 * S)),
                    3 => Rule::SlidingLog(Window::new(3, 2 * S)),
                    _ => Rule::WarmUp(WarmGcra::new(Curve::new(S, 4 * S, 2, 1_000), 2 * S)),
                })
                .collect();
            let (clock, hand) = Clock::manual();
            let store = MemoryStore::<u64, Mixed>::new(8, OnFull::EvictNearestIdle);
            let mut models = [KeyState::default(), KeyState::default(), KeyState::default()];
            let mut now = S;
            let mut taken: Vec<(u64, Reservation)> = Vec::new();
            for (op, key, cost, dt) in ops {
                now += dt * S / 4;
                hand.set(std::time::Duration::from_nanos(now));
                // A key the table dropped was idle: its model starts again as one never seen.
                for (k, m) in models.iter_mut().enumerate() {
                    if m.idle_at(&rules) <= now {
                        *m = KeyState::default();
                        taken.retain(|(t, _)| *t != k as u64);
                    }
                }
                let model = &mut models[key as usize];
                match op {
                    0 | 1 => {
                        let d = store.decide(&key, &rules[..], &clock, now, cost);
                        let (m, _) = algo::decide(&rules, model, now, cost);
                        proptest::prop_assert_eq!(d, m);
                        if d.is_allowed() {
                            taken.push((key, Reservation::of(&d, cost)));
                        }
                    }
                    2 => {
                        if let Some(i) = taken.iter().rposition(|(k, _)| *k == key) {
                            let (_, t) = taken.remove(i);
                            store.refund(&key, &rules[..], now, &t, cost);
                            model.refund(&rules, now, &t, cost);
                        }
                    }
                    _ => {
                        store.charge(&key, &rules[..], &clock, now, cost);
                        model.charge(&rules, now, cost);
                    }
                }
            }
        }
    }
}
