//! GCRA rate limiting for HTTP services.
//!
//! [`RateLimitLayer`] decides each request against the quotas of its key's policy before the
//! inner service sees it:
//!
//! * **Admitted:** the request goes on, carrying the [`Decision`](crate::Decision) in its
//!   extensions (axum handlers can take it as an extractor), and the response gets
//!   `RateLimit-Policy` and `RateLimit` header fields.
//! * **Rejected:** the client gets `429 Too Many Requests` at once, with the same fields and,
//!   when waiting helps, `Retry-After` (whole seconds, rounded up; none for a request that
//!   costs more than a quota's burst); the inner service is not called.
//! * **No key:** see [`MissingKey`].
//!
//! One layer value is one shared state: its clones, and every service it wraps, count against
//! the same limits (tower's `RateLimitLayer` gives each service its own).
//!
//! Two limits on one handler go in one `layer` call, as a tuple (the first layer sees the
//! request first): chained, `post(login).layer(a).layer(b)` fails to compile with E0283
//! ("cannot infer type of the type parameter `NewError`"), because axum's
//! `MethodRouter::layer` leaves the error type between the two calls open.
//!
//! ```
//! use axum::{routing::post, Router};
//! use tollgate::{key, Quota, RateLimitLayer};
//!
//! let per_ip = RateLimitLayer::new(Quota::per_second(10)).key(key::PeerIp::new());
//! let login_limit = RateLimitLayer::new(Quota::per_minute(5)).key(key::PeerIp::new());
//! let app: Router = Router::new()
//!     .route("/login", post(|| async { "welcome" }).layer((per_ip, login_limit)));
//! ```
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
mod service;
mod shared;
pub(crate) mod store;

pub use crate::key::MissingKey;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use policy::Policy;
pub use service::RateLimit;
pub use store::{Answer, Backend, Handover, Memory, Never, Refunding};
