use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::permit::Permit;

pin_project! {
    /// The response body of [`ConcurrencyLimit`](super::ConcurrencyLimit): the inner service's
    /// body, holding the request's place among those in flight until it ends or is dropped, or
    /// the body of a rejection.
    ///
    /// The place is given back as soon as the last frame has been read (or the body reports
    /// its end, or fails), not only when the server drops the body.
    ///
    /// `ResponseBody<B>` converts [`From<Bytes>`](From), like the bodies of `http-body-util` and
    /// axum, so layers that answer with a body of their own (such as
    /// [`RateLimitLayer`](crate::RateLimitLayer)) can sit outside this one.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            permit: Option<Permit>,
            // The permit instead, when a `max_hold` timer may take it away.
            timed: Option<Timed>,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    #[inline]
    pub(crate) fn new(body: B, permit: Option<Permit>, max_hold: Option<Duration>) -> Self {
        let (permit, timed) = match (permit, max_hold) {
            (Some(p), Some(hold)) => match Timed::start(p, hold) {
                Ok(timed) => (None, Some(timed)),
                Err(p) => (Some(p), None),
            },
            (permit, _) => (permit, None),
        };
        ResponseBody {
            kind: Kind::Inner {
                body,
                permit,
                timed,
            },
        }
    }

    /// Whether this body still holds its request's place among those in flight.
    pub fn holds_permit(&self) -> bool {
        match &self.kind {
            Kind::Inner { permit, timed, .. } => {
                permit.is_some() || timed.as_ref().is_some_and(Timed::holds)
            }
            Kind::Full { .. } => false,
        }
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner {
                mut body,
                permit,
                timed,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                match &frame {
                    Some(Ok(_)) if !body.is_end_stream() => {}
                    // The last frame, the end, or an error: the response is done.
                    _ => {
                        let failed = matches!(frame, Some(Err(_)));
                        if let Some(p) = permit.take() {
                            p.finish(failed);
                        }
                        if let Some(p) = timed.take().and_then(|t| t.take()) {
                            p.finish(failed);
                        }
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(B::Data::from(d)))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner {
                body,
                permit,
                timed,
            } => {
                let end = body.is_end_stream();
                // A server may drop a body at its end without reading it: it is complete now.
                if end {
                    if let Some(p) = permit {
                        p.record(false);
                    }
                    if let Some(t) = timed {
                        if let Some(p) = t.slot().as_ref() {
                            p.record(false);
                        }
                    }
                }
                end
            }
            Kind::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body, .. } => f
                .debug_struct("ResponseBody")
                .field("inner", body)
                .field("holds_permit", &self.holds_permit())
                .finish(),
            Kind::Full { data } => f.debug_struct("ResponseBody").field("data", data).finish(),
        }
    }
}

/// A permit that a timer gives back after `max_hold`, unless the body ends or is dropped
/// first. The timer is a task of its own: a server does not poll the body of a client that
/// stopped reading, so a timer polled by the body would never fire.
struct Timed {
    slot: Arc<Mutex<Option<Permit>>>,
    task: tokio::task::AbortHandle,
}

impl Timed {
    /// Starts the timer; gives the permit back unchanged outside a tokio runtime.
    fn start(permit: Permit, max_hold: Duration) -> Result<Self, Permit> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(permit);
        };
        let slot = Arc::new(Mutex::new(Some(permit)));
        // Weak: a body dropped before the timer fires gives the permit back at once.
        let weak = Arc::downgrade(&slot);
        let task = runtime.spawn(async move {
            tokio::time::sleep(max_hold).await;
            if let Some(slot) = weak.upgrade() {
                let expired = lock(&slot).take();
                // Given back without a sample: the time was the client's, not the service's.
                drop(expired);
            }
        });
        Ok(Timed {
            slot,
            task: task.abort_handle(),
        })
    }

    fn slot(&self) -> MutexGuard<'_, Option<Permit>> {
        lock(&self.slot)
    }

    fn holds(&self) -> bool {
        self.slot().is_some()
    }

    /// The permit, if the timer has not taken it yet; stops the timer.
    fn take(self) -> Option<Permit> {
        self.task.abort();
        let permit = self.slot().take();
        permit
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The slot's lock; a panic elsewhere while it was held leaves an `Option` that is still valid.
fn lock(slot: &Mutex<Option<Permit>>) -> MutexGuard<'_, Option<Permit>> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
