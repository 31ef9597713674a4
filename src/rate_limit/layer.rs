use std::fmt;
use std::sync::{Arc, OnceLock};

use http::Method;
use tower_layer::Layer;

use super::policy::Policy;
use super::service::{RateLimit, Shared, Tier};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor, MissingKey, RequestHead};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::response::OnReject;
use crate::store::{Backend, Memory, OnFull};

pub(crate) type SelectFn = dyn Fn(&RequestHead<'_>) -> Option<&'static str> + Send + Sync;
pub(crate) type CostFn = dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync;
pub(crate) type SkipFn = dyn Fn(&RequestHead<'_>) -> bool + Send + Sync;

/// Applies GCRA rate limiting to requests. See the [module docs](crate::rate_limit).
///
/// One layer value is one shared state: clones, and every service it wraps (every route of a
/// `Router::layer`), count against the same limits. Two layer values are two limits (with the
/// memory store; in Redis, limits are shared by name, see [`store`](Self::store)).
///
/// `B` is where the state lives: [`Memory`] (the default; decisions are synchronous and cost
/// no I/O) or, with the `redis` feature, a `redis::RedisStore`.
#[must_use]
pub struct RateLimitLayer<E: KeyExtractor = Global, B: Backend<E::Key> = Memory> {
    policies: Vec<Policy>,
    extractor: E,
    select: Option<Arc<SelectFn>>,
    cost: Option<Arc<CostFn>>,
    skip: Option<Arc<SkipFn>>,
    skip_methods: Vec<Method>,
    skip_paths: Vec<String>,
    on_missing: MissingKey<E::Key>,
    on_reject: Option<OnReject>,
    headers: bool,
    legacy_headers: bool,
    clock: Option<Clock>,
    max_keys: usize,
    on_full: OnFull,
    store: B,
    state: Arc<OnceLock<Result<SharedState<E, B>, ConfigError>>>,
}

/// The state of a layer, built once, shared by every service it makes.
type SharedState<E, B> = Arc<Shared<E, <B as Backend<<E as KeyExtractor>::Key>>::Limiter>>;

impl<E: KeyExtractor + Clone, B: Backend<E::Key>> Clone for RateLimitLayer<E, B> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            policies: self.policies.clone(),
            extractor: self.extractor.clone(),
            select: self.select.clone(),
            cost: self.cost.clone(),
            skip: self.skip.clone(),
            skip_methods: self.skip_methods.clone(),
            skip_paths: self.skip_paths.clone(),
            on_missing: self.on_missing.clone(),
            on_reject: self.on_reject.clone(),
            headers: self.headers,
            legacy_headers: self.legacy_headers,
            clock: self.clock.clone(),
            max_keys: self.max_keys,
            on_full: self.on_full,
            store: self.store.clone(),
            state: self.state.clone(),
        }
    }
}

impl<E: KeyExtractor + fmt::Debug, B: Backend<E::Key>> fmt::Debug for RateLimitLayer<E, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", &self.policies)
            .field("extractor", &self.extractor)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<Global> {
    /// Limits requests by `policy` (a [`Quota`](crate::Quota) or a [`Policy`]), with one key for
    /// all of them until [`key`](Self::key) says otherwise.
    pub fn new(policy: impl Into<Policy>) -> Self {
        RateLimitLayer {
            policies: vec![policy.into()],
            extractor: Global,
            select: None,
            cost: None,
            skip: None,
            skip_methods: Vec::new(),
            skip_paths: Vec::new(),
            on_missing: MissingKey::default(),
            on_reject: None,
            headers: true,
            legacy_headers: false,
            clock: None,
            max_keys: DEFAULT_MAX_KEYS,
            on_full: OnFull::default(),
            store: Memory,
            state: Arc::default(),
        }
    }
}

impl<E: KeyExtractor, B: Backend<E::Key>> RateLimitLayer<E, B> {
    fn changed(mut self) -> Self {
        // A setting changed before the layer was used: start from a fresh state.
        self.state = Arc::default();
        self
    }

    /// Counts requests per key, as `extractor` finds it (see [`crate::key`]).
    pub fn key<E2: KeyExtractor>(self, extractor: E2) -> RateLimitLayer<E2, B>
    where
        B: Backend<E2::Key>,
    {
        RateLimitLayer {
            policies: self.policies,
            extractor,
            select: self.select,
            cost: self.cost,
            skip: self.skip,
            skip_methods: self.skip_methods,
            skip_paths: self.skip_paths,
            on_missing: MissingKey::default(),
            on_reject: self.on_reject,
            headers: self.headers,
            legacy_headers: self.legacy_headers,
            clock: self.clock,
            max_keys: self.max_keys,
            on_full: self.on_full,
            store: self.store,
            state: Arc::default(),
        }
    }

    /// Keeps the limits in `store` instead of memory: with a
    /// `redis::RedisStore`, every instance of the service that uses the
    /// same Redis, key prefix and policy names shares the limits. Nothing else changes: keys,
    /// tiers, costs, headers and responses are the same.
    ///
    /// With Redis, decisions wait for one round trip (bounded by the store's timeout, after
    /// which its `redis::FailMode` decides), and
    /// [`max_keys`](Self::max_keys) / [`on_full`](Self::on_full) do not apply: Redis expires
    /// idle keys itself.
    pub fn store<B2: Backend<E::Key>>(self, store: B2) -> RateLimitLayer<E, B2> {
        RateLimitLayer {
            policies: self.policies,
            extractor: self.extractor,
            select: self.select,
            cost: self.cost,
            skip: self.skip,
            skip_methods: self.skip_methods,
            skip_paths: self.skip_paths,
            on_missing: self.on_missing,
            on_reject: self.on_reject,
            headers: self.headers,
            legacy_headers: self.legacy_headers,
            clock: self.clock,
            max_keys: self.max_keys,
            on_full: self.on_full,
            store,
            state: Arc::default(),
        }
    }

    /// Adds a quota to the default policy; all its quotas are decided together.
    pub fn quota(mut self, quota: crate::Quota) -> Self {
        self.policies[0].quotas.push(quota);
        self.changed()
    }

    /// Renames the default policy (the name shown in the `RateLimit` header fields).
    pub fn name(mut self, name: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.policies[0].name = name.into();
        self.changed()
    }

    /// Adds a tier: a policy that [`select_tier`](Self::select_tier) can choose by its name.
    /// Each tier keeps its own state.
    ///
    /// ```
    /// use tollgate::{key, Policy, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
    ///     .tier(Policy::new("vip", Quota::per_second(100)))
    ///     .key(key::Header::new("x-api-key"))
    ///     .select_tier(|req| {
    ///         let vip = req.headers.get("x-api-key").is_some_and(|k| k.as_bytes().starts_with(b"vip_"));
    ///         vip.then_some("vip")
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn tier(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self.changed()
    }

    /// Chooses the tier of each request by name; `None`, or an unknown name, means the default
    /// policy (the one given to [`new`](RateLimitLayer::new)).
    pub fn select_tier<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<&'static str> + Send + Sync + 'static,
    {
        self.select = Some(Arc::new(f));
        self.changed()
    }

    /// How many units each request costs (1 by default; 0 only reports, never rejects).
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(f));
        self.changed()
    }

    /// Lets requests for which `f` is true through without counting them.
    pub fn skip_if<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.skip = Some(Arc::new(f));
        self.changed()
    }

    /// Lets requests with this method through without counting them (e.g. `OPTIONS`).
    pub fn skip_method(mut self, method: Method) -> Self {
        self.skip_methods.push(method);
        self.changed()
    }

    /// Lets requests for exactly this path through without counting them (e.g. `/health`).
    pub fn skip_path(mut self, path: impl Into<String>) -> Self {
        self.skip_paths.push(path.into());
        self.changed()
    }

    /// What to do when no key can be extracted (default: reject with 400).
    pub fn on_missing_key(mut self, policy: MissingKey<E::Key>) -> Self {
        self.on_missing = policy;
        self.changed()
    }

    /// Builds rejection responses with `hook` instead of the default plain-text 429.
    pub fn on_reject(mut self, hook: OnReject) -> Self {
        self.on_reject = Some(hook);
        self.changed()
    }

    /// Whether to add `RateLimit-Policy` and `RateLimit` to responses (default: yes).
    pub fn ratelimit_headers(mut self, on: bool) -> Self {
        self.headers = on;
        self.changed()
    }

    /// Whether to add the legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self.changed()
    }

    /// Decides with `clock` (e.g. [`Clock::tokio`] under a paused test clock). With Redis, the
    /// clock's time is sent to the server instead of its own `TIME` (for tests).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self.changed()
    }

    /// Bounds the number of keys tracked per tier (default 1 000 000; memory store only).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self.changed()
    }

    /// What to do with a new key when `max_keys` active keys are tracked (memory store only).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self.changed()
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

    /// The limiter of the tier named `name`, for inspection or for decisions outside HTTP that
    /// share the layer's state.
    pub fn limiter(&self, name: &str) -> Result<Option<B::Limiter>, ConfigError>
    where
        E: Clone,
    {
        let shared = self.shared()?;
        Ok(shared
            .tiers
            .iter()
            .find(|t| &*t.name == name)
            .map(|t| t.limiter.clone()))
    }

    fn shared(&self) -> Result<SharedState<E, B>, ConfigError>
    where
        E: Clone,
    {
        self.state.get_or_init(|| self.build()).clone()
    }

    fn build(&self) -> Result<SharedState<E, B>, ConfigError>
    where
        E: Clone,
    {
        let mut tiers = Vec::with_capacity(self.policies.len());
        for policy in &self.policies {
            policy.validate()?;
            if tiers
                .iter()
                .any(|t: &Tier<B::Limiter>| *t.name == *policy.name)
            {
                return Err(ConfigError::DuplicateTier(policy.name.to_string()));
            }
            let limiter = self.store.make_limiter(
                &policy.name,
                &policy.quotas,
                self.clock.as_ref(),
                self.max_keys,
                self.on_full,
            )?;
            tiers.push(Tier {
                name: policy.name.as_ref().into(),
                limiter,
                headers: policy.headers(),
            });
        }
        self.on_missing.validate()?;
        Ok(Arc::new(Shared {
            extractor: self.extractor.clone(),
            tiers: tiers.into_boxed_slice(),
            select: self.select.clone(),
            cost: self.cost.clone(),
            skip: self.skip.clone(),
            skip_methods: self.skip_methods.clone().into_boxed_slice(),
            skip_paths: self.skip_paths.clone().into_boxed_slice(),
            on_missing: self.on_missing.clone(),
            on_reject: self.on_reject.clone(),
            headers: self.headers,
            legacy_headers: self.legacy_headers,
        }))
    }
}

impl<S, E: KeyExtractor + Clone> Layer<S> for RateLimitLayer<E, Memory> {
    type Service = RateLimit<S, E>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        match self.shared() {
            Ok(shared) => RateLimit::from_shared(inner, shared),
            Err(e) => panic!("tollgate: invalid RateLimitLayer: {e}"),
        }
    }
}

#[cfg(feature = "redis")]
impl<S, E> Layer<S> for RateLimitLayer<E, crate::redis::RedisStore>
where
    E: KeyExtractor + Clone,
    E::Key: crate::redis::RedisKey,
{
    type Service = super::redis::RedisRateLimit<S, E>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        match self.shared() {
            Ok(shared) => super::redis::RedisRateLimit::from_shared(inner, shared),
            Err(e) => panic!("tollgate: invalid RateLimitLayer: {e}"),
        }
    }
}
