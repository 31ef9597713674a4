//! GCRA rate limiting for HTTP services.
//!
//! [`RateLimitLayer`] decides each request against the quotas of its key's policy before the
//! inner service sees it:
//!
//! * **Admitted:** the request goes on, carrying the [`Decision`](crate::Decision) in its
//!   extensions (axum handlers can take it as an extractor), and the response gets
//!   `RateLimit-Policy` and `RateLimit` header fields.
//! * **Rejected:** the client gets `429 Too Many Requests` at once, with `Retry-After` (whole
//!   seconds, rounded up) and the same fields; the inner service is not called.
//! * **No key:** see [`MissingKey`].
//!
//! ```
//! use axum::{routing::{get, post}, Router};
//! use tollgate::{key, Quota, RateLimitLayer};
//!
//! async fn login() -> &'static str { "welcome" }
//! async fn items() -> &'static str { "[]" }
//!
//! let app: Router = Router::new()
//!     .route("/login", post(login).layer(RateLimitLayer::new(Quota::per_minute(5)).key(key::PeerIp::new())))
//!     .route("/api/items", get(items))
//!     .layer(RateLimitLayer::new(Quota::per_second(100).burst(200)).key(key::Header::new("x-api-key")));
//! ```

mod future;
mod layer;
pub(crate) mod policy;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod shared;

pub use crate::key::MissingKey;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use policy::Policy;
#[cfg(feature = "redis")]
pub use redis::{RedisRateLimit, RedisResponseFuture};
pub use service::RateLimit;
