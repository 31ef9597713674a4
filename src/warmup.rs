//! Warm-up: after idleness, a key's admitted rate starts low and rises to the quota's rate.
//!
//! A service that has been idle (cold caches, cold connection pools, a JIT that has not
//! compiled the hot path yet) cannot take its full rate at once. With [`WarmUp`], a quota
//! admits `rate / cold_factor` right after idleness and climbs to `rate` over the warm-up
//! period, the way Guava's `SmoothWarmingUp` rate limiter (and Sentinel's warm-up control)
//! define it. The same curve spaces out the departures of a [`Shaper`](crate::Shaper)
//! queue (Sentinel's "warm-up with queue").
//!
//! # The model
//!
//! Write `T` for the quota's emission interval (`period / count`), `W` for the warm-up period
//! and `f` for the cold factor. Each key keeps, besides its theoretical arrival time `tat`, a
//! number of *stored permits*. Stored permits accumulate while the key is idle (`now > tat`)
//! and are spent by requests; the more the key has stored, the colder it is and the more a
//! request costs:
//!
//! ```text
//!   cost of one
//!   request
//!     f·T  +                 /      cold
//!          |               / |
//!          |             /   |     the area of the trapezoid between
//!          |           /     |     `threshold` and `max` is W
//!       T  +---------/       |
//!          |  stable |  warm |
//!        0 +---------+-------+---> stored permits
//!          0     threshold  max
//! ```
//!
//! * `threshold = W / (2T)` permits; `max = threshold + 2W / (T + f·T)` permits.
//! * A permit taken when `x` permits are stored above `threshold` costs
//!   `T + x · slope`, with `slope = (f·T − T) / (max − threshold)`. Below the threshold a
//!   permit costs `T`, exactly like a request of plain GCRA.
//! * Taking `k` permits from `a` stored above the threshold costs the area under that line:
//!   `k·T + slope · (a² − (a − k)²) / 2`. Spending the whole warm zone (from `max` down to
//!   `threshold`) costs exactly `W`: a key that is sent requests as fast as it admits them
//!   goes from cold to warm in `W`.
//! * An idle key gains `max / W` permits per second (so it goes from warm to fully cold in
//!   `W`), up to `max`. A key never seen is fully cold.
//!
//! A request of cost `c` at `now` is then decided like GCRA, except for what it costs:
//!
//! ```text
//! if tat < now:  stored = min(max, stored + (now − tat) · max / W);  base = now
//! else:          base = tat
//! allow    = base + c·T − now <= tau               (exactly plain GCRA's test)
//! spent    = min(c, stored)                        (only when allowed)
//! new_tat  = base + c·T + slope · (a² − (a − min(a, spent))²) / 2,  a = stored − threshold
//! stored   = stored − spent
//! ```
//!
//! A request is admitted exactly when plain GCRA would admit it; the warm-up surcharge moves
//! `tat` further ahead, so the requests *after* it wait longer. That is how Guava charges too
//! (a request pays for the one before it), so with burst 1 the spacing of admitted requests is
//! Guava's `acquire()` wait, request for request. With a larger burst an idle key still admits a
//! short burst, smaller than when warm, since every cold request uses up more of the
//! tolerance.
//!
//! With `f = 1` the surcharge is zero: the quota behaves exactly like plain GCRA.
//!
//! The `RateLimit` header field reports `r` as the requests of cost 1 that would be admitted
//! one after another now (fewer than the burst while the key is cold) and `t` as the time
//! until the key's backlog is clear (`tat − now`): from then on a request is admitted at
//! once. It is not a time until "full": an idle key grows colder, not fuller.
//!
//! # Guava's example
//!
//! `RateLimiter.create(2, 3, SECONDS)` (Guava's cold factor is always 3): `T = 0.5 s`,
//! `threshold = 3`, `max = 6` permits, `slope = 1/3 s` per permit. The cost line is at
//! 1.5 s, 1.167 s, 0.833 s and 0.5 s when 6, 5, 4 and 3 permits are stored; a request takes
//! one permit and pays the area of its strip, the mean of the two ends: 1.333 s, 1 s,
//! 0.667 s, then 0.5 s for every later one. Guava's `acquire()` returns these waits
//! (0, 1.333, 1, 0.667, 0.5, …), and so does this crate (`tests` in this module pin them to
//! the nanosecond).
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

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;

/// The longest warm-up period: 2^60 ns, about 36 years. Longer ones are refused, so that every
/// product the Redis script computes stays exact.
pub const MAX_WARM_UP_PERIOD: Duration = Duration::from_nanos(1 << 60);

/// How a quota warms up after idleness: over `period`, from `rate / cold_factor` to the
/// quota's rate. See the [module docs](self) for the exact model.
///
/// ```
/// use std::time::Duration;
/// use tollgate::warmup::WarmUp;
///
/// let w = WarmUp::new(Duration::from_secs(3), 3);
/// assert_eq!(w.cold_factor(), 3);
/// assert!(WarmUp::try_new(Duration::ZERO, 3).is_err());
/// assert!(WarmUp::try_new(Duration::from_secs(3), 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarmUp {
    period: Duration,
    cold_factor: u32,
}

impl WarmUp {
    /// Warm-up over `period`, starting at `rate / cold_factor`.
    ///
    /// # Panics
    /// When `period` is zero or longer than [`MAX_WARM_UP_PERIOD`], or `cold_factor` is zero;
    /// use [`WarmUp::try_new`] for values from configuration.
    #[track_caller]
    #[must_use]
    pub fn new(period: Duration, cold_factor: u32) -> Self {
        match Self::try_new(period, cold_factor) {
            Ok(w) => w,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Warm-up over `period`, starting at `rate / cold_factor`, or why it cannot work.
    pub fn try_new(period: Duration, cold_factor: u32) -> Result<Self, ConfigError> {
        if period.is_zero() || period > MAX_WARM_UP_PERIOD {
            return Err(ConfigError::InvalidWarmUpPeriod(period));
        }
        if cold_factor == 0 {
            return Err(ConfigError::InvalidColdFactor(cold_factor));
        }
        Ok(WarmUp {
            period,
            cold_factor,
        })
    }

    /// How long a key sent requests as fast as it admits them takes to go from cold to its
    /// full rate (and an idle key from warm to fully cold).
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How much slower than the quota's rate a fully cold key starts.
    pub fn cold_factor(&self) -> u32 {
        self.cold_factor
    }

    /// The curve for emission interval `interval` (ns), computed in units of `unit` (1 µs for
    /// quotas, 1 ns for shapers).
    pub(crate) fn curve(&self, interval: u64, unit: Duration) -> Curve {
        // At most 2^60 ns: validated at construction.
        let period = self.period.as_nanos() as u64;
        Curve::new(interval, period, self.cold_factor, unit.as_nanos() as u64)
    }
}

impl fmt::Display for WarmUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warm-up over {:?} from 1/{} of the rate",
            self.period, self.cold_factor
        )
    }
}

/// `⌊x · y / d⌋` in 128 bits (`d > 0`); saturates at `u64::MAX`.
#[inline]
pub(crate) fn mul_div(x: u64, y: u64, d: u64) -> u64 {
    let q = u128::from(x) * u128::from(y) / u128::from(d.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `⌈x · y / d⌉` in 128 bits (`d > 0`); saturates at `u64::MAX`.
#[inline]
fn mul_div_ceil(x: u64, y: u64, d: u64) -> u64 {
    let q = (u128::from(x) * u128::from(y)).div_ceil(u128::from(d.max(1)));
    u64::try_from(q).unwrap_or(u64::MAX)
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

    /// The deficit after `idle` nanoseconds without a request.
    #[inline]
    pub(crate) fn regain(&self, deficit: u64, idle: u64) -> u64 {
        let idle = idle / self.unit;
        if deficit == 0 || idle == 0 {
            return deficit;
        }
        let gained = mul_div(idle.min(self.period), self.max, self.period);
        deficit.saturating_sub(gained)
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
    /// threshold.
    #[inline]
    fn surcharge_to(&self, x: u64) -> u64 {
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
    #[inline]
    fn surcharge(&self, deficit: u64, n: u64) -> u64 {
        let a = self.above(deficit);
        let k = a.min(self.interval_units.saturating_mul(n));
        (self.surcharge_to(a) - self.surcharge_to(a - k)).saturating_mul(self.unit)
    }

    /// The most requests of cost 1 that a key with `deficit` can take one after another
    /// within `budget` ns: the largest `n` with `n·T + surcharge(n) <= budget`.
    pub(crate) fn fits(&self, deficit: u64, budget: u64) -> u64 {
        let t = self.interval;
        let fits = |n: u64| {
            n.checked_mul(t)
                .and_then(|c| c.checked_add(self.surcharge(deficit, n)))
                .is_some_and(|c| c <= budget)
        };
        // Without the surcharge: budget / T, an upper bound.
        let (mut lo, mut hi) = (0u64, budget / t);
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
}

/// What a warm-up quota says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WarmStep {
    /// Admitted; store this state (unless the cost is 0).
    Allow(WarmState),
    /// Not now; admissible after `retry_after`.
    Deny { retry_after: u64 },
    /// The cost is larger than the burst.
    Never,
}

impl WarmGcra {
    pub(crate) fn new(curve: Curve, tolerance: u64) -> Self {
        WarmGcra { curve, tolerance }
    }

    /// The burst, in requests (`q` in `RateLimit-Policy`).
    pub(crate) fn burst(&self) -> u64 {
        self.tolerance / self.curve.interval
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
    #[inline]
    pub(crate) fn step(&self, s: WarmState, now: u64, cost: u32) -> WarmStep {
        let t = self.curve.interval;
        let inc = t.saturating_mul(u64::from(cost));
        if inc > self.tolerance {
            return WarmStep::Never;
        }
        let s = self.resync(s, now);
        let Some(stable_tat) = s.tat.checked_add(inc) else {
            return WarmStep::Deny { retry_after: t };
        };
        let ahead = stable_tat - now;
        if ahead > self.tolerance {
            return WarmStep::Deny {
                retry_after: ahead - self.tolerance,
            };
        }
        let (price, deficit) = self.curve.price(s.deficit, u64::from(cost));
        match s.tat.checked_add(price) {
            Some(tat) => WarmStep::Allow(WarmState { tat, deficit }),
            None => WarmStep::Deny { retry_after: t },
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
    pub(crate) fn remaining(&self, s: WarmState, now: u64) -> u64 {
        let s = self.resync(s, now);
        let ahead = s.tat - now;
        // The n-th request (from 1) is admitted when ahead + (n−1)·T + surcharge(n−1) + T
        // <= tau.
        match self
            .tolerance
            .checked_sub(ahead)
            .and_then(|room| room.checked_sub(self.curve.interval))
        {
            Some(budget) => self.curve.fits(s.deficit, budget).saturating_add(1),
            None => 0,
        }
    }

    /// Time from `now` until the key is the same as one never seen: no backlog and fully cold.
    pub(crate) fn idle_at(&self, s: WarmState) -> u64 {
        s.tat.saturating_add(self.curve.cold_in(s.deficit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            match w.step(s, now, 1) {
                WarmStep::Allow(next) => {
                    admitted.push(now);
                    s = next;
                }
                WarmStep::Deny { retry_after } => {
                    now += retry_after;
                    match w.step(s, now, 1) {
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

    #[test]
    fn a_key_idle_until_cold_in_decides_like_one_never_seen() {
        let w = WarmGcra::new(guava(), 2 * S);
        let mut s = WarmState::default();
        let mut now = S;
        for _ in 0..5 {
            if let WarmStep::Allow(n) = w.step(s, now, 1) {
                s = n;
            }
            now += 300 * MS;
        }
        let idle = w.idle_at(s);
        assert!(idle > s.tat);
        let fresh = WarmState::default();
        for cost in [1, 2, 4] {
            let from_state = w.step(s, idle, cost);
            let from_nothing = w.step(fresh, idle, cost);
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
        let WarmStep::Allow(s) = w.step(WarmState::default(), now, 1) else {
            panic!("first request from cold is admitted");
        };
        assert_eq!(s.tat, now + 1_333_333_334);
        assert_eq!(
            w.step(s, now, 1),
            WarmStep::Deny {
                retry_after: 833_333_334
            }
        );
        assert!(matches!(
            w.step(s, now + 833_333_334, 1),
            WarmStep::Allow(_)
        ));
        assert_eq!(
            w.step(s, now + 833_333_333, 1),
            WarmStep::Deny { retry_after: 1 }
        );
    }

    #[test]
    fn cost_above_burst_never_passes_and_cost_0_consumes_nothing() {
        let w = WarmGcra::new(guava(), S);
        assert_eq!(w.step(WarmState::default(), S, 3), WarmStep::Never);
        assert_eq!(
            w.step(WarmState::default(), S, 0),
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
                while let WarmStep::Allow(n) = w.step(s, now, 1) {
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
        let WarmStep::Allow(s) = w.step(WarmState::default(), S, 1) else {
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
                let _ = w.step(s, u64::MAX / 2, 1);
                let _ = w.remaining(s, u64::MAX / 2);
                let _ = w.idle_at(s);
                let _ = c.price(d, u64::from(u32::MAX));
            }
        }
    }

    #[test]
    fn validation_refuses_what_cannot_work() {
        assert!(WarmUp::try_new(Duration::ZERO, 3).is_err());
        assert!(WarmUp::try_new(Duration::from_secs(1), 0).is_err());
        assert!(WarmUp::try_new(MAX_WARM_UP_PERIOD, 1).is_ok());
        assert!(WarmUp::try_new(MAX_WARM_UP_PERIOD + Duration::from_nanos(1), 1).is_err());
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
                let ours = match g.step(s, now, cost) {
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
