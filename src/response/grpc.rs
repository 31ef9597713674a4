//! gRPC: rejections as gRPC statuses, and the body adapter that puts the layers on a tonic
//! server.
//!
//! Every layer of the crate answers a gRPC call (a request whose `content-type` is
//! `application/grpc…`, see [`Protocol::of`](crate::response::Protocol::of)) with a
//! *trailers-only* gRPC response instead of an HTTP error that gRPC clients would report as a
//! transport failure:
//!
//! * HTTP status 200 and `content-type: application/grpc`, an empty body;
//! * `grpc-status` and `grpc-message` (a short ASCII text), as headers: a response without a
//!   body carries its trailers in its headers;
//! * `grpc-retry-pushback-ms`, the delay in milliseconds after which a retry can succeed, as
//!   gRPC's retry design (proposal A6) defines it: clients with a retry policy wait that long
//!   instead of their own backoff. A request that can never pass (its cost exceeds the burst)
//!   gets `-1`, which A6 defines as "do not retry". `Retry-After` (seconds) is kept alongside;
//! * the layer's `RateLimit` / `RateLimit-Policy` fields, which clients read as metadata
//!   (admitted calls get them as initial metadata).
//!
//! | rejection | HTTP | gRPC |
//! |---|---|---|
//! | rate limit ([`RejectionKind::RateLimited`]) | 429 | `RESOURCE_EXHAUSTED` (8) |
//! | cost above the burst ([`RejectionKind::CostExceedsBurst`]) | 429 | `RESOURCE_EXHAUSTED` (8), pushback `-1` |
//! | shaping queue full ([`RejectionKind::QueueFull`]) | 429 | `RESOURCE_EXHAUSTED` (8) |
//! | concurrency limit per key | 429 | `RESOURCE_EXHAUSTED` (8) |
//! | global concurrency limit (or its queue) | 503 | `UNAVAILABLE` (14) |
//! | key banned by a penalty box ([`RejectionKind::Banned`]) | 429 (or the box's status) | `RESOURCE_EXHAUSTED` (8); `PERMISSION_DENIED` (7) for 403 |
//! | store unreachable, fail closed ([`RejectionKind::StoreUnavailable`]) | 503 | `UNAVAILABLE` (14) |
//! | no key ([`RejectionKind::MissingKey`]) | 400 / 401 / 403 / other | `INVALID_ARGUMENT` (3) / `UNAUTHENTICATED` (16) / `PERMISSION_DENIED` (7) / `UNKNOWN` (2) |
//!
//! Force one protocol with [`OnReject::grpc`](crate::response::OnReject::grpc).
//!
//! # On a tonic server
//!
//! tonic's response body cannot be built from bytes, which the rate-limit and shaping layers
//! need for their plain HTTP rejections; [`layer`] wraps any layer of the crate so that it
//! fits `tonic::transport::Server::layer`:
//!
//! ```
//! use tollgate::response::grpc;
//! use tollgate::{key, Quota, RateLimitLayer};
//!
//! let limit = grpc::layer(
//!     RateLimitLayer::new(Quota::per_second(100))
//!         .key(key::GrpcMethod)
//!         // Health checks are never limited.
//!         .skip_path("/grpc.health.v1.Health/Check"),
//! );
//! // tonic::transport::Server::builder().layer(limit).add_service(...)
//! # let _ = limit;
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::rejection::{Rejection, RejectionKind};
use crate::headers;

/// When rejections are answered as gRPC statuses. See
/// [`OnReject::grpc`](crate::response::OnReject::grpc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GrpcMode {
    /// gRPC for requests whose `content-type` is `application/grpc…`, HTTP for the others
    /// (the default).
    #[default]
    Auto,
    /// gRPC for every rejection.
    Always,
    /// Plain HTTP for every rejection.
    Never,
}

/// The gRPC status codes the layers answer with.
pub mod code {
    /// `UNKNOWN`.
    pub const UNKNOWN: i32 = 2;
    /// `INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// `PERMISSION_DENIED`.
    pub const PERMISSION_DENIED: i32 = 7;
    /// `RESOURCE_EXHAUSTED`: a limit of the client's was reached.
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    /// `UNAVAILABLE`: the service as a whole is busy or cannot decide.
    pub const UNAVAILABLE: i32 = 14;
    /// `UNAUTHENTICATED`.
    pub const UNAUTHENTICATED: i32 = 16;
}

/// `grpc-status`.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: milliseconds until a retry can succeed (gRPC proposal A6).
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The gRPC status code of a rejection.
pub(crate) fn code(r: &Rejection<'_>) -> i32 {
    match r.kind() {
        RejectionKind::RateLimited | RejectionKind::CostExceedsBurst => code::RESOURCE_EXHAUSTED,
        RejectionKind::Banned => match r.status() {
            StatusCode::FORBIDDEN => code::PERMISSION_DENIED,
            StatusCode::SERVICE_UNAVAILABLE => code::UNAVAILABLE,
            _ => code::RESOURCE_EXHAUSTED,
        },
        RejectionKind::StoreUnavailable => code::UNAVAILABLE,
        RejectionKind::Concurrency | RejectionKind::QueueFull => {
            if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                code::UNAVAILABLE
            } else {
                code::RESOURCE_EXHAUSTED
            }
        }
        RejectionKind::MissingKey => match r.status() {
            StatusCode::BAD_REQUEST => code::INVALID_ARGUMENT,
            StatusCode::UNAUTHORIZED => code::UNAUTHENTICATED,
            StatusCode::FORBIDDEN => code::PERMISSION_DENIED,
            StatusCode::TOO_MANY_REQUESTS => code::RESOURCE_EXHAUSTED,
            StatusCode::SERVICE_UNAVAILABLE => code::UNAVAILABLE,
            _ => code::UNKNOWN,
        },
    }
}

fn message(r: &Rejection<'_>) -> &'static str {
    // Plain ASCII without '%': valid `grpc-message` values as they are.
    match r.kind() {
        RejectionKind::RateLimited => "rate limit exceeded",
        RejectionKind::CostExceedsBurst => "request exceeds the rate limit",
        RejectionKind::MissingKey => "could not identify the client",
        RejectionKind::Concurrency => "too many concurrent requests",
        RejectionKind::QueueFull => "too many requests waiting",
        RejectionKind::StoreUnavailable => "rate limit store unavailable",
        RejectionKind::Banned => "banned after repeated rejections",
    }
}

/// The value of a status code, without allocating for the codes used here.
fn code_value(code: i32) -> HeaderValue {
    match code {
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        7 => HeaderValue::from_static("7"),
        8 => HeaderValue::from_static("8"),
        14 => HeaderValue::from_static("14"),
        16 => HeaderValue::from_static("16"),
        other => HeaderValue::from(other),
    }
}

/// The trailers-only gRPC response for `r`.
pub(crate) fn response(r: &Rejection<'_>) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::new());
    let h = resp.headers_mut();
    // Room for these and the RateLimit fields without growing.
    h.reserve(8);
    const APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
    h.insert(CONTENT_TYPE, APPLICATION_GRPC);
    h.insert(GRPC_STATUS, code_value(code(r)));
    h.insert(GRPC_MESSAGE, HeaderValue::from_static(message(r)));
    if r.kind() == RejectionKind::CostExceedsBurst {
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    } else if let Some(wait) = r.retry_after() {
        h.insert(GRPC_RETRY_PUSHBACK_MS, pushback_value(wait));
        h.insert(RETRY_AFTER, headers::retry_after_value(wait));
    }
    resp
}

/// Milliseconds, rounded up so that a client never comes back too early, and at most
/// `i32::MAX` (24.8 days): clients parse the value as a 32-bit integer, and one they cannot
/// parse means "do not retry", which a long wait is not.
fn pushback_value(wait: std::time::Duration) -> HeaderValue {
    let ms = wait.as_nanos().div_ceil(1_000_000);
    HeaderValue::from(i32::try_from(ms).unwrap_or(i32::MAX))
}

/// Makes a layer of this crate fit a tonic server (or any server whose response body cannot
/// be built from bytes): the wrapped service's body becomes a [`GrpcBody`]. See the
/// [module documentation](self).
pub fn layer<L>(layer: L) -> GrpcLayer<L> {
    GrpcLayer { layer }
}

/// A layer whose services answer with a [`GrpcBody`]. Made by [`layer`].
#[derive(Debug, Clone)]
pub struct GrpcLayer<L> {
    layer: L,
}

impl<L, S> Layer<S> for GrpcLayer<L>
where
    L: Layer<WrapBody<S>>,
{
    type Service = L::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.layer.layer(WrapBody { inner })
    }
}

/// A service whose response body is wrapped in a [`GrpcBody`]. See [`layer`].
#[derive(Debug, Clone)]
pub struct WrapBody<S> {
    inner: S,
}

impl<S, Req, B> Service<Req> for WrapBody<S>
where
    S: Service<Req, Response = Response<B>>,
{
    type Response = Response<GrpcBody<B>>;
    type Error = S::Error;
    type Future = WrapBodyFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        WrapBodyFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The future of [`WrapBody`].
    pub struct WrapBodyFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F: fmt::Debug> fmt::Debug for WrapBodyFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrapBodyFuture")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<F, B, E> Future for WrapBodyFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<GrpcBody<B>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .inner
            .poll(cx)
            .map(|r| r.map(|resp| resp.map(GrpcBody::inner)))
    }
}

pin_project! {
    /// A response body: the wrapped service's, or the bytes of a rejection (empty for gRPC).
    pub struct GrpcBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> GrpcBody<B> {
    /// Wraps the service's body.
    pub fn inner(body: B) -> Self {
        GrpcBody {
            kind: Kind::Inner { body },
        }
    }
}

impl<B> From<Bytes> for GrpcBody<B> {
    fn from(data: Bytes) -> Self {
        GrpcBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for GrpcBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body } => f.debug_tuple("Inner").field(body).finish(),
            Kind::Full { data } => f.debug_tuple("Full").field(data).finish(),
        }
    }
}

impl<B> http_body::Body for GrpcBody<B>
where
    B: http_body::Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => {
                Poll::Ready(data.take().map(|d| Ok(http_body::Frame::data(d))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> http_body::SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                http_body::SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(kind: RejectionKind, status: StatusCode) -> Rejection<'static> {
        Rejection {
            kind,
            status,
            retry_after: Some(std::time::Duration::from_millis(250)),
            decision: None,
            policy: None,
            protocol: crate::response::Protocol::Grpc,
            cost: None,
            outer: false,
        }
    }

    #[test]
    fn every_rejection_kind_maps_to_its_grpc_status() {
        use RejectionKind::*;
        let cases = [
            (RateLimited, StatusCode::TOO_MANY_REQUESTS, 8),
            (CostExceedsBurst, StatusCode::TOO_MANY_REQUESTS, 8),
            (QueueFull, StatusCode::TOO_MANY_REQUESTS, 8),
            (Concurrency, StatusCode::TOO_MANY_REQUESTS, 8),
            (Concurrency, StatusCode::SERVICE_UNAVAILABLE, 14),
            (QueueFull, StatusCode::SERVICE_UNAVAILABLE, 14),
            (StoreUnavailable, StatusCode::SERVICE_UNAVAILABLE, 14),
            (MissingKey, StatusCode::BAD_REQUEST, 3),
            (MissingKey, StatusCode::UNAUTHORIZED, 16),
            (MissingKey, StatusCode::FORBIDDEN, 7),
            (MissingKey, StatusCode::IM_A_TEAPOT, 2),
        ];
        for (kind, status, want) in cases {
            assert_eq!(code(&rejection(kind, status)), want, "{kind:?} {status}");
        }
    }

    #[test]
    fn store_down_fail_closed_is_a_trailers_only_unavailable_with_pushback() {
        let r = rejection(
            RejectionKind::StoreUnavailable,
            StatusCode::SERVICE_UNAVAILABLE,
        );
        let resp = r.default_response();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.body().is_empty());
        let h = resp.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h[GRPC_STATUS], "14");
        assert_eq!(h[GRPC_MESSAGE], "rate limit store unavailable");
        assert_eq!(h[GRPC_RETRY_PUSHBACK_MS], "250");
        assert_eq!(h[RETRY_AFTER], "1");
    }

    #[test]
    fn http_protocol_keeps_the_plain_http_response() {
        let mut r = rejection(RejectionKind::RateLimited, StatusCode::TOO_MANY_REQUESTS);
        r.protocol = crate::response::Protocol::Http;
        let resp = r.default_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!resp.headers().contains_key(GRPC_STATUS));
        assert_eq!(resp.body(), "Too Many Requests\n");
    }

    #[test]
    fn pushback_rounds_up_to_the_millisecond() {
        use std::time::Duration;
        assert_eq!(pushback_value(Duration::ZERO), "0");
        assert_eq!(pushback_value(Duration::from_nanos(1)), "1");
        assert_eq!(pushback_value(Duration::from_millis(250)), "250");
        assert_eq!(pushback_value(Duration::from_micros(250_001)), "251");
        assert_eq!(
            pushback_value(Duration::from_millis(2_147_483_647)),
            "2147483647"
        );
        assert_eq!(
            pushback_value(Duration::from_millis(2_147_483_648)),
            "2147483647"
        );
        assert_eq!(pushback_value(Duration::MAX), "2147483647");
    }
}
