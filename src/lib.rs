//! Tower layers that protect HTTP services from too much traffic.
//!
//! * [`RateLimitLayer`]: rate limiting with GCRA — an exact burst, a cost per request, several
//!   quotas per key decided all or nothing, tiers, and the IETF `RateLimit` header fields.
//! * [`RateLimiter`]: the same limiter without HTTP, for queue consumers and outbound calls.
//! * [`ShapeLayer`]: traffic shaping — requests wait in a bounded FIFO queue and are forwarded
//!   at a fixed rate; [`PoliteLayer`] and [`Shaper`] do the same for outbound calls and queue
//!   consumers (see [`shape`]).
//! * [`key`]: who a request counts against — peer IP, client IP behind trusted proxies, a
//!   header, the route, a closure, or a tuple of them.
//!
//! # Quick start
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key, Quota, RateLimitLayer};
//!
//! # async fn run() -> std::io::Result<()> {
//! // Per client IP: 1 request per second, bursts of 5.
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(Quota::per_second(1).burst(5)).key(key::PeerIp::new()));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // PeerIp needs the peer address: serve with ConnectInfo.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! # What clients see
//!
//! An admitted request gets its response with
//! `RateLimit-Policy: "1-per-1s";q=5;w=5` and `RateLimit: "1-per-1s";r=4;t=1`
//! (draft-ietf-httpapi-ratelimit-headers-10; see [`headers`] for the mapping; a layer without
//! a name is named after its quota, see [`Policy`]). A rejected one gets
//! `429 Too Many Requests` at once and the same fields; the inner service never sees it. When
//! waiting helps, the rejection carries `Retry-After` in whole seconds (rounded up, never 0);
//! a request that costs more than a quota's burst can never pass and gets none.
//!
//! One layer value is one shared state: its clones and every service it wraps (every route of
//! a `Router::layer`) count against the same limits. tower's `RateLimitLayer` and
//! `ConcurrencyLimitLayer` give each wrapped service its own state instead.
//!
//! Two layers on one handler go in one `.layer((outer, inner))` (a tuple) or a
//! `ServiceBuilder`: `post(h).layer(a).layer(b)` does not compile with axum (E0283, "cannot
//! infer type ... `NewError`"), for any pair of Tower middlewares that keep the inner error
//! type. See [`rate_limit`] for an example.
//!
//! # Semantics
//!
//! A [`Quota`] is `count` requests per `period` with a `burst`. The emission interval is
//! `T = period / count`; an idle key may send exactly `burst` requests back to back, then one per
//! `T`. Note for users of redis-cell or nginx `limit_req`: those admit `burst + 1` at once;
//! here `burst` means the number admitted, so `Quota::per_second(10).burst(5)` admits five
//! requests at t=0 and rejects the sixth.
//!
//! ```
//! use tollgate::{Clock, Quota, RateLimiter};
//!
//! let (clock, _time) = Clock::manual();
//! let limiter = RateLimiter::<&str>::builder(Quota::per_second(10).burst(5)).clock(clock).build();
//! let admitted = (0..6).filter(|_| limiter.check(&"alice").is_allowed()).count();
//! assert_eq!(admitted, 5);
//! ```
//!
//! # Features
//!
//! * `axum` (default): `ConnectInfo` peer addresses, `MatchedPath` route keys, and
//!   [`Decision`] as an axum extractor. Without it the crate needs only `http`, `tower` and
//!   `tokio`, and serves any Tower stack.
//! * `redis`: limits shared by many instances, kept in Redis or Redis Cluster
//!   (module `redis`): `RateLimitLayer::store(RedisStore)` and `RedisRateLimiter`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod concurrency;
pub mod error;
pub mod gcra;
pub mod headers;
pub mod key;
mod keyed;
mod layer;
pub mod limiter;
pub mod quota;
pub mod rate_limit;
#[cfg(feature = "redis")]
pub mod redis;
pub mod response;
pub mod shape;
pub mod store;

mod wait;

#[cfg(feature = "axum")]
mod axum_support;

pub use clock::{Clock, ManualClock};
pub use concurrency::ConcurrencyLimitLayer;
pub use error::ConfigError;
pub use gcra::{Decision, Outcome, QuotaState};
pub use limiter::{InsufficientCapacity, RateLimiter, RateLimiterBuilder};
pub use quota::Quota;
pub use rate_limit::{MissingKey, Policy, RateLimitLayer};
pub use shape::{PoliteLayer, ShapeLayer, Shaper};

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
