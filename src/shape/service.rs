use std::sync::Arc;

use arc_swap::ArcSwap;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::future::{ResponseFuture, ShapeHeaders, State};
use super::shaper::{Admission, Room, Shaper};
use crate::headers::PolicyHeaders;
use crate::key::missing::Resolved;
use crate::key::{KeyExtractor, RequestHead};
use crate::layer::common::{service_shell, Core};
use crate::response::{Protocol, RejectionKind};
use std::time::Duration;

pub(crate) struct Shared<E: KeyExtractor> {
    pub(crate) core: Core<E>,
    pub(crate) shaper: Shaper<E::Key>,
    /// What the header fields say of the shaper's rate and bounds, replaced with them.
    pub(crate) fields: ArcSwap<Fields>,
    pub(crate) name: Box<str>,
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

/// The service made by [`ShapeLayer`](super::ShapeLayer).
pub struct Shape<S, E: KeyExtractor> {
    inner: S,
    shared: Arc<Shared<E>>,
}

service_shell!(Shape<S, E: KeyExtractor> => Shared<E>);

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

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let key = match shared.core.resolve(&RequestHead::new(&req)) {
            Resolved::Key(key) => key,
            Resolved::Pass => {
                return ResponseFuture::new(State::calling(self.inner.call(req)), None)
            }
            Resolved::Reject(status) => {
                let protocol = Protocol::of(&RequestHead::new(&req));
                let resp = shared
                    .core
                    .reject_missing(status, Some(&shared.name), protocol);
                return ResponseFuture::new(State::ready(resp), None);
            }
        };
        match shared.shaper.admit(&key) {
            Admission::Leave(room) => {
                let headers = shared.headers(&room);
                ResponseFuture::new(State::calling(self.inner.call(req)), headers)
            }
            Admission::Wait(slot, room) => {
                let headers = shared.headers(&room);
                // The service made ready for this request waits with it; the clone serves the
                // next one.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::new(State::waiting(slot, ready, req), headers)
            }
            Admission::Full(full, room) => {
                let mut resp = shared.core.reject(
                    RejectionKind::QueueFull,
                    StatusCode::TOO_MANY_REQUESTS,
                    Some(full.retry_after()),
                    Some(&shared.name),
                    Protocol::of(&RequestHead::new(&req)),
                );
                if let Some(h) = shared.headers(&room) {
                    h.apply(resp.headers_mut());
                }
                ResponseFuture::new(State::ready(resp), None)
            }
        }
    }
}
