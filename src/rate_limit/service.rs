use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use tower_service::Service;

use super::future::{RateHeaders, ResponseFuture};
use super::layer::{CostFn, SelectFn, SkipFn};
use crate::gcra::{Decision, Outcome};
use crate::headers::PolicyHeaders;
use crate::key::missing::{self, Resolved};
use crate::key::MissingKey;
use crate::key::{KeyExtractor, RequestHead};
use crate::limiter::RateLimiter;
use crate::response::{self, OnReject, Protocol, Rejection, RejectionKind};

/// One policy of a layer and its limiter (in memory, or on a remote store).
pub(crate) struct Tier<L> {
    pub(crate) name: Box<str>,
    pub(crate) limiter: L,
    pub(crate) headers: PolicyHeaders,
}

/// Everything a layer's services share; `L` is the limiter type of the layer's store.
pub(crate) struct Shared<E: KeyExtractor, L> {
    pub(crate) extractor: E,
    pub(crate) tiers: Box<[Tier<L>]>,
    pub(crate) select: Option<Arc<SelectFn>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) skip: Option<Arc<SkipFn>>,
    pub(crate) skip_methods: Box<[Method]>,
    pub(crate) skip_paths: Box<[String]>,
    pub(crate) on_missing: MissingKey<E::Key>,
    pub(crate) on_reject: Option<OnReject>,
    pub(crate) headers: bool,
    pub(crate) legacy_headers: bool,
}

/// What a request needs before the store is asked.
pub(crate) enum Prepared<K, B> {
    /// Not limited: call the inner service as it is.
    Pass,
    /// Answered without a decision (no key, and the layer rejects such requests).
    Reject(Response<B>),
    /// Decide `cost` for `key` on the tier at index `tier`.
    Decide { tier: usize, key: K, cost: u32 },
}

impl<E: KeyExtractor, L> Shared<E, L> {
    fn skips(&self, head: &RequestHead<'_>) -> bool {
        self.skip_methods.contains(head.method)
            || self.skip_paths.iter().any(|p| p == head.uri.path())
            || self.skip.as_ref().is_some_and(|f| f(head))
    }

    fn tier(&self, head: &RequestHead<'_>) -> usize {
        let chosen = self
            .select
            .as_ref()
            .and_then(|f| f(head))
            .and_then(|name| self.tiers.iter().position(|t| &*t.name == name));
        chosen.unwrap_or(0)
    }

    /// Skip rules, tier, key and cost of a request: everything before the decision.
    #[inline]
    pub(crate) fn prepare<B: From<Bytes>>(&self, head: &RequestHead<'_>) -> Prepared<E::Key, B> {
        if self.skips(head) {
            return Prepared::Pass;
        }
        let tier = self.tier(head);
        let key = match self.on_missing.resolve(&self.extractor, head) {
            Resolved::Key(key) => key,
            Resolved::Pass => return Prepared::Pass,
            Resolved::Reject(status) => {
                let policy = Some(&*self.tiers[tier].name);
                let hook = self.on_reject.as_ref();
                return Prepared::Reject(missing::rejection(
                    hook,
                    status,
                    policy,
                    Protocol::of(head),
                ));
            }
        };
        let cost = self.cost.as_ref().map_or(1, |f| f(head));
        Prepared::Decide { tier, key, cost }
    }

    /// Everything after the decision: an admitted request gets the decision in its extensions
    /// and the header fields for its response (`Ok`); a rejected one gets its response (`Err`).
    #[inline]
    pub(crate) fn finish<ReqBody, B: From<Bytes>>(
        &self,
        tier: usize,
        decision: Decision,
        req: &mut Request<ReqBody>,
    ) -> Result<Option<RateHeaders>, Response<B>> {
        let tier = &self.tiers[tier];
        // A degraded decision knows nothing of the quotas: no fields that would say otherwise.
        let headers = if decision.is_degraded() {
            None
        } else {
            self.rate_headers(tier, &decision)
        };
        if decision.is_allowed() {
            req.extensions_mut().insert(decision);
            return Ok(headers);
        }
        let (kind, status) = match decision.outcome() {
            _ if decision.is_degraded() => (
                RejectionKind::StoreUnavailable,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            Outcome::Exceeds => (
                RejectionKind::CostExceedsBurst,
                StatusCode::TOO_MANY_REQUESTS,
            ),
            _ => (RejectionKind::RateLimited, StatusCode::TOO_MANY_REQUESTS),
        };
        let r = Rejection {
            kind,
            status,
            retry_after: decision.retry_after(),
            decision: Some(&decision),
            policy: Some(&tier.name),
            protocol: Protocol::of(&RequestHead::new(req)),
        };
        let mut resp = response::reject(self.on_reject.as_ref(), &r);
        if let Some(h) = headers {
            h.apply(resp.headers_mut());
        }
        Err(resp)
    }

    fn rate_headers(&self, tier: &Tier<L>, d: &Decision) -> Option<RateHeaders> {
        (self.headers || self.legacy_headers).then(|| RateHeaders::new(self, tier, d))
    }
}

impl RateHeaders {
    fn new<E: KeyExtractor, L>(shared: &Shared<E, L>, tier: &Tier<L>, d: &Decision) -> Self {
        RateHeaders {
            ietf: shared
                .headers
                .then(|| (tier.headers.policy(), tier.headers.ratelimit(d))),
            legacy: shared.legacy_headers.then(|| {
                Box::new([
                    crate::headers::integer_value(d.limit()),
                    crate::headers::integer_value(d.remaining()),
                    crate::headers::integer_value(crate::headers::ceil_secs(d.reset_after())),
                ])
            }),
        }
    }
}

/// The service made by [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, E: KeyExtractor> {
    inner: S,
    shared: Arc<Shared<E, RateLimiter<E::Key>>>,
}

impl<S: Clone, E: KeyExtractor> Clone for RateLimit<S, E> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, E: KeyExtractor> fmt::Debug for RateLimit<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, E: KeyExtractor> RateLimit<S, E> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<E, RateLimiter<E::Key>>>) -> Self {
        RateLimit { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

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
