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
//! `grpc-retry-pushback-ms` (a trailers-only response); see [`grpc`]. The protocol is
//! read from the request head ([`Protocol::of`]) and can be forced with
//! [`OnReject::grpc`].

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

pub mod grpc;
pub(crate) mod refuse;

use crate::decision::Decision;
use crate::headers;
use crate::key::RequestHead;
use grpc::GrpcMode;

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
            Some(ct) if grpc::is_grpc_content_type(ct.as_bytes()) => Protocol::Grpc,
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
    /// The key is banned by a [penalty box](crate::penalty) after repeated rejections, for
    /// `retry_after` more.
    Banned,
}

impl RejectionKind {
    /// The short machine-readable code of this kind (see [`Rejection::reason`]).
    pub fn code(self) -> &'static str {
        match self {
            RejectionKind::RateLimited => "rate_limited",
            RejectionKind::CostExceedsBurst => "cost_exceeds_burst",
            RejectionKind::MissingKey => "missing_key",
            RejectionKind::Concurrency => "concurrency_limited",
            RejectionKind::QueueFull => "queue_full",
            RejectionKind::StoreUnavailable => "store_unavailable",
            RejectionKind::Banned => "banned",
        }
    }

    /// What happened, for kinds the status's reason phrase does not say by itself.
    fn detail(self) -> Option<&'static str> {
        match self {
            RejectionKind::RateLimited | RejectionKind::StoreUnavailable => None,
            RejectionKind::CostExceedsBurst => Some("the request costs more than the limit allows"),
            RejectionKind::MissingKey => Some("could not identify the client"),
            RejectionKind::Concurrency => Some("too many requests in progress"),
            RejectionKind::QueueFull => Some("the queue is full"),
            RejectionKind::Banned => Some("banned for a while after repeated rejections"),
        }
    }
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
    /// The quota that fired, for a rate limit's counts and events.
    pub(crate) quota: Option<usize>,
    /// Whether a layer outside decided the request: then the response is marked
    /// ([`Rejected`]).
    pub(crate) outer: bool,
}

impl<'a> Rejection<'a> {
    /// The rejection of `kind` with `status`, telling the client to wait `retry_after`, by the
    /// policy (tier or layer) named `policy`, to `to`. The one place a [`Rejection`] is
    /// assembled; a rate limit adds its decision with [`decided`](Self::decided).
    #[inline]
    pub(crate) fn new(
        kind: RejectionKind,
        status: StatusCode,
        retry_after: Option<Duration>,
        policy: Option<&'a str>,
        to: Recipient,
    ) -> Self {
        Rejection {
            kind,
            status,
            retry_after,
            decision: None,
            policy,
            protocol: to.protocol,
            quota: None,
            outer: to.outer,
        }
    }

    /// This rejection, made by the rate-limit `decision`, whose quota `quota` fired.
    #[inline]
    pub(crate) fn decided(self, decision: &'a Decision, quota: Option<usize>) -> Self {
        Rejection {
            decision: Some(decision),
            quota,
            ..self
        }
    }

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
    /// concurrency limit or an unreachable store; see [`grpc`].
    pub fn grpc_code(&self) -> i32 {
        grpc::code(self)
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
        grpc::response(self)
    }

    /// A short machine-readable code for [`kind`](Self::kind), stable across releases:
    /// `"rate_limited"`, `"cost_exceeds_burst"`, `"missing_key"`, `"concurrency_limited"`,
    /// `"queue_full"` or `"store_unavailable"`. Put it in a JSON body, a log line or a metric.
    pub fn reason(&self) -> &'static str {
        self.kind.code()
    }

    /// [`retry_after`](Self::retry_after) in whole seconds as `Retry-After` carries it
    /// (rounded up, at least 1), or `None` when waiting does not help.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
            .map(|d| headers::ceil_secs(d).clamp(1, headers::MAX_INTEGER))
    }

    /// The one-line text of the default response, without the line break: the status's
    /// reason phrase, then what happened when the phrase does not say it
    /// (`"Service Unavailable: too many requests in progress"`). It never contradicts the
    /// status: it always starts with the status's reason phrase (its code when it has none).
    pub fn message(&self) -> Cow<'static, str> {
        match self.static_line() {
            Some(line) => Cow::Borrowed(line.trim_end_matches('\n')),
            None => Cow::Owned(self.composed()),
        }
    }

    /// The body line of the pairs the crate produces, with its line break, without an
    /// allocation (rejections are the hot path under a flood).
    fn static_line(&self) -> Option<&'static str> {
        use RejectionKind as K;
        Some(match (self.kind, self.status) {
            (K::RateLimited, StatusCode::TOO_MANY_REQUESTS) => "Too Many Requests\n",
            (K::CostExceedsBurst, StatusCode::TOO_MANY_REQUESTS) => {
                "Too Many Requests: the request costs more than the limit allows\n"
            }
            (K::MissingKey, StatusCode::BAD_REQUEST) => {
                "Bad Request: could not identify the client\n"
            }
            (K::MissingKey, StatusCode::UNAUTHORIZED) => {
                "Unauthorized: could not identify the client\n"
            }
            (K::Concurrency, StatusCode::TOO_MANY_REQUESTS) => {
                "Too Many Requests: too many requests in progress\n"
            }
            (K::Concurrency, StatusCode::SERVICE_UNAVAILABLE) => {
                "Service Unavailable: too many requests in progress\n"
            }
            (K::QueueFull, StatusCode::TOO_MANY_REQUESTS) => {
                "Too Many Requests: the queue is full\n"
            }
            (K::QueueFull, StatusCode::SERVICE_UNAVAILABLE) => {
                "Service Unavailable: the queue is full\n"
            }
            (K::StoreUnavailable, StatusCode::SERVICE_UNAVAILABLE) => "Service Unavailable\n",
            _ => return None,
        })
    }

    /// `"<phrase or code>: <detail>"`, for the pairs the static table does not hold.
    fn composed(&self) -> String {
        let phrase = self
            .status
            .canonical_reason()
            .unwrap_or(self.status.as_str());
        match self.kind.detail() {
            Some(detail) => format!("{phrase}: {detail}"),
            None => phrase.to_owned(),
        }
    }

    /// A JSON response in the status of the default one, with `Retry-After`:
    /// `{"error":"<reason>","message":"<message>","retry_after":<seconds or null>}`.
    /// The ready-made body for [`OnReject`] hooks of JSON APIs.
    ///
    /// ```
    /// use tollgate::response::{OnReject, Rejection};
    /// let json = OnReject::new(|r: &Rejection<'_>| r.json_response());
    /// # let _ = json;
    /// ```
    pub fn json_response(&self) -> Response<Bytes> {
        let retry_after = match self.retry_after_secs() {
            Some(secs) => secs.to_string(),
            None => "null".to_owned(),
        };
        // The reason and the message are ASCII without quotes or backslashes: no escaping.
        let body = format!(
            "{{\"error\":\"{}\",\"message\":\"{}\",\"retry_after\":{retry_after}}}\n",
            self.reason(),
            self.message()
        );
        self.response(Bytes::from(body), APPLICATION_JSON)
    }

    /// The plain HTTP response whatever the request: the status, the one-line
    /// [`message`](Self::message) as a plain-text body, and `Retry-After` when waiting helps.
    pub fn http_response(&self) -> Response<Bytes> {
        let body = match self.static_line() {
            Some(line) => Bytes::from_static(line.as_bytes()),
            None => Bytes::from(self.composed() + "\n"),
        };
        self.response(body, TEXT_PLAIN)
    }

    fn response(&self, body: Bytes, content_type: HeaderValue) -> Response<Bytes> {
        let mut resp = Response::new(body);
        *resp.status_mut() = self.status;
        // No `reserve`: the first insertion makes room for six fields (the type, Retry-After
        // and the RateLimit fields fit), and costs less than reserving the same room ahead.
        resp.headers_mut().insert(CONTENT_TYPE, content_type);
        if let Some(wait) = self.retry_after {
            resp.headers_mut()
                .insert(RETRY_AFTER, headers::retry_after_value(wait));
        }
        resp
    }
}

// Checked when compiled: `HeaderValue::from_static` at run time checks every byte, for each
// rejection.
const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A function that builds the response for a rejected request.
///
/// The hook answers every kind of rejection the layer produces: a rate limit (`429`), a
/// missing key (`400` or the configured status), a full queue or a busy server (`503` for a
/// global concurrency limit), a store outage (`503`). Keep the rejection's
/// [`status`](Rejection::status) and say what happened with its [`reason`](Rejection::reason)
/// code, so that the body never contradicts the status. [`Rejection::json_response`] is the
/// ready-made JSON answer.
///
/// ```
/// use bytes::Bytes;
/// use http::Response;
/// use tollgate::response::{OnReject, Rejection};
///
/// // {"error":"rate_limited","retry_after":1} with 429, {"error":"missing_key","retry_after":null}
/// // with 400, {"error":"queue_full",...} with 503, ...
/// let json: OnReject = OnReject::new(|r: &Rejection<'_>| {
///     let retry_after = r.retry_after_secs().map_or("null".to_owned(), |s| s.to_string());
///     Response::builder()
///         .status(r.status())
///         .header("content-type", "application/json")
///         .body(Bytes::from(format!(
///             r#"{{"error":"{}","retry_after":{retry_after}}}"#,
///             r.reason()
///         )))
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
    /// use tollgate::response::grpc::GrpcMode;
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

/// Who a rejection answers: the request's protocol, and whether a layer outside already
/// decided the request (a [`RateLimitLayer`](crate::RateLimitLayer) that admitted it records its
/// [`Decision`] in the request's extensions before passing it on). Read once from the request
/// head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recipient {
    pub(crate) protocol: Protocol,
    /// Only then is the rejection marked ([`Rejected`]): a mark no layer looks for would cost
    /// an allocation in the response's extensions for nothing.
    pub(crate) outer: bool,
}

impl Recipient {
    /// The recipient of a rejection of the request with head `head`.
    #[inline]
    pub(crate) fn of(head: &RequestHead<'_>) -> Self {
        Recipient {
            protocol: Protocol::of(head),
            outer: head.extensions.get::<Decision>().is_some(),
        }
    }
}

/// The mark a rejection the crate builds (or its hook) carries in its response extensions when
/// a layer outside decided the request: an outer [`RateLimitLayer`](crate::RateLimitLayer) that
/// admitted the request gives back what it took when it sees it. Private, so a handler's own
/// `429` cannot carry it, and extensions are never sent to the client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejected;

/// Whether `resp` is a rejection built by a layer of this crate.
#[inline]
pub(crate) fn is_rejection<B>(resp: &Response<B>) -> bool {
    resp.extensions().get::<Rejected>().is_some()
}

/// Builds the response for `r`: the hook's or the default, with `Retry-After` ensured, in the
/// service's body type, marked as a rejection when `mark` (a layer outside decided it).
pub(crate) fn reject<B: From<Bytes>>(
    hook: Option<&OnReject>,
    r: &Rejection<'_>,
    mark: bool,
) -> Response<B> {
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
    if mark {
        resp.extensions_mut().insert(Rejected);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [RejectionKind; 7] = [
        RejectionKind::RateLimited,
        RejectionKind::CostExceedsBurst,
        RejectionKind::MissingKey,
        RejectionKind::Concurrency,
        RejectionKind::QueueFull,
        RejectionKind::StoreUnavailable,
        RejectionKind::Banned,
    ];

    fn rejection(kind: RejectionKind, status: StatusCode) -> Rejection<'static> {
        Rejection {
            kind,
            status,
            retry_after: Some(Duration::from_millis(1500)),
            decision: None,
            policy: None,
            protocol: Protocol::Http,
            quota: None,
            outer: false,
        }
    }

    fn body(resp: &Response<Bytes>) -> &str {
        std::str::from_utf8(resp.body()).unwrap_or("<not utf-8>")
    }

    /// The bodies of the (kind, status) pairs the layers produce, exactly.
    #[test]
    fn the_default_body_of_every_produced_rejection_starts_with_its_status() {
        use RejectionKind as K;
        let produced = [
            (K::RateLimited, 429, "Too Many Requests\n"),
            (
                K::CostExceedsBurst,
                429,
                "Too Many Requests: the request costs more than the limit allows\n",
            ),
            (
                K::MissingKey,
                400,
                "Bad Request: could not identify the client\n",
            ),
            (
                K::MissingKey,
                401,
                "Unauthorized: could not identify the client\n",
            ),
            (
                K::MissingKey,
                403,
                "Forbidden: could not identify the client\n",
            ),
            (
                K::Concurrency,
                429,
                "Too Many Requests: too many requests in progress\n",
            ),
            (
                K::Concurrency,
                503,
                "Service Unavailable: too many requests in progress\n",
            ),
            (K::QueueFull, 429, "Too Many Requests: the queue is full\n"),
            (
                K::QueueFull,
                503,
                "Service Unavailable: the queue is full\n",
            ),
            (K::StoreUnavailable, 503, "Service Unavailable\n"),
        ];
        for (kind, code, expected) in produced {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::IM_A_TEAPOT);
            let resp = rejection(kind, status).default_response();
            assert_eq!(resp.status(), status);
            assert_eq!(body(&resp), expected, "{kind:?} {code}");
            assert_eq!(resp.headers()[RETRY_AFTER], "2");
        }
    }

    /// Any kind under any error status (a hook or `MissingKey::Reject` can pick any): the body
    /// starts with that status's reason phrase, or its code when it has none.
    #[test]
    fn no_body_contradicts_its_status() {
        for kind in KINDS {
            for code in 400..=599u16 {
                let Ok(status) = StatusCode::from_u16(code) else {
                    continue;
                };
                let r = rejection(kind, status);
                let resp = r.default_response();
                let phrase = status.canonical_reason().unwrap_or(status.as_str());
                assert!(
                    body(&resp).starts_with(phrase),
                    "{kind:?} {code}: {:?}",
                    body(&resp)
                );
                assert_eq!(body(&resp), format!("{}\n", r.message()));
                assert!(!r.message().contains('\n'));
                if status != StatusCode::TOO_MANY_REQUESTS {
                    assert!(
                        !body(&resp).contains("Too Many Requests"),
                        "{kind:?} {code}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_kind_has_its_own_reason_code() {
        let codes: Vec<&str> = KINDS.iter().map(|k| k.code()).collect();
        assert_eq!(
            codes,
            [
                "rate_limited",
                "cost_exceeds_burst",
                "missing_key",
                "concurrency_limited",
                "queue_full",
                "store_unavailable",
                "banned"
            ]
        );
    }

    #[test]
    fn the_json_response_keeps_the_status_and_names_the_kind() {
        let r = rejection(RejectionKind::QueueFull, StatusCode::SERVICE_UNAVAILABLE);
        let resp = r.json_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(resp.headers()[RETRY_AFTER], "2");
        assert_eq!(
            body(&resp),
            "{\"error\":\"queue_full\",\"message\":\"Service Unavailable: the queue is full\",\"retry_after\":2}\n"
        );

        let r = Rejection {
            retry_after: None,
            ..rejection(RejectionKind::MissingKey, StatusCode::BAD_REQUEST)
        };
        assert_eq!(
            body(&r.json_response()),
            "{\"error\":\"missing_key\",\"message\":\"Bad Request: could not identify the client\",\"retry_after\":null}\n"
        );
    }

    #[test]
    fn retry_after_secs_rounds_up_and_is_never_zero() {
        let mut r = rejection(RejectionKind::RateLimited, StatusCode::TOO_MANY_REQUESTS);
        for (wait, secs) in [
            (1, Some(1)),
            (999, Some(1)),
            (1000, Some(1)),
            (1001, Some(2)),
        ] {
            r.retry_after = Some(Duration::from_millis(wait));
            assert_eq!(r.retry_after_secs(), secs, "{wait} ms");
        }
        r.retry_after = Some(Duration::ZERO);
        assert_eq!(r.retry_after_secs(), Some(1));
        r.retry_after = None;
        assert_eq!(r.retry_after_secs(), None);
    }

    #[test]
    fn a_rejection_is_marked_exactly_when_a_layer_outside_decided_the_request() {
        let hook = OnReject::new(|r: &Rejection<'_>| r.json_response());
        for hook in [None, Some(&hook)] {
            let mut req = http::Request::new(());
            let to = Recipient::of(&RequestHead::new(&req));
            assert!(!to.outer);
            let r = Rejection::new(
                RejectionKind::RateLimited,
                StatusCode::TOO_MANY_REQUESTS,
                None,
                None,
                to,
            );
            let resp: Response<Bytes> = reject(hook, &r, r.outer);
            assert!(!is_rejection(&resp));
            // What an outer layer records when it admits (or lets through) the request.
            crate::decision::record_unlimited(req.extensions_mut());
            let to = Recipient::of(&RequestHead::new(&req));
            assert!(to.outer);
            let r = Rejection::new(
                RejectionKind::Concurrency,
                StatusCode::SERVICE_UNAVAILABLE,
                Some(Duration::from_secs(1)),
                None,
                to,
            );
            let resp: Response<Bytes> = reject(hook, &r, r.outer);
            assert!(is_rejection(&resp));
            assert_eq!(resp.headers()[RETRY_AFTER], "1");
        }
    }
}
