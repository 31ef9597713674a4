//! tollgate: Tower layers that protect services from too much traffic.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod concurrency;
pub mod error;
pub mod gcra;
pub mod headers;
pub mod key;
pub mod limiter;
pub mod quota;
pub mod rate_limit;
pub mod response;
pub mod store;

#[cfg(feature = "axum")]
mod axum_support;

pub use clock::{Clock, ManualClock};
pub use concurrency::ConcurrencyLimitLayer;
pub use error::ConfigError;
pub use gcra::{Decision, Outcome, QuotaState};
pub use limiter::{InsufficientCapacity, RateLimiter, RateLimiterBuilder};
pub use quota::Quota;
pub use rate_limit::{MissingKey, Policy, RateLimitLayer};
