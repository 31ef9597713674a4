//! tollgate: Tower layers that protect services from too much traffic.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod error;
pub mod gcra;
pub mod headers;
pub mod key;
pub mod quota;

pub use clock::{Clock, ManualClock};
pub use error::ConfigError;
pub use gcra::{Decision, Outcome, QuotaState};
pub use quota::Quota;
