//! The response futures of the shaping layers: wait for the slot, call the service, add the
//! header fields.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, HeaderValue, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::shaper::Slot;
use crate::headers::append_fields;

/// The `RateLimit-Policy` and `RateLimit` values a shaped response gets.
#[derive(Debug)]
pub(crate) struct ShapeHeaders {
    pub(crate) policy: HeaderValue,
    pub(crate) ratelimit: HeaderValue,
}

impl ShapeHeaders {
    /// Appends the fields, so that items of other layers on the same response are kept.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        append_fields(headers, self.policy, Some(self.ratelimit));
    }
}

pin_project! {
    /// Wait for the slot, then call the service that was made ready for this request.
    #[project = StateProj]
    pub(crate) enum State<S, Req>
    where
        S: Service<Req>,
    {
        Waiting {
            slot: Slot,
            service: Option<S>,
            request: Option<Req>,
            // Its place in the queue-length gauge, and its delay when it leaves.
            queued: crate::observe::Held,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
        Ready {
            response: Option<S::Response>,
        },
    }
}

impl<S: Service<Req>, Req> State<S, Req> {
    pub(crate) fn waiting(slot: Slot, service: S, request: Req) -> Self {
        Self::counted(slot, service, request, crate::observe::Held::default())
    }

    /// Waiting, counted in a layer's metrics by `queued`.
    pub(crate) fn counted(
        slot: Slot,
        service: S,
        request: Req,
        queued: crate::observe::Held,
    ) -> Self {
        State::Waiting {
            slot,
            service: Some(service),
            request: Some(request),
            queued,
        }
    }

    pub(crate) fn calling(future: S::Future) -> Self {
        State::Calling { future }
    }

    pub(crate) fn ready(response: S::Response) -> Self {
        State::Ready {
            response: Some(response),
        }
    }

    fn poll_state(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<S::Response, S::Error>> {
        loop {
            match self.as_mut().project() {
                StateProj::Waiting {
                    slot,
                    service,
                    request,
                    ..
                } => {
                    ready!(Pin::new(slot).poll(cx));
                    let (Some(mut service), Some(request)) = (service.take(), request.take())
                    else {
                        // Polled after completion: a contract violation by the caller.
                        panic!("shaped future polled after completion");
                    };
                    let future = service.call(request);
                    self.set(State::Calling { future });
                }
                StateProj::Calling { future } => return future.poll(cx),
                StateProj::Ready { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        None => panic!("shaped future polled after completion"),
                    }
                }
            }
        }
    }
}

pin_project! {
    /// The response future of [`Polite`](super::Polite): waits for the call's slot, then the
    /// inner service's response.
    ///
    /// Dropping it while it waits gives the slot to the next call, and the call is not made.
    pub struct PoliteFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
    }
}

impl<S: Service<Req>, Req> PoliteFuture<S, Req> {
    pub(crate) fn new(state: State<S, Req>) -> Self {
        PoliteFuture { state }
    }
}

impl<S: Service<Req>, Req> Future for PoliteFuture<S, Req> {
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().state.poll_state(cx)
    }
}

pin_project! {
    /// The response future of [`Shape`](super::Shape): a [`PoliteFuture`] (it waits for the
    /// request's slot, then calls the inner service) whose response gets the `RateLimit`
    /// header fields; or the rejection.
    ///
    /// Dropping it while it waits (the client went away) gives the slot to the next request.
    pub struct ResponseFuture<S: Service<Req>, Req> {
        #[pin]
        shaped: PoliteFuture<S, Req>,
        headers: Option<ShapeHeaders>,
    }
}

impl<S: Service<Req>, Req> ResponseFuture<S, Req> {
    pub(crate) fn new(state: State<S, Req>, headers: Option<ShapeHeaders>) -> Self {
        ResponseFuture {
            shaped: PoliteFuture::new(state),
            headers,
        }
    }
}

impl<S, Req, B> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = Response<B>>,
{
    type Output = Result<Response<B>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.shaped.poll(cx))?;
        if let Some(h) = this.headers.take() {
            h.apply(response.headers_mut());
        }
        Poll::Ready(Ok(response))
    }
}
