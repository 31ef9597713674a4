//! Clocks: where "now" comes from.
//!
//! A limiter reads its clock once per decision. The default, [`Clock::system`], reads the
//! CPU's time-stamp counter through `quanta` (about half the cost of `Instant::now()`);
//! [`Clock::tokio`] follows tokio's clock, so tests under `#[tokio::test(start_paused = true)]`
//! are deterministic; [`Clock::manual`] moves only when told to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic clock: the time since the clock was created, to the nanosecond. Cheap to clone;
/// clones share one time line.
#[derive(Clone, Debug)]
pub struct Clock {
    kind: Kind,
}

/// With a tag of its own (`repr(u8)`): a decision tells the system clock from the others by
/// one comparison, instead of decoding the tag from the niches of `quanta`'s own enum.
#[derive(Clone, Debug)]
#[repr(u8)]
enum Kind {
    System { clock: quanta::Clock, epoch: u64 },
    Tokio { epoch: tokio::time::Instant },
    Manual(Arc<AtomicU64>),
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The machine's monotonic clock (TSC through `quanta`, falling back to the OS clock).
    ///
    /// Building one costs tens of microseconds: build it once, then clone it.
    pub fn system() -> Self {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        Clock {
            kind: Kind::System { clock, epoch },
        }
    }

    /// tokio's clock (`tokio::time::Instant`), which tests can pause and advance.
    pub fn tokio() -> Self {
        Clock {
            kind: Kind::Tokio {
                epoch: tokio::time::Instant::now(),
            },
        }
    }

    /// A clock that stands still until [`ManualClock::advance`] moves it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, Quota, RateLimiter};
    ///
    /// let (clock, time) = Clock::manual();
    /// let limiter = RateLimiter::<()>::builder(Quota::per_second(1)).clock(clock).build();
    /// assert!(limiter.check(&()).is_allowed());
    /// assert!(!limiter.check(&()).is_allowed());
    /// time.advance(Duration::from_secs(1));
    /// assert!(limiter.check(&()).is_allowed());
    /// ```
    pub fn manual() -> (Clock, ManualClock) {
        // Start away from zero so that "absent" (0) is always in the past.
        let now = Arc::new(AtomicU64::new(1));
        (
            Clock {
                kind: Kind::Manual(now.clone()),
            },
            ManualClock { now },
        )
    }

    /// Nanoseconds since this clock's epoch.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match &self.kind {
            Kind::System { clock, epoch } => clock.delta_as_nanos(*epoch, clock.raw()),
            Kind::Tokio { epoch } => saturating_nanos(epoch.elapsed()),
            Kind::Manual(now) => now.load(Ordering::Acquire),
        }
    }

    /// Whether this is the machine's clock (as opposed to a test clock).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn is_system(&self) -> bool {
        matches!(self.kind, Kind::System { .. })
    }

    /// Whether sleeping with tokio moves this clock forward.
    pub(crate) fn follows_sleep(&self) -> bool {
        !matches!(self.kind, Kind::Manual(_))
    }
}

/// The handle that moves a [`Clock::manual`] clock.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// Moves the clock forward by `by`, stopping at the end of its range (`u64::MAX`
    /// nanoseconds, about 584 years) instead of wrapping round to the past.
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        let _ = self
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(by))
            });
    }

    /// Sets the clock to `at` since its epoch, backwards too: for tests of a clock that steps
    /// back (a Redis failover to a server whose clock is behind, say).
    pub fn set(&self, at: Duration) {
        self.now.store(saturating_nanos(at), Ordering::Release);
    }

    /// The time since the clock's epoch (kept to the nanosecond).
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now.load(Ordering::Acquire))
    }
}

fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
