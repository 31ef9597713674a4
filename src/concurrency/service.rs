use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::body::ResponseBody;
use super::control::{Classifier, Control, Priority};
use super::future::ResponseFuture;
use super::permit::{Attempt, GlobalLimit, KeyedLimit, Waiter};
use crate::headers::RATELIMIT_POLICY;
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::{service_shell, Core};
use crate::response::{Protocol, RejectionKind};

pub(crate) enum Limit<K> {
    Global(GlobalLimit),
    Keyed(Arc<KeyedLimit<K>>),
}

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) core: Core<E>,
    pub(crate) limit: Limit<E::Key>,
    /// 503 for a global limit, 429 for a limit per key.
    pub(crate) status: StatusCode,
    /// How many may wait, if waiting is on.
    pub(crate) max_waiting: Option<usize>,
    pub(crate) max_wait: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) release_on_headers: bool,
    /// How long a response body may hold its permit, if bounded.
    pub(crate) max_hold: Option<Duration>,
    pub(crate) policy_name: Option<Box<str>>,
    /// The `RateLimit-Policy` item, when configured.
    pub(crate) policy: Option<Arc<HeaderValue>>,
    /// An adaptive limit or priorities (see `control.rs`).
    pub(crate) control: Option<Arc<Control>>,
    pub(crate) classify: Option<Classifier>,
}

impl<E: KeyExtractor> Shared<E> {
    /// Finds the request's key and tries to take a permit of it.
    fn try_acquire_keyed(
        &self,
        keyed: &Arc<KeyedLimit<E::Key>>,
        head: &RequestHead<'_>,
    ) -> Attempt {
        match self.core.resolve(head) {
            Resolved::Key(key) => keyed.try_acquire(key, self.max_waiting, self.priority(head)),
            Resolved::Pass => Attempt::Unlimited,
            Resolved::Reject(_) => Attempt::MissingKey,
        }
    }

    /// The request's class; every request may use the whole limit without a classifier.
    #[inline]
    fn priority(&self, head: &RequestHead<'_>) -> Priority {
        self.classify
            .as_ref()
            .map_or(Priority::Critical, |f| f(head))
    }

    /// The response for a request turned away.
    fn reject(&self, kind: RejectionKind, protocol: Protocol) -> Response<Bytes> {
        let policy = self.policy_name.as_deref();
        let mut resp: Response<Bytes> = match kind {
            RejectionKind::MissingKey => {
                let status = self.core.missing_status();
                self.core.reject_missing(status, policy, protocol)
            }
            _ => {
                let wait = Some(self.retry_after);
                self.core.reject(kind, self.status, wait, policy, protocol)
            }
        };
        if let Some(policy) = &self.policy {
            resp.headers_mut()
                .append(&RATELIMIT_POLICY, HeaderValue::clone(policy));
        }
        resp
    }
}

/// The service made by [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
///
/// Its responses carry a [`ResponseBody`], which holds the request's place until the body is
/// finished or dropped. `poll_ready` is the inner service's: the permit is taken in `call`,
/// where the key is known. The inner service must be `Clone` (as axum's are): a request that
/// waits in the queue takes the service that was driven to readiness with it.
pub struct ConcurrencyLimit<S, E: KeyExtractor> {
    inner: S,
    shared: Arc<Shared<E>>,
}

service_shell!(ConcurrencyLimit<S, E: KeyExtractor> => Shared<E>);

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

    #[inline(always)]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let attempt = match &shared.limit {
            Limit::Global(_) if shared.core.allows_address(&RequestHead::new(&req)) => {
                Attempt::Unlimited
            }
            Limit::Global(global) => {
                let priority = match &shared.classify {
                    Some(_) => shared.priority(&RequestHead::new(&req)),
                    None => Priority::Critical,
                };
                global.try_acquire(shared.max_waiting, priority)
            }
            Limit::Keyed(keyed) => shared.try_acquire_keyed(keyed, &RequestHead::new(&req)),
        };
        let permit = match attempt {
            Attempt::Acquired(permit) => Some(permit),
            Attempt::Unlimited => None,
            Attempt::Wait(waiter) => return self.wait(waiter, req),
            Attempt::Busy | Attempt::Shed => return self.reject(RejectionKind::Concurrency, &req),
            Attempt::QueueFull => return self.reject(RejectionKind::QueueFull, &req),
            Attempt::MissingKey => return self.reject(RejectionKind::MissingKey, &req),
        };
        ResponseFuture::called(
            self.inner.call(req),
            permit,
            shared.policy.clone(),
            shared.release_on_headers,
            shared.max_hold,
        )
    }
}

impl<S, E: KeyExtractor> ConcurrencyLimit<S, E> {
    #[inline(never)]
    fn reject<ReqBody>(
        &self,
        kind: RejectionKind,
        req: &Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        let protocol = Protocol::of(&RequestHead::new(req));
        ResponseFuture::rejected(self.shared.reject(kind, protocol))
    }

    /// Waits in the queue for a permit, then calls the inner service; or rejects.
    #[inline(never)]
    fn wait<ReqBody>(&mut self, waiter: Waiter, req: Request<ReqBody>) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let shared = self.shared.clone();
        let policy = shared.policy.clone();
        let release_on_headers = shared.release_on_headers;
        let max_hold = shared.max_hold;
        let protocol = Protocol::of(&RequestHead::new(&req));
        let wait = Box::pin(async move {
            match waiter.acquire(shared.max_wait).await {
                Some(permit) => Ok(permit),
                None => Err(shared.reject(RejectionKind::Concurrency, protocol)),
            }
        });
        // The service that was driven to readiness goes with the request; this one must be
        // driven again before the next call, as tower's contract says.
        let ready = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, ready);
        ResponseFuture::waiting(wait, ready, req, policy, release_on_headers, max_hold)
    }
}
