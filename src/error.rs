//! Configuration errors.
//!
//! Every invalid setting is reported when a quota, limiter or layer is built, never while a
//! request is being served. Each variant names the setting that is wrong.

use std::fmt;
use std::time::Duration;

/// A setting that cannot work, found while building a [`Quota`](crate::Quota), a
/// [`RateLimiter`](crate::RateLimiter) or a layer.
///
/// The panicking constructors (`Quota::per_second(0)`, …) panic with this error's message; the
/// `try_` constructors return it, for values read from configuration at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `count` of a quota was zero: a quota must admit at least one request per period.
    ZeroCount,
    /// `period` of a quota was zero.
    ZeroPeriod,
    /// `burst` of a quota was zero: an idle key must be able to send at least one request.
    ZeroBurst,
    /// `period / count` is shorter than one nanosecond, the resolution of the clock.
    RateTooHigh {
        /// The requested count.
        count: u32,
        /// The requested period.
        period: Duration,
    },
    /// `period / count` is shorter than the resolution of the store's clock (1 µs for Redis,
    /// whose `TIME` counts microseconds).
    RateTooHighForStore {
        /// The requested count.
        count: u32,
        /// The requested period.
        period: Duration,
        /// The store's resolution.
        resolution: Duration,
    },
    /// `burst × period / count` does not fit the clock's range (about 584 years).
    ToleranceTooLong,
    /// A policy was given no quota at all.
    NoQuota,
    /// A policy was given more quotas than one key can be decided on at once.
    TooManyQuotas {
        /// How many were given.
        got: usize,
        /// The most a policy may hold.
        max: usize,
    },
    /// Two tiers of one layer have the same name.
    DuplicateTier(String),
    /// `max_keys` was zero.
    ZeroMaxKeys,
    /// A name used in a header is not a valid structured-field string.
    InvalidName(String),
    /// A name used in a header is longer than
    /// [`MAX_NAME_LEN`](crate::headers::MAX_NAME_LEN) bytes.
    NameTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A header name given to a key extractor is not a valid header name.
    InvalidHeaderName(String),
    /// A gRPC metadata name given to [`key::Metadata`](crate::key::Metadata) is not an ASCII
    /// metadata name: not a valid header name, or a binary (`-bin`) one.
    InvalidMetadataName(String),
    /// A status code given for a rejection is not a client or server error.
    InvalidStatus(u16),
    /// A trusted-proxy entry could not be parsed as an address or CIDR range.
    InvalidProxy(String),
    /// A concurrency limit was zero, or larger than a semaphore can count.
    InvalidConcurrency(usize),
    /// Priority shares were not `0 < sheddable ≤ normal ≤ 1` (the values given).
    InvalidShares(String),
    /// `on_missing_key(MissingKey::UseKey(..))` was set before `.key(..)` changed the key type,
    /// so its key no longer fits: set it after `.key(..)`.
    MissingKeyBeforeKey,
    /// A setting of the memory store (`max_keys`, `on_full`) was given to a layer whose limits
    /// live in Redis, which expires idle keys itself.
    MemoryOnly(&'static str),
    /// A layer whose limits live in Redis has a policy without a name of its own (named after
    /// its quota) and a key extractor that cannot describe its keys (a closure, a mapped key,
    /// an extractor of your own): its Redis keys could meet another limit's. Name the policy
    /// (`Policy::new("login", …)`) or the extractor
    /// ([`KeyExtractorExt::named`](crate::key::KeyExtractorExt::named)).
    UnnamedRedisKeys(String),
    /// Two limiters on one Redis store in this process have no names of their own, the same
    /// quotas and the same keys: they would share their Redis keys, which two layers never do
    /// in memory. Name each policy (`Policy::new("login", …)`), or apply one layer value in
    /// both places to share one limit on purpose.
    SharedRedisKeys(String),
    /// A burst was set on a window quota ([`Quota::fixed_window`](crate::Quota::fixed_window),
    /// [`Quota::sliding_log`](crate::Quota::sliding_log),
    /// [`Quota::sliding_window`](crate::Quota::sliding_window)): its count is its only limit.
    BurstOnWindow,
    /// A window quota's window does not fit the clock's range (about 146 years).
    WindowTooLong,
    /// A sliding-log quota counts more requests than a key's log may hold
    /// ([`Quota::MAX_LOG_COUNT`](crate::Quota::MAX_LOG_COUNT)).
    LogTooLong {
        /// The requested count.
        count: u32,
        /// The most a sliding log may count.
        max: u32,
    },
    /// A sliding-window counter kept in Redis whose `count × window` (in microseconds) reaches
    /// 2^52: the script's numbers are Lua doubles, exact only below 2^53 (for a window of one
    /// day, a count of at most 52 000).
    WindowTooLongForStore {
        /// The requested count.
        count: u32,
        /// The requested window.
        window: Duration,
    },
    /// A change while serving gave a policy a different number of quotas than it was built
    /// with: each new quota replaces the one at its position, whose per-key state it keeps.
    QuotaCountChanged {
        /// How many quotas the policy has.
        was: usize,
        /// How many the change gave.
        got: usize,
    },
    /// A change while serving named a tier (policy) the layer does not have.
    UnknownTier(String),
    /// A change while serving asked for something the layer was not built with (a waiting
    /// queue on a layer that rejects at once, say); the setting named cannot change.
    NotChangeable(&'static str),
    /// A warm-up period was zero or longer than
    /// [`MAX_WARM_UP_PERIOD`](crate::warmup::MAX_WARM_UP_PERIOD).
    InvalidWarmUpPeriod(Duration),
    /// A warm-up cold factor was zero: a cold key runs at `rate / cold_factor`, at least 1.
    InvalidColdFactor(u32),
    /// Warm-up was set on a window quota: only a GCRA quota warms up.
    WarmUpOnWindow,
    /// An allow-list entry could not be parsed as an address or CIDR range.
    InvalidAllowedIp(String),
    /// `allow_key(..)` was called before `.key(..)` changed the key type, so its keys no
    /// longer fit: allow keys after `.key(..)`.
    AllowKeyBeforeKey,
    /// A penalty box setting cannot work; the text says which and why.
    InvalidPenaltyBox(&'static str),
    /// The share of each quota a Redis store's local fallback enforces was not
    /// `0 < share <= 1` (the value given).
    InvalidFallbackShare(String),
    /// A Redis lease setting (`redis::Lease`) is out of range; the text says which.
    InvalidLease(&'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroCount => f.write_str("quota count must be at least 1"),
            ConfigError::ZeroPeriod => f.write_str("quota period must be longer than zero"),
            ConfigError::ZeroBurst => f.write_str("quota burst must be at least 1"),
            ConfigError::RateTooHigh { count, period } => write!(
                f,
                "quota rate {count} per {period:?} is finer than the clock's 1 ns resolution"
            ),
            ConfigError::RateTooHighForStore {
                count,
                period,
                resolution,
            } => write!(
                f,
                "quota rate {count} per {period:?} is finer than the store's {resolution:?} resolution"
            ),
            ConfigError::ToleranceTooLong => {
                f.write_str("quota burst × period / count is longer than the clock can hold")
            }
            ConfigError::NoQuota => f.write_str("a rate-limit policy needs at least one quota"),
            ConfigError::TooManyQuotas { got, max } => {
                write!(
                    f,
                    "a rate-limit policy holds at most {max} quotas (got {got})"
                )
            }
            ConfigError::DuplicateTier(name) => write!(f, "tier {name:?} is defined twice"),
            ConfigError::ZeroMaxKeys => f.write_str("max_keys must be at least 1"),
            ConfigError::InvalidName(name) => write!(
                f,
                "name {name:?} must be printable ASCII without '\"' or '\\\\' to appear in headers"
            ),
            ConfigError::NameTooLong { len, max } => write!(
                f,
                "a name of {len} bytes is too long to appear in headers (at most {max})"
            ),
            ConfigError::InvalidHeaderName(name) => {
                write!(f, "{name:?} is not a valid header name")
            }
            ConfigError::InvalidMetadataName(name) => {
                write!(f, "{name:?} is not an ASCII gRPC metadata name")
            }
            ConfigError::InvalidStatus(code) => {
                write!(f, "rejection status {code} is not a 4xx or 5xx status")
            }
            ConfigError::InvalidProxy(s) => {
                write!(f, "trusted proxy {s:?} is not an IP address or CIDR range")
            }
            ConfigError::InvalidConcurrency(max) => write!(
                f,
                "concurrency limit {max} must be between 1 and {}",
                tokio::sync::Semaphore::MAX_PERMITS
            ),
            ConfigError::InvalidShares(given) => write!(
                f,
                "priority shares must be 0 < sheddable <= normal <= 1 (got {given})"
            ),
            ConfigError::MissingKeyBeforeKey => f.write_str(
                "on_missing_key(MissingKey::UseKey(..)) names a key of the type before .key(..) \
                 changed it: call on_missing_key after key",
            ),
            ConfigError::MemoryOnly(setting) => write!(
                f,
                "{setting} applies to the memory store only; Redis expires idle keys itself"
            ),
            ConfigError::UnnamedRedisKeys(name) => write!(
                f,
                "policy {name:?} lives in Redis without a name of its own, and its key \
                 extractor (a closure, a mapped key or an extractor without `describe`) cannot \
                 say what it keys by, so its Redis keys could meet another limit's: name the \
                 policy (Policy::new(\"login\", quota)) or the extractor (.named(\"tenant\"))"
            ),
            ConfigError::SharedRedisKeys(name) => write!(
                f,
                "two limits {name:?} on one Redis store have no names of their own, the same \
                 quotas and the same key extractor, so they would share their Redis keys: name \
                 each policy (Policy::new(\"login\", quota)), or apply one layer value in both \
                 places to share one limit"
            ),
            ConfigError::BurstOnWindow => f.write_str(
                "a window quota has no burst: its count is the most it admits in a window",
            ),
            ConfigError::WindowTooLong => {
                f.write_str("a quota's window is longer than the clock can hold")
            }
            ConfigError::WindowTooLongForStore { count, window } => write!(
                f,
                "a sliding window of {count} per {window:?} is too large for the store's exact \
                 arithmetic (count × window in microseconds must stay below 2^52)"
            ),
            ConfigError::LogTooLong { count, max } => write!(
                f,
                "a sliding log keeps one time per request: a count of {count} is above the \
                 most it may hold ({max}); use a sliding window counter"
            ),
            ConfigError::QuotaCountChanged { was, got } => write!(
                f,
                "a policy built with {was} quotas can only be given {was} while serving (got {got})"
            ),
            ConfigError::UnknownTier(name) => write!(f, "the layer has no tier named {name:?}"),
            ConfigError::NotChangeable(what) => {
                write!(f, "{what} cannot be changed while serving")
            }
            ConfigError::InvalidWarmUpPeriod(period) => write!(
                f,
                "warm-up period {period:?} must be longer than zero and at most \
                 1152921504.606846976s"
            ),
            ConfigError::InvalidColdFactor(factor) => {
                write!(f, "warm-up cold factor {factor} must be at least 1")
            }
            ConfigError::WarmUpOnWindow => {
                f.write_str("warm-up applies to a GCRA quota, not to a window quota")
            }
            ConfigError::InvalidAllowedIp(s) => {
                write!(f, "allow-list entry {s:?} is not an IP address or CIDR range")
            }
            ConfigError::AllowKeyBeforeKey => f.write_str(
                "allow_key(..) names a key of the type before .key(..) changed it: call \
                 allow_key after key",
            ),
            ConfigError::InvalidPenaltyBox(why) => write!(f, "penalty box: {why}"),
            ConfigError::InvalidFallbackShare(given) => write!(
                f,
                "the local fallback's share of each quota must be above 0 and at most 1 \
                 (got {given})"
            ),
            ConfigError::InvalidLease(why) => write!(f, "lease: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}
