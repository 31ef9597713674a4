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
//! # Stacked limits are all or nothing
//!
//! A request that a layer inside rejects gives back what the rate-limit layers outside took
//! from it, as the quotas of one policy already do: with a per-API-key daily quota outside and
//! a per-IP login limit inside, a login rejected by the login limit leaves the daily quota as
//! it was. Every rejection this crate builds ([`RateLimitLayer`],
//! [`ShapeLayer`](crate::ShapeLayer), [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer):
//! rate limited, queue full, concurrency, missing key, store down, the default response or an
//! [`on_reject`](RateLimitLayer::on_reject) hook's) of a request an outer `RateLimitLayer`
//! decided carries a private mark in its response extensions (the outer layer's
//! [`Decision`](crate::Decision) in the request's extensions is how the inner layer knows, so a
//! service in between that replaces the request's extensions loses the give-back); the outer
//! layer that admitted the request sees the mark and gives back the cost it took, for the same
//! key and tier. The mark is never sent to the client
//! (extensions are not part of the response on the wire), and a `429` the handler returns
//! itself has no mark: the request was served, and stays counted.
//!
//! The exact rule, for each quota of the tier, at the time `now` the rejection comes back:
//! the quota's theoretical arrival time (TAT) moves back by `cost` emission intervals, but
//! never before `now`; a TAT already at or before `now` is left as it is (what the request
//! took has already come back on its own). Requests admitted on the same key in between keep
//! their place: the TAT ends where it would be had the rejected request never come. All the
//! quotas move together (under the key's lock in memory; in one script call on Redis, which
//! also updates or drops a cached rejection of the key). A request rejected by an outer layer
//! *because* of the one given back is not admitted after the fact. The `RateLimit` fields the
//! outer layer added report the state when it admitted the request. On Redis, a refund that
//! Redis does not answer within the store's timeout is lost (and logged as an outage); the
//! rejection waits for the refund's round trip before it is returned.
//!
//! [`ShapeLayer`](crate::ShapeLayer) and [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer)
//! as *outer* layers give nothing back, because there is nothing left to give: a concurrency
//! permit is released when the response (here, the rejection) is done anyway, and a shaping
//! delay is time already spent; the shaper's schedule keeps the slot, as a served request's.
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

mod answers;
mod future;
pub(crate) mod handle;
pub(crate) mod layer;
pub(crate) mod policy;
mod service;
pub mod settle;
mod shared;

pub use future::ResponseFuture;
pub use service::RateLimit;
// Public at the crate root; named here by this module's docs.
#[allow(unused_imports)]
pub(crate) use crate::{MissingKey, Policy, RateLimitHandle, RateLimitLayer};
