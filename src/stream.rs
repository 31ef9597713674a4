//! Stream adapters: rate-limit or shape any `futures::Stream`, e.g. the messages of a queue
//! consumer.
//!
//! Items are never dropped: each one waits for its slot and is then yielded, in order. While an
//! item waits, the stream underneath is not polled, so a consumer that reads with
//! back-pressure (a Redis Stream read with `COUNT`, a Kafka consumer) fetches no more than it
//! can pass on.
//!
//! * [`LimitStreamExt::rate_limit`]: a [`RateLimiter`] decides, keyed by a closure on the item;
//!   [`RateLimited::cost`] charges an item more than one unit. A key with its burst left lets
//!   items through at once.
//! * [`LimitStreamExt::shape`]: a [`Shaper`] spaces items out, one per emission interval per
//!   key; [`Shaped::cost`] makes an item take several slots.
//! * `LimitStreamExt::rate_limit_redis` (feature `redis` too): a
//!   [`RedisRateLimiter`](crate::redis::RedisRateLimiter) decides, so that consumers in many
//!   processes share one limit; `RedisRateLimited::cost` as above.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use tollgate::stream::LimitStreamExt;
//! use tollgate::{Clock, Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // 2 messages per second per tenant, bursts of 2.
//! let limiter = RateLimiter::<&str>::builder(Quota::per_second(2)).clock(Clock::tokio()).build();
//! let messages = futures_util::stream::iter([("acme", 1), ("acme", 2), ("acme", 3), ("zeta", 4)]);
//! let start = tokio::time::Instant::now();
//! let out: Vec<_> = messages
//!     .rate_limit(limiter, |m: &(&str, i32)| m.0)
//!     .map(|m| (m.1, start.elapsed()))
//!     .collect()
//!     .await;
//! assert_eq!(out[2], (3, Duration::from_millis(500)));
//! # }
//! ```
//!
//! # Clocks
//! Waiting is on tokio's timer, so the limiter must read tokio's time or the system's (the
//! default, or [`Clock::tokio`](crate::Clock::tokio) in tests with a paused clock).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::decision::Outcome;
use crate::limiter::RateLimiter;
use crate::shape::{Shaper, Slot};

/// The cost of an item when none is set: 1.
fn unit_cost<T>(_: &T) -> u32 {
    1
}

/// Rate limiting and shaping for every [`Stream`].
pub trait LimitStreamExt: Stream + Sized {
    /// Yields each item once `limiter` admits it for the key `key` gives, waiting as long as
    /// it takes. Items cost 1 unless [`RateLimited::cost`] says otherwise.
    fn rate_limit<K, KF>(self, limiter: RateLimiter<K>, key: KF) -> RateLimited<Self, K, KF>
    where
        K: Hash + Eq + Clone + Send + Sync,
        KF: FnMut(&Self::Item) -> K,
    {
        let chunk = smallest_burst(&limiter.quotas());
        RateLimited {
            inner: Paced::new(
                self,
                key,
                RateGate {
                    limiter,
                    chunk,
                    sleep: None,
                },
            ),
        }
    }

    /// Yields each item when its slot in `shaper`'s queue for the key `key` gives has come:
    /// one item per emission interval per key. Items take one slot unless [`Shaped::cost`]
    /// says otherwise.
    fn shape<K, KF>(self, shaper: Shaper<K>, key: KF) -> Shaped<Self, K, KF>
    where
        K: Hash + Eq + Clone + Send + Sync,
        KF: FnMut(&Self::Item) -> K,
    {
        Shaped {
            inner: Paced::new(self, key, ShapeGate { shaper, slot: None }),
        }
    }

    /// Yields each item once `limiter`, a limit shared through Redis by every process that
    /// uses the same store and name, admits it for the key `key` gives, waiting as long as it
    /// takes. Items cost 1 unless [`RedisRateLimited::cost`] says otherwise.
    ///
    /// ```no_run
    /// use futures_util::StreamExt;
    /// use tollgate::redis::{RedisRateLimiter, RedisStore};
    /// use tollgate::stream::LimitStreamExt;
    /// use tollgate::Quota;
    ///
    /// # async fn run() -> Result<(), redis::RedisError> {
    /// // 50 messages per second per tenant, shared by every consumer process.
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// let limiter = RedisRateLimiter::<String>::builder(store, Quota::per_second(50))
    ///     .name("consumers")
    ///     .build();
    /// let messages = futures_util::stream::iter([("acme", 1), ("zeta", 2)]);
    /// let mut paced = messages.rate_limit_redis(limiter, |m: &(&str, i32)| m.0.to_owned());
    /// while let Some(m) = paced.next().await {
    ///     // process m
    /// #   let _ = m;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// Each part of an item's cost is one [`until_ready_n`] on the limiter: waiters of one key
    /// in this process queue in line, and a rejection from Redis sends the item to sleep for
    /// the retry time Redis gave. When Redis cannot be reached, the store's failure mode
    /// decides, as for any decision; with the local fallback, a part larger than a scaled
    /// burst waits (a second at a time) until Redis answers again.
    ///
    /// [`until_ready_n`]: crate::redis::RedisRateLimiter::until_ready_n
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    fn rate_limit_redis<K, KF>(
        self,
        limiter: crate::redis::RedisRateLimiter<K>,
        key: KF,
    ) -> RedisRateLimited<Self, K, KF>
    where
        K: crate::redis::RedisKey + Hash + Eq + Clone + Send + Sync + 'static,
        KF: FnMut(&Self::Item) -> K,
    {
        let chunk = smallest_burst(&limiter.quotas());
        RedisRateLimited {
            inner: Paced::new(
                self,
                key,
                RedisGate {
                    limiter,
                    chunk,
                    waiting: None,
                },
            ),
        }
    }
}

impl<S: Stream> LimitStreamExt for S {}

/// The largest part of a cost one decision can admit: the smallest burst of `quotas`.
fn smallest_burst(quotas: &[crate::Quota]) -> u32 {
    quotas
        .iter()
        .map(|q| q.burst_size())
        .min()
        .unwrap_or(1)
        .max(1)
}

/// The size hint of an adapter: the stream's, plus the item it holds back, if any.
fn size_hint((lo, hi): (usize, Option<usize>), holding: bool) -> (usize, Option<usize>) {
    let extra = usize::from(holding);
    (
        lo.saturating_add(extra),
        hi.and_then(|h| h.checked_add(extra)),
    )
}

/// The item being admitted and what it still has to pay.
struct Pending<T, K> {
    item: T,
    key: K,
    /// Units (or slots) still to take.
    owed: u32,
}

/// What an item pays its cost to before it passes: a limiter or a shaper, with the state of
/// the wait of the item being admitted.
trait Gate<K> {
    /// Pays `owed` for `key` down to 0; `Pending` while it waits.
    fn pay(&mut self, key: &K, owed: &mut u32, cx: &mut Context<'_>) -> Poll<()>;
}

pin_project! {
    /// The adapters' common part: the stream, the key and cost of its items, and the item
    /// held back until `gate` lets it pass.
    struct Paced<S: Stream, K, KF, CF, G> {
        #[pin]
        stream: S,
        key: KF,
        cost: CF,
        gate: G,
        pending: Option<Pending<S::Item, K>>,
    }
}

impl<S: Stream, K, KF, G> Paced<S, K, KF, fn(&S::Item) -> u32, G> {
    fn new(stream: S, key: KF, gate: G) -> Self {
        Paced {
            stream,
            key,
            cost: unit_cost::<S::Item>,
            gate,
            pending: None,
        }
    }
}

impl<S: Stream, K, KF, CF, G> Paced<S, K, KF, CF, G> {
    fn cost<CF2>(self, cost: CF2) -> Paced<S, K, KF, CF2, G> {
        Paced {
            stream: self.stream,
            key: self.key,
            cost,
            gate: self.gate,
            pending: self.pending,
        }
    }

    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result
    where
        S: fmt::Debug,
    {
        f.debug_struct(name)
            .field("stream", &self.stream)
            .field("waiting", &self.pending.is_some())
            .finish_non_exhaustive()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        size_hint(self.stream.size_hint(), self.pending.is_some())
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>>
    where
        KF: FnMut(&S::Item) -> K,
        CF: FnMut(&S::Item) -> u32,
        G: Gate<K>,
    {
        let mut this = self.project();
        loop {
            let Some(p) = this.pending.as_mut() else {
                let Some(item) = ready!(this.stream.as_mut().poll_next(cx)) else {
                    return Poll::Ready(None);
                };
                let (key, owed) = ((this.key)(&item), (this.cost)(&item));
                *this.pending = Some(Pending { item, key, owed });
                continue;
            };
            ready!(this.gate.pay(&p.key, &mut p.owed, cx));
            return Poll::Ready(this.pending.take().map(|p| p.item));
        }
    }
}

/// The public side of an adapter around [`Paced`]: `cost`, `into_inner`, `Debug` and
/// `Stream`, all forwarded; `$bound` is what the gate needs of the key.
macro_rules! adapter {
    ($name:ident, [$($bound:tt)+], $cost_doc:literal) => {
        impl<S: Stream, K, KF, CF> $name<S, K, KF, CF> {
            #[doc = $cost_doc]
            pub fn cost<CF2>(self, cost: CF2) -> $name<S, K, KF, CF2>
            where
                CF2: FnMut(&S::Item) -> u32,
            {
                $name {
                    inner: self.inner.cost(cost),
                }
            }

            /// The stream underneath.
            pub fn into_inner(self) -> S {
                self.inner.stream
            }
        }

        impl<S: Stream + fmt::Debug, K, KF, CF> fmt::Debug for $name<S, K, KF, CF> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.inner.debug(stringify!($name), f)
            }
        }

        impl<S, K, KF, CF> Stream for $name<S, K, KF, CF>
        where
            S: Stream,
            K: $($bound)+,
            KF: FnMut(&S::Item) -> K,
            CF: FnMut(&S::Item) -> u32,
        {
            type Item = S::Item;

            fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
                self.project().inner.poll_next(cx)
            }

            fn size_hint(&self) -> (usize, Option<usize>) {
                self.inner.size_hint()
            }
        }
    };
}

/// A [`RateLimiter`] as a gate: the cost in parts of at most `chunk`, each decided at once,
/// sleeping for the retry time between rejections.
struct RateGate<K> {
    limiter: RateLimiter<K>,
    chunk: u32,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<K: Hash + Eq + Clone + Send + Sync> Gate<K> for RateGate<K> {
    fn pay(&mut self, key: &K, owed: &mut u32, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if *owed == 0 {
                self.sleep = None;
                return Poll::Ready(());
            }
            let part = (*owed).min(self.chunk);
            let d = self.limiter.check_n(key, part);
            match d.outcome() {
                Outcome::Allowed => *owed -= part,
                // Parts never exceed the smallest burst; should one anyway (a quota changed
                // under us), pay unit by unit rather than stall.
                Outcome::Exceeds => self.chunk = 1,
                Outcome::Limited | Outcome::Banned => {
                    let wait = d.retry_after().unwrap_or(Duration::from_millis(1));
                    let deadline = tokio::time::Instant::now() + wait;
                    let sleep = match self.sleep.as_mut() {
                        Some(s) => {
                            s.as_mut().reset(deadline);
                            s
                        }
                        None => self
                            .sleep
                            .insert(Box::pin(tokio::time::sleep_until(deadline))),
                    };
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

/// A [`Shaper`] as a gate: one slot of the key's queue per unit of cost.
struct ShapeGate<K> {
    shaper: Shaper<K>,
    /// The slot the item waits for.
    slot: Option<Slot>,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Gate<K> for ShapeGate<K> {
    fn pay(&mut self, key: &K, owed: &mut u32, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(s) = self.slot.as_mut() {
                if Pin::new(s).poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.slot = None;
                *owed -= 1;
            }
            if *owed == 0 {
                return Poll::Ready(());
            }
            self.slot = Some(self.shaper.until_slot(key));
        }
    }
}

pin_project! {
    /// A stream whose items pass a [`RateLimiter`]. Made by [`LimitStreamExt::rate_limit`].
    ///
    /// # Semantics
    /// * An item is yielded once its cost has been admitted for its key; until then the stream
    ///   underneath is not polled.
    /// * A cost of 0 passes at once and consumes nothing.
    /// * A cost above the smallest burst of the limiter's quotas could never be admitted in
    ///   one decision: it is paid in parts of that burst, one after the other, so the item
    ///   waits for its whole cost and the rate holds.
    /// * Dropping the stream while an item waits drops the item; the parts of its cost already
    ///   paid stay consumed.
    #[must_use = "streams do nothing unless polled"]
    pub struct RateLimited<S: Stream, K, KF, CF = fn(&<S as Stream>::Item) -> u32> {
        #[pin]
        inner: Paced<S, K, KF, CF, RateGate<K>>,
    }
}

impl<S: Stream, K, KF, CF> RateLimited<S, K, KF, CF> {
    /// The limiter.
    pub fn limiter(&self) -> &RateLimiter<K> {
        &self.inner.gate.limiter
    }
}

adapter!(
    RateLimited,
    [Hash + Eq + Clone + Send + Sync],
    "Charges each item `cost(&item)` units instead of 1."
);

pin_project! {
    /// A stream whose items are spaced out by a [`Shaper`]. Made by [`LimitStreamExt::shape`].
    ///
    /// # Semantics
    /// * An item takes its first place in its key's queue when the stream underneath yields
    ///   it, and is yielded when its last slot has come; until then the stream underneath is
    ///   not polled.
    /// * A cost of `n` takes `n` slots one after the other (other users of the shaper may be
    ///   served in between); a cost of 0 passes at once.
    /// * Dropping the stream while an item waits drops the item and gives its place back.
    #[must_use = "streams do nothing unless polled"]
    pub struct Shaped<S: Stream, K, KF, CF = fn(&<S as Stream>::Item) -> u32> {
        #[pin]
        inner: Paced<S, K, KF, CF, ShapeGate<K>>,
    }
}

impl<S: Stream, K, KF, CF> Shaped<S, K, KF, CF> {
    /// The shaper.
    pub fn shaper(&self) -> &Shaper<K> {
        &self.inner.gate.shaper
    }
}

adapter!(
    Shaped,
    [Hash + Eq + Clone + Send + Sync + 'static],
    "Makes each item take `cost(&item)` slots instead of 1."
);

#[cfg(feature = "redis")]
type Admission = Pin<
    Box<dyn Future<Output = Result<crate::Decision, crate::limiter::InsufficientCapacity>> + Send>,
>;

/// A [`RedisRateLimiter`](crate::redis::RedisRateLimiter) as a gate: the cost in parts of at
/// most `chunk`, each one `until_ready_n`.
#[cfg(feature = "redis")]
struct RedisGate<K> {
    limiter: crate::redis::RedisRateLimiter<K>,
    chunk: u32,
    // The admission of the pending item's next part, and its size.
    waiting: Option<(Admission, u32)>,
}

#[cfg(feature = "redis")]
impl<K> Gate<K> for RedisGate<K>
where
    K: crate::redis::RedisKey + Hash + Eq + Clone + Send + Sync + 'static,
{
    fn pay(&mut self, key: &K, owed: &mut u32, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some((admission, part)) = self.waiting.as_mut() {
                let Poll::Ready(result) = admission.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                let part = *part;
                self.waiting = None;
                match result {
                    Ok(_) => *owed -= part,
                    // Parts never exceed the smallest burst; should one anyway (a quota
                    // changed under us), pay unit by unit rather than stall.
                    Err(_) => self.chunk = 1,
                }
            }
            if *owed == 0 {
                return Poll::Ready(());
            }
            let part = (*owed).min(self.chunk);
            let limiter = self.limiter.clone();
            let key = key.clone();
            let admission: Admission =
                Box::pin(async move { limiter.until_ready_n(&key, part).await });
            self.waiting = Some((admission, part));
        }
    }
}

#[cfg(feature = "redis")]
pin_project! {
    /// A stream whose items pass a [`RedisRateLimiter`](crate::redis::RedisRateLimiter): one
    /// limit shared by consumers in many processes. Made by
    /// `LimitStreamExt::rate_limit_redis`.
    ///
    /// # Semantics
    /// As [`RateLimited`]: an item is yielded once its whole cost has been admitted for its
    /// key, in parts no larger than the smallest burst; until then the stream underneath is
    /// not polled; a cost of 0 passes at once; dropping the stream while an item waits drops
    /// the item, and the parts already admitted stay consumed in Redis.
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use = "streams do nothing unless polled"]
    pub struct RedisRateLimited<S: Stream, K, KF, CF = fn(&<S as Stream>::Item) -> u32> {
        #[pin]
        inner: Paced<S, K, KF, CF, RedisGate<K>>,
    }
}

#[cfg(feature = "redis")]
impl<S: Stream, K, KF, CF> RedisRateLimited<S, K, KF, CF> {
    /// The limiter.
    pub fn limiter(&self) -> &crate::redis::RedisRateLimiter<K> {
        &self.inner.gate.limiter
    }
}

#[cfg(feature = "redis")]
adapter!(
    RedisRateLimited,
    [crate::redis::RedisKey + Hash + Eq + Clone + Send + Sync + 'static],
    "Charges each item `cost(&item)` units instead of 1."
);
