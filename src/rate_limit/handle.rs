//! [`RateLimitHandle`]: the quotas of a [`RateLimitLayer`](super::RateLimitLayer), replaced
//! while it serves.

use std::fmt;
use std::sync::Arc;

use super::answers::Answers;
use super::policy::Policy;
use crate::error::ConfigError;
use crate::quota::Quota;

/// Replaces a tier's quotas in its limiter (memory or Redis).
/// Gives the limiter of a tier new quotas (`Some`), or leaves them (`None`); either way says
/// the generation of the quotas it then decides with.
pub(crate) type SetFn = dyn Fn(usize, Option<&[Quota]>) -> Result<u16, ConfigError> + Send + Sync;

/// Changes the quotas of a [`RateLimitLayer`](super::RateLimitLayer)'s policies while it
/// serves, from [`RateLimitLayer::handle`](super::RateLimitLayer::handle).
///
/// A change applies to the layer value it came from, its clones and every service they made,
/// from their next decision on, and keeps the state of every key: what a key spent stays
/// spent, counted in time. The new quotas judge that state and never rewrite it, by the rule
/// of [`RateLimiter::set_quotas`](crate::RateLimiter::set_quotas). The `RateLimit-Policy` and
/// `RateLimit` header fields describe the new quotas from the same moment: the fields of a
/// response are those of the quotas that judged its request, old or new, however late it is
/// answered (a Redis round trip, a settlement), whatever the two differ in (a window's width
/// alone included). Each decision carries the generation of the quotas the limiter judged it
/// with, and the layer keeps the policies of its last seven changes beside the one in
/// force. A request answered after eight changes or more since its quotas were loaded (a
/// handler or a settlement that outlived them) gets the fields of the quotas in force.
/// Replacing the quotas on the tier's limiter itself
/// ([`RateLimitLayer::limiter`](super::RateLimitLayer::limiter)) rather than through a handle
/// is a change the layer does not see: a request those quotas decide gets the fields of the
/// policy in force, which this handle last set. The next change through a handle takes the
/// limiter's count of changes again, so that later requests get the fields of the quotas
/// that judged them as before. Changes are made one at a time, through this
/// handle, its clones or another handle of the same layer, so that once they are done the
/// fields are those of the quotas the limiter kept.
///
/// A change that is not valid (an unknown tier, a policy with another number of quotas than
/// the tier was built with, a quota too fine for the store) returns a [`ConfigError`] and
/// leaves the quotas in force as they were.
///
/// On Redis, the quotas travel with each script call: each instance decides with the quotas
/// its own layer holds, so a change meant for every instance is made on each of them (they
/// all reload the same configuration, say), and applies on each from its next decision.
///
/// Cheap to clone, `Send` and `Sync`; the same type whatever the layer's key and store.
///
/// ```
/// use tollgate::{Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
///     .tier(Policy::new("pro", Quota::per_second(100)));
/// let handle = layer.handle().unwrap();
/// handle.apply(&Policy::new("pro", Quota::per_second(50).burst(200))).unwrap();
/// assert_eq!(handle.policy("pro").unwrap().quotas()[0].burst_size(), 200);
/// // Unknown tiers and invalid quotas change nothing.
/// assert!(handle.set_quotas("gold", [Quota::per_second(1)]).is_err());
/// assert!(handle.set_quotas("free", [Quota::per_second(1), Quota::per_hour(10)]).is_err());
/// assert_eq!(handle.policy("free").unwrap().quotas(), [Quota::per_second(10)]);
/// ```
#[derive(Clone)]
pub struct RateLimitHandle {
    answers: Arc<Answers>,
    set: Arc<SetFn>,
}

impl fmt::Debug for RateLimitHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitHandle")
            .field("policies", &self.policies())
            .finish_non_exhaustive()
    }
}

impl RateLimitHandle {
    pub(crate) fn new(answers: Arc<Answers>, set: Arc<SetFn>) -> Self {
        RateLimitHandle { answers, set }
    }

    /// The policies in force, one per tier, in the order the layer was given them (the
    /// first is the default tier).
    pub fn policies(&self) -> Vec<Policy> {
        let tiers = self.answers.tiers.iter();
        tiers.map(|t| t.live.load().policy.clone()).collect()
    }

    /// The policy in force for the tier named `tier`, if the layer has one.
    pub fn policy(&self, tier: &str) -> Option<Policy> {
        let i = self.position(tier).ok()?;
        Some(self.answers.tiers[i].live.load().policy.clone())
    }

    /// Applies `policy`: replaces the quotas of the tier with the policy's name by the
    /// policy's, as [`ConcurrencyHandle::apply`](crate::ConcurrencyHandle::apply) and
    /// [`ShapeHandle::apply`](crate::ShapeHandle::apply) apply their layers' settings.
    ///
    /// The policy must hold as many quotas as the tier (each replaces the one at its
    /// position, whose per-key state it keeps); an unknown tier or an invalid quota returns a
    /// [`ConfigError`] and changes nothing.
    pub fn apply(&self, policy: &Policy) -> Result<(), ConfigError> {
        self.set_quotas(policy.name(), policy.quotas.iter().cloned())
    }

    /// The former name of [`apply`](Self::apply).
    #[deprecated(note = "use `apply`, the name every handle gives it")]
    pub fn set_policy(&self, policy: Policy) -> Result<(), ConfigError> {
        self.apply(&policy)
    }

    /// Replaces the quotas of the tier named `tier`.
    ///
    /// The quotas must be as many as the tier's (each replaces the one at its position, whose
    /// per-key state it keeps). A layer built from one [`Quota`] has one tier, named after
    /// it (see [`Policy`]'s names); [`set_default_quotas`](Self::set_default_quotas) needs
    /// no name.
    pub fn set_quotas(
        &self,
        tier: &str,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<(), ConfigError> {
        let i = self.position(tier)?;
        self.set_at(i, quotas.into_iter().collect())
    }

    /// Replaces the quotas of the default tier (the layer's first policy).
    pub fn set_default_quotas(
        &self,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<(), ConfigError> {
        self.set_at(0, quotas.into_iter().collect())
    }

    fn position(&self, tier: &str) -> Result<usize, ConfigError> {
        let tiers = &self.answers.tiers;
        tiers
            .iter()
            .position(|t| &*t.name == tier)
            .ok_or_else(|| ConfigError::UnknownTier(tier.to_owned()))
    }

    fn set_at(&self, i: usize, quotas: Vec<Quota>) -> Result<(), ConfigError> {
        self.answers.tiers[i].change(quotas, |quotas| (self.set)(i, quotas))
    }
}
