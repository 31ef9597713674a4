//! [`RedisStore`]: the connection, its timeout and what happens when Redis does not answer.

use crate::error::ConfigError;
use crate::observe::{RedisMeter, StoreError};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Client, RedisError, Script, ScriptInvocation};

use super::lease::Lease;
use super::outage::{Line, Outage, SUMMARY_INTERVAL};
use super::script::{Arg, GCRA_ONLY, PLAIN, SCRIPT};

/// The default time allowed for one decision on Redis.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default prefix of every key the store writes.
pub const DEFAULT_PREFIX: &str = "tollgate:";
/// The default bound on the entries of each limiter's local deny cache.
pub const DEFAULT_DENY_CACHE: usize = 65_536;
/// The longest interval between two calls that try Redis during an outage
/// ([`RedisStore::probe_every`]).
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(60);

/// The default time a rejection decided by Redis is answered locally at most.
pub const DEFAULT_DENY_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

/// What a limiter does when Redis cannot decide in time (an error, a timeout, a refused
/// connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Admit the request. The decision says [`is_degraded`](crate::Decision::is_degraded), and
    /// the HTTP layer lets the request through without `RateLimit` fields. Limits are not
    /// enforced during the outage; the service stays up. The default.
    #[default]
    Open,
    /// Reject the request. The decision is limited and degraded, with a retry after one second;
    /// the HTTP layer answers `503 Service Unavailable` with `Retry-After: 1`
    /// ([`RejectionKind::StoreUnavailable`](crate::response::RejectionKind::StoreUnavailable)).
    Closed,
    /// Decide in this process, with an in-memory limiter whose quotas are the policy's scaled
    /// by a [`Share`]: the limit stays enforced during the outage, each instance at its share.
    ///
    /// Built with [`FailMode::local`]. Each limiter (each tier of a layer) keeps its own
    /// in-memory state, keyed like Redis, with every quota scaled (the kind is kept):
    ///
    /// * the rate, by at most the share: the count times the share, rounded down; when that
    ///   is below one request per period, one request per period divided by count × share
    ///   (`per_minute(5)` at a tenth: one per 2 minutes), a period capped at the longest a
    ///   quota can have (over a century) for a share too small to reach it;
    /// * the burst (a window's count), times the share rounded down, at least 1.
    ///
    /// So over any span `t` of an outage an instance admits for a key at most
    /// `max(1, ⌊burst × share⌋) + share × rate × t`, and `n` instances at `1 / n` at most
    /// `n × max(1, ⌊burst / n⌋) + rate × t` in all: the quota's own bound, except that each
    /// instance's burst is at least one request.
    ///
    /// The local state of each limiter tracks at most 1 000 000 keys, as the memory store
    /// does by default, forgetting idle keys first, then the active key nearest to idle
    /// ([`OnFull::EvictNearestIdle`](crate::store::OnFull::EvictNearestIdle)). A penalty box
    /// on Redis keeps the bans this instance already saw; no new strike is counted while Redis
    /// is down.
    ///
    /// A decision made so is real: it is [`is_degraded`](crate::Decision::is_degraded) and
    /// [`is_local`](crate::Decision::is_local), its quota states are those of the local
    /// limiter, and the HTTP layer answers it as any other (`RateLimit` fields of the scaled
    /// quotas, `429` with `Retry-After` when it rejects). A request whose cost is above a
    /// scaled burst but within the policy's is rejected with a retry after one second, not as
    /// never admissible: Redis may admit it once it is back.
    ///
    /// Each decision still asks Redis first and waits for it up to the store's
    /// [`timeout`](RedisStore::timeout): during an outage every request takes that long
    /// before the fallback decides (whether Redis refuses connections, is gone or hangs),
    /// and Redis is used again from the first request it answers. Keep the timeout short.
    ///
    /// When Redis answers again, it decides again, from the state it kept: the requests
    /// admitted locally were not counted there, so a key may get the scaled quota from each
    /// instance during the outage and then whatever its Redis state allows, at most one
    /// burst after a long outage (or after a restart that lost the state). A Redis that
    /// hung rather than went away (paused, or too slow to answer within the timeout) still
    /// runs the decisions it was sent once it resumes: those requests, decided locally, are
    /// then counted there too, which only makes Redis stricter. The local state is kept for
    /// the next outage; it only ever makes the fallback stricter.
    Local(Share),
}

impl FailMode {
    /// [`FailMode::Local`] at `share` of each quota.
    ///
    /// # Panics
    /// At the caller's line unless `0 < share <= 1` (crate docs, "Bad settings"); use
    /// [`FailMode::try_local`] for a share read at run time.
    ///
    /// ```
    /// use tollgate::redis::FailMode;
    /// // Four instances: each decides alone at a quarter of each quota while Redis is down.
    /// let mode = FailMode::local(0.25);
    /// assert_eq!(mode, FailMode::try_local(0.25).unwrap());
    /// ```
    #[track_caller]
    #[must_use]
    pub fn local(share: f64) -> FailMode {
        FailMode::Local(Share::new(share))
    }

    /// [`FailMode::Local`] at `share` of each quota: `0 < share <= 1`, else
    /// [`ConfigError::InvalidFallbackShare`](crate::ConfigError::InvalidFallbackShare).
    ///
    /// ```
    /// use tollgate::redis::FailMode;
    /// // A share read from the environment: a bad one is an error to report, not a panic.
    /// let share: f64 = "0.25".parse().unwrap();
    /// assert_eq!(FailMode::try_local(share), Ok(FailMode::local(0.25)));
    /// assert!(FailMode::try_local(0.0).is_err());
    /// assert!(FailMode::try_local(f64::INFINITY).is_err());
    /// ```
    pub fn try_local(share: f64) -> Result<FailMode, ConfigError> {
        Share::try_new(share).map(FailMode::Local)
    }
}

/// The part of each quota a [`FailMode::Local`] fallback enforces: a number in `(0, 1]`.
#[derive(Debug, Clone, Copy)]
pub struct Share(f64);

impl Share {
    /// `share` of each quota.
    ///
    /// # Panics
    /// At the caller's line unless `0 < share <= 1` (crate docs, "Bad settings"); use
    /// [`Share::try_new`] for a share read at run time.
    #[track_caller]
    #[must_use]
    pub fn new(share: f64) -> Share {
        match Share::try_new(share) {
            Ok(share) => share,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// `share` of each quota, when `0 < share <= 1`; else
    /// [`ConfigError::InvalidFallbackShare`](crate::ConfigError::InvalidFallbackShare).
    ///
    /// ```
    /// use tollgate::redis::Share;
    /// assert_eq!(Share::try_new(0.5).unwrap().get(), 0.5);
    /// assert!(Share::try_new(-0.5).is_err());
    /// assert!(Share::try_new(f64::NAN).is_err());
    /// ```
    pub fn try_new(share: f64) -> Result<Share, ConfigError> {
        if share > 0.0 && share <= 1.0 {
            Ok(Share(share))
        } else {
            Err(ConfigError::InvalidFallbackShare(format!("{share}")))
        }
    }

    /// One `n`-th of each quota, for `n` instances that share one Redis.
    ///
    /// # Panics
    /// At the caller's line when `n` is 0; use [`Share::try_one_in`] for a count read at run
    /// time.
    ///
    /// ```
    /// use tollgate::redis::Share;
    /// assert_eq!(Share::one_in(4).get(), 0.25);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn one_in(n: u32) -> Share {
        match Share::try_one_in(n) {
            Ok(share) => share,
            Err(e) => panic!("tollgate: {e}"),
        }
    }

    /// One `n`-th of each quota, for `n` instances that share one Redis; `n` of 0 is
    /// [`ConfigError::InvalidFallbackShare`](crate::ConfigError::InvalidFallbackShare).
    ///
    /// ```
    /// use tollgate::redis::Share;
    /// assert_eq!(Share::try_one_in(3).unwrap().get(), 1.0 / 3.0);
    /// assert!(Share::try_one_in(0).is_err());
    /// ```
    pub fn try_one_in(n: u32) -> Result<Share, ConfigError> {
        if n == 0 {
            return Err(ConfigError::InvalidFallbackShare("1/0".to_owned()));
        }
        Share::try_new(1.0 / f64::from(n))
    }

    /// The share, in `(0, 1]`.
    pub fn get(self) -> f64 {
        self.0
    }
}

// A share is never NaN: equality is total.
impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Share {}

/// Retry time of a fail-closed decision.
pub(crate) const RETRY_WHEN_UNAVAILABLE: Duration = Duration::from_secs(1);

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Where Redis-backed limiters keep their state: a connection to one Redis server (or a Redis
/// Cluster), with the settings every limiter built on it shares.
///
/// * **One connection, shared.** The connection is multiplexed: concurrent decisions are
///   pipelined on it, and each decision is one `EVALSHA` round trip. Clones share it. It
///   reconnects by itself after Redis restarts.
/// * **Bounded waits.** Each decision waits at most [`timeout`](Self::timeout) (50 ms by
///   default); then, and on any error, the [`FailMode`] decides. A request never hangs on
///   Redis.
/// * **Quiet outages.** The first error of an outage is logged (`tracing`, at `warn`), then at
///   most one line every 10 s with the number of errors since, and one line (at `info`) when
///   Redis answers again.
///
/// ```no_run
/// use tollgate::redis::{FailMode, RedisStore};
/// # async fn run() -> Result<(), redis::RedisError> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379")
///     .await?
///     .timeout(std::time::Duration::from_millis(20))
///     .on_failure(FailMode::Closed);
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    pub(crate) prefix: Arc<[u8]>,
    pub(crate) timeout: Duration,
    pub(crate) on_failure: FailMode,
    pub(crate) deny_cache: usize,
    pub(crate) deny_max_age: Duration,
    pub(crate) lease: Option<Lease>,
    /// During an outage, how often a call may try Redis (`None`: every call).
    probe_every: Option<Duration>,
    outage: Arc<Outage>,
    /// The key name prefixes taken by live limiters without names of their own.
    scopes: Arc<Mutex<Scopes>>,
}

/// Key name prefixes, each with the token of the limiter that holds it.
type Scopes = HashMap<Box<[u8]>, Weak<()>>;

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "connection",
                &match self.conn {
                    Connection::Single(_) => "single",
                    Connection::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_max_age", &self.deny_max_age)
            .field("lease", &self.lease)
            .field("probe_every", &self.probe_every)
            .finish()
    }
}

/// A call of `script` on `keys` with `args`.
fn invocation<'s>(script: &'s Script, keys: &[&[u8]], args: &[Arg<'_>]) -> ScriptInvocation<'s> {
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(*k);
    }
    for a in args {
        match a {
            Arg::Int(n) => call.arg(*n),
            Arg::Bytes(b) => call.arg(*b),
        };
    }
    call
}

/// Reconnection settings: a few quick attempts, then a fresh round on the next decision, so
/// that a restarted server is found again within a second or so. No response timeout of the
/// connection's own (the redis crate's default is 500 ms): the store's
/// [`timeout`](RedisStore::timeout) bounds every call, whatever it is set to.
fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(None)
}

impl RedisStore {
    fn with(conn: Connection) -> Self {
        RedisStore {
            conn,
            prefix: Arc::from(DEFAULT_PREFIX.as_bytes()),
            timeout: DEFAULT_TIMEOUT,
            on_failure: FailMode::default(),
            deny_cache: DEFAULT_DENY_CACHE,
            deny_max_age: DEFAULT_DENY_CACHE_MAX_AGE,
            lease: None,
            probe_every: None,
            outage: Arc::default(),
            scopes: Arc::default(),
        }
    }

    /// A store on the server at `url` (e.g. `redis://127.0.0.1:6379`), connected lazily on the
    /// first decision: an application can start while Redis is down (its failure policy
    /// applies until Redis answers).
    ///
    /// Needs a tokio runtime. Fails only when `url` cannot be parsed.
    pub fn open(url: &str) -> Result<Self, RedisError> {
        let client = Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(client, manager_config())?;
        Ok(Self::with(Connection::Single(manager)))
    }

    /// A store on the server at `url`, connected now, with the decision scripts loaded.
    pub async fn connect(url: &str) -> Result<Self, RedisError> {
        let client = Client::open(url)?;
        let mut manager = ConnectionManager::new_with_config(client, manager_config()).await?;
        SCRIPT.prepare_invoke().load_async(&mut manager).await?;
        GCRA_ONLY.prepare_invoke().load_async(&mut manager).await?;
        PLAIN.prepare_invoke().load_async(&mut manager).await?;
        Ok(Self::with(Connection::Single(manager)))
    }

    /// A store on a Redis Cluster reached through any of `nodes`, connected now.
    ///
    /// Each limiter key is one Redis key, so every decision goes to one node.
    pub async fn connect_cluster<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, RedisError> {
        let client = ClusterClient::builder(nodes.into_iter().collect::<Vec<_>>())
            .connection_timeout(Duration::from_secs(1))
            .build()?;
        let mut conn = client.get_async_connection().await?;
        SCRIPT.prepare_invoke().load_async(&mut conn).await?;
        GCRA_ONLY.prepare_invoke().load_async(&mut conn).await?;
        PLAIN.prepare_invoke().load_async(&mut conn).await?;
        Ok(Self::with(Connection::Cluster(conn)))
    }

    /// A store on a connection manager you configured yourself (TLS, credentials, …).
    pub fn from_manager(manager: ConnectionManager) -> Self {
        Self::with(Connection::Single(manager))
    }

    /// A store on a cluster connection you configured yourself.
    pub fn from_cluster(conn: ClusterConnection) -> Self {
        Self::with(Connection::Cluster(conn))
    }

    /// Prefixes every key with `prefix` (default `tollgate:`). Limiters that share a prefix,
    /// a policy name and a key share one limit, whichever instance they run in.
    ///
    /// With Redis Cluster, a hash tag in the prefix (`app{1}:`) puts every key in one slot,
    /// on one node; without one, keys spread over the slots by their whole name.
    #[must_use]
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = Arc::from(prefix.as_ref());
        self
    }

    /// How long a decision may wait for Redis before the [`FailMode`] decides (default 50 ms).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What to do when Redis cannot decide in time (default: [`FailMode::Open`]).
    #[must_use]
    pub fn on_failure(mut self, mode: FailMode) -> Self {
        self.on_failure = mode;
        self
    }

    /// Bounds each limiter's local deny cache to `max_entries` keys (default 65 536); 0 turns
    /// the cache off, so that every decision asks Redis.
    #[must_use]
    pub fn deny_cache(mut self, max_entries: usize) -> Self {
        self.deny_cache = max_entries;
        self
    }

    /// How long a rejection decided by Redis is answered locally at most (default 1 s), however
    /// long its retry time.
    ///
    /// This bounds how long an instance can disagree with Redis after a key moved back
    /// unseen: another instance gave units back (a refund, a settlement, `return_leases`), or
    /// Redis lost the key's state (a restart without persistence, `FLUSHALL`, eviction, a
    /// failover to a lagging replica): within `max_age` of it, every instance asks Redis again
    /// and sees the fresh state. Give-backs through the same limiter update its cache at once.
    /// Until then a cached rejection may turn away a request that Redis would now admit; it
    /// never admits one that Redis would reject. Under a flood of rejected requests, each key
    /// costs one round trip per `max_age`. `Duration::ZERO` asks Redis for every decision, as
    /// [`deny_cache(0)`](Self::deny_cache) does.
    #[must_use]
    pub fn deny_cache_max_age(mut self, max_age: Duration) -> Self {
        self.deny_max_age = max_age;
        self
    }

    /// While Redis does not answer, tries it at most once per `every` (off by default).
    ///
    /// Without it, every decision during an outage asks Redis and waits up to the
    /// [`timeout`](Self::timeout) before the [`FailMode`] decides: a flood slows to one decision
    /// per timeout and task. With it, after a call fails, the next ones are decided by the
    /// failure policy at once, without a round trip; one call per `every` goes to Redis (it
    /// waits up to the timeout), and the first that Redis answers ends the outage. So Redis
    /// decides again at most `every` (plus a timeout) after it is back. Intervals above
    /// [`MAX_PROBE_INTERVAL`] are that long, so that a Redis that is back is always found;
    /// `Duration::ZERO` probes with every call, as without the setting.
    ///
    /// ```
    /// # fn run() -> Result<(), redis::RedisError> {
    /// use std::time::Duration;
    /// use tollgate::redis::{FailMode, RedisStore};
    ///
    /// let store = RedisStore::open("redis://127.0.0.1:6379")?
    ///     .on_failure(FailMode::Closed)
    ///     .probe_every(Duration::from_millis(250));
    /// # let _ = store; Ok(()) }
    /// ```
    #[must_use]
    pub fn probe_every(mut self, every: Duration) -> Self {
        self.probe_every = Some(every.min(MAX_PROBE_INTERVAL));
        self
    }

    /// Leases hot keys' quota in batches (see [`Lease`](super::Lease)): an instance takes
    /// several units of a key in one script call and admits requests from them without a
    /// round trip, never more than it took. Off by default. Serves policies whose quotas are
    /// all GCRA and that have no penalty box; the others ask Redis for every decision.
    ///
    /// ```
    /// # async fn run() -> Result<(), redis::RedisError> {
    /// use std::time::Duration;
    /// use tollgate::redis::{Lease, RedisStore};
    ///
    /// let store = RedisStore::open("redis://127.0.0.1:6379")?
    ///     .lease(Lease::new(50, Duration::from_millis(100)));
    /// # let _ = store; Ok(()) }
    /// ```
    #[must_use]
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Runs `script` on `keys` with `args`; `None` when Redis gave no reply (see
    /// [`try_eval_script`](Self::try_eval_script)).
    pub(super) async fn eval_script(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        meter: &RedisMeter,
    ) -> Option<Vec<i64>> {
        self.try_eval_script(script, keys, args, meter, None)
            .await
            .ok()
    }

    /// Runs `script` on `keys` with `args`, waiting at most the store's timeout, and no later
    /// than `deadline` when one is given (a decision that already waited for a lease's batch).
    ///
    /// An error about one key or the script on it ([`Failure::Key`]: `WRONGTYPE`, a script
    /// error, `OOM` for a write, `NOPERM` from an ACL rule) is logged once per policy and counted, and never trips the
    /// outage state. Anything else (a timeout, a refused or dropped connection, a server that
    /// is loading, read-only, down or refusing the credentials) is [`Failure::Unavailable`]
    /// and is an outage, except a timeout cut short by `deadline` (the call did not have the
    /// store's whole timeout, so it says nothing about Redis).
    pub(super) async fn try_eval_script(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[Arg<'_>],
        meter: &RedisMeter,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<i64>, Failure> {
        let start = tokio::time::Instant::now();
        let (wait, cut) = match deadline {
            Some(d) if d.saturating_duration_since(start) < self.timeout => {
                (d.saturating_duration_since(start), true)
            }
            _ => (self.timeout, false),
        };
        if wait.is_zero() {
            // The decision's time is up before the call: the failure policy decides.
            return Err(Failure::Unavailable);
        }
        let call = invocation(script, keys, args);
        if let Some(every) = self.probe_every {
            if !self.outage.may_call(Instant::now(), every) {
                // An outage is on and this is not the call that probes: the failure policy
                // decides at once.
                return Err(Failure::Unavailable);
            }
        }
        let reply = async {
            match &self.conn {
                Connection::Single(c) => call.invoke_async::<Vec<i64>>(&mut c.clone()).await,
                Connection::Cluster(c) => call.invoke_async::<Vec<i64>>(&mut c.clone()).await,
            }
        };
        let reply = tokio::time::timeout(wait, reply).await;
        meter.call(start.elapsed());
        match reply {
            Ok(Ok(reply)) => {
                self.answered();
                Ok(reply)
            }
            Ok(Err(e)) => match key_error_cause(&e) {
                Some(cause) => {
                    // Redis answered: whatever is wrong is wrong with this key, not with Redis.
                    self.answered();
                    meter.error(StoreError::Key);
                    meter
                        .key_errors()
                        .report(keys.first().copied().unwrap_or_default(), &e, cause);
                    Err(Failure::Key)
                }
                None => {
                    meter.error(StoreError::Connection);
                    self.failed(&e);
                    Err(Failure::Unavailable)
                }
            },
            Err(_) => {
                meter.error(StoreError::Timeout);
                if !cut {
                    self.failed(&format_args!("no answer within {:?}", self.timeout));
                }
                Err(Failure::Unavailable)
            }
        }
    }

    /// Runs `cmd` in the background of the decisions (see `expiry.rs`), waiting at most
    /// `wait`: neither counted nor logged as a decision's call, and no outage when it fails.
    pub(super) async fn background<T: ::redis::FromRedisValue>(
        &self,
        cmd: &::redis::Cmd,
        wait: Duration,
    ) -> Result<T, String> {
        let call = async {
            match &self.conn {
                Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
                Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            }
        };
        match tokio::time::timeout(wait, call).await {
            Ok(reply) => reply.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {wait:?}")),
        }
    }

    /// Runs `script` on `key` with `args` in the background of the decisions, as
    /// [`background`](Self::background).
    pub(super) async fn background_script(
        &self,
        script: &Script,
        key: &[u8],
        args: &[Arg<'_>],
        wait: Duration,
    ) -> Result<(), String> {
        let call = invocation(script, &[key], args);
        let reply = async {
            match &self.conn {
                Connection::Single(c) => call.invoke_async::<::redis::Value>(&mut c.clone()).await,
                Connection::Cluster(c) => call.invoke_async::<::redis::Value>(&mut c.clone()).await,
            }
        };
        match tokio::time::timeout(wait, reply).await {
            Ok(reply) => reply.map(drop).map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {wait:?}")),
        }
    }

    /// The deadline of a decision that starts now: the store's timeout from now (a timeout
    /// too long for the clock never ends).
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        now.checked_add(self.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
    }

    /// Redis answered a call: an outage, if one was on, is over.
    fn answered(&self) {
        if let Some(line) = self.outage.success(Instant::now) {
            log(&line, None);
        }
    }

    /// Takes the key name prefix `scope` for a limiter without a name of its own, for as long
    /// as the returned token lives; `None` when a live limiter of this store holds it.
    pub(crate) fn claim(&self, scope: &[u8]) -> Option<Arc<()>> {
        let mut scopes = self.scopes.lock().unwrap_or_else(|e| e.into_inner());
        scopes.retain(|_, held| held.strong_count() > 0);
        if scopes.contains_key(scope) {
            return None;
        }
        let token = Arc::new(());
        scopes.insert(scope.into(), Arc::downgrade(&token));
        Some(token)
    }

    /// Whether Redis failed to answer the latest call (until it answers one again).
    pub(crate) fn is_down(&self) -> bool {
        self.outage.is_down()
    }

    /// Whether the store is a Redis Cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Connection::Cluster(_))
    }

    /// Reports a reply that does not fit the script: Redis answered, so this is about the
    /// key's stored value (another layout), not an outage.
    pub(crate) fn bad_reply(&self, meter: &RedisMeter) {
        self.bad_reply_on(meter, b"");
    }

    /// Reports a reply for the Redis key `key` that does not fit the script, as
    /// [`bad_reply`](Self::bad_reply).
    pub(crate) fn bad_reply_on(&self, meter: &RedisMeter, key: &[u8]) {
        meter.error(StoreError::BadReply);
        meter.key_errors().report(
            key,
            &"unexpected reply from the decision script",
            BAD_REPLY_CAUSE,
        );
    }

    fn failed(&self, error: &dyn fmt::Display) {
        if let Some(line) = self.outage.error(Instant::now(), SUMMARY_INTERVAL) {
            log(&line, Some((error, self.on_failure)));
        }
    }
}

/// Why a script call gave no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Redis did not answer in time, or failed as a whole: the [`FailMode`] decides.
    Unavailable,
    /// Redis answered with an error about this key or the script on it: the request is
    /// rejected as unavailable, whatever the [`FailMode`] (a misconfiguration must be loud).
    Key,
}

const BAD_REPLY_CAUSE: &str = "the key's stored value does not fit this limiter's quotas: \
    another limiter with other quotas writes the same Redis key";

/// The likely cause of an error that is about one key or the script on it, not about Redis
/// as a whole; `None` for an outage.
pub(crate) fn key_error_cause(e: &RedisError) -> Option<&'static str> {
    match e.code() {
        Some("WRONGTYPE") => Some(
            "the key holds a value of another type: another limiter (quotas of another kind) \
             or another program writes the same Redis key; give each limiter its own name or \
             store prefix",
        ),
        Some("OOM") => Some("Redis is out of memory (maxmemory) and refuses this write"),
        // Redis answered: its access rules, not its health, refuse the call.
        Some("NOPERM") => Some(
            "the Redis user may not run the decision script on this key (an ACL rule): allow \
             it the store's key prefix (`~<prefix>*`) and `EVALSHA`, `EVAL`, `SCRIPT`",
        ),
        Some("ERR") if e.detail().is_some_and(|d| d.contains("script")) => Some(
            "the decision script failed on the key's stored value, which another limiter may \
             have written in another layout",
        ),
        _ if e.kind() == ::redis::ErrorKind::UnexpectedReturnType => Some(BAD_REPLY_CAUSE),
        _ => None,
    }
}

fn log(line: &Line, error: Option<(&dyn fmt::Display, FailMode)>) {
    let mode = match error.map(|(_, m)| m) {
        Some(FailMode::Closed) => "rejecting requests (fail closed)".to_owned(),
        Some(FailMode::Local(share)) => format!(
            "deciding in this process at {}% of each quota (local fallback)",
            (share.get() * 10_000.0).round() / 100.0
        ),
        _ => "admitting requests (fail open)".to_owned(),
    };
    let error = error.map(|(e, _)| e.to_string()).unwrap_or_default();
    match line {
        Line::Down => {
            tracing::warn!(target: "tollgate::redis", %error, "Redis unavailable, {mode}")
        }
        Line::StillDown { errors } => tracing::warn!(
            target: "tollgate::redis",
            errors,
            %error,
            "Redis still unavailable, {mode}: {errors} more failed decisions"
        ),
        Line::Back { lasted, errors } => tracing::info!(
            target: "tollgate::redis",
            errors,
            "Redis available again after {lasted:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::key_error_cause;

    /// The error Redis sends as `line` (without its leading `-`), as the client reports it.
    fn error(line: &str) -> ::redis::RedisError {
        let bytes = format!("-{line}\r\n");
        match ::redis::parse_redis_value(bytes.as_bytes()).and_then(|v| v.extract_error()) {
            Err(e) => e,
            Ok(v) => panic!("not an error: {v:?}"),
        }
    }

    #[test]
    fn errors_about_one_key_or_its_script_are_key_errors_and_the_rest_outages() {
        for key in [
            "WRONGTYPE Operation against a key holding the wrong kind of value script: x",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR user_script:12: attempt to perform arithmetic on a nil value script: x",
            "ERR Error running script (call to f_0123): @user_script:1: boom",
            "NOPERM this user has no permissions to run the 'evalsha' command",
            "NOPERM No permissions to access a key",
        ] {
            assert!(key_error_cause(&error(key)).is_some(), "{key}");
        }
        for outage in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "READONLY You can't write against a read only replica.",
            "MASTERDOWN Link with MASTER is down",
            "NOAUTH Authentication required.",
            "CLUSTERDOWN The cluster is down",
            "ERR max number of clients reached",
        ] {
            assert_eq!(key_error_cause(&error(outage)), None, "{outage}");
        }
        let io = ::redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(key_error_cause(&io), None);
    }
}
