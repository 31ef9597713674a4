use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::shared::Answers;
use super::store::{Answer, Backend, Refunding, Settling};
use crate::decision::{Decision, Reservation};
use crate::response;

use crate::headers::{append_fields, Legacy};

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
            append_fields(headers, policy, Some(ratelimit));
        }
        if let Some(legacy) = self.legacy {
            legacy.apply(headers);
        }
    }
}

/// What an admitted request took from its key: given back if a layer inside rejects it.
pub(crate) struct Taken<B: Backend<K>, K> {
    pub(crate) limiter: B::Limiter,
    pub(crate) key: K,
    pub(crate) cost: u32,
    /// What the admission took, and where (filled in when the decision comes later).
    pub(crate) reserved: Reservation,
    /// Taken from the store's local fallback (Redis unreachable), not from the store.
    pub(crate) local: bool,
    /// When the layer settles the cost from the response: what it needs then. Boxed, so
    /// that layers that do not settle carry one word.
    pub(crate) settle: Option<Box<Settle>>,
}

/// What settling needs: the tier's rule and header fields, and the admission's decision,
/// whose fields are rendered only when the cost does not change (or the store does not
/// answer), so that a settled response renders its fields once.
pub(crate) struct Settle {
    pub(crate) answers: Arc<Answers>,
    pub(crate) tier: usize,
    /// The admission's decision; filled in when it comes later (Redis).
    pub(crate) admitted: Option<Decision>,
}

impl Settle {
    /// The header fields of the admission.
    fn admitted_headers(&self) -> Option<RateHeaders> {
        let d = self.admitted.as_ref()?;
        self.answers.settled_headers(self.tier, d)
    }
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner service's response
    /// with the rate-limit header fields added, or the rejection. `B` is the store; with the
    /// memory store no decision waits and the future only waits for the inner service. When
    /// the inner service answers with a rejection of a layer of this crate, what this layer
    /// took from the key is given back first.
    pub struct ResponseFuture<S, ReqBody, B, K>
    where
        S: Service<Request<ReqBody>>,
        B: Backend<K>,
    {
        #[pin]
        kind: Kind<S, ReqBody, B, K>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, B, K>
    where
        S: Service<Request<ReqBody>>,
        B: Backend<K>,
    {
        Deciding {
            // Boxed: the request is large, and only decisions that wait need to carry it.
            deciding: Pin<Box<Deciding<S, ReqBody, B, K>>>,
        },
        Inner {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
            taken: Option<Taken<B, K>>,
        },
        Refunding {
            refunding: Refunding,
            response: Option<S::Response>,
        },
        Settling {
            settling: Settling,
            response: Option<S::Response>,
            settle: Option<Box<Settle>>,
        },
        Ready {
            response: Option<S::Response>,
        },
    }
}

pin_project! {
    /// A request waiting for its decision, with the service made ready for it.
    struct Deciding<S, ReqBody, B, K>
    where
        B: Backend<K>,
    {
        #[pin]
        later: B::Later,
        answers: Arc<Answers>,
        tier: usize,
        request: Option<Request<ReqBody>>,
        service: Option<S>,
        taken: Option<Taken<B, K>>,
        // The key, for rejection events, when the layer traces keys.
        key: Option<K>,
        cost: u32,
    }
}

impl<S, ReqBody, B, K> ResponseFuture<S, ReqBody, B, K>
where
    S: Service<Request<ReqBody>>,
    B: Backend<K>,
{
    #[inline]
    pub(crate) fn inner(
        future: S::Future,
        headers: Option<RateHeaders>,
        taken: Option<Taken<B, K>>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Inner {
                future,
                headers,
                taken,
            },
        }
    }

    pub(crate) fn ready(response: S::Response) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    /// `taken` says what the request will have taken if the decision admits it; `key` is
    /// given when rejection events show it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn later(
        later: B::Later,
        answers: Arc<Answers>,
        tier: usize,
        request: Request<ReqBody>,
        service: S,
        taken: Option<Taken<B, K>>,
        key: Option<K>,
        cost: u32,
    ) -> Self {
        let deciding = Deciding {
            later,
            answers,
            tier,
            request: Some(request),
            service: Some(service),
            taken,
            key,
            cost,
        };
        ResponseFuture {
            kind: Kind::Deciding {
                deciding: Box::pin(deciding),
            },
        }
    }
}

impl<S, ReqBody, ResBody, B, K> Future for ResponseFuture<S, ReqBody, B, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
    B: Backend<K>,
    K: std::fmt::Debug,
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
                    // A degraded decision (Redis down, failing open) took nothing, nor did a
                    // rejection that a dry run lets through: nothing to give back or settle.
                    // One of the local fallback took from the fallback's state.
                    let took =
                        decision.is_allowed() && (!decision.is_degraded() || decision.is_local());
                    let mut taken = if took { d.taken.take() } else { None };
                    if let Some(t) = taken.as_mut() {
                        t.local = decision.is_local();
                        t.reserved = Reservation::of(&decision, t.cost);
                    }
                    if let Some(settle) = taken.as_mut().and_then(|t| t.settle.as_mut()) {
                        settle.admitted = Some(decision);
                    }
                    let key = d.key.as_ref().map(|k| k as &dyn std::fmt::Debug);
                    match d
                        .answers
                        .finish(*d.tier, &decision, *d.cost, key, &mut request)
                    {
                        Ok(headers) => Kind::Inner {
                            future: service.call(request),
                            headers,
                            taken,
                        },
                        Err(response) => Kind::Ready {
                            response: Some(response),
                        },
                    }
                }
                KindProj::Inner {
                    future,
                    headers,
                    taken,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    match taken.take() {
                        Some(t) if response::is_rejection(&response) => {
                            if let Some(h) = headers.take() {
                                h.apply(response.headers_mut());
                            }
                            match B::refund(&t.limiter, t.key, t.reserved, t.local) {
                                Some(refunding) => Kind::Refunding {
                                    refunding,
                                    response: Some(response),
                                },
                                None => return Poll::Ready(Ok(response)),
                            }
                        }
                        Some(Taken {
                            limiter,
                            key,
                            cost,
                            reserved,
                            local,
                            settle: Some(settle),
                        }) => {
                            // Settled from the response head; see `settle` for the rules.
                            let (parts, body) = response.into_parts();
                            let actual = settle
                                .answers
                                .settle
                                .as_ref()
                                .map_or(cost, |rule| rule.actual(&parts, cost));
                            let mut response = Response::from_parts(parts, body);
                            let fields = if actual == cost {
                                settle.admitted_headers()
                            } else {
                                match B::settle(&limiter, key, reserved, actual, local) {
                                    Answer::Now(d) => {
                                        settle.answers.settled_headers(settle.tier, &d)
                                    }
                                    Answer::Later(settling) => {
                                        kind.set(Kind::Settling {
                                            settling,
                                            response: Some(response),
                                            settle: Some(settle),
                                        });
                                        continue;
                                    }
                                }
                            };
                            if let Some(h) = fields {
                                h.apply(response.headers_mut());
                            }
                            return Poll::Ready(Ok(response));
                        }
                        _ => {
                            if let Some(h) = headers.take() {
                                h.apply(response.headers_mut());
                            }
                            return Poll::Ready(Ok(response));
                        }
                    }
                }
                KindProj::Settling {
                    settling,
                    response,
                    settle,
                } => {
                    let settled = ready!(settling.as_mut().poll(cx));
                    let (Some(mut response), Some(settle)) = (response.take(), settle.take())
                    else {
                        panic!("ResponseFuture polled after completion");
                    };
                    // Redis did not answer: the reservation stands, and so do its fields.
                    let fields = match settled {
                        Some(d) => settle.answers.settled_headers(settle.tier, &d),
                        None => settle.admitted_headers(),
                    };
                    if let Some(h) = fields {
                        h.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                KindProj::Refunding {
                    refunding,
                    response,
                } => {
                    ready!(refunding.as_mut().poll(cx));
                    Kind::Ready {
                        response: response.take(),
                    }
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
