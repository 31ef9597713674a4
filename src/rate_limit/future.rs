use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::shared::Answers;
use crate::gcra::Decision;

use crate::headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

/// The header fields a decision adds to its response.
#[derive(Debug)]
pub(crate) struct RateHeaders {
    /// `RateLimit-Policy` and `RateLimit`.
    pub(crate) ietf: Option<(HeaderValue, HeaderValue)>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub(crate) legacy: Option<Box<[HeaderValue; 3]>>,
}

impl RateHeaders {
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, ratelimit)) = self.ietf {
            // Both fields are lists: keep the items other layers (or the handler) put there.
            headers.append(RATELIMIT_POLICY.clone(), policy);
            headers.append(RATELIMIT.clone(), ratelimit);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
            headers.insert(X_RATELIMIT_REMAINING.clone(), remaining);
            headers.insert(X_RATELIMIT_RESET.clone(), reset);
        }
    }
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner service's response
    /// with the rate-limit header fields added, or the rejection. `L` is the store's pending
    /// decision; with the memory store there is none and the future only waits for the inner
    /// service.
    pub struct ResponseFuture<S, ReqBody, L>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, L>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, L>
    where
        S: Service<Request<ReqBody>>,
    {
        Deciding {
            // Boxed: the request is large, and only decisions that wait need to carry it.
            deciding: Pin<Box<Deciding<S, ReqBody, L>>>,
        },
        Inner {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
        },
        Ready {
            response: Option<S::Response>,
        },
    }
}

pin_project! {
    /// A request waiting for its decision, with the service made ready for it.
    struct Deciding<S, ReqBody, L> {
        #[pin]
        later: L,
        answers: Arc<Answers>,
        tier: usize,
        request: Option<Request<ReqBody>>,
        service: Option<S>,
    }
}

impl<S, ReqBody, L> ResponseFuture<S, ReqBody, L>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn inner(future: S::Future, headers: Option<RateHeaders>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, headers },
        }
    }

    pub(crate) fn ready(response: S::Response) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn later(
        later: L,
        answers: Arc<Answers>,
        tier: usize,
        request: Request<ReqBody>,
        service: S,
    ) -> Self {
        let deciding = Deciding {
            later,
            answers,
            tier,
            request: Some(request),
            service: Some(service),
        };
        ResponseFuture {
            kind: Kind::Deciding {
                deciding: Box::pin(deciding),
            },
        }
    }
}

impl<S, ReqBody, ResBody, L> Future for ResponseFuture<S, ReqBody, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
    L: Future<Output = Decision>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            let next = match kind.as_mut().project() {
                KindProj::Deciding { deciding } => {
                    let d = deciding.as_mut().project();
                    let decision = ready!(d.later.poll(cx));
                    let (Some(mut request), Some(mut service)) =
                        (d.request.take(), d.service.take())
                    else {
                        // Only reachable if polled again after a panic in `call`.
                        panic!("ResponseFuture polled after completion");
                    };
                    match d.answers.finish(*d.tier, decision, &mut request) {
                        Ok(headers) => Kind::Inner {
                            future: service.call(request),
                            headers,
                        },
                        Err(response) => Kind::Ready {
                            response: Some(response),
                        },
                    }
                }
                KindProj::Inner { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(h) = headers.take() {
                        h.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                KindProj::Ready { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        // Polled after completion: a contract violation by the caller.
                        None => panic!("ResponseFuture polled after completion"),
                    };
                }
            };
            kind.set(next);
        }
    }
}
