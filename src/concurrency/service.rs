use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::permit::{Attempt, GlobalLimit, KeyedLimit, Limited};
use crate::headers::RATELIMIT_POLICY;
use crate::key::{KeyExtractor, RequestHead};
use crate::rate_limit::MissingKey;
use crate::response::{self, OnReject, Rejection, RejectionKind};

pub(crate) enum Limit<K> {
    Global(Arc<GlobalLimit>),
    Keyed(Arc<KeyedLimit<K>>),
}

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) extractor: E,
    pub(crate) limit: Limit<E::Key>,
    /// 503 for a global limit, 429 for a limit per key.
    pub(crate) status: StatusCode,
    /// How many may wait, if waiting is on.
    pub(crate) max_waiting: Option<usize>,
    pub(crate) max_wait: Duration,
    pub(crate) on_missing: MissingKey<E::Key>,
    pub(crate) on_reject: Option<OnReject>,
    pub(crate) retry_after: Duration,
    pub(crate) release_on_headers: bool,
    pub(crate) policy_name: Option<Box<str>>,
    /// The `RateLimit-Policy` item, when configured.
    pub(crate) policy: Option<HeaderValue>,
}

impl<E: KeyExtractor> Shared<E> {
    /// The response for a request turned away.
    fn reject(&self, kind: RejectionKind) -> Response<Bytes> {
        let (status, retry_after) = match (&self.on_missing, kind) {
            (MissingKey::Reject(status), RejectionKind::MissingKey) => (*status, None),
            _ => (self.status, Some(self.retry_after)),
        };
        let r = Rejection {
            kind,
            status,
            retry_after,
            decision: None,
            policy: self.policy_name.as_deref(),
        };
        let mut resp: Response<Bytes> = response::reject(self.on_reject.as_ref(), &r);
        if let Some(policy) = &self.policy {
            resp.headers_mut().append(&RATELIMIT_POLICY, policy.clone());
        }
        resp
    }
}

/// The service made by [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
///
/// Its responses carry a [`ResponseBody`], which holds the request's place until the body is
/// finished or dropped.
pub struct ConcurrencyLimit<S, E: KeyExtractor> {
    inner: S,
    shared: Arc<Shared<E>>,
}

impl<S: Clone, E: KeyExtractor> Clone for ConcurrencyLimit<S, E> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, E: KeyExtractor> fmt::Debug for ConcurrencyLimit<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, E: KeyExtractor> ConcurrencyLimit<S, E> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<E>>) -> Self {
        ConcurrencyLimit { inner, shared }
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

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: KeyExtractor,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        match &shared.limit {
            Limit::Global(global) => {
                let attempt = global.try_acquire(shared.max_waiting);
                self.admit(attempt, req)
            }
            Limit::Keyed(keyed) => {
                let key = match shared.extractor.extract(&RequestHead::new(&req)) {
                    Ok(key) => key,
                    Err(_) => match &shared.on_missing {
                        MissingKey::UseKey(key) => key.clone(),
                        MissingKey::Allow => {
                            let future = self.inner.call(req);
                            return ResponseFuture::called(
                                future,
                                None,
                                shared.policy.clone(),
                                shared.release_on_headers,
                            );
                        }
                        MissingKey::Reject(_) => {
                            return ResponseFuture::rejected(
                                shared.reject(RejectionKind::MissingKey),
                            );
                        }
                    },
                };
                let attempt = keyed.try_acquire(key, shared.max_waiting);
                self.admit(attempt, req)
            }
        }
    }
}

impl<S, E: KeyExtractor> ConcurrencyLimit<S, E> {
    /// Calls the inner service with the permit, waits for one, or rejects.
    #[inline]
    fn admit<L, ReqBody, ResBody>(
        &mut self,
        attempt: Attempt<L>,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody>
    where
        L: Limited,
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    {
        let shared = &*self.shared;
        match attempt {
            Attempt::Acquired(permit) => ResponseFuture::called(
                self.inner.call(req),
                Some(permit),
                shared.policy.clone(),
                shared.release_on_headers,
            ),
            Attempt::Busy => ResponseFuture::rejected(shared.reject(RejectionKind::Concurrency)),
            Attempt::QueueFull => ResponseFuture::rejected(shared.reject(RejectionKind::QueueFull)),
            Attempt::Wait(waiter) => {
                let owned = self.shared.clone();
                let wait = Box::pin(async move {
                    match waiter.acquire(owned.max_wait).await {
                        Some(permit) => Ok(permit),
                        None => Err(owned.reject(RejectionKind::Concurrency)),
                    }
                });
                // The service that was driven to readiness goes with the request; this one
                // must be driven again before the next call, as tower's contract says.
                let ready = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, ready);
                ResponseFuture::waiting(
                    wait,
                    ready,
                    req,
                    shared.policy.clone(),
                    shared.release_on_headers,
                )
            }
        }
    }
}
