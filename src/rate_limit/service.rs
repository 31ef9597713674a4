use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::shared::{Prepared, Shared};
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::service_shell;
use crate::store::backend::{Answer, Backend, Handover, Memory};

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
    type Future = ResponseFuture<S, ReqBody, B, E::Key>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (tier, key, cost) = match shared.prepare(&RequestHead::new(&req)) {
            Prepared::Pass => {
                crate::decision::record_unlimited(req.extensions_mut());
                return ResponseFuture::inner(self.inner.call(req), None, None);
            }
            Prepared::Missing { tier, status } => {
                if let Some(resp) = shared.missing(tier, status, &mut req) {
                    return ResponseFuture::ready(resp);
                }
                // A dry run lets it through, recorded.
                crate::decision::record_unlimited(req.extensions_mut());
                return ResponseFuture::inner(self.inner.call(req), None, None);
            }
            Prepared::Decide { tier, key, cost } => (tier, key, cost),
        };
        if let Some(banned) = shared.banned(tier, &key) {
            // Neither the handler nor the quotas see a banned key's requests.
            let traced = shared.traced(&key);
            let answers = shared.answers();
            return match answers.finish(tier, &banned, cost, traced, &mut req) {
                answer @ Some(_) => ResponseFuture::answered(answer),
                // A banned decision is never admitted; were it, the request would pass.
                None => {
                    let headers = answers.fields(tier, &banned);
                    ResponseFuture::inner(self.inner.call(req), headers, None)
                }
            };
        }
        let limiter = &shared.limiters()[tier];
        let mut answer = if shared.settles() {
            B::reserve(limiter, &key, cost)
        } else {
            B::decide(limiter, &key, cost)
        };
        // Read in place: a decision is many words, not copied out of the answer.
        match answer {
            Answer::Now(ref mut decision) => {
                shared.strike(tier, &key, decision);
                // What was taken goes with the response, to be given back if a layer inside
                // rejects the request, or settled from the response; a decision of a store's
                // failure policy (not its local fallback) or a rejection let through by a dry
                // run took nothing, nor did a cost of 0 unless the response may charge it.
                let allowed = decision.is_allowed();
                let blind = decision.is_degraded() && !decision.is_local();
                let took = shared.reserves(cost) && allowed && !blind;
                let meter = &shared.answers().tiers[tier].meter;
                meter.keys(!allowed, || B::tracked_keys(limiter));
                let traced = shared.traced(&key);
                match shared
                    .answers()
                    .finish(tier, decision, cost, traced, &mut req)
                {
                    None => {
                        let taken = took.then(|| shared.taken(tier, key, cost, Some(decision)));
                        let headers = shared.answers().fields(tier, decision);
                        ResponseFuture::inner(self.inner.call(req), headers, taken)
                    }
                    answer @ Some(_) => ResponseFuture::answered(answer),
                }
            }
            Answer::Later(later) => self.later(later, tier, req, key, cost),
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
        key: E::Key,
        cost: u32,
    ) -> ResponseFuture<S, ReqBody, B, E::Key>
    where
        S: Service<Request<ReqBody>>,
        B: Handover<E::Key, S>,
    {
        let (service, later) = B::hand_over(&mut self.inner, later);
        let answers = self.shared.answers().clone();
        let traced = self.shared.traced(&key).is_some().then(|| key.clone());
        let taken = self
            .shared
            .reserves(cost)
            .then(|| self.shared.taken(tier, key, cost, None));
        ResponseFuture::later(later, answers, tier, req, service, taken, traced, cost)
    }
}
