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
//! One string key per limiter key, `<prefix><scope length>:<scope>:<key>`, holding the
//! theoretical arrival time of each quota in microseconds, separated by spaces, e.g.
//! `tollgate:7:per-key:abc` → `"1732290000123456"`. The scope is the policy's name when it was
//! given (`Policy::new`, `.name(..)`), else the name derived from its first quota (its rate,
//! or its name for the header fields) with a digest of its quotas and key extractor
//! (`3-per-1m#5c0f9a1b2e47`; see [Keys](RedisRateLimiter#keys)). A key whose bytes have a `{` is written
//! after `{}` (`tollgate:7:per-key:{}{abc}`), so that no client can pick a Redis Cluster slot
//! with a hash tag (see [`RedisKey`]). It expires when the key is back to its
//! full burst, so idle keys cost Redis nothing (a live change under which requests count
//! longer lengthens every key's expiry: see
//! [`set_quotas`](RedisRateLimiter::set_quotas)). Two layers (or limiters) that share a store
//! prefix and a policy name given on purpose share their limits; unnamed ones share only with
//! the same layer in other processes.
//!
//! # Outages
//! Each decision waits at most the store's timeout. On a timeout or a connection error the
//! [`FailMode`] decides (an error about one key is not an outage: see
//! [`RedisRateLimiter`]): fail open admits the request (the decision [`is_degraded`](crate::Decision::is_degraded),
//! and no `RateLimit` fields are sent), fail closed answers `503` with `Retry-After: 1`, and
//! the local fallback ([`FailMode::try_local`]) decides in this process on each quota scaled to a
//! share, a real decision ([`is_local`](crate::Decision::is_local)) answered with its
//! `RateLimit` fields, or `429` and `Retry-After`. The connection is re-established in the
//! background; decisions go back to Redis as soon as it answers, from the state it kept.
//! Logs (`tracing`, target `tollgate::redis`): the first error (saying which policy decides),
//! then at most one line per 10 s counting the errors, then one line when Redis is back.
//!
//! ```no_run
//! use tollgate::redis::{FailMode, RedisStore};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Four instances: during an outage each decides alone, on a quarter of every quota.
//! let store = RedisStore::connect("redis://127.0.0.1:6379")
//!     .await?
//!     .on_failure(FailMode::try_local(0.25)?);
//! # let _ = store; Ok(()) }
//! ```

mod ban;
mod decide;
mod deny;
mod expiry;
mod fallback;
mod key;
mod layer;
mod lease;
mod limiter;
mod outage;
mod script;
mod store;

pub use key::RedisKey;
pub use lease::Lease;
pub use limiter::{RedisRateLimiter, RedisRateLimiterBuilder};
pub use store::{
    FailMode, RedisStore, Share, DEFAULT_DENY_CACHE, DEFAULT_DENY_CACHE_MAX_AGE, DEFAULT_PREFIX,
    DEFAULT_TIMEOUT, MAX_PROBE_INTERVAL,
};
