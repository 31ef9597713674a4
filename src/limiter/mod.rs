//! [`RateLimiter`]: the keyed limiter (GCRA or any [`QuotaKind`](crate::QuotaKind)), usable
//! without HTTP.

use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Reservation, MAX_QUOTAS};
use crate::error::ConfigError;
use crate::keyed::{Bound, Room};
use crate::penalty::{Penalties, PenaltyBox};
use crate::quota::Quota;
use crate::store::backend::{Answer, Never, Refunding, Settling};
use crate::store::{Backend, Memory, OnFull};

mod live;
#[cfg(test)]
mod live_meet;

mod memory;
#[cfg(feature = "redis")]
pub(crate) use memory::renews_idle_keys;
pub(crate) mod wait;

use live::{Limits, Live};
use memory::{OneGcra, State};
pub use wait::InsufficientCapacity;
use wait::Lines;

/// The default bound on tracked keys.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A keyed rate limiter: one or more quotas per key, of any [`QuotaKind`](crate::QuotaKind),
/// decided together.
///
/// Cheap to clone; clones share state. The HTTP layer is built on it, and it serves on its own
/// wherever requests are not HTTP: queue consumers, outbound calls, background jobs.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
///
/// // 10 per second and 1000 per hour for each user, all or nothing.
/// let limiter = RateLimiter::<u64>::builder(Quota::per_second(10))
///     .quota(Quota::per_hour(1000))
///     .build();
/// let user = 42;
/// let d = limiter.check(&user);
/// assert!(d.is_allowed());
/// assert_eq!(d.states().len(), 2);
/// ```
///
/// # Semantics
/// * A key idle for long enough admits exactly `burst` requests back to back, then one every
///   emission interval.
/// * [`check_n`](Self::check_n) with a cost `c` takes `c` requests' worth at once; a cost of 0
///   only reports. A cost above a quota's burst can never pass: the decision says
///   [`Outcome::Exceeds`](crate::Outcome::Exceeds) and carries no retry time.
/// * With several quotas, a request that one quota rejects consumes from none.
pub struct RateLimiter<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for RateLimiter<K> {
    fn clone(&self) -> Self {
        RateLimiter {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for RateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("quotas", &self.inner.live.load().quotas)
            .finish_non_exhaustive()
    }
}

struct Inner<K> {
    /// The quotas in force: read once per decision, replaced whole by
    /// [`RateLimiter::set_quotas`].
    live: Live,
    /// Every key's state.
    state: State<K>,
    clock: Clock,
    /// The tasks waiting in `until_ready_n`, in one line per key.
    waiters: Lines<K>,
    /// Its decisions in the metrics, when it has a name.
    #[cfg(feature = "metrics")]
    meter: Option<crate::observe::LimiterMeter>,
}

/// The checks every set of quotas passes, at build time and when replaced.
pub(crate) fn check_quotas(quotas: &[Quota]) -> Result<(), ConfigError> {
    if quotas.is_empty() {
        return Err(ConfigError::NoQuota);
    }
    if quotas.len() > MAX_QUOTAS {
        return Err(ConfigError::TooManyQuotas {
            got: quotas.len(),
            max: MAX_QUOTAS,
        });
    }
    Ok(())
}

/// Whether `new` may replace `old` while serving: as many quotas, each of the kind of the
/// one it replaces (the per-key state of a position is read by its kind).
pub(crate) fn check_replacement(old: &[Quota], new: &[Quota]) -> Result<(), ConfigError> {
    check_quotas(new)?;
    if new.len() != old.len() {
        return Err(ConfigError::QuotaCountChanged {
            was: old.len(),
            got: new.len(),
        });
    }
    if old.iter().zip(new).any(|(o, n)| o.kind() != n.kind()) {
        return Err(ConfigError::NotChangeable(
            "the kind (algorithm) of a quota, whose per-key state it keeps,",
        ));
    }
    Ok(())
}

impl<K: Hash + Eq + Clone + Send + Sync> Room for Inner<K> {
    fn drop_idle(&self) -> bool {
        self.state.drop_idle(self.clock.now())
    }

    fn evict(&self, rank: u8, spare: Option<u64>) -> bool {
        self.state.evict(self.clock.now(), rank, spare)
    }

    fn idle_in(&self) -> u64 {
        self.state.idle_in(self.clock.now())
    }
}

/// Builds a [`RateLimiter`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RateLimiterBuilder<K> {
    key: PhantomData<fn() -> K>,
    quotas: Vec<Quota>,
    clock: Option<Clock>,
    max_keys: usize,
    on_full: OnFull,
    name: Option<Cow<'static, str>>,
}

impl<K: Hash + Eq + Clone + Send + Sync> RateLimiterBuilder<K> {
    /// Names the limiter in the metrics (feature `metrics`): its decisions are counted under
    /// `layer="limiter"`, `policy=<name>` (see [`observe`](crate::observe)). A limiter
    /// without a name is not counted (the limiters of a `RateLimitLayer` are counted by the
    /// layer).
    ///
    /// ```
    /// use tollgate::{Quota, RateLimiter};
    /// let jobs = RateLimiter::<u64>::builder(Quota::per_second(100)).name("jobs").build();
    /// # let _ = jobs;
    /// ```
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Adds a quota, decided together with the others (at most 4 in all: more is
    /// [`ConfigError::TooManyQuotas`] from [`try_build`](Self::try_build)).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// Uses `clock` instead of the system clock.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Bounds the number of tracked keys (default 1 000 000; `0` is
    /// [`ConfigError::ZeroMaxKeys`] from [`try_build`](Self::try_build)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What to do with a new key when `max_keys` active keys are tracked (default
    /// [`OnFull::EvictNearestIdle`]).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }

    /// Builds the limiter.
    ///
    /// # Panics
    /// When the configuration is invalid; see [`try_build`](Self::try_build).
    #[track_caller]
    pub fn build(self) -> RateLimiter<K> {
        match self.try_build() {
            Ok(l) => l,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Builds the limiter, or says which setting is wrong.
    pub fn try_build(self) -> Result<RateLimiter<K>, ConfigError> {
        if self.quotas.is_empty() {
            return Err(ConfigError::NoQuota);
        }
        if self.quotas.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas {
                got: self.quotas.len(),
                max: MAX_QUOTAS,
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let limits = Limits::new(self.quotas);
        let state = State::new(&limits, self.max_keys, self.on_full);
        #[cfg(feature = "metrics")]
        let meter = self.name.as_deref().map(|name| {
            let policy = crate::Policy::new(name.to_owned(), limits.quotas[0].clone());
            let policy = limits.quotas[1..]
                .iter()
                .fold(policy, |p, q| p.quota(q.clone()));
            crate::observe::LimiterMeter::new(name, &policy.item_names(), false)
        });
        #[cfg(not(feature = "metrics"))]
        let _ = self.name;
        Ok(RateLimiter {
            inner: Arc::new(Inner {
                live: Live::new(limits),
                state,
                clock: self.clock.unwrap_or_default(),
                waiters: Lines::default(),
                #[cfg(feature = "metrics")]
                meter,
            }),
        })
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> RateLimiter<K> {
    /// A limiter with one quota, the system clock and the default key bound.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// Starts a builder with a first quota.
    pub fn builder(quota: Quota) -> RateLimiterBuilder<K> {
        RateLimiterBuilder {
            key: PhantomData,
            quotas: vec![quota],
            clock: None,
            max_keys: DEFAULT_MAX_KEYS,
            on_full: OnFull::default(),
            name: None,
        }
    }

    /// Decides one request for `key`.
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Decides a request costing `cost` units for `key`; a cost of 0 only reports.
    #[inline]
    pub fn check_n(&self, key: &K, cost: u32) -> Decision {
        let inner = &*self.inner;
        let now = inner.clock.now();
        // Every shape is decided in this function: the global limiter's whole state is one
        // word, decided in place, a table's lookup is inlined here, and so is each other
        // shape's arm (`State::decide_live`). (Forced into the caller instead, it saved 15
        // instructions on the single key but cost 14 on a table, and a caller that moves the
        // decision right after it was written waited for the writes: twice the wall time in
        // the bench's loop. Every shape but one GCRA quota behind one more call out of line
        // instead, each paid about 30 instructions for the second frame and the second
        // match on the shape, and one GCRA quota saved none.)
        // The decision is stamped where it lies with the generation of the quotas that
        // judged it (`decide_live` stamps its own).
        let mut decision;
        match inner.state.one_gcra() {
            Some(OneGcra::Direct(slot)) => {
                let (g, generation) = inner.live.one();
                decision = memory::decide_one(slot, &g, now, cost);
                decision.stamp(generation);
            }
            Some(OneGcra::Table(keys)) => {
                let (g, generation) = inner.live.one();
                decision = keys.decide(key, &g, &inner.clock, now, cost);
                decision.stamp(generation);
            }
            None => decision = (inner.state).decide_live(&inner.live, key, &inner.clock, now, cost),
        }
        #[cfg(feature = "metrics")]
        if let Some(meter) = &self.inner.meter {
            meter.record(&decision, cost, || Some(self.len()));
        }
        decision
    }

    /// Reports the state of `key` without consuming anything (`check_n(key, 0)`).
    pub fn peek(&self, key: &K) -> Decision {
        self.check_n(key, 0)
    }

    /// Decides a request of `cost` for `key` whose cost may be charged after its response (a
    /// layer that settles): as [`check_n`](Self::check_n), but a cost of 0 needs a place for
    /// the key like any other cost (see `MemoryStore::reserve`).
    pub(crate) fn reserve_n(&self, key: &K, cost: u32) -> Decision {
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner
            .state
            .reserve(&inner.live.load(), key, &inner.clock, now, cost)
    }

    /// Counts this limiter's keys in `bound`, with those of the other tables that share it (a
    /// layer's other tiers, its penalty box); asked for room by them when they have none.
    pub(crate) fn share_bound(&self, bound: &Arc<Bound>)
    where
        K: 'static,
    {
        if !self.inner.state.share(bound) {
            return;
        }
        let inner: Arc<dyn Room> = self.inner.clone();
        bound.join(Arc::downgrade(&inner));
    }

    /// Gives back `units` of the request that this limiter admitted for `key` with
    /// `taken` (its decision's [`Reservation`]) but that was not served after all (a layer
    /// inside rejected it), or served for less: exactly what the request took, and only what
    /// still counts now. See [`settle`](crate::rate_limit::settle#what-a-refund-gives-back).
    pub(crate) fn refund(&self, key: &K, taken: &Reservation, units: u32) {
        if units == 0 || taken.cost == 0 {
            return;
        }
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner
            .state
            .refund(&inner.live.load(), key, now, taken, units)
    }

    /// Settles a request that took `taken` for `key` at the `actual` cost known after its
    /// response: gives back the difference (the end part of what it took, as
    /// [`refund`](Self::refund)), or charges it now even over the limit (the key goes into
    /// debt, which stands until time pays it off). Returns the key's state after settling
    /// (a cost-0 decision).
    pub(crate) fn settle(&self, key: &K, taken: &Reservation, actual: u32) -> Decision {
        let reserved = taken.cost;
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Less => self.refund(key, taken, reserved - actual),
            std::cmp::Ordering::Greater => self.charge(key, actual - reserved),
            std::cmp::Ordering::Equal => {}
        }
        self.check_n(key, 0)
    }

    /// Takes `cost` from `key` whatever its state, beyond the limit if need be: a GCRA quota's
    /// time moves `cost` emission intervals past the later of itself and now; a window counts
    /// `cost` more in its current window.
    fn charge(&self, key: &K, cost: u32) {
        let inner = &*self.inner;
        let now = inner.clock.now();
        inner
            .state
            .charge(&inner.live.load(), key, &inner.clock, now, cost)
    }

    /// Waits until one request for `key` is admitted, then returns its decision.
    ///
    /// Waits with `tokio::time::sleep`, so the limiter's clock must move with tokio's time (the
    /// system clock, or [`Clock::tokio`]).
    ///
    /// # Fairness
    /// The tasks waiting on one key stand in line, first come first served: only the first one
    /// decides (and sleeps for the retry time it is given); the others are parked and woken
    /// once, when their turn comes. Each admission costs one wake, however many tasks wait, and
    /// the key is served at its full rate. Requests decided with [`check`](Self::check) do not
    /// queue: they take what is free when they come.
    ///
    /// # Cancellation safety
    /// Cancel-safe: nothing is consumed until the future completes, so dropping it consumes
    /// nothing, and the next task in line moves up.
    pub async fn until_ready(&self, key: &K) -> Decision {
        wait::admitted_one(self.until_ready_n(key, 1).await)
    }

    /// Waits until a request of `cost` for `key` is admitted.
    ///
    /// Returns [`InsufficientCapacity`] at once when `cost` is larger than a quota's burst.
    /// Waits in the same line as [`until_ready`](Self::until_ready): a large cost at the head
    /// of the line is served before the smaller ones behind it, so it never waits forever
    /// while they take every unit as it comes back.
    ///
    /// # Cancellation safety
    /// Cancel-safe, as [`until_ready`](Self::until_ready).
    pub async fn until_ready_n(
        &self,
        key: &K,
        cost: u32,
    ) -> Result<Decision, InsufficientCapacity> {
        wait::until_ready_n(self, key, cost).await
    }

    /// The quotas in force, in the order given (the latest set by
    /// [`set_quotas`](Self::set_quotas)).
    pub fn quotas(&self) -> Arc<[Quota]> {
        self.inner.live.load().quotas.clone()
    }

    /// The generation of the quotas in force: one more at each change of them
    /// ([`Decision::generation`]).
    pub(crate) fn generation(&self) -> u16 {
        self.inner.live.load().generation
    }

    /// Replaces the quotas of this limiter and of every clone of it, from the next decision
    /// on, keeping the state of every key.
    ///
    /// The new quotas must be as many as the limiter was built with, each of the
    /// [kind](Quota::kind) of the one it replaces (it takes over that quota's per-key state),
    /// and valid; otherwise this returns a [`ConfigError`] and the quotas in force stay.
    ///
    /// # A change judges what a key stored; it never rewrites it
    /// Every key keeps what it was charged, in the terms it was charged in, and the new
    /// quotas judge it from the next decision on, in memory and in Redis alike. GCRA and
    /// warm-up keep the key's theoretical arrival time: a key 1 s ahead of now is 1 s ahead
    /// under any quota, so a change gives no free burst (lowering a burst and raising it
    /// again admits nothing more), takes nothing back, and a debt settled after a response
    /// stands. A fixed window keeps the end it opened with: a new period applies from the
    /// key's next window, a new count at once. A sliding log keeps each request's time and
    /// cost, and a sliding-window counter its counts, judged at once by the new window and
    /// count, except that what had left the old window when the change came stays gone. A
    /// refund or a settlement gives back what its own request took, as it was
    /// measured then (see [`settle`](crate::rate_limit::settle#what-a-refund-gives-back)).
    /// So no sequence of changes admits more over any span than the most generous quota in
    /// force over it allows, each request counted at the price it was charged: a GCRA key is
    /// never further ahead of now than the burst period of the quota that judges it, and the
    /// requests admitted before a change of interval keep their own interval. Counted in
    /// requests, a change to a slower interval can therefore admit more at one instant than
    /// either quota alone (4 under one per 100 ms with a burst of 4, then 4 more under one per
    /// 200 ms with a burst of 6: 400 ms + 800 ms of the new 1.2 s), and a change to a faster
    /// interval fewer. A window kind's promise holds in requests.
    ///
    /// A key idle under the quotas in force when the change comes (its state equal to one
    /// never seen) is a new key under the new quotas, whether it is still tracked or not. So
    /// forgetting idle keys ([`evict_idle`](Self::evict_idle)) changes no decision under any
    /// later change, and a Redis key that expired while idle under the quotas in force
    /// decides as one kept in memory. Most kinds need nothing for it; a change of a warm-up
    /// curve (its rate, period or cold factor) makes every idle key new before the new curve
    /// judges any request, where a kept key would otherwise regain its stored permits at the
    /// new curve's pace and not be fully cold yet. Only such a change visits every tracked
    /// key, and so does one that changes the width of a sliding window or log, or changes one
    /// within its widest reach after a widening: it measures again when each key goes idle
    /// under the new quotas, so that a full table finds it idle in time. Any other change
    /// costs the same whatever the number of keys.
    ///
    /// Requests already decided keep their decision; waiters of
    /// [`until_ready`](Self::until_ready) decide again under the new quotas when their turn
    /// comes.
    ///
    /// ```
    /// use tollgate::{Clock, Quota, RateLimiter};
    ///
    /// let (clock, _time) = Clock::manual();
    /// let limiter = RateLimiter::<&str>::builder(Quota::per_second(2))
    ///     .clock(clock)
    ///     .build();
    /// let handle = limiter.clone();
    /// assert!(limiter.check(&"k").is_allowed());
    /// assert!(limiter.check(&"k").is_allowed());
    /// assert!(!limiter.check(&"k").is_allowed());
    ///
    /// // During an incident: at most 1 per second, at once, for every clone.
    /// handle.set_quotas([Quota::per_second(1)]).unwrap();
    /// assert_eq!(limiter.quotas()[0], Quota::per_second(1));
    /// // Still spent: the key's time (1 s ahead) is the new burst's whole tolerance.
    /// let d = limiter.check(&"k");
    /// assert_eq!(d.retry_after(), Some(std::time::Duration::from_secs(1)));
    /// // An invalid change is refused and the quotas in force stay.
    /// assert!(handle.set_quotas([]).is_err());
    /// assert_eq!(limiter.quotas()[0], Quota::per_second(1));
    /// ```
    pub fn set_quotas(&self, quotas: impl IntoIterator<Item = Quota>) -> Result<(), ConfigError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        self.inner.live.replace(|old| {
            check_replacement(&old.quotas, &quotas)?;
            let now = self.inner.clock.now();
            let mut limits = Limits::new(quotas);
            Rule::replacing(&mut limits.rules, &old.rules, now);
            self.inner.state.replacing(&old.rules, &limits.rules, now);
            Ok(limits)
        })
    }

    /// The clock decisions are made with.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The number of tracked keys, idle ones included until they are swept.
    pub fn len(&self) -> usize {
        self.inner.state.len(self.inner.clock.now())
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every idle key now (which changes no decision) and returns how many keys are
    /// still tracked. Not needed for correctness or for bounded memory: stores sweep by
    /// themselves as they grow.
    pub fn evict_idle(&self) -> usize {
        self.inner.state.evict_idle(self.inner.clock.now())
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> wait::Admit<K> for RateLimiter<K> {
    fn admit(&self, key: &K, cost: u32) -> impl std::future::Future<Output = Decision> {
        std::future::ready(self.check_n(key, cost))
    }

    fn lines(&self) -> &Lines<K> {
        &self.inner.waiters
    }

    fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    fn smallest_burst(&self) -> u64 {
        wait::smallest_burst(&self.inner.live.load().rules)
    }
}

/// The memory store of a layer: each tier's limiter is a `RateLimiter`, and a layer's decision
/// is [`RateLimiter::check_n`] (or `reserve_n` when it settles), made at once.
impl<K: Hash + Eq + Clone + Send + Sync + 'static> Backend<K> for Memory {
    type Limiter = RateLimiter<K>;
    type Later = Never;
    const LOCAL_PENALTIES: bool = true;

    fn make_limiter(
        &self,
        policy: &crate::Policy,
        _keys: Option<&str>,
        clock: Option<&Clock>,
        max_keys: Option<usize>,
        on_full: Option<OnFull>,
        _penalty: Option<&PenaltyBox>,
        _dry_run: bool,
    ) -> Result<RateLimiter<K>, ConfigError> {
        let (first, rest) = policy.quotas.split_first().ok_or(ConfigError::NoQuota)?;
        let mut builder = RateLimiter::<K>::builder(first.clone())
            .max_keys(max_keys.unwrap_or(DEFAULT_MAX_KEYS))
            .on_full(on_full.unwrap_or_default());
        for q in rest {
            builder = builder.quota(q.clone());
        }
        if let Some(clock) = clock {
            builder = builder.clock(clock.clone());
        }
        builder.try_build()
    }

    fn set_quotas(limiter: &RateLimiter<K>, quotas: &[Quota]) -> Result<(), ConfigError> {
        limiter.set_quotas(quotas.iter().cloned())
    }

    fn generation(limiter: &RateLimiter<K>) -> u16 {
        limiter.generation()
    }

    #[inline]
    fn decide(limiter: &RateLimiter<K>, key: &K, cost: u32) -> Answer<Never> {
        Answer::Now(limiter.check_n(key, cost))
    }

    fn share_bound(
        limiters: &[RateLimiter<K>],
        max_keys: usize,
        penalty: Option<(&PenaltyBox, Clock)>,
    ) -> Option<Penalties<K>> {
        let bound = Arc::new(Bound::new(max_keys));
        for limiter in limiters {
            limiter.share_bound(&bound);
        }
        penalty.map(|(p, clock)| Penalties::sharing(p, clock, &bound))
    }

    fn reserve(limiter: &RateLimiter<K>, key: &K, cost: u32) -> Answer<Never> {
        Answer::Now(limiter.reserve_n(key, cost))
    }

    fn refund(
        limiter: &RateLimiter<K>,
        key: K,
        taken: Reservation,
        _local: bool,
    ) -> Option<Refunding> {
        limiter.refund(&key, &taken, taken.cost);
        None
    }

    fn tracked_keys(limiter: &RateLimiter<K>) -> Option<usize> {
        Some(limiter.len())
    }

    fn settle(
        limiter: &RateLimiter<K>,
        key: K,
        taken: Reservation,
        actual: u32,
        _local: bool,
    ) -> Answer<Settling> {
        Answer::Now(limiter.settle(&key, &taken, actual))
    }
}

/// A builder of every quota of `quotas` (at least one) on `clock`, for the unit tests of the
/// limiter's files.
#[cfg(test)]
fn test_builder<K: Hash + Eq + Clone + Send + Sync>(
    quotas: &[Quota],
    clock: &Clock,
) -> RateLimiterBuilder<K> {
    quotas[1..]
        .iter()
        .fold(RateLimiter::builder(quotas[0].clone()), |b, q| {
            b.quota(q.clone())
        })
        .clock(clock.clone())
}
