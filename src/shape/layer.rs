use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use arc_swap::ArcSwap;

use super::handle::{Change, ShapeHandle};
use super::service::OUTCOMES;
use super::service::{Fields, Shape, Shared};
use super::shaper::Shaper;
use crate::error::ConfigError;
use crate::headers;
use crate::key::{Global, KeyExtractor};
use crate::layer::common::{common_setters, Common, Lazy};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::observe::{self, DecisionMeter, LayerKind, Names, ShapeMeter};
use crate::quota::Quota;
use crate::rate_limit::policy::rate_name;
use crate::settings::ShapeSettings;

/// Shapes HTTP traffic: requests wait in a bounded first-in-first-out queue per key and are
/// forwarded at the quota's rate. See the [module docs](crate::shape).
///
/// One layer value is one shared state: clones, and every service it wraps (every route of a
/// `Router::layer`), share the same queues. Two layer values are two queues.
#[must_use]
#[derive(Clone)]
pub struct ShapeLayer<E: KeyExtractor = Global> {
    quota: Quota,
    common: Common<E>,
    no_delay_burst: u32,
    warm_up: Option<(Duration, u32)>,
    max_queue: Option<usize>,
    max_delay: Option<Duration>,
    max_keys: usize,
    name: Option<Cow<'static, str>>,
    headers: bool,
    state: Lazy<Shared<E>>,
}

impl<E: KeyExtractor + fmt::Debug> fmt::Debug for ShapeLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeLayer")
            .field("quota", &self.quota)
            .field("extractor", &self.common.extractor)
            .field("no_delay_burst", &self.no_delay_burst)
            .field("max_queue", &self.max_queue)
            .field("max_delay", &self.max_delay)
            .finish_non_exhaustive()
    }
}

impl ShapeLayer<Global> {
    /// Forwards requests at `quota`'s rate (one per `T = period / count`), first in first out,
    /// all in one queue until [`key`](Self::key) says otherwise.
    ///
    /// The quota's burst is not used: requests are spaced out (see
    /// [`no_delay_burst`](Self::no_delay_burst)). Unless [`max_waiting`](Self::max_waiting) or
    /// [`max_wait`](Self::max_wait) is set, a key's queue takes one period's worth of
    /// requests: an idle key may send `count` at once (the first leaves, `count - 1` wait,
    /// the last one about a period; at least one may wait), and more are refused with 429.
    pub fn new(quota: Quota) -> Self {
        ShapeLayer {
            quota,
            common: Common::new(Global),
            no_delay_burst: 0,
            warm_up: None,
            max_queue: None,
            max_delay: None,
            max_keys: DEFAULT_MAX_KEYS,
            name: None,
            headers: true,
            state: Lazy::default(),
        }
    }
}

impl<E: KeyExtractor> ShapeLayer<E> {
    common_setters! {
        fn changed;
    }

    /// Gives each key (see [`crate::key`]) its own queue and its own rate.
    ///
    /// Every other setting is kept, whatever the order of the calls; a
    /// `MissingKey::UseKey` set before `key` cannot follow the new key type and is reported
    /// by [`validate`](Self::validate) (and when the layer is applied).
    pub fn key<E2: KeyExtractor>(self, extractor: E2) -> ShapeLayer<E2> {
        ShapeLayer {
            quota: self.quota,
            common: self.common.rekey(extractor),
            no_delay_burst: self.no_delay_burst,
            warm_up: self.warm_up,
            max_queue: self.max_queue,
            max_delay: self.max_delay,
            max_keys: self.max_keys,
            name: self.name,
            headers: self.headers,
            state: Lazy::default(),
        }
    }

    /// Lets up to `n` requests go ahead of the rate without waiting after the key was idle
    /// (default `0`: pure smoothing).
    ///
    /// With `n`, an idle key's first `n + 1` requests are forwarded at once (the first is on
    /// schedule anyway) and the rest are spaced one interval apart; the allowance comes back at
    /// one request per interval. This is nginx's `delay=n`: `limit_req burst=B delay=D` is
    /// `.no_delay_burst(D).max_waiting(B - D)`, and `limit_req burst=B` (no `delay`, no
    /// `nodelay`) is `.max_waiting(B)`.
    pub fn no_delay_burst(mut self, n: u32) -> Self {
        self.no_delay_burst = n;
        self.changed()
    }

    /// Forwards slowly after idleness: a key's first departures are spaced `cold_factor`
    /// times wider than the quota's interval, narrowing to the interval over `period` of
    /// steady traffic (Sentinel's warm-up with queue). A key left idle cools down again over
    /// `period`. The spacing follows the same curve as a warm-up quota; see
    /// [`WarmUp`](crate::warmup::WarmUp) for the formula, and [`ShaperBuilder::warm_up`](super::ShaperBuilder::warm_up).
    ///
    /// The queue bounds count the same: a cold key's waiters wait longer, so
    /// [`max_wait`](Self::max_wait) admits fewer of them. Invalid values are reported by
    /// [`validate`](Self::validate), or when the layer is applied.
    pub fn warm_up(mut self, period: Duration, cold_factor: u32) -> Self {
        self.warm_up = Some((period, cold_factor));
        self.changed()
    }

    /// Refuses (429) a request that would make more than `n` requests of its key wait.
    /// Requests whose slot has come are not counted; `0` forwards at the rate and refuses
    /// whatever comes faster. The same setting, of the same name, as the first bound of
    /// [`ConcurrencyLimitLayer::queue`](crate::ConcurrencyLimitLayer::queue).
    ///
    /// With neither this nor [`max_wait`](Self::max_wait) set, a key's queue holds one
    /// period's worth of requests (see [`new`](Self::new)); setting only one of the two
    /// bounds leaves the other unlimited.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_queue = Some(n);
        self.changed()
    }

    /// Refuses (429) a request that would have to wait longer than `d`: it is refused at
    /// once, when its place in the schedule is known, rather than after waiting `d`. Unset by
    /// default; see [`max_waiting`](Self::max_waiting) for the bound that applies then.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_delay = Some(d);
        self.changed()
    }

    /// Both bounds of the queue at once, as for a concurrency limit:
    /// `.queue(n, d)` is `.max_waiting(n).max_wait(d)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{ConcurrencyLimitLayer, Quota, ShapeLayer};
    ///
    /// // The same words on both layers: 20 may wait, none longer than 2 s.
    /// let shape = ShapeLayer::new(Quota::per_second(10)).queue(20, Duration::from_secs(2));
    /// let limit = ConcurrencyLimitLayer::new(8).queue(20, Duration::from_secs(2));
    /// # let _ = (shape, limit);
    /// ```
    pub fn queue(self, max_waiting: usize, max_wait: Duration) -> Self {
        self.max_waiting(max_waiting).max_wait(max_wait)
    }

    /// The former name of [`max_waiting`](Self::max_waiting).
    #[deprecated(note = "use `.max_waiting(n)`, the name a concurrency limit's queue uses too")]
    pub fn max_queue(self, n: usize) -> Self {
        self.max_waiting(n)
    }

    /// The former name of [`max_wait`](Self::max_wait).
    #[deprecated(note = "use `.max_wait(d)`, the name a concurrency limit's queue uses too")]
    pub fn max_delay(self, d: Duration) -> Self {
        self.max_wait(d)
    }

    /// Bounds the number of keys tracked (default 1 000 000). Idle keys are forgotten first,
    /// which changes nothing; when every tracked key is busy, requests of new keys are refused
    /// with 429 until one goes idle. `0` is invalid.
    #[track_caller]
    pub fn max_keys(mut self, n: usize) -> Self {
        self.common.note("max_keys", check_max_keys(n));
        self.max_keys = n;
        self.changed()
    }

    /// Names the layer in the `RateLimit-Policy` and `RateLimit` header fields (default: the
    /// quota's name, else `"shape-"` and the quota's rate, e.g. `"shape-10-per-1s"`, so that
    /// two layers say which one answered). An invalid name is reported by
    /// [`validate`](Self::validate), or else when the layer is applied, naming this line.
    #[track_caller]
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        let name = name.into();
        self.common.note("name", headers::check_name(&name));
        self.name = Some(name);
        self.changed()
    }

    common_setters! {
        /// What to do when no key can be extracted (default: reject with 400).
        fn on_missing_key;

        /// Lets requests from `cidr` (`"10.0.0.0/8"`, `"2001:db8::/32"`, or one address) through
        /// without any limit, as [`RateLimitLayer::allow_ip`](crate::RateLimitLayer::allow_ip)
        /// describes: matched against the client address the key extractor resolves.
        fn allow_ip;

        /// Lets requests whose key is `key` through without any limit. Call it after
        /// [`key`](Self::key): a key of an earlier key type is reported as
        /// [`ConfigError::AllowKeyBeforeKey`](crate::ConfigError::AllowKeyBeforeKey).
        fn allow_key;

        /// Dry-run (shadow) mode: every request is decided, counted and traced as if shaping
        /// were enforced, but none is delayed or rejected. A request that would have waited goes
        /// on at once and its place in the schedule is kept until its slot, so the schedule and
        /// the delays reported are those enforcement would have; one the queue would have
        /// refused goes on with a [`DryRunRejection`](crate::observe::DryRunRejection) in its
        /// extensions and takes no place. No `RateLimit` header fields are sent. See
        /// [`observe`](crate::observe#dry-run-mode).
        ///
        /// ```
        /// use tollgate::{Quota, ShapeLayer};
        /// let shadow = ShapeLayer::new(Quota::per_second(50)).name("upstream").dry_run(true);
        /// # let _ = shadow;
        /// ```
        fn dry_run;

        /// Whether rejection events (target `tollgate::reject`) carry the request's key, in its
        /// `Debug` form (default: no; a key is often an IP address or a user id).
        fn trace_keys;

        /// Builds rejection responses with `hook` instead of the default plain-text 429.
        fn on_reject;
    }

    /// Whether to add `RateLimit-Policy` and `RateLimit` to responses (default: yes).
    pub fn ratelimit_headers(mut self, on: bool) -> Self {
        self.headers = on;
        self.changed()
    }

    /// Checks the configuration now, for layers built from values read at run time.
    ///
    /// `Layer::layer` panics with the same error otherwise, when the app is assembled.
    pub fn validate(self) -> Result<Self, ConfigError>
    where
        E: Clone,
    {
        self.shared()?;
        Ok(self)
    }

    /// The shaper behind the layer, sharing its queues: to watch it, or to queue work that is
    /// not HTTP behind the same rate.
    pub fn shaper(&self) -> Result<Shaper<E::Key>, ConfigError>
    where
        E: Clone,
    {
        Ok(self.shared()?.shaper.clone())
    }

    /// A handle that changes this layer's rate and queue bounds while it serves, for every
    /// clone of the layer and every service it made; see [`ShapeHandle`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, ShapeLayer};
    ///
    /// let layer = ShapeLayer::new(Quota::per_second(10)).max_waiting(20);
    /// let handle = layer.handle().unwrap();
    /// handle.set_quota(Quota::per_second(2)).unwrap();
    /// handle.set_queue(Some(5), Some(Duration::from_secs(3))).unwrap();
    /// assert_eq!(layer.shaper().unwrap().quota(), Quota::per_second(2));
    /// ```
    pub fn handle(&self) -> Result<ShapeHandle, ConfigError>
    where
        E: Clone,
    {
        let shared = self.shared()?;
        let on = self.headers;
        Ok(ShapeHandle::new(Arc::new(move |change| {
            let shaper = &shared.shaper;
            match change {
                Change::Quota(q) => shaper.set_quota(q)?,
                Change::Bounds(n, d) => shaper.set_queue(n, d)?,
            }
            let fields = Fields::of(shaper, &shared.name, on);
            shared.fields.store(Arc::new(fields));
            Ok(())
        })))
    }

    fn shared(&self) -> Result<Arc<Shared<E>>, ConfigError>
    where
        E: Clone,
    {
        self.state.get_or_build(|| self.build())
    }

    fn build(&self) -> Result<Shared<E>, ConfigError>
    where
        E: Clone,
    {
        let core = self.common.core()?;
        let name: Box<str> = match (&self.name, self.quota.name()) {
            (Some(n), _) => n.as_ref().into(),
            (None, Some(n)) => n.into(),
            (None, None) => format!("shape-{}", rate_name(&self.quota)).into(),
        };
        headers::check_name(&name)?;
        let mut builder = Shaper::<E::Key>::builder(self.quota.clone())
            .no_delay_burst(self.no_delay_burst)
            .max_keys(self.max_keys);
        if let Some((period, cold_factor)) = self.warm_up {
            builder = builder.warm_up(period, cold_factor);
        }
        if self.max_queue.is_none() && self.max_delay.is_none() {
            let one_period = self.quota.count().saturating_sub(1).max(1);
            builder = builder.max_waiting(one_period as usize);
        }
        if let Some(n) = self.max_queue {
            builder = builder.max_waiting(n);
        }
        if let Some(d) = self.max_delay {
            builder = builder.max_wait(d);
        }
        let shaper = builder.try_build()?;
        let fields = Fields::of(&shaper, &name, self.headers);
        let names = Names::new(LayerKind::Shape, &name, &[]);
        let observe = self.common.observe;
        observe::config(&names, observe.dry_run, observe.trace_keys, &self.quota);
        Ok(Shared {
            core,
            shaper,
            fields: ArcSwap::from_pointee(fields),
            name,
            meter: DecisionMeter::new(&names, observe.dry_run, OUTCOMES),
            gauges: ShapeMeter::new(&names, observe.dry_run),
            names,
        })
    }
}

fn check_max_keys(n: usize) -> Result<(), ConfigError> {
    if n == 0 {
        Err(ConfigError::ZeroMaxKeys)
    } else {
        Ok(())
    }
}

impl ShapeSettings {
    /// A layer with these settings (global; `.key(..)` and the other builder calls apply as
    /// usual).
    pub fn layer(&self) -> ShapeLayer {
        let mut layer = ShapeLayer::new(self.rate.clone());
        if let Some(n) = self.max_waiting {
            layer = layer.max_waiting(n);
        }
        if let Some(d) = self.max_wait {
            layer = layer.max_wait(d);
        }
        layer
    }
}

impl<S, E: KeyExtractor + Clone> Layer<S> for ShapeLayer<E> {
    type Service = Shape<S, E>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        match self.shared() {
            Ok(shared) => Shape::from_shared(inner, shared),
            Err(e) => self.common.invalid("ShapeLayer", e),
        }
    }
}
