//! Rejection responses, shared by every layer.
//!
//! A rejection is always a *response*, never an error that reaches the server: the wrapped
//! service's error type is left as it is. The default response is a short plain-text body with
//! the status, `Retry-After` when the client can come back, and the `RateLimit` fields of the
//! layer. Replace it with the layer's `on_reject` hook. To the hook's response the layer adds
//! `Retry-After` when the client can come back, unless the hook set it, and then appends the
//! layer's `RateLimit-Policy` and `RateLimit` items whatever the hook did (they are lists, so
//! the items of other layers are kept): a hook that sets those fields itself sends them twice.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::gcra::Decision;
use crate::headers;

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// A rate limit was reached; the client may retry after `retry_after`.
    RateLimited,
    /// The request costs more than a quota's burst: it can never be admitted.
    CostExceedsBurst,
    /// No key could be extracted from the request and the layer is set to reject such requests.
    MissingKey,
    /// A concurrency limit was reached.
    Concurrency,
    /// A shaping or waiting queue was full, or the wait would have been too long.
    QueueFull,
    /// The limit's store (Redis) could not be reached in time and the layer is set to fail
    /// closed: `503 Service Unavailable`.
    StoreUnavailable,
}

/// What a rejection hook is told about the request it answers.
#[derive(Debug, Clone, Copy)]
pub struct Rejection<'a> {
    pub(crate) kind: RejectionKind,
    pub(crate) status: StatusCode,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) decision: Option<&'a Decision>,
    pub(crate) policy: Option<&'a str>,
}

impl<'a> Rejection<'a> {
    /// Why the request was turned away.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The status the default response would have.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// How long the client should wait before retrying, if waiting helps.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The rate-limit decision, for rate-limit rejections.
    pub fn decision(&self) -> Option<&'a Decision> {
        self.decision
    }

    /// The name of the policy (tier) that decided, for rate-limit rejections.
    pub fn policy(&self) -> Option<&'a str> {
        self.policy
    }

    /// The default response: the status, a one-line text body, and `Retry-After`.
    pub fn default_response(&self) -> Response<Bytes> {
        let body: &'static str = match self.kind {
            RejectionKind::RateLimited => "Too Many Requests\n",
            RejectionKind::CostExceedsBurst => "Request exceeds the rate limit\n",
            RejectionKind::MissingKey => "Could not identify the client\n",
            RejectionKind::Concurrency => {
                if self.status == StatusCode::SERVICE_UNAVAILABLE {
                    "Service Unavailable\n"
                } else {
                    "Too Many Concurrent Requests\n"
                }
            }
            RejectionKind::QueueFull => "Too Many Requests\n",
            RejectionKind::StoreUnavailable => "Service Unavailable\n",
        };
        let mut resp = Response::new(Bytes::from_static(body.as_bytes()));
        *resp.status_mut() = self.status;
        // No `reserve`: the first insertion makes room for six fields (the type, Retry-After
        // and the RateLimit fields fit), and costs less than reserving the same room ahead.
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(wait) = self.retry_after {
            resp.headers_mut()
                .insert(RETRY_AFTER, headers::retry_after_value(wait));
        }
        resp
    }
}

/// A function that builds the response for a rejected request.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, StatusCode};
/// use tollgate::response::{OnReject, Rejection};
///
/// let json: OnReject = OnReject::new(|r: &Rejection<'_>| {
///     let secs = r.retry_after().map_or(0, |d| d.as_secs_f64().ceil() as u64);
///     Response::builder()
///         .status(r.status())
///         .header("content-type", "application/json")
///         .body(Bytes::from(format!(r#"{{"error":"rate_limited","retry_after":{secs}}}"#)))
///         .unwrap_or_else(|_| r.default_response())
/// });
/// # let _ = json;
/// ```
#[derive(Clone)]
pub struct OnReject(Arc<RejectFn>);

type RejectFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

impl OnReject {
    /// Wraps a response-building function.
    pub fn new<F>(f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        OnReject(Arc::new(f))
    }

    pub(crate) fn call(&self, r: &Rejection<'_>) -> Response<Bytes> {
        (self.0)(r)
    }
}

impl fmt::Debug for OnReject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnReject")
    }
}

/// The response to a request turned away: `hook`'s, or the default one. The one place a
/// [`Rejection`] is assembled.
pub(crate) fn respond<B: From<Bytes>>(
    hook: Option<&OnReject>,
    kind: RejectionKind,
    status: StatusCode,
    retry_after: Option<Duration>,
    decision: Option<&Decision>,
    policy: Option<&str>,
) -> Response<B> {
    let r = Rejection {
        kind,
        status,
        retry_after,
        decision,
        policy,
    };
    reject(hook, &r)
}

/// The mark every rejection the crate builds carries in its response extensions (the hook's
/// too): an outer [`RateLimitLayer`](crate::RateLimitLayer) that admitted the request gives back
/// what it took when it sees it. Private, so a handler's own `429` cannot carry it, and
/// extensions are never sent to the client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejected;

/// Whether `resp` is a rejection built by a layer of this crate.
#[inline]
pub(crate) fn is_rejection<B>(resp: &Response<B>) -> bool {
    resp.extensions().get::<Rejected>().is_some()
}

/// Builds the response for `r`: the hook's or the default, with `Retry-After` ensured, in the
/// service's body type.
fn reject<B: From<Bytes>>(hook: Option<&OnReject>, r: &Rejection<'_>) -> Response<B> {
    let resp = match hook {
        Some(h) => {
            let mut resp = h.call(r);
            if let Some(wait) = r.retry_after {
                if !resp.headers().contains_key(RETRY_AFTER) {
                    resp.headers_mut()
                        .insert(RETRY_AFTER, headers::retry_after_value(wait));
                }
            }
            resp
        }
        None => r.default_response(),
    };
    let mut resp = resp.map(B::from);
    resp.extensions_mut().insert(Rejected);
    resp
}
