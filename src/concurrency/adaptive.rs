//! Limit algorithms: how an adaptive concurrency limit moves with the latency it measures.
//!
//! Each algorithm is a plain value fed with one [`Sample`] per completed request (its latency,
//! how many requests were in flight when it started, whether it failed) that answers with the
//! new limit, always between its minimum and maximum. They read no clock and share nothing:
//! the layer ([`ConcurrencyLimitLayer::adaptive`](super::ConcurrencyLimitLayer::adaptive))
//! measures and applies, the algorithm only decides, so the same numbers always give the same
//! limits.
//!
//! * [`Aimd`]: additive increase, multiplicative decrease on failures or on latency over a
//!   threshold you give it. Simple and predictable; needs to be told what "too slow" is.
//! * [`Gradient2`]: compares the latency of each request with a long-term average of the
//!   latency and shrinks the limit when they drift apart, as Netflix's `Gradient2Limit`; plus a
//!   periodic re-measurement of the no-load latency at a low limit, as Envoy's adaptive
//!   concurrency filter does. Finds "too slow" itself.
//! * [`Vegas`]: estimates how many requests wait in the service's queue from the latency and
//!   the no-load latency, and keeps that queue between two small bounds, as Netflix's
//!   `VegasLimit` (after TCP Vegas). Moves by a few requests per round trip.
//!
//! References:
//! * Netflix concurrency-limits, `AIMDLimit`, `Gradient2Limit` and `VegasLimit`:
//!   <https://github.com/Netflix/concurrency-limits>
//! * L. Brakmo, L. Peterson, *TCP Vegas: End to End Congestion Avoidance on a Global
//!   Internet*, IEEE JSAC 13(8), 1995.
//! * Envoy, adaptive concurrency filter (gradient controller, minRTT calculation):
//!   <https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/adaptive_concurrency_filter>

use std::fmt;
use std::time::Duration;

/// One completed request, as a [`LimitAlgorithm`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When the request completed, as time since the limit was created.
    pub at: Duration,
    /// How long it held its place: from taking the permit to the end of its response body.
    pub rtt: Duration,
    /// Requests in flight when it took its permit, itself included.
    pub in_flight: usize,
    /// Whether it failed in a way that says the service is overloaded: the inner service
    /// returned an error, answered `503` or `504`, or the response body failed.
    pub dropped: bool,
}

/// How an adaptive limit moves. Implemented by [`Aimd`] and [`Gradient2`]; a type of your own
/// may implement it too.
pub trait LimitAlgorithm: Send + 'static {
    /// The limit to start with.
    fn initial_limit(&self) -> usize;

    /// The smallest and largest limits it may answer (inclusive).
    fn bounds(&self) -> (usize, usize);

    /// Takes one completed request into account and answers the new limit, within
    /// [`bounds`](Self::bounds).
    fn update(&mut self, sample: Sample) -> usize;
}

fn clamp_limit(limit: f64, (min, max): (usize, usize)) -> f64 {
    limit.clamp(min as f64, max as f64)
}

fn to_limit(limit: f64) -> usize {
    // Already within bounds (at most `Semaphore::MAX_PERMITS`), finite and positive.
    limit.round() as usize
}

/// Gathers samples into windows of one round trip: a window closes with the first sample of
/// a request that started after the window opened, and the algorithm sees the window as one
/// sample (average latency, most requests in flight, dropped if any was). A limit that moved
/// is thus judged by requests that ran under it, once, as TCP's congestion window is; and the
/// pace of updates follows the latency, not the request rate.
#[derive(Clone, Debug, Default)]
struct Window {
    open: Option<Duration>,
    count: u32,
    rtt_sum: f64,
    in_flight: usize,
    dropped: bool,
}

impl Window {
    fn push(&mut self, s: &Sample) -> Option<Sample> {
        self.count += 1;
        self.rtt_sum += s.rtt.as_secs_f64();
        self.in_flight = self.in_flight.max(s.in_flight);
        self.dropped |= s.dropped;
        let start = s.at.saturating_sub(s.rtt);
        if self.open.is_some_and(|open| start < open) {
            return None;
        }
        let window = Sample {
            at: s.at,
            rtt: Duration::from_secs_f64(self.rtt_sum / f64::from(self.count)),
            in_flight: self.in_flight,
            dropped: self.dropped,
        };
        *self = Window {
            open: Some(s.at),
            ..Window::default()
        };
        Some(window)
    }

    fn restart(&mut self, at: Duration) {
        *self = Window {
            open: Some(at),
            ..Window::default()
        };
    }
}

/// The periodic measurement of the no-load latency (as the minRTT calculation of Envoy's
/// adaptive concurrency filter): the limit is held at its minimum until `samples` requests
/// that started with no more than the minimum in flight have completed; the lowest of their
/// latencies is the no-load latency.
#[derive(Clone, Debug)]
struct NoLoadProbe {
    interval: Duration,
    samples: u32,
    next: Option<Duration>,
    running: Option<Probe>,
}

#[derive(Clone, Debug)]
struct Probe {
    /// The limit to return to.
    resume: f64,
    samples: u32,
    min_rtt: f64,
}

impl NoLoadProbe {
    fn new(interval: Duration, samples: u32) -> Self {
        NoLoadProbe {
            interval,
            samples: samples.max(1),
            next: None,
            running: None,
        }
    }

    fn running(&self) -> bool {
        self.running.is_some()
    }

    /// The warm-up is over: measure now (unless the probe is off).
    fn due_now(&mut self, at: Duration) {
        if self.interval != Duration::MAX {
            self.next = Some(at);
        }
    }

    /// Starts a measurement if one is due at `at`, to return to `resume` afterwards.
    fn start_if_due(&mut self, at: Duration, resume: f64) -> bool {
        if self.running.is_some() || !self.next.is_some_and(|next| at >= next) {
            return false;
        }
        self.running = Some(Probe {
            resume,
            samples: 0,
            min_rtt: f64::INFINITY,
        });
        true
    }

    /// Feeds a completed request to the running measurement. When it is complete: the
    /// no-load latency (seconds) and the limit to return to; the next one is scheduled.
    fn feed(&mut self, s: &Sample, min_limit: usize) -> Option<(f64, f64)> {
        let p = self.running.as_mut()?;
        // Only requests that started when the limit was already down measure the no-load
        // latency.
        if s.in_flight <= min_limit && !s.dropped {
            p.samples += 1;
            p.min_rtt = p.min_rtt.min(s.rtt.as_secs_f64());
        }
        if p.samples < self.samples {
            return None;
        }
        let done = (p.min_rtt, p.resume);
        self.running = None;
        self.next = s.at.checked_add(self.interval);
        Some(done)
    }
}

/// How often the no-load latency is measured again by default, and from how many requests.
const PROBE_INTERVAL: Duration = Duration::from_secs(30);
const PROBE_SAMPLES: u32 = 20;

/// Sets bounds, keeping `min <= max` and both at least 1.
fn bounds(min: usize, max: usize) -> (usize, usize) {
    let min = min.max(1);
    (min, max.max(min))
}

/// A smoothing factor within `[0.01, 1]`, `default` for NaN.
fn smoothing_or(smoothing: f64, default: f64) -> f64 {
    if smoothing.is_nan() {
        default
    } else {
        smoothing.clamp(0.01, 1.0)
    }
}

/// What the algorithms that measure the no-load latency ([`Gradient2`], [`Vegas`]) share:
/// the round-trip windows, the warm-up count, the probe and the no-load latency it measures.
#[derive(Clone, Debug)]
struct RoundTrips {
    warmup: u32,
    /// Round trips seen (saturating).
    count: u32,
    /// The no-load latency in seconds, infinite before the first request.
    no_load: f64,
    /// The round trip before the running (or last) measurement: in flight, latency.
    before_probe: (usize, f64),
    probe: NoLoadProbe,
    window: Window,
}

/// What a completed request means for an algorithm, as [`RoundTrips::step`] answers.
enum Step {
    /// Answer this limit and move nothing.
    Hold(usize),
    /// A measurement of the no-load latency completed (already taken as the no-load latency,
    /// and a new window opened): the no-load latency and the limit to return to.
    Measured { min_rtt: f64, resume: f64 },
    /// A round trip closed, to be judged by the algorithm: its sample and latency (seconds).
    Round(Sample, f64),
}

impl RoundTrips {
    fn new() -> Self {
        RoundTrips {
            warmup: 10,
            count: 0,
            no_load: f64::INFINITY,
            before_probe: (0, 0.0),
            probe: NoLoadProbe::new(PROBE_INTERVAL, PROBE_SAMPLES),
            window: Window::default(),
        }
    }

    /// Feeds one completed request under `limit`: a running probe takes it; otherwise it joins
    /// the round-trip window, and a closed window starts a due probe or counts to the warm-up.
    fn step(&mut self, s: &Sample, limit: f64, min: usize) -> Step {
        if self.probe.running() {
            let Some((min_rtt, resume)) = self.probe.feed(s, min) else {
                return Step::Hold(min);
            };
            self.no_load = min_rtt;
            self.window.restart(s.at);
            return Step::Measured { min_rtt, resume };
        }
        let Some(s) = self.window.push(s) else {
            return Step::Hold(to_limit(limit));
        };
        let rtt = s.rtt.as_secs_f64();
        if self.probe.start_if_due(s.at, limit) {
            self.before_probe = (s.in_flight, rtt);
            return Step::Hold(min);
        }
        self.count = self.count.saturating_add(1);
        if self.count == self.warmup {
            // Measure the no-load latency first: the warm-up may have been under overload.
            self.probe.due_now(s.at);
        }
        Step::Round(s, rtt)
    }

    /// The no-load latency, zero before the first request.
    fn no_load_rtt(&self) -> Duration {
        if self.no_load.is_finite() {
            Duration::from_secs_f64(self.no_load.max(0.0))
        } else {
            Duration::ZERO
        }
    }
}

/// The methods of an algorithm that measures the no-load latency in its `rounds` field
/// ([`RoundTrips`]), written once: each algorithm gives the docs and the names.
macro_rules! no_load_methods {
    ($($(#[$doc:meta])* fn $method:ident;)+) => {
        $(no_load_methods!(@one [$(#[$doc])*] $method);)+
    };
    (@one [$(#[$doc:meta])*] probe) => {
        $(#[$doc])*
        pub fn probe(mut self, every: Duration, samples: u32) -> Self {
            self.rounds.probe = NoLoadProbe::new(every, samples);
            self
        }
    };
    (@one [$(#[$doc:meta])*] no_load_rtt) => {
        $(#[$doc])*
        pub fn no_load_rtt(&self) -> Duration {
            self.rounds.no_load_rtt()
        }
    };
    (@one [$(#[$doc:meta])*] probing) => {
        $(#[$doc])*
        pub fn probing(&self) -> bool {
            self.rounds.probe.running()
        }
    };
}

/// The [`LimitAlgorithm`] of an algorithm that samples round trips and measures the no-load
/// latency through its `rounds` field ([`RoundTrips`]), written once: a completed request is
/// held, ends a measurement (the algorithm's `measured`) or closes a round trip (its
/// `round`).
macro_rules! round_trip_algorithm {
    ($name:ident) => {
        impl LimitAlgorithm for $name {
            fn initial_limit(&self) -> usize {
                to_limit(self.limit)
            }

            fn bounds(&self) -> (usize, usize) {
                self.bounds
            }

            fn update(&mut self, s: Sample) -> usize {
                match self.rounds.step(&s, self.limit, self.bounds.0) {
                    Step::Hold(limit) => limit,
                    Step::Measured { min_rtt, resume } => self.measured(min_rtt, resume),
                    Step::Round(s, rtt) => self.round(s, rtt),
                }
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// AIMD

/// Additive increase, multiplicative decrease (as Netflix's `AIMDLimit`).
///
/// Samples are taken a round trip at a time (a window closes with the first request that
/// started after it opened), and once per window, as TCP does:
///
/// * if a request of the window was [dropped](Sample::dropped), or took longer than
///   [`timeout`](Self::timeout), the limit is multiplied by [`backoff`](Self::backoff) (0.9
///   by default): a burst of slow responses from one overload is one step down, not fifty;
/// * otherwise the limit grows by 1, if it was in use: at least half of it was in flight
///   when a request of the window started. A service that is not using its limit does not
///   learn that a higher one is safe.
///
/// The reference updates on every request; with thousands of requests a second that moves
/// the limit far faster than the latency can answer, and it swings.
///
/// Defaults: limit 20, between 1 and 1000, backoff 0.9, timeout 5 s.
#[derive(Clone)]
pub struct Aimd {
    limit: f64,
    initial: usize,
    bounds: (usize, usize),
    backoff: f64,
    timeout: Duration,
    window: Window,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd {
            limit: 20.0,
            initial: 20,
            bounds: (1, 1000),
            backoff: 0.9,
            timeout: Duration::from_secs(5),
            window: Window::default(),
        }
    }
}

impl fmt::Debug for Aimd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Aimd")
            .field("limit", &to_limit(self.limit))
            .field("bounds", &self.bounds)
            .field("backoff", &self.backoff)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Aimd {
    /// The limit to start with (default 20), clamped into the [`range`](Self::range).
    pub fn initial(mut self, limit: usize) -> Self {
        self.initial = limit;
        self.limit = clamp_limit(limit as f64, self.bounds);
        self
    }

    /// The smallest and largest limits (default 1 and 1000; a `min` of 0 counts as 1, a `max`
    /// below `min` as `min`).
    pub fn range(mut self, min: usize, max: usize) -> Self {
        self.bounds = bounds(min, max);
        self.limit = clamp_limit(self.initial as f64, self.bounds);
        self
    }

    /// The factor a decrease multiplies the limit by (default 0.9), clamped into `[0.5, 0.99]`;
    /// NaN means the default.
    pub fn backoff(mut self, ratio: f64) -> Self {
        self.backoff = if ratio.is_nan() {
            0.9
        } else {
            ratio.clamp(0.5, 0.99)
        };
        self
    }

    /// The latency over which a request counts as a failure, as if it had been dropped
    /// (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl LimitAlgorithm for Aimd {
    fn initial_limit(&self) -> usize {
        to_limit(self.limit)
    }

    fn bounds(&self) -> (usize, usize) {
        self.bounds
    }

    fn update(&mut self, mut s: Sample) -> usize {
        s.dropped |= s.rtt > self.timeout;
        let Some(s) = self.window.push(&s) else {
            return to_limit(self.limit);
        };
        if s.dropped {
            self.limit = clamp_limit((self.limit * self.backoff).floor(), self.bounds);
        } else if s.in_flight.saturating_mul(2) >= to_limit(self.limit) {
            self.limit = clamp_limit(self.limit + 1.0, self.bounds);
        }
        to_limit(self.limit)
    }
}

// ---------------------------------------------------------------------------------------------
// Gradient2

/// Latency gradient (as Netflix's `Gradient2Limit`), with a periodic re-measurement of the
/// no-load latency (as the minRTT calculation of Envoy's adaptive concurrency filter).
///
/// Two latencies are compared: the **short** one, the average of one round trip's requests
/// (see below), and the **long** one, an exponential moving average of the short ones over
/// [`long_window`](Self::long_window) round trips (600 by default; the first 10 are averaged
/// plainly as a warm-up). For each round trip:
///
/// ```text
/// gradient  = clamp(tolerance × long / short, 0.5, 1.0)
/// new       = gradient × limit + queue_size
/// limit     = (1 − smoothing) × limit + smoothing × new        (then clamped to the bounds)
/// ```
///
/// so the limit grows by up to `smoothing × queue_size` per round trip while latency stays
/// within `tolerance` (1.5) of the long average, and shrinks, by up to half per step before
/// smoothing, when it does not. `queue_size` is 4, `smoothing` 0.2. As in the reference, the
/// limit does not grow while it is not in use (fewer than half of it in flight when the
/// requests started; it may still shrink), and when the long average is more than twice the
/// short latency (the load went away) the long average is brought down by 5% per round trip.
///
/// **Round trips.** The reference updates on every request (or on windows of a fixed time,
/// wrapped in its `WindowedLimit`). Here a window closes with the first request that started
/// after the window opened, so the limit moves once per round trip, judged by requests that
/// ran under the previous limit: fast when the service is fast, and without the swings of a
/// limit moved by thousands of requests a second before their latency could answer.
///
/// **The no-load latency.** Under a sustained overload the reference's long average follows
/// the slow latency up, and the limit drifts up with it, without end. Here the long average
/// is never above the **no-load latency**: the lowest latency seen since it was last
/// measured. It is measured by a probe, as Envoy's minRTT calculation: right after the
/// warm-up, then every [`probe_interval`](Self::probe) (30 s by default), the limit is held
/// at its minimum until [`probe_samples`](Self::probe) requests (20) that started with no
/// more than the minimum in flight have completed; the lowest of their latencies becomes the
/// no-load latency and the long average, and the limit returns to what it was, from where the
/// gradient brings it to the right level. A service that became slower for good is thus
/// recognised within one probe interval.
///
/// Defaults: limit 20, between 4 and 1000.
#[derive(Clone)]
pub struct Gradient2 {
    limit: f64,
    bounds: (usize, usize),
    smoothing: f64,
    tolerance: f64,
    queue_size: f64,
    long_window: u32,
    // State.
    long: f64,
    rounds: RoundTrips,
}

impl Default for Gradient2 {
    fn default() -> Self {
        Gradient2::new(20, 4, 1000)
    }
}

impl fmt::Debug for Gradient2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gradient2")
            .field("limit", &to_limit(self.limit))
            .field("bounds", &self.bounds)
            .field("long_rtt", &Duration::from_secs_f64(self.long.max(0.0)))
            .field("probing", &self.rounds.probe.running())
            .finish_non_exhaustive()
    }
}

impl Gradient2 {
    /// Starts at `initial`, moving between `min` and `max` (a `min` of 0 counts as 1; `max`
    /// below `min` as `min`), with the other settings at their defaults.
    pub fn new(initial: usize, min: usize, max: usize) -> Self {
        let bounds = bounds(min, max);
        Gradient2 {
            limit: clamp_limit(initial as f64, bounds),
            bounds,
            smoothing: 0.2,
            tolerance: 1.5,
            queue_size: 4.0,
            long_window: 600,
            long: 0.0,
            rounds: RoundTrips::new(),
        }
    }

    /// How much of each new estimate is taken, in `(0, 1]` (default 0.2): higher follows
    /// faster, lower is steadier.
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing_or(smoothing, 0.2);
        self
    }

    /// How much slower than the long average a request may be before the limit shrinks, at
    /// least 1 (default 1.5).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = if tolerance.is_nan() {
            1.5
        } else {
            tolerance.clamp(1.0, 100.0)
        };
        self
    }

    /// How many requests the limit may grow by past what the gradient allows (default 4).
    pub fn queue_size(mut self, queue_size: usize) -> Self {
        self.queue_size = queue_size as f64;
        self
    }

    /// How many requests the long average spans, at least 1 (default 600).
    pub fn long_window(mut self, requests: u32) -> Self {
        self.long_window = requests.max(1);
        self
    }

    no_load_methods! {
        /// How often the no-load latency is measured again, and from how many requests (defaults
        /// 30 s and 20). `Duration::MAX` turns the probe off.
        fn probe;
    }

    /// The long-term latency average, the baseline a request's latency is compared with.
    /// Zero before the first request.
    pub fn long_rtt(&self) -> Duration {
        Duration::from_secs_f64(self.long.max(0.0))
    }

    no_load_methods! {
        /// The no-load latency: the lowest latency since the last probe. Zero before the first
        /// request.
        fn no_load_rtt;

        /// Whether the limit is held at its minimum to measure the no-load latency.
        fn probing;
    }
}

round_trip_algorithm!(Gradient2);

impl Gradient2 {
    /// A measurement found the no-load latency `min_rtt`: it is the new baseline, and the
    /// limit resumes where it was.
    fn measured(&mut self, min_rtt: f64, resume: f64) -> usize {
        self.long = min_rtt;
        self.limit = resume;
        to_limit(self.limit)
    }

    /// Judges a round trip `s` of latency `rtt` (seconds) against the long average.
    fn round(&mut self, s: Sample, rtt: f64) -> usize {
        // The long average: plain during the warm-up, then exponential.
        let count = self.rounds.count;
        if count <= self.rounds.warmup {
            self.long += (rtt - self.long) / f64::from(count);
        } else {
            let factor = 2.0 / (f64::from(self.long_window) + 1.0);
            self.long += (rtt - self.long) * factor;
        }
        self.rounds.no_load = self.rounds.no_load.min(rtt);
        self.long = self.long.min(self.rounds.no_load);
        if rtt <= 0.0 {
            return to_limit(self.limit);
        }
        // The load went away: do not wait 600 requests for the average to notice.
        if self.long / rtt > 2.0 {
            self.long *= 0.95;
        }
        let gradient = (self.tolerance * self.long / rtt).clamp(0.5, 1.0);
        let mut new = gradient * self.limit + self.queue_size;
        // Not in use: no evidence that more would be fine (but evidence that less would be).
        if (s.in_flight as f64) < self.limit / 2.0 {
            new = new.min(self.limit);
        }
        let new = self.limit * (1.0 - self.smoothing) + new * self.smoothing;
        self.limit = clamp_limit(new, self.bounds);
        to_limit(self.limit)
    }
}

// ---------------------------------------------------------------------------------------------
// Vegas

/// Queue estimation from the no-load latency (as Netflix's `VegasLimit`, after TCP Vegas).
///
/// Little's law turns the latency into the number of requests waiting in the service: with a
/// limit `L`, a latency `rtt` and a no-load latency `rtt_noload`, the service works on
/// `L × rtt_noload / rtt` requests and the rest queue. For each round trip (see below):
///
/// ```text
/// queue     = ⌈L × (1 − rtt_noload / rtt)⌉
/// log       = max(1, ⌊log10 L⌋)
/// alpha     = 3 × log,  beta = 6 × log,  threshold = log
///
/// dropped request          → new = L − log
/// queue ≤ threshold        → new = L + beta      (no queue: grow fast)
/// queue < alpha            → new = L + log
/// queue > beta             → new = L − log
/// otherwise                → no change           (alpha ≤ queue ≤ beta)
/// L = (1 − smoothing) × L + smoothing × new      (then clamped to the bounds)
/// ```
///
/// so the limit settles where `alpha` to `beta` requests wait in the service: 3 to 6 below a
/// limit of 100, 6 to 12 below 1000. As in the reference, the limit does not grow while fewer
/// than half of it are in flight (it may still shrink on a drop), a round trip faster than
/// the no-load latency becomes the new no-load latency and moves nothing, and `smoothing`
/// is 1 by default.
///
/// **Round trips.** The reference updates on every request; here, as TCP Vegas and as
/// [`Gradient2`], the requests of one round trip are one sample (their average latency), so
/// the limit moves by at most `beta` per round trip, judged by requests that ran under it.
///
/// **The no-load latency** is the lowest latency seen since it was last measured. The
/// reference forgets it every 15 to 30 × `L` requests (a random jitter) and takes the next
/// request's latency instead, so that a service that became slower for good is followed. Under
/// a sustained overload that next latency is the loaded one: the queue looks empty, the limit
/// grows by `beta`, and at the next reset again, without end; and a limit that starts far
/// above the service's capacity never sees a fast request at all. Here, as for [`Gradient2`],
/// the no-load latency is measured: right after a warm-up of 10 round trips, then every
/// [`probe`](Self::probe) interval (30 s), the limit is held at its minimum until 20 requests
/// that started with no more than the minimum in flight have completed, and the lowest of
/// their latencies is the no-load latency. The limit then resumes at Vegas's own estimate of
/// what the service holds without queueing, `in_flight × rtt_noload / rtt` of the round trip
/// before the measurement (never above where it was), and moves from there by the rule
/// above.
///
/// Against the simulated backend of `tests/concurrency/adaptive.rs` (20 requests at once in
/// 10 ms, driven by 200 clients, on a paused clock), the limit comes down from 500 to between
/// 20 and 30 within 1.5 s (most of it the warm-up before the first measurement); it grows from
/// 4 to a capacity of 50 within 0.5 s; it follows a step of the capacity up (20 → 80) within
/// 0.5 s, and down (80 → 10) within 4 s: down is `log` per round trip, slower than
/// [`Gradient2`]'s.
///
/// Defaults: limit 20, between 4 and 1000, smoothing 1.
///
/// ```
/// use tollgate::concurrency::Vegas;
/// use tollgate::ConcurrencyLimitLayer;
///
/// let limit = ConcurrencyLimitLayer::new(500).adaptive(Vegas::new(20, 4, 500).smoothing(0.5));
/// assert_eq!(limit.limit(), 20);
/// ```
#[derive(Clone)]
pub struct Vegas {
    limit: f64,
    bounds: (usize, usize),
    smoothing: f64,
    // State.
    rounds: RoundTrips,
}

impl Default for Vegas {
    fn default() -> Self {
        Vegas::new(20, 4, 1000)
    }
}

impl fmt::Debug for Vegas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vegas")
            .field("limit", &to_limit(self.limit))
            .field("bounds", &self.bounds)
            .field("smoothing", &self.smoothing)
            .field("no_load_rtt", &self.no_load_rtt())
            .field("probing", &self.rounds.probe.running())
            .finish_non_exhaustive()
    }
}

/// `max(1, ⌊log10 limit⌋)`, the step of the reference's `Log10RootFunction`. (The reference
/// switches to `√limit` from a limit of 1000, where its lookup table ends; this stays with
/// the logarithm.)
fn log10_step(limit: f64) -> f64 {
    if limit < 10.0 {
        1.0
    } else {
        limit.log10().floor().max(1.0)
    }
}

impl Vegas {
    /// Starts at `initial`, moving between `min` and `max` (a `min` of 0 counts as 1; `max`
    /// below `min` as `min`), with the other settings at their defaults.
    pub fn new(initial: usize, min: usize, max: usize) -> Self {
        let bounds = bounds(min, max);
        Vegas {
            limit: clamp_limit(initial as f64, bounds),
            bounds,
            smoothing: 1.0,
            rounds: RoundTrips::new(),
        }
    }

    /// How much of each new estimate is taken, in `(0, 1]` (default 1, as the reference):
    /// lower is steadier.
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing_or(smoothing, 1.0);
        self
    }

    no_load_methods! {
        /// How often the no-load latency is measured again, and from how many requests (defaults
        /// 30 s and 20). `Duration::MAX` turns the measurement off: the no-load latency is then
        /// the lowest latency ever seen.
        fn probe;

        /// The no-load latency: the lowest latency since the last measurement. Zero before the
        /// first request.
        fn no_load_rtt;

        /// Whether the limit is held at its minimum to measure the no-load latency.
        fn probing;
    }
}

round_trip_algorithm!(Vegas);

impl Vegas {
    /// A measurement found the no-load latency `min_rtt`: the limit resumes at what the
    /// service held without queueing, never above `resume`, where it was.
    fn measured(&mut self, min_rtt: f64, resume: f64) -> usize {
        // What the service held without queueing in the round trip before: its
        // throughput (in flight / latency) times the no-load latency.
        let (in_flight, rtt) = self.rounds.before_probe;
        let estimate = if rtt > 0.0 {
            in_flight as f64 * min_rtt / rtt
        } else {
            resume
        };
        self.limit = clamp_limit(estimate.min(resume).round(), self.bounds);
        to_limit(self.limit)
    }

    /// Judges a round trip `s` of latency `rtt` (seconds) by the queue it shows.
    fn round(&mut self, s: Sample, rtt: f64) -> usize {
        let no_load = &mut self.rounds.no_load;
        if rtt <= 0.0 || rtt < *no_load {
            *no_load = no_load.min(rtt);
            return to_limit(self.limit);
        }

        let limit = self.limit;
        let log = log10_step(limit);
        let new = if s.dropped {
            limit - log
        } else if (s.in_flight as f64) * 2.0 < limit {
            // Not in use: no evidence either way.
            return to_limit(self.limit);
        } else {
            let queue = (limit * (1.0 - self.rounds.no_load / rtt)).ceil();
            let (alpha, beta, threshold) = (3.0 * log, 6.0 * log, log);
            if queue <= threshold {
                limit + beta
            } else if queue < alpha {
                limit + log
            } else if queue > beta {
                limit - log
            } else {
                return to_limit(self.limit);
            }
        };
        let new = clamp_limit(new, self.bounds);
        self.limit = clamp_limit(
            (1.0 - self.smoothing) * limit + self.smoothing * new,
            self.bounds,
        );
        to_limit(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn sample(at_ms: u64, rtt_ms: u64, in_flight: usize) -> Sample {
        Sample {
            at: ms(at_ms),
            rtt: ms(rtt_ms),
            in_flight,
            dropped: false,
        }
    }

    #[test]
    fn aimd_grows_by_one_per_request_while_the_limit_is_in_use() {
        let mut a = Aimd::default().initial(10).timeout(ms(100));
        assert_eq!(a.update(sample(10, 10, 5)), 11);
        assert_eq!(a.update(sample(20, 10, 6)), 12);
        // Fewer than half of the limit in flight: no growth.
        assert_eq!(a.update(sample(30, 10, 5)), 12);
    }

    #[test]
    fn aimd_backs_off_once_per_round_trip() {
        let mut a = Aimd::default().initial(100).timeout(ms(100));
        // Slow: 100 × 0.9.
        assert_eq!(a.update(sample(1_000, 200, 100)), 90);
        // Started (at 850 ms) before that decrease: no second step down.
        assert_eq!(a.update(sample(1_050, 200, 100)), 90);
        // Started after it: down again, 90 × 0.9 = 81.
        assert_eq!(a.update(sample(1_300, 200, 100)), 81);
        // A drop counts like a slow request.
        let mut d = sample(1_600, 10, 100);
        d.dropped = true;
        assert_eq!(a.update(d), 72);
    }

    #[test]
    fn aimd_stays_within_its_bounds() {
        let mut a = Aimd::default().range(3, 5).initial(100);
        assert_eq!(a.initial_limit(), 5);
        assert_eq!(a.update(sample(10, 10, 5)), 5);
        let mut at = 10;
        for _ in 0..50 {
            at += 10_000;
            a.update(sample(at, 6_000, 5));
        }
        assert_eq!(a.update(sample(at + 10_000, 6_000, 5)), 3);
        // A zero minimum counts as 1, a maximum below the minimum as the minimum.
        assert_eq!(LimitAlgorithm::bounds(&Aimd::default().range(0, 0)), (1, 1));
        assert_eq!(LimitAlgorithm::bounds(&Aimd::default().range(7, 2)), (7, 7));
    }

    #[test]
    fn gradient2_grows_while_latency_stays_at_its_average() {
        let mut g = Gradient2::new(10, 1, 100).probe(Duration::MAX, 1);
        // Gradient 1: new = limit + 4, smoothed: limit + 0.8 per request.
        let mut last = 0;
        for i in 0..10u64 {
            last = g.update(sample(i * 10, 10, 100));
        }
        assert_eq!(last, 18);
        assert_eq!(g.long_rtt(), ms(10));
    }

    #[test]
    fn gradient2_shrinks_when_latency_rises_past_the_tolerance() {
        let mut g = Gradient2::new(50, 1, 100).probe(Duration::MAX, 1);
        for i in 0..10u64 {
            g.update(sample(i * 10, 10, 50));
        }
        let before = g.update(sample(100, 10, 60));
        // Latency 4× the average: gradient 1.5 / 4 = 0.375, clamped to 0.5.
        // new = 0.5 × limit + 4, smoothed: 0.9 × limit + 0.8.
        let after = g.update(sample(150, 40, 60));
        assert_eq!(before, 59);
        assert_eq!(after, 54);
    }

    #[test]
    fn gradient2_does_not_grow_an_unused_limit_but_shrinks_it() {
        let mut g = Gradient2::new(40, 1, 100).probe(Duration::MAX, 1);
        for i in 0..30u64 {
            assert_eq!(g.update(sample(i * 10, 10, 19)), 40);
        }
        // 0.5 × 40 + 4 = 24, smoothed: 36.8.
        assert_eq!(g.update(sample(340, 40, 19)), 37);
    }

    #[test]
    fn a_window_is_one_round_trip() {
        let mut a = Aimd::default().initial(10).timeout(ms(100));
        assert_eq!(a.update(sample(100, 100, 10)), 11);
        // Started at 50, 80 and 90 ms, before the window opened at 100 ms: no update.
        assert_eq!(a.update(sample(150, 100, 10)), 11);
        assert_eq!(a.update(sample(180, 100, 10)), 11);
        // One slow request in the window: one step down when the window closes.
        assert_eq!(a.update(sample(290, 200, 10)), 11);
        assert_eq!(a.update(sample(300, 200, 10)), 9);
    }

    #[test]
    fn gradient2_probe_holds_the_minimum_then_resets_the_baseline() {
        let mut g = Gradient2::new(50, 2, 100).probe(ms(1_000), 3);
        // A warm-up under overload, at 30 ms: the first probe is due at its end.
        for i in 0..10u64 {
            assert_eq!(g.update(sample(i * 100, 30, 10)), 50);
        }
        assert!(!g.probing());
        assert_eq!(g.no_load_rtt(), ms(30));
        assert_eq!(g.update(sample(1_090, 30, 10)), 2);
        assert!(g.probing());
        // Requests that started above the minimum do not count.
        assert_eq!(g.update(sample(1_100, 30, 10)), 2);
        assert_eq!(g.update(sample(1_110, 8, 2)), 2);
        assert_eq!(g.update(sample(1_120, 7, 1)), 2);
        // The third: the limit returns, the baseline is the lowest measured.
        let resumed = g.update(sample(1_130, 9, 2));
        assert!(!g.probing());
        assert_eq!(g.long_rtt(), ms(7));
        assert_eq!(g.no_load_rtt(), ms(7));
        assert_eq!(resumed, 50);
        // The next probe is due 1 s later; meanwhile the long average stays at most 7 ms
        // however slow requests get, so the limit keeps shrinking.
        assert_eq!(g.update(sample(1_200, 70, 50)), 46);
        assert_eq!(g.long_rtt(), ms(7));
        assert_eq!(g.update(sample(2_129, 70, 50)), 42);
        assert!(!g.probing());
        assert_eq!(g.update(sample(2_200, 70, 50)), 2);
        assert!(g.probing());
    }

    #[test]
    fn vegas_grows_by_beta_without_a_queue_by_log_with_a_small_one_and_holds_in_between() {
        let mut v = Vegas::new(20, 1, 1000).probe(Duration::MAX, 1);
        // The first round trip is the no-load latency: nothing moves.
        assert_eq!(v.update(sample(1_000, 100, 20)), 20);
        assert_eq!(v.no_load_rtt(), ms(100));
        // No queue (0 ≤ threshold 1): + beta = 6.
        assert_eq!(v.update(sample(2_000, 100, 20)), 26);
        // queue = ⌈26 × 6 / 106⌉ = 2, below alpha = 3: + 1.
        assert_eq!(v.update(sample(3_000, 106, 26)), 27);
        // queue = ⌈27 × 20 / 120⌉ = 5, between alpha and beta: no change.
        assert_eq!(v.update(sample(4_000, 120, 27)), 27);
        // queue = ⌈27 × 50 / 150⌉ = 9, above beta = 6: − 1.
        assert_eq!(v.update(sample(5_000, 150, 27)), 26);
        // A drop: − 1, whatever the latency.
        let mut d = sample(6_000, 100, 26);
        d.dropped = true;
        assert_eq!(v.update(d), 25);
        // Fewer than half in flight: no growth without a queue.
        assert_eq!(v.update(sample(7_000, 100, 12)), 25);
        // A round trip faster than the no-load latency becomes it, and moves nothing.
        assert_eq!(v.update(sample(8_000, 90, 25)), 25);
        assert_eq!(v.no_load_rtt(), ms(90));
    }

    #[test]
    fn vegas_steps_follow_log10_of_the_limit() {
        assert_eq!(log10_step(0.0), 1.0);
        assert_eq!(log10_step(9.9), 1.0);
        assert_eq!(log10_step(10.0), 1.0);
        assert_eq!(log10_step(99.0), 1.0);
        assert_eq!(log10_step(100.0), 2.0);
        assert_eq!(log10_step(999.0), 2.0);
        assert_eq!(log10_step(1000.0), 3.0);
        assert_eq!(log10_step(f64::MAX), 308.0);
        // At 100: beta = 12; at 995 the maximum caps the step.
        let mut v = Vegas::new(100, 1, 1000).probe(Duration::MAX, 1);
        v.update(sample(1_000, 100, 100));
        assert_eq!(v.update(sample(2_000, 100, 100)), 112);
        let mut v = Vegas::new(995, 1, 1000).probe(Duration::MAX, 1);
        v.update(sample(1_000, 100, 995));
        assert_eq!(v.update(sample(2_000, 100, 995)), 1000);
    }

    #[test]
    fn vegas_smoothing_takes_part_of_each_step() {
        let mut v = Vegas::new(20, 1, 1000)
            .smoothing(0.5)
            .probe(Duration::MAX, 1);
        v.update(sample(1_000, 100, 20));
        // 0.5 × 20 + 0.5 × 26.
        assert_eq!(v.update(sample(2_000, 100, 20)), 23);
        // NaN and out-of-range smoothings are clamped, never poison the limit.
        assert_eq!(Vegas::default().smoothing(f64::NAN).smoothing, 1.0);
        assert_eq!(Vegas::default().smoothing(0.0).smoothing, 0.01);
        assert_eq!(Vegas::default().smoothing(7.0).smoothing, 1.0);
    }

    #[test]
    fn vegas_probe_measures_the_no_load_latency_and_resumes_at_its_estimate() {
        let mut v = Vegas::new(50, 2, 100).probe(ms(1_000), 3);
        // A warm-up at 30 ms, the limit not in use.
        for i in 0..10u64 {
            assert_eq!(v.update(sample(i * 100, 30, 10)), 50);
        }
        assert!(!v.probing());
        assert_eq!(v.no_load_rtt(), ms(30));
        assert_eq!(v.update(sample(1_090, 30, 40)), 2);
        assert!(v.probing());
        // Requests that started above the minimum do not count.
        assert_eq!(v.update(sample(1_100, 30, 10)), 2);
        assert_eq!(v.update(sample(1_110, 8, 2)), 2);
        assert_eq!(v.update(sample(1_120, 7, 1)), 2);
        // Done: 40 in flight at 30 ms is 40 × 7 / 30 = 9.3 without queueing.
        assert_eq!(v.update(sample(1_130, 9, 2)), 9);
        assert!(!v.probing());
        assert_eq!(v.no_load_rtt(), ms(7));
        // The next measurement is due 1 s later.
        assert_eq!(v.update(sample(1_200, 7, 9)), 15);
        assert_eq!(v.update(sample(2_129, 7, 15)), 21);
        assert_eq!(v.update(sample(2_200, 7, 21)), 2);
        assert!(v.probing());
    }

    #[test]
    fn vegas_stays_within_its_bounds() {
        let mut v = Vegas::new(100, 3, 5).probe(Duration::MAX, 1);
        assert_eq!(v.initial_limit(), 5);
        v.update(sample(1_000, 10, 5));
        assert_eq!(v.update(sample(2_000, 10, 5)), 5);
        // Drops: − 1 each, down to the minimum and no further.
        let mut limits = Vec::new();
        for i in 0..4u64 {
            let mut d = sample(3_000 + i * 1_000, 10, 5);
            d.dropped = true;
            limits.push(v.update(d));
        }
        assert_eq!(limits, [4, 3, 3, 3]);
        assert_eq!(LimitAlgorithm::bounds(&Vegas::new(0, 0, 0)), (1, 1));
        assert_eq!(Vegas::new(0, 0, 0).initial_limit(), 1);
    }
}
