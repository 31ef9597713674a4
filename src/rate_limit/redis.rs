//! The service of a [`RateLimitLayer`](super::RateLimitLayer) whose state is in Redis.
//!
//! Same request preparation and same responses as [`RateLimit`](super::RateLimit) (the shared
//! `prepare` and `finish`); only the decision differs: it waits for Redis in the response
//! future, so the inner service that was made ready is moved into that future and a clone takes
//! its place.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::future::RateHeaders;
use super::shared::{Prepared, Shared};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::service_shell;
use crate::redis::{RedisKey, RedisRateLimiter};

type SharedState<E> = Arc<Shared<E, RedisRateLimiter<<E as KeyExtractor>::Key>>>;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer) with a
/// [`RedisStore`](crate::redis::RedisStore).
pub struct RedisRateLimit<S, E: KeyExtractor> {
    inner: S,
    shared: SharedState<E>,
}

service_shell!(RedisRateLimit<S, E: KeyExtractor> => Shared<E, RedisRateLimiter<E::Key>>);

/// The decision in flight: the request to pass on with its header fields, or the rejection.
type Pending<ReqBody, ResBody> = Pin<
    Box<
        dyn Future<Output = Result<(Request<ReqBody>, Option<RateHeaders>), Response<ResBody>>>
            + Send,
    >,
>;

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for RedisRateLimit<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: KeyExtractor,
    E::Key: RedisKey,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RedisResponseFuture<S, ReqBody, ResBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (tier, key, cost) = match shared.prepare(&RequestHead::new(&req)) {
            Prepared::Pass => return RedisResponseFuture::inner(self.inner.call(req), None),
            Prepared::Reject(resp) => return RedisResponseFuture::ready(resp),
            Prepared::Decide { tier, key, cost } => (tier, key, cost),
        };
        let limiter = &shared.tiers[tier].limiter;
        let now = limiter.now();
        // A rejection Redis already decided: no round trip, no clone of the inner service.
        if let Some(decision) = limiter.local(&key, cost, now) {
            return match shared.finish(tier, decision, &mut req) {
                Ok(headers) => RedisResponseFuture::inner(self.inner.call(req), headers),
                Err(resp) => RedisResponseFuture::ready(resp),
            };
        }
        let state = self.shared.clone();
        let pending: Pending<ReqBody, ResBody> = Box::pin(async move {
            let decision = state.tiers[tier].limiter.remote(&key, cost, now).await;
            state
                .finish(tier, decision, &mut req)
                .map(|headers| (req, headers))
        });
        // The service that was polled ready is the one that will be called.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        RedisResponseFuture {
            kind: Kind::Deciding {
                pending,
                service: Some(service),
            },
        }
    }
}

pin_project! {
    /// The response future of [`RedisRateLimit`]: waits for the decision, then for the inner
    /// service's response (with the rate-limit header fields added), or yields the rejection.
    pub struct RedisResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Deciding {
            pending: Pending<ReqBody, ResBody>,
            service: Option<S>,
        },
        Inner {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
        },
        Ready {
            response: Option<Response<ResBody>>,
        },
    }
}

impl<S, ReqBody, ResBody> RedisResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
{
    fn inner(future: S::Future, headers: Option<RateHeaders>) -> Self {
        RedisResponseFuture {
            kind: Kind::Inner { future, headers },
        }
    }

    fn ready(response: Response<ResBody>) -> Self {
        RedisResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for RedisResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            let next = match kind.as_mut().project() {
                KindProj::Deciding { pending, service } => {
                    match ready!(pending.as_mut().poll(cx)) {
                        Ok((req, headers)) => match service.take() {
                            Some(mut service) => Kind::Inner {
                                future: service.call(req),
                                headers,
                            },
                            // Only reachable if polled again after a panic in `call`.
                            None => panic!("RedisResponseFuture polled after completion"),
                        },
                        Err(response) => Kind::Ready {
                            response: Some(response),
                        },
                    }
                }
                KindProj::Inner { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(h) = headers.take() {
                        h.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                KindProj::Ready { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        // Polled after completion: a contract violation by the caller.
                        None => panic!("RedisResponseFuture polled after completion"),
                    };
                }
            };
            kind.set(next);
        }
    }
}
