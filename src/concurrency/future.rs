use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::permit::Permit;
use crate::headers::append_fields;

/// Waiting in the queue: a permit, or the rejection to send when the wait is over.
pub(crate) type Wait =
    Pin<Box<dyn Future<Output = Result<Option<Permit>, Response<Bytes>>> + Send>>;

pin_project! {
    /// The response future of [`ConcurrencyLimit`](super::ConcurrencyLimit).
    ///
    /// Resolves to the inner service's response, with a body that holds the request's permit
    /// (see [`ResponseBody`]), or to a rejection. While the request waits in the queue, this
    /// future holds the request and the inner service; dropping it leaves the queue at once.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        // `RateLimit-Policy` item to add to the response, if configured.
        policy: Option<Arc<HeaderValue>>,
        release_on_headers: bool,
        max_hold: Option<Duration>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Waiting {
            // Boxed: the request is large, and only waiting requests need to carry it.
            queued: Box<Queued<S, ReqBody>>,
        },
        Called {
            #[pin]
            future: S::Future,
            permit: Option<Permit>,
        },
        Done {
            response: Option<Response<Bytes>>,
        },
    }
}

/// The inner service's future and the permit its request waited for.
type Turn<F> = (F, Option<Permit>);

/// A request waiting for a permit, with the service that will answer it.
struct Queued<S, ReqBody> {
    wait: Wait,
    service: Option<S>,
    request: Option<Request<ReqBody>>,
}

impl<S, ReqBody> Queued<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// Waits for the permit, then calls the service; or gives the rejection.
    ///
    /// Out of line: the path of requests that did not wait stays small enough to inline.
    #[inline(never)]
    fn poll_turn(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Turn<S::Future>, Response<Bytes>>> {
        let permit = ready!(self.wait.as_mut().poll(cx))?;
        match (self.service.take(), self.request.take()) {
            (Some(mut service), Some(request)) => Poll::Ready(Ok((service.call(request), permit))),
            // Polled after completion: a contract violation by the caller, not by a client.
            _ => panic!("ResponseFuture polled after completion"),
        }
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    #[inline]
    pub(crate) fn called(
        future: S::Future,
        permit: Option<Permit>,
        policy: Option<Arc<HeaderValue>>,
        release_on_headers: bool,
        max_hold: Option<Duration>,
    ) -> Self {
        ResponseFuture {
            state: State::Called { future, permit },
            policy,
            release_on_headers,
            max_hold,
        }
    }

    pub(crate) fn waiting(
        wait: Wait,
        service: S,
        request: Request<ReqBody>,
        policy: Option<Arc<HeaderValue>>,
        release_on_headers: bool,
        max_hold: Option<Duration>,
    ) -> Self {
        ResponseFuture {
            state: State::Waiting {
                queued: Box::new(Queued {
                    wait,
                    service: Some(service),
                    request: Some(request),
                }),
            },
            policy,
            release_on_headers,
            max_hold,
        }
    }

    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Done {
                response: Some(response),
            },
            policy: None,
            release_on_headers: false,
            max_hold: None,
        }
    }
}

impl<S, ReqBody, B> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
{
    type Output = Result<Response<ResponseBody<B>>, S::Error>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { queued } => match ready!(queued.poll_turn(cx)) {
                    Ok((future, permit)) => this.state.set(State::Called { future, permit }),
                    Err(rejection) => {
                        this.state.set(State::Done { response: None });
                        return Poll::Ready(Ok(rejection.map(ResponseBody::from)));
                    }
                },
                StateProj::Called { future, permit } => {
                    let (mut parts, body) = match ready!(future.poll(cx)) {
                        Ok(response) => response.into_parts(),
                        Err(e) => {
                            // A failure teaches an adaptive limit as a drop does.
                            if let Some(p) = permit.take() {
                                p.finish(true);
                            }
                            return Poll::Ready(Err(e));
                        }
                    };
                    if matches!(
                        parts.status,
                        StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
                    ) {
                        if let Some(p) = permit.as_mut() {
                            p.mark_dropped();
                        }
                    }
                    if let Some(policy) = this.policy.take() {
                        let policy = Arc::unwrap_or_clone(policy);
                        append_fields(&mut parts.headers, policy, None);
                    }
                    // Given back now with `release_on_headers`, else when the body is done.
                    let mut permit = permit.take();
                    if *this.release_on_headers {
                        if let Some(p) = permit.take() {
                            p.finish(false);
                        }
                    }
                    let body = ResponseBody::new(body, permit, *this.max_hold);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
                StateProj::Done { response } => match response.take() {
                    Some(r) => return Poll::Ready(Ok(r.map(ResponseBody::from))),
                    // Polled after completion: a contract violation by the caller, not by a client.
                    None => panic!("ResponseFuture polled after completion"),
                },
            }
        }
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Called { .. } => "called",
            State::Done { .. } => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
