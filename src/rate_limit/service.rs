use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use tower_service::Service;

use super::future::{RateHeaders, ResponseFuture};
use super::layer::{CostFn, MissingKey, SelectFn, SkipFn};
use crate::gcra::{Decision, Outcome};
use crate::headers::PolicyHeaders;
use crate::key::{KeyExtractor, RequestHead};
use crate::limiter::RateLimiter;
use crate::response::{self, OnReject, Rejection, RejectionKind};

pub(crate) struct Tier<K> {
    pub(crate) name: Box<str>,
    pub(crate) limiter: RateLimiter<K>,
    pub(crate) headers: PolicyHeaders,
}

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) extractor: E,
    pub(crate) tiers: Box<[Tier<E::Key>]>,
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

impl<E: KeyExtractor> Shared<E> {
    fn skips(&self, head: &RequestHead<'_>) -> bool {
        self.skip_methods.contains(head.method)
            || self.skip_paths.iter().any(|p| p == head.uri.path())
            || self.skip.as_ref().is_some_and(|f| f(head))
    }

    fn tier(&self, head: &RequestHead<'_>) -> &Tier<E::Key> {
        let chosen = self
            .select
            .as_ref()
            .and_then(|f| f(head))
            .and_then(|name| self.tiers.iter().find(|t| &*t.name == name));
        chosen.unwrap_or(&self.tiers[0])
    }

    fn rate_headers(&self, tier: &Tier<E::Key>, d: &Decision) -> Option<RateHeaders> {
        (self.headers || self.legacy_headers).then(|| RateHeaders::new(self, tier, d))
    }
}

impl RateHeaders {
    fn new<E: KeyExtractor>(shared: &Shared<E>, tier: &Tier<E::Key>, d: &Decision) -> Self {
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
    shared: Arc<Shared<E>>,
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
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<E>>) -> Self {
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
        let head = RequestHead::new(&req);
        if shared.skips(&head) {
            return ResponseFuture::inner(self.inner.call(req), None);
        }
        let tier = shared.tier(&head);
        let key = match shared.extractor.extract(&head) {
            Ok(key) => key,
            Err(_) => match &shared.on_missing {
                MissingKey::UseKey(key) => key.clone(),
                MissingKey::Allow => return ResponseFuture::inner(self.inner.call(req), None),
                MissingKey::Reject(status) => {
                    let r = Rejection {
                        kind: RejectionKind::MissingKey,
                        status: *status,
                        retry_after: None,
                        decision: None,
                        policy: Some(&tier.name),
                    };
                    return ResponseFuture::ready(response::reject(shared.on_reject.as_ref(), &r));
                }
            },
        };
        let cost = shared.cost.as_ref().map_or(1, |f| f(&head));
        let decision = tier.limiter.check_n(&key, cost);
        let headers = shared.rate_headers(tier, &decision);
        if decision.is_allowed() {
            req.extensions_mut().insert(decision);
            return ResponseFuture::inner(self.inner.call(req), headers);
        }
        let kind = match decision.outcome() {
            Outcome::Exceeds => RejectionKind::CostExceedsBurst,
            _ => RejectionKind::RateLimited,
        };
        let r = Rejection {
            kind,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: decision.retry_after(),
            decision: Some(&decision),
            policy: Some(&tier.name),
        };
        let mut resp = response::reject(shared.on_reject.as_ref(), &r);
        if let Some(h) = headers {
            h.apply(resp.headers_mut());
        }
        ResponseFuture::ready(resp)
    }
}
