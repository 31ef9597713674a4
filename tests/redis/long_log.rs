//! A sliding log of 9 001 entries (of a log's most, 10 000 units) through a settling layer, on
//! Redis beside memory in lockstep: a request of cost 3 held by its handler while 9 000 others
//! are admitted (some of cost 2 settling for 1, given back from the newest entry), then settled for less itself, which
//! gives back from the oldest entry and rewrites every later one in Redis. Every response on
//! Redis has the status, `RateLimit` and `Retry-After` of the same response on memory, and
//! the log keeps every unit: the one that fills what remains is admitted, the next refused.
//!
//! Pins docs/design.md section 3 ("An account per key", "Redis"): both stores keep the same
//! account, whatever the log's length.
#![cfg(all(feature = "redis", feature = "axum"))]

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::redis_server::RedisServer;
use http::{Request, Response};
use http_body_util::Full;
use tokio::sync::Semaphore;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::RedisStore;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt};

type Svc = BoxCloneSyncService<Request<()>, Response<Full<Bytes>>, Infallible>;

/// Answers with the cost in `x-actual`; a request to `/slow` first waits for the gate.
fn handler(gate: Arc<Semaphore>, calls: Arc<AtomicUsize>) -> Svc {
    Svc::new(tower::service_fn(move |req: Request<()>| {
        let (gate, calls) = (gate.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if req.uri().path() == "/slow" {
                gate.acquire().await.unwrap().forget();
            }
            let actual = req
                .headers()
                .get("x-actual")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            let mut resp = Response::new(Full::new(Bytes::new()));
            if let Some(a) = actual {
                resp.extensions_mut().insert(ActualCost(a));
            }
            Ok::<_, Infallible>(resp)
        }
    }))
}

fn req(path: &str, cost: u32, actual: u32) -> Request<()> {
    Request::get(path)
        .header("x-key", "k")
        .header("x-cost", cost.to_string())
        .header("x-actual", actual.to_string())
        .body(())
        .unwrap()
}

/// Status, `RateLimit` and `Retry-After` of a response.
fn seen(resp: &Response<Full<Bytes>>) -> (u16, String, String) {
    let field = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    (
        resp.status().as_u16(),
        field("ratelimit"),
        field("retry-after"),
    )
}

/// Both stores' services of one settling layer on a sliding log of 10 000 per hour, their
/// layers (for their limiters), the slow request in flight on each (3 reserved at 1 ms, 1 to
/// be used) and the manual clock; after 9 000 other requests in lockstep, 1 ms apart in tens
/// from 2 ms, of which one in ten costs 2, and one in seventy of those uses 1.
struct Filled {
    memory: Svc,
    redis: Svc,
    layers: (RateLimitLayer<Header>, RateLimitLayer<Header, RedisStore>),
    slow: Vec<tokio::task::JoinHandle<Result<Response<Full<Bytes>>, Infallible>>>,
    gate: Arc<Semaphore>,
    hand: tollgate::ManualClock,
    /// Units the requests so far use, the slow one's 3 included.
    used: u64,
    server: RedisServer,
}

async fn filled() -> Filled {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, hand) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new(
        "long",
        Quota::sliding_log(10_000, Duration::from_secs(3_600)),
    ))
    .key(Header::new("x-key"))
    .cost(|h| {
        h.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
    .settle(ActualCost::of)
    .clock(clock);
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let on_redis = layer.clone().store(store);
    let memory = Svc::new(layer.layer(handler(gate.clone(), calls.clone())));
    let redis = Svc::new(on_redis.layer(handler(gate.clone(), calls.clone())));
    // The slow request reserves 3 on each store at 1 ms, and will use 1. (At 0 µs: the test
    // below.)
    hand.advance(Duration::from_millis(1));
    let slow: Vec<_> = [&memory, &redis]
        .into_iter()
        .map(|svc| tokio::spawn(svc.clone().oneshot(req("/slow", 3, 1))))
        .collect();
    while calls.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    let mut used = 3u64;
    for i in 0..9_000u32 {
        if i % 10 == 0 {
            hand.advance(Duration::from_millis(1));
        }
        let cost = if i % 10 == 0 { 2 } else { 1 };
        let actual = if i % 70 == 0 { 1 } else { cost };
        let m = memory
            .clone()
            .oneshot(req("/", cost, actual))
            .await
            .unwrap();
        let r = redis.clone().oneshot(req("/", cost, actual)).await.unwrap();
        assert_eq!(seen(&r), seen(&m), "request {i}");
        assert_eq!(m.status(), 200, "request {i}");
        used += u64::from(actual);
    }
    Filled {
        memory,
        redis,
        layers: (layer, on_redis),
        slow,
        gate,
        hand,
        used,
        server,
    }
}

impl Filled {
    /// Lets the slow request answer, on both stores.
    async fn release(&mut self) {
        self.gate.add_permits(2);
        for handle in self.slow.drain(..) {
            let resp = handle.await.unwrap().unwrap();
            assert_eq!(resp.status(), 200);
        }
    }

    /// A request of `cost` on both stores, which answer alike; the memory store's answer.
    async fn both(&self, cost: u32, what: &str) -> (u16, String, String) {
        let m = self
            .memory
            .clone()
            .oneshot(req("/", cost, cost))
            .await
            .unwrap();
        let r = self
            .redis
            .clone()
            .oneshot(req("/", cost, cost))
            .await
            .unwrap();
        assert_eq!(seen(&r), seen(&m), "{what}");
        seen(&m)
    }

    /// Both limiters take `quotas`.
    fn set_quotas(&self, quotas: Vec<Quota>) {
        let memory = self.layers.0.limiter("long").unwrap().unwrap();
        let redis = self.layers.1.limiter("long").unwrap().unwrap();
        memory.set_quotas(quotas.clone()).unwrap();
        redis.set_quotas(quotas).unwrap();
    }
}

#[tokio::test]
async fn a_request_settled_after_nine_thousand_others_gives_back_from_the_oldest_entry_as_memory_does(
) {
    let mut f = filled().await;
    // The slow request uses 1 of its 3: 2 come back from the oldest entry.
    f.release().await;
    f.hand.advance(Duration::from_millis(1));
    let used = f.used - 2;
    assert_eq!(used, 9_772);
    // In Redis, the oldest entry (the slow request's, at 1 ms) keeps 1 unit, and every later
    // entry's running total follows: the newest one's is what the log holds.
    let limiter = f.layers.1.limiter("long").unwrap().unwrap();
    let key = limiter.redis_key(&b"k"[..].into());
    let mut conn = crate::common::redis_server::connection(&f.server).await;
    let ends: Vec<String> = redis::pipe()
        .cmd("ZRANGE")
        .arg(&key)
        .arg(1)
        .arg(1)
        .cmd("ZRANGE")
        .arg(&key)
        .arg(-1)
        .arg(-1)
        .query_async::<Vec<Vec<String>>>(&mut conn)
        .await
        .unwrap()
        .concat();
    assert_eq!(ends[0], "1000:0000000000000001:1");
    assert!(ends[1].ends_with(&format!(":{used:016}:1")), "{ends:?}");
    let left = u32::try_from(10_000 - used).unwrap();
    let (status, ..) = f.both(left, "the request of what remains").await;
    assert_eq!(status, 200);
    let (status, ..) = f.both(1, "the request past the limit").await;
    assert_eq!(status, 429);
}

/// The window narrowed to half a second while the slow request is in flight: its entry (and
/// every one up to 401 ms) leaves the window, and its settlement gives back nothing, since
/// what it took no longer counts; widened back to the hour, what left stays gone. On both
/// stores alike, to every response.
#[tokio::test]
async fn a_settlement_after_its_entry_left_a_narrowed_window_gives_back_nothing_as_memory_does() {
    let mut f = filled().await;
    let log = |secs_ms: u64| Quota::sliding_log(10_000, Duration::from_millis(secs_ms));
    // At 901 ms: the last 500 ms hold the requests after 401 ms.
    f.set_quotas(vec![log(500)]);
    f.release().await;
    f.set_quotas(vec![log(3_600_000)]);
    // Requests of 1 000 until refused: both stores refuse the same one, with the same fields.
    let mut admitted = 0;
    loop {
        let (status, ..) = f.both(1_000, &format!("after {admitted} admitted")).await;
        if status != 200 {
            assert_eq!(status, 429);
            break;
        }
        admitted += 1;
        assert!(admitted <= 10, "never refused");
    }
    // What left the window (the 4 000 requests up to 401 ms and the slow one) stays gone.
    assert!(admitted >= 4, "{admitted}");
    let (status, ..) = f.both(1, "one unit more").await;
    assert!(status == 200 || status == 429);
}

/// A reservation made in the first microsecond of a test clock (the manual clock starts at
/// 1 ns) has its sliding log's spot at 0 µs, which must not read as a reservation the script
/// did not fill in (whose refund gives back the newest entries, as a lease's expired units
/// are): once its own entry has left the window, its settlement gives back nothing, on Redis
/// as on memory. The system clock sends no time (the script reads the server's), so only test
/// clocks meet it.
#[tokio::test]
async fn a_reservation_at_the_clock_start_gives_back_its_own_entry_on_redis_as_on_memory() {
    let log = Quota::sliding_log(10, Duration::from_secs(1));
    // The 5 at 600 ms still count at 1.1 s: 5 remain.
    let left = settled_at_start(vec![log], 1, &[(600, 5), (500, 0)]).await;
    assert_eq!(left, [5]);
}

/// The same at the clock's start for a sliding-window counter (its spot is its window's
/// start, 0 µs) and for a counter beside a log, settled for less or for nothing: after two
/// widths, what the request took no longer counts, and the 2 requests of the new window are
/// all that does, on Redis as on memory.
#[tokio::test]
async fn a_counters_reservation_at_the_clock_start_gives_back_only_what_still_counts() {
    let second = Duration::from_secs(1);
    let counter = Quota::sliding_window(10, second);
    let both = vec![counter.clone(), Quota::sliding_log(10, second)];
    for actual in [1, 0] {
        let left = settled_at_start(vec![counter.clone()], actual, &[(600, 5), (1_500, 2)]).await;
        assert_eq!(left, [8], "settled for {actual}");
        let left = settled_at_start(both.clone(), actual, &[(600, 5), (1_500, 2)]).await;
        assert_eq!(left, [8, 8], "settled for {actual}");
    }
}

/// A settling layer of `quotas` on both stores: a request at the clock's first instant
/// reserves 3, held while the clock moves by each step's ms and each step's requests of 1 are
/// admitted on both; then it settles for `actual`. What remains of each quota, the same on
/// both stores.
async fn settled_at_start(quotas: Vec<Quota>, actual: u32, steps: &[(u64, usize)]) -> Vec<u64> {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5));
    let (clock, hand) = Clock::manual();
    let policy = quotas[1..]
        .iter()
        .fold(Policy::new("start", quotas[0].clone()), |p, q| {
            p.quota(q.clone())
        });
    let layer = RateLimitLayer::new(policy)
        .key(Header::new("x-key"))
        .cost(|h| {
            h.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .settle(ActualCost::of)
        .clock(clock);
    let gate = Arc::new(Semaphore::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let on_redis = layer.clone().store(store);
    let memory = Svc::new(layer.layer(handler(gate.clone(), calls.clone())));
    let redis = Svc::new(on_redis.layer(handler(gate.clone(), calls.clone())));
    // At 0 µs: reserves 3, will use `actual`.
    let slow: Vec<_> = [&memory, &redis]
        .into_iter()
        .map(|svc| tokio::spawn(svc.clone().oneshot(req("/slow", 3, actual))))
        .collect();
    while calls.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    for &(ms, n) in steps {
        hand.advance(Duration::from_millis(ms));
        for _ in 0..n {
            let m = memory.clone().oneshot(req("/", 1, 1)).await.unwrap();
            let r = redis.clone().oneshot(req("/", 1, 1)).await.unwrap();
            assert_eq!(seen(&r), seen(&m));
            assert_eq!(m.status(), 200);
        }
    }
    gate.add_permits(2);
    for handle in slow {
        assert_eq!(handle.await.unwrap().unwrap().status(), 200);
    }
    let key: Box<[u8]> = b"k"[..].into();
    let m = layer.limiter("start").unwrap().unwrap().peek(&key);
    let r = on_redis.limiter("start").unwrap().unwrap().peek(&key).await;
    let left =
        |d: &tollgate::Decision| -> Vec<u64> { d.states().iter().map(|s| s.remaining()).collect() };
    assert_eq!(left(&r), left(&m), "Redis beside memory");
    drop(server);
    left(&m)
}
