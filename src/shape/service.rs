use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::future::{ResponseFuture, ShapeHeaders, State};
use super::shaper::{Admission, Room, Shaper};
use crate::headers::PolicyHeaders;
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::{service_shell, Core};
use crate::observe::{DecisionMeter, Names, ShapeMeter, Verdict};
use crate::response::{Recipient, Rejection, RejectionKind};

/// The outcomes a shaping layer can count.
pub(crate) const OUTCOMES: &[Verdict] = &[
    Verdict::Allowed,
    Verdict::Delayed,
    Verdict::QueueFull,
    Verdict::MissingKey,
];
use std::time::Duration;

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) core: Core<E>,
    pub(crate) shaper: Shaper<E::Key>,
    /// What the header fields say of the shaper's rate and bounds, replaced with them.
    pub(crate) fields: ArcSwap<Fields>,
    pub(crate) name: Box<str>,
    /// The names its metrics and events carry, and its metrics.
    pub(crate) names: Names,
    pub(crate) meter: DecisionMeter,
    pub(crate) gauges: ShapeMeter,
}

/// The `RateLimit-Policy` of a shaping layer at its current rate and bounds.
pub(crate) struct Fields {
    /// Requests an idle key is admitted at once (`q` of `RateLimit-Policy`).
    pub(crate) capacity: u64,
    /// `None` when the header fields are turned off.
    pub(crate) policy: Option<PolicyHeaders>,
}

impl Fields {
    pub(crate) fn of<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
        shaper: &Shaper<K>,
        name: &str,
        on: bool,
    ) -> Self {
        // `q`: how many requests an idle client may send at once without being refused, at
        // the quota's rate (see `headers::policy_window`).
        let capacity = shaper.capacity().unwrap_or(u64::MAX);
        let quota = shaper.quota();
        let (count, period) = (quota.count(), quota.period());
        let policy =
            on.then(|| PolicyHeaders::new(&[(name.to_string(), capacity, count, period)], None));
        Fields { capacity, policy }
    }
}

impl<E: KeyExtractor> Shared<E> {
    /// Turns a request away with `kind` and `status` through the one rejection path (with
    /// `key` for events that show it), adding the fields of the key's queue (`room`) when it
    /// has one: the response, or in dry-run mode `None`, the would-be rejection recorded in
    /// the request's extensions.
    #[inline(never)]
    fn refuse<ReqBody, B: From<Bytes>>(
        &self,
        kind: RejectionKind,
        status: StatusCode,
        retry_after: Option<Duration>,
        key: Option<&E::Key>,
        room: Option<&Room>,
        req: &mut Request<ReqBody>,
    ) -> Option<Response<B>> {
        self.meter.keys(true, || Some(self.shaper.len()));
        let to = Recipient::of(&RequestHead::new(req));
        let r = Rejection::new(kind, status, retry_after, Some(&self.name), to);
        let key = key.map(|k| k as &dyn std::fmt::Debug);
        let refuser = self.core.refuser(&self.names, &self.meter);
        let mut resp = refuser.refuse(&r, key, req.extensions_mut())?;
        if let Some(h) = room.and_then(|room| self.headers(room)) {
            h.apply(resp.headers_mut());
        }
        Some(resp)
    }

    /// The header fields for a response, from the state of the key's queue.
    fn headers(&self, room: &Room) -> Option<ShapeHeaders> {
        let fields = self.fields.load();
        let policy = fields.policy.as_ref()?;
        let item = (
            room.remaining.min(fields.capacity),
            Duration::from_nanos(room.reset_after),
        );
        Some(ShapeHeaders {
            policy: policy.policy(),
            ratelimit: policy.ratelimit_items(std::iter::once(item)),
        })
    }
}

service_shell! {
    /// The service made by [`ShapeLayer`](super::ShapeLayer).
    pub struct Shape<S, E: KeyExtractor> => Shared<E>
}

impl<S, E, ReqBody, ResBody> Service<Request<ReqBody>> for Shape<S, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    E: KeyExtractor,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<ReqBody>>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let dry_run = shared.core.observe.dry_run;
        let key = match shared.core.resolve(&RequestHead::new(&req)) {
            Resolved::Key(key) => key,
            Resolved::Pass => {
                return ResponseFuture::new(State::calling(self.inner.call(req)), None)
            }
            Resolved::Reject(status) => {
                let kind = RejectionKind::MissingKey;
                return match shared.refuse(kind, status, None, None, None, &mut req) {
                    Some(resp) => ResponseFuture::new(State::ready(resp), None),
                    None => ResponseFuture::new(State::calling(self.inner.call(req)), None),
                };
            }
        };
        match shared.shaper.admit(&key) {
            Admission::Leave(room) => {
                shared.meter.count(Verdict::Allowed, None);
                shared.gauges.left();
                let headers = shared.headers(&room).filter(|_| !dry_run);
                ResponseFuture::new(State::calling(self.inner.call(req)), headers)
            }
            Admission::Wait(slot, room) if dry_run => {
                shared.meter.count(Verdict::Delayed, None);
                // Not delayed: the slot alone waits for its turn, so that the schedule is the
                // one enforcement would have.
                let queued = shared.gauges.queued();
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        slot.await;
                        drop(queued);
                    });
                }
                let _ = room;
                ResponseFuture::new(State::calling(self.inner.call(req)), None)
            }
            Admission::Wait(slot, room) => {
                shared.meter.count(Verdict::Delayed, None);
                let queued = shared.gauges.queued();
                let headers = shared.headers(&room);
                // The service made ready for this request waits with it; the clone serves the
                // next one.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::new(State::counted(slot, ready, req, queued), headers)
            }
            Admission::Full(full, room) => {
                let (kind, status) = (RejectionKind::QueueFull, StatusCode::TOO_MANY_REQUESTS);
                let wait = Some(full.retry_after());
                let Some(resp) =
                    shared.refuse(kind, status, wait, Some(&key), Some(&room), &mut req)
                else {
                    return ResponseFuture::new(State::calling(self.inner.call(req)), None);
                };
                ResponseFuture::new(State::ready(resp), None)
            }
        }
    }
}
