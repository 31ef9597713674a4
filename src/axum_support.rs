//! axum extractors.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use http::request::Parts;
use http::StatusCode;

use crate::decision::{Decision, Decisions};

/// A handler behind a [`RateLimitLayer`](crate::RateLimitLayer) can take the decision that
/// admitted its request (the innermost, when layers are stacked; see [`Decisions`] for all).
///
/// Every request that reaches the handler through a `RateLimitLayer` has one, whatever the
/// client sent: a request the layer let through without deciding (a skip rule,
/// [`MissingKey::Allow`](crate::MissingKey::Allow)) gets a decision that
/// [`is_unlimited`](Decision::is_unlimited). Only a handler that no `RateLimitLayer` wraps at
/// all fails to extract it, with a 500 that says so: a mistake in how the app is assembled,
/// which no request can cause or avoid. Take `Option<Decision>` where the layer is optional.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for Decision {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Decision>().copied().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "no rate-limit decision: the handler is not behind a RateLimitLayer\n",
        ))
    }
}

/// `None` when no [`RateLimitLayer`](crate::RateLimitLayer) wraps the handler.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for Decision {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Decision>().copied())
    }
}

/// Every decision that admitted the request, outermost first; empty when no layer decided it.
/// Never fails.
impl<S: Send + Sync> FromRequestParts<S> for Decisions {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Decisions::from_extensions(&parts.extensions))
    }
}
