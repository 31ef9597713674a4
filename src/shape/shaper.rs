//! [`Shaper`]: keyed first-in-first-out queues drained at a fixed rate, without HTTP.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::queue::{Bounds, Join, Queue, Timing, Turn};
use arc_swap::ArcSwap;

use crate::clock::Clock;
use crate::error::ConfigError;
use crate::keyed::{Absent, Entry, OnFull, Table};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::quota::Quota;
use crate::quota::WarmUp;

/// How late a departure may be and still be caught up. It covers tokio's 1 ms timer ticks
/// and a busy runtime's scheduling delays (several ms on a loaded machine); a schedule that
/// fell further behind forfeits the older slots rather than releasing them as a burst.
const CATCH_UP: Duration = Duration::from_millis(20);

/// Spaces out work per key: each key's requests leave one per emission interval of the quota,
/// first in first out.
///
/// Cheap to clone; clones share the queues. The HTTP [`ShapeLayer`](super::ShapeLayer) and the
/// outbound [`PoliteLayer`](super::PoliteLayer) are built on it, and it serves on its own for
/// queue consumers and background jobs.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, Shaper};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A partner accepts 5 calls per second per account.
/// let shaper = Shaper::<u64>::new(Quota::per_second(5));
/// let start = tokio::time::Instant::now();
/// for _ in 0..3 {
///     shaper.until_slot(&42).await; // the first at once, then every 200 ms
/// }
/// assert_eq!(start.elapsed(), Duration::from_millis(400));
/// # }
/// ```
///
/// # Semantics
/// * The quota gives the rate only: one request per `T = period / count`. Its burst is not
///   used, since the point of shaping is to space requests out; see
///   [`ShaperBuilder::no_delay_burst`] for letting a few through early.
/// * A request's place in its key's queue is fixed when it joins
///   ([`until_slot`](Self::until_slot) or [`reserve`](Self::reserve) is called), not when the
///   returned [`Slot`] is first polled.
/// * Waiting is on tokio's timer, and time is read from tokio's clock ([`Clock::tokio`]), so
///   tests under `#[tokio::test(start_paused = true)]` run without sleeping.
pub struct Shaper<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Shaper<K> {
    fn clone(&self) -> Self {
        Shaper {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for Shaper<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = self.inner.core.settings.load();
        f.debug_struct("Shaper")
            .field("quota", &settings.quota)
            .field("no_delay_burst", &settings.no_delay_burst)
            .field("warm_up", &settings.warm_up)
            .field("bounds", &settings.bounds)
            .finish_non_exhaustive()
    }
}

struct Inner<K> {
    core: Arc<Core>,
    changing: Mutex<()>,
    table: Table<K, LaneEntry>,
}

/// What every waiter of a shaper needs, whatever its key.
struct Core {
    /// Replaced whole by [`Shaper::set_quota`] and [`Shaper::set_queue`].
    settings: ArcSwap<Settings>,
    clock: Clock,
}

/// A shaper's rate and bounds, as they are now.
#[derive(Debug, Clone)]
struct Settings {
    quota: Quota,
    no_delay_burst: u32,
    warm_up: Option<WarmUp>,
    timing: Timing,
    bounds: Bounds,
}

impl Settings {
    fn new(
        quota: Quota,
        no_delay_burst: u32,
        warm_up: Option<WarmUp>,
        bounds: Bounds,
    ) -> Result<Self, ConfigError> {
        let interval = u64::try_from(quota.emission_interval().as_nanos())
            .map_err(|_| ConfigError::ToleranceTooLong)?;
        let ahead = interval
            .checked_mul(u64::from(no_delay_burst))
            .filter(|&a| a <= u64::MAX / 4)
            .ok_or(ConfigError::ToleranceTooLong)?;
        Ok(Settings {
            quota,
            no_delay_burst,
            warm_up,
            timing: Timing {
                interval,
                ahead,
                catch_up: CATCH_UP.as_nanos() as u64,
                warm: warm_up.map(|w| w.curve(interval, Duration::from_nanos(1))),
            },
            bounds,
        })
    }
}

/// One key's queue.
type Lane = Arc<Mutex<Queue>>;

/// How a slot that gives up its place tells the keyed table that its queue may go idle
/// earlier than the table was last told.
trait IdleHint: Send + Sync {
    fn lower(&self, hash: u64, at: u64);
}

impl<K: Hash + Eq + Clone + Send + Sync> IdleHint for Inner<K> {
    fn lower(&self, hash: u64, at: u64) {
        self.table.lower_idle_hint(hash, at);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a panic elsewhere between two plain field updates; the numbers are
    // still times and counts, and a stuck queue would be worse.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds a [`Shaper`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ShaperBuilder<K> {
    key: PhantomData<fn() -> K>,
    quota: Quota,
    no_delay_burst: u32,
    warm_up: Option<(Duration, u32)>,
    bounds: Bounds,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone + Send + Sync> ShaperBuilder<K> {
    /// Lets up to `n` requests go ahead of the rate without waiting after the key was idle.
    ///
    /// Default `0`: pure smoothing, where after idle the first request leaves at once (nobody
    /// is ahead of it) and every later one waits for its slot. With `n`, an idle key's first
    /// `n + 1` requests leave at once and the rest are spaced one interval apart; the key earns
    /// its allowance back at one request per interval. This is nginx `limit_req ... delay=n`.
    pub fn no_delay_burst(mut self, n: u32) -> Self {
        self.no_delay_burst = n;
        self
    }

    /// Makes a key's queue drain slowly after idleness: the first departures are spaced
    /// `cold_factor` times wider than the quota's interval, and the spacing narrows to the
    /// interval over `period` of steady departures (Sentinel's warm-up with queue). The
    /// spacing follows the same curve as a warm-up quota; see [`WarmUp`] for the
    /// formula. A key that stays idle cools down again over `period`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, Shaper};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // 2 per second, warming up over 3 s from a third of that (Guava's example).
    /// let shaper = Shaper::<u8>::builder(Quota::per_second(2))
    ///     .warm_up(Duration::from_secs(3), 3)
    ///     .build();
    /// let start = tokio::time::Instant::now();
    /// let mut left = Vec::new();
    /// for _ in 0..5 {
    ///     shaper.until_slot(&0).await;
    ///     left.push(start.elapsed().as_millis());
    /// }
    /// // Spaced 1333.3, 1000, 666.7, then 500 ms (tokio's timer fires on whole ms).
    /// assert_eq!(left, [0, 1334, 2334, 3000, 3500]);
    /// # }
    /// ```
    ///
    /// Invalid values (a zero or too long period, a zero cold factor) are reported by
    /// [`try_build`](Self::try_build).
    pub fn warm_up(mut self, period: Duration, cold_factor: u32) -> Self {
        self.warm_up = Some((period, cold_factor));
        self
    }

    /// Refuses a request that would make more than `n` requests of its key wait (requests
    /// whose slot has come do not count). Without it, or [`max_wait`](Self::max_wait), the
    /// queue is unbounded. Bounds apply to [`Shaper::reserve`]; [`Shaper::until_slot`] waits
    /// regardless.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.bounds.max_queue = Some(n as u64);
        self
    }

    /// Refuses a request that would have to wait longer than `d`. Applies, like
    /// [`max_waiting`](Self::max_waiting), to [`Shaper::reserve`].
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.bounds.max_delay = Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self
    }

    /// The former name of [`max_waiting`](Self::max_waiting).
    #[deprecated(note = "use `.max_waiting(n)`, the name every queue of the crate uses")]
    pub fn max_queue(self, n: usize) -> Self {
        self.max_waiting(n)
    }

    /// The former name of [`max_wait`](Self::max_wait).
    #[deprecated(note = "use `.max_wait(d)`, the name every queue of the crate uses")]
    pub fn max_delay(self, d: Duration) -> Self {
        self.max_wait(d)
    }

    /// Bounds the number of keys tracked (default 1 000 000), over the whole shaper. Keys with
    /// nobody waiting whose schedule is in the past are forgotten first, which changes nothing;
    /// then a key with nobody waiting whose schedule is at most one interval ahead (the one
    /// nearest to idle among a random sample), whose next request may then leave at most one
    /// interval early, once. When every tracked key is busy, [`Shaper::reserve`] refuses
    /// requests of new keys ([`Shaper::until_slot`], which never refuses, tracks them beyond
    /// the bound).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// Builds the shaper.
    ///
    /// # Panics
    /// On an invalid setting; see [`try_build`](Self::try_build).
    #[track_caller]
    pub fn build(self) -> Shaper<K> {
        match self.try_build() {
            Ok(s) => s,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Builds the shaper, or says which setting cannot work.
    pub fn try_build(self) -> Result<Shaper<K>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let warm_up = match self.warm_up {
            Some((period, cold_factor)) => Some(WarmUp::try_new(period, cold_factor)?),
            None => None,
        };
        let settings = Settings::new(self.quota, self.no_delay_burst, warm_up, self.bounds)?;
        let core = Arc::new(Core {
            settings: ArcSwap::from_pointee(settings),
            clock: Clock::tokio(),
        });
        Ok(Shaper {
            inner: Arc::new(Inner {
                core,
                changing: Mutex::new(()),
                table: Table::new(self.max_keys, OnFull::EvictNearestIdle),
            }),
        })
    }
}

/// A request was refused because its key's queue is full (or the wait would be too long, or
/// too many keys are busy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    retry_after: Duration,
}

impl QueueFull {
    /// The time until a place frees up in the queue, if nobody else takes it.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for QueueFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shaping queue full: a place frees up in {:?}",
            self.retry_after
        )
    }
}

impl std::error::Error for QueueFull {}

/// The state of a key's queue after a request was admitted or refused, for the `RateLimit`
/// header fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    /// Requests that would still be admitted now.
    pub(crate) remaining: u64,
    /// Nanoseconds until the key is idle.
    pub(crate) reset_after: u64,
}

/// What the shaper decided for one request.
pub(crate) enum Admission {
    /// Go now.
    Leave(Room),
    /// Wait for the slot.
    Wait(Slot, Room),
    /// Refused.
    Full(QueueFull, Room),
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Shaper<K> {
    /// A shaper at `quota`'s rate, with no queue bound and no no-delay burst.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// Starts a builder.
    pub fn builder(quota: Quota) -> ShaperBuilder<K> {
        ShaperBuilder {
            key: PhantomData,
            quota,
            no_delay_burst: 0,
            warm_up: None,
            bounds: Bounds::default(),
            max_keys: DEFAULT_MAX_KEYS,
        }
    }

    /// Takes a place in `key`'s queue now and returns the [`Slot`] that completes when it is
    /// this request's turn to go. Never refused: a caller that uses it has chosen to wait,
    /// however long the queue (the bounds apply to [`reserve`](Self::reserve)).
    ///
    /// A plain function returning a future, so the place is taken at the call: the order of
    /// the calls is the order of departure.
    ///
    /// # Cancellation safety
    /// Cancel-safe. Dropping the [`Slot`] before it completes leaves the queue at once and
    /// consumes nothing: everyone behind moves up one slot. Once it has completed, the slot
    /// is used, whatever the caller does next.
    pub fn until_slot(&self, key: &K) -> Slot {
        match self.join(key, false, false) {
            Admission::Wait(slot, _) => slot,
            // Unbounded joins are never refused and, without `leave_now`, never leave at once.
            Admission::Leave(_) | Admission::Full(..) => Slot::ready(self.inner.core.clone()),
        }
    }

    /// Takes a place in `key`'s queue if the shaper's bounds allow it, or says how long until
    /// a place frees up.
    ///
    /// # Cancellation safety
    /// As [`until_slot`](Self::until_slot): dropping the [`Slot`] before it completes gives the
    /// place back.
    pub fn reserve(&self, key: &K) -> Result<Slot, QueueFull> {
        match self.join(key, true, false) {
            Admission::Wait(slot, _) => Ok(slot),
            Admission::Full(full, _) => Err(full),
            Admission::Leave(_) => Ok(Slot::ready(self.inner.core.clone())),
        }
    }

    /// Admits a request within the shaper's bounds; one that nobody is ahead of and whose slot
    /// has come leaves at once.
    pub(crate) fn admit(&self, key: &K) -> Admission {
        self.join(key, true, true)
    }

    /// Admits a request that will wait however long: `None` when it may leave at once.
    pub(crate) fn admit_waiting(&self, key: &K) -> Option<Slot> {
        match self.join(key, false, true) {
            Admission::Wait(slot, _) => Some(slot),
            Admission::Leave(_) | Admission::Full(..) => None,
        }
    }

    /// Admits a request: leave now (only with `leave_now`, when nobody is ahead and its slot
    /// has come), wait, or refused (only with `bounds`).
    pub(crate) fn join(&self, key: &K, bounded: bool, leave_now: bool) -> Admission {
        let core = &self.inner.core;
        let settings = core.settings.load();
        let timing = &settings.timing;
        let bounds = bounded.then_some(&settings.bounds);
        let table = &self.inner.table;
        let hash = table.hash(key);
        // The table's lock is held while the key's queue changes, so a sweep cannot drop an
        // entry that a request is joining.
        let enter = |lane: &Lane, now: u64| {
            let mut queue = lock(lane);
            let join = queue.join(timing, bounds, now, leave_now);
            let room = Room {
                remaining: queue.room(timing, &settings.bounds, now),
                reset_after: queue.reset_after(now),
            };
            (join, room)
        };
        let result = table.upsert(
            hash,
            key,
            bounds.is_none(),
            || core.clock.now(),
            |entry, now| {
                let (join, room) = enter(&entry.lane, now);
                (join, room, entry.lane.clone())
            },
            |now| {
                let lane: Lane = Arc::new(Mutex::new(Queue::new()));
                let (join, room) = enter(&lane, now);
                let entry = LaneEntry {
                    lane: lane.clone(),
                    timing: *timing,
                };
                Absent::Insert((join, room, lane), entry)
            },
        );
        let (join, room, lane) = match result {
            Ok(r) => r,
            Err(_) => {
                // Every tracked key is busy: refuse newcomers, exactly as a full queue would,
                // until one goes idle.
                let full = QueueFull {
                    retry_after: Duration::from_nanos(timing.interval),
                };
                let room = Room {
                    remaining: 0,
                    reset_after: timing.interval,
                };
                return Admission::Full(full, room);
            }
        };
        match join {
            Join::Leave => Admission::Leave(room),
            Join::Wait(ticket) => Admission::Wait(
                Slot {
                    core: core.clone(),
                    lane: Some(lane),
                    ticket,
                    sleep: None,
                    armed: None,
                    hint: Some((self.inner.clone(), hash)),
                },
                room,
            ),
            Join::Full(retry) => Admission::Full(
                QueueFull {
                    retry_after: Duration::from_nanos(retry),
                },
                room,
            ),
        }
    }

    /// How many requests an idle key is admitted at once under the shaper's bounds (one leaves,
    /// the others wait), or `None` when unbounded.
    pub(crate) fn capacity(&self) -> Option<u64> {
        let settings = self.inner.core.settings.load();
        if settings.bounds == Bounds::default() {
            return None;
        }
        Some(Queue::new().room(&settings.timing, &settings.bounds, 0))
    }

    /// The quota whose rate the shaper keeps (the latest set by
    /// [`set_quota`](Self::set_quota)).
    pub fn quota(&self) -> Quota {
        self.inner.core.settings.load().quota.clone()
    }

    /// Changes the rate of this shaper and of every clone of it (and of the
    /// [`ShapeLayer`](crate::ShapeLayer) it belongs to), keeping every queue.
    ///
    /// Requests already waiting keep their place in line: the one at the head of a key's
    /// queue keeps its departure time, and the ones behind it leave one new interval apart
    /// after it. A key nobody waits on sends its next request one new interval after its last
    /// one left, also when those who waited at the change all went away (the head's kept
    /// departure goes with it). The no-delay burst stays the same number of requests, at the
    /// new interval.
    ///
    /// An invalid quota returns a [`ConfigError`] and the rate in force stays. A shaper built
    /// with [`warm_up`](ShaperBuilder::warm_up) keeps its rate: each waiter is spaced by the
    /// price it was given on the warm-up curve, which a new interval would change under it, so
    /// a quota of another rate returns [`ConfigError::NotChangeable`].
    ///
    /// ```
    /// use tollgate::{Quota, Shaper};
    ///
    /// let shaper = Shaper::<u64>::new(Quota::per_second(10));
    /// shaper.set_quota(Quota::per_second(100)).unwrap();
    /// assert_eq!(shaper.quota(), Quota::per_second(100));
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), ConfigError> {
        self.change(|s| {
            let new = Settings::new(quota, s.no_delay_burst, s.warm_up, s.bounds)?;
            // Each waiter keeps the warm-up price it was given; a new interval would move the
            // whole curve under them, so a shaper with warm-up keeps its rate.
            if s.warm_up.is_some() && new.timing.interval != s.timing.interval {
                return Err(ConfigError::NotChangeable(
                    "the rate of a shaper with warm-up",
                ));
            }
            Ok(new)
        })
    }

    /// Changes the bounds of every key's queue, for this shaper and every clone of it:
    /// `max_waiting` requests waiting at most, a wait of `max_wait` at most (`None`: no bound).
    ///
    /// The new bounds apply to requests that come after the change: a queue longer than the
    /// new bound keeps its waiters (none is turned away), and newcomers are refused until it is
    /// below the bound.
    pub fn set_queue(
        &self,
        max_waiting: Option<usize>,
        max_wait: Option<Duration>,
    ) -> Result<(), ConfigError> {
        let bounds = Bounds {
            max_queue: max_waiting.map(|n| n as u64),
            max_delay: max_wait.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        };
        self.change(|s| Settings::new(s.quota.clone(), s.no_delay_burst, s.warm_up, bounds))
    }

    /// The former name of [`set_queue`](Self::set_queue).
    #[deprecated(note = "use `set_queue`, the name the handles use too")]
    pub fn set_bounds(
        &self,
        max_queue: Option<usize>,
        max_delay: Option<Duration>,
    ) -> Result<(), ConfigError> {
        self.set_queue(max_queue, max_delay)
    }

    fn change(
        &self,
        f: impl FnOnce(&Settings) -> Result<Settings, ConfigError>,
    ) -> Result<(), ConfigError> {
        // One change at a time, so that a change of the rate and one of the bounds both hold.
        let _one_at_a_time = lock(&self.inner.changing);
        let settings = &self.inner.core.settings;
        let new = f(&settings.load())?;
        settings.store(Arc::new(new));
        Ok(())
    }

    /// The number of tracked keys (idle ones included until they are swept).
    pub fn len(&self) -> usize {
        self.inner.table.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every idle key now (nobody waiting, schedule in the past), which changes no
    /// decision, and returns how many keys are still tracked. Not needed for bounded memory:
    /// the table sweeps by itself.
    pub fn evict_idle(&self) -> usize {
        let now = self.inner.core.clock.now();
        self.inner.table.evict_idle(now)
    }
}

/// A place in a key's queue: a future that completes when it is this request's turn to go.
///
/// Returned by [`Shaper::until_slot`] and [`Shaper::reserve`]. The place was taken when the
/// slot was created; polling only waits for it.
///
/// # Cancellation safety
/// Dropping a slot before it completes leaves the queue at once: the requests behind move up
/// one interval each, and if it was at the head, the next one takes over its departure time.
/// Nothing is consumed, so the key's output stays one request per interval as long as anyone
/// is waiting. A slot that has completed has left; dropping it then changes nothing.
///
/// # Order
/// The slots of one key complete in the order they were taken. A slot that is held without
/// being polled holds up the ones behind it once its turn has come: await each slot (in its
/// own task, or with the others), or drop it.
#[must_use = "a slot does nothing unless awaited, and leaves the queue when dropped"]
pub struct Slot {
    core: Arc<Core>,
    /// `None` once the slot has left the queue (or never joined one).
    lane: Option<Lane>,
    ticket: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    /// The departure time the timer is set for.
    armed: Option<u64>,
    /// The shaper's table and the key's hash, told when giving up makes the queue idle earlier.
    hint: Option<(Arc<dyn IdleHint>, u64)>,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("waiting", &self.lane.is_some())
            .finish_non_exhaustive()
    }
}

impl Slot {
    /// A slot that has already come.
    fn ready(core: Arc<Core>) -> Self {
        Slot {
            core,
            lane: None,
            ticket: 0,
            sleep: None,
            armed: None,
            hint: None,
        }
    }

    /// Whether the slot has been reached (the future completed, or had nothing to wait for).
    pub fn is_done(&self) -> bool {
        self.lane.is_none()
    }

    fn arm(&mut self, at: u64, now: u64, cx: &mut Context<'_>) -> Poll<()> {
        if self.armed != Some(at) {
            // Read after `now`, so the deadline is never before `at` on the shaper's clock.
            let deadline = tokio::time::Instant::now() + Duration::from_nanos(at - now);
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = Some(at);
        }
        match &mut self.sleep {
            Some(sleep) => {
                let fired = sleep.as_mut().poll(cx);
                if fired.is_ready() {
                    // Re-arm from a fresh reading if the slot turns out not to have come.
                    self.armed = None;
                }
                fired
            }
            None => Poll::Ready(()),
        }
    }
}

impl Future for Slot {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            let Some(lane) = &this.lane else {
                return Poll::Ready(());
            };
            let now = this.core.clock.now();
            let timing = this.core.settings.load().timing;
            let turn = lock(lane).turn(&timing, this.ticket, now, cx.waker());
            match turn {
                Turn::Leave(next_head) => {
                    this.lane = None;
                    this.sleep = None;
                    if let Some(w) = next_head {
                        w.wake();
                    }
                    return Poll::Ready(());
                }
                Turn::Behind => return Poll::Pending,
                Turn::At(at) => {
                    if this.arm(at, now, cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            let timing = self.core.settings.load().timing;
            let (next_head, idle_at) = {
                let mut queue = lock(&lane);
                let next_head = queue.cancel(&timing, self.ticket);
                (next_head, queue.idle_at(&timing))
            };
            if let Some((table, hash)) = &self.hint {
                table.lower(*hash, idle_at);
            }
            if let Some(w) = next_head {
                w.wake();
            }
        }
    }
}

/// A key's queue as the keyed table sees it.
struct LaneEntry {
    lane: Lane,
    /// The shaper's timing.
    timing: Timing,
}

impl Entry for LaneEntry {
    /// When the schedule ends (and with warm-up, the key is fully cold again); a queue with
    /// waiters is idle only once they have left.
    fn idle_at(&self) -> u64 {
        lock(&self.lane).idle_at(&self.timing)
    }

    fn is_idle(&self, now: u64) -> bool {
        lock(&self.lane).is_idle(&self.timing, now)
    }

    /// Nobody waiting and the schedule at most one interval ahead: forgetting the key lets its
    /// next request leave at most one interval early, once. (With warm-up, a forgotten key
    /// starts cold: slower, never faster.)
    fn evictable(&self, now: u64) -> bool {
        let q = lock(&self.lane);
        q.is_empty() && q.horizon() <= now.saturating_add(self.timing.interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter that gives up moves its queue's idle time earlier, after a sweep has made the
    /// shard's hint exact: the hint must follow, or a full shaper would pass over the idle
    /// queue while it evicts or refuses a live one.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_lowers_the_tables_idle_hint() {
        let shaper = Shaper::<u64>::builder(Quota::per_second(1))
            .max_keys(2)
            .build();
        // Two keys, each with three places: the first leaves at 0, the others wait for 1 s
        // and 2 s, so each queue is idle at 3 s, and neither may be evicted.
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..3 {
            a.push(shaper.until_slot(&1));
            b.push(shaper.until_slot(&2));
        }
        // A newcomer finds the table full: the retry time it is given comes from a sweep of
        // the shards, which makes their hints exact (3 s).
        assert!(shaper.reserve(&3).is_err());
        assert!(shaper.inner.table.hints_hold());
        // Key 1's waiters give up: its queue is idle at 1 s, not 3 s.
        a.truncate(1);
        assert!(
            shaper.inner.table.hints_hold(),
            "a shard's hint stayed above an entry's idle time"
        );
        drop(b);
    }
}
