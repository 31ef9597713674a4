//! One bound per layer under threads: the two tiers and penalty box of
//! `bound_property.rs`'s layer (a GCRA tier; a sliding log beside a fixed window), with
//! `max_keys` of 6, served by two tasks sending requests of 24 clients that settle more or
//! less than they reserved, while a third strikes clients from outside the quotas and a fourth
//! changes both tiers' quotas, on three threads, the clock standing within a round and moving
//! between rounds. After each round, with every task done:
//! * every tier's entries and the penalty box's together are at most `max_keys`, and the
//!   penalty records at most half of it;
//! * a ban is never evicted: every ban seen during the round (its time left read by the
//!   tasks, at the round's instant) still has exactly that time left.
//!
//! Pins docs/design.md section 3 ("Keyed state", "One bound per layer", "The penalty box").

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::race::Rng;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tollgate::key::{IpKey, PeerIp};
use tollgate::penalty::PenaltyBox;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

const MAX_KEYS: usize = 6;
const CLIENTS: u64 = 24;
const MS: Duration = Duration::from_millis(1);

fn free(v: bool) -> Vec<Quota> {
    vec![Quota::per_second(2).burst(if v { 3 } else { 1 })]
}

fn pro(v: bool) -> Vec<Quota> {
    let w = if v { 4_000 * MS } else { 1_500 * MS };
    vec![Quota::sliding_log(3, w), Quota::fixed_window(5, 3_000 * MS)]
}

fn policy(name: &str, q: Vec<Quota>) -> Policy {
    q[1..]
        .iter()
        .fold(Policy::new(name.to_owned(), q[0].clone()), |p, q| {
            p.quota(q.clone())
        })
}

fn ip(n: u64) -> IpAddr {
    IpAddr::from([10, 0, 0, n as u8])
}

fn request(n: u64, pro: bool, actual: u64) -> Request<()> {
    let mut req = Request::builder()
        .uri(if pro { "/pro" } else { "/" })
        .header("x-actual", actual.to_string())
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(SocketAddr::from((ip(n), 40_000)));
    req
}

fn handler() -> tower::util::BoxCloneSyncService<Request<()>, Response<Bytes>, Infallible> {
    tower::util::BoxCloneSyncService::new(tower::service_fn(|r: Request<()>| async move {
        let actual: u32 = r
            .headers()
            .get("x-actual")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1);
        let mut resp = Response::new(Bytes::from_static(b"ok"));
        resp.extensions_mut().insert(ActualCost(actual));
        Ok::<_, Infallible>(resp)
    }))
}

async fn race(on_full: OnFull) {
    let (clock, time) = Clock::manual();
    let layer = RateLimitLayer::new(policy("free", free(false)))
        .tier(policy("pro", pro(false)))
        .select_tier(|h| (h.uri.path() == "/pro").then_some("pro"))
        .key(PeerIp)
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .on_full(on_full)
        .settle(ActualCost::of)
        .penalty_box(PenaltyBox::new(2, Duration::from_secs(10), 2_500 * MS));
    let handle = layer.handle().unwrap();
    let penalties = layer.penalties().unwrap().unwrap();
    let tiers = [
        layer.limiter("free").unwrap().unwrap(),
        layer.limiter("pro").unwrap().unwrap(),
    ];
    let svc = layer.layer(handler());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut banned = 0;
    for round in 0..300u64 {
        // The bans the tasks saw this round: client, time left.
        let seen: Arc<Mutex<HashMap<u64, Duration>>> = Arc::default();
        let mut tasks = Vec::new();
        for t in 0..2u64 {
            let (svc, penalties, seen) = (svc.clone(), penalties.clone(), seen.clone());
            let mut rng = Rng(round * 7 + t + 1);
            tasks.push(tokio::spawn(async move {
                for _ in 0..12 {
                    let n = rng.below(CLIENTS);
                    let req = request(n, rng.below(2) == 1, rng.below(4));
                    let st = svc.clone().oneshot(req).await.unwrap().status();
                    assert!(
                        st == StatusCode::OK || st == StatusCode::TOO_MANY_REQUESTS,
                        "{st}"
                    );
                    if let Some(left) = penalties.ban_left(&IpKey::from(ip(n))) {
                        seen.lock().unwrap().insert(n, left);
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
        {
            let (penalties, seen) = (penalties.clone(), seen.clone());
            let mut rng = Rng(round * 7 + 5);
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let n = rng.below(CLIENTS);
                    let _ = penalties.strike(&IpKey::from(ip(n)));
                    if let Some(left) = penalties.ban_left(&IpKey::from(ip(n))) {
                        seen.lock().unwrap().insert(n, left);
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
        {
            let handle = handle.clone();
            let mut rng = Rng(round * 7 + 6);
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    handle.set_quotas("free", free(rng.below(2) == 1)).unwrap();
                    handle.set_quotas("pro", pro(rng.below(2) == 1)).unwrap();
                    tokio::task::yield_now().await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let held = tiers.iter().map(|l| l.len()).sum::<usize>() + penalties.len();
        assert!(held <= MAX_KEYS, "round {round}: {held} entries");
        assert!(penalties.len() <= MAX_KEYS / 2, "round {round}");
        banned += seen.lock().unwrap().len();
        for (n, left) in seen.lock().unwrap().iter() {
            assert_eq!(
                penalties.ban_left(&IpKey::from(ip(*n))),
                Some(*left),
                "round {round}: client {n}'s ban"
            );
        }
        if rng.below(3) == 0 {
            for l in &tiers {
                l.evict_idle();
            }
        }
        time.advance(Duration::from_millis(rng.below(1_500)));
    }
    assert!(banned > 30, "{banned} bans seen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn one_bound_holds_under_threads_rejecting_new_keys_and_no_ban_is_evicted() {
    race(OnFull::RejectNewKeys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn one_bound_holds_under_threads_evicting_idle_keys_and_no_ban_is_evicted() {
    race(OnFull::EvictNearestIdle).await;
}
