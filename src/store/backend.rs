//! Where the state of a [`RateLimitLayer`](crate::RateLimitLayer) lives, and how its one
//! service asks for a decision: a store answers [now](Answer::Now) (memory; Redis when its
//! cache of known rejections already knows) or [later](Answer::Later) (after a Redis round
//! trip).

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::clock::Clock;
use crate::decision::{Decision, Reservation};
use crate::error::ConfigError;
use crate::keyed::OnFull;
use crate::penalty::{Penalties, PenaltyBox};
use crate::quota::Quota;

/// The store of a [`RateLimitLayer`](crate::RateLimitLayer) (its second type parameter):
/// [`Memory`] by default, or a `redis::RedisStore` given to
/// [`RateLimitLayer::store`](crate::RateLimitLayer::store).
///
/// Sealed: implemented by the crate's stores only.
pub trait Backend<K>: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The limiter of one tier on this store.
    type Limiter: Clone + Send + Sync + 'static;

    /// A decision that waits for the store.
    #[doc(hidden)]
    type Later: Future<Output = Decision> + Send + 'static;

    /// Whether the layer keeps a penalty box's state itself, in memory, beside the store's
    /// limiters (the memory store), or leaves it to the limiters (Redis, which decides the ban
    /// and the quotas in one script call).
    #[doc(hidden)]
    const LOCAL_PENALTIES: bool;

    /// The limiter of `policy`, whose keys the layer's extractor describes as `keys` (see
    /// [`KeyExtractor::describe`](crate::key::KeyExtractor::describe)). `dry_run`: the
    /// layer lets every request through, so a refusal of its quotas is no strike of a
    /// `penalty` box the limiter keeps.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn make_limiter(
        &self,
        policy: &crate::Policy,
        keys: Option<&str>,
        clock: Option<&Clock>,
        max_keys: Option<usize>,
        on_full: Option<OnFull>,
        penalty: Option<&PenaltyBox>,
        dry_run: bool,
    ) -> Result<Self::Limiter, ConfigError>;

    /// The share of each quota its limiters enforce in this process when the store cannot
    /// decide (Redis's local fallback), if they do.
    #[doc(hidden)]
    fn local_share(&self) -> Option<f64> {
        None
    }

    /// Replaces the quotas of `limiter` (and its clones) while serving.
    #[doc(hidden)]
    fn set_quotas(limiter: &Self::Limiter, quotas: &[Quota]) -> Result<(), ConfigError>;

    /// The generation of the quotas `limiter` decides with: one more at each change of them,
    /// whoever made it, and what its decisions are stamped with.
    #[doc(hidden)]
    fn generation(limiter: &Self::Limiter) -> u16;

    /// Decides `cost` for `key`: at once, or with a future.
    #[doc(hidden)]
    fn decide(limiter: &Self::Limiter, key: &K, cost: u32) -> Answer<Self::Later>;

    /// Makes the limiters of a layer's tiers count their keys against one bound of `max_keys`,
    /// with the penalty box's keys when the layer keeps them (see `LOCAL_PENALTIES`); returns
    /// that penalty state. Nothing for a store that bounds no keys here.
    #[doc(hidden)]
    fn share_bound(
        _limiters: &[Self::Limiter],
        _max_keys: usize,
        _penalty: Option<(&PenaltyBox, Clock)>,
    ) -> Option<Penalties<K>> {
        None
    }

    /// Decides `cost` for `key` on a layer that may charge it after the response (a
    /// settlement): as [`decide`](Self::decide), except that a store bounding its keys finds
    /// a place for the key even at a cost of 0.
    #[doc(hidden)]
    fn reserve(limiter: &Self::Limiter, key: &K, cost: u32) -> Answer<Self::Later> {
        Self::decide(limiter, key, cost)
    }

    /// Gives back what the admission of a request for `key` took (`taken`, its whole cost):
    /// done when this returns (memory), or when the returned future completes (Redis).
    /// `local`: the admission was made by the store's local fallback (Redis unreachable),
    /// whose state is given back instead.
    #[doc(hidden)]
    fn refund(
        limiter: &Self::Limiter,
        key: K,
        taken: Reservation,
        local: bool,
    ) -> Option<Refunding>;

    /// How many keys the limiter tracks in this process, if it tracks them here.
    #[doc(hidden)]
    fn tracked_keys(_limiter: &Self::Limiter) -> Option<usize> {
        None
    }

    /// Settles a request that took `taken` for `key` at the `actual` cost its response
    /// reported (different from the cost taken): gives back the difference from what it took,
    /// or charges it even over the limit. Answers the key's state after settling: at once
    /// (memory), or when the future completes (Redis; `None` when Redis did not answer).
    /// `local` as for [`refund`](Self::refund).
    #[doc(hidden)]
    fn settle(
        limiter: &Self::Limiter,
        key: K,
        taken: Reservation,
        actual: u32,
        local: bool,
    ) -> Answer<Settling>;
}

/// A refund that waits for the store.
#[doc(hidden)]
pub type Refunding = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A settlement that waits for the store: the key's state after it, if the store answered.
#[doc(hidden)]
pub type Settling = Pin<Box<dyn Future<Output = Option<Decision>> + Send>>;

/// What a store makes of a request to be decided.
#[doc(hidden)]
#[derive(Debug)]
pub enum Answer<F> {
    /// Decided without waiting.
    Now(Decision),
    /// Decided when `F` completes.
    Later(F),
}

/// How the service hands the inner service it made ready to a request whose decision comes
/// later (the future calls it then). Only a store that answers later needs `S: Clone` to put
/// a fresh service in its place; the memory store never answers later and needs nothing.
#[doc(hidden)]
pub trait Handover<K, S>: Backend<K> {
    /// Takes the ready service out of `inner`, for the request waiting on `later`.
    fn hand_over(inner: &mut S, later: Self::Later) -> (S, Self::Later);
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// The in-memory store: state in this process, decisions without I/O. The default.
///
/// Each tier's limiter is a [`RateLimiter`](crate::RateLimiter); the store's [`Backend`] impl
/// sits beside it (in `src/limiter/mod.rs`), so that a layer's decision is read where the
/// limiter makes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory;

impl sealed::Sealed for Memory {}

/// The memory store's decisions never wait: a future that cannot exist.
#[doc(hidden)]
#[derive(Debug)]
pub enum Never {}

impl Future for Never {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Decision> {
        match *self {}
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, S> Handover<K, S> for Memory {
    fn hand_over(_: &mut S, later: Never) -> (S, Never) {
        match later {}
    }
}
