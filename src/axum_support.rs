//! axum extractors.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use http::request::Parts;
use http::StatusCode;

use crate::gcra::Decision;

/// A handler behind a [`RateLimitLayer`](crate::RateLimitLayer) can take the decision that
/// admitted its request. Outside such a layer the extraction fails with a 500 that says so;
/// take `Option<Decision>` where the layer is optional.
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

#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for Decision {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Decision>().copied())
    }
}
