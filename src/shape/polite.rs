//! [`PoliteLayer`]: the client side of shaping. Calls wait for their slot instead of being
//! refused, so a caller never exceeds a partner's limit.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::{PoliteFuture, State};
use super::shaper::Shaper;
use crate::key::Global;
use crate::layer::common::inner_access;
use crate::quota::Quota;

/// How a [`PoliteLayer`] picks the key of a call: [`Global`] (one queue, as everywhere in the
/// crate), or a closure
/// `Fn(&Req) -> K` (e.g. one queue per partner host).
pub trait CallKey<Req>: Send + Sync + 'static {
    /// The key type.
    type Key;

    /// The key of `req`.
    fn key(&self, req: &Req) -> Self::Key;
}

/// Every call in one queue.
impl<Req> CallKey<Req> for Global {
    type Key = ();

    #[inline]
    fn key(&self, _: &Req) {}
}

impl<Req, K, F> CallKey<Req> for F
where
    F: Fn(&Req) -> K + Send + Sync + 'static,
{
    type Key = K;

    #[inline]
    fn key(&self, req: &Req) -> K {
        self(req)
    }
}

/// Spaces out calls to any Tower service (an HTTP client, a gRPC channel, a database pool) to
/// a quota's rate: each call waits for its slot, first in first out, and is never refused.
///
/// Works for any request type. One layer value is one queue (per key), shared by its clones
/// and every service it wraps.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{PoliteLayer, Quota};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Stand-in for an HTTP client; the partner allows 10 calls per second.
/// let client = ServiceBuilder::new()
///     .layer(PoliteLayer::new(Quota::per_second(10)))
///     .service(service_fn(|id: u32| async move { Ok::<_, std::convert::Infallible>(id) }));
///
/// let start = tokio::time::Instant::now();
/// for id in 0..5 {
///     client.clone().oneshot(id).await.unwrap();
/// }
/// assert_eq!(start.elapsed(), Duration::from_millis(400)); // 0, 100, 200, 300, 400 ms
/// # }
/// ```
///
/// # Behaviour
/// * `poll_ready` is the inner service's. `call` takes the request's place in the queue at
///   once; the returned future waits for the slot and then calls the inner service (made
///   ready by the caller's `poll_ready`, which waits with the request). A call whose slot has
///   come and that nobody is ahead of goes straight through.
/// * Dropping the future before its slot (a timeout, a cancelled task) gives the slot to the
///   next call and the call is not made.
/// * The inner service's error type is kept.
pub struct PoliteLayer<K = (), F = Global> {
    shaper: Shaper<K>,
    key: Arc<F>,
}

impl<K, F> Clone for PoliteLayer<K, F> {
    fn clone(&self) -> Self {
        PoliteLayer {
            shaper: self.shaper.clone(),
            key: self.key.clone(),
        }
    }
}

impl<K, F> fmt::Debug for PoliteLayer<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoliteLayer")
            .field("shaper", &self.shaper)
            .finish_non_exhaustive()
    }
}

impl PoliteLayer<(), Global> {
    /// One queue for every call, at `quota`'s rate (its burst is not used).
    pub fn new(quota: Quota) -> Self {
        Self::with_shaper(Shaper::new(quota))
    }

    /// One queue for every call, on `shaper`: to set a no-delay burst, or to share the queue
    /// with other code that calls [`Shaper::until_slot`].
    pub fn with_shaper(shaper: Shaper<()>) -> Self {
        PoliteLayer {
            shaper,
            key: Arc::new(Global),
        }
    }
}

impl<K, F> PoliteLayer<K, F> {
    /// One queue per key, as `key` picks it from each request (e.g. the partner's host), each
    /// at the shaper's rate.
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::{PoliteLayer, Quota, Shaper};
    ///
    /// let per_host = PoliteLayer::keyed(
    ///     Shaper::<Option<String>>::new(Quota::per_second(10)),
    ///     |req: &Request<String>| req.uri().host().map(str::to_owned),
    /// );
    /// # let _ = per_host;
    /// ```
    pub fn keyed(shaper: Shaper<K>, key: F) -> Self {
        PoliteLayer {
            shaper,
            key: Arc::new(key),
        }
    }

    /// The shaper behind the layer.
    pub fn shaper(&self) -> &Shaper<K> {
        &self.shaper
    }
}

impl<S, K, F> Layer<S> for PoliteLayer<K, F> {
    type Service = Polite<S, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Polite {
            inner,
            shaper: self.shaper.clone(),
            key: self.key.clone(),
        }
    }
}

/// The service made by [`PoliteLayer`].
pub struct Polite<S, K = (), F = Global> {
    inner: S,
    shaper: Shaper<K>,
    key: Arc<F>,
}

impl<S: Clone, K, F> Clone for Polite<S, K, F> {
    fn clone(&self) -> Self {
        Polite {
            inner: self.inner.clone(),
            shaper: self.shaper.clone(),
            key: self.key.clone(),
        }
    }
}

impl<S: fmt::Debug, K, F> fmt::Debug for Polite<S, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Polite")
            .field("inner", &self.inner)
            .field("shaper", &self.shaper)
            .finish_non_exhaustive()
    }
}

inner_access!(Polite<S, K, F>);

impl<S, Req, K, F> Service<Req> for Polite<S, K, F>
where
    S: Service<Req> + Clone,
    F: CallKey<Req, Key = K>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = PoliteFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = self.key.key(&req);
        match self.shaper.admit_waiting(&key) {
            None => PoliteFuture::new(State::calling(self.inner.call(req))),
            Some(slot) => {
                // The service made ready for this call waits with it; the clone serves the
                // next one.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                PoliteFuture::new(State::waiting(slot, ready, req))
            }
        }
    }
}
