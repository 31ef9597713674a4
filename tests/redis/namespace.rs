//! Redis key names: two limits never meet in Redis unless they are named alike on purpose.
//! The same layer in several processes shares its keys; layers that differ in their quotas
//! or their key extractor never do; two identical unnamed layers on one store are refused
//! when built. Against a real `redis-server` started by each test.
//!
//! Pins docs/design.md section 3 ("Redis": key names).

#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use common::redis_server::RedisServer;
use http::{Request, Response, StatusCode};
use tollgate::key::{self, Header, KeyExtractorExt, PeerIp, RequestHead};
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, ConfigError, Policy, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

fn req(path: &str, peer: &str, api_key: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path);
    if let Some(k) = api_key {
        b = b.header("x-api-key", k);
    }
    let mut r = b.body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{peer}:4000").parse().unwrap();
    r.extensions_mut().insert(ConnectInfo(addr));
    r
}

async fn send<S, B>(svc: &mut S, r: Request<Body>) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(r).await.unwrap().status()
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(2))
}

/// Every key name in the server, sorted.
fn keys(server: &RedisServer) -> Vec<String> {
    let out = server.cli(&["KEYS", "*"]).unwrap_or_default();
    let mut keys: Vec<String> = out.lines().map(str::to_owned).collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn unnamed_layers_keyed_differently_never_share_a_bucket() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let login = RateLimitLayer::new(Quota::per_minute(3))
        .key(PeerIp)
        .clock(clock.clone())
        .store(store.clone());
    let api = RateLimitLayer::new(Quota::per_minute(3))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(store);
    let mut login = login.layer(tower::service_fn(ok));
    let mut api = api.layer(tower::service_fn(ok));
    // A client sends the victim's address as its API key, three times.
    for _ in 0..3 {
        let r = req("/api", "192.0.2.66", Some("10.0.0.1"));
        assert_eq!(send(&mut api, r).await, StatusCode::OK);
    }
    // The victim's first three logins are its own.
    for _ in 0..3 {
        let r = req("/login", "10.0.0.1", None);
        assert_eq!(send(&mut login, r).await, StatusCode::OK);
    }
    assert_eq!(
        send(&mut login, req("/login", "10.0.0.1", None)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let names = keys(&server);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|k| k.starts_with("tollgate:21:3-per-1m#")));
}

#[tokio::test]
async fn quotas_named_alike_for_their_header_fields_never_share_a_bucket_across_keys() {
    // `Quota::named` names the header items; it is no choice to share Redis keys.
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let minute = || Quota::per_minute(3).named("minute");
    let login = RateLimitLayer::new(minute())
        .key(PeerIp)
        .clock(clock.clone())
        .store(store.clone());
    let api = RateLimitLayer::new(minute())
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(store);
    let mut login = login.layer(tower::service_fn(ok));
    let mut api = api.layer(tower::service_fn(ok));
    for _ in 0..3 {
        let r = req("/api", "192.0.2.66", Some("10.0.0.1"));
        assert_eq!(send(&mut api, r).await, StatusCode::OK);
    }
    for _ in 0..3 {
        let r = req("/login", "10.0.0.1", None);
        assert_eq!(send(&mut login, r).await, StatusCode::OK);
    }
    let names = keys(&server);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|k| k.starts_with("tollgate:")));
    assert!(names.iter().all(|k| k.contains("minute#")), "{names:?}");
}

#[tokio::test]
async fn policies_named_alike_on_purpose_share_their_keys() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let a = RateLimitLayer::new(Policy::new("shared", Quota::per_minute(3)))
        .key(Header::new("x-api-key"))
        .clock(clock.clone())
        .store(store.clone());
    let b = RateLimitLayer::new(Policy::new("shared", Quota::per_minute(3)))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(store);
    let mut a = a.layer(tower::service_fn(ok));
    let mut b = b.layer(tower::service_fn(ok));
    for _ in 0..3 {
        let r = req("/a", "192.0.2.1", Some("k"));
        assert_eq!(send(&mut a, r).await, StatusCode::OK);
    }
    let r = req("/b", "192.0.2.1", Some("k"));
    assert_eq!(send(&mut b, r).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(keys(&server), vec!["tollgate:6:shared:k".to_owned()]);
}

#[tokio::test]
async fn an_unnamed_gcra_layer_and_an_unnamed_sliding_log_layer_each_admit_their_own_limit() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let (clock, _time) = Clock::manual();
    let gcra = RateLimitLayer::new(Quota::per_second(10))
        .key(Header::new("x-api-key"))
        .clock(clock.clone())
        .store(store.clone());
    let log = RateLimitLayer::new(Quota::sliding_log(10, Duration::from_secs(1)))
        .key(Header::new("x-api-key"))
        .clock(clock)
        .store(store);
    let mut gcra = gcra.layer(tower::service_fn(ok));
    let mut log = log.layer(tower::service_fn(ok));
    let (mut admitted, mut errors) = (0, 0);
    for i in 0..30 {
        let status = if i % 2 == 0 {
            send(&mut gcra, req("/", "192.0.2.1", Some("k"))).await
        } else {
            send(&mut log, req("/", "192.0.2.1", Some("k"))).await
        };
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            _ => errors += 1,
        }
    }
    // Fifteen requests each: ten admitted by each limit, no key of the wrong type.
    assert_eq!((admitted, errors), (20, 0));
}

#[tokio::test]
async fn the_same_layer_in_two_processes_shares_its_keys() {
    let server = RedisServer::start();
    let (clock, _time) = Clock::manual();
    // Two processes: two stores, two connections, the same configuration.
    let layer = |store: RedisStore| {
        RateLimitLayer::new(Quota::per_minute(3))
            .key(Header::new("x-api-key"))
            .clock(clock.clone())
            .store(store)
    };
    let mut a = layer(store(&server).await).layer(tower::service_fn(ok));
    let mut b = layer(store(&server).await).layer(tower::service_fn(ok));
    assert_eq!(
        send(&mut a, req("/", "192.0.2.1", Some("k"))).await,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut b, req("/", "192.0.2.1", Some("k"))).await,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut a, req("/", "192.0.2.1", Some("k"))).await,
        StatusCode::OK
    );
    assert_eq!(
        send(&mut b, req("/", "192.0.2.1", Some("k"))).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(keys(&server).len(), 1);
}

#[tokio::test]
async fn unnamed_layers_that_differ_in_any_number_of_a_quota_write_different_keys() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let quotas = [
        Quota::per_minute(3),
        Quota::per_minute(3).burst(4),
        Quota::per_second(3).burst(3),
        Quota::fixed_window(3, Duration::from_secs(60)),
        Quota::sliding_window(3, Duration::from_secs(60)),
    ];
    let mut names = Vec::new();
    for q in quotas {
        let limiter = RedisRateLimiter::<u64>::builder(store.clone(), q)
            .try_build()
            .unwrap();
        names.push(limiter.redis_key(&1));
    }
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len());
    // Another key type, the same quota: other keys too.
    let other = RedisRateLimiter::<String>::builder(store, Quota::per_second(1))
        .try_build()
        .unwrap();
    assert!(!names.contains(&other.redis_key(&"1".to_owned())));
}

#[tokio::test]
async fn two_identical_unnamed_layers_on_one_store_are_refused_when_built() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let layer = || {
        RateLimitLayer::new(Quota::per_minute(3))
            .key(Header::new("x-api-key"))
            .store(store.clone())
    };
    let first = layer();
    assert!(first.handle().is_ok());
    let second = layer();
    assert_eq!(
        second.handle().err(),
        Some(ConfigError::SharedRedisKeys("3-per-1m".into()))
    );
    // One layer value applied twice is one limit: no error.
    let again = first.clone();
    assert!(again.handle().is_ok());
    // Once the first is gone, its keys are free again.
    drop((first, again));
    assert!(layer().handle().is_ok());
    // Named alike on purpose, they share.
    let named = || {
        RateLimitLayer::new(Policy::new("login", Quota::per_minute(3)))
            .key(Header::new("x-api-key"))
            .store(store.clone())
    };
    let (n1, n2) = (named(), named());
    assert!(n1.handle().is_ok() && n2.handle().is_ok());
}

#[tokio::test]
async fn an_unnamed_closure_extractor_on_redis_must_be_named() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let tenant = |req: &RequestHead<'_>| req.uri.path().split('/').nth(1).map(str::to_owned);
    let unnamed = RateLimitLayer::new(Quota::per_minute(3))
        .key(key::from_fn(tenant))
        .store(store.clone());
    let err = unnamed.handle().err();
    assert_eq!(err, Some(ConfigError::UnnamedRedisKeys("3-per-1m".into())));
    let text = err.unwrap().to_string();
    assert!(
        text.contains("Policy::new") && text.contains(".named("),
        "{text}"
    );
    // Named extractor, or named policy: built.
    let named_key = RateLimitLayer::new(Quota::per_minute(3))
        .key(key::from_fn(tenant).named("tenant"))
        .store(store.clone());
    assert!(named_key.handle().is_ok());
    let named_policy = RateLimitLayer::new(Policy::new("tenants", Quota::per_minute(3)))
        .key(key::from_fn(tenant))
        .store(store.clone());
    assert!(named_policy.handle().is_ok());
    // A mapped key is a closure too.
    let mapped = RateLimitLayer::new(Quota::per_minute(4))
        .key(PeerIp.map(|ip| ip.to_string()))
        .store(store);
    assert!(matches!(
        mapped.handle().err(),
        Some(ConfigError::UnnamedRedisKeys(_))
    ));
}

#[test]
fn built_in_extractors_describe_what_they_key_by() {
    use tollgate::key::{ClientIp, Global, KeyExtractor, Route};
    assert_eq!(PeerIp.describe().as_deref(), Some("peer-ip/64"));
    assert_eq!(
        Header::new("X-Api-Key").describe().as_deref(),
        Some("header:x-api-key")
    );
    assert_eq!(
        (Route, Global).describe().as_deref(),
        Some("(route,global)")
    );
    assert_eq!(
        Header::new("a").or(ClientIp::new()).describe().as_deref(),
        Some("or(header:a,client-ip/64)")
    );
    assert_eq!(
        (Route, key::from_fn(|_: &RequestHead<'_>| Some(1u8))).describe(),
        None
    );
}

/// The Redis key name of the key `k` under an unnamed layer of `quotas` keyed by `extractor`,
/// built and dropped (so that the next one may take the same names).
fn key_name<E>(store: &RedisStore, quotas: &[Quota], extractor: E) -> Vec<u8>
where
    E: key::KeyExtractor<Key = Box<[u8]>> + Clone,
{
    let policy = quotas[1..]
        .iter()
        .fold(Policy::from(quotas[0].clone()), |p, q| p.quota(q.clone()));
    let layer = RateLimitLayer::new(policy.clone())
        .key(extractor)
        .store(store.clone());
    let limiter = layer.limiter(policy.name()).unwrap().unwrap();
    limiter.redis_key(&Box::from(&b"k"[..]))
}

/// A quota of one of three kinds, with numbers no two of which decide alike.
fn quota() -> impl proptest::strategy::Strategy<Value = Quota> {
    use proptest::prelude::*;
    let period = prop_oneof![Just(1u64), Just(60), Just(3_600)].prop_map(Duration::from_secs);
    (0..3u8, 1..=10u32, period, 1..=10u32).prop_map(|(kind, count, period, burst)| match kind {
        0 => Quota::new(count, period).burst(burst),
        1 => Quota::fixed_window(count, period),
        _ => Quota::sliding_log(count, period),
    })
}

#[test]
fn unnamed_layers_share_key_names_exactly_when_their_quotas_and_extractors_are_alike() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _enter = rt.enter();
    // Connected lazily: key names need no server.
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let quotas = || prop::collection::vec(quota(), 1..=2);
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(quotas(), 0..3u8, quotas(), 0..3u8),
            |(qa, ea, qb, eb): (Vec<Quota>, u8, Vec<Quota>, u8)| {
                let name = |q: &[Quota], e: u8| match e {
                    0 => key_name(&store, q, Header::new("x-a")),
                    1 => key_name(&store, q, Header::new("x-b")),
                    _ => key_name(&store, q, Header::new("x-a").named("x-a")),
                };
                let alike = qa == qb && ea == eb;
                prop_assert_eq!(name(&qa, ea) == name(&qb, eb), alike);
                // And the same layer twice (two processes) writes the same names.
                prop_assert_eq!(name(&qa, ea), name(&qa, ea));
                Ok(())
            },
        )
        .unwrap();
}

#[tokio::test]
async fn new_quotas_set_while_serving_keep_the_key_names() {
    let store = RedisStore::open("redis://127.0.0.1:1").unwrap();
    let limiter = RedisRateLimiter::<u64>::builder(store, Quota::per_minute(3))
        .try_build()
        .unwrap();
    let before = limiter.redis_key(&1);
    limiter.set_quotas([Quota::per_minute(30)]).unwrap();
    assert_eq!(limiter.redis_key(&1), before);
}
