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
//! use tollgate::{key, MissingKey, Quota, RateLimitLayer};
//!
//! async fn login() -> &'static str { "welcome" }
//! async fn items() -> &'static str { "[]" }
//!
//! let api = Router::new()
//!     .route("/items", get(items))
//!     // The API's routes only: unknown paths stay 404, /login is not under it.
//!     .route_layer(
//!         RateLimitLayer::new(Quota::per_second(100).burst(200))
//!             .key(key::Header::new("x-api-key"))
//!             .on_missing_key(MissingKey::reject(401)),
//!     );
//! let app: Router = Router::new()
//!     // PeerIp: serve with `into_make_service_with_connect_info::<SocketAddr>()`, or every
//!     // request gets the missing-key answer (400).
//!     .route("/login", post(login).layer(RateLimitLayer::new(Quota::per_minute(5)).key(key::PeerIp)))
//!     .nest("/api", api);
//! ```
//!
//! Where the layer goes decides what it covers: `MethodRouter::layer` one route,
//! `Router::route_layer` the routes added before it (unknown paths stay `404`),
//! `Router::layer` every request, unknown paths too.

mod future;
mod layer;
mod policy;
#[cfg(feature = "redis")]
mod redis;
mod service;

pub use crate::key::MissingKey;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use policy::Policy;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisRateLimit, RedisResponseFuture};
pub use service::RateLimit;
