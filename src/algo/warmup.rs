//! The warm-up curve of a [`WarmUp`](crate::warmup::WarmUp) quota, in exact integers: the model
//! as the user sees it is written out on `WarmUp`; here is how it is computed.
//!
//! # Exact integers
//!
//! The state is two integers per key: `tat` (ns) and the *deficit* `max − stored`, with stored
//! permits measured in time (`permits × T`, so `threshold = W/2` and `max = W/2 + 2W/(f+1)`,
//! independent of the rate). A deficit of 0 is fully cold, which makes an absent key and a key
//! idle long enough the same state: such entries are dropped without changing any decision.
//! The surcharge of taking `k` from `a` above the threshold is `G(a) − G(a − k)` with
//! `G(x) = ⌊(f − 1)·x² / (2·(max − threshold))⌋`, so costs add up exactly (two requests of
//! cost 1 cost what one of cost 2 does).
//!
//! For a quota the curve is computed in whole microseconds, in memory as in Redis (whose clock
//! counts microseconds): the deficit, the surcharge and the idle time that cools a key are
//! whole microseconds, with the same floors in both stores, so a policy decides alike in
//! memory and in Redis, to the microsecond. Products are taken in 128 bits in memory; the
//! Redis script takes the same floors exactly with a long multiplication beyond 2^52, where
//! its numbers (Lua doubles) stop being exact. No floating point is involved anywhere. The
//! shaper computes its curve in nanoseconds.
//!
//! Against the real-valued formulas (Guava computes in `double`), each floor loses less than
//! one time unit (1 µs for a quota, 1 ns for a shaper), and an error of one unit in the stored
//! permits moves the next surcharge by at most `f − 1` units: a key's `tat` stays within
//! `2·(f + 1)` units per admitted request of the real-valued model, and the two differ only
//! on requests that arrive within that margin of the boundary. Property tests check this
//! against an independent floating-point reading of Guava's model.

use super::step::Step;
use crate::decision::QuotaState;

/// `⌊x · y / d⌋` in 128 bits (`d > 0`); saturates at `u64::MAX`.
#[inline]
pub(crate) fn mul_div(x: u64, y: u64, d: u64) -> u64 {
    // The same quotient in 64 bits when the product fits, without a 128-bit division.
    if let Some(p) = x.checked_mul(y) {
        return p / d.max(1);
    }
    let q = u128::from(x) * u128::from(y) / u128::from(d.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `⌈x · y / d⌉` in 128 bits (`d > 0`); saturates at `u64::MAX`.
#[inline]
fn mul_div_ceil(x: u64, y: u64, d: u64) -> u64 {
    if let Some(p) = x.checked_mul(y) {
        return p.div_ceil(d.max(1));
    }
    let q = (u128::from(x) * u128::from(y)).div_ceil(u128::from(d.max(1)));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `x` as a float for a guess, through a signed integer (one instruction, where an unsigned
/// one takes several); above `i64::MAX`, `i64::MAX`.
#[inline(always)]
fn float(x: u64) -> f64 {
    x.min(i64::MAX as u64) as i64 as f64
}

/// The warm-up curve in integers of one time unit (`unit` ns: 1 µs for quotas, in memory as
/// in Redis, so that both stores compute the same floors; 1 ns for the shaper). Stored permits
/// are measured in time (`permits × T`), in units; the state keeps the *deficit*
/// `max − stored`, so that 0 is fully cold. What goes in and out (idle time, prices, budgets)
/// is in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Curve {
    /// `T` in ns: the stable cost of one request.
    pub(crate) interval: u64,
    /// Nanoseconds per unit.
    pub(crate) unit: u64,
    /// `T` in units (rounded up): the stored permits one request spends.
    pub(crate) interval_units: u64,
    /// `W`, in units.
    pub(crate) period: u64,
    /// `f`.
    pub(crate) cold_factor: u64,
    /// Stored permits, in time units, below which a request costs `T`: `W / 2`.
    pub(crate) threshold: u64,
    /// Width of the warm zone, in time units: `2W / (f + 1)`.
    pub(crate) zone: u64,
    /// `threshold + zone`: the most an idle key stores.
    pub(crate) max: u64,
}

impl Curve {
    /// The curve for emission interval `interval` and warm-up `period` (both in ns), cold
    /// factor `cold_factor`, computed in units of `unit` ns.
    pub(crate) fn new(interval: u64, period: u64, cold_factor: u32, unit: u64) -> Self {
        let unit = unit.max(1);
        let interval = interval.max(1);
        let period = (period / unit).max(1);
        let cold_factor = u64::from(cold_factor.max(1));
        let threshold = period / 2;
        let zone = mul_div(2, period, cold_factor + 1);
        Curve {
            interval,
            unit,
            interval_units: interval.div_ceil(unit),
            period,
            cold_factor,
            threshold,
            zone,
            max: threshold + zone,
        }
    }

    /// The deficit after `idle` nanoseconds without a request. A deficit beyond `max` (stored
    /// under a curve with a larger one, before a change) is no stored permit at all: it
    /// regains from `max`, so that a key is fully cold [`cold_in`](Self::cold_in) after it.
    #[inline]
    pub(crate) fn regain(&self, deficit: u64, idle: u64) -> u64 {
        let idle = idle / self.unit;
        if deficit == 0 || idle == 0 {
            return deficit;
        }
        let gained = mul_div(idle.min(self.period), self.max, self.period);
        deficit.min(self.max).saturating_sub(gained)
    }

    /// Nanoseconds until a key with `deficit`, idle from now on, is fully cold (the same as a
    /// key never seen).
    #[inline]
    pub(crate) fn cold_in(&self, deficit: u64) -> u64 {
        if deficit == 0 || self.max == 0 {
            0
        } else {
            mul_div_ceil(deficit.min(self.max), self.period, self.max).saturating_mul(self.unit)
        }
    }

    /// The surcharge integral, in units: `⌊(f − 1)·x² / (2·zone)⌋` for `x` stored above the
    /// threshold (`x <= zone`).
    ///
    /// No case needs a test of its own: `x` is 0 whenever the zone is (the division is then
    /// by 1, of 0), the product is 0 when `f` is 1, and `(f − 1)·x` stays under
    /// `2·period`, since `x <= zone = ⌊2·period / (f + 1)⌋`.
    #[inline]
    fn surcharge_to(&self, x: u64) -> u64 {
        debug_assert!(x <= self.zone);
        mul_div(x, (self.cold_factor - 1) * x, 2 * self.zone)
    }

    /// [`surcharge_to`](Self::surcharge_to) as it was, testing each case apart: the
    /// reference the property tests hold it to.
    #[cfg(test)]
    fn surcharge_to_before(&self, x: u64) -> u64 {
        if self.zone == 0 || self.cold_factor == 1 || x == 0 {
            return 0;
        }
        mul_div(x, (self.cold_factor - 1) * x, 2 * self.zone)
    }

    /// Stored permits above the threshold, in time units, for a key with `deficit`.
    #[inline]
    fn above(&self, deficit: u64) -> u64 {
        self.max
            .saturating_sub(deficit)
            .saturating_sub(self.threshold)
    }

    /// Stored permits above the threshold for a key with `deficit`, and their surcharge
    /// integral.
    #[inline(always)]
    fn integral_above(&self, deficit: u64) -> (u64, u64) {
        let a = self.above(deficit);
        (a, self.surcharge_to(a))
    }

    /// What `cost` requests cost when taken at once by a key with `deficit`: the nanoseconds
    /// they add to `tat`, and the deficit afterwards.
    #[inline]
    pub(crate) fn price(&self, deficit: u64, cost: u64) -> (u64, u64) {
        let stable = self.interval.saturating_mul(cost);
        let stored = self.max.saturating_sub(deficit);
        let spent = self.interval_units.saturating_mul(cost).min(stored);
        let a = self.above(deficit);
        let k = a.min(spent);
        let extra = self.surcharge_to(a) - self.surcharge_to(a - k);
        (
            stable.saturating_add(extra.saturating_mul(self.unit)),
            deficit + spent,
        )
    }

    /// The surcharge in ns (beyond `T` each) of `n` requests taken one after another by a key
    /// with `deficit`; the same as taking them at once.
    #[cfg(test)]
    fn surcharge(&self, deficit: u64, n: u64) -> u64 {
        let a = self.above(deficit);
        let k = a.min(self.interval_units.saturating_mul(n));
        (self.surcharge_to_before(a) - self.surcharge_to_before(a - k)).saturating_mul(self.unit)
    }

    /// The most requests of cost 1 that a key with `deficit` can take one after another
    /// within `budget` ns: the largest `n` with `n·T + surcharge(n) <= budget`.
    ///
    /// Past the requests that spend every permit above the threshold each one costs `T`, so
    /// that part is a division; below it the cost is a quadratic in `n`, whose real root
    /// gives a first guess that the exact test then confirms or corrects (the cost rises
    /// with `n`, so the answer is the same whatever the guess).
    #[inline]
    pub(crate) fn fits(&self, deficit: u64, budget: u64) -> u64 {
        let (a, integral) = self.integral_above(deficit);
        self.fits_above(a, integral, budget)
    }

    /// [`fits`](Self::fits) for a key with `a` units stored above the threshold, whose
    /// surcharge integral `surcharge_to(a)` is `whole_integral` (a caller that has it already
    /// does not compute it again).
    #[inline(always)]
    fn fits_above(&self, a: u64, whole_integral: u64, budget: u64) -> u64 {
        // When the requests that spend every stored permit above the threshold fit, their
        // surcharge is the whole integral above it, and every request costs `T` besides: `n`
        // requests fit, `n = ⌊(budget − integral) / T⌋`, if those requests (`⌈a / I⌉`, `I`
        // the interval in units) are among them, that is if `a <= n·I`.
        let rest = whole_integral
            .checked_mul(self.unit)
            .and_then(|integral| budget.checked_sub(integral));
        if let Some(rest) = rest {
            let n = rest / self.interval;
            if a <= n.saturating_mul(self.interval_units.max(1)) {
                return n;
            }
        }
        let whole = a.div_ceil(self.interval_units.max(1));
        self.fits_warm(a, whole_integral, whole, budget)
    }

    /// [`fits_above`](Self::fits_above) when not every permit above the threshold fits:
    /// fewer than `whole` requests fit (`whole >= 1`, since nothing costs nothing). The real
    /// root of the quadratic is checked first with two exact tests (it is the answer, or
    /// one off, but for the floors); a wrong guess is corrected by a galloping search.
    #[inline(never)]
    fn fits_warm(&self, a: u64, whole_integral: u64, whole: u64, budget: u64) -> u64 {
        let t = self.interval;
        // The cost of `n` requests (`n < whole`, each within the permits above): `n·T` and
        // the integral between `a` and where they stop, exactly as `price` charges it.
        let fits = |n: u64| {
            let k = a.min(self.interval_units.saturating_mul(n));
            let surcharge = (whole_integral - self.surcharge_to(a - k)).saturating_mul(self.unit);
            n.checked_mul(t)
                .and_then(|c| c.checked_add(surcharge))
                .is_some_and(|c| c <= budget)
        };
        // `fits(0)` holds and `fits(whole)` does not.
        let (mut lo, mut hi) = (0, whole);
        let guess = self.guess(a, budget).min(whole - 1);
        let mut step = 1;
        if fits(guess) {
            lo = guess;
            while lo + step < hi && fits(lo + step) {
                lo += step;
                step = step.saturating_mul(2);
            }
            hi = hi.min(lo.saturating_add(step));
        } else {
            hi = guess;
            while hi - lo > step && !fits(hi - step) {
                hi -= step;
                step = step.saturating_mul(2);
            }
            lo = lo.max(hi.saturating_sub(step));
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// [`fits`](Self::fits) as it was before the integral was shared and the guess was
    /// checked first: the reference the property tests hold it to.
    #[cfg(test)]
    fn fits_before(&self, deficit: u64, budget: u64) -> u64 {
        let t = self.interval;
        let cost = |n: u64| {
            n.checked_mul(t)
                .and_then(|c| c.checked_add(self.surcharge(deficit, n)))
        };
        let fits = |n: u64| cost(n).is_some_and(|c| c <= budget);
        let a = self.above(deficit);
        let whole = a.div_ceil(self.interval_units.max(1));
        let all_above = whole
            .checked_mul(t)
            .and_then(|c| c.checked_add(self.surcharge_to_before(a).saturating_mul(self.unit)));
        if let Some(c) = all_above.filter(|&c| c <= budget) {
            return whole.saturating_add((budget - c) / t);
        }
        let (mut lo, mut hi) = (0, whole);
        let guess = self.guess(a, budget).clamp(1, whole) - 1;
        let mut step = 1;
        if fits(guess) {
            lo = guess;
            while lo + step < hi && fits(lo + step) {
                lo += step;
                step = step.saturating_mul(2);
            }
            hi = hi.min(lo.saturating_add(step));
        } else {
            hi = guess;
            while hi - lo > step && !fits(hi - step) {
                hi -= step;
                step = step.saturating_mul(2);
            }
            lo = lo.max(hi.saturating_sub(step));
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// About how many requests fit `budget` ns while every one is priced above the
    /// threshold (`a` units stored above it): the real root of
    /// `B·n − A·n² = budget`, with `A = u·(f − 1)·I² / (2·zone)` and
    /// `B = T + u·(f − 1)·a·I / zone` (`u` the unit, `I` the interval in units). A guess only:
    /// [`fits`](Self::fits) settles the exact answer.
    fn guess(&self, a: u64, budget: u64) -> u64 {
        let (u, i, t) = (
            float(self.unit),
            float(self.interval_units),
            float(self.interval),
        );
        let (f, zone) = (float(self.cold_factor - 1), float(self.zone.max(1)));
        let sq = u * f * i * i / (2.0 * zone);
        let lin = t + u * f * float(a) * i / zone;
        let budget = float(budget);
        let disc = (lin * lin - 4.0 * sq * budget).max(0.0);
        // The smaller root, written so that it does not cancel when `sq` is small.
        let n = 2.0 * budget / (lin + disc.sqrt());
        // Not a number and below 0 give 0, above the range its end.
        (n as i64).max(0) as u64
    }

    /// The cost in units of the next request of cost 1 at `stored` permits (in time units) on
    /// the line of the model: `T` at or below the threshold, rising to `f·T` at `max`. For
    /// tests; decisions charge the area under this line.
    #[cfg(test)]
    fn height(&self, stored: u64) -> u64 {
        let x = stored.saturating_sub(self.threshold);
        if self.zone == 0 {
            return self.interval_units;
        }
        self.interval_units + mul_div(self.interval_units * (self.cold_factor - 1), x, self.zone)
    }
}

/// The state of one warm-up quota for one key. `(0, 0)` is a key never seen: fully cold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WarmState {
    /// The theoretical arrival time.
    pub(crate) tat: u64,
    /// `max − stored`, stored permits measured in time.
    pub(crate) deficit: u64,
}

/// A warm-up quota: GCRA with tolerance `tau`, whose requests are priced on the curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WarmGcra {
    pub(crate) curve: Curve,
    /// `tau = burst × T`.
    pub(crate) tolerance: u64,
    /// `tau / T`, kept so that no decision divides for it.
    burst: u64,
}

impl WarmGcra {
    pub(crate) fn new(curve: Curve, tolerance: u64) -> Self {
        WarmGcra {
            curve,
            tolerance,
            burst: tolerance / curve.interval.max(1),
        }
    }

    /// The quota's numbers as words, to keep a copy in atomics; [`from_words`](Self::from_words)
    /// gives the quota back.
    #[inline]
    pub(crate) const fn words(&self) -> [u64; 10] {
        let c = &self.curve;
        [
            c.interval,
            c.unit,
            c.interval_units,
            c.period,
            c.cold_factor,
            c.threshold,
            c.zone,
            c.max,
            self.tolerance,
            self.burst,
        ]
    }

    /// The quota whose [`words`](Self::words) are `w`.
    #[inline]
    pub(crate) const fn from_words(w: [u64; 10]) -> Self {
        WarmGcra {
            curve: Curve {
                interval: w[0],
                unit: w[1],
                interval_units: w[2],
                period: w[3],
                cold_factor: w[4],
                threshold: w[5],
                zone: w[6],
                max: w[7],
            },
            tolerance: w[8],
            burst: w[9],
        }
    }

    /// The burst, in requests (`q` in `RateLimit-Policy`).
    #[inline]
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// The state as of `now`: an idle key regains permits and its `tat` moves up to `now`.
    #[inline]
    pub(crate) fn resync(&self, s: WarmState, now: u64) -> WarmState {
        if s.tat < now {
            WarmState {
                tat: now,
                deficit: self.curve.regain(s.deficit, now - s.tat),
            }
        } else {
            s
        }
    }

    /// Decides a request of `cost` at `now`.
    /// Admitted, it stores `[tat, deficit]` and its cost lands in the slice of time it adds
    /// to `tat`.
    #[inline]
    pub(crate) fn step(&self, s: WarmState, now: u64, cost: u32) -> Step {
        let t = self.curve.interval;
        let inc = t.saturating_mul(u64::from(cost));
        if inc > self.tolerance {
            return Step::Never;
        }
        let s = self.resync(s, now);
        let Some(stable_tat) = s.tat.checked_add(inc) else {
            return Step::Deny { retry_after: t };
        };
        let ahead = stable_tat - now;
        if ahead > self.tolerance {
            return Step::Deny {
                retry_after: ahead - self.tolerance,
            };
        }
        let (price, deficit) = self.curve.price(s.deficit, u64::from(cost));
        match s.tat.checked_add(price) {
            Some(tat) => Step::Allow {
                words: [tat, deficit],
                spot: [s.tat, tat],
            },
            None => Step::Deny { retry_after: t },
        }
    }

    /// The state once `cost` is taken at `now` whatever the limit (a cost settled after the
    /// response): priced on the curve, beyond the tolerance if need be.
    pub(crate) fn charged(&self, s: WarmState, now: u64, cost: u32) -> WarmState {
        let s = self.resync(s, now);
        let (price, deficit) = self.curve.price(s.deficit, u64::from(cost));
        WarmState {
            tat: s.tat.saturating_add(price),
            deficit,
        }
    }

    /// How many requests of cost 1, sent one after another now, would be admitted.
    #[cfg(test)]
    pub(crate) fn remaining(&self, s: WarmState, now: u64) -> u64 {
        let s = self.resync(s, now);
        self.remaining_synced(s, now, || self.curve.integral_above(s.deficit))
    }

    /// [`remaining`](Self::remaining) for a key whose state `s` is as of `now` already
    /// (`s.tat >= now`); `above` gives its permits stored above the threshold and their
    /// surcharge integral, asked only when a request could fit.
    #[inline(always)]
    fn remaining_synced(&self, s: WarmState, now: u64, above: impl FnOnce() -> (u64, u64)) -> u64 {
        let ahead = s.tat - now;
        // The n-th request (from 1) is admitted when ahead + (n−1)·T + surcharge(n−1) + T
        // <= tau.
        match self
            .tolerance
            .checked_sub(ahead)
            .and_then(|room| room.checked_sub(self.curve.interval))
        {
            Some(budget) => {
                let (a, integral) = above();
                self.curve.fits_above(a, integral, budget).saturating_add(1)
            }
            None => 0,
        }
    }

    /// The figures of the quota for a key in state `s` at `now`.
    #[inline]
    pub(crate) fn state(&self, s: WarmState, now: u64) -> QuotaState {
        let s = self.resync(s, now);
        self.figures(s, now, || self.curve.integral_above(s.deficit))
    }

    /// [`state`](Self::state) for a key whose state `s` is as of `now` already, `above` as
    /// in [`remaining_synced`](Self::remaining_synced).
    #[inline(always)]
    fn figures(&self, s: WarmState, now: u64, above: impl FnOnce() -> (u64, u64)) -> QuotaState {
        QuotaState::counted(
            self.burst(),
            self.remaining_synced(s, now, above),
            s.tat - now,
        )
    }

    /// [`step`](Self::step), the figures of the state it leaves ([`state`](Self::state)),
    /// and that state when it is kept (admitted at a cost), with no work done twice: the
    /// key's state as of `now` is found once, and the figures after an admission start from
    /// the surcharge integral its price ends at (the permits it leaves above the threshold).
    ///
    /// It writes out `step`'s test and `Curve::price` rather than share them through a
    /// helper: a helper returning the admission (a `Result`, or one taking two closures)
    /// cost 14 and 34 more instructions per admitted check, 8 and 82 per refused one.
    /// `shared::a_check_with_its_work_shared_judges_as_each_part_apart` holds the two to
    /// each other.
    #[inline(always)]
    pub(crate) fn judged(
        &self,
        s: WarmState,
        now: u64,
        cost: u32,
    ) -> (Step, QuotaState, Option<WarmState>) {
        let c = &self.curve;
        let t = c.interval;
        let inc = t.saturating_mul(u64::from(cost));
        let r = self.resync(s, now);
        let step = if inc > self.tolerance {
            Step::Never
        } else {
            match r.tat.checked_add(inc) {
                Some(stable_tat) if stable_tat - now > self.tolerance => Step::Deny {
                    retry_after: stable_tat - now - self.tolerance,
                },
                Some(_) => {
                    // `Curve::price`, keeping the integral where the request leaves it.
                    let stored = c.max.saturating_sub(r.deficit);
                    let spent = c.interval_units.saturating_mul(u64::from(cost)).min(stored);
                    let a = stored.saturating_sub(c.threshold);
                    let left = a - a.min(spent);
                    let integral_left = c.surcharge_to(left);
                    let extra = c.surcharge_to(a) - integral_left;
                    let price = inc.saturating_add(extra.saturating_mul(c.unit));
                    if let Some(tat) = r.tat.checked_add(price) {
                        let after = WarmState {
                            tat,
                            deficit: r.deficit + spent,
                        };
                        let figures = self.figures(after, now, || (left, integral_left));
                        let step = Step::Allow {
                            words: [tat, after.deficit],
                            spot: [r.tat, tat],
                        };
                        return (step, figures, (cost > 0).then_some(after));
                    }
                    Step::Deny { retry_after: t }
                }
                None => Step::Deny { retry_after: t },
            }
        };
        (
            step,
            self.figures(r, now, || c.integral_above(r.deficit)),
            None,
        )
    }

    /// Time from `now` until the key is the same as one never seen: no backlog and fully cold.
    #[inline]
    pub(crate) fn idle_at(&self, s: WarmState) -> u64 {
        s.tat.saturating_add(self.curve.cold_in(s.deficit))
    }
}

/// A warm-up step read back as the quota's state, for the tests.
#[cfg(test)]
#[derive(Debug, PartialEq)]
enum WarmStep {
    Allow(WarmState),
    Deny { retry_after: u64 },
    Never,
}

#[cfg(test)]
fn step(w: &WarmGcra, s: WarmState, now: u64, cost: u32) -> WarmStep {
    match w.step(s, now, cost) {
        Step::Allow { words, .. } => WarmStep::Allow(WarmState {
            tat: words[0],
            deficit: words[1],
        }),
        Step::Deny { retry_after } => WarmStep::Deny { retry_after },
        Step::Never => WarmStep::Never,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::MAX_WARM_UP_PERIOD;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// Guava's `RateLimiter.create(2, 3, SECONDS)`.
    fn guava() -> Curve {
        Curve::new(S / 2, 3 * S, 3, 1)
    }

    #[test]
    fn guava_example_has_threshold_3_and_max_6_permits() {
        let c = guava();
        assert_eq!(c.threshold, 3 * (S / 2));
        assert_eq!(c.zone, 3 * (S / 2));
        assert_eq!(c.max, 6 * (S / 2));
    }

    #[test]
    fn guava_example_cost_line_is_1500_1167_833_500_ms_at_6_5_4_3_permits() {
        let c = guava();
        let heights: Vec<u64> = (3..=6).rev().map(|p| c.height(p * S / 2)).collect();
        assert_eq!(
            heights,
            [1_500_000_000, 1_166_666_666, 833_333_333, 500_000_000]
        );
    }

    #[test]
    fn guava_example_charges_the_area_of_each_strip() {
        // One permit at a time from cold: 4/3 s, 1 s, 2/3 s, then 1/2 s for ever.
        let c = guava();
        let mut deficit = 0;
        let mut charges = Vec::new();
        for _ in 0..6 {
            let (price, d) = c.price(deficit, 1);
            charges.push(price);
            deficit = d;
        }
        assert_eq!(
            charges,
            [
                1_333_333_334,
                1_000_000_000,
                666_666_666,
                500_000_000,
                500_000_000,
                500_000_000
            ]
        );
        // The warm zone costs W in all, the stable zone T a permit.
        let warm: u64 = charges[..3].iter().sum();
        assert_eq!(warm, 3 * S);
    }

    #[test]
    fn guava_example_with_burst_1_spaces_admissions_like_acquire() {
        let w = WarmGcra::new(guava(), S / 2);
        let mut s = WarmState::default();
        let mut now = 10 * S;
        let mut admitted = Vec::new();
        for _ in 0..6 {
            // Wait exactly as long as the limiter says, then ask again.
            match step(&w, s, now, 1) {
                WarmStep::Allow(next) => {
                    admitted.push(now);
                    s = next;
                }
                WarmStep::Deny { retry_after } => {
                    now += retry_after;
                    match step(&w, s, now, 1) {
                        WarmStep::Allow(next) => {
                            admitted.push(now);
                            s = next;
                        }
                        other => panic!("retry_after was wrong: {other:?}"),
                    }
                }
                WarmStep::Never => panic!("cost 1 fits burst 1"),
            }
        }
        let gaps: Vec<u64> = admitted.windows(2).map(|p| p[1] - p[0]).collect();
        assert_eq!(
            gaps,
            [
                1_333_333_334,
                1_000_000_000,
                666_666_666,
                500_000_000,
                500_000_000
            ]
        );
    }

    #[test]
    fn costs_add_up_exactly() {
        let c = guava();
        for start in [0, S / 3, S, 2 * S, 3 * S] {
            let (one, d1) = c.price(start, 1);
            let (two, d2) = c.price(d1, 1);
            let (both, d) = c.price(start, 2);
            assert_eq!(one + two, both, "from deficit {start}");
            assert_eq!(d2, d);
        }
    }

    #[test]
    fn cold_factor_1_is_plain_gcra() {
        let c = Curve::new(100, 10_000, 1, 1);
        let mut d = 0;
        for _ in 0..300 {
            let (p, next) = c.price(d, 1);
            assert_eq!(p, 100);
            d = next;
        }
    }

    #[test]
    fn idle_key_goes_from_warm_to_cold_in_the_period() {
        let c = guava();
        let warm = c.max; // nothing stored
        assert_eq!(c.regain(warm, 3 * S / 2), c.max - c.threshold); // half way: at threshold
        assert_eq!(c.regain(warm, 3 * S - 1), 1);
        assert_eq!(c.regain(warm, 3 * S), 0);
        assert_eq!(c.regain(warm, u64::MAX), 0);
        assert_eq!(c.cold_in(warm), 3 * S);
        assert_eq!(c.cold_in(1), 1);
        assert_eq!(c.cold_in(0), 0);
    }

    /// A deficit stored under a curve with a larger `max`, judged after a change by a curve
    /// with a smaller one, is no stored permit: the key is fully cold once `cold_in` says so
    /// (a full period), as a key never seen, never warmer.
    #[test]
    fn a_deficit_beyond_max_after_a_change_is_cold_in_one_period() {
        let big = Curve::new(S / 2, 30 * S, 3, 1);
        let c = guava();
        let deficit = big.max;
        assert!(deficit > c.max);
        assert_eq!(c.cold_in(deficit), 3 * S);
        assert_eq!(c.regain(deficit, 3 * S), 0);
        assert_eq!(c.regain(deficit, 3 * S / 2), c.max - c.threshold);
        assert_eq!(c.regain(deficit, 0), deficit);
    }

    #[test]
    fn a_key_idle_until_cold_in_decides_like_one_never_seen() {
        let w = WarmGcra::new(guava(), 2 * S);
        let mut s = WarmState::default();
        let mut now = S;
        for _ in 0..5 {
            if let WarmStep::Allow(n) = step(&w, s, now, 1) {
                s = n;
            }
            now += 300 * MS;
        }
        let idle = w.idle_at(s);
        assert!(idle > s.tat);
        let fresh = WarmState::default();
        for cost in [1, 2, 4] {
            let from_state = step(&w, s, idle, cost);
            let from_nothing = step(&w, fresh, idle, cost);
            match (from_state, from_nothing) {
                (WarmStep::Allow(a), WarmStep::Allow(b)) => assert_eq!(a, b),
                (a, b) => assert_eq!(a, b),
            }
        }
        // One nanosecond earlier it is not yet fully cold.
        assert_ne!(w.resync(s, idle - 1).deficit, 0);
    }

    #[test]
    fn admission_test_is_plain_gcra_and_retry_after_is_exact() {
        // Burst 2 (tau = 1 s), cold: the first costs 1.333 s, so a second at once is refused
        // and told to come back when plain GCRA's test passes.
        let w = WarmGcra::new(guava(), S);
        let now = 5 * S;
        let WarmStep::Allow(s) = step(&w, WarmState::default(), now, 1) else {
            panic!("first request from cold is admitted");
        };
        assert_eq!(s.tat, now + 1_333_333_334);
        assert_eq!(
            step(&w, s, now, 1),
            WarmStep::Deny {
                retry_after: 833_333_334
            }
        );
        assert!(matches!(
            step(&w, s, now + 833_333_334, 1),
            WarmStep::Allow(_)
        ));
        assert_eq!(
            step(&w, s, now + 833_333_333, 1),
            WarmStep::Deny { retry_after: 1 }
        );
    }

    #[test]
    fn cost_above_burst_never_passes_and_cost_0_consumes_nothing() {
        let w = WarmGcra::new(guava(), S);
        assert_eq!(step(&w, WarmState::default(), S, 3), WarmStep::Never);
        assert_eq!(
            step(&w, WarmState::default(), S, 0),
            WarmStep::Allow(WarmState { tat: S, deficit: 0 })
        );
    }

    #[test]
    fn remaining_counts_what_would_really_be_admitted() {
        for tau_permits in [1u64, 2, 3, 5, 8, 20] {
            let w = WarmGcra::new(guava(), tau_permits * S / 2);
            for start in [WarmState::default(), WarmState { tat: 0, deficit: S }] {
                let now = 7 * S;
                let expect = w.remaining(start, now);
                let mut s = start;
                let mut got = 0;
                while let WarmStep::Allow(n) = step(&w, s, now, 1) {
                    s = n;
                    got += 1;
                }
                assert_eq!(got, expect, "burst {tau_permits}, start {start:?}");
            }
        }
    }

    #[test]
    fn a_refund_gives_back_the_slice_the_request_added_and_keeps_the_warmth() {
        use crate::algo::Rule;
        let w = WarmGcra::new(guava(), 2 * S);
        let rule = Rule::WarmUp(w);
        let WarmStep::Allow(s) = step(&w, WarmState::default(), S, 1) else {
            panic!()
        };
        // The request added [1 s, 2.333 s): all of it comes back at 1 s, the surcharge too.
        let spot = [S, S + 1_333_333_334];
        assert_eq!(
            rule.refund([s.tat, s.deficit], S, spot, 1, 1),
            [S, s.deficit]
        );
        // At 2 s only the part still ahead of now comes back; once past, nothing.
        let at_2 = rule.refund([s.tat, s.deficit], 2 * S, spot, 1, 1);
        assert_eq!(at_2, [2 * S, s.deficit]);
        let past = [S + 1_333_333_334, 7];
        assert_eq!(rule.refund(past, 3 * S, spot, 1, 1), past);
    }

    #[test]
    fn extreme_parameters_do_not_overflow() {
        let max_period = MAX_WARM_UP_PERIOD.as_nanos() as u64;
        for (t, period, f) in [
            (1, 1, 1),
            (1, 1, u32::MAX),
            (1, max_period, u32::MAX),
            (u64::MAX / 4, max_period, 3),
            (1, max_period, 2),
            (S, 1, 3),
        ] {
            let c = Curve::new(t, period, f, 1);
            let w = WarmGcra::new(c, t);
            for d in [0, 1, c.max / 2, c.max] {
                let s = WarmState { tat: 0, deficit: d };
                let _ = step(&w, s, u64::MAX / 2, 1);
                let _ = w.remaining(s, u64::MAX / 2);
                let _ = w.idle_at(s);
                let _ = c.price(d, u64::from(u32::MAX));
            }
        }
    }
}

/// [`Curve::fits`] against the plain search over every count it replaced.
#[cfg(test)]
mod fits {
    use super::*;
    use proptest::prelude::*;

    /// The largest `n <= budget / T` with `n·T + surcharge(n) <= budget`, by bisection.
    fn by_search(c: &Curve, deficit: u64, budget: u64) -> u64 {
        let fits = |n: u64| {
            n.checked_mul(c.interval)
                .and_then(|x| x.checked_add(c.surcharge(deficit, n)))
                .is_some_and(|x| x <= budget)
        };
        let (mut lo, mut hi) = (0u64, budget / c.interval);
        if fits(hi) {
            return hi;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn fits_counts_what_the_search_counts(
            interval in prop_oneof![1u64..1_000, 1_000u64..10_000_000_000],
            period in prop_oneof![1u64..1_000_000, 1_000_000u64..(1 << 60)],
            cold in prop_oneof![1u32..=10, 10u32..=u32::MAX],
            unit in prop_oneof![Just(1u64), Just(1_000u64)],
            share in 0u64..=1_000,
            budget in prop_oneof![0u64..1_000_000_000, 0u64..u64::MAX / 2],
        ) {
            let c = Curve::new(interval, period, cold, unit);
            let deficit = mul_div(c.max, share, 1_000);
            let searched = by_search(&c, deficit, budget);
            prop_assert_eq!(c.fits(deficit, budget), searched);
            prop_assert_eq!(c.fits_before(deficit, budget), searched);
        }

        /// The integral with no case tested apart is the integral with each case tested, for
        /// every amount a key can store above the threshold.
        #[test]
        fn the_integral_needs_no_case_of_its_own(
            period in prop_oneof![1u64..1_000, 1u64..(1 << 60), Just(1u64 << 60)],
            cold in prop_oneof![1u32..=10, 1u32..=u32::MAX, Just(u32::MAX)],
            unit in prop_oneof![Just(1u64), Just(1_000u64)],
            share in prop_oneof![0u64..=1_000, Just(0u64), Just(1_000u64)],
        ) {
            let c = Curve::new(1, period, cold, unit);
            for x in [mul_div(c.zone, share, 1_000), c.zone, c.zone.saturating_sub(1), 0, 1.min(c.zone)] {
                prop_assert_eq!(c.surcharge_to(x), c.surcharge_to_before(x), "x {}", x);
            }
        }
    }
}

/// The model against a reference written from Guava's description in floating point, with
/// stored permits counted in permits (not time) and no shared code.
///
/// Each request starts both from the same state (the reference reads the integers), so the
/// test pins what one step does. Run apart for long, the two drift: a few ns of `tat` change
/// how much an idle key regains, which changes the next surcharge, and so on; the same holds
/// between Guava's `double`s and exact arithmetic.
#[cfg(test)]
mod model {
    use super::*;
    use proptest::prelude::*;

    /// How far one integer step may land from the real-valued model started from the same
    /// state, in ns: each floor loses under 1 ns, and the threshold and the warm zone, rounded
    /// to the ns, move a surcharge by up to `f − 1` ns.
    fn eps(f: u32) -> f64 {
        2.0 * (f64::from(f) + 1.0) + 4.0
    }

    /// Guava's `SmoothWarmingUp`, read literally, in f64 nanoseconds, with plain GCRA's
    /// admission test in front.
    struct Reference {
        t: f64,
        tau: f64,
        threshold: f64,
        max: f64,
        slope: f64,
        cool_down: f64,
        stored: f64,
        next_free: f64,
    }

    #[derive(Debug, PartialEq)]
    enum Said {
        Allow,
        Deny(f64),
        Never,
    }

    impl Reference {
        fn new(t: f64, w: f64, cold: f64, tau: f64) -> Self {
            let cold_interval = t * cold;
            let threshold = 0.5 * w / t;
            let max = threshold + 2.0 * w / (t + cold_interval);
            let slope = (cold_interval - t) / (max - threshold);
            Reference {
                t,
                tau,
                threshold,
                max,
                slope,
                cool_down: w / max,
                stored: max,
                next_free: 0.0,
            }
        }

        fn permits_to_time(&self, permits: f64) -> f64 {
            self.t + permits * self.slope
        }

        fn stored_permits_to_wait_time(&self, stored: f64, mut take: f64) -> f64 {
            let above = stored - self.threshold;
            let mut wait = 0.0;
            if above > 0.0 {
                let k = above.min(take);
                let length = self.permits_to_time(above) + self.permits_to_time(above - k);
                wait = k * length / 2.0;
                take -= k;
            }
            wait + self.t * take
        }

        fn decide(&mut self, now: f64, cost: f64) -> Said {
            if cost * self.t > self.tau {
                return Said::Never;
            }
            let (mut stored, mut next) = (self.stored, self.next_free);
            if now > next {
                stored = self.max.min(stored + (now - next) / self.cool_down);
                next = now;
            }
            let ahead = next + cost * self.t - now;
            if ahead > self.tau {
                return Said::Deny(ahead - self.tau);
            }
            if cost > 0.0 {
                let spend = cost.min(stored);
                let price =
                    self.stored_permits_to_wait_time(stored, spend) + (cost - spend) * self.t;
                self.next_free = next + price;
                self.stored = stored - spend;
            }
            Said::Allow
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn warm_up_admits_what_the_model_admits(
            t_us in 1_000u64..1_000_000,
            w_ms in 1u64..10_000,
            cold in 1u32..=10,
            burst in 1u64..=10,
            steps in proptest::collection::vec(
                (prop_oneof![0u64..4_000_000_000, 0u64..300_000_000], 0u32..=3),
                1..120,
            ),
        ) {
            let t = t_us * 1_000;
            let w = w_ms * 1_000_000;
            let tau = burst * t;
            let g = WarmGcra::new(Curve::new(t, w, cold, 1), tau);
            let mut r = Reference::new(t as f64, w as f64, f64::from(cold), tau as f64);
            let mut s = WarmState::default();
            let mut now = 1_000_000_000u64;
            let eps = eps(cold);
            for (gap, cost) in steps {
                now += gap;
                // Both start each request from the same state: the model reads the integers.
                r.next_free = s.tat as f64;
                r.stored = g.curve.max.saturating_sub(s.deficit) as f64 / r.t;
                let ours = match step(&g, s, now, cost) {
                    WarmStep::Allow(next) => {
                        if cost > 0 {
                            s = next;
                        }
                        Said::Allow
                    }
                    WarmStep::Deny { retry_after } => Said::Deny(retry_after as f64),
                    WarmStep::Never => Said::Never,
                };
                // The admission test is plain GCRA's on the same `tat`: the same answer,
                // to the request, and the same wait.
                prop_assert_eq!(&ours, &r.decide(now as f64, f64::from(cost)));
                prop_assert!(
                    (r.next_free - s.tat as f64).abs() <= eps,
                    "tat {} vs model {}", s.tat, r.next_free
                );
                let stored = (g.curve.max.saturating_sub(s.deficit)) as f64 / r.t;
                prop_assert!((r.stored - stored).abs() * r.t <= eps);
            }
        }
    }
}

/// The check of a warm-up quota with its work shared ([`WarmGcra::judged`] and the idle time
/// of what it keeps, the path every memory check takes) against the arithmetic as it was,
/// each part computed apart: [`before`]'s step, figures and price, with the idle time of the
/// words kept, over random curves and states, and over runs of checks, settled charges,
/// refunds and changes of the curve or the rate.
#[cfg(test)]
mod shared {
    use super::*;
    use crate::algo::two::TwoKind;
    use crate::algo::Rule;
    use proptest::prelude::*;

    /// The arithmetic of a warm-up check as it was before its parts shared their work.
    mod before {
        use super::*;

        pub(super) fn price(c: &Curve, deficit: u64, cost: u64) -> (u64, u64) {
            let stable = c.interval.saturating_mul(cost);
            let stored = c.max.saturating_sub(deficit);
            let spent = c.interval_units.saturating_mul(cost).min(stored);
            let a = c.above(deficit);
            let k = a.min(spent);
            let extra = c.surcharge_to_before(a) - c.surcharge_to_before(a - k);
            (
                stable.saturating_add(extra.saturating_mul(c.unit)),
                deficit + spent,
            )
        }

        pub(super) fn step(w: &WarmGcra, s: WarmState, now: u64, cost: u32) -> Step {
            let t = w.curve.interval;
            let inc = t.saturating_mul(u64::from(cost));
            if inc > w.tolerance {
                return Step::Never;
            }
            let s = w.resync(s, now);
            let Some(stable_tat) = s.tat.checked_add(inc) else {
                return Step::Deny { retry_after: t };
            };
            let ahead = stable_tat - now;
            if ahead > w.tolerance {
                return Step::Deny {
                    retry_after: ahead - w.tolerance,
                };
            }
            let (price, deficit) = price(&w.curve, s.deficit, u64::from(cost));
            match s.tat.checked_add(price) {
                Some(tat) => Step::Allow {
                    words: [tat, deficit],
                    spot: [s.tat, tat],
                },
                None => Step::Deny { retry_after: t },
            }
        }

        pub(super) fn state(w: &WarmGcra, s: WarmState, now: u64) -> QuotaState {
            let r = w.resync(s, now);
            let ahead = r.tat - now;
            let remaining = match w
                .tolerance
                .checked_sub(ahead)
                .and_then(|room| room.checked_sub(w.curve.interval))
            {
                Some(budget) => w.curve.fits_before(r.deficit, budget).saturating_add(1),
                None => 0,
            };
            QuotaState::counted(w.burst(), remaining, s.tat.saturating_sub(now))
        }

        pub(super) fn charged(w: &WarmGcra, s: WarmState, now: u64, cost: u32) -> WarmState {
            let s = w.resync(s, now);
            let (price, deficit) = price(&w.curve, s.deficit, u64::from(cost));
            WarmState {
                tat: s.tat.saturating_add(price),
                deficit,
            }
        }

        /// What a check judged: the step, the figures after it, the words kept and the idle
        /// time of the words after it.
        pub(super) fn judge_kept(
            w: &WarmGcra,
            words: Words,
            now: u64,
            cost: u32,
        ) -> (Step, QuotaState, Option<Words>, u64) {
            let step = step(w, warm(words), now, cost);
            let kept = match step {
                Step::Allow { words, .. } if cost > 0 => Some(words),
                _ => None,
            };
            let after = kept.unwrap_or(words);
            (
                step,
                state(w, warm(after), now),
                kept,
                w.idle_at(warm(after)),
            )
        }
    }

    use super::super::step::Words;
    use super::super::two::warm;

    fn judge_kept(
        w: &WarmGcra,
        words: Words,
        now: u64,
        cost: u32,
    ) -> (Step, QuotaState, Option<Words>, u64) {
        let ((step, state), kept, idle) = TwoKind::judge_kept(w, words, now, cost);
        // The parts a check asks for alone say the same.
        assert_eq!(TwoKind::judge(w, words, now, cost), (step, state));
        assert_eq!(WarmGcra::state(w, warm(kept.unwrap_or(words)), now), state);
        assert_eq!(WarmGcra::step(w, warm(words), now, cost), step);
        (step, state, kept, idle)
    }

    /// Intervals from 1 ns and 1 µs (10^6 per second) to an hour, at the edges too.
    fn interval() -> impl Strategy<Value = u64> {
        prop_oneof![
            1u64..1_000,
            1_000u64..=3_600_000_000_000,
            Just(1_000u64),
            Just(1_000_000_000u64),
            Just(3_600_000_000_000u64),
        ]
    }

    /// Periods up to the longest a quota accepts; cold factors 1 to 10 mostly, and to the
    /// largest; both units.
    fn curve() -> impl Strategy<Value = Curve> {
        (
            interval(),
            prop_oneof![
                1u64..1_000_000,
                1_000_000u64..100_000_000_000,
                1u64..=(1 << 60)
            ],
            prop_oneof![4 => 1u32..=10, 1 => 1u32..=u32::MAX],
            prop_oneof![Just(1u64), Just(1_000u64)],
        )
            .prop_map(|(t, p, f, u)| Curve::new(t, p, f, u))
    }

    /// A tolerance of a few requests, of many, or up to the edge of the clock.
    fn quota() -> impl Strategy<Value = WarmGcra> {
        (
            curve(),
            prop_oneof![1u64..=10, 1u64..=u64::from(u32::MAX)],
            0u64..=u64::MAX,
            0u8..4,
        )
            .prop_map(|(c, burst, any, pick)| {
                let tolerance = match pick {
                    0 => any,
                    1 => u64::MAX,
                    _ => c.interval.saturating_mul(burst),
                };
                WarmGcra::new(c, tolerance)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// One check on any state: `tat` before, at or after now (by up to the tolerance
        /// and beyond, to the clock's edge), a deficit of any share of the curve's most and
        /// beyond it (stored under a larger curve before a change), any cost.
        #[test]
        fn a_check_with_its_work_shared_judges_as_each_part_apart(
            w in quota(),
            now in prop_oneof![0u64..1_000_000_000_000, 0u64..=u64::MAX, Just(u64::MAX)],
            back in prop_oneof![Just(0u64), 0u64..=u64::MAX],
            ahead in prop_oneof![0u64..=u64::MAX, 0u64..10_000_000_000],
            later in proptest::bool::ANY,
            share in prop_oneof![0u64..=1_000, 1_000u64..=3_000, Just(0u64), Just(1_000u64)],
            huge_deficit in proptest::bool::weighted(0.02),
            cost in prop_oneof![0u32..=3, 0u32..=u32::MAX, Just(u32::MAX)],
        ) {
            // `ahead` as a share of the tolerance, mostly, so that both sides of the test
            // are met.
            let tat = if later {
                now.saturating_add(ahead % w.tolerance.saturating_add(2).max(1))
            } else {
                now.saturating_sub(back)
            };
            let deficit = if huge_deficit { u64::MAX } else { mul_div(w.curve.max, share, 1_000) };
            let words = [tat, deficit];
            prop_assert_eq!(judge_kept(&w, words, now, cost), before::judge_kept(&w, words, now, cost));
        }
    }

    /// What is done to a key in a run.
    #[derive(Debug, Clone)]
    enum Op {
        /// A check of `cost`, `gap` ns after the last instant.
        Check { gap: u64, cost: u32 },
        /// `cost` settled after the response (taken whatever the limit).
        Settle { gap: u64, cost: u32 },
        /// `units` of the last admission given back.
        Refund { gap: u64, units: u32 },
        /// The quota replaced: another curve, rate or tolerance.
        Change(WarmGcra),
    }

    fn op() -> impl Strategy<Value = Op> {
        let gap = prop_oneof![Just(0u64), 0u64..2_000_000_000, 0u64..200_000_000_000];
        prop_oneof![
            12 => (gap.clone(), prop_oneof![0u32..=3, 0u32..=100]).prop_map(|(gap, cost)| Op::Check { gap, cost }),
            2 => (gap.clone(), 0u32..=5).prop_map(|(gap, cost)| Op::Settle { gap, cost }),
            2 => (gap, 0u32..=3).prop_map(|(gap, units)| Op::Refund { gap, units }),
            1 => quota().prop_map(Op::Change),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// Runs of checks, settled charges, refunds of the last admission and changes of the
        /// quota: the key's words, every step, figure and idle time are the same on both
        /// paths at every point.
        #[test]
        fn runs_of_checks_refunds_settles_and_changes_keep_both_paths_alike(
            first in quota(),
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let mut w = first;
            let mut now = 1_000_000_000_000u64;
            let (mut ours, mut theirs) = ([0u64; 2], [0u64; 2]);
            let mut last: Option<(Words, u32)> = None;
            for op in ops {
                match op {
                    Op::Check { gap, cost } => {
                        now = now.saturating_add(gap);
                        let a = judge_kept(&w, ours, now, cost);
                        let b = before::judge_kept(&w, theirs, now, cost);
                        prop_assert_eq!(a, b);
                        if let (Step::Allow { spot, .. }, Some(kept)) = (a.0, a.2) {
                            ours = kept;
                            theirs = b.2.unwrap_or(theirs);
                            last = Some((spot, cost));
                        }
                    }
                    Op::Settle { gap, cost } => {
                        now = now.saturating_add(gap);
                        ours = Rule::WarmUp(w).charge(ours, now, cost);
                        let s = before::charged(&w, warm(theirs), now, cost);
                        theirs = [s.tat, s.deficit];
                    }
                    Op::Refund { gap, units } => {
                        now = now.saturating_add(gap);
                        if let Some((spot, cost)) = last.take() {
                            let units = units.min(cost);
                            ours = Rule::WarmUp(w).refund(ours, now, spot, cost, units);
                            theirs = Rule::WarmUp(w).refund(theirs, now, spot, cost, units);
                        }
                    }
                    Op::Change(next) => {
                        w = next;
                        last = None;
                    }
                }
                prop_assert_eq!(ours, theirs);
                prop_assert_eq!(w.idle_at(warm(ours)), w.idle_at(warm(theirs)));
            }
        }
    }
}
