//! The GCRA decision: a pure function of numbers, with no clock, no storage and no I/O.
//!
//! Times are nanoseconds on one monotonic axis chosen by the caller. A stored theoretical
//! arrival time (`tat`) of `0`, or any `tat <= now`, is the state of an idle key: evicting such
//! an entry changes no decision.
//!
//! For a request of cost `c`:
//!
//! ```text
//! base    = max(tat, now)
//! new_tat = base + c*T
//! allow   = new_tat - now <= tau      (tau = burst * T)
//! ```
//!
//! An allowed request stores `new_tat`; a rejected one stores nothing. With several quotas on
//! one key the request is allowed only if every quota allows it, and then all of them store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::step::{all_or_nothing, Slot, Step};
use super::Rule;
use crate::decision::{Decision, Outcome, QuotaState, Reservation, MAX_QUOTAS};

/// One quota reduced to the two numbers the algorithm needs, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// Emission interval `T`.
    pub(crate) interval: u64,
    /// Tolerance `tau = burst * T`.
    pub(crate) tolerance: u64,
    /// `tau / T`, kept so that no decision divides for it.
    burst: u64,
}

impl Gcra {
    pub(crate) const fn new(interval: u64, tolerance: u64) -> Self {
        let interval = if interval == 0 { 1 } else { interval };
        Gcra {
            interval,
            tolerance,
            burst: tolerance / interval,
        }
    }

    /// The burst, in requests.
    #[inline]
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// The quota's numbers as words, to keep a copy in atomics; [`from_words`](Self::from_words)
    /// gives the quota back.
    #[inline]
    pub(crate) const fn words(&self) -> [u64; 3] {
        [self.interval, self.tolerance, self.burst]
    }

    /// The quota whose [`words`](Self::words) are `w`.
    #[inline]
    pub(crate) const fn from_words(w: [u64; 3]) -> Self {
        Gcra {
            interval: w[0],
            tolerance: w[1],
            burst: w[2],
        }
    }

    /// The time once `cost` is taken at `now` whatever the limit (a cost settled after the
    /// response): `cost` emission intervals past the later of `tat` and `now`, beyond the
    /// tolerance if need be, so that the key is in debt and rejected until time pays it off.
    #[inline]
    pub(crate) fn charged(&self, tat: u64, now: u64, cost: u32) -> u64 {
        tat.max(now)
            .saturating_add(self.interval.saturating_mul(u64::from(cost)))
    }

    /// Decides a request of `cost` against stored `tat` at `now`.
    #[inline]
    pub(crate) fn step(&self, tat: u64, now: u64, cost: u32) -> Step {
        let inc = self.interval.saturating_mul(u64::from(cost));
        if inc > self.tolerance {
            return Step::Never;
        }
        let base = if tat > now { tat } else { now };
        let Some(new_tat) = base.checked_add(inc) else {
            // Only reachable about 584 years into a clock's life; deny rather than let a
            // saturated time admit requests for free.
            return Step::Deny {
                retry_after: self.interval,
            };
        };
        let ahead = new_tat - now;
        if ahead <= self.tolerance {
            Step::Allow {
                words: [new_tat, 0],
                spot: [base, new_tat],
            }
        } else {
            Step::Deny {
                retry_after: ahead - self.tolerance,
            }
        }
    }
}

impl QuotaState {
    /// The state of quota `g` for a key whose stored time is `tat`, at `now`.
    #[inline]
    pub(crate) fn of(g: &Gcra, tat: u64, now: u64) -> Self {
        QuotaState::timed(g.interval, g.tolerance, tat.saturating_sub(now))
    }

    /// The state of quota `g` for a key that may not send anything now: no request remaining,
    /// and the whole burst period until it is back.
    pub(crate) fn spent(g: &Gcra) -> Self {
        QuotaState::timed(g.interval, g.tolerance, g.tolerance)
    }

    /// The state of quota `g` for a key `ahead` nanoseconds ahead of now.
    pub(crate) fn ahead_by(g: &Gcra, ahead: u64) -> Self {
        QuotaState::timed(g.interval, g.tolerance, ahead)
    }
}

/// Decides a request of `cost` against every quota at once, all or nothing.
///
/// `tats` holds one stored time per quota (`0` for absent); when the request is admitted they
/// are replaced by the new times, otherwise left alone. Returns the decision (with what an
/// admission took, see [`Reservation`]) and whether `tats` changed.
pub(crate) fn decide(gcras: &[Gcra], tats: &mut [u64], now: u64, cost: u32) -> (Decision, bool) {
    debug_assert_eq!(gcras.len(), tats.len());
    let n = gcras.len().min(tats.len());
    let v = all_or_nothing(n, |i| gcras[i].step(tats[i], now, cost));
    let allowed = v.outcome == Outcome::Allowed && cost > 0;
    if allowed {
        for (tat, words) in tats.iter_mut().zip(&v.words) {
            *tat = words[0];
        }
    }
    let mut quotas = [QuotaState::default(); MAX_QUOTAS];
    for (i, (g, &tat)) in gcras.iter().zip(tats.iter()).enumerate() {
        quotas[i] = QuotaState::of(g, tat, now);
    }
    (super::concluded(&v, cost, quotas, n), allowed)
}

/// The single-quota case, on one word: returns the decision and the new time to store when
/// admitted.
#[inline]
pub(crate) fn decide_one(g: &Gcra, tat: u64, now: u64, cost: u32) -> (Decision, Option<u64>) {
    let step = step_one(g, tat, now, cost);
    (decision_one(g, tat, now, cost, step), step.2)
}

/// The step of [`decide_one`] alone: the outcome, the retry time and the new time to store
/// when admitted. A compare-and-swap loop retries this, and builds the decision (larger)
/// once, with [`decision_one`].
#[inline]
pub(crate) fn step_one(g: &Gcra, tat: u64, now: u64, cost: u32) -> (Outcome, u64, Option<u64>) {
    match g.step(tat, now, cost) {
        Step::Allow { words, .. } if cost > 0 => (Outcome::Allowed, 0, Some(words[0])),
        Step::Allow { .. } => (Outcome::Allowed, 0, None),
        Step::Deny { retry_after } => (Outcome::Limited, retry_after, None),
        Step::Never => (Outcome::Exceeds, 0, None),
    }
}

/// The decision of [`step_one`]'s `step` for a key whose stored time was `tat`.
#[inline]
pub(crate) fn decision_one(
    g: &Gcra,
    tat: u64,
    now: u64,
    cost: u32,
    step: (Outcome, u64, Option<u64>),
) -> Decision {
    let (outcome, retry_after, stored) = step;
    // Each word is chosen here and written once, so that the decision is written in place
    // rather than assembled elsewhere and copied.
    let (taken, spot, tat) = match stored {
        Some(new_tat) => (cost, [tat.max(now), new_tat], new_tat),
        None => (0, [0; 2], tat),
    };
    let taken = Reservation {
        cost: taken,
        spots: [spot, [0; 2], [0; 2], [0; 2]],
    };
    let rest = QuotaState::default();
    let quotas = [QuotaState::of(g, tat, now), rest, rest, rest];
    Decision::new(outcome, retry_after, quotas, 1, taken)
}

/// The slice `[start, end)` a request of `cost` added to a quota's time, once `units` of it
/// are given back at `now` from its end: how far the time moves back. Only the part of the
/// slice still ahead of `now` counts; the rest has come back on its own.
///
/// The part of `units` is `units / cost` of the slice, rounded down in whole `unit`s of
/// time (a warm-up quota's curve counts microseconds, as Redis does) and exactly below.
#[inline]
pub(crate) fn slice_back(spot: [u64; 2], cost: u32, units: u32, now: u64, unit: u64) -> u64 {
    let [start, end] = spot;
    if cost == 0 || end <= now {
        return 0;
    }
    let (units, cost, unit) = (
        u128::from(units.min(cost)),
        u128::from(cost),
        u128::from(unit.max(1)),
    );
    let len = u128::from(end.saturating_sub(start));
    let part = (len / unit * units / cost) * unit + (len % unit) * units / cost;
    end - end.saturating_sub(part as u64).max(now)
}

/// A quota's time `tat` once a slice is given back at `now` (see [`slice_back`]): `back`
/// earlier, never before `now`; a time already past stays.
#[inline]
pub(crate) fn moved_back(tat: u64, back: u64, now: u64) -> u64 {
    if tat <= now || back == 0 {
        return tat;
    }
    tat.saturating_sub(back).max(now)
}

/// A quota's time once `units` of the request that took `spot` (its slice of time, of a
/// request of `cost`) are given back at `now`: the end part of its own slice that is still
/// ahead of now comes off, never moving the time before `now`; the part already behind now
/// has come back on its own.
#[inline]
pub(crate) fn refunded(tat: u64, now: u64, spot: [u64; 2], cost: u32, units: u32) -> u64 {
    moved_back(tat, slice_back(spot, cost, units, now, 1), now)
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
        let (d, store) = decide_one(g, 0, now, cost);
        (d, store.map(|t| One(AtomicU64::new(t))))
    }

    /// The step and the time it was made on; the decision is built once, after any retry.
    type Said = ((Outcome, u64, Option<u64>), u64);

    #[inline]
    fn step(&self, g: &Gcra, now: u64, cost: u32) -> Self::Said {
        self.measure_and_replace(|tat| {
            let step = step_one(g, tat, now, cost);
            (step, step.2)
        })
    }

    #[inline]
    fn decision(g: &Gcra, (step, tat): Self::Said, now: u64, cost: u32) -> Decision {
        decision_one(g, tat, now, cost, step)
    }

    fn horizon(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn refund(&self, _: &Gcra, now: u64, taken: &Reservation, units: u32) {
        self.measure_and_replace(|tat| {
            let back = refunded(tat, now, taken.spots[0], taken.cost, units);
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
        let (d, changed) = decide(gcras, &mut tats[..gcras.len()], now, cost);
        (d, changed.then(|| Many(Mutex::new(tats))))
    }

    type Said = Decision;

    fn step(&self, gcras: &[Gcra], now: u64, cost: u32) -> Decision {
        self.measure_and_replace(|tats| decide(gcras, &mut tats[..gcras.len()], now, cost).0)
    }

    #[inline]
    fn decision(_: &[Gcra], said: Decision, _: u64, _: u32) -> Decision {
        said
    }

    fn horizon(&self) -> u64 {
        self.measure_and_replace(|tats| tats.iter().copied().max().unwrap_or(0))
    }

    fn refund(&self, gcras: &[Gcra], now: u64, taken: &Reservation, units: u32) {
        self.measure_and_replace(|tats| {
            for (tat, spot) in tats.iter_mut().zip(&taken.spots).take(gcras.len()) {
                *tat = refunded(*tat, now, *spot, taken.cost, units);
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algo::{self, KeyState};

    const S: u64 = 1_000_000_000;

    proptest! {
        /// The decision of one GCRA quota on one word, written in place, is the decision of
        /// the general state of any policy (and of the several-GCRA function) for that one
        /// quota: every figure equal, with what each admission took, and the same time kept,
        /// over any sequence of costs and waits.
        #[test]
        fn the_one_word_decision_is_the_general_one(
            count in 1u64..5,
            burst in 1u64..6,
            steps in prop::collection::vec((0u32..5, 0u64..5), 1..80),
        ) {
            let g = Gcra::new(S / count, burst * S / count);
            let rules = [Rule::Gcra(g)];
            let mut general = KeyState::default();
            let mut tats = [0u64];
            let mut tat = 0u64;
            let mut now = S;
            for (cost, dt) in steps {
                now += dt * S / 4;
                let (d, stored) = decide_one(&g, tat, now, cost);
                let (m, _) = algo::decide(&rules, &mut general, now, cost);
                let (n, _) = decide(&[g], &mut tats, now, cost);
                prop_assert_eq!(d, m);
                prop_assert_eq!(d, n);
                prop_assert_eq!(Reservation::of(&d, cost), Reservation::of(&m, cost));
                prop_assert_eq!(Reservation::of(&d, cost), Reservation::of(&n, cost));
                if let Some(t) = stored {
                    tat = t;
                }
                prop_assert_eq!(tat, tats[0]);
                prop_assert_eq!(d.retry_after(), m.retry_after());
                prop_assert_eq!(d.states(), m.states());
            }
        }
    }
}
