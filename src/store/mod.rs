//! Where theoretical arrival times live.
//!
//! The memory store is the default; it needs no server: for one key it reads the stored times,
//! decides with [`crate::gcra`] and replaces them atomically. With the `redis` feature,
//! `redis::RedisStore` keeps them in Redis, shared by every instance of a service; there the
//! same rule runs as a Lua script on the server, on the server's clock, and the result is
//! read back into the same [`Decision`](crate::Decision).

use std::hash::Hash;

use crate::clock::Clock;
use crate::error::ConfigError;
use crate::limiter::{RateLimiter, DEFAULT_MAX_KEYS};
use crate::quota::Quota;

pub(crate) mod memory;

pub use memory::OnFull;

/// The store of a [`RateLimitLayer`](crate::RateLimitLayer) (its second type parameter):
/// [`Memory`] by default, or a `redis::RedisStore` given to
/// [`RateLimitLayer::store`](crate::RateLimitLayer::store).
///
/// Sealed: implemented by the crate's stores only.
pub trait Backend<K>: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The limiter of one tier on this store.
    type Limiter: Clone + Send + Sync + 'static;

    #[doc(hidden)]
    fn make_limiter(
        &self,
        name: &str,
        quotas: &[Quota],
        clock: Option<&Clock>,
        max_keys: Option<usize>,
        on_full: Option<OnFull>,
    ) -> Result<Self::Limiter, ConfigError>;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// The in-memory store: state in this process, decisions without I/O. The default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory;

impl sealed::Sealed for Memory {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Backend<K> for Memory {
    type Limiter = RateLimiter<K>;

    fn make_limiter(
        &self,
        _name: &str,
        quotas: &[Quota],
        clock: Option<&Clock>,
        max_keys: Option<usize>,
        on_full: Option<OnFull>,
    ) -> Result<RateLimiter<K>, ConfigError> {
        let (first, rest) = quotas.split_first().ok_or(ConfigError::NoQuota)?;
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
}
