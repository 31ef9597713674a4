use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, HeaderValue, Response};
use pin_project_lite::pin_project;

use crate::headers::{Legacy, RATELIMIT, RATELIMIT_POLICY};

/// The header fields a decision adds to its response.
#[derive(Debug)]
pub(crate) struct RateHeaders {
    /// `RateLimit-Policy` and `RateLimit`.
    pub(crate) ietf: Option<(HeaderValue, HeaderValue)>,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub(crate) legacy: Option<Legacy>,
}

impl RateHeaders {
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        if let Some((policy, ratelimit)) = self.ietf {
            // Both fields are lists: keep the items other layers (or the handler) put there.
            headers.append(RATELIMIT_POLICY.clone(), policy);
            headers.append(RATELIMIT.clone(), ratelimit);
        }
        if let Some(legacy) = self.legacy {
            legacy.apply(headers);
        }
    }
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner service's response
    /// with the rate-limit header fields added, or the rejection.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Inner {
            #[pin]
            future: F,
            headers: Option<RateHeaders>,
        },
        Ready {
            response: Option<Response<B>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn inner(future: F, headers: Option<RateHeaders>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, headers },
        }
    }

    pub(crate) fn ready(response: Response<B>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, headers } => {
                let mut response = ready!(future.poll(cx))?;
                if let Some(h) = headers.take() {
                    h.apply(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Ready { response } => match response.take() {
                Some(r) => Poll::Ready(Ok(r)),
                // Polled after completion: a contract violation by the caller, not by a client.
                None => panic!("ResponseFuture polled after completion"),
            },
        }
    }
}
