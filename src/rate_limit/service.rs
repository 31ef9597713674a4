use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::shared::{Prepared, Shared};
use super::store::{Answer, Backend, Handover, Memory};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::service_shell;

/// The service made by [`RateLimitLayer`](super::RateLimitLayer), on the store `B`.
///
/// With the memory store every decision is made in `call`. With Redis, a decision that its
/// cache of known rejections cannot make waits for a round trip in the response future: the
/// inner service that was made ready goes into that future (so the inner service must be
/// `Clone` on Redis, as axum's are) and a clone takes its place.
pub struct RateLimit<S, E: KeyExtractor, B: Backend<E::Key> = Memory> {
    inner: S,
    shared: std::sync::Arc<Shared<E, B::Limiter>>,
}

service_shell!(RateLimit<S, E: KeyExtractor, B: Backend<E::Key>> => Shared<E, B::Limiter>);

impl<S, E, B, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, E, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    E: KeyExtractor,
    B: Handover<E::Key, S>,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, <B as Backend<E::Key>>::Later>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (tier, key, cost) = match shared.prepare(&RequestHead::new(&req)) {
            Prepared::Pass => return ResponseFuture::inner(self.inner.call(req), None),
            Prepared::Reject(resp) => return ResponseFuture::ready(resp),
            Prepared::Decide { tier, key, cost } => (tier, key, cost),
        };
        match B::decide(&shared.limiters[tier], key, cost) {
            Answer::Now(decision) => match shared.answers.finish(tier, decision, &mut req) {
                Ok(headers) => ResponseFuture::inner(self.inner.call(req), headers),
                Err(resp) => ResponseFuture::ready(resp),
            },
            Answer::Later(later) => self.later(later, tier, req),
        }
    }
}

impl<S, E: KeyExtractor, B: Backend<E::Key>> RateLimit<S, E, B> {
    /// A decision that waits for the store: the service that was polled ready goes with the
    /// request, to be called once the decision admits it.
    #[inline(never)]
    fn later<ReqBody>(
        &mut self,
        later: B::Later,
        tier: usize,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, B::Later>
    where
        S: Service<Request<ReqBody>>,
        B: Handover<E::Key, S>,
    {
        let (service, later) = B::hand_over(&mut self.inner, later);
        let answers = self.shared.answers.clone();
        ResponseFuture::later(later, answers, tier, req, service)
    }
}
