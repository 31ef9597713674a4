//! [`Quota`]: how many requests, per how long, with how much burst.

use std::borrow::Cow;
use std::time::Duration;

use crate::error::ConfigError;
use crate::gcra::Gcra;

/// `count` requests per `period`, with a `burst`: the number of requests an idle key may send
/// back to back.
///
/// The emission interval is `T = period / count` (rounded up to the nanosecond, so the rate is
/// never exceeded); a key that has been idle may send `burst` requests at once, after which it
/// earns one request back every `T`. Unless set, `burst` equals `count`.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// // 100 requests per second, up to 200 at once after idle.
/// let api = Quota::per_second(100).burst(200);
/// assert_eq!(api.emission_interval(), Duration::from_millis(10));
///
/// // 5 requests per minute: one every 12 s, 5 at once after idle.
/// let login = Quota::per_minute(5);
/// assert_eq!(login.burst_size(), 5);
///
/// // From configuration: errors instead of panics.
/// assert!(Quota::try_new(0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    count: u32,
    period: Duration,
    burst: u32,
    name: Option<Cow<'static, str>>,
}

impl Quota {
    /// `count` requests per `period`, burst `count`.
    ///
    /// # Panics
    /// When `count` or `period` is zero, or the rate is finer than 1 ns; use [`Quota::try_new`]
    /// for values that come from configuration.
    #[track_caller]
    #[must_use]
    pub fn new(count: u32, period: Duration) -> Self {
        match Self::try_new(count, period) {
            Ok(q) => q,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// `count` requests per `period`, burst `count`, or the reason it cannot work.
    pub fn try_new(count: u32, period: Duration) -> Result<Self, ConfigError> {
        let q = Quota {
            count,
            period,
            burst: count,
            name: None,
        };
        q.validate()?;
        Ok(q)
    }

    /// `n` requests per second (a rate, not an interval), burst `n`.
    ///
    /// # Panics
    /// When `n` is zero or above 1 000 000 000.
    #[track_caller]
    #[must_use]
    pub fn per_second(n: u32) -> Self {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` requests per minute, burst `n`.
    ///
    /// # Panics
    /// When `n` is zero.
    #[track_caller]
    #[must_use]
    pub fn per_minute(n: u32) -> Self {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` requests per hour, burst `n`.
    ///
    /// # Panics
    /// When `n` is zero.
    #[track_caller]
    #[must_use]
    pub fn per_hour(n: u32) -> Self {
        Self::new(n, Duration::from_secs(3600))
    }

    /// `n` requests per day, burst `n`.
    ///
    /// # Panics
    /// When `n` is zero.
    #[track_caller]
    #[must_use]
    pub fn per_day(n: u32) -> Self {
        Self::new(n, Duration::from_secs(86_400))
    }

    /// Sets how many requests an idle key may send back to back.
    ///
    /// # Panics
    /// When `burst` is zero or the tolerance `burst × T` overflows; see [`Quota::try_burst`].
    #[track_caller]
    #[must_use]
    pub fn burst(self, burst: u32) -> Self {
        match self.try_burst(burst) {
            Ok(q) => q,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Sets the burst, or returns why it cannot work.
    pub fn try_burst(mut self, burst: u32) -> Result<Self, ConfigError> {
        self.burst = burst;
        self.validate()?;
        Ok(self)
    }

    /// Names this quota in the `RateLimit-Policy` and `RateLimit` header fields.
    ///
    /// Without a name, a quota takes the name of the layer's policy (suffixed with its position
    /// when the policy has several quotas).
    ///
    /// # Panics
    /// When the name is empty, longer than [`MAX_NAME_LEN`](crate::headers::MAX_NAME_LEN)
    /// bytes, not printable ASCII, or contains `"` or `\`; use [`Quota::try_named`] for names
    /// that come from configuration.
    #[track_caller]
    #[must_use]
    pub fn named(self, name: impl Into<Cow<'static, str>>) -> Self {
        match self.try_named(name) {
            Ok(q) => q,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Names this quota, or returns why the name cannot appear in a header
    /// ([`ConfigError::InvalidName`], [`ConfigError::NameTooLong`]).
    ///
    /// ```
    /// use tollgate::{ConfigError, Quota};
    /// assert!(Quota::per_second(5).try_named("per-ip").is_ok());
    /// assert_eq!(
    ///     Quota::per_second(5).try_named("x".repeat(65)),
    ///     Err(ConfigError::NameTooLong { len: 65, max: 64 })
    /// );
    /// ```
    pub fn try_named(mut self, name: impl Into<Cow<'static, str>>) -> Result<Self, ConfigError> {
        let name = name.into();
        crate::headers::check_name(&name)?;
        self.name = Some(name);
        Ok(self)
    }

    /// The number of requests per period.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The number of requests an idle key may send at once.
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The name given with [`Quota::named`], if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `T = period / count`, rounded up to the nanosecond.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.gcra().interval)
    }

    /// How long an idle key takes to earn its whole burst back after spending it: `burst × T`.
    pub fn burst_period(&self) -> Duration {
        Duration::from_nanos(self.gcra().tolerance)
    }

    pub(crate) fn gcra(&self) -> Gcra {
        // Validated at construction: these cannot fail here.
        let period = self.period.as_nanos();
        let count = u128::from(self.count.max(1));
        let interval = period.div_ceil(count) as u64;
        Gcra::new(interval, interval.saturating_mul(u64::from(self.burst)))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(ConfigError::ZeroCount);
        }
        if self.period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        if self.burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let period = self.period.as_nanos();
        if period < u128::from(self.count) {
            return Err(ConfigError::RateTooHigh {
                count: self.count,
                period: self.period,
            });
        }
        let interval = period.div_ceil(u128::from(self.count));
        let tolerance = interval.checked_mul(u128::from(self.burst));
        // Keep head room so that `now + tolerance` cannot overflow for centuries of uptime.
        match tolerance {
            Some(t) if t <= u128::from(u64::MAX / 4) => Ok(()),
            _ => Err(ConfigError::ToleranceTooLong),
        }
    }
}
