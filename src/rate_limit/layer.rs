use std::fmt;
use std::sync::Arc;

use http::Method;
use tower_layer::Layer;

use super::answers::{Answers, Tier};
use super::handle::RateLimitHandle;
use super::policy::Policy;
use super::service::RateLimit;
use super::settle::{AmountFn, CountFn, SettleRule};
use super::shared::{CostFn, Parts, SelectFn, Shared, SkipFn, OUTCOMES};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor, RequestHead};
use crate::layer::common::{common_setters, Common, Lazy};
use crate::limiter::DEFAULT_MAX_KEYS;
use crate::observe::{self, DecisionMeter, LayerKind, Names};
use crate::penalty::{Penalties, PenaltyBox};
use crate::store::backend::{Backend, Memory};
use crate::store::OnFull;

/// Applies GCRA rate limiting to requests. See the [module docs](crate::rate_limit).
///
/// One layer value is one shared state: clones, and every service it wraps (every route of a
/// `Router::layer`), count against the same limits. Two layer values are two limits (with the
/// memory store; in Redis, limits are shared by name, see [`store`](Self::store)). tower's
/// `RateLimitLayer` gives each wrapped service its own state instead.
///
/// `B` is where the state lives: [`Memory`] (the default; decisions are synchronous and cost
/// no I/O) or, with the `redis` feature, a `redis::RedisStore`.
#[must_use]
#[derive(Clone)]
pub struct RateLimitLayer<E: KeyExtractor = Global, B: Backend<E::Key> = Memory> {
    settings: Settings,
    common: Common<E>,
    store: B,
    state: Lazy<SharedState<E, B>>,
}

/// The settings of a rate-limit layer that depend on neither its key type nor its store, so
/// that `.key(..)` and `.store(..)` carry them over whole.
#[derive(Clone)]
struct Settings {
    policies: Vec<Policy>,
    select: Option<Arc<SelectFn>>,
    cost: Option<Arc<CostFn>>,
    skip: Option<Arc<SkipFn>>,
    count: Option<Arc<CountFn>>,
    amount: Option<Arc<AmountFn>>,
    skip_methods: Vec<Method>,
    skip_paths: Vec<String>,
    headers: bool,
    legacy_headers: bool,
    clock: Option<Clock>,
    max_keys: Option<usize>,
    on_full: Option<OnFull>,
    penalty: Option<PenaltyBox>,
    dry_run_headers: bool,
}

/// The state of a layer, built once, shared by every service it makes.
type SharedState<E, B> = Shared<E, <B as Backend<<E as KeyExtractor>::Key>>::Limiter>;

impl<E: KeyExtractor + fmt::Debug, B: Backend<E::Key>> fmt::Debug for RateLimitLayer<E, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policies", &self.settings.policies)
            .field("extractor", &self.common.extractor)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<Global> {
    /// Limits requests by `policy` (a [`Quota`](crate::Quota) or a [`Policy`]), with one key for
    /// all of them until [`key`](Self::key) says otherwise.
    #[track_caller]
    pub fn new(policy: impl Into<Policy>) -> Self {
        let policy = policy.into();
        let mut common = Common::new(Global);
        common.note("policy", policy.validate());
        RateLimitLayer {
            settings: Settings {
                policies: vec![policy],
                select: None,
                cost: None,
                skip: None,
                count: None,
                amount: None,
                skip_methods: Vec::new(),
                skip_paths: Vec::new(),
                headers: true,
                legacy_headers: false,
                clock: None,
                max_keys: None,
                on_full: None,
                penalty: None,
                dry_run_headers: false,
            },
            common,
            store: Memory,
            state: Lazy::default(),
        }
    }
}

impl<E: KeyExtractor, B: Backend<E::Key>> RateLimitLayer<E, B> {
    common_setters! {
        fn changed;
    }

    /// Counts requests per key, as `extractor` finds it (see [`crate::key`]).
    ///
    /// Every other setting is kept, whatever the order of the calls; a
    /// `MissingKey::UseKey` set before `key` cannot follow the new key type and is reported
    /// by [`validate`](Self::validate) (and when the layer is applied).
    pub fn key<E2: KeyExtractor>(self, extractor: E2) -> RateLimitLayer<E2, B>
    where
        B: Backend<E2::Key>,
    {
        RateLimitLayer {
            settings: self.settings,
            common: self.common.rekey(extractor),
            store: self.store,
            state: Lazy::default(),
        }
    }

    /// Keeps the limits in `store` instead of memory: with a
    /// `redis::RedisStore`, every instance of the service that uses the
    /// same Redis, key prefix and policy names shares the limits. Nothing else changes: keys,
    /// tiers, costs, headers and responses are the same.
    ///
    /// With Redis, decisions wait for one round trip (bounded by the store's timeout, after
    /// which its `redis::FailMode` decides: a local fallback's decisions are answered like
    /// any other, with the fields of its scaled quotas). [`max_keys`](Self::max_keys) and
    /// [`on_full`](Self::on_full) are settings of the memory store: Redis expires idle keys
    /// itself, so they are not methods of a layer on Redis; set before `store`, either is an
    /// error, reported by [`validate`](Self::validate) and when the layer is applied.
    pub fn store<B2: Backend<E::Key>>(self, store: B2) -> RateLimitLayer<E, B2> {
        RateLimitLayer {
            settings: self.settings,
            common: self.common,
            store,
            state: Lazy::default(),
        }
    }

    /// Adds a quota to the default policy; all its quotas are decided together (at most 4:
    /// more is [`ConfigError::TooManyQuotas`] from [`validate`](Self::validate), or a panic
    /// naming it when the layer is applied).
    #[track_caller]
    pub fn quota(mut self, quota: crate::Quota) -> Self {
        self.settings.policies[0].quotas.push(quota);
        self.common
            .note("policy", self.settings.policies[0].validate());
        self.changed()
    }

    /// Renames the default policy (the name shown in the `RateLimit` header fields, and part
    /// of the Redis keys). See [`Policy`] for how its quotas are named.
    #[track_caller]
    pub fn name(mut self, name: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        self.settings.policies[0] = self.settings.policies[0].clone().renamed(name.into());
        self.common
            .note("policy", self.settings.policies[0].validate());
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
    #[track_caller]
    pub fn tier(mut self, policy: Policy) -> Self {
        let mut valid = policy.validate();
        if self.settings.policies.iter().any(|p| p.name == policy.name) {
            valid = Err(ConfigError::DuplicateTier(policy.name.to_string()));
        }
        self.common.note_added("tier", valid);
        self.settings.policies.push(policy);
        self.changed()
    }

    /// Chooses the tier of each request by name; `None` means the default policy (the one
    /// given to [`new`](RateLimitLayer::new)).
    ///
    /// The name may be anything that reads as a `&str` (`&'static str`, `String`,
    /// `Arc<str>`), e.g. a plan looked up in a map read from configuration. A name that is
    /// not a tier of the layer is a configuration mistake: the request gets the default
    /// policy, and the first such name is logged as an error (through `tracing`).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use tollgate::{key, Policy, Quota, RateLimitLayer};
    ///
    /// // Plans per API key, as read at start-up.
    /// let plans: HashMap<String, String> = HashMap::from([("k1".into(), "vip".into())]);
    /// let layer = RateLimitLayer::new(Policy::new("free", Quota::per_second(10)))
    ///     .tier(Policy::new("vip", Quota::per_second(100)))
    ///     .key(key::Header::new("x-api-key"))
    ///     .select_tier(move |req| {
    ///         let api_key = req.headers.get("x-api-key")?.to_str().ok()?;
    ///         plans.get(api_key).cloned()
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn select_tier<F, N>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<N> + Send + Sync + 'static,
        N: AsRef<str>,
    {
        let select = move |head: &RequestHead<'_>, find: &dyn Fn(&str) -> Option<usize>| {
            f(head).and_then(|name| find(name.as_ref()))
        };
        self.settings.select = Some(Arc::new(select));
        self.changed()
    }

    /// How many units each request costs (1 by default; 0 only reports, and is rejected only
    /// by a key in debt, see [`settle`](Self::settle)). With `settle` or
    /// [`count_if`](Self::count_if) this is the reservation, settled after the response.
    pub fn cost<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static,
    {
        self.settings.cost = Some(Arc::new(f));
        self.changed()
    }

    /// Counts only the requests whose response `f` accepts (e.g. failed logins: `401`/`403`),
    /// looking at the response head: status, header fields, extensions.
    ///
    /// The cost is reserved before the handler, as for any request, and given back when the
    /// response does not count. So a key over its limit is rejected before the handler, and
    /// parallel requests of one key cannot all slip through: with a limit of 5, at most 5 of
    /// 100 wrong passwords sent at once reach the handler (and, while they are in flight, so
    /// do at most 5 right ones). A request whose response never comes (a panicking handler,
    /// a client gone) stays counted. The full rules: [`settle`](super::settle).
    ///
    /// With [`settle`](Self::settle) too, a response that counts is charged what `settle`
    /// reads from it, and one that does not count is charged nothing, whatever the order of
    /// the two calls.
    ///
    /// ```
    /// use axum::{http::StatusCode, routing::post, Router};
    /// use tollgate::{key, Quota, RateLimitLayer};
    ///
    /// // 5 failed logins per minute and IP; successful ones are free.
    /// let failures = RateLimitLayer::new(Quota::per_minute(5))
    ///     .key(key::PeerIp::new())
    ///     .count_if(|res| matches!(res.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN));
    /// let app: Router = Router::new().route("/login", post(|| async { "welcome" }).layer(failures));
    /// ```
    pub fn count_if<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    {
        self.settings.count = Some(Arc::new(f));
        self.changed()
    }

    /// Settles the cost of each request from its response: `f` reads the actual cost from
    /// the response head (a header field, an extension the handler set: see
    /// [`ActualCost`](super::settle::ActualCost)); `None` keeps the reservation.
    ///
    /// The reservation, what [`cost`](Self::cost) says (1 by default), is taken before the
    /// handler as for any request, so it is the estimate: a key over its limit is rejected
    /// then. When the response comes, a smaller actual cost gives the difference back; a
    /// larger one charges it **even over the limit**: the key goes into debt, and its next
    /// requests are rejected, with a true `Retry-After`, until time pays the debt off. The
    /// response's `RateLimit` fields report the state after settling. The full rules (a
    /// panicking handler, a dropped body, Redis): [`settle`](super::settle).
    ///
    /// ```
    /// use axum::{response::IntoResponse, routing::post, Router};
    /// use tollgate::{key, rate_limit::settle::ActualCost, Policy, Quota, RateLimitLayer};
    ///
    /// async fn complete() -> impl IntoResponse {
    ///     let mut response = "…".into_response();
    ///     response.extensions_mut().insert(ActualCost(1_234)); // tokens used
    ///     response
    /// }
    ///
    /// // 100 000 tokens a day per API key; reserve 500 per request, settle the real count.
    /// let tokens = RateLimitLayer::new(Policy::new("tokens", Quota::per_day(100_000)))
    ///     .key(key::Header::new("x-api-key"))
    ///     .cost(|_| 500)
    ///     .settle(ActualCost::of);
    /// let app: Router = Router::new().route("/v1/complete", post(complete).layer(tokens));
    /// ```
    pub fn settle<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> Option<u32> + Send + Sync + 'static,
    {
        self.settings.amount = Some(Arc::new(f));
        self.changed()
    }

    /// Lets requests for which `f` is true through without counting them.
    pub fn skip_if<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.settings.skip = Some(Arc::new(f));
        self.changed()
    }

    /// Lets requests with this method through without counting them (e.g. `OPTIONS`).
    pub fn skip_method(mut self, method: Method) -> Self {
        self.settings.skip_methods.push(method);
        self.changed()
    }

    /// Lets requests for exactly this path through without counting them (e.g. `/health`).
    pub fn skip_path(mut self, path: impl Into<String>) -> Self {
        self.settings.skip_paths.push(path.into());
        self.changed()
    }

    common_setters! {
        /// What to do when no key can be extracted (default: reject with 400).
        fn on_missing_key;

        /// Lets requests from `cidr` (`"10.0.0.0/8"`, `"2001:db8::/32"`, or one address) through
        /// without any limit: not counted, never rejected or banned, no `RateLimit` fields.
        ///
        /// The address matched is the one the key extractor resolves
        /// ([`KeyExtractor::client_ip`](crate::key::KeyExtractor::client_ip)):
        /// with [`key::ClientIp`](crate::key::ClientIp) the client behind your trusted proxies, so
        /// a forwarding header is believed only from a proxy you trust; with any other extractor
        /// the TCP peer. IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`) match IPv4 ranges. Every
        /// layer of the crate has the same allow list. An entry that is not an address or range is
        /// a [`ConfigError::InvalidAllowedIp`], reported by [`validate`](Self::validate) and when
        /// the layer is applied.
        ///
        /// ```
        /// use tollgate::{key, Quota, RateLimitLayer};
        /// let login = RateLimitLayer::new(Quota::per_minute(5))
        ///     .key(key::ClientIp::new().trust_proxy("10.0.0.0/8"))
        ///     .allow_ip("203.0.113.0/24"); // the office
        /// # let _ = login;
        /// ```
        fn allow_ip;

        /// Lets requests whose key is `key` through without any limit (an internal API key, a
        /// monitoring user). Call it after [`key`](Self::key): a key of an earlier key type is
        /// reported as [`ConfigError::AllowKeyBeforeKey`].
        fn allow_key;

        /// Builds rejection responses with `hook` instead of the default plain-text 429.
        fn on_reject;
    }

    /// Whether to add `RateLimit-Policy` and `RateLimit` to responses (default: yes).
    pub fn ratelimit_headers(mut self, on: bool) -> Self {
        self.settings.headers = on;
        self.changed()
    }

    /// Whether to add the legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default: no).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.settings.legacy_headers = on;
        self.changed()
    }

    /// Decides with `clock` (default [`Clock::system`]; e.g. [`Clock::tokio`] under a paused
    /// test clock). With Redis, the clock's time is sent to the server instead of its own
    /// `TIME` (for tests).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.settings.clock = Some(clock);
        self.changed()
    }

    /// Bans keys that keep getting rejected: after `penalty`'s number of rejections within its
    /// window, a key's requests are answered at once (429, or the box's status, with the
    /// `Retry-After` of the ban) without reaching the quotas or the handler, for a ban that
    /// doubles with each repeat offence up to a cap. See [`crate::penalty`] for the rules.
    ///
    /// One penalty box per layer, shared by its tiers: a key banned on one tier is banned on
    /// all. With the memory store the state is kept beside the quotas, within
    /// [`max_keys`](Self::max_keys); with Redis it is kept in Redis and decided in the same
    /// script call as the quotas. Strikes found elsewhere (a failed login) are recorded with
    /// [`penalties`](Self::penalties).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::penalty::PenaltyBox;
    /// use tollgate::{key, Quota, RateLimitLayer};
    ///
    /// // Three rejections within 10 minutes: banned 15 minutes, then 30, 60, … up to a day.
    /// let login = RateLimitLayer::new(Quota::per_minute(5))
    ///     .key(key::PeerIp)
    ///     .penalty_box(PenaltyBox::new(3, Duration::from_secs(600), Duration::from_secs(900)));
    /// # let _ = login;
    /// ```
    #[track_caller]
    pub fn penalty_box(mut self, penalty: PenaltyBox) -> Self {
        self.common.note("penalty_box", penalty.validate());
        self.settings.penalty = Some(penalty);
        self.changed()
    }

    /// The penalty state of this layer (memory store), to record strikes the layer cannot see
    /// (a failed login, known once the handler answered), ask about or lift a ban. `None`
    /// without a [`penalty_box`](Self::penalty_box), or when the layer's store keeps the
    /// penalty state itself (Redis: see
    /// `RedisRateLimiter::strike`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::penalty::PenaltyBox;
    /// use tollgate::{key, Quota, RateLimitLayer};
    /// let layer = RateLimitLayer::new(Quota::per_minute(5))
    ///     .key(key::Header::new("x-user"))
    ///     .penalty_box(PenaltyBox::new(3, Duration::from_secs(600), Duration::from_secs(900)));
    /// let penalties = layer.penalties()?.expect("a penalty box in memory");
    /// // In the login handler, after a wrong password:
    /// penalties.strike(&b"mallory"[..].into());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn penalties(&self) -> Result<Option<Penalties<E::Key>>, ConfigError>
    where
        E: Clone,
    {
        Ok(self.shared()?.penalties().cloned())
    }

    common_setters! {
        /// Dry-run (shadow) mode: every request is decided, counted and traced as if the limit
        /// were enforced, but none is rejected. A request the layer would have rejected goes on
        /// to the service with a [`DryRunRejection`](crate::observe::DryRunRejection) in its
        /// extensions, and consumes nothing, as a rejected request would not; admitted ones
        /// consume as they would. With Redis, a shadow instance therefore takes from the shared
        /// state exactly what an enforcing one would. See [`observe`](crate::observe#dry-run-mode).
        ///
        /// No `RateLimit` header fields are sent in dry-run mode unless
        /// [`dry_run_headers`](Self::dry_run_headers) says so.
        ///
        /// ```
        /// use tollgate::{key, Quota, RateLimitLayer};
        /// let shadow = RateLimitLayer::new(Quota::per_second(10)).key(key::PeerIp).dry_run(true);
        /// # let _ = shadow;
        /// ```
        fn dry_run;
    }

    /// Whether a layer in dry-run mode sends its `RateLimit` header fields (default: no, so
    /// that clients that follow them do not slow down because of a limit not enforced yet).
    pub fn dry_run_headers(mut self, on: bool) -> Self {
        self.settings.dry_run_headers = on;
        self.changed()
    }

    common_setters! {
        /// Whether rejection events (target `tollgate::reject`) carry the request's key, in its
        /// `Debug` form (default: no; a key is often an IP address or a user id).
        fn trace_keys;
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
        let found = shared.answers().tiers.iter().position(|t| &*t.name == name);
        Ok(found.map(|i| shared.limiters()[i].clone()))
    }

    /// A handle that replaces the quotas of this layer's policies while it serves, for every
    /// clone of the layer and every service it made; see [`RateLimitHandle`].
    ///
    /// Returns the layer's configuration error, if it has one.
    ///
    /// ```
    /// use tollgate::{Policy, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(Policy::new("api", Quota::per_second(100)));
    /// let handle = layer.handle().unwrap();
    /// // Later, during an incident:
    /// handle.set_quotas("api", [Quota::per_second(10)]).unwrap();
    /// assert_eq!(handle.policy("api").unwrap().quotas(), [Quota::per_second(10)]);
    /// ```
    pub fn handle(&self) -> Result<RateLimitHandle, ConfigError>
    where
        E: Clone,
    {
        let shared = self.shared()?;
        let limiters = shared.limiters().to_vec();
        Ok(RateLimitHandle::new(
            shared.answers().clone(),
            Arc::new(move |tier: usize, quotas: Option<&[crate::Quota]>| {
                let limiter = &limiters[tier];
                match quotas {
                    Some(quotas) => B::set_quotas(limiter, quotas).map(|()| B::generation(limiter)),
                    None => Ok(B::generation(limiter)),
                }
            }),
        ))
    }

    fn shared(&self) -> Result<Arc<SharedState<E, B>>, ConfigError>
    where
        E: Clone,
    {
        self.state.get_or_build(|| self.build())
    }

    fn build(&self) -> Result<SharedState<E, B>, ConfigError>
    where
        E: Clone,
    {
        let core = self.common.core()?;
        let mut tiers: Vec<Tier> = Vec::with_capacity(self.settings.policies.len());
        let mut limiters = Vec::with_capacity(self.settings.policies.len());
        for policy in &self.settings.policies {
            policy.validate()?;
            if tiers.iter().any(|t| *t.name == *policy.name) {
                return Err(ConfigError::DuplicateTier(policy.name.to_string()));
            }
            limiters.push(self.store.make_limiter(
                policy,
                self.common.extractor.describe().as_deref(),
                self.settings.clock.as_ref(),
                self.settings.max_keys,
                self.settings.on_full,
                self.settings.penalty.as_ref(),
                self.common.observe.dry_run,
            )?);
            let names = Names::new(LayerKind::RateLimit, &policy.name, &policy.item_names());
            let observe = self.common.observe;
            observe::config(&names, observe.dry_run, observe.trace_keys, &policy.quotas);
            let meter = DecisionMeter::new(&names, observe.dry_run, OUTCOMES);
            tiers.push(Tier::new(
                policy.name.as_ref().into(),
                policy.clone(),
                names,
                meter,
                self.store.local_share(),
            ));
        }
        let penalty = match &self.settings.penalty {
            Some(p) if B::LOCAL_PENALTIES => {
                p.validate()?;
                Some((p, self.settings.clock.clone().unwrap_or_default()))
            }
            _ => None,
        };
        // One bound for every key the layer tracks: its tiers' quotas and its penalty box.
        let max_keys = self.settings.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
        let penalty = B::share_bound(&limiters, max_keys, penalty);
        Ok(Shared::new(Parts {
            core,
            limiters: limiters.into_boxed_slice(),
            answers: Arc::new(Answers {
                tiers: tiers.into_boxed_slice(),
                on_reject: self.common.on_reject.clone(),
                headers: self.settings.headers,
                legacy_headers: self.settings.legacy_headers,
                ban_status: self.settings.penalty.as_ref().map_or(
                    http::StatusCode::TOO_MANY_REQUESTS,
                    PenaltyBox::answer_status,
                ),
                observe: self.common.observe,
                dry_run_headers: self.settings.dry_run_headers,
                settle: SettleRule::new(self.settings.count.clone(), self.settings.amount.clone()),
            }),
            select: self.settings.select.clone(),
            cost: self.settings.cost.clone(),
            skip: self.settings.skip.clone(),
            skip_methods: self.settings.skip_methods.clone().into_boxed_slice(),
            skip_paths: self.settings.skip_paths.clone().into_boxed_slice(),
            penalty,
        }))
    }
}

/// The settings of the memory store, which a layer on another store does not have.
impl<E: KeyExtractor> RateLimitLayer<E, Memory>
where
    Memory: Backend<E::Key>,
{
    /// Bounds the number of keys the layer tracks (default 1 000 000; `0` is invalid): one
    /// bound for the quota state of all its tiers and its penalty box's records together, so
    /// `max_keys(4)` is 4 entries in all. A key with quota state and a penalty record counts
    /// twice, and a key tracked by two tiers once in each. See the README's "Memory and
    /// hostile keys" for what a full table does.
    ///
    /// A setting of the memory store, so a method of a layer on it only: on a layer whose
    /// limits live in Redis, which expires idle keys itself, it does not compile. Set before
    /// [`store`](Self::store) moves the layer to Redis, it is reported as
    /// [`ConfigError::MemoryOnly`] by [`validate`](Self::validate) and when the layer is
    /// applied.
    ///
    #[cfg_attr(
        feature = "redis",
        doc = "```compile_fail,E0599
use tollgate::{redis::RedisStore, Quota, RateLimitLayer};
let store = RedisStore::open(\"redis://127.0.0.1:6379\").unwrap();
// error[E0599]: no method named `max_keys` found for `RateLimitLayer<Global, RedisStore>`
let layer = RateLimitLayer::new(Quota::per_second(1)).store(store).max_keys(10_000);
```"
    )]
    #[track_caller]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        let valid = if max_keys == 0 {
            Err(ConfigError::ZeroMaxKeys)
        } else {
            Ok(())
        };
        self.common.note("max_keys", valid);
        self.settings.max_keys = Some(max_keys);
        self.changed()
    }

    /// What to do with a new key when `max_keys` active keys are tracked (default
    /// [`OnFull::EvictNearestIdle`]).
    ///
    /// A setting of the memory store, as [`max_keys`](Self::max_keys) is: it does not compile
    /// on a layer whose limits live in Redis.
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.settings.on_full = Some(on_full);
        self.changed()
    }
}

impl<S, E: KeyExtractor + Clone, B: Backend<E::Key>> Layer<S> for RateLimitLayer<E, B> {
    type Service = RateLimit<S, E, B>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        match self.shared() {
            Ok(shared) => RateLimit::from_shared(inner, shared),
            Err(e) => self.common.invalid("RateLimitLayer", e),
        }
    }
}
