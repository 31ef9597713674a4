//! One bound per layer, on random interleavings: clients of two tiers (a GCRA quota and a
//! sliding log beside a fixed window), requests that settle more or less than they reserved,
//! strikes from the quotas and from outside, bans, live changes of both tiers (a window
//! widened and narrowed, a burst raised and lowered), `evict_idle`, and the clock moving on,
//! under both `OnFull` policies. After every step:
//! * every tier's entries and the penalty box's together never pass `max_keys`, and the
//!   penalty records never more than half of it;
//! * a ban is never evicted: every ban seen lasts until its end, to the nanosecond;
//! * under `RejectNewKeys`, a key the table holds keeps its state: what a tracked key's next
//!   peek says does not change because other keys came.
//!
//! Pins docs/design.md section 3 ("Keyed state", "One bound per layer", "The penalty box").

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use tollgate::key::{IpKey, PeerIp};
use tollgate::penalty::PenaltyBox;
use tollgate::rate_limit::settle::ActualCost;
use tollgate::store::OnFull;
use tollgate::{Clock, Policy, Quota, RateLimitLayer};
use tower::{Layer, ServiceExt};

const MAX_KEYS: usize = 6;
const MS: Duration = Duration::from_millis(1);

fn free(v: bool) -> Vec<Quota> {
    vec![Quota::per_second(2).burst(if v { 3 } else { 1 })]
}

fn pro(v: bool) -> Vec<Quota> {
    let w = if v { 4_000 * MS } else { 1_500 * MS };
    vec![Quota::sliding_log(3, w), Quota::fixed_window(5, 3_000 * MS)]
}

#[derive(Debug, Clone)]
enum Op {
    /// A request from client `n`, to the pro tier or not, whose response settles `actual`.
    Send(u8, bool, u32),
    /// A strike against client `n` from outside the quotas.
    Strike(u8),
    Wait(u64),
    /// New settings for the free tier (`.0`) and the pro tier (`.1`).
    Change(bool, bool),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..12, any::<bool>(), 0u32..4).prop_map(|(n, p, a)| Op::Send(n, p, a)),
        1 => (0u8..12).prop_map(Op::Strike),
        3 => (0u64..1_500).prop_map(Op::Wait),
        1 => any::<(bool, bool)>().prop_map(|(a, b)| Op::Change(a, b)),
        1 => Just(Op::Evict),
    ]
}

fn ip(n: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, n])
}

fn request(n: u8, pro: bool, actual: u32) -> Request<()> {
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

async fn run(on_full: OnFull, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (clock, time) = Clock::manual();
    let layer = RateLimitLayer::new(Policy::new("free", free(false)[0].clone()))
        .tier(
            pro(false)[1..]
                .iter()
                .fold(Policy::new("pro", pro(false)[0].clone()), |p, q| {
                    p.quota(q.clone())
                }),
        )
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
    // The bans seen: client, and the time it ends (ns on the manual clock).
    let mut bans: HashMap<u8, u128> = HashMap::new();
    for (i, op) in ops.into_iter().enumerate() {
        // Under `RejectNewKeys`, what each tracked key's peek says before a request of
        // another key; it must say the same after.
        let mut before = Vec::new();
        match op {
            Op::Send(n, to_pro, actual) => {
                if on_full == OnFull::RejectNewKeys {
                    for (t, l) in tiers.iter().enumerate() {
                        for m in (0..12u8).filter(|&m| m != n) {
                            let d = l.peek(&IpKey::from(ip(m)));
                            before.push((t, m, d.states().to_vec()));
                        }
                    }
                }
                let resp = svc
                    .clone()
                    .oneshot(request(n, to_pro, actual))
                    .await
                    .unwrap();
                prop_assert!(
                    resp.status() == StatusCode::OK
                        || resp.status() == StatusCode::TOO_MANY_REQUESTS,
                    "step {}: {}",
                    i,
                    resp.status()
                );
            }
            Op::Strike(n) => {
                let _ = penalties.strike(&IpKey::from(ip(n)));
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Change(a, b) => {
                handle.set_quotas("free", free(a)).unwrap();
                handle.set_quotas("pro", pro(b)).unwrap();
            }
            Op::Evict => {
                for l in &tiers {
                    l.evict_idle();
                }
            }
        }
        let now = time.now().as_nanos();
        let held = tiers.iter().map(|l| l.len()).sum::<usize>() + penalties.len();
        prop_assert!(held <= MAX_KEYS, "step {}: {} entries", i, held);
        prop_assert!(penalties.len() <= MAX_KEYS / 2, "step {}", i);
        for n in 0..12u8 {
            let left = penalties.ban_left(&IpKey::from(ip(n)));
            if let Some(&end) = bans.get(&n) {
                if end > now {
                    let want = Duration::from_nanos((end - now) as u64);
                    prop_assert_eq!(left, Some(want), "step {}: client {}'s ban", i, n);
                    continue;
                }
            }
            if let Some(left) = left {
                bans.insert(n, now + left.as_nanos());
            }
        }
        for (t, m, states) in before {
            let d = tiers[t].peek(&IpKey::from(ip(m)));
            prop_assert_eq!(
                d.states(),
                &states[..],
                "step {}: tier {}, client {}",
                i,
                t,
                m
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn one_bound_holds_every_tier_and_the_penalty_box_and_never_evicts_a_ban(
        reject in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let on_full = if reject { OnFull::RejectNewKeys } else { OnFull::EvictNearestIdle };
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(run(on_full, ops))?;
    }
}
