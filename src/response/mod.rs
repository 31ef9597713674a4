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

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response};

pub mod grpc;
pub(crate) mod refuse;
pub(crate) mod rejection;

use crate::headers;
use grpc::GrpcMode;

pub(crate) use rejection::{rejection_getters, Recipient};
pub use rejection::{Protocol, Rejection, RejectionKind};

/// The responses of a rejection: the default one in the request's protocol, and each form a
/// hook may pick.
impl Rejection<'_> {
    /// The gRPC status code the default gRPC response carries: `RESOURCE_EXHAUSTED` (8) for
    /// rate limits, queues and limits per key, `UNAVAILABLE` (14) for a full global
    /// concurrency limit or an unreachable store; see [`grpc`].
    pub fn grpc_code(&self) -> i32 {
        grpc::code(self)
    }

    /// The default response in the request's protocol: for HTTP the status, a one-line text
    /// body and `Retry-After`; for gRPC see [`grpc_response`](Self::grpc_response).
    pub fn default_response(&self) -> Response<Bytes> {
        self.default_response_of()
    }

    /// [`default_response`](Self::default_response) with its body in the service's type: a
    /// layer's own rejection is built once, not built and then mapped.
    #[inline]
    fn default_response_of<B: From<Bytes>>(&self) -> Response<B> {
        match self.protocol {
            Protocol::Http => self.http_response_of(),
            Protocol::Grpc => self.grpc_response().map(B::from),
        }
    }

    /// The gRPC response whatever the request: HTTP 200, `content-type: application/grpc`,
    /// `grpc-status`, `grpc-message`, `grpc-retry-pushback-ms` and `Retry-After` when
    /// retrying helps, and an empty body.
    pub fn grpc_response(&self) -> Response<Bytes> {
        grpc::response(self)
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
        self.http_response_of()
    }

    /// [`http_response`](Self::http_response) with its body in the service's type.
    #[inline]
    fn http_response_of<B: From<Bytes>>(&self) -> Response<B> {
        let body = match self.static_line() {
            Some(line) => Bytes::from_static(line.as_bytes()),
            None => Bytes::from(self.composed() + "\n"),
        };
        self.response(body, TEXT_PLAIN)
    }

    fn response<B: From<Bytes>>(&self, body: Bytes, content_type: HeaderValue) -> Response<B> {
        let mut resp = Response::new(B::from(body));
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
    let mut resp = match hook {
        Some(h) => {
            let mut resp = h.call(r);
            if let Some(wait) = r.retry_after {
                if !resp.headers().contains_key(RETRY_AFTER) {
                    resp.headers_mut()
                        .insert(RETRY_AFTER, headers::retry_after_value(wait));
                }
            }
            resp.map(B::from)
        }
        None => r.default_response_of(),
    };
    if mark {
        resp.extensions_mut().insert(Rejected);
    }
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;
    use crate::key::RequestHead;

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
            cost: None,
            outer: false,
        }
    }

    fn body(resp: &Response<Bytes>) -> &str {
        std::str::from_utf8(resp.body()).unwrap_or("<not utf-8>")
    }

    /// A layer's own rejection is built in the service's body type; it is the public
    /// default response, head and body, in either protocol and with or without a wait.
    #[test]
    fn a_layers_rejection_without_a_hook_is_the_default_response() {
        let statuses = [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::BAD_REQUEST,
            StatusCode::FORBIDDEN,
        ];
        for kind in KINDS {
            for status in statuses {
                for protocol in [Protocol::Http, Protocol::Grpc] {
                    for retry_after in [None, Some(Duration::from_millis(1500))] {
                        let r = Rejection {
                            protocol,
                            retry_after,
                            ..rejection(kind, status)
                        };
                        let sent: Response<Vec<u8>> = reject(None, &r, false);
                        let default = r.default_response();
                        let case = format!("{kind:?} {status} {protocol:?} {retry_after:?}");
                        assert_eq!(sent.status(), default.status(), "{case}");
                        assert_eq!(sent.headers(), default.headers(), "{case}");
                        assert_eq!(&sent.body()[..], &default.body()[..], "{case}");
                        assert!(sent.extensions().get::<Rejected>().is_none(), "{case}");
                    }
                }
            }
        }
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
