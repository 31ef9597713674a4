//! The run-time side of adaptive limits and priorities: a limit that moves while permits are
//! out, and the share of it each class of request may take.
//!
//! * [`Control`] is one per layer: the current limit (set by the [`LimitAlgorithm`] from the
//!   latency of completed requests, or fixed), the measured latency and the count of sheds.
//! * [`GateCtl`] is one per semaphore (the global one, or one per key). It follows the
//!   layer's limit lazily, whenever a permit is taken or given back: a higher limit adds
//!   permits at once (waiters are woken); a lower one becomes a **debt**, paid first with free
//!   permits and then with permits given back, which are forgotten instead of returned until
//!   the debt is paid; a permit that reaches a waiter while a debt is owed pays it too, and
//!   the waiter waits again. Requests in flight are never cut short.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::adaptive::{LimitAlgorithm, Sample};
use crate::error::ConfigError;
use crate::key::RequestHead;
use crate::observe::AdaptiveMeter;
use crate::Clock;

/// How important a request is, for [`ConcurrencyLimitLayer::priority`]: the share of the
/// current limit it may take.
///
/// A request of a class is admitted only while the requests in flight, itself included, stay
/// within its class's share of the current limit `L`. With the default [`Shares`]:
///
/// | class        | may take the permit while in flight (with it) ≤ | at `L` = 20 | at `L` = 1 |
/// |--------------|-----------------------------------------------|-------------|------------|
/// | `Critical`   | `L`                                           | 20          | 1          |
/// | `Normal`     | `⌊0.9 × L⌋` = `L − ⌈L / 10⌉`                  | 18          | 0          |
/// | `Sheddable`  | `⌊0.5 × L⌋`                                   | 10          | 0          |
///
/// The shares count all classes together, so whatever the flood of normal and sheddable
/// requests, `⌈L / 10⌉` places are only ever taken by critical requests, and sheddable
/// traffic alone never holds more than half of the limit. The check and the count are one
/// atomic step: racing requests cannot overshoot a share.
/// [`ConcurrencyLimitLayer::shares`] sets other fractions.
///
/// [`ConcurrencyLimitLayer::priority`]: super::ConcurrencyLimitLayer::priority
/// [`ConcurrencyLimitLayer::shares`]: super::ConcurrencyLimitLayer::shares
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// The first to go under pressure: health checks of other systems, prefetches, batch jobs.
    Sheddable,
    /// Ordinary traffic.
    Normal,
    /// Kept as long as anything is: logins, payments, the requests that matter most.
    Critical,
}

impl Priority {
    /// The most requests that may be in flight, a request of this class included, for it to
    /// be admitted under the limit `limit`, with the default [`Shares`].
    pub fn share(self, limit: usize) -> usize {
        Shares::default().share(self, limit)
    }
}

/// Parts per million in a share.
const PPM: u128 = 1_000_000;

/// The fractions of the current limit that [`Priority::Sheddable`] and [`Priority::Normal`]
/// requests may take, for
/// [`ConcurrencyLimitLayer::shares`](crate::ConcurrencyLimitLayer::shares); critical requests
/// may always take all of it.
///
/// Under the limit `L`, a request is admitted while the requests in flight of all classes,
/// itself included, are at most `⌊sheddable × L⌋` for a sheddable request, `⌊normal × L⌋`
/// for a normal one, and `L` for a critical one. So `L − ⌊normal × L⌋` places (that is
/// `⌈(1 − normal) × L⌉`) are only ever taken by critical requests. The fractions are kept to
/// a millionth.
///
/// A share that rounds down to 0 admits no request of its class at that limit (at `L = 1`
/// with the defaults, only critical requests pass).
///
/// ```
/// use tollgate::concurrency::{Priority, Shares};
///
/// // Sheddable requests may hold a quarter of the limit, normal ones 60%: 40% is kept for
/// // critical requests.
/// let shares = Shares::new(0.25, 0.6);
/// assert_eq!(shares.share(Priority::Sheddable, 20), 5);
/// assert_eq!(shares.share(Priority::Normal, 20), 12);
/// assert_eq!(shares.share(Priority::Critical, 20), 20);
///
/// // Read at run time: out of order, zero, over 1 or not a number is an error.
/// assert!(Shares::try_new(0.9, 0.5).is_err());
/// assert!(Shares::try_new(0.0, 0.5).is_err());
/// assert!(Shares::try_new(0.5, 1.5).is_err());
/// assert!(Shares::try_new(f64::NAN, 0.5).is_err());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shares {
    /// Millionths of the limit.
    sheddable: u32,
    normal: u32,
}

impl fmt::Debug for Shares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shares")
            .field("sheddable", &self.sheddable())
            .field("normal", &self.normal())
            .finish()
    }
}

impl Default for Shares {
    /// Sheddable 0.5, normal 0.9.
    fn default() -> Self {
        Shares {
            sheddable: 500_000,
            normal: 900_000,
        }
    }
}

impl Shares {
    /// Shares of `sheddable` and `normal` of the limit, `0 < sheddable ≤ normal ≤ 1`.
    ///
    /// # Panics
    /// At the caller's line, with [`ConfigError::InvalidShares`], when they are not; see
    /// [`try_new`](Self::try_new) for values read at run time.
    #[track_caller]
    pub fn new(sheddable: f64, normal: f64) -> Shares {
        match Self::try_new(sheddable, normal) {
            Ok(shares) => shares,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Shares of `sheddable` and `normal` of the limit: `0 < sheddable ≤ normal ≤ 1`, or
    /// [`ConfigError::InvalidShares`].
    pub fn try_new(sheddable: f64, normal: f64) -> Result<Shares, ConfigError> {
        let valid = sheddable > 0.0 && sheddable <= normal && normal <= 1.0;
        if !valid {
            return Err(ConfigError::InvalidShares(format!(
                "sheddable {sheddable}, normal {normal}"
            )));
        }
        // Finite and within (0, 1]: rounds to at most a million; a positive share keeps at
        // least a millionth.
        let ppm = |f: f64| ((f * 1e6).round() as u32).max(1);
        Ok(Shares {
            sheddable: ppm(sheddable),
            normal: ppm(normal),
        })
    }

    /// The fraction of the limit sheddable requests may take.
    pub fn sheddable(&self) -> f64 {
        f64::from(self.sheddable) / 1e6
    }

    /// The fraction of the limit normal requests may take.
    pub fn normal(&self) -> f64 {
        f64::from(self.normal) / 1e6
    }

    /// The most requests that may be in flight, a request of `priority` included, for it to
    /// be admitted under the limit `limit`.
    pub fn share(&self, priority: Priority, limit: usize) -> usize {
        let part = |ppm: u32| {
            // At most `limit`: the fraction is at most one.
            usize::try_from(limit as u128 * u128::from(ppm) / PPM).unwrap_or(limit)
        };
        match priority {
            Priority::Critical => limit,
            Priority::Normal => part(self.normal),
            Priority::Sheddable => part(self.sheddable),
        }
    }
}

/// Classifies a request.
pub(crate) type Classifier = Arc<dyn Fn(&RequestHead<'_>) -> Priority + Send + Sync>;

/// A concurrency limit must be at least 1 and fit a semaphore: the rule for the limit a layer
/// is built with and the one a handle sets.
pub(crate) fn check_max(max: usize) -> Result<(), ConfigError> {
    if (1..=Semaphore::MAX_PERMITS).contains(&max) {
        Ok(())
    } else {
        Err(ConfigError::InvalidConcurrency(max))
    }
}

/// The layer's limit and what it measured.
pub(crate) struct Control {
    limit: AtomicUsize,
    /// The layer's `max`: the limit never goes above it. Changed by a handle.
    cap: AtomicUsize,
    algorithm: Option<Mutex<Box<dyn LimitAlgorithm>>>,
    clock: Clock,
    /// Smoothed latency of completed requests, in nanoseconds; 0 before the first.
    latency: AtomicU64,
    sheds: AtomicU64,
    shares: Shares,
    /// The limit, latency and sheds in the metrics.
    meter: Option<AdaptiveMeter>,
}

impl fmt::Debug for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Control")
            .field("limit", &self.limit())
            .field("adaptive", &self.algorithm.is_some())
            .finish_non_exhaustive()
    }
}

impl Control {
    /// A limit that stays at `max` (for priorities without an algorithm).
    pub(crate) fn fixed(max: usize) -> Self {
        Control::new(max, max, None)
    }

    /// A limit moved by `algorithm`, never above `max`.
    pub(crate) fn adaptive(max: usize, algorithm: Box<dyn LimitAlgorithm>) -> Self {
        let initial = algorithm.initial_limit().clamp(1, max);
        Control::new(initial, max, Some(Mutex::new(algorithm)))
    }

    fn new(limit: usize, cap: usize, algorithm: Option<Mutex<Box<dyn LimitAlgorithm>>>) -> Self {
        Control {
            limit: AtomicUsize::new(limit),
            cap: AtomicUsize::new(cap),
            algorithm,
            clock: Clock::tokio(),
            latency: AtomicU64::new(0),
            sheds: AtomicU64::new(0),
            shares: Shares::default(),
            meter: None,
        }
    }

    /// Reports the limit, the latency and the sheds to `meter`, starting with the limit now.
    pub(crate) fn with_meter(mut self, meter: AdaptiveMeter) -> Self {
        meter.learnt(self.limit(), None);
        self.meter = Some(meter);
        self
    }

    /// The shares of the classes below critical.
    pub(crate) fn with_shares(mut self, shares: Shares) -> Self {
        self.shares = shares;
        self
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    /// The layer's `max`.
    pub(crate) fn cap(&self) -> usize {
        self.cap.load(Ordering::Acquire)
    }

    /// Sets the layer's `max` while serving: a fixed limit follows it; an adaptive one is
    /// held under it (the algorithm moves it from there). Each semaphore follows the new
    /// limit on its next permit taken or given back.
    pub(crate) fn set_cap(&self, max: usize) {
        // Under the algorithm's lock, which a sample holds from reading the cap to storing
        // the limit it learnt: else a sample that read the old cap could store a limit above
        // the new one after this returned.
        let _samples = self
            .algorithm
            .as_ref()
            .map(|a| a.lock().unwrap_or_else(|e| e.into_inner()));
        self.cap.store(max, Ordering::Release);
        let _ = self
            .limit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |limit| {
                Some(if self.algorithm.is_none() {
                    max
                } else {
                    limit.min(max)
                })
            });
    }

    /// Whether permits should note when they were taken.
    #[inline]
    pub(crate) fn measuring(&self) -> bool {
        self.algorithm.is_some()
    }

    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(self.clock.now())
    }

    pub(crate) fn latency(&self) -> Option<Duration> {
        match self.latency.load(Ordering::Acquire) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    pub(crate) fn sheds(&self) -> u64 {
        self.sheds.load(Ordering::Acquire)
    }

    fn shed(&self) {
        self.sheds.fetch_add(1, Ordering::AcqRel);
        if let Some(m) = &self.meter {
            m.shed();
        }
    }

    /// A request that took its permit at `start`, with `in_flight` in flight, has completed.
    pub(crate) fn record(&self, start: Duration, in_flight: usize, dropped: bool) {
        let Some(algorithm) = &self.algorithm else {
            return;
        };
        let at = self.now();
        let rtt = at.saturating_sub(start);
        let nanos = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        // An exponential average over about 8 requests: what a dashboard would show.
        let _ = self
            .latency
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                Some(if old == 0 {
                    nanos
                } else {
                    let old = i128::from(old);
                    (old + (i128::from(nanos) - old) / 8).clamp(1, i128::from(u64::MAX)) as u64
                })
            });
        let sample = Sample {
            at,
            rtt,
            in_flight,
            dropped,
        };
        let mut algorithm = algorithm.lock().unwrap_or_else(|e| e.into_inner());
        let limit = algorithm.update(sample).clamp(1, self.cap());
        self.limit.store(limit, Ordering::Release);
        if let Some(m) = &self.meter {
            m.learnt(limit, self.latency());
        }
    }
}

/// A semaphore's view of the layer's limit.
pub(crate) struct GateCtl {
    pub(crate) control: Arc<Control>,
    /// The limit the semaphore's permits (free, out, and owed) add up to.
    applied: AtomicUsize,
    /// Permits to forget instead of giving back.
    debt: AtomicUsize,
    in_flight: AtomicUsize,
}

impl GateCtl {
    /// A view and the permits its semaphore starts with.
    pub(crate) fn new(control: Arc<Control>) -> (Self, usize) {
        let limit = control.limit();
        let ctl = GateCtl {
            control,
            applied: AtomicUsize::new(limit),
            debt: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
        };
        (ctl, limit)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Brings the semaphore to the layer's current limit.
    #[inline]
    pub(crate) fn sync(&self, sem: &Semaphore) {
        let target = self.control.limit();
        let mut applied = self.applied.load(Ordering::Acquire);
        while applied != target {
            match self.applied.compare_exchange_weak(
                applied,
                target,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if target > applied {
                        let grow = target - applied;
                        let paid = self.take_debt(grow);
                        if grow > paid {
                            sem.add_permits(grow - paid);
                        }
                    } else {
                        self.debt.fetch_add(applied - target, Ordering::AcqRel);
                    }
                    break;
                }
                Err(now) => applied = now,
            }
        }
        // Free permits pay the debt: at once after a lower limit, and a permit that came back
        // free while it was owed (handed on inside the semaphore by a waiter that went away)
        // before anyone takes it. Permits in flight pay it as they come back.
        while self.debt.load(Ordering::Acquire) > 0 {
            let Ok(permit) = sem.try_acquire() else {
                break;
            };
            permit.forget();
            if self.take_debt(1) == 0 {
                // Paid meanwhile by a permit given back: this one is not owed.
                sem.add_permits(1);
                break;
            }
        }
    }

    /// Takes up to `n` off the debt; how much was taken.
    fn take_debt(&self, n: usize) -> usize {
        match self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (d > 0).then(|| d - d.min(n))
            }) {
            Ok(d) => d.min(n),
            Err(_) => 0,
        }
    }

    /// Reserves a place for a request of `priority` if the requests in flight are within its
    /// share; the semaphore is tried next. Counts a shed otherwise.
    #[inline]
    pub(crate) fn reserve(&self, priority: Priority) -> bool {
        let share = self.control.shares.share(priority, self.control.limit());
        let ok = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < share).then_some(n + 1)
            })
            .is_ok();
        if !ok {
            self.control.shed();
        }
        ok
    }

    /// Gives back a reservation that got no permit.
    pub(crate) fn unreserve(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// A permit was taken without a reservation (critical requests, waiters).
    pub(crate) fn taken(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A waiter was handed a permit: whether it must pay the debt with it instead of
    /// starting. A permit reaches a waiter while the limit owes permits only when it was
    /// handed before the limit came down (the waiter had not started yet), or handed on
    /// inside the semaphore by a waiter that went away meanwhile; either way starting would
    /// put more in flight than the limit in force.
    #[inline]
    pub(crate) fn owed(&self, sem: &Semaphore) -> bool {
        self.sync(sem);
        self.take_debt(1) == 1
    }

    /// A permit comes back: returned to the semaphore, or forgotten to pay the debt.
    ///
    /// The limit is followed first: the request giving the permit back may just have taught
    /// the algorithm a lower one, and its permit must pay that debt, not go to a waiter.
    #[inline]
    pub(crate) fn release(&self, sem: &Semaphore) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.sync(sem);
        if self.take_debt(1) == 0 {
            sem.add_permits(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_keep_a_place_for_critical_requests_at_every_limit() {
        for limit in 1..=1000 {
            assert!(Priority::Normal.share(limit) < limit);
            assert!(Priority::Sheddable.share(limit) <= Priority::Normal.share(limit));
            assert_eq!(Priority::Critical.share(limit), limit);
        }
        assert_eq!(Priority::Normal.share(20), 18);
        assert_eq!(Priority::Sheddable.share(20), 10);
        assert_eq!(Priority::Normal.share(1), 0);
        assert_eq!(
            Priority::Normal.share(usize::MAX),
            usize::MAX - usize::MAX.div_ceil(10)
        );
    }

    #[test]
    fn default_shares_are_the_integer_formulas_at_every_limit() {
        let d = Shares::default();
        for limit in (0..=10_000).chain([usize::MAX - 1, usize::MAX]) {
            assert_eq!(d.share(Priority::Normal, limit), limit - limit.div_ceil(10));
            assert_eq!(d.share(Priority::Sheddable, limit), limit / 2);
        }
        assert_eq!((d.sheddable(), d.normal()), (0.5, 0.9));
    }

    #[test]
    fn shares_are_validated_and_exact_at_their_edges() {
        for (s, n) in [
            (0.0, 0.5),
            (-0.1, 0.5),
            (0.6, 0.5),
            (0.5, 1.000_001),
            (f64::NAN, 0.5),
            (0.5, f64::NAN),
            (f64::INFINITY, f64::INFINITY),
            (f64::NEG_INFINITY, 0.5),
        ] {
            let err = Shares::try_new(s, n).unwrap_err();
            assert!(matches!(err, ConfigError::InvalidShares(_)), "{s} {n}");
        }
        // All of the limit to every class: no place kept for critical requests.
        let all = Shares::new(1.0, 1.0);
        for p in [Priority::Sheddable, Priority::Normal, Priority::Critical] {
            assert_eq!(all.share(p, 1), 1);
            assert_eq!(all.share(p, usize::MAX), usize::MAX);
        }
        // The smallest share: a millionth, nothing below a million.
        let tiny = Shares::new(1e-12, 1e-12);
        assert_eq!(tiny.share(Priority::Sheddable, 999_999), 0);
        assert_eq!(tiny.share(Priority::Normal, 1_000_000), 1);
        assert_eq!(tiny.share(Priority::Critical, 1), 1);
        // Fractions are exact to the millionth: no float rounding below the whole request.
        let s = Shares::new(0.3, 0.7);
        assert_eq!(s.share(Priority::Sheddable, 10), 3);
        assert_eq!(s.share(Priority::Normal, 10), 7);
        assert_eq!(s.share(Priority::Normal, 1), 0);
    }

    /// A fixed-step algorithm: answers the limits it is given, one per sample.
    struct Script(Vec<usize>);

    impl LimitAlgorithm for Script {
        fn initial_limit(&self) -> usize {
            4
        }
        fn bounds(&self) -> (usize, usize) {
            (1, 100)
        }
        fn update(&mut self, _: Sample) -> usize {
            self.0.remove(0)
        }
    }

    fn take(sem: &Semaphore, ctl: &GateCtl) -> bool {
        ctl.sync(sem);
        match sem.try_acquire() {
            Ok(p) => {
                p.forget();
                ctl.taken();
                true
            }
            Err(_) => false,
        }
    }

    #[test]
    fn a_lower_limit_is_paid_by_permits_given_back_and_a_higher_one_pays_the_debt_first() {
        let control = Arc::new(Control::adaptive(100, Box::new(Script(vec![2, 3, 6]))));
        let (ctl, permits) = GateCtl::new(control.clone());
        let sem = Semaphore::new(permits);
        assert_eq!(permits, 4);
        for _ in 0..4 {
            assert!(take(&sem, &ctl));
        }
        assert!(!take(&sem, &ctl));
        // Limit 2 with 4 out: a debt of 2, paid by the next two permits given back.
        control.record(Duration::ZERO, 4, false);
        ctl.release(&sem);
        assert_eq!(sem.available_permits(), 0);
        // Limit 3 with 2 out: the rest of the debt is forgiven, one place is free.
        control.record(Duration::ZERO, 4, false);
        ctl.release(&sem);
        assert_eq!(sem.available_permits(), 1);
        assert_eq!(ctl.in_flight(), 2);
        ctl.release(&sem);
        assert_eq!(sem.available_permits(), 2);
        // Limit 6 with 1 out: 5 free.
        control.record(Duration::ZERO, 4, false);
        ctl.sync(&sem);
        assert_eq!(sem.available_permits(), 5);
        assert_eq!(ctl.in_flight(), 1);
    }

    #[test]
    fn a_lower_limit_takes_free_permits_at_once() {
        let control = Arc::new(Control::adaptive(100, Box::new(Script(vec![1]))));
        let (ctl, permits) = GateCtl::new(control.clone());
        let sem = Semaphore::new(permits);
        assert!(take(&sem, &ctl));
        control.record(Duration::ZERO, 1, false);
        ctl.sync(&sem);
        assert_eq!(sem.available_permits(), 0);
        ctl.release(&sem);
        assert_eq!(sem.available_permits(), 1);
    }

    /// Always up by one, from 1 to 100.
    struct Climb(usize);

    impl LimitAlgorithm for Climb {
        fn initial_limit(&self) -> usize {
            1
        }
        fn bounds(&self) -> (usize, usize) {
            (1, 100)
        }
        fn update(&mut self, _: Sample) -> usize {
            self.0 = self.0 % 100 + 1;
            self.0
        }
    }

    #[test]
    fn a_lower_max_holds_the_limit_under_it_from_the_moment_it_is_set_while_samples_race() {
        let control = Arc::new(Control::adaptive(100, Box::new(Climb(1))));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (control, stop) = (control.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    control.record(Duration::ZERO, 1, false);
                }
            })
        };
        for i in 0..200_000usize {
            let max = 1 + i % 7;
            control.set_cap(max);
            // Only this thread changes the cap: from now on every limit is under it.
            for _ in 0..3 {
                assert!(
                    control.limit() <= max,
                    "limit {} over max {max}",
                    control.limit()
                );
            }
            control.set_cap(100);
        }
        stop.store(true, Ordering::Release);
        sampler.join().unwrap();
    }

    #[test]
    fn the_layer_max_caps_the_algorithm() {
        let control = Control::adaptive(3, Box::new(Script(vec![50, 0])));
        assert_eq!(control.limit(), 3);
        control.record(Duration::ZERO, 1, false);
        assert_eq!(control.limit(), 3);
        // An algorithm answering 0 still leaves one place.
        control.record(Duration::ZERO, 1, false);
        assert_eq!(control.limit(), 1);
    }
}
