//! [`ConcurrencyHandle`]: the maximum and the queue bounds of a
//! [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer), changed while it serves.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;

use super::control::Control;
use crate::error::ConfigError;
use crate::headers;
use crate::settings::ConcurrencySettings;

/// What a layer's services read on each request that a handle may change.
pub(crate) struct Live {
    /// How many may wait, if waiting is on.
    max_waiting: Option<AtomicUsize>,
    /// How long a waiter waits at most, in nanoseconds.
    max_wait: AtomicU64,
    /// The `RateLimit-Policy` item and its name, when configured.
    pub(crate) policy: Option<ArcSwap<HeaderValue>>,
    policy_name: Option<Box<str>>,
}

impl Live {
    pub(crate) fn new(
        queue: Option<(usize, Duration)>,
        policy_name: Option<&str>,
        max: usize,
    ) -> Self {
        Live {
            max_waiting: queue.map(|(n, _)| AtomicUsize::new(n)),
            max_wait: AtomicU64::new(queue.map_or(0, |(_, d)| nanos(d))),
            policy: policy_name.map(|n| ArcSwap::from_pointee(headers::concurrency_policy(n, max))),
            policy_name: policy_name.map(Box::from),
        }
    }

    #[inline]
    pub(crate) fn max_waiting(&self) -> Option<usize> {
        self.max_waiting.as_ref().map(|n| n.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait.load(Ordering::Relaxed))
    }

    #[inline]
    pub(crate) fn policy(&self) -> Option<Arc<HeaderValue>> {
        self.policy.as_ref().map(ArcSwap::load_full)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Changes the limit and the queue of a
/// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) while it serves, from
/// [`ConcurrencyLimitLayer::handle`](super::ConcurrencyLimitLayer::handle).
///
/// A change applies to the layer value it came from, its clones and every service they
/// made, globally or for every key of a keyed limit:
///
/// * **A higher maximum** admits more requests at once: waiters are woken for the new places.
/// * **A lower maximum** cuts nothing short: the requests in flight finish and keep their
///   permits until their responses are done; no new request is admitted until fewer than
///   the new maximum are in flight (the permits given back meanwhile are retired, not handed
///   on). Waiters keep their place in line and their deadline.
/// * **Queue bounds**: a smaller `max_waiting` turns away new waiters until the queue is
///   below it, and lets those already in line wait on; a new `max_wait` applies to the
///   requests that start waiting after the change (one already waiting keeps the deadline it
///   started with).
///
/// With an [adaptive](super::ConcurrencyLimitLayer::adaptive) limit, the maximum is the
/// ceiling the algorithm moves under: lowering it below the current limit lowers the limit
/// with it.
///
/// ```
/// use std::time::Duration;
/// use tollgate::ConcurrencyLimitLayer;
///
/// let layer = ConcurrencyLimitLayer::new(100).queue(50, Duration::from_secs(1));
/// let handle = layer.handle().unwrap();
/// // Take the handle before the layer is applied; then, during an incident:
/// handle.set_max(20).unwrap();
/// handle.set_queue(10, Duration::from_millis(200)).unwrap();
/// assert_eq!(handle.max(), 20);
/// assert!(handle.set_max(0).is_err());
/// assert_eq!(layer.limit(), 20);
/// ```
#[derive(Clone)]
pub struct ConcurrencyHandle {
    control: Arc<Control>,
    live: Arc<Live>,
    /// Brings every semaphore of the layer to the new limit.
    sync: Arc<dyn Fn() + Send + Sync>,
    changing: Arc<Mutex<()>>,
}

impl fmt::Debug for ConcurrencyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyHandle")
            .field("max", &self.max())
            .field("max_waiting", &self.live.max_waiting())
            .field("max_wait", &self.live.max_wait())
            .finish()
    }
}

impl ConcurrencyHandle {
    pub(crate) fn new(
        control: Arc<Control>,
        live: Arc<Live>,
        sync: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        ConcurrencyHandle {
            control,
            live,
            sync,
            changing: Arc::default(),
        }
    }

    /// Whether the layer was built with a queue, whose bounds may change.
    fn has_queue(&self) -> bool {
        self.live.max_waiting.is_some()
    }

    /// The maximum in force.
    pub fn max(&self) -> usize {
        self.control.cap()
    }

    /// Sets the most requests in flight at once (per key, for a keyed limit).
    ///
    /// A lower maximum lets the requests in flight finish and starts nobody until fewer than
    /// it are in flight: a place handed to a waiter that has not started yet, or handed on by
    /// a waiter that went away, counts against the new maximum, and that waiter waits again
    /// behind those already waiting.
    ///
    /// `max` must be at least 1 and fit a semaphore; otherwise this returns
    /// [`ConfigError::InvalidConcurrency`] and the maximum in force stays.
    pub fn set_max(&self, max: usize) -> Result<(), ConfigError> {
        super::control::check_max(max)?;
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.control.set_cap(max);
        (self.sync)();
        if let (Some(policy), Some(name)) = (&self.live.policy, &self.live.policy_name) {
            policy.store(Arc::new(headers::concurrency_policy(name, max)));
        }
        Ok(())
    }

    /// Sets how many requests may wait and for how long.
    ///
    /// Only a layer built with a [`queue`](super::ConcurrencyLimitLayer::queue) has one to
    /// change; otherwise this returns [`ConfigError::NotChangeable`].
    pub fn set_queue(&self, max_waiting: usize, max_wait: Duration) -> Result<(), ConfigError> {
        let Some(n) = &self.live.max_waiting else {
            return Err(ConfigError::NotChangeable(
                "the queue of a concurrency limit built without one",
            ));
        };
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        n.store(max_waiting, Ordering::Relaxed);
        self.live.max_wait.store(nanos(max_wait), Ordering::Relaxed);
        Ok(())
    }

    /// Applies `settings`: the maximum, then the queue bounds. A layer built without a queue
    /// cannot be given one ([`ConfigError::NotChangeable`]); an invalid maximum changes
    /// nothing.
    pub fn apply(&self, settings: &ConcurrencySettings) -> Result<(), ConfigError> {
        // Everything that can fail is checked before anything changes.
        if settings.queue.is_some() && !self.has_queue() {
            return Err(ConfigError::NotChangeable(
                "the queue of a concurrency limit built without one",
            ));
        }
        self.set_max(settings.max)?;
        if let Some(q) = settings.queue {
            self.set_queue(q.max_waiting, q.max_wait)?;
        }
        Ok(())
    }
}
