//! A [`RateLimitLayer`](crate::RateLimitLayer) on Redis: [`RedisStore`] as the layer's
//! store, whose limiter of each tier is a [`RedisRateLimiter`].
//!
//! A decision is answered at once when this instance already knows it (a cached rejection or
//! ban, a leased unit), and after one script call otherwise; refunds and settlements of the
//! local fallback's admissions are made in its state, at once.

use super::key::RedisKey;
use super::limiter::RedisRateLimiter;
use super::store::{FailMode, RedisStore};

impl crate::store::backend::sealed::Sealed for RedisStore {}

/// A decision waiting for Redis.
type Later = std::pin::Pin<Box<dyn std::future::Future<Output = crate::Decision> + Send>>;

impl<K> crate::store::backend::Backend<K> for RedisStore
where
    K: RedisKey + std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    type Limiter = RedisRateLimiter<K>;
    type Later = Later;
    const LOCAL_PENALTIES: bool = false;

    /// Now when the cache of known rejections already knows (no round trip, no clone of the
    /// inner service); later, after the round trip, otherwise.
    fn decide(limiter: &Self::Limiter, key: &K, cost: u32) -> crate::store::backend::Answer<Later> {
        let now = limiter.now();
        if let Some(decision) = limiter.local(key, cost, now) {
            return crate::store::backend::Answer::Now(decision);
        }
        let limiter = limiter.clone();
        let key = key.clone();
        crate::store::backend::Answer::Later(Box::pin(async move {
            limiter.remote(&key, cost, now).await
        }))
    }

    fn local_share(&self) -> Option<f64> {
        match self.on_failure {
            FailMode::Local(share) => Some(share.get()),
            FailMode::Open | FailMode::Closed => None,
        }
    }

    fn set_quotas(
        limiter: &Self::Limiter,
        quotas: &[crate::Quota],
    ) -> Result<(), crate::ConfigError> {
        limiter.set_quotas(quotas.iter().cloned())
    }

    fn generation(limiter: &Self::Limiter) -> u16 {
        limiter.generation()
    }

    /// One script call that moves the key's times back, and forgets a cached rejection of the
    /// key that the refund makes stale; an admission of the local fallback is given back to
    /// it, at once.
    fn refund(
        limiter: &Self::Limiter,
        key: K,
        taken: crate::decision::Reservation,
        local: bool,
    ) -> Option<crate::store::backend::Refunding> {
        if local {
            limiter.refund_locally(&key, &taken);
            return None;
        }
        let limiter = limiter.clone();
        Some(Box::pin(async move { limiter.refund(&key, &taken).await }))
    }

    /// One script call that gives back or charges the difference, and reports the state; an
    /// admission of the local fallback is settled there, at once.
    fn settle(
        limiter: &Self::Limiter,
        key: K,
        taken: crate::decision::Reservation,
        actual: u32,
        local: bool,
    ) -> crate::store::backend::Answer<crate::store::backend::Settling> {
        if local {
            if let Some(d) = limiter.settle_locally(&key, &taken, actual) {
                return crate::store::backend::Answer::Now(d);
            }
        }
        let limiter = limiter.clone();
        crate::store::backend::Answer::Later(Box::pin(async move {
            limiter.settle(&key, &taken, actual).await
        }))
    }

    fn make_limiter(
        &self,
        policy: &crate::Policy,
        keys: Option<&str>,
        clock: Option<&crate::Clock>,
        max_keys: Option<usize>,
        on_full: Option<crate::store::OnFull>,
        penalty: Option<&crate::penalty::PenaltyBox>,
        dry_run: bool,
    ) -> Result<Self::Limiter, crate::ConfigError> {
        // Redis expires idle keys itself: a bound meant for memory must not pass unnoticed.
        if max_keys.is_some() {
            return Err(crate::ConfigError::MemoryOnly("max_keys"));
        }
        if on_full.is_some() {
            return Err(crate::ConfigError::MemoryOnly("on_full"));
        }
        let (first, rest) = policy
            .quotas
            .split_first()
            .ok_or(crate::ConfigError::NoQuota)?;
        let mut builder = RedisRateLimiter::<K>::builder(self.clone(), first.clone())
            .name(policy.name.to_string())
            .keyed_as(!policy.is_derived(), keys.map(str::to_owned))
            .uncounted();
        for q in rest {
            builder = builder.quota(q.clone());
        }
        if let Some(clock) = clock {
            builder = builder.clock(clock.clone());
        }
        if let Some(penalty) = penalty {
            builder = builder.penalty_box(penalty.clone()).dry_run(dry_run);
        }
        builder.try_build()
    }
}

impl<K, S> crate::store::backend::Handover<K, S> for RedisStore
where
    K: RedisKey + std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    S: Clone,
{
    fn hand_over(inner: &mut S, later: Later) -> (S, Later) {
        let clone = inner.clone();
        (std::mem::replace(inner, clone), later)
    }
}
