//! Rejection responses, shared by every layer.
//!
//! A rejection is always a *response*, never an error that reaches the server: the wrapped
//! service's error type is left as it is. The default response is a short plain-text body with
//! the status, `Retry-After` when the client can come back, and the `RateLimit` fields of the
//! layer. Replace it with the layer's `on_reject` hook. To the hook's response the layer adds
//! `Retry-After` when the client can come back, unless the hook set it, and then appends the
//! layer's `RateLimit-Policy` and `RateLimit` items whatever the hook did (they are lists, so
//! the items of other layers are kept): a hook that sets those fields itself sends them twice.
//!
//! A gRPC call (`content-type: application/grpc…`) is answered the gRPC way instead: HTTP 200
//! with an empty body and the status in `grpc-status`, `grpc-message` and
//! `grpc-retry-pushback-ms` (a trailers-only response); see [`crate::grpc`]. The protocol is
//! read from the request head ([`Protocol::of`]) and can be forced with
//! [`OnReject::grpc`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::gcra::Decision;
use crate::grpc::GrpcMode;
use crate::headers;
use crate::key::RequestHead;

/// How a rejection is answered: a plain HTTP response or a gRPC status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// An HTTP status with a short text body.
    #[default]
    Http,
    /// A gRPC trailers-only response: HTTP 200, `grpc-status`, `grpc-message`, no body.
    Grpc,
}

impl Protocol {
    /// The protocol of a request: gRPC when its `content-type` is `application/grpc`,
    /// `application/grpc+proto` (or any `+` subtype) or has parameters after `;`. gRPC-Web
    /// (`application/grpc-web`) counts as HTTP: its proxy translates plain HTTP errors.
    ///
    /// ```
    /// use tollgate::key::RequestHead;
    /// use tollgate::response::Protocol;
    ///
    /// let req = http::Request::builder().header("content-type", "application/grpc+proto").body(())?;
    /// assert_eq!(Protocol::of(&RequestHead::new(&req)), Protocol::Grpc);
    /// let req = http::Request::builder().header("content-type", "application/json").body(())?;
    /// assert_eq!(Protocol::of(&RequestHead::new(&req)), Protocol::Http);
    /// # Ok::<(), http::Error>(())
    /// ```
    #[inline]
    pub fn of(head: &RequestHead<'_>) -> Protocol {
        match head.headers.get(CONTENT_TYPE) {
            Some(ct) if crate::grpc::is_grpc_content_type(ct.as_bytes()) => Protocol::Grpc,
            _ => Protocol::Http,
        }
    }
}

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
    pub(crate) protocol: Protocol,
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

    /// Whether the request was a gRPC call, which the default response answers with a gRPC
    /// status ([`Protocol::of`]).
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The gRPC status code the default gRPC response carries: `RESOURCE_EXHAUSTED` (8) for
    /// rate limits, queues and limits per key, `UNAVAILABLE` (14) for a full global
    /// concurrency limit or an unreachable store; see [`crate::grpc`].
    pub fn grpc_code(&self) -> i32 {
        crate::grpc::code(self)
    }

    /// The default response in the request's protocol: for HTTP the status, a one-line text
    /// body and `Retry-After`; for gRPC see [`grpc_response`](Self::grpc_response).
    pub fn default_response(&self) -> Response<Bytes> {
        match self.protocol {
            Protocol::Http => self.http_response(),
            Protocol::Grpc => self.grpc_response(),
        }
    }

    /// The gRPC response whatever the request: HTTP 200, `content-type: application/grpc`,
    /// `grpc-status`, `grpc-message`, `grpc-retry-pushback-ms` and `Retry-After` when
    /// retrying helps, and an empty body.
    pub fn grpc_response(&self) -> Response<Bytes> {
        crate::grpc::response(self)
    }

    /// The plain HTTP response whatever the request: the status, a one-line text body and
    /// `Retry-After`.
    pub fn http_response(&self) -> Response<Bytes> {
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
pub struct OnReject(Hook);

#[derive(Clone)]
enum Hook {
    Custom(Arc<RejectFn>),
    Default(GrpcMode),
}

type RejectFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

impl OnReject {
    /// Wraps a response-building function. It answers gRPC calls too: look at
    /// [`Rejection::protocol`], or call [`Rejection::default_response`].
    pub fn new<F>(f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        OnReject(Hook::Custom(Arc::new(f)))
    }

    /// The default responses, with gRPC chosen by `mode`: [`GrpcMode::Auto`] (what a layer
    /// without a hook does) reads the request's `content-type`, [`GrpcMode::Always`] answers
    /// every rejection as gRPC (a server that only speaks gRPC, whatever its clients send),
    /// [`GrpcMode::Never`] always as plain HTTP.
    ///
    /// ```
    /// use tollgate::grpc::GrpcMode;
    /// use tollgate::response::OnReject;
    /// use tollgate::{Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Quota::per_second(10)).on_reject(OnReject::grpc(GrpcMode::Always));
    /// # let _ = layer;
    /// ```
    pub fn grpc(mode: GrpcMode) -> Self {
        OnReject(Hook::Default(mode))
    }

    pub(crate) fn call(&self, r: &Rejection<'_>) -> Response<Bytes> {
        match &self.0 {
            Hook::Custom(f) => f(r),
            Hook::Default(GrpcMode::Auto) => r.default_response(),
            Hook::Default(GrpcMode::Always) => r.grpc_response(),
            Hook::Default(GrpcMode::Never) => r.http_response(),
        }
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
    protocol: Protocol,
) -> Response<B> {
    let r = Rejection {
        kind,
        status,
        retry_after,
        decision,
        policy,
        protocol,
    };
    reject(hook, &r)
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
    resp.map(B::from)
}
