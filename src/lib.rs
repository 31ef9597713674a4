//! Tower layers that protect HTTP services from too much traffic.
//!
//! * [`RateLimitLayer`]: rate limiting with GCRA — an exact burst, a cost per request, several
//!   quotas per key decided all or nothing, tiers, and the IETF `RateLimit` header fields; or
//!   with a fixed window, an exact sliding-window log, a sliding-window counter, or GCRA that
//!   warms up after idleness ([`warmup`]), per quota ([`QuotaKind`]).
//! * [`RateLimiter`]: the same limiter without HTTP, for queue consumers and outbound calls.
//! * [`ShapeLayer`]: traffic shaping — requests wait in a bounded FIFO queue and are forwarded
//!   at a fixed rate; [`PoliteLayer`] and [`Shaper`] do the same for outbound calls and queue
//!   consumers (see [`shape`]).
//! * [`key`]: who a request counts against — peer IP, client IP behind trusted proxies, a
//!   header, the route, a closure, or a tuple of them.
//!
//! * [`ConcurrencyLimitLayer`]: at most `n` requests in flight, globally or per key; reject at
//!   once or wait in a bounded FIFO queue (see [`concurrency`]).
//! * [`MissingKey`]: what every layer does with a request that has no key.
//!
//! # Quick start
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{routing::get, Router};
//! use tollgate::{key, Policy, Quota, RateLimitLayer};
//!
//! # async fn run() -> std::io::Result<()> {
//! // Per client IP: 1 request per second, bursts of 5.
//! let per_ip = RateLimitLayer::new(Policy::new("per-ip", Quota::per_second(1).burst(5)))
//!     .key(key::PeerIp);
//! let app = Router::new().route("/", get(|| async { "hello" }).layer(per_ip));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // PeerIp needs the peer address: serve with ConnectInfo.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! **Serve with `ConnectInfo`.** [`key::PeerIp`](struct@key::PeerIp) (and [`key::ClientIp`], which starts from the
//! peer) reads the client address axum provides only when the app is served with
//! `into_make_service_with_connect_info::<SocketAddr>()`. Served with a plain
//! `axum::serve(listener, app)`, no request has an address and every one gets the missing-key
//! answer: `400 Bad Request` unless [`MissingKey`] says otherwise.
//!
//! # What clients see
//!
//! An admitted request gets its response with
//! `RateLimit-Policy: "per-ip";q=5;w=5` and `RateLimit: "per-ip";r=4;t=1`
//! (draft-ietf-httpapi-ratelimit-headers-10; see [`headers`] for the mapping; a layer without
//! a name is named after its quota, `"1-per-1s"`, see [`Policy`]). A rejected one gets
//! `429 Too Many Requests` at once and the same fields; the inner service never sees it. When
//! waiting helps, the rejection carries `Retry-After` in whole seconds (rounded up, never 0);
//! a request that costs more than a quota's burst can never pass and gets none. The body of
//! every rejection starts with its status's reason phrase; [`response::OnReject`] replaces it.
//!
//! One layer value is one shared state: its clones and every service it wraps (every route of
//! a `Router::layer`) count against the same limits. tower's `RateLimitLayer` and
//! `ConcurrencyLimitLayer` give each wrapped service its own state instead.
//!
//! # Where a layer goes, and stacking
//!
//! `MethodRouter::layer` covers one route with all its methods (a wrong method's `405` is
//! answered inside the layer and spends quota), `MethodRouter::route_layer` only the methods
//! routed (a `405` costs nothing), `Router::route_layer` the routes added before it (an
//! unknown path stays `404`), `Router::layer` every request, unknown paths too. Layers
//! stack: the one added last runs first. Put a rate limit outside a concurrency limit, so a
//! rejected request never takes a permit. Stacked layers are all or nothing: a request an
//! inner layer refuses gives back what the rate limits outside took, since it was not served
//! (see [`rate_limit`]). Several quotas on one key are best given to one layer
//! ([`Policy::quota`]): they are then decided all or nothing. Give stacked layers different
//! names: two `RateLimit-Policy` items of one name cannot be told apart, and are logged at
//! `WARN`.
//!
//! Two layers on one handler go in one `.layer((outer, inner))` (a tuple) or a
//! `ServiceBuilder`: `post(h).layer(a).layer(b)` does not compile with axum (E0283, "cannot
//! infer type ... `NewError`"), for any pair of Tower middlewares that keep the inner error
//! type. See [`rate_limit`] for an example.
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{key, ConcurrencyLimitLayer, MissingKey, Quota, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let api = Router::new()
//!     // At most 4 reports built at once; 8 more may wait up to 2 s, then 503.
//!     .route("/report", get(|| async { "report" })
//!         .layer(ConcurrencyLimitLayer::new(4).queue(8, Duration::from_secs(2))))
//!     .route("/items", get(|| async { "[]" }))
//!     // Outermost, for the routes above only: 10 per second per API key, 401 without one.
//!     .route_layer(RateLimitLayer::new(Quota::per_second(10))
//!         .key(key::Header::new("x-api-key"))
//!         .on_missing_key(MissingKey::reject(401)));
//!
//! let with_key = Request::get("/items").header("x-api-key", "k1").body(Body::empty()).unwrap();
//! assert_eq!(api.clone().oneshot(with_key).await.unwrap().status(), StatusCode::OK);
//! let without = Request::get("/items").body(Body::empty()).unwrap();
//! assert_eq!(api.clone().oneshot(without).await.unwrap().status(), StatusCode::UNAUTHORIZED);
//! let unknown = Request::get("/nope").body(Body::empty()).unwrap();
//! assert_eq!(api.oneshot(unknown).await.unwrap().status(), StatusCode::NOT_FOUND);
//! # }
//! ```
//!
//! Several layers over the same routes are best given as one `tower::ServiceBuilder` in one
//! `Router::layer` (or `route_layer`) call, the first layer of the builder outermost. Each
//! `Router::layer` call wraps the routes in one more boxed service that axum clones for every
//! request, with everything inside it: a rate limit, a shaping layer and a concurrency limit
//! as three `Router::layer` calls cost more than the three layers each alone, and as one
//! `ServiceBuilder` less (instructions per request over bare Axum: 7,435 as one builder,
//! 8,335 for the three each alone, 10,111 as three calls; BENCHMARKS.md, "Three layers in one
//! `ServiceBuilder`").
//!
//! ```
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tollgate::{key, ConcurrencyLimitLayer, Policy, Quota, RateLimitLayer, ShapeLayer};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(
//!     ServiceBuilder::new()
//!         // Outermost: a request it rejects takes no permit and waits in no queue.
//!         .layer(RateLimitLayer::new(Policy::new("api", Quota::per_minute(2))).key(key::Global))
//!         .layer(ShapeLayer::new(Quota::per_second(100)).name("smooth").key(key::Global))
//!         .layer(ConcurrencyLimitLayer::new(64)),
//! );
//! let get = || Request::get("/").body(Body::empty()).unwrap();
//! let first = app.clone().oneshot(get()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::OK);
//! // Both limits' items, the outer layer's last.
//! let policies: Vec<_> = first.headers().get_all("ratelimit-policy").iter().collect();
//! assert_eq!(policies.len(), 2);
//! assert!(policies[1].to_str().unwrap().starts_with("\"api\""));
//! app.clone().oneshot(get()).await.unwrap();
//! let third = app.oneshot(get()).await.unwrap();
//! assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
//! # }
//! ```
//!
//! # Missing keys
//!
//! A request whose key cannot be extracted (no such header, no peer address) is never a panic
//! or a 500: [`MissingKey`] decides. `MissingKey::reject(401)` answers that status (the
//! default is `400`), `MissingKey::UseKey(k)` counts all such requests under one key,
//! `MissingKey::Allow` lets them through unlimited. A layer that never finds a key (a header
//! name misspelt, an IP key served without `ConnectInfo`) logs one `ERROR` naming what it
//! reads: after its first 100 requests, or at once when no request can have a key.
//!
//! # Tiers
//!
//! One layer can hold several [`Policy`]s, chosen per request: VIP API keys get more.
//!
//! ```
//! use axum::{body::Body, routing::get, Router};
//! use tollgate::{key, Clock, Decision, Policy, Quota, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let (clock, _time) = Clock::manual();
//! let limit = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
//!     .tier(Policy::new("vip", Quota::per_second(100)))
//!     .key(key::Header::new("x-api-key"))
//!     .select_tier(|req| {
//!         let api_key = req.headers.get("x-api-key")?;
//!         api_key.as_bytes().starts_with(b"vip_").then_some("vip")
//!     })
//!     .clock(clock);
//! let app = Router::new()
//!     .route("/", get(|d: Decision| async move { d.limit().to_string() }))
//!     .route_layer(limit);
//!
//! for (api_key, limit) in [("vip_ada", "100"), ("bob", "10")] {
//!     let req = http::Request::get("/").header("x-api-key", api_key).body(Body::empty()).unwrap();
//!     let body = app.clone().oneshot(req).await.unwrap().into_body();
//!     let bytes = axum::body::to_bytes(body, 64).await.unwrap();
//!     assert_eq!(bytes, limit);
//! }
//! # }
//! ```
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
//! # Bad settings
//!
//! A setting that cannot work is a [`ConfigError`] that names it, found before any request is
//! served, never a value quietly changed. (A valid setting that never matches, such as a
//! misspelt header name, can only show while serving: that is the one `ERROR` log of
//! [missing keys](#missing-keys).) One rule says where the error comes out:
//!
//! * **Values written in code** use the plain forms: [`Quota::per_second(0)`](Quota::per_second),
//!   [`MissingKey::reject`], [`key::Header::new`], a builder's `build()`. They panic with the
//!   error at *your* line (`#[track_caller]`).
//! * **Values read at run time** use the `try_` forms ([`Quota::try_new`],
//!   [`MissingKey::try_reject`], [`key::Header::try_new`], `try_build()`), which return it.
//! * **Builder methods never panic**: a layer's, and those of a value built in steps and
//!   given to a layer ([`penalty::PenaltyBox`]). A bad value is recorded with the caller's
//!   line; the layer's `validate()` returns the first as a `Result`, and applying a layer that
//!   was not validated panics with it, naming that line. A setting that belongs to another
//!   store does not compile ([`RateLimitLayer::max_keys`] exists only on the memory store).
//! * **Changes while serving** (the handles, [`RateLimiter::set_quotas`]) return a `Result`
//!   and change nothing on error.
//!
//! # Where things are
//!
//! Each public type has one path. The crate root holds the layers, their handles and the
//! values a newcomer writes ([`Quota`], [`Policy`], [`MissingKey`], [`Decision`],
//! [`ConfigError`], [`Clock`]); everything else is in the module of its concept: [`key`]
//! (extractors), [`rate_limit`] (its service and [`settle`](rate_limit::settle)),
//! [`concurrency`] (adaptive limits, priorities), [`shape`], [`penalty`], [`response`],
//! [`headers`], [`observe`], [`settings`], [`store`] (memory or Redis: where a limit's state
//! lives), [`warmup`], [`response::grpc`], and with their features `redis` and `stream`. The same setting has the same name on every layer:
//! `.key`, `.name`, `.on_missing_key`, `.allow_ip`, `.allow_key`, `.on_reject`, `.dry_run`,
//! `.trace_keys`, `.validate`, `.handle`, and for a queue `.queue(max_waiting, max_wait)`.
//!
//! # Features
//!
//! * `axum` (default): `ConnectInfo` peer addresses, `MatchedPath` route keys, and
//!   [`Decision`] as an axum extractor. Without it the crate needs only `http`, `tower` and
//!   `tokio`, and serves any Tower stack.
//! * `redis`: limits shared by many instances, kept in Redis or Redis Cluster
//!   (module `redis`): `RateLimitLayer::store(RedisStore)` and `RedisRateLimiter`.
//! * `tonic`: [`key::PeerIp`](struct@key::PeerIp) reads tonic's `TcpConnectInfo`. gRPC rejections ([`response::grpc`])
//!   need no feature.
//! * `stream`: adapters that rate-limit or shape any `futures::Stream` (module `stream`).
//! * `serde`: `Serialize` / `Deserialize` for [`Quota`], [`Policy`] and the layers' settings
//!   ([`settings`]), durations written as `"1s"` or `"1h30m"`: limits read from a configuration
//!   file and changed while serving through the layers' handles.
//! * `metrics`: every layer and limiter counts its decisions through the `metrics` facade
//!   (see [`observe`] for the series). Tracing events and dry-run mode need no feature.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod algo;
mod clock;
pub mod concurrency;
mod decision;
mod error;
pub mod headers;
pub mod key;
mod keyed;
mod layer;
mod limiter;
pub mod observe;
pub mod penalty;
mod quota;
pub mod rate_limit;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub mod response;
pub mod settings;
pub mod shape;
pub mod store;
#[cfg(feature = "stream")]
pub mod stream;

pub mod warmup {
    //! Warm-up after idleness: a quota that admits `rate / cold_factor` right after a key has
    //! been idle and climbs to its rate over the warm-up period. [`WarmUp`] holds the model
    //! and its formulas; it is set with
    //! [`Quota::warm_up`](crate::Quota::warm_up).
    pub use crate::quota::{WarmUp, MAX_WARM_UP_PERIOD};
}

#[cfg(feature = "axum")]
mod axum_support;

// One public path per type: the types named most are here, the rest in their module.
pub use clock::{Clock, ManualClock};
pub use concurrency::handle::ConcurrencyHandle;
pub use concurrency::layer::ConcurrencyLimitLayer;
pub use decision::{Decision, Decisions, Outcome, QuotaState};
pub use error::ConfigError;
pub use key::missing::MissingKey;
pub use limiter::{InsufficientCapacity, RateLimiter, RateLimiterBuilder};
pub use quota::{Quota, QuotaKind, MAX_QUOTAS};
pub use rate_limit::handle::RateLimitHandle;
pub use rate_limit::layer::RateLimitLayer;
pub use rate_limit::policy::Policy;
pub use shape::handle::ShapeHandle;
pub use shape::layer::ShapeLayer;
pub use shape::polite::PoliteLayer;
pub use shape::shaper::Shaper;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
