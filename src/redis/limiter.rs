//! [`RedisRateLimiter`]: the keyed GCRA limiter, with its state in Redis.

use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::ban::Penalty;
use super::decide::{Inner, Limits};
use super::deny::DenyCache;
use super::expiry;
use super::fallback::Fallback;
use super::key::{guard_fixed_part, RedisKey};
use super::lease::Leases;
use super::script::{rule_args, PEEK, STRIKE};
use super::store::RedisStore;
use crate::algo::Rule;
use crate::clock::Clock;
use crate::decision::{Decision, Reservation};
use crate::error::ConfigError;
use crate::limiter::wait::{self, Lines};
use crate::limiter::InsufficientCapacity;
use crate::penalty::PenaltyBox;
use crate::quota::Quota;

/// A keyed GCRA rate limiter whose state lives in Redis, shared by every instance of a service
/// that uses the same store prefix, policy name and key. The same methods and semantics as
/// [`RateLimiter`](crate::RateLimiter), asynchronous.
///
/// Cheap to clone; clones share the connection and the local deny cache.
///
/// ```no_run
/// use tollgate::redis::{RedisRateLimiter, RedisStore};
/// use tollgate::Quota;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_second(10))
///     .quota(Quota::per_day(10_000))
///     .name("api")
///     .try_build()?;
/// let d = limiter.check(&42).await;
/// if d.is_allowed() {
///     // serve user 42
/// }
/// # Ok(()) }
/// ```
///
/// # Time and precision
/// Decisions use the Redis server's `TIME`, one clock for every instance. Times are kept in
/// whole microseconds: an emission interval is rounded up to the microsecond (so the rate is
/// never exceeded), and a rate finer than one request per microsecond is a configuration
/// error. A limiter built with a test clock ([`Clock::manual`], [`Clock::tokio`]) sends its
/// own time instead, so that tests are deterministic; Redis still expires idle keys on its own
/// clock.
///
/// # Keys
/// The Redis key of a limiter key is `<prefix><scope length>:<scope>:<key>` (see [`RedisKey`]),
/// e.g. `tollgate:3:api:42`. The scope of a limiter named on purpose
/// ([`name`](RedisRateLimiterBuilder::name), or a layer's `Policy::new("api", ..)`) is its
/// name: limiters named alike share their keys, whatever their quotas. An unnamed one's is
/// its default name, `#` and twelve hex digits of a digest of its quotas (kind and numbers, in
/// order) and of what its keys are (a layer's key extractor, see
/// [`KeyExtractor::describe`](crate::key::KeyExtractor::describe); the key type for a
/// limiter used directly), e.g. `tollgate:21:3-per-1m#5c0f9a1b2e47:42`: the same limiter in
/// every process writes the same keys, and limiters that differ in any of those never meet.
/// Two live unnamed limiters with the same scope on one store are a
/// [`ConfigError::SharedRedisKeys`] when the second is built. The check is of one store and
/// its clones: two stores of this process connected to one server are two instances, as two
/// processes are, and unnamed limiters alike on them share their Redis keys, one limit for
/// both (as `tests/redis/namespace.rs` pins). Give each limit a name, or build every limiter
/// of one server on one store. The scope is fixed when the
/// limiter is built: [`set_quotas`](Self::set_quotas) keeps it. A key's value it holds the state of all the policy's quotas (so they share one
/// Cluster slot), and expires when the key is back to its full burst. It is a string, or, when
/// the policy has a [`sliding_log`](Quota::sliding_log) quota, a sorted set holding one member
/// per admitted unit (`<time>:<index>`, never two alike) beside the other quotas' state. The bytes of a key never
/// form a Cluster hash tag: a key with a `{` is written after `{}`, so Redis hashes the whole
/// name ([`RedisKey`] says more).
///
/// # When Redis does not answer
/// See [`FailMode`](super::FailMode): the decision is admitted or rejected as configured, or made by the local
/// fallback on the scaled quotas (each limiter and its clones keep one local state), and says
/// [`is_degraded`](Decision::is_degraded). A decision waits at most the store's timeout in
/// all, from its start (a wait for another request's batch included).
///
/// An error Redis gives about one key (a value of another type, a script error on it, `OOM`
/// for a write, `NOPERM` from an ACL rule, a reply that does not fit) is not an outage: the request is rejected as
/// unavailable and degraded, whatever the [`FailMode`](super::FailMode), and nothing else changes (no outage
/// state, no probing). The first of a policy is logged at `ERROR` with the key's Redis name
/// and the likely cause; each is counted in `tollgate_redis_errors_total{error="key"}`.
///
/// # Round trips
/// One `EVALSHA` per decision, except for rejections already known: once Redis has rejected a
/// request of some cost for a key until a time, requests of that cost or more for that key are
/// rejected locally until then, or for at most the store's
/// [`deny_cache_max_age`](RedisStore::deny_cache_max_age) (1 s by default) if that comes first.
/// A refund, a settlement or [`return_leases`](Self::return_leases) through this limiter
/// brings its cached rejection of the key up to date with Redis's answer (dropped when the
/// key moved back). Other instances' give-backs, and Redis losing the key's state (restart
/// without persistence, `FLUSHALL`, eviction, failover), move the key back unseen: then a
/// limiter may still reject for up to that age what Redis would admit, never longer, and it
/// never admits what Redis would reject. See
/// [`local_rejections`](Self::local_rejections). The deny cache serves policies whose quotas
/// are all GCRA; a policy with a window quota asks Redis for every decision.
///
/// With a [`Lease`](super::Lease) on the store, a hot key's admissions come from batches
/// taken from Redis in one call each (see [`leased`](Self::leased)): the fleet never admits
/// more than Redis gave out, and falls short of the limit by at most `max_batch` units per
/// instance.
///
/// # Window quotas
/// Windows are counted in whole microseconds (a window is rounded up to the microsecond).
/// The script's numbers are Lua doubles, exact below 2^53: a
/// [`sliding_window`](Quota::sliding_window) quota whose `count × window` in microseconds
/// reaches 2^52 is a configuration error
/// ([`ConfigError::WindowTooLongForStore`]; for one day, counts up to 52 000). Changing a
/// policy's quotas under the same name while keys are live mixes two layouts: give the new
/// policy a new name.
pub struct RedisRateLimiter<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for RedisRateLimiter<K> {
    fn clone(&self) -> Self {
        RedisRateLimiter {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for RedisRateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("name", &self.inner.name)
            .field("quotas", &self.inner.limits.load().quotas)
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisRateLimiter`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisRateLimiterBuilder<K> {
    key: PhantomData<fn() -> K>,
    store: RedisStore,
    quotas: Vec<Quota>,
    name: Cow<'static, str>,
    clock: Option<Clock>,
    penalty: Option<PenaltyBox>,
    /// Whether it decides for a dry-run layer, whose quotas' refusals are no strikes.
    dry_run: bool,
    /// Whether its own decisions are counted (not when a layer counts them).
    counted: bool,
    /// Whether the name was given on purpose; if not, the quotas and `keys` join it in the
    /// Redis key names.
    named: bool,
    /// What the keys are (a key extractor's description, or the key type); `None`: unknown.
    keys: Option<String>,
}

impl<K: RedisKey + Hash + Eq + Clone + Send + Sync> RedisRateLimiterBuilder<K> {
    /// Adds a quota, decided together with the others (at most 4 in all: more is
    /// [`ConfigError::TooManyQuotas`] from [`try_build`](Self::try_build)).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }

    /// The limiter of a layer, which counts the decisions itself.
    pub(crate) fn uncounted(mut self) -> Self {
        self.counted = false;
        self
    }

    /// Names the policy. The name is part of every Redis key: limiters with different names
    /// never share state, limiters with the same name and store prefix always do, whatever
    /// their quotas (see [Keys](RedisRateLimiter#keys)).
    ///
    /// Without a name, the limiter is called `"default"` and its Redis keys are named after
    /// its quotas and its key type as well, so that only limiters alike in both share them.
    /// A key type says nothing of what a key means: two programs on one Redis with unnamed
    /// limiters of the same quotas keyed by `u64` (a user id, an order id) share their keys.
    /// And it is the type's `std::any::type_name`, which moving the type to another module,
    /// or another compiler, may spell otherwise: a rolling deploy across such a change splits
    /// the limit in two. Name every limiter used directly.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self.named = true;
        self
    }

    /// For a layer: whether its policy was named on purpose, and what its key extractor says
    /// its keys are.
    pub(crate) fn keyed_as(mut self, named: bool, keys: Option<String>) -> Self {
        self.named = named;
        self.keys = keys;
        self
    }

    /// Decides with `clock` and sends its time to Redis instead of using the server's `TIME`:
    /// for tests with [`Clock::manual`] or [`Clock::tokio`]. With [`Clock::system`] the server's
    /// time is used, as by default.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Bans keys that keep getting rejected, with the rules of a [`PenaltyBox`]: the ban, the
    /// strikes and the quotas are decided together, in the one script call of each decision.
    /// See [`crate::penalty`].
    pub fn penalty_box(mut self, penalty: PenaltyBox) -> Self {
        self.penalty = Some(penalty);
        self
    }

    /// For a dry-run layer: the penalty box still answers a ban, but the quotas' refusals are
    /// no strikes (docs/design.md section 3, "The penalty box punishes the client's own
    /// traffic").
    pub(crate) fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Builds the limiter.
    ///
    /// # Panics
    /// When the configuration is invalid; see [`try_build`](Self::try_build).
    #[track_caller]
    pub fn build(self) -> RedisRateLimiter<K> {
        match self.try_build() {
            Ok(l) => l,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// Builds the limiter, or says which setting is wrong.
    pub fn try_build(self) -> Result<RedisRateLimiter<K>, ConfigError> {
        let limits = Limits::new(self.quotas)?;
        crate::headers::check_name(&self.name)?;
        if let Some(p) = &self.penalty {
            Penalty::<K>::check(p, &self.store)?;
        }
        let all_gcra = limits.gcras.len() == limits.rules.len();
        // The part of every Redis key name that says which limit it is.
        let scope: Cow<'_, str> = if self.named {
            Cow::Borrowed(&*self.name)
        } else {
            let keys = self
                .keys
                .as_deref()
                .ok_or_else(|| ConfigError::UnnamedRedisKeys(self.name.to_string()))?;
            Cow::Owned(format!(
                "{}#{}",
                self.name,
                scope_digest(&limits.rules, keys)
            ))
        };
        let mut key_prefix = self.store.prefix.to_vec();
        RedisKey::write_key(&scope.len(), &mut key_prefix);
        key_prefix.push(b':');
        key_prefix.extend_from_slice(scope.as_bytes());
        key_prefix.push(b':');
        let tag_guard = guard_fixed_part(&mut key_prefix);
        // Two limits alike but for a name neither was given would share their keys.
        let claim = if self.named {
            None
        } else {
            let claim = self.store.claim(&key_prefix);
            Some(claim.ok_or_else(|| ConfigError::SharedRedisKeys(self.name.to_string()))?)
        };
        let clock = self.clock.unwrap_or_default();
        let fallback = Fallback::new(self.store.on_failure, &limits.quotas, &clock)?;
        let max_age = u64::try_from(self.store.deny_max_age.as_nanos()).unwrap_or(u64::MAX);
        let deny = (all_gcra && self.store.deny_cache > 0 && max_age > 0)
            .then(|| DenyCache::new(self.store.deny_cache, max_age));
        if let Some(lease) = &self.store.lease {
            lease.validate()?;
        }
        // Strikes must reach Redis one by one, and window quotas cannot lend their units.
        let leases = self
            .store
            .lease
            .filter(|_| all_gcra && self.penalty.is_none())
            .map(|lease| Leases::new(&lease, self.store.timeout));
        let penalty = self
            .penalty
            .as_ref()
            .map(|p| Penalty::new(p, &self.store, &scope, max_age, !self.dry_run));
        #[cfg(feature = "metrics")]
        let decisions = self.counted.then(|| {
            let policy = crate::Policy::new(self.name.to_string(), limits.quotas[0].clone());
            let policy = limits.quotas[1..]
                .iter()
                .fold(policy, |p, q| p.quota(q.clone()));
            crate::observe::LimiterMeter::new(&self.name, &policy.item_names(), true)
        });
        Ok(RedisRateLimiter {
            inner: Arc::new(Inner {
                name: self.name.as_ref().into(),
                limits: Arc::new(ArcSwap::from_pointee(limits)),
                local_time: !clock.is_system(),
                clock,
                key_prefix: key_prefix.into_boxed_slice(),
                tag_guard,
                store: self.store,
                deny,
                leases,
                penalty,
                meter: crate::observe::RedisMeter::new(&self.name),
                #[cfg(feature = "metrics")]
                decisions,
                waiters: Lines::default(),
                fallback,
                _claim: claim,
                walks: Default::default(),
                changing: std::sync::Mutex::new(()),
            }),
        })
    }
}

/// The digest that names the keys of an unnamed limiter: of everything the script decides
/// by (each quota's kind and numbers, in order, a warm-up's curve) and of what the keys are.
/// Twelve hex digits (48 bits) of SHA-256: the same in every process, different for limits
/// that differ.
fn scope_digest(rules: &[Rule], keys: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"tollgate-scope-1\n");
    for r in rules {
        let (kind, a, b) = rule_args(r);
        h.update(format!("{kind} {a} {b}").as_bytes());
        if let Rule::WarmUp(g) = r {
            h.update(format!(" {} {}", g.curve.period, g.curve.cold_factor).as_bytes());
        }
        h.update(b"\n");
    }
    h.update(keys.as_bytes());
    h.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl<K: RedisKey + Hash + Eq + Clone + Send + Sync> RedisRateLimiter<K> {
    /// Starts a builder on `store` with a first quota.
    pub fn builder(store: RedisStore, quota: Quota) -> RedisRateLimiterBuilder<K> {
        RedisRateLimiterBuilder {
            key: PhantomData,
            store,
            quotas: vec![quota],
            name: Cow::Borrowed("default"),
            clock: None,
            penalty: None,
            dry_run: false,
            counted: true,
            named: false,
            keys: Some(std::any::type_name::<K>().to_owned()),
        }
    }

    /// Decides one request for `key`.
    ///
    /// # Cancellation safety
    /// Dropping the future before it completes may or may not have consumed the request: the
    /// script may already be running on the server.
    pub async fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1).await
    }

    /// Decides a request costing `cost` units for `key`; a cost of 0 only reports.
    ///
    /// # Cancellation safety
    /// As [`check`](Self::check).
    pub async fn check_n(&self, key: &K, cost: u32) -> Decision {
        let now = self.now();
        let decision = match self.local(key, cost, now) {
            Some(d) => d,
            None => self.remote(key, cost, now).await,
        };
        #[cfg(feature = "metrics")]
        if let Some(meter) = &self.inner.decisions {
            meter.record(&decision, cost, || None);
        }
        decision
    }

    /// Reports the state of `key` without consuming anything (`check_n(key, 0)`).
    pub async fn peek(&self, key: &K) -> Decision {
        self.check_n(key, 0).await
    }

    /// Waits until one request for `key` is admitted, then returns its decision.
    ///
    /// Waits with `tokio::time::sleep`, for the time Redis says (or one second while Redis is
    /// unavailable and the store fails closed).
    ///
    /// # Fairness
    /// As for [`RateLimiter::until_ready`](crate::RateLimiter::until_ready): the tasks waiting
    /// on one key through this limiter (or its clones) stand in line, first come first served,
    /// and only the first one asks Redis, so an admission costs one wake and two round trips
    /// however many tasks wait. Other instances and other callers are not in that line: they
    /// take what Redis gives them.
    ///
    /// # Cancellation safety
    /// Dropping the future while it waits in line or sleeps consumes nothing, and the next task
    /// in line moves up; dropping it while a decision is on its way is as
    /// [`check`](Self::check).
    pub async fn until_ready(&self, key: &K) -> Decision {
        wait::admitted_one(self.until_ready_n(key, 1).await)
    }

    /// Waits until a request of `cost` for `key` is admitted, as
    /// [`RateLimiter::until_ready_n`](crate::RateLimiter::until_ready_n): at once
    /// [`InsufficientCapacity`] for a cost above a quota's burst, else in the line of
    /// [`until_ready`](Self::until_ready).
    ///
    /// # Cancellation safety
    /// As [`until_ready`](Self::until_ready).
    pub async fn until_ready_n(
        &self,
        key: &K,
        cost: u32,
    ) -> Result<Decision, InsufficientCapacity> {
        wait::until_ready_n(self, key, cost).await
    }

    /// The quotas in force, in the order given (the latest set by
    /// [`set_quotas`](Self::set_quotas)).
    pub fn quotas(&self) -> Arc<[Quota]> {
        self.inner.limits.load().quotas.clone()
    }

    /// The generation of the quotas in force: one more at each change of them, what its
    /// decisions are stamped with.
    pub(crate) fn generation(&self) -> u16 {
        self.inner.limits.load().generation
    }

    /// Replaces the quotas of this limiter and of every clone of it, from its next decision
    /// on; the state in Redis is kept.
    ///
    /// The quotas travel with each script call, so an instance decides with the quotas its
    /// own limiter holds: to change a limit shared by several instances, change it on each
    /// (they read the same configuration, say). Each instance applies the change from its
    /// next decision on; until every instance has it, each decides its own requests with the
    /// quotas it holds, on the same stored times. The new quotas judge what each key stored
    /// and never rewrite it, by the rule of
    /// [`RateLimiter::set_quotas`](crate::RateLimiter::set_quotas), which the script applies
    /// too.
    ///
    /// The local deny cache checks every rejection it answers against the quotas in force, so
    /// a rejection remembered under stricter quotas is not answered again once the quotas are
    /// raised: the next request asks Redis.
    ///
    /// The new quotas must be as many as the limiter was built with, each of the kind of the
    /// one it replaces, and valid for the store (whole microseconds); otherwise this returns a
    /// [`ConfigError`] and the quotas in force stay.
    ///
    /// A key's expiry in Redis follows the quotas of the script call that last wrote it. A
    /// change under which some key's requests may count longer (a sliding log or counter
    /// widened, a warm-up curve changed) starts, in the background of the decisions, a walk
    /// over this limit's keys (`SCAN`) that lengthens each key's expiry to when it is idle
    /// under the new quotas (never shortening it), so that a key no request touches is kept
    /// while its requests count, as the memory store keeps it. The walk runs in the Tokio
    /// runtime `set_quotas` is called in, else in the one the limiter was built in (none: it
    /// is logged and skipped), looks at 10 million keys and runs 10 minutes at most,
    /// gives way to the walk of a later change, and logs when it is done or stopped; on
    /// Redis Cluster there is none (logged), and a key left idle from the change on expires
    /// when the quotas of its last write said: its next request starts afresh. A key idle at
    /// a change of a warm-up curve under the curve then in force is a new key, as in memory,
    /// even while Redis still holds it (its expiry is rounded up to whole milliseconds): each
    /// script call is told of the latest changes of curve (up to four within one warm-up
    /// period) and of the curves they replaced.
    ///
    /// Changes made at once, from several clones, are made one at a time.
    ///
    /// An unnamed limiter keeps the key names of the quotas it was built with (they are
    /// fixed when it is built; moving them would drop every key's state). A process built
    /// later with the new quotas writes other names, and counts apart from those changed
    /// while serving: name a policy that you change live on several instances.
    pub fn set_quotas(&self, quotas: impl IntoIterator<Item = Quota>) -> Result<(), ConfigError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        // One change at a time (the lock guards no data: a poisoned one is taken as it is).
        let _changing =
            (self.inner.changing.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = self.inner.limits.load();
        crate::limiter::check_replacement(&old.quotas, &quotas)?;
        let limits = Limits::replacing(quotas, Some(&old), self.now())?;
        self.inner.fallback.set_quotas(&limits.quotas)?;
        let lengthens = expiry::lengthens(&old.rules, &limits.rules);
        self.inner.limits.store(Arc::new(limits));
        if let Some(leases) = &self.inner.leases {
            leases.quotas_changed();
        }
        if lengthens {
            let inner = &self.inner;
            inner.walks.start(expiry::Walk {
                store: inner.store.clone(),
                key_prefix: inner.key_prefix.clone(),
                name: inner.name.clone(),
                limits: Arc::downgrade(&inner.limits),
                clock: inner.clock.clone(),
                local_time: inner.local_time,
            });
        }
        Ok(())
    }

    /// Waits until the walk over this limit's keys that the latest live change started (see
    /// [`set_quotas`](Self::set_quotas)) has lengthened their expiry, or has stopped; at once
    /// when no change started one.
    ///
    /// # Cancellation safety
    /// Dropping the future stops nothing: the walk goes on.
    pub async fn until_expiry_lengthened(&self) {
        self.inner.walks.until_over().await;
    }

    /// The policy name, part of every Redis key.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The store.
    pub fn store(&self) -> &RedisStore {
        &self.inner.store
    }

    /// How many requests were rejected locally by the deny cache, each a round trip to Redis
    /// saved.
    pub fn local_rejections(&self) -> u64 {
        self.inner.deny.as_ref().map_or(0, DenyCache::saved)
    }

    /// How many requests were admitted from a [`Lease`](super::Lease), each a round trip
    /// saved.
    pub fn leased(&self) -> u64 {
        self.inner.leases.as_ref().map_or(0, Leases::served)
    }

    /// Gives back to Redis the units this limiter holds under a live [`Lease`](super::Lease)
    /// (e.g. when the instance shuts down): one script call per key, pipelined on the
    /// multiplexed connection a few hundred at a time, under one deadline: the whole takes at
    /// most the store's [`timeout`](RedisStore::timeout), whatever the number of keys. Units of a lease older
    /// than its hold are never given back: Redis restored them by time alone, and returning
    /// them would give the fleet more than the limit. That holds for each give-back when it
    /// is sent: one whose lease ends while earlier ones are on their way is dropped. (A call
    /// sent in time but held up in Redis, which runs it when it resumes, still lands late.) Units that Redis does not take back in
    /// time are lost to the fleet until the key recovers on its own, within its burst period.
    pub async fn return_leases(&self) {
        self.inner.return_leases().await;
    }

    /// The Redis key that holds the state of `key`: `<prefix><name length>:<name>:<key>`,
    /// with `{}` before the key's bytes when they have a `{` (see [`RedisKey`] on hash tags).
    pub fn redis_key(&self, key: &K) -> Vec<u8> {
        self.inner.redis_key(key)
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.inner.now()
    }

    /// The decision this instance already knows, without a round trip (see
    /// [`Inner::local`]).
    #[inline]
    pub(crate) fn local(&self, key: &K, cost: u32, now: u64) -> Option<Decision> {
        self.inner.local(key, cost, now)
    }

    /// The decision of Redis, or of the failure policy (see [`Inner::remote`]).
    pub(crate) async fn remote(&self, key: &K, cost: u32, now: u64) -> Decision {
        self.inner.remote(key, cost, now).await
    }

    /// Gives back in Redis what a request for `key` took (see [`Inner::refund`]).
    pub(crate) async fn refund(&self, key: &K, taken: &Reservation) {
        self.inner.refund(key, taken).await
    }

    /// Settles in Redis a request for `key` at its `actual` cost (see [`Inner::settle`]).
    pub(crate) async fn settle(
        &self,
        key: &K,
        taken: &Reservation,
        actual: u32,
    ) -> Option<Decision> {
        self.inner.settle(key, taken, actual).await
    }

    /// Gives back what the local fallback's admission of a request for `key` took (a layer
    /// inside rejected it) to the fallback's state.
    pub(crate) fn refund_locally(&self, key: &K, taken: &Reservation) {
        self.inner.fallback.refund(key, taken);
    }

    /// Settles a request the local fallback admitted, in the fallback's state: the key's
    /// state there after settling (a local decision); `None` without a fallback.
    pub(crate) fn settle_locally(
        &self,
        key: &K,
        taken: &Reservation,
        actual: u32,
    ) -> Option<Decision> {
        self.inner.fallback.settle(key, taken, actual)
    }

    /// Records a strike against `key` in the penalty box (a failed login found after the
    /// response, say), in one script call, by the rules of [`PenaltyBox`]; returns how long
    /// the key is banned now, if it is. `None` too without a penalty box, or when Redis did
    /// not answer in time (the strike may then be lost).
    pub async fn strike(&self, key: &K) -> Option<Duration> {
        let left = self.inner.penalty_only(&STRIKE, key).await?;
        (left > 0).then(|| Duration::from_nanos(left))
    }

    /// How long `key` is still banned, as Redis says; `None` when it is not, without a
    /// penalty box, or when Redis did not answer in time.
    pub async fn ban_left(&self, key: &K) -> Option<Duration> {
        let left = self.inner.penalty_only(&PEEK, key).await?;
        (left > 0).then(|| Duration::from_nanos(left))
    }

    /// Lifts `key`'s ban and forgets its strikes and offences, in Redis and in this instance
    /// (other instances may still answer a ban they cached, for at most the store's
    /// `deny_cache_max_age`).
    pub async fn pardon(&self, key: &K) {
        let inner = &*self.inner;
        if let Some(p) = &inner.penalty {
            p.pardon(&inner.store, &inner.meter, key).await;
        }
    }
}

impl<K: RedisKey + Hash + Eq + Clone + Send + Sync> wait::Admit<K> for RedisRateLimiter<K> {
    fn admit(&self, key: &K, cost: u32) -> impl std::future::Future<Output = Decision> {
        self.check_n(key, cost)
    }

    fn lines(&self) -> &Lines<K> {
        &self.inner.waiters
    }

    fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    fn smallest_burst(&self) -> u64 {
        wait::smallest_burst(&self.inner.limits.load().rules)
    }
}
