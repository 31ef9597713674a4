use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use super::adaptive::LimitAlgorithm;
use super::control::{check_max, Classifier, Control, Priority, Shares};
use super::handle::{ConcurrencyHandle, Live};
use super::permit::{GlobalLimit, KeyedLimit};
use super::service::OUTCOMES;
use super::service::{ConcurrencyLimit, Limit, Shared};
use crate::error::ConfigError;
use crate::headers;
use crate::key::{Global, KeyExtractor, RequestHead};
use crate::layer::common::{common_setters, Common, Lazy};
use crate::observe::{self, AdaptiveMeter, ConcurrencyMeter, DecisionMeter, LayerKind, Names};
use crate::settings::ConcurrencySettings;

/// The `Retry-After` hint of a rejection unless [`retry_after`](ConcurrencyLimitLayer::retry_after)
/// says otherwise.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Limits how many requests are in flight at once. See the [module docs](crate::concurrency).
///
/// One layer value is one shared state: clones, and every service it wraps (every route of a
/// `Router::layer`), count against the same limit. Two layer values are two limits. (tower's
/// `ConcurrencyLimitLayer` gives each wrapped service its own semaphore instead.)
#[must_use]
#[derive(Clone)]
pub struct ConcurrencyLimitLayer<E: KeyExtractor = Global> {
    max: usize,
    common: Common<E>,
    retry_after: Duration,
    queue: Option<(usize, Duration)>,
    release_on_headers: bool,
    max_hold: Option<Duration>,
    policy_name: Option<Cow<'static, str>>,
    adaptive: Option<NewAlgorithm>,
    classify: Option<Classifier>,
    shares: Shares,
    state: Lazy<Shared<E>>,
}

/// Makes the algorithm of a new layer state (a layer value may be built on more than once).
type NewAlgorithm = Arc<dyn Fn() -> Box<dyn LimitAlgorithm> + Send + Sync>;

impl<E: KeyExtractor + fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ConcurrencyLimitLayer");
        d.field("max", &self.max);
        if is_keyed::<E::Key>() {
            d.field("key", &self.common.extractor);
        }
        d.field("queue", &self.queue)
            .field("release_on_headers", &self.release_on_headers)
            .field("max_hold", &self.max_hold)
            .field("adaptive", &self.adaptive.is_some())
            .field("priority", &self.classify.is_some())
            .field("shares", &self.shares)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayer<Global> {
    /// At most `max` requests in flight at once, across everything this layer wraps, until
    /// [`key`](Self::key) makes it a limit per key.
    ///
    /// `max` must be at least 1: an invalid value (e.g. read from configuration) is reported
    /// by [`validate`](Self::validate), or else by a panic when the layer is applied whose
    /// message names this line.
    #[track_caller]
    pub fn new(max: usize) -> Self {
        let mut common = Common::new(Global);
        common.note("max", check_max(max));
        ConcurrencyLimitLayer {
            max,
            common,
            retry_after: DEFAULT_RETRY_AFTER,
            queue: None,
            release_on_headers: false,
            max_hold: None,
            policy_name: None,
            adaptive: None,
            classify: None,
            shares: Shares::default(),
            state: Lazy::default(),
        }
    }
}

impl<E: KeyExtractor> ConcurrencyLimitLayer<E> {
    common_setters! {
        fn changed;
    }

    /// Applies the limit to each key separately, as `extractor` finds it (see [`crate::key`]):
    /// at most `max` requests in flight *per key*, and, with [`queue`](Self::queue), a queue
    /// per key.
    ///
    /// A key type without values to tell apart (`.key(key::Global)`, whose key is `()`)
    /// keeps the limit global.
    ///
    /// **This changes the rejection status:** over a limit per key, clients get
    /// `429 Too Many Requests` (the client is sending too much), where a global limit answers
    /// `503 Service Unavailable` (the server is busy). A hook set with
    /// [`on_reject`](Self::on_reject) sees the status in
    /// [`Rejection::status`](crate::response::Rejection::status).
    ///
    /// Every other setting is kept, whatever the order of the calls; a
    /// `MissingKey::UseKey` set before `key` cannot follow the new key type and is reported
    /// by [`validate`](Self::validate) (and when the layer is applied).
    ///
    /// A key's semaphore exists only while the key has requests in flight or waiting, so the
    /// memory used is bounded by the number of such requests, however many keys clients
    /// invent. For a global limit *and* a limit per key, stack two layers.
    pub fn key<E2: KeyExtractor>(self, extractor: E2) -> ConcurrencyLimitLayer<E2> {
        ConcurrencyLimitLayer {
            max: self.max,
            common: self.common.rekey(extractor),
            retry_after: self.retry_after,
            queue: self.queue,
            release_on_headers: self.release_on_headers,
            max_hold: self.max_hold,
            policy_name: self.policy_name,
            adaptive: self.adaptive,
            classify: self.classify,
            shares: self.shares,
            state: Lazy::default(),
        }
    }

    common_setters! {
        /// What to do when no key can be extracted (default: reject with 400). The same policy
        /// type as [`RateLimitLayer::on_missing_key`](crate::RateLimitLayer::on_missing_key).
        fn on_missing_key;

        /// Lets requests from `cidr` (`"10.0.0.0/8"`, `"2001:db8::/32"`, or one address) through
        /// without any limit, as [`RateLimitLayer::allow_ip`](crate::RateLimitLayer::allow_ip)
        /// describes: matched against the client address the key extractor resolves.
        fn allow_ip;

        /// Lets requests whose key is `key` through without any limit. Call it after
        /// [`key`](Self::key): a key of an earlier key type is reported as
        /// [`ConfigError::AllowKeyBeforeKey`](crate::ConfigError::AllowKeyBeforeKey).
        fn allow_key;
    }

    /// Lets requests over the limit wait for a place instead of being rejected at once (the
    /// default, without a queue).
    ///
    /// At most `max_waiting` requests wait (per key, for a keyed limit), first in first out,
    /// each for at most `max_wait`:
    ///
    /// * a request that finds the queue full is rejected at once, as
    ///   [`RejectionKind::QueueFull`](crate::response::RejectionKind::QueueFull);
    /// * a request still waiting after `max_wait` is rejected as
    ///   [`RejectionKind::Concurrency`](crate::response::RejectionKind::Concurrency), like a
    ///   request rejected at once without a queue.
    ///
    /// A waiting request whose future is dropped (the client went away) leaves the queue at
    /// once. `max_waiting = 0` turns waiting off: every request over the limit is then
    /// rejected as `QueueFull`.
    pub fn queue(mut self, max_waiting: usize, max_wait: Duration) -> Self {
        self.queue = Some((max_waiting, max_wait));
        self.changed()
    }

    /// Gives a request's place back as soon as the response headers are ready, as tower's
    /// `ConcurrencyLimit` does, instead of when the response body is finished or dropped.
    ///
    /// Suits services whose bodies are small and already in memory; a streaming body then no
    /// longer counts against the limit.
    pub fn release_on_headers(mut self) -> Self {
        self.release_on_headers = true;
        self.changed()
    }

    /// Bounds how long a response body may hold its request's place: after `max_hold`,
    /// counted from the response headers, the place is given back **and the body keeps
    /// streaming**; it is no longer counted against the limit. A body that ends (or is
    /// dropped) sooner gives its place back then, as without this setting.
    ///
    /// Without it, a streamed body holds its place for as long as the server keeps the
    /// connection open, and a client that stops reading can keep it open indefinitely (see
    /// the [module docs](crate::concurrency#slow-clients-and-upgrades)). The timer runs on
    /// tokio's clock (a paused clock in tests) in a task of its own, since a server does not
    /// poll the body of a client that stopped reading; outside a tokio runtime there is no
    /// timer and the body holds its place until it is done.
    ///
    /// With an [adaptive](Self::adaptive) limit, a place given back by the timer teaches the
    /// limit nothing, as a client that went away: the time was the client's, not the
    /// service's. `Duration::ZERO` gives the place back with the headers, as
    /// [`release_on_headers`](Self::release_on_headers) does (and records the latency to the
    /// headers); `Duration::MAX` saturates to tokio's far future, which is never in practice.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self.changed()
    }

    /// The `Retry-After` hint sent with rejections (default 1 s; whole seconds, rounded up,
    /// at least 1).
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self.changed()
    }

    common_setters! {
        /// Dry-run (shadow) mode: every request is decided, counted and traced as if the limit
        /// were enforced, but none is rejected or queued. A request over the limit (or one that
        /// would have waited in the queue) goes on at once without a permit, so the permits held
        /// are those enforcement would hold, and carries a
        /// [`DryRunRejection`](crate::observe::DryRunRejection) in its extensions. See
        /// [`observe`](crate::observe#dry-run-mode).
        ///
        /// ```
        /// use tollgate::ConcurrencyLimitLayer;
        /// let shadow = ConcurrencyLimitLayer::new(64).name("db").dry_run(true);
        /// # let _ = shadow;
        /// ```
        fn dry_run;

        /// Whether rejection events (target `tollgate::reject`) carry the request's key, in its
        /// `Debug` form (default: no; a key is often an IP address or a user id).
        fn trace_keys;

        /// Builds rejection responses with `hook` instead of the default plain-text 503 or 429.
        fn on_reject;
    }

    /// Names the layer, and with the name adds an item to `RateLimit-Policy` on every
    /// response of the layer (without a name, a concurrency limit sends no header field):
    /// `"name";q=max;qu="concurrent-requests"` (draft-ietf-httpapi-ratelimit-headers-10).
    ///
    /// The item is appended, so the fields of a rate limit on the same route are kept. The
    /// name must be printable ASCII without `"` or `\`; an invalid name is reported by
    /// [`validate`](Self::validate), or else when the layer is applied, naming this line.
    #[track_caller]
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        let name = name.into();
        self.common.note("name", headers::check_name(&name));
        self.policy_name = Some(name);
        self.changed()
    }

    /// The former name of [`name`](Self::name).
    #[deprecated(note = "use `.name(..)`, the name every layer gives this setting")]
    #[track_caller]
    pub fn policy_header(self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name(name)
    }

    /// Moves the limit at run time with `algorithm` ([`Aimd`](super::Aimd),
    /// [`Gradient2`](super::Gradient2), or one of your own), from the latency of completed
    /// requests, measured from taking the permit to the end of the response body (to the
    /// headers with [`release_on_headers`](Self::release_on_headers)).
    ///
    /// The limit starts at the algorithm's initial limit and stays within its bounds, and
    /// never above this layer's `max` (so `new(max)` is the ceiling). A request whose
    /// response future or body is dropped before the end (the client went away) is not
    /// taken into account; one whose service failed, answered `503` or `504`, or whose body
    /// failed, counts as dropped. A lower limit never cuts requests short: places are taken
    /// away as requests in flight finish.
    ///
    /// With [`key`](Self::key), there is **one** adaptive limit, learnt from the requests of
    /// all keys and applied to each key: a key may have up to the current limit in flight.
    /// The latency measured is the service's, which all keys share, and a key's state lives
    /// only while it has requests in flight, too briefly to learn anything of its own.
    ///
    /// See [`limit`](Self::limit) and [`latency`](Self::latency) for what it measured.
    pub fn adaptive<A>(mut self, algorithm: A) -> Self
    where
        A: LimitAlgorithm + Clone + Sync,
    {
        self.adaptive = Some(Arc::new(move || Box::new(algorithm.clone())));
        self.changed()
    }

    /// Classifies each request as [`Priority::Critical`], [`Normal`](Priority::Normal) or
    /// [`Sheddable`](Priority::Sheddable): under pressure, the lower classes are rejected
    /// first (`503`, or `429` for a keyed limit, counted by [`sheds`](Self::sheds)), and
    /// critical requests keep a share of the limit no flood of other requests can take.
    ///
    /// A request is admitted only while the requests in flight, itself included, are within
    /// its class's [share](Priority::share) of the current limit: 50% for sheddable, 90% for
    /// normal, all of it for critical. A request over its share is rejected at once, even
    /// with a [`queue`](Self::queue): the queue holds requests within their share waiting
    /// for a permit. Works with a fixed and an [adaptive](Self::adaptive) limit, per key
    /// with [`key`](Self::key).
    pub fn priority<F>(mut self, classify: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Priority + Send + Sync + 'static,
    {
        self.classify = Some(Arc::new(classify));
        self.changed()
    }

    /// The fractions of the limit that [sheddable](Priority::Sheddable) and
    /// [normal](Priority::Normal) requests may take (default 0.5 and 0.9; critical requests
    /// may always take all of it). Applies with [`priority`](Self::priority); without a
    /// classifier every request may take the whole limit.
    ///
    /// ```
    /// use tollgate::concurrency::{Priority, Shares};
    /// use tollgate::ConcurrencyLimitLayer;
    ///
    /// // Under a limit of 40: at most 10 sheddable requests in flight, at most 24 with the
    /// // normal ones, and 16 places that only critical requests take.
    /// let limit = ConcurrencyLimitLayer::new(40)
    ///     .priority(|req| match req.uri.path() {
    ///         "/pay" => Priority::Critical,
    ///         "/suggest" => Priority::Sheddable,
    ///         _ => Priority::Normal,
    ///     })
    ///     .shares(Shares::new(0.25, 0.6));
    /// # let _ = limit;
    /// ```
    pub fn shares(mut self, shares: Shares) -> Self {
        self.shares = shares;
        self.changed()
    }

    /// The current limit: `max` for a fixed limit, the limit the algorithm has reached for
    /// an [adaptive](Self::adaptive) one (its initial limit before the layer is applied).
    pub fn limit(&self) -> usize {
        match self.built_shared().and_then(|s| s.control.as_ref()) {
            Some(control) => control.limit(),
            None => match &self.adaptive {
                Some(new) if self.built_shared().is_none() => {
                    new().initial_limit().clamp(1, self.max.max(1))
                }
                _ => self.max,
            },
        }
    }

    /// The latency of recently completed requests (an exponential average over about 8 of
    /// them), as an [adaptive](Self::adaptive) limit measures it. `None` before the first
    /// request completes, and for a fixed limit.
    pub fn latency(&self) -> Option<Duration> {
        self.built_shared()
            .and_then(|s| s.control.as_ref())
            .and_then(|c| c.latency())
    }

    /// How many requests were rejected because their [priority](Self::priority) class had
    /// used up its share of the limit.
    pub fn sheds(&self) -> u64 {
        self.built_shared()
            .and_then(|s| s.control.as_ref())
            .map_or(0, |c| c.sheds())
    }

    fn built_shared(&self) -> Option<&Arc<Shared<E>>> {
        self.state.get()
    }

    /// Checks the configuration now, for layers built from values read at run time.
    ///
    /// `Layer::layer` panics with the same error otherwise, when the app is assembled.
    pub fn validate(self) -> Result<Self, ConfigError>
    where
        E: Clone,
    {
        self.shared().map(|_| ())?;
        Ok(self)
    }

    /// How many requests hold a place now (in flight, their bodies not yet finished).
    ///
    /// 0 before the layer has been applied. Sums over the keys for a keyed limit.
    pub fn in_flight(&self) -> usize {
        match self.built() {
            Some(Limit::Global(g)) => g.in_flight(),
            Some(Limit::Keyed(k)) => k.in_flight(),
            None => 0,
        }
    }

    /// How many requests wait in the queue now (summed over the keys for a keyed limit).
    pub fn waiting(&self) -> usize {
        match self.built() {
            Some(Limit::Global(g)) => g.waiting(),
            Some(Limit::Keyed(k)) => k.waiting(),
            None => 0,
        }
    }

    /// How many keys are tracked now: those with requests in flight or waiting. A key is
    /// forgotten as soon as its last request is done, so this is never more than
    /// [`in_flight`](Self::in_flight) + [`waiting`](Self::waiting). Always 0 for a global
    /// limit.
    pub fn tracked_keys(&self) -> usize {
        match self.built() {
            Some(Limit::Keyed(k)) => k.len(),
            _ => 0,
        }
    }

    fn built(&self) -> Option<&Limit<E::Key>> {
        self.state.get().map(|shared| &shared.limit)
    }

    /// A handle that changes this layer's maximum and queue bounds while it serves, for
    /// every clone of the layer and every service it made; see [`ConcurrencyHandle`].
    ///
    /// Take it once the layer is configured and **before it is applied**: a limit that can
    /// change follows a moving target on each permit, which a layer applied without a handle
    /// does not pay for. Returns [`ConfigError::NotChangeable`] for a layer applied before,
    /// and the layer's configuration error if it has one.
    pub fn handle(&self) -> Result<ConcurrencyHandle, ConfigError>
    where
        E: Clone,
    {
        let shared = self.state.get_or_build(|| self.build(true))?;
        match &shared.control {
            Some(control) => {
                let sync: Arc<dyn Fn() + Send + Sync> = match &shared.limit {
                    Limit::Global(global) => {
                        let global = global.clone();
                        Arc::new(move || global.sync())
                    }
                    Limit::Keyed(keyed) => {
                        let keyed = keyed.clone();
                        Arc::new(move || keyed.sync())
                    }
                };
                Ok(ConcurrencyHandle::new(
                    control.clone(),
                    shared.live.clone(),
                    sync,
                ))
            }
            None => Err(ConfigError::NotChangeable(
                "the maximum of a concurrency limit applied before its handle was taken",
            )),
        }
    }

    fn shared(&self) -> Result<Arc<Shared<E>>, ConfigError>
    where
        E: Clone,
    {
        self.state.get_or_build(|| self.build(false))
    }

    /// Builds the state; `changeable` when a handle asks for it.
    fn build(&self, changeable: bool) -> Result<Shared<E>, ConfigError>
    where
        E: Clone,
    {
        let core = self.common.core()?;
        let live = Arc::new(Live::new(self.queue, self.policy_name.as_deref(), self.max));
        let control = match (&self.adaptive, &self.classify) {
            (Some(new), _) => Some(Control::adaptive(self.max, new())),
            (None, Some(_)) => Some(Control::fixed(self.max)),
            (None, None) if changeable => Some(Control::fixed(self.max)),
            (None, None) => None,
        };
        let names = Names::new(
            LayerKind::Concurrency,
            self.policy_name.as_deref().unwrap_or(""),
            &[],
        );
        let observe = self.common.observe;
        let control = control.map(|c| {
            let meter = AdaptiveMeter::new(&names, observe.dry_run);
            Arc::new(c.with_shares(self.shares).with_meter(meter))
        });
        let (limit, status) = if is_keyed::<E::Key>() {
            let limit = Limit::Keyed(KeyedLimit::new(self.max, control.clone()));
            (limit, StatusCode::TOO_MANY_REQUESTS)
        } else {
            let limit = Limit::Global(GlobalLimit::new(self.max, control.as_ref()));
            (limit, StatusCode::SERVICE_UNAVAILABLE)
        };
        let settings = (self.max, self.queue);
        observe::config(&names, observe.dry_run, observe.trace_keys, &settings);
        Ok(Shared {
            core,
            limit,
            status,
            live,
            meter: DecisionMeter::new(&names, observe.dry_run, OUTCOMES),
            gauges: ConcurrencyMeter::new(&names, observe.dry_run),
            names,
            retry_after: self.retry_after,
            release_on_headers: self.release_on_headers || self.max_hold == Some(Duration::ZERO),
            max_hold: self.max_hold.filter(|d| !d.is_zero()),
            policy_name: self.policy_name.as_deref().map(Box::from),
            control,
            classify: self.classify.clone(),
        })
    }
}

/// Whether a key type tells requests apart: a zero-sized key (`()` of [`Global`]) has a
/// single value, so the limit is one for everything, as everywhere in the crate.
fn is_keyed<K>() -> bool {
    std::mem::size_of::<K>() != 0
}

impl ConcurrencySettings {
    /// A layer with these settings (global; `.key(..)` and the other builder calls apply as
    /// usual).
    pub fn layer(&self) -> ConcurrencyLimitLayer {
        let layer = ConcurrencyLimitLayer::new(self.max);
        match self.queue {
            Some(q) => layer.queue(q.max_waiting, q.max_wait),
            None => layer,
        }
    }
}

impl<S, E: KeyExtractor + Clone> Layer<S> for ConcurrencyLimitLayer<E> {
    type Service = ConcurrencyLimit<S, E>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        match self.shared() {
            Ok(shared) => ConcurrencyLimit::from_shared(inner, shared),
            Err(e) => self.common.invalid("ConcurrencyLimitLayer", e),
        }
    }
}
