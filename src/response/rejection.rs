//! What a rejection hook is told: why the request was turned away ([`RejectionKind`]), with
//! what status and wait, by which policy, and to whom ([`Protocol`], the request's protocol).
//! How a [`Rejection`] is answered, in HTTP or gRPC, is the parent module's concern.

use std::borrow::Cow;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::StatusCode;

use crate::decision::Decision;
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
        // The few fields of a short request are read in order for less than the name's hash
        // and probe cost; either way the first `content-type` value is the one read.
        let ct = if head.headers.len() <= SCANNED_FIELDS {
            let mut fields = head.headers.iter();
            fields.find(|(n, _)| **n == CONTENT_TYPE).map(|(_, v)| v)
        } else {
            head.headers.get(CONTENT_TYPE)
        };
        match ct {
            Some(ct) if is_grpc_content_type(ct.as_bytes()) => Protocol::Grpc,
            _ => Protocol::Http,
        }
    }
}

/// The most header values a request may have for [`Protocol::of`] to read them in order
/// rather than look `content-type` up.
const SCANNED_FIELDS: usize = 4;

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

/// The getters a [`Rejection`] and a dry-run record
/// ([`DryRunRejection`](crate::observe::DryRunRejection)) share, written once over their
/// `kind`, `status` and `retry_after` fields: what was (or would have been) refused, the
/// same way on both.
macro_rules! rejection_getters {
    () => {
        /// Why the request was turned away.
        pub fn kind(&self) -> $crate::response::rejection::RejectionKind {
            self.kind
        }

        /// The status of the rejection's default response (`429`, `503`, ...).
        pub fn status(&self) -> http::StatusCode {
            self.status
        }

        /// How long the client is told to wait before retrying, if waiting helps.
        pub fn retry_after(&self) -> Option<std::time::Duration> {
            self.retry_after
        }

        /// A short machine-readable code for [`kind`](Self::kind), stable across releases:
        /// `"rate_limited"`, `"cost_exceeds_burst"`, `"missing_key"`, `"concurrency_limited"`,
        /// `"queue_full"`, `"store_unavailable"` or `"banned"`. Put it in a JSON body, a log
        /// line or a metric.
        pub fn reason(&self) -> &'static str {
            self.kind.code()
        }

        /// [`retry_after`](Self::retry_after) in whole seconds as `Retry-After` carries it
        /// (rounded up, at least 1), or `None` when waiting does not help.
        pub fn retry_after_secs(&self) -> Option<u64> {
            self.retry_after
                .map(|d| $crate::headers::ceil_secs(d).clamp(1, $crate::headers::MAX_INTEGER))
        }
    };
}

pub(crate) use rejection_getters;

/// What a rejection hook is told about the request it answers.
#[derive(Debug, Clone, Copy)]
pub struct Rejection<'a> {
    pub(crate) kind: RejectionKind,
    pub(crate) status: StatusCode,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) decision: Option<&'a Decision>,
    pub(crate) policy: Option<&'a str>,
    pub(crate) protocol: Protocol,
    /// The cost of the request a rate limit refused, when a quota of its decision fired: the
    /// quota is found from it ([`quota`](Self::quota)) only when a count or an event takes it,
    /// which a plain rejection never does.
    pub(crate) cost: Option<u32>,
    /// Whether a layer outside decided the request: then the response is marked
    /// (`Rejected`, in the parent module).
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
            cost: None,
            outer: to.outer,
        }
    }

    /// This rejection, made by the rate-limit `decision` of a request of `cost`; `None` when
    /// no quota fired (the store could not be asked).
    #[inline]
    pub(crate) fn decided(self, decision: &'a Decision, cost: Option<u32>) -> Self {
        Rejection {
            decision: Some(decision),
            cost,
            ..self
        }
    }

    /// The quota that fired, for a rate limit's counts and events
    /// ([`observe::fired`](crate::observe::fired)).
    pub(crate) fn quota(&self) -> Option<usize> {
        crate::observe::fired(self.decision?, self.cost?)
    }

    rejection_getters!();

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
    pub(super) fn static_line(&self) -> Option<&'static str> {
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
    pub(super) fn composed(&self) -> String {
        let phrase = self
            .status
            .canonical_reason()
            .unwrap_or(self.status.as_str());
        match self.kind.detail() {
            Some(detail) => format!("{phrase}: {detail}"),
            None => phrase.to_owned(),
        }
    }
}

/// Whether a `content-type` value is gRPC's: `application/grpc`, then the end, `+` or `;`.
#[inline]
pub(crate) fn is_grpc_content_type(ct: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    ct.len() >= GRPC.len()
        && ct[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// Who a rejection answers: the request's protocol, and whether a layer outside already
/// decided the request (a [`RateLimitLayer`](crate::RateLimitLayer) that admitted it records its
/// [`Decision`] in the request's extensions before passing it on). Read once from the request
/// head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Recipient {
    pub(crate) protocol: Protocol,
    /// Only then is the rejection marked (`Rejected`, in the parent module): a mark no layer looks for would cost
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// A request of few fields is read in order, one of more looked up: both answer what
        /// the lookup of the first `content-type` value answers.
        #[test]
        fn the_protocol_read_in_order_is_the_protocol_looked_up(
            fields in proptest::collection::vec((0..5usize, 0..5usize), 0..9),
        ) {
            const NAMES: [&str; 5] = ["content-type", "host", "accept", "grpc-timeout", "x-a"];
            const VALUES: [&str; 5] = [
                "application/grpc",
                "application/json",
                "application/grpc+proto",
                "application/grpc-web",
                "text/plain",
            ];
            let mut req = http::Request::new(());
            for (n, v) in fields {
                let name = http::HeaderName::from_static(NAMES[n]);
                req.headers_mut().append(name, http::HeaderValue::from_static(VALUES[v]));
            }
            let looked_up = match req.headers().get(CONTENT_TYPE) {
                Some(ct) if is_grpc_content_type(ct.as_bytes()) => Protocol::Grpc,
                _ => Protocol::Http,
            };
            prop_assert_eq!(Protocol::of(&RequestHead::new(&req)), looked_up);
        }
    }

    #[test]
    fn grpc_content_types_are_recognised_and_lookalikes_are_not() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "application/grpc;charset=utf-8",
            "Application/GRPC",
        ] {
            assert!(is_grpc_content_type(ct.as_bytes()), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc_content_type(ct.as_bytes()), "{ct}");
        }
    }
}
