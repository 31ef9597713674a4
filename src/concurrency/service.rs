use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
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
use crate::observe::{self, ConcurrencyMeter, DecisionMeter, DryRunRejection, Names, Verdict};
use crate::response::{Recipient, RejectionKind};

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

    /// Counts and traces a rejection (or in dry-run mode a would-be rejection) of `kind`.
    fn record(&self, kind: RejectionKind, key: Option<&E::Key>) -> (StatusCode, Option<Duration>) {
        let (status, wait) = match kind {
            RejectionKind::MissingKey => (self.core.missing_status(), None),
            _ => (self.status, Some(self.retry_after)),
        };
        let verdict = Verdict::of_rejection(kind);
        self.meter.count(verdict, None);
        if let Limit::Keyed(keyed) = &self.limit {
            self.meter.keys(true, || Some(keyed.len()));
        }
        let key = key.filter(|_| self.core.observe.trace_keys);
        let key = key.map(|k| k as &dyn std::fmt::Debug);
        let dry_run = self.core.observe.dry_run;
        observe::rejected(&self.names, None, verdict, status, wait, dry_run, key);
        (status, wait)
    }

    /// The request's class; every request may use the whole limit without a classifier.
    #[inline]
    fn priority(&self, head: &RequestHead<'_>) -> Priority {
        self.classify
            .as_ref()
            .map_or(Priority::Critical, |f| f(head))
    }

    /// The response for a request turned away.
    fn reject(&self, kind: RejectionKind, to: Recipient) -> Response<Bytes> {
        let policy = self.policy_name.as_deref();
        let mut resp: Response<Bytes> = match kind {
            RejectionKind::MissingKey => {
                let status = self.core.missing_status();
                self.core.reject_missing(status, policy, to)
            }
            _ => {
                let wait = Some(self.retry_after);
                self.core.reject(kind, self.status, wait, policy, to)
            }
        };
        if let Some(policy) = &self.live.policy {
            let policy = HeaderValue::clone(&policy.load());
            append_fields(resp.headers_mut(), policy, None);
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
        let (status, wait) = shared.record(kind, key.as_ref());
        if shared.core.observe.dry_run {
            let r = DryRunRejection::new(&shared.names, None, kind, status, wait);
            r.record(req.extensions_mut());
            let policy = shared.live.policy();
            let future = self.inner.call(req);
            return ResponseFuture::called(future, None, policy, false, None);
        }
        let to = Recipient::of(&RequestHead::new(&req));
        ResponseFuture::rejected(shared.reject(kind, to))
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
                    Ok(permit)
                }
                None => {
                    shared.record(RejectionKind::Concurrency, key.as_ref());
                    Err(shared.reject(RejectionKind::Concurrency, to))
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
