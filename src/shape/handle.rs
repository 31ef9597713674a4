//! [`ShapeHandle`]: the rate and queue bounds of a [`ShapeLayer`](super::ShapeLayer),
//! changed while it serves.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::quota::Quota;
use crate::settings::ShapeSettings;

/// One change to a shaping layer.
pub(crate) enum Change {
    Quota(Quota),
    Bounds(Option<usize>, Option<Duration>),
}

/// Applies a change to the layer's shaper and header fields.
pub(crate) type ChangeFn = dyn Fn(Change) -> Result<(), ConfigError> + Send + Sync;

/// Changes the rate and the queue bounds of a [`ShapeLayer`](super::ShapeLayer) while it
/// serves, from [`ShapeLayer::handle`](super::ShapeLayer::handle).
///
/// A change applies to the layer value it came from, its clones, every service they made
/// and its [`shaper`](super::ShapeLayer::shaper), for every key, and keeps every queue:
///
/// * **A new rate** ([`set_quota`](Self::set_quota)): requests already waiting keep their
///   place in line; the one at the head of each queue keeps its departure time and those
///   behind it leave one new interval apart (see [`Shaper::set_quota`](super::Shaper::set_quota)).
/// * **New bounds** ([`set_queue`](Self::set_queue)): a queue longer than the new bound
///   keeps its waiters (none is turned away); newcomers are refused until it is below the
///   bound. Bounds stay as they are when only the rate changes.
///
/// The `RateLimit-Policy` field follows both. An invalid value returns a [`ConfigError`]
/// and changes nothing. Cheap to clone; the same type whatever the layer's key.
#[derive(Clone)]
pub struct ShapeHandle {
    change: Arc<ChangeFn>,
}

impl fmt::Debug for ShapeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeHandle").finish_non_exhaustive()
    }
}

impl ShapeHandle {
    pub(crate) fn new(change: Arc<ChangeFn>) -> Self {
        ShapeHandle { change }
    }

    /// Sets the rate: one request per emission interval of `quota` (its burst is not used,
    /// as for [`ShapeLayer::new`](super::ShapeLayer::new)).
    pub fn set_quota(&self, quota: Quota) -> Result<(), ConfigError> {
        (self.change)(Change::Quota(quota))
    }

    /// Sets the queue bounds of every key: at most `max_waiting` waiting, a wait of at most
    /// `max_wait` (`None`: no bound of that kind).
    pub fn set_queue(
        &self,
        max_waiting: Option<usize>,
        max_wait: Option<Duration>,
    ) -> Result<(), ConfigError> {
        (self.change)(Change::Bounds(max_waiting, max_wait))
    }

    /// The former name of [`set_queue`](Self::set_queue).
    #[deprecated(note = "use `set_queue`, the name the concurrency handle gives it too")]
    pub fn set_bounds(
        &self,
        max_queue: Option<usize>,
        max_delay: Option<Duration>,
    ) -> Result<(), ConfigError> {
        self.set_queue(max_queue, max_delay)
    }

    /// Applies `settings`: the rate, then the queue bounds. With neither `max_waiting` nor
    /// `max_wait`, the bounds are left as they are.
    pub fn apply(&self, settings: &ShapeSettings) -> Result<(), ConfigError> {
        self.set_quota(settings.rate.clone())?;
        if settings.max_waiting.is_some() || settings.max_wait.is_some() {
            self.set_queue(settings.max_waiting, settings.max_wait)?;
        }
        Ok(())
    }
}
