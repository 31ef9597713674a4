//! Two instances leasing one key from Redis, on threads: each instance's HTTP layer (its own
//! store, connection and leases) serves two tasks that send requests of costs 1 to 3, given
//! back by `count_if`, kept, settled lower or settled higher (debts), while both instances'
//! handles change the two GCRA quotas' bursts (the intervals stay), all at one instant of a
//! manual clock. Once every task is done and both instances gave their leases back:
//! * each quota's time in Redis is a whole number of its intervals, and the same number for
//!   both quotas: a batch, an admission, a refund and a debt each take or give the same units
//!   of every quota (all or nothing);
//! * that number is at least the units the answered requests hold: no refund, settlement or
//!   give-back of a lease returns more than was taken;
//! * and at most that plus what the changes left unused, two batches an instance a change;
//! * without debts, the requests never hold more than the largest burst in force.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change", "Redis").

#![cfg(feature = "redis")]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::redis::{Lease, RedisStore};
use tollgate::{Policy, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

use crate::common::account::rig::manual;
use crate::common::race::Rng;
use crate::common::redis_server::RedisServer;

/// The most units a batch holds.
const BATCH: u64 = 4;
/// The intervals of the two quotas, in ns.
const T: [u64; 2] = [100_000_000, 250_000_000];

/// The bursts of variant `v`.
fn bursts(v: u64) -> [u32; 2] {
    [[12, 10], [6, 10], [16, 5], [12, 12]][v as usize % 4]
}

/// The policy of variant `v`, and a third quota that keeps the key alive in Redis for a day of
/// real time while the limiters send the manual clock's time.
fn policy(v: u64) -> Policy {
    let [a, b] = bursts(v);
    Policy::new("leased", Quota::new(1, Duration::from_nanos(T[0])).burst(a))
        .quota(Quota::new(1, Duration::from_nanos(T[1])).burst(b))
        .quota(Quota::per_day(100_000).burst(100_000))
}

/// Answers with `x-status` and settles `x-actual`, if given.
async fn handler(r: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let number = |name: &str| -> Option<u32> { r.headers().get(name)?.to_str().ok()?.parse().ok() };
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::from_u16(number("x-status").unwrap_or(401) as u16).unwrap();
    if let Some(n) = number("x-actual") {
        resp.extensions_mut().insert(ActualCost(n));
    }
    Ok(resp)
}

type Limit = RateLimitLayer<Header, RedisStore>;

async fn instance(server: &RedisServer, clock: &tollgate::Clock) -> Limit {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(10))
        .lease(Lease::new(BATCH as u32, Duration::from_secs(10)));
    RateLimitLayer::new(policy(0))
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .cost(crate::common::stores::x_cost)
        .count_if(|res| res.status != StatusCode::OK)
        .settle(ActualCost::of)
        .store(store)
}

/// One round on a fresh key `k`: returns (units the answered requests hold, whether any
/// settled into debt, changes made).
async fn round(limits: &[Limit; 2], round: u64, debts: bool) -> (u64, bool, u64) {
    let key = format!("k{round}");
    let mut tasks = Vec::new();
    for (i, l) in limits.iter().enumerate() {
        for t in 0..2u64 {
            let svc = l.clone().layer(tower::service_fn(handler));
            let key = key.clone();
            let mut rng = Rng(round * 11 + i as u64 * 3 + t + 1);
            tasks.push(tokio::spawn(async move {
                let (mut held, mut debt) = (0u64, false);
                for _ in 0..10 {
                    let cost = 1 + rng.below(3);
                    let (status, actual) = match rng.below(if debts { 5 } else { 4 }) {
                        0 => (200, None),
                        1 => (401, None),
                        2 => (401, Some(cost - 1)),
                        3 => (401, Some(rng.below(cost))),
                        _ => (401, Some(cost + 1 + rng.below(4))),
                    };
                    let mut req = Request::post("/")
                        .header("x-key", key.as_str())
                        .header("x-cost", cost.to_string())
                        .header("x-status", status.to_string());
                    if let Some(n) = actual {
                        req = req.header("x-actual", n.to_string());
                    }
                    let got = svc.clone().oneshot(req.body(()).unwrap()).await.unwrap();
                    match got.status().as_u16() {
                        429 => {}
                        s => {
                            assert_eq!(s, status);
                            let kept = match (status, actual) {
                                (200, _) => 0,
                                (_, Some(n)) => n,
                                (_, None) => cost,
                            };
                            held += kept;
                            debt |= kept > cost;
                        }
                    }
                    tokio::task::yield_now().await;
                }
                (held, debt)
            }));
        }
    }
    let changer = {
        let handles = [limits[0].handle().unwrap(), limits[1].handle().unwrap()];
        let mut rng = Rng(round * 13 + 7);
        tokio::spawn(async move {
            let n = 1 + rng.below(3);
            for _ in 0..n {
                let p = policy(rng.below(4));
                for h in &handles {
                    h.apply(&p).unwrap();
                }
                tokio::task::yield_now().await;
            }
            // Back to the first variant, on both.
            for h in &handles {
                h.apply(&policy(0)).unwrap();
            }
            n + 1
        })
    };
    let (mut held, mut debt) = (0, false);
    for t in tasks {
        let (h, d) = t.await.unwrap();
        held += h;
        debt |= d;
    }
    (held, debt, changer.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn two_leasing_instances_racing_refunds_debts_and_changes_take_each_unit_once_of_every_quota()
{
    let server = RedisServer::start();
    let (clock, _time) = manual();
    let limits = [
        instance(&server, &clock).await,
        instance(&server, &clock).await,
    ];
    let mut leased = 0;
    for r in 0..80u64 {
        let debts = r % 2 == 1;
        let (held, debt, changes) = round(&limits, r, debts).await;
        let key: Box<[u8]> = format!("k{r}").as_bytes().into();
        for l in &limits {
            let lim = l.limiter("leased").unwrap().unwrap();
            leased += lim.leased();
            lim.return_leases().await;
        }
        let lim = limits[0].limiter("leased").unwrap().unwrap();
        let d = lim.peek(&key).await;
        assert!(!d.is_degraded());
        let ahead: Vec<u64> = (0..2)
            .map(|q| d.states()[q].reset_after().as_nanos() as u64)
            .collect();
        assert!(
            ahead[0] % T[0] == 0 && ahead[1] % T[1] == 0,
            "round {r}: {ahead:?} not whole intervals"
        );
        let units = [ahead[0] / T[0], ahead[1] / T[1]];
        assert_eq!(units[0], units[1], "round {r}: the quotas hold {units:?}");
        assert!(
            units[0] >= held,
            "round {r}: Redis holds {units:?}, the requests {held}"
        );
        let lost = changes * 2 * 2 * BATCH;
        assert!(
            units[0] <= held + lost,
            "round {r}: Redis holds {units:?}, the requests {held}, {changes} changes"
        );
        if !debt {
            assert!(held <= 16, "round {r}: {held} held");
        }
    }
    assert!(leased > 0, "no admission served by a lease");
}
