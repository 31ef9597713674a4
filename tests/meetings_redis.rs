#![cfg(feature = "redis")]
//! Where the account of a key, leases, the penalty box and the Redis key's life meet, on a
//! real redis-server: refunds and settlements of leased admissions, of keys whose state was
//! flushed or expired, and during a key error. Each case on the manual clock, with exact
//! numbers.

mod common;

use std::time::Duration;

use common::account::rig::{Reply, Rig};
use common::redis_server::RedisServer;
use http::StatusCode;
use tollgate::key::Header;
use tollgate::rate_limit::ActualCost;
use tollgate::redis::{Lease, RedisStore};
use tollgate::{Clock, ManualClock, Policy, Quota, RateLimitLayer};
use tower::Layer;

const S: Duration = Duration::from_secs(1);

type Limit = RateLimitLayer<Header, RedisStore>;

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(Duration::from_secs(5))
}

/// One policy `name` of `quotas`, keyed by `x-key`, costing `x-cost`; a `200` does not
/// count, and a response that counts settles the cost it reports.
fn layer(store: &RedisStore, name: &str, quotas: &[Quota], clock: &Clock) -> Limit {
    let policy = quotas[1..]
        .iter()
        .fold(Policy::new(name.to_owned(), quotas[0].clone()), |p, q| {
            p.quota(q.clone())
        });
    RateLimitLayer::new(policy)
        .key(Header::new("x-key"))
        .clock(clock.clone())
        .cost(|h| {
            h.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .count_if(|res| res.status != StatusCode::OK)
        .settle(ActualCost::of)
        .store(store.clone())
}

const OK: Reply = Reply {
    status: 200,
    actual: None,
};
const FAILED: Reply = Reply {
    status: 401,
    actual: None,
};

fn manual() -> (Clock, ManualClock) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    (clock, time)
}

async fn failures<S>(rig: &mut Rig<S>, key: &str, n: usize) -> usize
where
    S: tower::Service<
        http::Request<()>,
        Response = http::Response<http_body_util::Full<bytes::Bytes>>,
        Error = std::convert::Infallible,
    >,
{
    let mut admitted = 0;
    for _ in 0..n {
        if let Some(id) = rig.send(key, 1).await {
            rig.answer(id, FAILED).await;
            admitted += 1;
        }
    }
    admitted
}

// ---- leased admissions, then count_if refunds ----

/// GCRA 3 per 10 s (and a daily quota that keeps the key alive) on a store that leases hot
/// keys: three slow successes at 0 s, a failure at 5 s, failures at 10 s, then the late
/// successes answer, then more failures. The successes' slices have passed by 10 s: their
/// refunds give nothing back, leased or not, and 3 failures are counted in all.
#[tokio::test]
async fn late_refunds_of_leased_admissions_never_double_a_limit() {
    let server = RedisServer::start();
    for (i, lease) in [None, Some(Lease::new(50, Duration::from_secs(60)))]
        .into_iter()
        .enumerate()
    {
        let store = match lease {
            Some(l) => store(&server).await.lease(l),
            None => store(&server).await,
        };
        let (clock, time) = manual();
        let l = layer(
            &store,
            &format!("lease{i}"),
            &[
                Quota::new(3, 10 * S),
                Quota::per_day(100_000).burst(100_000),
            ],
            &clock,
        );
        let mut rig = Rig::new(|h| l.layer(h));
        let mut slow = Vec::new();
        for _ in 0..3 {
            slow.push(rig.send("login", 1).await.unwrap());
        }
        time.advance(5 * S);
        let mut counted = failures(&mut rig, "login", 1).await;
        time.advance(5 * S);
        counted += failures(&mut rig, "login", 3).await;
        for id in slow {
            assert_eq!(rig.answer(id, OK).await, 200);
        }
        counted += failures(&mut rig, "login", 3).await;
        assert_eq!(counted, 3, "lease {lease:?}");
    }
}
