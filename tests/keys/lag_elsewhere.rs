//! The retry time a full layer gives a new key when the place that frees first is in another
//! tier of the layer (`max_keys` is one bound over the tiers), and one of the two tiers sweeps
//! behind the clock after a live widening of its sliding counter (`OnFull::RejectNewKeys`).
//!
//! A sliding counter of 1 per 200 ms widened to 1 per second makes its tier's table sweep
//! 1.6 s (the growth of its reach, two widths) behind the clock for 2 s (the new reach). The
//! other tier holds the layer's one place with a GCRA key idle 5 s from now. The new key is
//! admitted exactly when a place frees, and must be told so, whichever tier lags.
//!
//! Pins docs/design.md section 3 ("One bound per layer", and a full table's retry time
//! after a widening).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::key::{IpKey, PeerIp};
use tollgate::store::OnFull;
use tollgate::{Clock, ManualClock, Policy, Quota, RateLimitLayer, RateLimiter};

const MS: Duration = Duration::from_millis(1);

fn ip(n: u8) -> IpKey {
    IpKey::from(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

/// A layer of two tiers, "counter" (a sliding counter of 1 per 200 ms) and "gcra" (1 per
/// 5 s), one place in all, turning new keys away when full; their limiters and the clock.
fn layer() -> (RateLimiter<IpKey>, RateLimiter<IpKey>, ManualClock) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let layer = RateLimitLayer::new(Policy::new("counter", Quota::sliding_window(1, 200 * MS)))
        .tier(Policy::new("gcra", Quota::new(1, Duration::from_secs(5))))
        .key(PeerIp)
        .clock(clock)
        .max_keys(1)
        .on_full(OnFull::RejectNewKeys);
    let counter = layer.limiter("counter").unwrap().unwrap();
    let gcra = layer.limiter("gcra").unwrap().unwrap();
    (counter, gcra, time)
}

/// Checks that `limiter` refuses the new key `key` as a full store until `wait`, told so,
/// and admits it at `wait`.
fn waits_exactly(limiter: &RateLimiter<IpKey>, time: &ManualClock, key: IpKey, wait: Duration) {
    let d = limiter.check(&key);
    assert!(d.is_store_full(), "{d:?}");
    let told = d.retry_after().unwrap_or_default();
    time.advance(wait - Duration::from_nanos(1));
    assert!(
        limiter.check(&key).is_store_full(),
        "no place 1 ns before {wait:?}"
    );
    time.advance(Duration::from_nanos(1));
    let d = limiter.check(&key);
    assert!(d.is_allowed(), "a place at {wait:?}: {d:?}");
    assert_eq!(
        told, wait,
        "told to retry after {told:?}, admitted after {wait:?}"
    );
}

/// The tier of the new key lags: the place frees in the other tier, 5 s from now by the
/// clock, whatever the lagging tier's table reads the time as.
#[test]
fn a_new_key_of_a_tier_lagging_a_widening_is_told_when_the_other_tiers_place_frees() {
    let (counter, gcra, time) = layer();
    counter
        .set_quotas([Quota::sliding_window(1, Duration::from_secs(1))])
        .unwrap();
    assert!(gcra.check(&ip(1)).is_allowed());
    waits_exactly(&counter, &time, ip(2), Duration::from_secs(5));
}

/// The same with no lag anywhere: told 5 s (the reference of the test above).
#[test]
fn a_new_key_is_told_when_the_other_tiers_place_frees() {
    let (counter, gcra, time) = layer();
    assert!(gcra.check(&ip(1)).is_allowed());
    waits_exactly(&counter, &time, ip(2), Duration::from_secs(5));
}

/// The tier holding the place lags: its key, admitted after the widening, is idle by its own
/// times 2 s from now (two widths of the new counter), and its table drops it then, the lag
/// having ended; the new key of the other tier is admitted then.
#[test]
fn a_new_key_is_told_when_a_lagging_tiers_place_frees() {
    let (counter, gcra, time) = layer();
    counter
        .set_quotas([Quota::sliding_window(1, Duration::from_secs(1))])
        .unwrap();
    assert!(counter.check(&ip(1)).is_allowed());
    waits_exactly(&gcra, &time, ip(2), Duration::from_secs(2));
}

/// What is done to the layer of [`two_windows`].
#[derive(Debug, Clone)]
enum Op {
    /// The clock moves on `ms` milliseconds.
    Wait(u64),
    /// The tier (0 or 1) gets another width (a step of 1 to 5).
    Change(usize, u64),
    /// The key holding the place asks again, on its tier.
    Again,
    /// A new key asks on the tier (0 or 1).
    New(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..1_500).prop_map(Op::Wait),
        2 => (0usize..2, 1u64..=5).prop_map(|(t, w)| Op::Change(t, w)),
        2 => Just(Op::Again),
        3 => (0usize..2).prop_map(Op::New),
    ]
}

/// Tier 0: a sliding counter of 1 per `w` × 200 ms; tier 1: a sliding log of 1 per `w` ×
/// 300 ms.
fn quota(tier: usize, w: u64) -> Quota {
    match tier {
        0 => Quota::sliding_window(1, 200 * MS * w as u32),
        _ => Quota::sliding_log(1, 300 * MS * w as u32),
    }
}

/// A layer of the two tiers of [`quota`] at their first widths, one place in all.
fn two_windows() -> ([RateLimiter<IpKey>; 2], ManualClock) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let layer = RateLimitLayer::new(Policy::new("a", quota(0, 1)))
        .tier(Policy::new("b", quota(1, 1)))
        .key(PeerIp)
        .clock(clock)
        .max_keys(1)
        .on_full(OnFull::RejectNewKeys);
    let a = layer.limiter("a").unwrap().unwrap();
    let b = layer.limiter("b").unwrap().unwrap();
    ([a, b], time)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Through widenings and narrowings of either tier, a new key of either tier turned away
    /// is told to retry exactly when it is admitted: turned away 1 ns before, admitted then.
    #[test]
    fn a_new_key_of_either_tier_is_told_exactly_when_a_place_frees_through_live_changes(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let (tiers, time) = two_windows();
        let mut held: Option<(usize, IpKey)> = None;
        let mut next = 1u8;
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::Change(t, w) => tiers[t].set_quotas([quota(t, w)]).unwrap(),
                Op::Again => {
                    if let Some((t, key)) = held {
                        prop_assert!(!tiers[t].check(&key).is_store_full(), "step {}", step);
                    }
                }
                Op::New(t) => {
                    let key = ip(next);
                    next = next.wrapping_add(1).max(1);
                    let d = tiers[t].check(&key);
                    if d.is_allowed() {
                        held = Some((t, key));
                        continue;
                    }
                    prop_assert!(d.is_store_full(), "step {}: {:?}", step, d);
                    let told = d.retry_after().unwrap_or_default();
                    prop_assert!(told > Duration::ZERO, "step {}", step);
                    time.advance(told - Duration::from_nanos(1));
                    prop_assert!(
                        tiers[t].check(&key).is_store_full(),
                        "step {}: a place 1 ns before the {:?} told",
                        step,
                        told
                    );
                    time.advance(Duration::from_nanos(1));
                    let d = tiers[t].check(&key);
                    prop_assert!(d.is_allowed(), "step {}: no place at the {:?} told: {:?}", step, told, d);
                    held = Some((t, key));
                }
            }
        }
    }
}
