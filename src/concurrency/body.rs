use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

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
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    #[inline]
    pub(crate) fn new(body: B, permit: Option<Permit>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body, permit },
        }
    }

    /// Whether this body still holds its request's place among those in flight.
    pub fn holds_permit(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Inner {
                permit: Some(_),
                ..
            }
        )
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
            KindProj::Inner { mut body, permit } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                match &frame {
                    Some(Ok(_)) if !body.is_end_stream() => {}
                    // The last frame, the end, or an error: the response is done.
                    _ => {
                        if let Some(p) = permit.take() {
                            p.finish(matches!(frame, Some(Err(_))));
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
            Kind::Inner { body, permit } => {
                let end = body.is_end_stream();
                // A server may drop a body at its end without reading it: it is complete now.
                if let (true, Some(p)) = (end, permit) {
                    p.record(false);
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
            Kind::Inner { body, permit } => f
                .debug_struct("ResponseBody")
                .field("inner", body)
                .field("holds_permit", &permit.is_some())
                .finish(),
            Kind::Full { data } => f.debug_struct("ResponseBody").field("data", data).finish(),
        }
    }
}
