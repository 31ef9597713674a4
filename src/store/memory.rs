//! The in-memory store: one word per key for single-quota policies, on the crate's keyed table
//! (`crate::keyed`).
//!
//! * **Hot path.** A decision on a tracked key takes its shard's lock for reading and updates the
//!   key's time with one compare-and-swap (single quota) or under the key's own small lock
//!   (several quotas, so that they change together). Rejections write nothing.
//! * **Idle keys.** A key whose every time is in the past decides exactly like an absent key, so
//!   the table drops such entries whenever it needs room or a shard's sweep is due, with no
//!   background task. [`crate::RateLimiter::evict_idle`] sweeps every shard on demand.
//! * **Bound.** At most `max_keys` keys are tracked, over the whole store; see [`OnFull`].

use std::cell::Cell;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::algo::gcra::{self, Gcra};
use crate::algo::{self, KeyState, Rule, Words};
use crate::clock::Clock;
use crate::decision::{Decision, Reservation, MAX_QUOTAS};
pub use crate::keyed::OnFull;
use crate::keyed::{Absent, Table};

/// Per-key state: what each quota of the policy needs to decide.
pub(crate) trait Slot: Send + Sync + Sized {
    /// The policy's quotas as this slot reads them.
    type Rules: ?Sized + Sync;
    /// Decides for a key that has no entry; returns the entry to insert when admitted.
    fn decide_absent(rules: &Self::Rules, now: u64, cost: u32) -> (Decision, Option<Self>);
    /// Decides under shared access; must be atomic for the key.
    fn decide(&self, rules: &Self::Rules, now: u64, cost: u32) -> Decision;
    /// When the key becomes equal to one never seen, if nothing else happens to it.
    fn horizon(&self) -> u64;
    /// Gives back `units` of the request that took `taken`: only what still counts at `now`
    /// (see [`Reservation`]). Atomic for the key.
    fn refund(&self, rules: &Self::Rules, now: u64, taken: &Reservation, units: u32);
    /// Takes `cost` whatever the state (see [`Gcra::charged`]). Atomic for the key.
    fn charge(&self, rules: &Self::Rules, now: u64, cost: u32);
    /// The entry of a key without one once `cost` is taken whatever the limit.
    fn charged_absent(rules: &Self::Rules, now: u64, cost: u32) -> Self;
    /// The decision for a new key turned away because the store is full.
    fn full(rules: &Self::Rules, retry_after: u64) -> Decision;
}

/// One quota: the whole state is one word, updated by compare-and-swap.
pub(crate) struct One(AtomicU64);

impl One {
    pub(crate) fn idle() -> Self {
        One(AtomicU64::new(0))
    }

    /// Reads the key's time, decides through `f` what to store in its place (nothing: leave
    /// it), and replaces it, unless another thread replaced it first: then decides again on
    /// what that thread stored. Returns what `f` said last and the time it was given.
    #[inline]
    fn measure_and_replace<T>(&self, mut f: impl FnMut(u64) -> (T, Option<u64>)) -> (T, u64) {
        let mut old = self.0.load(Ordering::Acquire);
        loop {
            let (said, new) = f(old);
            let new = match new {
                Some(new) if new != old => new,
                _ => return (said, old),
            };
            match self
                .0
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (said, old),
                Err(actual) => old = actual,
            }
        }
    }
}

impl Slot for One {
    type Rules = Gcra;

    #[inline]
    fn decide_absent(g: &Gcra, now: u64, cost: u32) -> (Decision, Option<Self>) {
        let (d, store) = gcra::decide_one(g, 0, now, cost);
        (d, store.map(|t| One(AtomicU64::new(t))))
    }

    #[inline]
    fn decide(&self, g: &Gcra, now: u64, cost: u32) -> Decision {
        // The step is retried; the decision, many words, is built once.
        let (step, tat) = self.measure_and_replace(|tat| {
            let step = gcra::step_one(g, tat, now, cost);
            (step, step.2)
        });
        gcra::decision_one(g, tat, now, cost, step)
    }

    fn horizon(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn refund(&self, _: &Gcra, now: u64, taken: &Reservation, units: u32) {
        self.measure_and_replace(|tat| {
            let back = gcra::refunded(tat, now, taken.spots[0], taken.cost, units);
            ((), Some(back))
        });
    }

    fn charge(&self, g: &Gcra, now: u64, cost: u32) {
        self.measure_and_replace(|tat| ((), Some(g.charged(tat, now, cost))));
    }

    fn charged_absent(g: &Gcra, now: u64, cost: u32) -> Self {
        One(AtomicU64::new(g.charged(0, now, cost)))
    }

    fn full(g: &Gcra, retry_after: u64) -> Decision {
        Decision::store_full(&[Rule::Gcra(*g)], retry_after)
    }
}

/// Several quotas: the times change together under the key's own lock.
pub(crate) struct Many(Mutex<[u64; MAX_QUOTAS]>);

impl Many {
    pub(crate) fn idle() -> Self {
        Many(Mutex::new([0; MAX_QUOTAS]))
    }

    /// Reads the key's times and replaces them through `f`, under the key's lock.
    fn measure_and_replace<T>(&self, f: impl FnOnce(&mut [u64; MAX_QUOTAS]) -> T) -> T {
        // A poisoned lock only means another thread panicked between two plain stores of
        // `u64`s; the values are still valid times.
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Slot for Many {
    type Rules = [Gcra];

    fn decide_absent(gcras: &[Gcra], now: u64, cost: u32) -> (Decision, Option<Self>) {
        let mut tats = [0u64; MAX_QUOTAS];
        let (d, changed) = gcra::decide(gcras, &mut tats[..gcras.len()], now, cost);
        (d, changed.then(|| Many(Mutex::new(tats))))
    }

    fn decide(&self, gcras: &[Gcra], now: u64, cost: u32) -> Decision {
        self.measure_and_replace(|tats| gcra::decide(gcras, &mut tats[..gcras.len()], now, cost).0)
    }

    fn horizon(&self) -> u64 {
        self.measure_and_replace(|tats| tats.iter().copied().max().unwrap_or(0))
    }

    fn refund(&self, gcras: &[Gcra], now: u64, taken: &Reservation, units: u32) {
        self.measure_and_replace(|tats| {
            for (tat, spot) in tats.iter_mut().zip(&taken.spots).take(gcras.len()) {
                *tat = gcra::refunded(*tat, now, *spot, taken.cost, units);
            }
        })
    }

    fn charge(&self, gcras: &[Gcra], now: u64, cost: u32) {
        self.measure_and_replace(|tats| {
            for (tat, g) in tats.iter_mut().zip(gcras) {
                *tat = g.charged(*tat, now, cost);
            }
        })
    }

    fn charged_absent(gcras: &[Gcra], now: u64, cost: u32) -> Self {
        let mut tats = [0u64; MAX_QUOTAS];
        for (tat, g) in tats.iter_mut().zip(gcras) {
            *tat = g.charged(0, now, cost);
        }
        Many(Mutex::new(tats))
    }

    fn full(gcras: &[Gcra], retry_after: u64) -> Decision {
        let mut rules = [Rule::Gcra(Gcra::new(1, 1)); MAX_QUOTAS];
        for (r, g) in rules.iter_mut().zip(gcras) {
            *r = Rule::Gcra(*g);
        }
        Decision::store_full(&rules[..gcras.len()], retry_after)
    }
}

/// Quotas of any kinds (see [`crate::algo`]), changed together under the key's own lock.
///
/// A policy of one quota kept in two words (a fixed window, a sliding-window counter or a
/// warm-up quota) keeps just those words, as GCRA keeps one: a quarter of the memory of the
/// general state, and no loop over quotas nor log to read. Any other policy keeps two words per quota and the log
/// of admitted requests when a quota is a sliding log. The kinds of a policy never change
/// while it serves, so a key's slot fits its policy for as long as it lives. The time the key
/// becomes idle is kept beside the state, for the table to read without the quotas.
pub(crate) enum Mixed {
    Two(Kept<Words>),
    /// Boxed, so that the table's entries are the size of the small slot.
    Any(Box<Kept<KeyState>>),
}

/// A key's state under its lock, and when it becomes idle.
pub(crate) struct Kept<S> {
    state: Mutex<S>,
    horizon: AtomicU64,
}

impl<S> Kept<S> {
    fn new(state: S, horizon: u64) -> Self {
        Kept {
            state: Mutex::new(state),
            horizon: AtomicU64::new(horizon),
        }
    }

    /// Reads the key's state and replaces it through `f`, under the key's lock, then keeps
    /// the time the key becomes idle (`idle_at`) beside it.
    #[inline]
    fn measure_and_replace<T>(
        &self,
        f: impl FnOnce(&mut S) -> T,
        idle_at: impl FnOnce(&S) -> u64,
    ) -> T {
        // A poisoned lock only means another thread panicked while deciding; the state is
        // still a valid state (every change is made after the decision's arithmetic).
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let said = f(&mut state);
        self.horizon.store(idle_at(&state), Ordering::Release);
        said
    }
}

impl Mixed {
    pub(crate) fn idle() -> Self {
        Mixed::Any(Box::new(Kept::new(KeyState::default(), 0)))
    }

    /// The slot a key of policy `rules` keeps once `change` is made to a state never seen,
    /// if it says so (what it says comes back beside it).
    #[inline]
    fn made<T>(
        rules: &[Rule],
        two: impl FnOnce(&Rule, &mut Words) -> (T, bool),
        any: impl FnOnce(&mut KeyState) -> (T, bool),
    ) -> (T, Option<Self>) {
        match rules {
            [rule] if rule.in_two_words() => {
                let mut words = [0; 2];
                let (said, keep) = two(rule, &mut words);
                let slot = keep.then(|| Mixed::Two(Kept::new(words, rule.idle_at_two(words))));
                (said, slot)
            }
            _ => {
                let mut state = KeyState::default();
                let (said, keep) = any(&mut state);
                let slot = keep.then(|| {
                    let horizon = state.idle_at(rules);
                    Mixed::Any(Box::new(Kept::new(state, horizon)))
                });
                (said, slot)
            }
        }
    }

    /// Changes the key's state through `two` (a slot of two words: with its only quota) or
    /// `any`, under its lock.
    #[inline]
    fn change<T>(
        &self,
        rules: &[Rule],
        two: impl FnOnce(&Rule, &mut Words) -> T,
        any: impl FnOnce(&mut KeyState) -> T,
    ) -> T {
        match (self, rules) {
            (Mixed::Two(kept), [rule, ..]) => {
                kept.measure_and_replace(|w| two(rule, w), |w| rule.idle_at_two(*w))
            }
            (Mixed::Two(kept), []) => {
                kept.measure_and_replace(|_| any(&mut KeyState::default()), |_| 0)
            }
            (Mixed::Any(kept), _) => kept.measure_and_replace(any, |s| s.idle_at(rules)),
        }
    }
}

impl Slot for Mixed {
    type Rules = [Rule];

    fn decide_absent(rules: &[Rule], now: u64, cost: u32) -> (Decision, Option<Self>) {
        Mixed::made(
            rules,
            |rule, words| algo::decide_two(rule, words, now, cost),
            |state| algo::decide(rules, state, now, cost),
        )
    }

    #[inline]
    fn decide(&self, rules: &[Rule], now: u64, cost: u32) -> Decision {
        self.change(
            rules,
            |rule, words| algo::decide_two(rule, words, now, cost).0,
            |state| algo::decide(rules, state, now, cost).0,
        )
    }

    fn horizon(&self) -> u64 {
        match self {
            Mixed::Two(kept) => kept.horizon.load(Ordering::Acquire),
            Mixed::Any(kept) => kept.horizon.load(Ordering::Acquire),
        }
    }

    fn refund(&self, rules: &[Rule], now: u64, taken: &Reservation, units: u32) {
        self.change(
            rules,
            |rule, words| *words = rule.refund_two(*words, now, taken, units),
            |state| state.refund(rules, now, taken, units),
        )
    }

    fn charge(&self, rules: &[Rule], now: u64, cost: u32) {
        self.change(
            rules,
            |rule, words| *words = rule.charge(*words, now, cost),
            |state| state.charge(rules, now, cost),
        )
    }

    fn charged_absent(rules: &[Rule], now: u64, cost: u32) -> Self {
        let (_, slot) = Mixed::made(
            rules,
            |rule, words| {
                *words = rule.charge(*words, now, cost);
                ((), true)
            },
            |state| {
                state.charge(rules, now, cost);
                ((), true)
            },
        );
        slot.unwrap_or_else(Mixed::idle)
    }

    fn full(rules: &[Rule], retry_after: u64) -> Decision {
        Decision::store_full(rules, retry_after)
    }
}

impl crate::keyed::Entry for One {
    #[inline]
    fn idle_at(&self) -> u64 {
        self.horizon()
    }
}

impl crate::keyed::Entry for Many {
    fn idle_at(&self) -> u64 {
        self.horizon()
    }
}

impl crate::keyed::Entry for Mixed {
    fn idle_at(&self) -> u64 {
        self.horizon()
    }
}

/// The keys' times, on the crate's keyed table.
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
    /// From `now` until `until`, sweep as if the clock were `lag` earlier (the larger lag
    /// and the later end of two that overlap).
    pub(crate) fn widen(&self, now: u64, lag: u64, until: u64) {
        if lag == 0 {
            return;
        }
        let (was_lag, was_until) = (
            self.by.load(Ordering::Acquire),
            self.until.load(Ordering::Acquire),
        );
        let (lag, until) = if now < was_until {
            (lag.max(was_lag), until.max(was_until))
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
        let hash = self.table.hash(key);
        let swept = self.sweep_time(now);
        if let Some(d) = self
            .table
            .get(hash, key, swept, |slot| slot.decide(gcras, now, cost))
        {
            return d;
        }
        self.decide_absent(hash, key, gcras, clock, now, cost)
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
        let swept = self.sweep_time(clock.now().max(now));
        match self.table.room(swept) {
            Ok(()) => decision,
            Err(full) => V::full(rules, full_retry(swept, full.retry_at)),
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
            Err(full) => V::full(gcras, full_retry(self.sweep_time(at.get()), full.retry_at)),
        }
    }

    /// The table of the keys' times.
    pub(crate) fn table(&self) -> &Table<K, V> {
        &self.table
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
/// the first tracked key goes idle (`retry_at`), since a new key is admitted then.
fn full_retry(now: u64, retry_at: u64) -> u64 {
    retry_at.saturating_sub(now).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_key_of_any_kinds_takes_no_more_room_in_the_table_than_two_words_and_their_lock() {
        // Two words, their lock and the idle time (32 bytes), and which slot it is.
        assert!(
            std::mem::size_of::<Mixed>() <= 40,
            "{}",
            std::mem::size_of::<Mixed>()
        );
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
            let store = MemoryStore::<u64, Mixed>::new(4, OnFull::EvictNearestIdle);
            let mut model = KeyState::default();
            let mut now = S;
            let mut taken = Vec::new();
            for (op, cost, dt) in ops {
                now += dt * S / 4;
                hand.set(std::time::Duration::from_nanos(now));
                match op {
                    0 | 1 => {
                        let d = store.decide(&1, &rules, &clock, now, cost);
                        let (m, _) = algo::decide(&rules, &mut model, now, cost);
                        proptest::prop_assert_eq!(d, m);
                        proptest::prop_assert_eq!(Reservation::of(&d, cost), Reservation::of(&m, cost));
                        if d.is_allowed() {
                            taken.push(Reservation::of(&d, cost));
                        }
                    }
                    2 => {
                        if let Some(t) = taken.pop() {
                            store.refund(&1, &rules, now, &t, cost);
                            model.refund(&rules, now, &t, cost);
                        }
                    }
                    _ => {
                        store.charge(&1, &rules, &clock, now, cost);
                        model.charge(&rules, now, cost);
                    }
                }
                if store.table().get(store.table().hash(&1), &1, now, |slot| matches!(slot, Mixed::Two(_))) == Some(false) {
                    proptest::prop_assert!(false, "a policy of one two-word quota kept the general state");
                }
            }
        }
    }
}
