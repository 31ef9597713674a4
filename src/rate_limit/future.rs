//! The response future of a rate limit: a state machine whose every transition is a named
//! step. What a decision adds to its response (its header fields, what it took from the key)
//! is built in [`answers`](super::answers).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::answers::{Answers, RateHeaders, Settle, Taken};
use crate::decision::Decision;
use crate::response;
use crate::store::backend::{Answer, Backend, Refunding, Settling};

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

/// Where a step of the future leads: the response, or the next state.
enum Step<R, K> {
    Done(R),
    Next(K),
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
        Self::answered(Some(response))
    }

    /// The future of a request answered where it was decided: `response` is the answer of
    /// [`Answers::finish`], moved here as it was returned.
    #[inline]
    pub(crate) fn answered(response: Option<S::Response>) -> Self {
        debug_assert!(response.is_some());
        ResponseFuture {
            kind: Kind::Ready { response },
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
                    let decision = ready!(deciding.as_mut().project().later.poll(cx));
                    decided(deciding.as_mut(), decision)
                }
                KindProj::Inner {
                    future,
                    headers,
                    taken,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    // Nothing to give back or settle: the response gets its fields, here, and
                    // what was taken is read where it lies, not moved out to be dropped.
                    let plain = match &*taken {
                        None => true,
                        Some(t) => t.settle.is_none() && !response::is_rejection(&response),
                    };
                    if plain {
                        RateHeaders::apply_to(headers.take(), &mut response);
                        return Poll::Ready(Ok(response));
                    }
                    match answered(response, headers.take(), taken.take()) {
                        Step::Done(response) => return Poll::Ready(Ok(response)),
                        Step::Next(next) => next,
                    }
                }
                KindProj::Settling {
                    settling,
                    response,
                    settle,
                } => {
                    let settled = ready!(settling.as_mut().poll(cx));
                    let (Some(response), Some(settle)) = (response.take(), settle.take()) else {
                        panic!("ResponseFuture polled after completion");
                    };
                    return Poll::Ready(Ok(with_settled(response, &settle, settled)));
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

/// The decision that waited has come: the request goes to the service made ready for it
/// with what it took, or is answered with its rejection.
fn decided<S, ReqBody, ResBody, B, K>(
    deciding: Pin<&mut Deciding<S, ReqBody, B, K>>,
    decision: Decision,
) -> Kind<S, ReqBody, B, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
    B: Backend<K>,
    K: std::fmt::Debug,
{
    let d = deciding.project();
    let (Some(mut request), Some(mut service)) = (d.request.take(), d.service.take()) else {
        // Only reachable if polled again after a panic in `call`.
        panic!("ResponseFuture polled after completion");
    };
    let taken = d.taken.take().and_then(|t| t.decided(&decision));
    let key = d.key.as_ref().map(|k| k as &dyn std::fmt::Debug);
    match d
        .answers
        .finish(*d.tier, &decision, *d.cost, key, &mut request)
    {
        None => Kind::Inner {
            headers: d.answers.fields(*d.tier, &decision),
            future: service.call(request),
            taken,
        },
        response @ Some(_) => Kind::Ready { response },
    }
}

/// The inner service has answered: what was taken is given back if a layer inside rejected
/// the request, or settled from the response; the response gets the decision's fields.
#[inline]
fn answered<S, ReqBody, ResBody, B, K>(
    mut response: Response<ResBody>,
    headers: Option<RateHeaders>,
    taken: Option<Taken<B, K>>,
) -> Step<Response<ResBody>, Kind<S, ReqBody, B, K>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    B: Backend<K>,
{
    match taken {
        Some(t) if response::is_rejection(&response) => {
            RateHeaders::apply_to(headers, &mut response);
            match B::refund(&t.limiter, t.key, t.reserved, t.local) {
                Some(refunding) => Step::Next(Kind::Refunding {
                    refunding,
                    response: Some(response),
                }),
                None => Step::Done(response),
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
            let (mut response, actual) = settle.actual(response, cost);
            if actual == cost {
                RateHeaders::apply_to(settle.admitted_headers(), &mut response);
                return Step::Done(response);
            }
            match B::settle(&limiter, key, reserved, actual, local) {
                Answer::Now(d) => Step::Done(with_settled(response, &settle, Some(d))),
                Answer::Later(settling) => Step::Next(Kind::Settling {
                    settling,
                    response: Some(response),
                    settle: Some(settle),
                }),
            }
        }
        _ => {
            RateHeaders::apply_to(headers, &mut response);
            Step::Done(response)
        }
    }
}

/// The response of a settled request, with the fields of the settlement (`settled`), or of
/// the admission when the store did not answer: the reservation stands, and so do its fields.
fn with_settled<ResBody>(
    mut response: Response<ResBody>,
    settle: &Settle,
    settled: Option<Decision>,
) -> Response<ResBody> {
    let fields = match settled {
        Some(d) => settle.answers.settled_headers(settle.tier, &d),
        None => settle.admitted_headers(),
    };
    RateHeaders::apply_to(fields, &mut response);
    response
}
