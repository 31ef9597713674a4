//! The two stores a shared suite runs over: the same test body, written once against
//! [`Store`], decides on the memory store and on a real redis-server.
//!
//! [`over_both_stores!`](crate::over_both_stores) instantiates each listed body as a test on
//! each store (`<module>::memory::<name>` and `<module>::redis::<name>`); the Redis one starts
//! its own server (`tests/common/redis_server.rs`). What differs between the stores (reading a
//! key without spending, evicting idle keys, the Redis key's time to live) is a method here,
//! so the bodies hold only the behaviour docs/design.md sections 1 and 3 promise on both.
#![allow(dead_code)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use tollgate::key::{Header, KeyExtractor, RequestHead};
use tollgate::penalty::Strike;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::{Clock, ConfigError, Decision, Policy, Quota, RateLimitLayer, RateLimiter};
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service};

use super::account::rig::Handler;

/// The layer every suite of this group uses: keyed by `x-key`, costing `x-cost`; a `200` does
/// not count, and a response that counts settles the cost it reports.
pub fn layer(quotas: &[Quota], name: &str, clock: &Clock) -> RateLimitLayer<Header> {
    let policy = quotas[1..]
        .iter()
        .fold(Policy::new(name.to_owned(), quotas[0].clone()), |p, q| {
            p.quota(q.clone())
        });
    RateLimitLayer::new(policy)
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .cost(x_cost)
        .count_if(|res| res.status != StatusCode::OK)
        .settle(ActualCost::of)
}

/// The cost a request of the rig asks for in `x-cost`, 1 without it.
pub fn x_cost(h: &RequestHead<'_>) -> u32 {
    h.headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// The key `k` as the layer keys it.
pub fn key(k: &str) -> Box<[u8]> {
    k.as_bytes().into()
}

/// A service of the rig's requests, boxed, so that layers on either store stack in any order
/// around any handler.
pub type Boxed = BoxCloneSyncService<http::Request<()>, Response<Full<Bytes>>, Infallible>;

/// A layer in memory, keyed as it is, around `inner`.
pub fn around<E: KeyExtractor>(l: &RateLimitLayer<E>, inner: Boxed) -> Boxed
where
    RateLimitLayer<E>: Layer<Boxed>,
    <RateLimitLayer<E> as Layer<Boxed>>::Service: Service<
            http::Request<()>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static,
{
    Boxed::new(l.layer(inner))
}

/// A store a shared suite runs on.
#[allow(async_fn_in_trait)]
pub trait Store {
    /// The layer of [`layer`], on this store.
    type Layer: Layer<Handler, Service = Self::Service> + Clone;
    /// The layer's service around the rig's handler.
    type Service: Service<
            http::Request<()>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static;
    /// The layer's limiter of one policy.
    type Limiter;

    /// Cases of a property test on this store (a Redis case is a few hundred round trips).
    const CASES: u32;
    /// The store decides in whole units of this many nanoseconds (the scripts work in
    /// microseconds).
    const TICK_NS: u128;

    /// [`layer`] on this store, its policy named `name` (names are distinct within a test, as
    /// two limits meet in Redis under one name).
    fn layer(&self, quotas: &[Quota], name: &str, clock: &Clock) -> Self::Layer {
        self.on(layer(quotas, name, clock))
    }
    /// Any layer keyed by a header, on this store.
    fn on(&self, l: RateLimitLayer<Header>) -> Self::Layer;
    /// Another instance of the service `l` is, `again` being its layer built anew: on Redis a
    /// layer of its own on the same server (its own ban and deny cache, as another process
    /// has); in memory, where the state is the process's, a clone of `l`.
    fn instance(&self, l: &Self::Layer, again: RateLimitLayer<Header>) -> Self::Layer;
    /// `l` around `inner`.
    fn around(&self, l: &Self::Layer, inner: Boxed) -> Boxed;
    /// What is left of the layer's policy `name` for `k`, per quota.
    async fn left(&self, l: &Self::Layer, name: &str, k: &str) -> Vec<u64> {
        let d = self.peek(&self.limiter(l, name), k).await;
        d.states().iter().map(|s| s.remaining()).collect()
    }
    /// The layer's setting error, if it has one.
    fn validate(&self, l: &Self::Layer) -> Result<(), ConfigError>;
    /// The limiter of the policy named `name`.
    fn limiter(&self, l: &Self::Layer, name: &str) -> Self::Limiter;
    /// A limiter of `quotas` on this store, without a layer, named `name`.
    fn build(&self, quotas: &[Quota], name: &str, clock: &Clock) -> Self::Limiter;
    /// Replaces the layer's policy.
    fn apply(&self, l: &Self::Layer, p: Policy);
    /// Replaces the quotas of a limiter.
    fn set_quotas(&self, l: &Self::Limiter, quotas: Vec<Quota>) {
        self.try_set_quotas(l, quotas).unwrap();
    }
    /// Replaces the quotas of a limiter, or says why not.
    fn try_set_quotas(&self, l: &Self::Limiter, quotas: Vec<Quota>) -> Result<(), ConfigError>;
    /// Decides a request of cost 1 for `k`.
    async fn check(&self, l: &Self::Limiter, k: &str) -> Decision {
        self.check_n(l, k, 1).await
    }
    /// Decides a request of `cost` for `k`.
    async fn check_n(&self, l: &Self::Limiter, k: &str, cost: u32) -> Decision;
    /// Reads `k`'s decision without spending (a peek in memory, a cost of 0 on Redis).
    async fn peek(&self, l: &Self::Limiter, k: &str) -> Decision;
    /// Drops idle keys where the store keeps a table (memory); Redis expires them itself.
    fn evict_idle(&self, l: &Self::Limiter);
    /// Records a strike against `k` in the penalty box of the layer's policy `name`, outside
    /// a decision; how long `k` is banned now, if it is.
    async fn strike(&self, l: &Self::Layer, name: &str, k: &str) -> Option<Duration>;
    /// How long `k` is still banned by the layer's policy `name`.
    async fn ban_left(&self, l: &Self::Layer, name: &str, k: &str) -> Option<Duration>;
    /// Lifts `k`'s ban and forgets its strikes.
    async fn pardon(&self, l: &Self::Layer, name: &str, k: &str);
    /// Keeps `k`'s state for as long as the test reads it: a Redis key's time to live runs
    /// on the server's clock, not the test's manual one. Nothing in memory.
    async fn keep(&self, l: &Self::Limiter, k: &str);
}

/// The memory store.
pub struct Memory;

impl Store for Memory {
    type Layer = RateLimitLayer<Header>;
    type Service = <RateLimitLayer<Header> as Layer<Handler>>::Service;
    type Limiter = RateLimiter<Box<[u8]>>;

    const CASES: u32 = 200;
    const TICK_NS: u128 = 1;

    fn on(&self, l: RateLimitLayer<Header>) -> Self::Layer {
        l
    }
    fn instance(&self, l: &Self::Layer, _: RateLimitLayer<Header>) -> Self::Layer {
        l.clone()
    }
    fn around(&self, l: &Self::Layer, inner: Boxed) -> Boxed {
        around(l, inner)
    }
    fn validate(&self, l: &Self::Layer) -> Result<(), ConfigError> {
        l.clone().validate().map(drop)
    }
    fn limiter(&self, l: &Self::Layer, name: &str) -> Self::Limiter {
        l.limiter(name).unwrap().unwrap()
    }
    fn build(&self, quotas: &[Quota], _: &str, clock: &Clock) -> Self::Limiter {
        let b = RateLimiter::builder(quotas[0].clone()).clock(clock.clone());
        quotas[1..]
            .iter()
            .fold(b, |b, q| b.quota(q.clone()))
            .build()
    }
    fn apply(&self, l: &Self::Layer, p: Policy) {
        l.handle().unwrap().apply(&p).unwrap();
    }
    fn try_set_quotas(&self, l: &Self::Limiter, quotas: Vec<Quota>) -> Result<(), ConfigError> {
        l.set_quotas(quotas)
    }
    async fn check_n(&self, l: &Self::Limiter, k: &str, cost: u32) -> Decision {
        l.check_n(&key(k), cost)
    }
    async fn peek(&self, l: &Self::Limiter, k: &str) -> Decision {
        l.peek(&key(k))
    }
    fn evict_idle(&self, l: &Self::Limiter) {
        l.evict_idle();
    }
    async fn strike(&self, l: &Self::Layer, _: &str, k: &str) -> Option<Duration> {
        match l.penalties().unwrap().unwrap().strike(&key(k)) {
            Strike::Banned { ban, .. } => Some(ban),
            Strike::AlreadyBanned(left) => Some(left),
            _ => None,
        }
    }
    async fn ban_left(&self, l: &Self::Layer, _: &str, k: &str) -> Option<Duration> {
        l.penalties().unwrap().unwrap().ban_left(&key(k))
    }
    async fn pardon(&self, l: &Self::Layer, _: &str, k: &str) {
        l.penalties().unwrap().unwrap().pardon(&key(k));
    }
    async fn keep(&self, _: &Self::Limiter, _: &str) {}
}

#[cfg(feature = "redis")]
#[allow(unused_imports)] // Not every group runs a suite on Redis.
pub use on_redis::OnRedis;

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use crate::common::redis_server::{expired_keys, RedisServer};
    use proptest::test_runner::TestCaseError;
    use std::sync::atomic::Ordering;
    use tollgate::redis::{RedisRateLimiter, RedisStore};

    /// A `RedisStore` on a redis-server of its own.
    ///
    /// The tests decide on the manual clock, but the server expires keys on its own: a key
    /// written with a time to live of `d` (until it is idle on the manual clock) is gone once
    /// `d` of real time passed, however still the manual clock stood, and on a loaded machine
    /// that happens between two steps (a burst of 100 per second starts with a key of 10 ms).
    /// So an outcome is judged only when the server expired no key on its own clock meanwhile
    /// (`INFO stats`, `expired_keys`): a suite's run in which it did is void and runs again on
    /// a new server ([`over_both_stores!`](crate::over_both_stores)), a property case is void
    /// ([`judge`](Self::judge)).
    pub struct OnRedis {
        /// The server, stopped when this is dropped.
        _server: RedisServer,
        pub store: RedisStore,
        conn: redis::aio::MultiplexedConnection,
        /// The server's `expired_keys` when the outcome being judged began.
        expired: std::sync::atomic::AtomicU64,
    }

    impl OnRedis {
        /// Starts a server and connects to it.
        pub async fn start() -> Self {
            let server = RedisServer::start();
            let store = RedisStore::connect(&server.url())
                .await
                .unwrap()
                .timeout(Duration::from_secs(5));
            let mut conn = crate::common::redis_server::connection(&server).await;
            let expired = expired_keys(&mut conn).await.into();
            OnRedis {
                _server: server,
                store,
                conn,
                expired,
            }
        }

        /// Whether the server expired a key on its own clock since the outcome being judged
        /// began; the next begins now.
        async fn expired_any(&self) -> bool {
            let now = expired_keys(&mut self.conn.clone()).await;
            now > self.expired.swap(now, Ordering::Relaxed)
        }

        /// The verdict of a property case run on the manual clock since the last verdict:
        /// `outcome` as it is, unless the server expired a key on its own clock meanwhile,
        /// which voids the case (a rejection: proptest draws another).
        pub async fn judge<T>(
            &self,
            outcome: Result<T, TestCaseError>,
        ) -> Result<T, TestCaseError> {
            if self.expired_any().await {
                eprintln!("{}: a case is void: {VOID}", test_name());
                return Err(TestCaseError::reject(VOID));
            }
            outcome
        }

        /// The verdict of attempt `attempt` of a suite's test on this server: `true` when it
        /// passed, `false` when it is void and runs again; a failure it had stands (the panic
        /// goes on), unless void.
        pub async fn verdict(&self, attempt: u32, outcome: std::thread::Result<()>) -> bool {
            if !self.expired_any().await {
                match outcome {
                    Ok(()) => return true,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            assert!(
                attempt < ATTEMPTS,
                "the server expired a key on its own clock in each of {ATTEMPTS} attempts"
            );
            eprintln!("{}: attempt {attempt} is void: {VOID}", test_name());
            false
        }
    }

    const VOID: &str = "the server expired a key on its own clock while the manual clock stood";

    /// The running test's name, as the harness names its thread.
    fn test_name() -> String {
        std::thread::current().name().unwrap_or("?").to_owned()
    }

    /// How many times a suite's test runs at most on Redis before every attempt being void
    /// fails it.
    pub const ATTEMPTS: u32 = 5;

    impl Store for OnRedis {
        type Layer = RateLimitLayer<Header, RedisStore>;
        type Service = <RateLimitLayer<Header, RedisStore> as Layer<Handler>>::Service;
        type Limiter = RedisRateLimiter<Box<[u8]>>;

        const CASES: u32 = 64;
        const TICK_NS: u128 = 1_000;

        fn on(&self, l: RateLimitLayer<Header>) -> Self::Layer {
            l.store(self.store.clone())
        }
        fn instance(&self, _: &Self::Layer, again: RateLimitLayer<Header>) -> Self::Layer {
            self.on(again)
        }
        fn around(&self, l: &Self::Layer, inner: Boxed) -> Boxed {
            Boxed::new(l.layer(inner))
        }
        fn validate(&self, l: &Self::Layer) -> Result<(), ConfigError> {
            l.clone().validate().map(drop)
        }
        fn limiter(&self, l: &Self::Layer, name: &str) -> Self::Limiter {
            l.limiter(name).unwrap().unwrap()
        }
        fn build(&self, quotas: &[Quota], name: &str, clock: &Clock) -> Self::Limiter {
            let b = RedisRateLimiter::builder(self.store.clone(), quotas[0].clone())
                .name(name.to_owned())
                .clock(clock.clone());
            quotas[1..]
                .iter()
                .fold(b, |b, q| b.quota(q.clone()))
                .build()
        }
        fn apply(&self, l: &Self::Layer, p: Policy) {
            l.handle().unwrap().apply(&p).unwrap();
        }
        fn try_set_quotas(&self, l: &Self::Limiter, quotas: Vec<Quota>) -> Result<(), ConfigError> {
            l.set_quotas(quotas)
        }
        async fn check_n(&self, l: &Self::Limiter, k: &str, cost: u32) -> Decision {
            l.check_n(&key(k), cost).await
        }
        async fn peek(&self, l: &Self::Limiter, k: &str) -> Decision {
            l.check_n(&key(k), 0).await
        }
        fn evict_idle(&self, _: &Self::Limiter) {}
        async fn strike(&self, l: &Self::Layer, name: &str, k: &str) -> Option<Duration> {
            self.limiter(l, name).strike(&key(k)).await
        }
        async fn ban_left(&self, l: &Self::Layer, name: &str, k: &str) -> Option<Duration> {
            self.limiter(l, name).ban_left(&key(k)).await
        }
        async fn pardon(&self, l: &Self::Layer, name: &str, k: &str) {
            self.limiter(l, name).pardon(&key(k)).await;
        }
        async fn keep(&self, l: &Self::Limiter, k: &str) {
            let _: i64 = redis::cmd("PERSIST")
                .arg(l.redis_key(&key(k)))
                .query_async(&mut self.conn.clone())
                .await
                .unwrap();
        }
    }
}

/// Instantiates each listed test body, an `async fn(&impl Store)` of the module that calls
/// this, as a test on the memory store (module `memory`) and on Redis (module `redis`). A name
/// may be followed by the arguments of its `#[tokio::test(..)]`, as `racing(flavor =
/// "multi_thread", worker_threads = 2)`.
#[macro_export]
macro_rules! over_both_stores {
    ($($name:ident $(($($runtime:tt)*))?),* $(,)?) => {
        /// The shared suite on the memory store.
        mod memory {
            $(
                #[tokio::test$(($($runtime)*))?]
                async fn $name() {
                    super::$name(&$crate::common::stores::Memory).await;
                }
            )*
        }

        /// The shared suite on a real redis-server, each test judged only on a run in which
        /// the server expired no key on its own clock (see `OnRedis`).
        #[cfg(feature = "redis")]
        mod redis {
            $(
                #[tokio::test$(($($runtime)*))?]
                async fn $name() {
                    let mut attempt = 1;
                    loop {
                        let s = $crate::common::stores::OnRedis::start().await;
                        let outcome = ::futures_util::FutureExt::catch_unwind(
                            ::std::panic::AssertUnwindSafe(super::$name(&s)),
                        )
                        .await;
                        if s.verdict(attempt, outcome).await {
                            break;
                        }
                        attempt += 1;
                    }
                }
            )*
        }
    };
}
