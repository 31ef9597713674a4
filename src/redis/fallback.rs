//! What a limiter decides when Redis does not: the store's [`FailMode`] (admit, reject, or
//! decide in this process on each quota scaled to a [`Share`]), and a rejection as
//! unavailable when Redis answered with an error about the key.

use std::hash::Hash;

use super::store::{FailMode, Failure, Share, RETRY_WHEN_UNAVAILABLE};
use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Reservation};
use crate::error::ConfigError;
use crate::limiter::RateLimiter;
use crate::quota::Quota;

/// A limiter's failure policy, with the in-memory limiter of [`FailMode::Local`].
pub(super) struct Fallback<K> {
    mode: FailMode,
    /// The in-memory limiter on the quotas at the share, with [`FailMode::Local`].
    local: Option<(RateLimiter<K>, Share)>,
}

impl<K: Hash + Eq + Clone + Send + Sync> Fallback<K> {
    /// The failure policy `mode` for `quotas`, its local limiter deciding on `clock`.
    pub(super) fn new(
        mode: FailMode,
        quotas: &[Quota],
        clock: &Clock,
    ) -> Result<Self, ConfigError> {
        let local = match mode {
            FailMode::Local(share) => {
                let scaled = scaled(quotas, share)?;
                let (first, rest) = scaled.split_first().ok_or(ConfigError::NoQuota)?;
                let limiter = rest
                    .iter()
                    .fold(RateLimiter::builder(first.clone()), |b, q| {
                        b.quota(q.clone())
                    })
                    .clock(clock.clone())
                    .try_build()?;
                Some((limiter, share))
            }
            FailMode::Open | FailMode::Closed => None,
        };
        Ok(Fallback { mode, local })
    }

    /// Replaces the local limiter's quotas with `quotas` at its share.
    pub(super) fn set_quotas(&self, quotas: &[Quota]) -> Result<(), ConfigError> {
        if let Some((limiter, share)) = &self.local {
            limiter.set_quotas(scaled(quotas, *share)?)?;
        }
        Ok(())
    }

    /// The decision for a request that Redis did not decide, by why: the failure policy's
    /// when Redis is unavailable; a rejection as unavailable, whatever the failure policy,
    /// when Redis answered with an error about the key (a misconfiguration: never admitted
    /// silently, and never decided on a local state that would hide it).
    pub(super) fn failed(&self, key: &K, cost: u32, rules: &[Rule], failure: Failure) -> Decision {
        match failure {
            Failure::Unavailable => self.unanswered(key, cost, rules),
            Failure::Key => {
                Decision::degraded(rules, false, RETRY_WHEN_UNAVAILABLE.as_nanos() as u64)
            }
        }
    }

    /// The decision of the failure policy for a request Redis did not decide: the local
    /// fallback's, or an admission or rejection that knows nothing of the key.
    pub(super) fn unanswered(&self, key: &K, cost: u32, rules: &[Rule]) -> Decision {
        let retry = RETRY_WHEN_UNAVAILABLE.as_nanos() as u64;
        match &self.local {
            Some((limiter, _)) => {
                let never = rules.iter().any(|r| u64::from(cost) > r.limit());
                limiter.check_n(key, cost).made_locally(never, retry)
            }
            None => Decision::degraded(rules, self.mode == FailMode::Open, retry),
        }
    }

    /// Gives back what the local fallback's admission of a request for `key` took (a layer
    /// inside rejected it) to the fallback's state.
    pub(super) fn refund(&self, key: &K, taken: &Reservation) {
        if let Some((limiter, _)) = &self.local {
            limiter.refund(key, taken, taken.cost);
        }
    }

    /// Settles a request the local fallback admitted, in the fallback's state: the key's
    /// state there after settling (a local decision); `None` without a local fallback.
    pub(super) fn settle(&self, key: &K, taken: &Reservation, actual: u32) -> Option<Decision> {
        let (limiter, _) = self.local.as_ref()?;
        let d = limiter.settle(key, taken, actual);
        Some(d.made_locally(true, 0))
    }
}

/// `quotas`, each at `share`.
fn scaled(quotas: &[Quota], share: Share) -> Result<Vec<Quota>, ConfigError> {
    quotas.iter().map(|q| q.scaled(share.get())).collect()
}
