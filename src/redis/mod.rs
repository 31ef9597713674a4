//! Limits shared by many instances of a service, kept in Redis (feature `redis`).
//!
//! The same semantics as the memory store (exact bursts, costs, several quotas per key decided
//! all or nothing), decided by one Lua script per request, atomically, on the Redis server's
//! clock. Works with a single server and with Redis Cluster (a limiter key is one Redis key).
//!
//! * [`RedisStore`]: the connection (self-reconnecting, multiplexed), the timeout of each
//!   decision (50 ms by default), the [`FailMode`] when Redis does not answer in time, the key
//!   prefix.
//! * [`RedisRateLimiter`]: `check`, `check_n`, `peek`, `until_ready` without HTTP, like
//!   [`RateLimiter`](crate::RateLimiter) but `async`.
//! * With HTTP: [`RateLimitLayer::store`](crate::RateLimitLayer::store) puts a layer's state
//!   in Redis; everything else about the layer (keys, tiers, costs, headers, rejections) stays
//!   the same.
//! * [`RedisKey`]: how a key is written into a Redis key name.
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use tollgate::redis::{FailMode, RedisStore};
//! use tollgate::{key, Policy, Quota, RateLimitLayer};
//!
//! # async fn run() -> Result<(), redis::RedisError> {
//! // Every instance of the service connects to the same Redis: one limit for all of them.
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?.on_failure(FailMode::Open);
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(
//!     RateLimitLayer::new(Policy::new("per-key", Quota::per_second(10).burst(20)))
//!         .key(key::Header::new("x-api-key"))
//!         .store(store),
//! );
//! # let _ = app; Ok(()) }
//! ```
//!
//! # What is stored
//! One string key per limiter key, `<prefix><name length>:<name>:<key>`, holding the
//! theoretical arrival time of each quota in microseconds, separated by spaces, e.g.
//! `tollgate:7:per-key:abc` → `"1732290000123456"`. A key whose bytes have a `{` is written
//! after `{}` (`tollgate:7:per-key:{}{abc}`), so that no client can pick a Redis Cluster slot
//! with a hash tag (see [`RedisKey`]). It expires when the key is back to its
//! full burst, so idle keys cost Redis nothing. Two layers (or limiters) that share a store
//! prefix and a policy name share their limits: name policies (`Policy::new("login", …)`) when
//! several layers use one Redis.
//!
//! # Outages
//! Each decision waits at most the store's timeout. On a timeout or an error the [`FailMode`]
//! decides: fail open admits the request (the decision [`is_degraded`](crate::Decision::is_degraded),
//! and no `RateLimit` fields are sent), fail closed answers `503` with `Retry-After: 1`. The
//! connection is re-established in the background; decisions resume as soon as Redis answers.
//! Logs (`tracing`, target `tollgate::redis`): the first error, then at most one line per 10 s
//! counting the errors, then one line when Redis is back.

mod ban;
mod deny;
mod key;
mod lease;
mod limiter;
mod outage;
mod store;

pub use key::RedisKey;
pub use lease::Lease;
pub use limiter::{RedisRateLimiter, RedisRateLimiterBuilder};
pub use store::{
    FailMode, RedisStore, DEFAULT_DENY_CACHE, DEFAULT_DENY_CACHE_MAX_AGE, DEFAULT_PREFIX,
    DEFAULT_TIMEOUT,
};
