use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, HeaderValue, Request, Response, StatusCode};
use tower_service::Service;

use super::body::ResponseBody;
use super::control::{Classifier, Control, Priority};
use super::future::ResponseFuture;
use super::handle::Live;
use super::permit::{Attempt, GlobalLimit, KeyedLimit, Permit, Waiter};
use crate::headers::append_fields;
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::{service_shell, Core};
use crate::observe::{ConcurrencyMeter, DecisionMeter, Names, Verdict};
use crate::response::{Recipient, Rejection, RejectionKind};

/// The outcomes a concurrency layer can count.
pub(crate) const OUTCOMES: &[Verdict] = &[
    Verdict::Allowed,
    Verdict::Waited,
    Verdict::Limited,
    Verdict::QueueFull,
    Verdict::MissingKey,
];

pub(crate) enum Limit<K> {
    Global(GlobalLimit),
    Keyed(Arc<KeyedLimit<K>>),
}

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) core: Core<E>,
    pub(crate) limit: Limit<E::Key>,
    /// 503 for a global limit, 429 for a limit per key.
    pub(crate) status: StatusCode,
    /// The queue bounds and the policy field, changed while serving by a
    /// [`ConcurrencyHandle`](super::ConcurrencyHandle).
    pub(crate) live: Arc<Live>,
    pub(crate) retry_after: Duration,
    pub(crate) release_on_headers: bool,
    /// How long a response body may hold its permit, if bounded.
    pub(crate) max_hold: Option<Duration>,
    pub(crate) policy_name: Option<Box<str>>,
    /// An adaptive limit or priorities (see `control.rs`).
    pub(crate) control: Option<Arc<Control>>,
    pub(crate) classify: Option<Classifier>,
    /// The names its metrics and events carry, and its metrics.
    pub(crate) names: Names,
    pub(crate) meter: DecisionMeter,
    pub(crate) gauges: ConcurrencyMeter,
}

impl<E: KeyExtractor> Shared<E> {
    /// How many may wait: none in dry-run mode, where nothing is queued.
    #[inline]
    fn max_waiting(&self) -> Option<usize> {
        if self.core.observe.dry_run {
            None
        } else {
            self.live.max_waiting()
        }
    }

    /// Finds the request's key and tries to take a permit of it; with the key when rejection
    /// events show it.
    fn try_acquire_keyed(
        &self,
        keyed: &Arc<KeyedLimit<E::Key>>,
        head: &RequestHead<'_>,
    ) -> (Attempt, Option<E::Key>) {
        match self.core.resolve(head) {
            Resolved::Key(key) => {
                let traced = self.core.observe.trace_keys.then(|| key.clone());
                let attempt = keyed.try_acquire(key, self.max_waiting(), self.priority(head));
                (attempt, traced)
            }
            Resolved::Pass => (Attempt::Unlimited, None),
            Resolved::Reject(_) => (Attempt::MissingKey, None),
        }
    }

    /// Counts a permit taken, and holds its place in the in-flight gauge.
    #[inline]
    fn acquired(&self, permit: &mut Permit, verdict: Verdict) {
        self.meter.count(verdict, None);
        permit.held(self.gauges.hold());
    }

    /// Turns a request away with `kind`, to `to`, through the one rejection path (with
    /// `key` for events that show it): the response, with the layer's policy field; in dry-run
    /// mode `None`, the would-be rejection recorded in `ext`.
    fn refuse(
        &self,
        kind: RejectionKind,
        key: Option<&E::Key>,
        to: Recipient,
        ext: &mut Extensions,
    ) -> Option<Response<Bytes>> {
        if let Limit::Keyed(keyed) = &self.limit {
            self.meter.keys(true, || Some(keyed.len()));
        }
        let (status, wait) = match kind {
            RejectionKind::MissingKey => (self.core.missing_status(), None),
            _ => (self.status, Some(self.retry_after)),
        };
        let r = Rejection::new(kind, status, wait, self.policy_name.as_deref(), to);
        let key = key.map(|k| k as &dyn std::fmt::Debug);
        let refuser = self.core.refuser(&self.names, &self.meter);
        let mut resp = refuser.refuse(&r, key, ext)?;
        if let Some(policy) = &self.live.policy {
            let policy = HeaderValue::clone(&policy.load());
            append_fields(resp.headers_mut(), policy, None);
        }
        Some(resp)
    }

    /// The request's class; every request may use the whole limit without a classifier.
    #[inline]
    fn priority(&self, head: &RequestHead<'_>) -> Priority {
        self.classify
            .as_ref()
            .map_or(Priority::Critical, |f| f(head))
    }
}

service_shell! {
    /// The service made by [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
    ///
    /// Its responses carry a [`ResponseBody`], which holds the request's place until the body
    /// is finished or dropped. `poll_ready` is the inner service's: the permit is taken in
    /// `call`, where the key is known. The inner service must be `Clone` (as axum's are): a
    /// request that waits in the queue takes the service that was driven to readiness with it.
    pub struct ConcurrencyLimit<S, E: KeyExtractor> => Shared<E>
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

    #[inline(always)]
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let (attempt, key) = match &shared.limit {
            Limit::Global(_) if shared.core.allows_address(&RequestHead::new(&req)) => {
                (Attempt::Unlimited, None)
            }
            Limit::Global(global) => {
                let priority = match &shared.classify {
                    Some(_) => shared.priority(&RequestHead::new(&req)),
                    None => Priority::Critical,
                };
                (global.try_acquire(shared.max_waiting(), priority), None)
            }
            Limit::Keyed(keyed) => shared.try_acquire_keyed(keyed, &RequestHead::new(&req)),
        };
        let permit = match attempt {
            Attempt::Acquired(mut permit) => {
                shared.acquired(&mut permit, Verdict::Allowed);
                Some(permit)
            }
            Attempt::Unlimited => None,
            Attempt::Wait(waiter) => return self.wait(waiter, req, key),
            Attempt::Busy | Attempt::Shed => {
                return self.reject(RejectionKind::Concurrency, req, key)
            }
            Attempt::QueueFull => return self.reject(RejectionKind::QueueFull, req, key),
            Attempt::MissingKey => return self.reject(RejectionKind::MissingKey, req, key),
        };
        ResponseFuture::called(
            self.inner.call(req),
            permit,
            shared.live.policy(),
            shared.release_on_headers,
            shared.max_hold,
        )
    }
}

impl<S, E: KeyExtractor> ConcurrencyLimit<S, E> {
    /// Turns the request away; in dry-run mode, lets it through without a permit.
    #[inline(never)]
    fn reject<ReqBody>(
        &mut self,
        kind: RejectionKind,
        mut req: Request<ReqBody>,
        key: Option<E::Key>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        let shared = &*self.shared;
        let to = Recipient::of(&RequestHead::new(&req));
        match shared.refuse(kind, key.as_ref(), to, req.extensions_mut()) {
            Some(resp) => ResponseFuture::rejected(resp),
            None => {
                let policy = shared.live.policy();
                let future = self.inner.call(req);
                ResponseFuture::called(future, None, policy, false, None)
            }
        }
    }

    /// Waits in the queue for a permit, then calls the inner service; or rejects.
    #[inline(never)]
    fn wait<ReqBody>(
        &mut self,
        waiter: Waiter,
        req: Request<ReqBody>,
        key: Option<E::Key>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let shared = self.shared.clone();
        let policy = shared.live.policy();
        let release_on_headers = shared.release_on_headers;
        let max_hold = shared.max_hold;
        let to = Recipient::of(&RequestHead::new(&req));
        let wait = Box::pin(async move {
            let start = tokio::time::Instant::now();
            let waiting = shared.gauges.wait();
            let permit = waiter.acquire(shared.live.max_wait()).await;
            drop(waiting);
            shared.gauges.waited(start.elapsed());
            match permit {
                Some(mut permit) => {
                    shared.acquired(&mut permit, Verdict::Waited);
                    Ok(Some(permit))
                }
                // A dry run queues nothing, so this is a real rejection; were it a dry run,
                // the request would go on without a permit.
                None => {
                    let kind = RejectionKind::Concurrency;
                    match shared.refuse(kind, key.as_ref(), to, &mut Extensions::new()) {
                        Some(resp) => Err(resp),
                        None => Ok(None),
                    }
                }
            }
        });
        // The service that was driven to readiness goes with the request; this one must be
        // driven again before the next call, as tower's contract says.
        let ready = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, ready);
        ResponseFuture::waiting(wait, ready, req, policy, release_on_headers, max_hold)
    }
}
