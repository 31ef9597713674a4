//! Seeing what the layers do: metrics, tracing events and dry-run (shadow) mode.
//!
//! Nobody turns a limit on in production blind. Every layer of the crate
//! ([`RateLimitLayer`](crate::RateLimitLayer), [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer),
//! [`ShapeLayer`](crate::ShapeLayer)) and the non-HTTP [`RateLimiter`](crate::RateLimiter)
//! count their decisions through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`), log each rejection through [`tracing`](https://docs.rs/tracing), and can run in
//! dry-run mode: deciding, counting and logging everything, rejecting and delaying nothing.
//!
//! # Metrics
//!
//! With the `metrics` feature, the crate records to whatever recorder the application
//! installed (`metrics-exporter-prometheus`, OpenTelemetry, StatsD, ...). Without the feature
//! nothing is compiled in: no field, no branch. The handles of every series are resolved once,
//! when a layer is first applied (or a limiter built): install the recorder before that. A
//! request then costs one counter increment, without a lookup.
//!
//! Labels are the layer kind and the policy and quota names, never the key: the number of
//! series stays bounded whatever the traffic. Every series of a layer in dry-run mode carries
//! `dry_run="true"`, every other one `dry_run="false"`, so a shadow layer and an enforcing one
//! with the same names stay apart, and switching a layer from shadow to enforced changes one
//! label.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `tollgate_decisions_total` | counter | `layer`, `policy`, `quota`, `outcome`, `dry_run` | one per decision, see the outcomes below |
//! | `tollgate_keys` | gauge | `layer`, `policy` | keys tracked in memory (sampled: set on every rejection and every 256th decision of a thread) |
//! | `tollgate_concurrency_in_flight` | gauge | `policy`, `dry_run` | requests holding a permit of a concurrency layer |
//! | `tollgate_concurrency_waiting` | gauge | `policy`, `dry_run` | requests waiting in its queue |
//! | `tollgate_concurrency_wait_seconds` | histogram | `policy`, `dry_run` | how long a request waited in the queue, admitted or not |
//! | `tollgate_concurrency_limit` | gauge | `policy`, `dry_run` | the current limit of an adaptive concurrency layer (or one with priorities), set each time it moves |
//! | `tollgate_concurrency_latency_seconds` | gauge | `policy`, `dry_run` | the smoothed latency (to the end of the body) an adaptive layer measured |
//! | `tollgate_concurrency_sheds_total` | counter | `policy`, `dry_run` | requests a layer with priorities turned away to keep places for a higher class |
//! | `tollgate_shape_queue_length` | gauge | `policy`, `dry_run` | requests a shaping layer holds back now |
//! | `tollgate_shape_delay_seconds` | histogram | `policy`, `dry_run` | the delay a shaping layer gave (dry run: would have given) a request |
//! | `tollgate_redis_call_duration_seconds` | histogram | `policy` | one decision, refund or settlement script call, answered or not (a timeout records the timeout) |
//! | `tollgate_redis_errors_total` | counter | `policy`, `error` | failed calls: `error="timeout"`, `"connection"` (Redis unreachable or failing as a whole), `"bad_reply"` (a reply that does not fit the script) or `"key"` (an error about one key: a value of another type, a script error, no memory for a write; never an outage) |
//!
//! `layer` is `"rate_limit"`, `"concurrency"`, `"shape"` or `"limiter"` (a
//! [`RateLimiter`](crate::RateLimiter) or a Redis limiter used directly). `policy` is the
//! policy (tier) name of a rate limit, the name of a concurrency or shaping layer
//! (`ConcurrencyLimitLayer::name`, `ShapeLayer::name`; `""` without one). `quota` is the name
//! of the quota that rejected (its `RateLimit` header item name), `""` for a decision no single
//! quota made. The outcomes:
//!
//! | `outcome` | layers | meaning |
//! |---|---|---|
//! | `allowed` | all | admitted (a shaped request that left at once) |
//! | `delayed` | shape | admitted after waiting for its slot (dry run: admitted at once, would have waited) |
//! | `waited` | concurrency | admitted after waiting in the queue |
//! | `limited` | rate limit, concurrency | rejected: the quota is spent, or the concurrency limit is reached (or the wait for a permit timed out) |
//! | `never_fits` | rate limit | rejected: the request costs more than the quota's burst |
//! | `queue_full` | concurrency, shape | rejected: the queue is full or the wait would be too long |
//! | `missing_key` | all | rejected: no key, and the missing-key policy rejects |
//! | `fail_open` | rate limit on Redis | Redis did not answer in time; admitted by `FailMode::Open` |
//! | `fail_closed` | rate limit on Redis | Redis did not answer in time; rejected by `FailMode::Closed` |
//! | `banned` | rate limit with a [penalty box](crate::penalty) | the key is banned; answered without asking the quotas |
//! | `local_allowed` | rate limit on Redis | Redis did not answer in time; admitted by the local fallback (`FailMode::Local`) on its scaled quotas |
//! | `local_limited` | rate limit on Redis | Redis did not answer in time; rejected by the local fallback (`429` with `Retry-After`) |
//!
//! A dry-run layer counts the outcome enforcement would have had: `outcome="limited",
//! dry_run="true"` is a request it let through and would have rejected.
//!
//! # Tracing
//!
//! Each rejection is one `tracing` event at `DEBUG` with target `tollgate::reject` (dry run:
//! target `tollgate::dry_run`, at `INFO`, since there nothing else says it happened). Fields:
//! `layer`, `policy`, `quota` (the one that fired, when one did), `outcome` (as above),
//! `status`, `retry_after_ms` (when waiting helps), `dry_run`, and `key` (its `Debug` form)
//! only when the layer was built with `.trace_keys(true)`: a key is often an IP address or a
//! user id, personal data that logs should not get by default. Rejections are `DEBUG`, not
//! `INFO`: under a flood a server turns away thousands a second, and the counters already
//! say how many; turn them on for a look with `RUST_LOG=tollgate::reject=debug`.
//!
//! When a layer builds its state (the first time it is applied), it logs its configuration at
//! `DEBUG`, target `tollgate::config`.
//!
//! # Dry-run mode
//!
//! `.dry_run(true)` on a layer: every decision is made, counted and traced as if enforced,
//! but nothing is rejected or delayed, and the would-be rejection is put into the request's
//! extensions as a [`DryRunRejection`], for the handler to read (or log with its own
//! context). What each layer does with a request it would have turned away:
//!
//! * **Rate limit**: admitted; it consumes nothing, exactly as a rejected request consumes
//!   nothing when enforced, while admitted requests consume what they would. So a shadow
//!   layer's state (in memory or in a Redis shared with enforcing instances) is exactly the
//!   state enforcement would have: the figures it reports are what enforcing would do, and a
//!   shadow instance never eats into the quota of enforcing ones more than one enforcing
//!   instance would. The `RateLimit` header fields are not sent in dry-run mode (clients that
//!   obey them would slow down: enforcement through the back door) unless
//!   `RateLimitLayer::dry_run_headers(true)`.
//! * **Concurrency**: a request over the limit passes at once, holds no permit (so the
//!   permits held are the ones enforcement would hold), and is counted `limited`; with a
//!   queue, a request that would have waited is not queued either: it passes without a permit
//!   and is counted `limited` too (whether its wait would have ended in time cannot be
//!   known).
//! * **Shape**: a request is never delayed. One that would have waited passes at once and
//!   keeps its place in the schedule until its slot (a small task releases the slot then), so
//!   the schedule, the queue length and the delays are those enforcement would have; it is
//!   counted `delayed` with the delay it would have had. One the queue would have refused
//!   passes, takes no place, and is counted `queue_full`.
//!
//! # Settling after the response
//!
//! A rate limit with [`count_if`](crate::RateLimitLayer::count_if) or
//! [`settle`](crate::RateLimitLayer::settle) (see [`rate_limit::settle`](crate::rate_limit::settle))
//! counts **one decision per request, made when the request comes in**: an admitted request
//! is counted `allowed` when it reserves its cost, whatever its response later settles. The
//! settlement is not a decision and adds none: neither a give-back (a response that does not
//! count, or cost less) nor a charge beyond the reservation, even one that puts the key in
//! debt. The debt shows in the decisions that follow: the key's next requests are rejected,
//! counted `limited` (with the quota in debt as `quota`) and traced like any rejection. On
//! Redis, a settlement is one script call, measured in
//! `tollgate_redis_call_duration_seconds`, and its failures in `tollgate_redis_errors_total`.
//!
//! In dry-run mode an admitted request reserves and settles exactly as when enforced, so the
//! shadow state (debts included) is the enforced one. A would-be rejection reserved nothing,
//! so there is nothing to settle: its response is not read by `count_if` or `settle`, and a
//! key in debt goes on collecting would-be rejections (`outcome="limited", dry_run="true"`)
//! until time pays the debt off. The `RateLimit` fields of a settled response follow
//! `dry_run_headers` like every other.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tollgate::observe::DryRunRejection;
//! use tollgate::{key, Quota, RateLimitLayer};
//!
//! // Shadow mode: what would 10 per second per API key reject?
//! let shadow = RateLimitLayer::new(Quota::per_second(10))
//!     .key(key::Header::new("x-api-key"))
//!     .dry_run(true);
//! let app: Router = Router::new()
//!     .route("/", get(|req: axum::extract::Request| async move {
//!         match DryRunRejection::first(req.extensions()) {
//!             Some(r) => format!("would have been rejected by {:?}", r.policy()),
//!             None => "ok".to_owned(),
//!         }
//!     }))
//!     .layer(shadow);
//! # let _ = app;
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use crate::response::RejectionKind;

mod meter;
mod trace;

#[cfg(feature = "redis")]
pub(crate) use meter::RedisMeter;
pub(crate) use meter::{AdaptiveMeter, ConcurrencyMeter, DecisionMeter, Held, ShapeMeter};
pub(crate) use trace::{config, rejected};

/// Which kind of layer (or limiter) made a decision: the `layer` label of the metrics and
/// the field of the tracing events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LayerKind {
    /// A [`RateLimitLayer`](crate::RateLimitLayer).
    RateLimit,
    /// A [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer).
    Concurrency,
    /// A [`ShapeLayer`](crate::ShapeLayer).
    Shape,
    /// A limiter used without HTTP ([`RateLimiter`](crate::RateLimiter), a Redis limiter).
    Limiter,
}

impl LayerKind {
    /// The label value: `"rate_limit"`, `"concurrency"`, `"shape"` or `"limiter"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerKind::RateLimit => "rate_limit",
            LayerKind::Concurrency => "concurrency",
            LayerKind::Shape => "shape",
            LayerKind::Limiter => "limiter",
        }
    }
}

/// What a decision came to: the `outcome` label of `tollgate_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    Delayed,
    Waited,
    Limited,
    NeverFits,
    QueueFull,
    MissingKey,
    FailOpen,
    FailClosed,
    Banned,
    LocalAllowed,
    LocalLimited,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Delayed => "delayed",
            Verdict::Waited => "waited",
            Verdict::Limited => "limited",
            Verdict::NeverFits => "never_fits",
            Verdict::QueueFull => "queue_full",
            Verdict::MissingKey => "missing_key",
            Verdict::FailOpen => "fail_open",
            Verdict::FailClosed => "fail_closed",
            Verdict::Banned => "banned",
            Verdict::LocalAllowed => "local_allowed",
            Verdict::LocalLimited => "local_limited",
        }
    }

    /// The outcome of a rejection of `kind`.
    pub(crate) fn of_rejection(kind: RejectionKind) -> Verdict {
        match kind {
            RejectionKind::RateLimited | RejectionKind::Concurrency => Verdict::Limited,
            RejectionKind::CostExceedsBurst => Verdict::NeverFits,
            RejectionKind::MissingKey => Verdict::MissingKey,
            RejectionKind::QueueFull => Verdict::QueueFull,
            RejectionKind::StoreUnavailable => Verdict::FailClosed,
            RejectionKind::Banned => Verdict::Banned,
        }
    }
}

/// The outcome of a rate-limit decision of `cost`, and the quota that fired (see [`fired`]).
#[cfg(feature = "metrics")]
pub(crate) fn verdict_of(d: &crate::Decision, cost: u32) -> (Verdict, Option<usize>) {
    use crate::Outcome;
    match d.outcome() {
        Outcome::Allowed if d.is_local() => (Verdict::LocalAllowed, None),
        Outcome::Allowed if d.is_degraded() => (Verdict::FailOpen, None),
        Outcome::Allowed => (Verdict::Allowed, None),
        Outcome::Limited if d.is_local() => (Verdict::LocalLimited, None),
        _ if d.is_degraded() && !d.is_local() => (Verdict::FailClosed, None),
        Outcome::Exceeds => (Verdict::NeverFits, fired(d, cost)),
        Outcome::Banned => (Verdict::Banned, None),
        _ => (Verdict::Limited, fired(d, cost)),
    }
}

/// The first quota that turned a request of `cost` away: one whose burst is below the cost
/// (never fits), or one without `cost` requests remaining; else the tightest one.
pub(crate) fn fired(d: &crate::Decision, cost: u32) -> Option<usize> {
    let cost = u64::from(cost);
    let states = d.states();
    match d.outcome() {
        crate::Outcome::Exceeds => states.iter().position(|s| s.limit() < cost),
        _ => states.iter().position(|s| s.remaining() < cost),
    }
    .or_else(|| {
        let tightest = d.most_restrictive()?;
        states.iter().position(|s| *s == tightest)
    })
}

/// The decisions of a limiter used without HTTP, counted under `layer="limiter"`.
#[cfg(feature = "metrics")]
pub(crate) struct LimiterMeter {
    meter: DecisionMeter,
}

#[cfg(feature = "metrics")]
impl LimiterMeter {
    /// The meter of a limiter named `policy` with quotas named `quotas`.
    pub(crate) fn new(policy: &str, quotas: &[String], redis: bool) -> Self {
        let names = Names::new(LayerKind::Limiter, policy, quotas);
        let outcomes: &[Verdict] = if redis {
            &[
                Verdict::Allowed,
                Verdict::FailOpen,
                Verdict::FailClosed,
                Verdict::LocalAllowed,
                Verdict::LocalLimited,
            ]
        } else {
            &[Verdict::Allowed]
        };
        LimiterMeter {
            meter: DecisionMeter::new(&names, false, outcomes),
        }
    }

    /// Counts a decision of `cost` (one of cost 0 only reports, and is not counted).
    #[inline]
    pub(crate) fn record(
        &self,
        d: &crate::Decision,
        cost: u32,
        keys: impl FnOnce() -> Option<usize>,
    ) {
        if cost == 0 {
            return;
        }
        let (verdict, quota) = verdict_of(d, cost);
        self.meter.count(verdict, quota);
        self.meter.keys(verdict != Verdict::Allowed, keys);
    }
}

/// Why a Redis call gave no decision.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreError {
    Timeout,
    Connection,
    BadReply,
    /// An error about one key or the script on it (see `KeyErrorLog`): not an outage.
    Key,
}

/// The errors Redis gave about one key of a policy (a value of another type, a script error,
/// no memory for a write): logged at `ERROR` once per policy, with the key's Redis name and
/// the likely cause; each is counted in `tollgate_redis_errors_total{error="key"}`.
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct KeyErrorLog {
    policy: Box<str>,
    logged: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "redis")]
impl KeyErrorLog {
    pub(crate) fn new(policy: &str) -> Self {
        KeyErrorLog {
            policy: policy.into(),
            logged: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Logs the first key error of the policy: `key` (its Redis name), what Redis said and
    /// the likely cause; the later ones are only counted.
    pub(crate) fn report(&self, key: &[u8], error: &dyn std::fmt::Display, cause: &str) {
        if self.logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        tracing::error!(
            target: "tollgate::redis",
            policy = %self.policy,
            key = %String::from_utf8_lossy(key),
            %error,
            "Redis refused a decision on one key ({cause}); each request on such a key is \
             rejected as unavailable (503) whatever the failure mode, until the key is fixed. \
             Only the first such error of the policy is logged; all are counted in \
             tollgate_redis_errors_total{{error=\"key\"}}"
        );
    }
}

/// The names a layer reports under, resolved when it is built.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) layer: LayerKind,
    pub(crate) policy: Arc<str>,
    /// The quota names of a rate-limit policy, in its order; empty for other layers.
    pub(crate) quotas: Box<[Arc<str>]>,
}

impl Names {
    pub(crate) fn new(layer: LayerKind, policy: &str, quotas: &[String]) -> Self {
        Names {
            layer,
            policy: Arc::from(policy),
            quotas: quotas.iter().map(|q| Arc::from(q.as_str())).collect(),
        }
    }

    pub(crate) fn quota(&self, index: Option<usize>) -> Option<&Arc<str>> {
        index.and_then(|i| self.quotas.get(i))
    }
}

/// A rejection that a layer in dry-run mode would have made, found in the extensions of the
/// request it let through (see the [module docs](self#dry-run-mode)).
///
/// Every dry-run layer that would have rejected the request adds one, outermost first.
///
/// ```
/// use tollgate::observe::DryRunRejection;
///
/// let req = http::Request::new(());
/// assert!(DryRunRejection::all(req.extensions()).is_empty());
/// assert!(DryRunRejection::first(req.extensions()).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRunRejection {
    layer: LayerKind,
    kind: RejectionKind,
    status: StatusCode,
    retry_after: Option<Duration>,
    policy: Arc<str>,
    quota: Option<Arc<str>>,
}

impl DryRunRejection {
    pub(crate) fn new(
        names: &Names,
        quota: Option<usize>,
        kind: RejectionKind,
        status: StatusCode,
        retry_after: Option<Duration>,
    ) -> Self {
        DryRunRejection {
            layer: names.layer,
            kind,
            status,
            retry_after,
            policy: names.policy.clone(),
            quota: names.quota(quota).cloned(),
        }
    }

    /// The kind of layer that would have rejected the request.
    pub fn layer(&self) -> LayerKind {
        self.layer
    }

    crate::response::rejection_getters!();

    /// The policy (tier) name of a rate limit, the name of a concurrency or shaping layer
    /// (`""` without one).
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The name of the quota that would have rejected the request, for a rate limit.
    pub fn quota(&self) -> Option<&str> {
        self.quota.as_deref()
    }

    /// Every dry-run rejection of the request, outermost layer first.
    pub fn all(ext: &http::Extensions) -> &[DryRunRejection] {
        ext.get::<DryRunRejections>()
            .map_or(&[], |r| r.0.as_slice())
    }

    /// The dry-run rejection of the outermost layer that would have rejected the request.
    pub fn first(ext: &http::Extensions) -> Option<&DryRunRejection> {
        Self::all(ext).first()
    }

    /// Adds this rejection to the request's extensions.
    pub(crate) fn record(self, ext: &mut http::Extensions) {
        match ext.get_mut::<DryRunRejections>() {
            Some(list) => list.0.push(self),
            None => {
                ext.insert(DryRunRejections(vec![self]));
            }
        }
    }
}

impl fmt::Display for DryRunRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} would have rejected the request: {}",
            self.layer.as_str(),
            &*self.policy,
            self.kind.code()
        )?;
        if let Some(q) = &self.quota {
            write!(f, " (quota {q:?})")?;
        }
        Ok(())
    }
}

/// The list kept in a request's extensions.
#[derive(Debug, Clone, Default)]
struct DryRunRejections(Vec<DryRunRejection>);

/// The observability settings every layer shares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Observe {
    /// Decide and record everything, reject and delay nothing.
    pub(crate) dry_run: bool,
    /// Put the key in rejection events.
    pub(crate) trace_keys: bool,
}
