//! The metric handles of a layer, resolved once when it is built. Without the `metrics`
//! feature every type here is empty and every method does nothing, so the compiler removes
//! them.

#[cfg(feature = "metrics")]
mod on {
    use std::cell::Cell;
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, Label};

    use super::super::{Names, Verdict};

    pub(crate) const DECISIONS: &str = "tollgate_decisions_total";
    pub(crate) const KEYS: &str = "tollgate_keys";
    pub(crate) const IN_FLIGHT: &str = "tollgate_concurrency_in_flight";
    pub(crate) const WAITING: &str = "tollgate_concurrency_waiting";
    pub(crate) const WAIT: &str = "tollgate_concurrency_wait_seconds";
    pub(crate) const LIMIT: &str = "tollgate_concurrency_limit";
    pub(crate) const LATENCY: &str = "tollgate_concurrency_latency_seconds";
    pub(crate) const SHEDS: &str = "tollgate_concurrency_sheds_total";
    pub(crate) const QUEUE: &str = "tollgate_shape_queue_length";
    pub(crate) const DELAY: &str = "tollgate_shape_delay_seconds";
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_CALL: &str = "tollgate_redis_call_duration_seconds";
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_ERRORS: &str = "tollgate_redis_errors_total";

    /// How many decisions of a thread between two samples of a gauge that costs a lookup.
    const SAMPLE_EVERY: u32 = 256;

    thread_local! {
        static TICK: Cell<u32> = const { Cell::new(0) };
    }

    /// Whether this decision of the thread should sample the gauges.
    #[inline]
    fn sample() -> bool {
        TICK.with(|t| {
            let n = t.get().wrapping_add(1);
            t.set(n);
            n % SAMPLE_EVERY == 0
        })
    }

    fn dry(dry_run: bool) -> &'static str {
        if dry_run {
            "true"
        } else {
            "false"
        }
    }

    fn decisions(names: &Names, quota: &str, v: Verdict, dry_run: bool) -> Counter {
        metrics::counter!(
            DECISIONS,
            "layer" => names.layer.as_str(),
            "policy" => names.policy.to_string(),
            "quota" => quota.to_owned(),
            "outcome" => v.as_str(),
            "dry_run" => dry(dry_run),
        )
    }

    fn labels(names: &Names, dry_run: bool) -> Vec<Label> {
        vec![
            Label::new("policy", names.policy.to_string()),
            Label::new("dry_run", dry(dry_run)),
        ]
    }

    /// The decision counters of one policy (a tier of a rate limit, or a whole layer).
    pub(crate) struct DecisionMeter {
        /// One per outcome, in the order of `Verdict`, for decisions no quota made alone.
        plain: [Counter; 12],
        /// Per quota: `limited` and `never_fits`.
        limited: Box<[Counter]>,
        never_fits: Box<[Counter]>,
        keys: Gauge,
    }

    fn index(v: Verdict) -> usize {
        v as usize
    }

    impl DecisionMeter {
        pub(crate) fn new(names: &Names, dry_run: bool, outcomes: &[Verdict]) -> Self {
            let plain = ALL.map(|v| {
                if outcomes.contains(&v) {
                    decisions(names, "", v, dry_run)
                } else {
                    Counter::noop()
                }
            });
            let per_quota = |v: Verdict| -> Box<[Counter]> {
                names
                    .quotas
                    .iter()
                    .map(|q| decisions(names, q, v, dry_run))
                    .collect()
            };
            let keys = metrics::gauge!(
                KEYS,
                "layer" => names.layer.as_str(),
                "policy" => names.policy.to_string(),
            );
            DecisionMeter {
                plain,
                limited: per_quota(Verdict::Limited),
                never_fits: per_quota(Verdict::NeverFits),
                keys,
            }
        }

        #[inline]
        pub(crate) fn count(&self, v: Verdict, quota: Option<usize>) {
            self.count_with(v, || quota);
        }

        /// [`count`](Self::count), with the quota that fired found only when it is counted
        /// (a limit or a cost that never fits).
        #[inline]
        pub(crate) fn count_with(&self, v: Verdict, quota: impl FnOnce() -> Option<usize>) {
            let per_quota = match v {
                Verdict::Limited => quota().and_then(|q| self.limited.get(q)),
                Verdict::NeverFits => quota().and_then(|q| self.never_fits.get(q)),
                _ => None,
            };
            per_quota.unwrap_or(&self.plain[index(v)]).increment(1);
        }

        /// Sets the tracked-keys gauge, now (`force`) or on one decision in 256 of the thread.
        #[inline]
        pub(crate) fn keys(&self, force: bool, len: impl FnOnce() -> Option<usize>) {
            if force || sample() {
                if let Some(n) = len() {
                    self.keys.set(n as f64);
                }
            }
        }
    }

    const ALL: [Verdict; 12] = [
        Verdict::Allowed,
        Verdict::Delayed,
        Verdict::Waited,
        Verdict::Limited,
        Verdict::NeverFits,
        Verdict::QueueFull,
        Verdict::MissingKey,
        Verdict::FailOpen,
        Verdict::FailClosed,
        Verdict::Banned,
        Verdict::LocalAllowed,
        Verdict::LocalLimited,
    ];

    /// The gauges and histogram of a concurrency layer.
    pub(crate) struct ConcurrencyMeter {
        in_flight: Gauge,
        waiting: Gauge,
        wait: Histogram,
    }

    impl ConcurrencyMeter {
        pub(crate) fn new(names: &Names, dry_run: bool) -> Self {
            ConcurrencyMeter {
                in_flight: metrics::gauge!(IN_FLIGHT, labels(names, dry_run)),
                waiting: metrics::gauge!(WAITING, labels(names, dry_run)),
                wait: metrics::histogram!(WAIT, labels(names, dry_run)),
            }
        }

        /// A request took a permit: counted in flight until the guard is dropped.
        #[inline]
        pub(crate) fn hold(&self) -> Held {
            Held::gauge(&self.in_flight)
        }

        /// A request joined the queue: counted waiting until the guard is dropped.
        pub(crate) fn wait(&self) -> Held {
            Held::gauge(&self.waiting)
        }

        pub(crate) fn waited(&self, d: Duration) {
            self.wait.record(d.as_secs_f64());
        }
    }

    /// What an adaptive concurrency limit (or one with priorities) learnt: its current limit,
    /// the smoothed latency it measured, and the requests it shed.
    pub(crate) struct AdaptiveMeter {
        limit: Gauge,
        latency: Gauge,
        sheds: Counter,
    }

    impl AdaptiveMeter {
        pub(crate) fn new(names: &Names, dry_run: bool) -> Self {
            AdaptiveMeter {
                limit: metrics::gauge!(LIMIT, labels(names, dry_run)),
                latency: metrics::gauge!(LATENCY, labels(names, dry_run)),
                sheds: metrics::counter!(SHEDS, labels(names, dry_run)),
            }
        }

        /// The limit now, and the latency measured so far (when there is one).
        pub(crate) fn learnt(&self, limit: usize, latency: Option<Duration>) {
            self.limit.set(limit as f64);
            if let Some(l) = latency {
                self.latency.set(l.as_secs_f64());
            }
        }

        pub(crate) fn shed(&self) {
            self.sheds.increment(1);
        }
    }

    /// A place counted in a gauge, given back when dropped, and the time it was held,
    /// recorded then when a histogram is given.
    #[derive(Default)]
    pub(crate) struct Held {
        gauge: Option<Gauge>,
        timed: Option<(Histogram, tokio::time::Instant)>,
    }

    impl Held {
        fn gauge(g: &Gauge) -> Self {
            g.increment(1.0);
            Held {
                gauge: Some(g.clone()),
                timed: None,
            }
        }
    }

    impl Drop for Held {
        #[inline]
        fn drop(&mut self) {
            if let Some(g) = self.gauge.take() {
                g.decrement(1.0);
            }
            if let Some((h, since)) = self.timed.take() {
                h.record(since.elapsed().as_secs_f64());
            }
        }
    }

    /// The gauge and histogram of a shaping layer.
    pub(crate) struct ShapeMeter {
        queue: Gauge,
        delay: Histogram,
    }

    impl ShapeMeter {
        pub(crate) fn new(names: &Names, dry_run: bool) -> Self {
            ShapeMeter {
                queue: metrics::gauge!(QUEUE, labels(names, dry_run)),
                delay: metrics::histogram!(DELAY, labels(names, dry_run)),
            }
        }

        /// A request that waits (or would wait) for its slot: counted in the queue until the
        /// guard is dropped, which records how long it waited.
        pub(crate) fn queued(&self) -> Held {
            self.queue.increment(1.0);
            Held {
                gauge: Some(self.queue.clone()),
                timed: Some((self.delay.clone(), tokio::time::Instant::now())),
            }
        }

        /// A request that left at once.
        #[inline]
        pub(crate) fn left(&self) {
            self.delay.record(0.0);
        }
    }

    /// The Redis calls of one limiter (a policy on Redis).
    #[cfg(feature = "redis")]
    pub(crate) struct RedisMeter {
        call: Histogram,
        timeout: Counter,
        connection: Counter,
        bad_reply: Counter,
        key_error: Counter,
        errors: super::super::KeyErrorLog,
    }

    #[cfg(feature = "redis")]
    impl RedisMeter {
        pub(crate) fn new(policy: &str) -> Self {
            let error = |e: &'static str| metrics::counter!(REDIS_ERRORS, "policy" => policy.to_owned(), "error" => e);
            RedisMeter {
                call: metrics::histogram!(REDIS_CALL, "policy" => policy.to_owned()),
                timeout: error("timeout"),
                connection: error("connection"),
                bad_reply: error("bad_reply"),
                key_error: error("key"),
                errors: super::super::KeyErrorLog::new(policy),
            }
        }

        pub(crate) fn call(&self, d: Duration) {
            self.call.record(d.as_secs_f64());
        }

        pub(crate) fn error(&self, e: super::super::StoreError) {
            match e {
                super::super::StoreError::Timeout => self.timeout.increment(1),
                super::super::StoreError::Connection => self.connection.increment(1),
                super::super::StoreError::BadReply => self.bad_reply.increment(1),
                super::super::StoreError::Key => self.key_error.increment(1),
            }
        }

        /// The policy's log of key errors.
        pub(crate) fn key_errors(&self) -> &super::super::KeyErrorLog {
            &self.errors
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use std::time::Duration;

    use super::super::{Names, Verdict};

    /// Nothing to count without the `metrics` feature.
    pub(crate) struct DecisionMeter;

    impl DecisionMeter {
        #[inline(always)]
        pub(crate) fn new(_: &Names, _: bool, _: &[Verdict]) -> Self {
            DecisionMeter
        }

        #[inline(always)]
        pub(crate) fn count(&self, _: Verdict, _: Option<usize>) {}

        #[inline(always)]
        pub(crate) fn count_with(&self, _: Verdict, _: impl FnOnce() -> Option<usize>) {}

        #[inline(always)]
        pub(crate) fn keys(&self, _: bool, _: impl FnOnce() -> Option<usize>) {}
    }

    pub(crate) struct AdaptiveMeter;

    impl AdaptiveMeter {
        #[inline(always)]
        pub(crate) fn new(_: &Names, _: bool) -> Self {
            AdaptiveMeter
        }

        #[inline(always)]
        pub(crate) fn learnt(&self, _: usize, _: Option<Duration>) {}

        #[inline(always)]
        pub(crate) fn shed(&self) {}
    }

    pub(crate) struct ConcurrencyMeter;

    impl ConcurrencyMeter {
        #[inline(always)]
        pub(crate) fn new(_: &Names, _: bool) -> Self {
            ConcurrencyMeter
        }

        #[inline(always)]
        pub(crate) fn hold(&self) -> Held {
            Held
        }

        #[inline(always)]
        pub(crate) fn wait(&self) -> Held {
            Held
        }

        #[inline(always)]
        pub(crate) fn waited(&self, _: Duration) {}
    }

    #[derive(Default)]
    pub(crate) struct Held;

    pub(crate) struct ShapeMeter;

    impl ShapeMeter {
        #[inline(always)]
        pub(crate) fn new(_: &Names, _: bool) -> Self {
            ShapeMeter
        }

        #[inline(always)]
        pub(crate) fn queued(&self) -> Held {
            Held
        }

        #[inline(always)]
        pub(crate) fn left(&self) {}
    }

    /// Without the `metrics` feature, only the policy's log of key errors.
    #[cfg(feature = "redis")]
    pub(crate) struct RedisMeter {
        errors: super::super::KeyErrorLog,
    }

    #[cfg(feature = "redis")]
    impl RedisMeter {
        #[inline(always)]
        pub(crate) fn new(policy: &str) -> Self {
            RedisMeter {
                errors: super::super::KeyErrorLog::new(policy),
            }
        }

        /// The policy's log of key errors.
        pub(crate) fn key_errors(&self) -> &super::super::KeyErrorLog {
            &self.errors
        }

        #[inline(always)]
        pub(crate) fn call(&self, _: Duration) {}

        #[inline(always)]
        pub(crate) fn error(&self, _: super::super::StoreError) {}
    }
}

#[cfg(feature = "redis")]
pub(crate) use on::RedisMeter;
pub(crate) use on::{AdaptiveMeter, ConcurrencyMeter, DecisionMeter, Held, ShapeMeter};
