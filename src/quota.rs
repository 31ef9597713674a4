//! [`Quota`]: how many requests, per how long, with how much burst.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::algo::warmup::{Curve, WarmGcra};
use crate::algo::{Gcra, Rule, Window};
pub use crate::decision::MAX_QUOTAS;
use crate::error::ConfigError;

/// The algorithm a [`Quota`] decides with. See the crate's README ("Which algorithm") for how
/// they compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum QuotaKind {
    /// GCRA (the default): `burst` at once after idle, then one request every `period / count`.
    /// One word per key. In a window of length `period` it admits up to `burst + count - 1`.
    #[default]
    Gcra,
    /// A counter per window of `period`, opened by the key's first request after the previous
    /// window ended: at most `count` inside one window, up to `2 × count` across the boundary
    /// of two. Two words per key.
    FixedWindow,
    /// The time of every admitted request, kept for `period`: exactly at most `count` in any
    /// window of length `period`. Eight bytes per admitted request still in the window.
    SlidingLog,
    /// The counts of the current and the previous fixed window, the previous one weighted by
    /// how much of it still overlaps the sliding window: an estimate of the sliding log in two
    /// words per key. At most `count` inside one fixed window, and never more than
    /// `2 × count - 1` in any window of length `period` (the estimate assumes the previous
    /// window's requests were spread evenly).
    SlidingWindow,
    /// GCRA whose rate after idleness starts at `rate / cold_factor` and rises to the rate over
    /// a warm-up period (Guava's `SmoothWarmingUp`); see [`Quota::warm_up`]. Two words per key.
    WarmUp,
}

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
///
/// # Kinds
/// Those are GCRA quotas, the default. A quota may instead count requests in windows of
/// `period` ([`QuotaKind`]): [`fixed_window`](Quota::fixed_window),
/// [`sliding_log`](Quota::sliding_log) ("at most `count` in any window", exactly) or
/// [`sliding_window`](Quota::sliding_window) (the two-window counter). Kinds mix in one policy:
///
/// ```
/// use std::time::Duration;
/// use tollgate::{QuotaKind, Quota, RateLimiter};
///
/// // Bursts of 20 at 10 per second, and never more than 1000 in any hour.
/// let limiter = RateLimiter::<u64>::builder(Quota::per_second(10).burst(20))
///     .quota(Quota::sliding_log(1000, Duration::from_secs(3600)))
///     .build();
/// assert_eq!(limiter.quotas()[1].kind(), QuotaKind::SlidingLog);
/// assert_eq!(limiter.check(&7).states()[1].remaining(), 999);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    count: u32,
    period: Duration,
    burst: u32,
    kind: QuotaKind,
    warm_up: Option<WarmUp>,
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
            kind: QuotaKind::Gcra,
            warm_up: None,
            name: None,
        };
        q.validate()?;
        Ok(q)
    }

    /// The most requests a [`sliding_log`](Self::sliding_log) quota may count: its log holds
    /// one time (8 bytes) per request admitted in the window, so a key's log never exceeds
    /// 80 000 bytes. Above that, [`sliding_window`](Self::sliding_window) keeps two words.
    pub const MAX_LOG_COUNT: u32 = 10_000;

    /// At most `count` requests in each fixed window of length `window`.
    ///
    /// A key's window opens with its first admitted request (not on a wall-clock boundary, so
    /// keys do not all reset at once) and closes `window` later; the next request after that
    /// opens a new one. Cheapest of all, but a client that spends `count` at the end of one
    /// window and `count` at the start of the next gets `2 × count` through in little more than
    /// an instant. Headers: `q` is `count`, `r` what is left in the window, `t` the time until
    /// the window closes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, Quota, RateLimiter};
    ///
    /// let (clock, time) = Clock::manual();
    /// let limiter = RateLimiter::<&str>::builder(Quota::fixed_window(3, Duration::from_secs(10)))
    ///     .clock(clock)
    ///     .build();
    /// for _ in 0..3 {
    ///     assert!(limiter.check(&"k").is_allowed());
    /// }
    /// let d = limiter.check(&"k");
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
    /// time.advance(Duration::from_secs(10));
    /// assert_eq!(limiter.check(&"k").remaining(), 2);
    /// ```
    ///
    /// # Panics
    /// When `count` or `window` is zero, or `window` is longer than about 146 years; use
    /// [`Quota::try_fixed_window`] for values from configuration.
    #[track_caller]
    #[must_use]
    pub fn fixed_window(count: u32, window: Duration) -> Self {
        unwrap(Self::try_fixed_window(count, window))
    }

    /// [`Quota::fixed_window`], or the reason it cannot work.
    pub fn try_fixed_window(count: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::window(QuotaKind::FixedWindow, count, window)
    }

    /// At most `count` requests in any window of length `window`, exactly: the sliding-window
    /// log.
    ///
    /// Each key keeps the time of every request it was admitted in the last `window` (a
    /// request of cost `c` counts `c` times), so memory grows with `count`: 8 bytes per
    /// request in the window, and `count` is bounded by [`Quota::MAX_LOG_COUNT`]. A rejected
    /// request may retry when enough of the oldest requests have left the window. Headers: `q`
    /// is `count`, `r` what is left now, `t` the time until the newest request has left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, Quota, RateLimiter};
    ///
    /// let (clock, time) = Clock::manual();
    /// let limiter = RateLimiter::<&str>::builder(Quota::sliding_log(2, Duration::from_secs(10)))
    ///     .clock(clock)
    ///     .build();
    /// assert!(limiter.check(&"k").is_allowed()); // t = 0
    /// time.advance(Duration::from_secs(4));
    /// assert!(limiter.check(&"k").is_allowed()); // t = 4
    /// // The request of t = 0 leaves the window at t = 10.
    /// assert_eq!(limiter.check(&"k").retry_after(), Some(Duration::from_secs(6)));
    /// ```
    ///
    /// # Panics
    /// When `count` or `window` is zero, `count` is above [`Quota::MAX_LOG_COUNT`], or
    /// `window` is longer than about 146 years; use [`Quota::try_sliding_log`] for values from
    /// configuration.
    #[track_caller]
    #[must_use]
    pub fn sliding_log(count: u32, window: Duration) -> Self {
        unwrap(Self::try_sliding_log(count, window))
    }

    /// [`Quota::sliding_log`], or the reason it cannot work.
    pub fn try_sliding_log(count: u32, window: Duration) -> Result<Self, ConfigError> {
        if count > Self::MAX_LOG_COUNT {
            return Err(ConfigError::LogTooLong {
                count,
                max: Self::MAX_LOG_COUNT,
            });
        }
        Self::window(QuotaKind::SlidingLog, count, window)
    }

    /// About `count` requests in any window of length `window`, in two words per key: the
    /// sliding-window counter.
    ///
    /// Time is cut into fixed windows of length `window`, the first opened by the key's first
    /// request. A request is admitted when `cur + cost + prev × (window − elapsed) / window
    /// <= count`, where `cur` is the count of the current fixed window, `prev` that of the one
    /// before, and `elapsed` the time since the current one opened: the previous window's
    /// requests are taken as spread evenly over it. Never more than `count` inside one fixed
    /// window; in any window of length `window` never more than `2 × count - 1` (when the
    /// previous window's requests all came at its very end), and on ordinary traffic within a
    /// few percent of the exact [`sliding_log`](Self::sliding_log) (BENCHMARKS.md has the
    /// measured error). Headers: `q` is `count`, `r` what the estimate leaves now, `t` the time
    /// until both counts have aged out.
    ///
    /// # Panics
    /// When `count` or `window` is zero, or `window` is longer than about 146 years; use
    /// [`Quota::try_sliding_window`] for values from configuration.
    #[track_caller]
    #[must_use]
    pub fn sliding_window(count: u32, window: Duration) -> Self {
        unwrap(Self::try_sliding_window(count, window))
    }

    /// [`Quota::sliding_window`], or the reason it cannot work.
    pub fn try_sliding_window(count: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::window(QuotaKind::SlidingWindow, count, window)
    }

    fn window(kind: QuotaKind, count: u32, window: Duration) -> Result<Self, ConfigError> {
        let q = Quota {
            count,
            period: window,
            burst: count,
            kind,
            warm_up: None,
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

    /// Sets how many requests an idle key may send back to back (default: the quota's count).
    ///
    /// # Panics
    /// When `burst` is zero, the tolerance `burst × T` overflows, or the quota is a window
    /// quota, which has no burst besides its count; see [`Quota::try_burst`].
    #[track_caller]
    #[must_use]
    pub fn burst(self, burst: u32) -> Self {
        match self.try_burst(burst) {
            Ok(q) => q,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Sets the burst, or returns why it cannot work.
    ///
    /// A window quota ([`fixed_window`](Self::fixed_window), [`sliding_log`](Self::sliding_log),
    /// [`sliding_window`](Self::sliding_window)) has no burst besides its count:
    /// [`ConfigError::BurstOnWindow`].
    pub fn try_burst(mut self, burst: u32) -> Result<Self, ConfigError> {
        if !self.is_gcra() {
            return Err(ConfigError::BurstOnWindow);
        }
        self.burst = burst;
        self.validate()?;
        Ok(self)
    }

    /// Makes this GCRA quota warm up after idleness: a key that has been idle is admitted at
    /// `rate / cold_factor` at first, and its rate rises to the quota's over `period` of
    /// steady traffic; left idle, it cools down again over `period`. This is Guava's
    /// `SmoothWarmingUp` (whose cold factor is always 3), for a service whose caches, pools or
    /// JIT need warming before they take the full rate.
    ///
    /// A request is admitted exactly when the plain quota would admit it; what changes is what
    /// it costs: a cold request moves the key's theoretical arrival time further ahead (up to
    /// `cold_factor × T` instead of `T`), so the requests after it wait longer, and a cold key
    /// admits a shorter burst. [`WarmUp`] writes the model out, with Guava's example.
    /// Headers: `q` is the burst, `r` the requests of cost 1 that would really be admitted
    /// now (fewer when cold), `t` the time until the key has no backlog. A cold factor of 1
    /// is the plain quota.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, Quota, RateLimiter};
    ///
    /// // Guava's example: 2 per second, warming up over 3 s, burst 1.
    /// let quota = Quota::per_second(2).burst(1).warm_up(Duration::from_secs(3), 3);
    /// let (clock, time) = Clock::manual();
    /// let limiter = RateLimiter::<&str>::builder(quota).clock(clock).build();
    /// let mut gaps = Vec::new();
    /// for _ in 0..5 {
    ///     let d = limiter.check(&"k");
    ///     let wait = d.retry_after().unwrap_or_default();
    ///     time.advance(wait);
    ///     gaps.push(wait.as_millis());
    ///     if !d.is_allowed() {
    ///         assert!(limiter.check(&"k").is_allowed());
    ///     }
    /// }
    /// // Spaced 1333, 1000, 667, then 500 ms.
    /// assert_eq!(gaps, [0, 1333, 1000, 666, 500]);
    /// ```
    ///
    /// # Panics
    /// When `period` is zero or longer than
    /// [`MAX_WARM_UP_PERIOD`], `cold_factor` is zero, or
    /// the quota is a window quota; use [`Quota::try_warm_up`] for values from configuration.
    #[track_caller]
    #[must_use]
    pub fn warm_up(self, period: Duration, cold_factor: u32) -> Self {
        unwrap(self.try_warm_up(period, cold_factor))
    }

    /// [`Quota::warm_up`], or the reason it cannot work ([`ConfigError::InvalidWarmUpPeriod`],
    /// [`ConfigError::InvalidColdFactor`], or [`ConfigError::WarmUpOnWindow`] for a window
    /// quota).
    pub fn try_warm_up(mut self, period: Duration, cold_factor: u32) -> Result<Self, ConfigError> {
        if !self.is_gcra() {
            return Err(ConfigError::WarmUpOnWindow);
        }
        self.warm_up = Some(WarmUp::try_new(period, cold_factor)?);
        self.kind = QuotaKind::WarmUp;
        Ok(self)
    }

    /// The warm-up set with [`Quota::warm_up`], if any.
    pub fn warm_up_settings(&self) -> Option<WarmUp> {
        self.warm_up
    }

    /// Whether the quota is GCRA, with or without warm-up.
    fn is_gcra(&self) -> bool {
        matches!(self.kind, QuotaKind::Gcra | QuotaKind::WarmUp)
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

    /// The number of requests an idle key may send at once (for a window quota, its count).
    pub fn burst_size(&self) -> u32 {
        self.burst
    }

    /// The algorithm this quota decides with.
    pub fn kind(&self) -> QuotaKind {
        self.kind
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

    /// The quota reduced to what its algorithm needs, in nanoseconds.
    pub(crate) fn rule(&self) -> Rule {
        let window = || Window::new(u64::from(self.count), self.period.as_nanos() as u64);
        match self.kind {
            QuotaKind::Gcra => Rule::Gcra(self.gcra()),
            QuotaKind::FixedWindow => Rule::FixedWindow(window()),
            QuotaKind::SlidingLog => Rule::SlidingLog(window()),
            QuotaKind::SlidingWindow => Rule::SlidingWindow(window()),
            QuotaKind::WarmUp => {
                let g = self.gcra();
                match self.warm_up {
                    Some(w) => Rule::WarmUp(WarmGcra::new(
                        w.curve(g.interval, Duration::from_micros(1)),
                        g.tolerance,
                    )),
                    None => Rule::Gcra(g),
                }
            }
        }
    }

    pub(crate) fn gcra(&self) -> Gcra {
        // Validated at construction: these cannot fail here.
        let period = self.period.as_nanos();
        let count = u128::from(self.count.max(1));
        let interval = period.div_ceil(count) as u64;
        Gcra::new(interval, interval.saturating_mul(u64::from(self.burst)))
    }

    /// This quota at `share` (in `(0, 1]`) of its count and burst, each rounded down and at
    /// least 1; the period, kind, warm-up and name are kept, except that a count below one
    /// stretches the period (at most to the longest a quota can have, over a century). An
    /// error when the result is not a valid quota.
    pub(crate) fn scaled(&self, share: f64) -> Result<Quota, ConfigError> {
        // Under one request per period, one request per a longer period: the rate is never
        // above the share (5 per minute at a tenth: 1 per 2 minutes, not 1 per minute).
        let exact = f64::from(self.count) * share;
        let burst = scale(self.burst, share);
        let period = if exact < 1.0 - 1e-6 && exact > 0.0 {
            let ns = (self.period.as_nanos() as f64 / exact).ceil();
            // One request per that period (`count` becomes 1); at most the longest period
            // the quota can have (over a century), so that a tiny share still builds: `as`
            // saturates.
            let longest = if self.is_gcra() {
                (u64::MAX / 4) / u64::from(burst)
            } else {
                u64::MAX / 4
            };
            Duration::from_nanos((ns as u64).min(longest)).max(self.period)
        } else {
            self.period
        };
        let q = Quota {
            count: scale(self.count, share),
            burst,
            period,
            ..self.clone()
        };
        q.validate()?;
        Ok(q)
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
        if !self.is_gcra() {
            // Keep head room so that `start + 2 × window` cannot overflow for a century.
            return if period <= u128::from(u64::MAX / 4) {
                Ok(())
            } else {
                Err(ConfigError::WindowTooLong)
            };
        }
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

/// `n × share`, rounded down, at least 1 and at most `n`. A product within a millionth of a
/// whole number is that number: `100 × 0.29` is 29, not the 28.999… of the float.
fn scale(n: u32, share: f64) -> u32 {
    let x = f64::from(n) * share;
    let whole = x.round();
    let x = if (x - whole).abs() < 1e-6 {
        whole
    } else {
        x.floor()
    };
    // `as` saturates: NaN is 0, and the clamp keeps the result within 1..=n.
    (x as u32).clamp(1, n.max(1))
}

/// The longest warm-up period: 2^60 ns, about 36 years. Longer ones are refused, so that every
/// product the Redis script computes stays exact.
pub const MAX_WARM_UP_PERIOD: Duration = Duration::from_nanos(1 << 60);

/// How a quota warms up after idleness: over `period`, from `rate / cold_factor` to the
/// quota's rate.
///
/// A service that has been idle (cold caches, cold connection pools, a JIT that has not
/// compiled the hot path yet) cannot take its full rate at once. With [`WarmUp`], a quota
/// admits `rate / cold_factor` right after idleness and climbs to `rate` over the warm-up
/// period, the way Guava's `SmoothWarmingUp` rate limiter (and Sentinel's warm-up control)
/// define it. The same curve spaces out the departures of a [`Shaper`](crate::shape::Shaper)
/// queue (Sentinel's "warm-up with queue").
///
/// # The model
///
/// Write `T` for the quota's emission interval (`period / count`), `W` for the warm-up period
/// and `f` for the cold factor. Each key keeps, besides its theoretical arrival time `tat`, a
/// number of *stored permits*. Stored permits accumulate while the key is idle (`now > tat`)
/// and are spent by requests; the more the key has stored, the colder it is and the more a
/// request costs:
///
/// ```text
///   cost of one
///   request
///     f·T  +                 /      cold
///          |               / |
///          |             /   |     the area of the trapezoid between
///          |           /     |     `threshold` and `max` is W
///       T  +---------/       |
///          |  stable |  warm |
///        0 +---------+-------+---> stored permits
///          0     threshold  max
/// ```
///
/// * `threshold = W / (2T)` permits; `max = threshold + 2W / (T + f·T)` permits.
/// * A permit taken when `x` permits are stored above `threshold` costs
///   `T + x · slope`, with `slope = (f·T − T) / (max − threshold)`. Below the threshold a
///   permit costs `T`, exactly like a request of plain GCRA.
/// * Taking `k` permits from `a` stored above the threshold costs the area under that line:
///   `k·T + slope · (a² − (a − k)²) / 2`. Spending the whole warm zone (from `max` down to
///   `threshold`) costs exactly `W`: a key that is sent requests as fast as it admits them
///   goes from cold to warm in `W`.
/// * An idle key gains `max / W` permits per second (so it goes from warm to fully cold in
///   `W`), up to `max`. A key never seen is fully cold.
///
/// A request of cost `c` at `now` is then decided like GCRA, except for what it costs:
///
/// ```text
/// if tat < now:  stored = min(max, stored + (now − tat) · max / W);  base = now
/// else:          base = tat
/// allow    = base + c·T − now <= tau               (exactly plain GCRA's test)
/// spent    = min(c, stored)                        (only when allowed)
/// new_tat  = base + c·T + slope · (a² − (a − min(a, spent))²) / 2,  a = stored − threshold
/// stored   = stored − spent
/// ```
///
/// A request is admitted exactly when plain GCRA would admit it; the warm-up surcharge moves
/// `tat` further ahead, so the requests *after* it wait longer. That is how Guava charges too
/// (a request pays for the one before it), so with burst 1 the spacing of admitted requests is
/// Guava's `acquire()` wait, request for request. With a larger burst an idle key still admits a
/// short burst, smaller than when warm, since every cold request uses up more of the
/// tolerance.
///
/// With `f = 1` the surcharge is zero: the quota behaves exactly like plain GCRA.
///
/// The `RateLimit` header field reports `r` as the requests of cost 1 that would be admitted
/// one after another now (fewer than the burst while the key is cold) and `t` as the time
/// until the key's backlog is clear (`tat − now`): from then on a request is admitted at
/// once. It is not a time until "full": an idle key grows colder, not fuller.
///
/// # Guava's example
///
/// `RateLimiter.create(2, 3, SECONDS)` (Guava's cold factor is always 3): `T = 0.5 s`,
/// `threshold = 3`, `max = 6` permits, `slope = 1/3 s` per permit. The cost line is at
/// 1.5 s, 1.167 s, 0.833 s and 0.5 s when 6, 5, 4 and 3 permits are stored; a request takes
/// one permit and pays the area of its strip, the mean of the two ends: 1.333 s, 1 s,
/// 0.667 s, then 0.5 s for every later one. Guava's `acquire()` returns these waits
/// (0, 1.333, 1, 0.667, 0.5, …), and so does this crate (the crate's tests pin them to
/// the nanosecond).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tollgate::warmup::WarmUp;
///
/// let w = WarmUp::new(Duration::from_secs(3), 3);
/// assert_eq!(w.cold_factor(), 3);
/// assert!(WarmUp::try_new(Duration::ZERO, 3).is_err());
/// assert!(WarmUp::try_new(Duration::from_secs(3), 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WarmUp {
    period: Duration,
    cold_factor: u32,
}

impl WarmUp {
    /// Warm-up over `period`, starting at `rate / cold_factor`.
    ///
    /// # Panics
    /// When `period` is zero or longer than [`MAX_WARM_UP_PERIOD`], or `cold_factor` is zero;
    /// use [`WarmUp::try_new`] for values from configuration.
    #[track_caller]
    #[must_use]
    pub fn new(period: Duration, cold_factor: u32) -> Self {
        match Self::try_new(period, cold_factor) {
            Ok(w) => w,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Warm-up over `period`, starting at `rate / cold_factor`, or why it cannot work.
    pub fn try_new(period: Duration, cold_factor: u32) -> Result<Self, ConfigError> {
        if period.is_zero() || period > MAX_WARM_UP_PERIOD {
            return Err(ConfigError::InvalidWarmUpPeriod(period));
        }
        if cold_factor == 0 {
            return Err(ConfigError::InvalidColdFactor(cold_factor));
        }
        Ok(WarmUp {
            period,
            cold_factor,
        })
    }

    /// How long a key sent requests as fast as it admits them takes to go from cold to its
    /// full rate (and an idle key from warm to fully cold).
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How much slower than the quota's rate a fully cold key starts.
    pub fn cold_factor(&self) -> u32 {
        self.cold_factor
    }

    /// The curve for emission interval `interval` (ns), computed in units of `unit` (1 µs for
    /// quotas, 1 ns for shapers).
    pub(crate) fn curve(&self, interval: u64, unit: Duration) -> Curve {
        // At most 2^60 ns: validated at construction.
        let period = self.period.as_nanos() as u64;
        Curve::new(interval, period, self.cold_factor, unit.as_nanos() as u64)
    }
}

impl fmt::Display for WarmUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warm-up over {:?} from 1/{} of the rate",
            self.period, self.cold_factor
        )
    }
}

#[track_caller]
fn unwrap(q: Result<Quota, ConfigError>) -> Quota {
    match q {
        Ok(q) => q,
        Err(e) => panic!("tollgate: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rounds_down_keeps_at_least_one_and_ignores_float_noise() {
        assert_eq!(scale(100, 0.29), 29);
        assert_eq!(scale(10, 0.3), 3);
        assert_eq!(scale(10, 0.25), 2);
        assert_eq!(scale(3, 0.5), 1);
        assert_eq!(scale(1, 0.001), 1);
        assert_eq!(scale(u32::MAX, 1.0), u32::MAX);
        assert_eq!(scale(u32::MAX, 0.5), u32::MAX / 2);
        assert_eq!(scale(7, 1.0), 7);
    }

    #[test]
    fn a_quota_scaled_below_one_per_period_stretches_its_period_instead() {
        // 5 per minute at a tenth: half a request per minute, so one per two minutes.
        let s = Quota::per_minute(5).scaled(0.1).unwrap();
        assert_eq!((s.count(), s.burst_size()), (1, 1));
        assert_eq!(s.period(), Duration::from_secs(120));
        let w = Quota::sliding_log(3, Duration::from_secs(60))
            .scaled(0.25)
            .unwrap();
        assert_eq!((w.count(), w.period()), (1, Duration::from_secs(80)));
        // Exactly one per period keeps the period.
        let one = Quota::per_minute(10).scaled(0.1).unwrap();
        assert_eq!((one.count(), one.period()), (1, Duration::from_secs(60)));
    }

    #[test]
    fn a_scaled_quota_keeps_its_period_kind_warm_up_and_name() {
        let q = Quota::per_second(10)
            .burst(20)
            .warm_up(Duration::from_secs(3), 3)
            .named("api");
        let s = q.scaled(0.25).unwrap();
        assert_eq!((s.count(), s.burst_size()), (2, 5));
        assert_eq!(s.period(), q.period());
        assert_eq!(s.kind(), QuotaKind::WarmUp);
        assert_eq!(s.warm_up_settings(), q.warm_up_settings());
        assert_eq!(s.name(), Some("api"));
        let w = Quota::sliding_log(9, Duration::from_secs(60))
            .scaled(0.5)
            .unwrap();
        assert_eq!(
            (w.count(), w.burst_size(), w.kind()),
            (4, 4, QuotaKind::SlidingLog)
        );
    }

    #[test]
    fn the_warm_up_period_error_names_the_longest_period_allowed() {
        let e = WarmUp::try_new(Duration::ZERO, 3).unwrap_err().to_string();
        assert!(e.ends_with(&format!("{MAX_WARM_UP_PERIOD:?}")), "{e}");
    }

    #[test]
    fn validation_refuses_what_cannot_work() {
        assert!(WarmUp::try_new(Duration::ZERO, 3).is_err());
        assert!(WarmUp::try_new(Duration::from_secs(1), 0).is_err());
        assert!(WarmUp::try_new(MAX_WARM_UP_PERIOD, 1).is_ok());
        assert!(WarmUp::try_new(MAX_WARM_UP_PERIOD + Duration::from_nanos(1), 1).is_err());
    }
}
