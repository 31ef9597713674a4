use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::shared::{Prepared, Shared};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::service_shell;
use crate::limiter::RateLimiter;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, E: KeyExtractor> {
    inner: S,
    shared: std::sync::Arc<Shared<E, RateLimiter<E::Key>>>,
}

service_shell!(RateLimit<S, E: KeyExtractor> => Shared<E, RateLimiter<E::Key>>);

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    E: KeyExtractor,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (tier, key, cost) = match shared.prepare(&RequestHead::new(&req)) {
            Prepared::Pass => return ResponseFuture::inner(self.inner.call(req), None),
            Prepared::Reject(resp) => return ResponseFuture::ready(resp),
            Prepared::Decide { tier, key, cost } => (tier, key, cost),
        };
        let decision = shared.tiers[tier].limiter.check_n(&key, cost);
        match shared.finish(tier, decision, &mut req) {
            Ok(headers) => ResponseFuture::inner(self.inner.call(req), headers),
            Err(resp) => ResponseFuture::ready(resp),
        }
    }
}
