//! Properties of docs/design.md section 1 on random inputs: each store agrees decision for
//! decision with a small reference model (one body, run on memory and on a real
//! redis-server, `tests/common/stores.rs`), exact eviction changes nothing, no interval
//! admits more than `burst + D/T`, and a clock stepping back (on both stores) grants nothing.

use std::time::Duration;

use crate::common;

use common::model::{Answer, Model};
use common::stores::{Memory, Store};
use proptest::prelude::*;
use tollgate::{Clock, Quota, RateLimiter};

fn quota() -> impl Strategy<Value = Quota> {
    (1u32..20, 1u64..5_000, 1u32..20).prop_map(|(count, period_ms, burst)| {
        Quota::new(count, Duration::from_millis(period_ms)).burst(burst)
    })
}

/// (gap before the request in µs, key, cost, evict idle keys first)
fn requests() -> impl Strategy<Value = Vec<(u64, u8, u32, bool)>> {
    prop::collection::vec(
        (0u64..400_000, 0u8..4, 0u32..8, prop::bool::weighted(0.05)),
        1..200,
    )
}

fn limiter(quotas: &[Quota]) -> (RateLimiter<u8>, tollgate::ManualClock) {
    let (clock, time) = Clock::manual();
    let mut b = RateLimiter::<u8>::builder(quotas[0].clone()).clock(clock);
    for q in &quotas[1..] {
        b = b.quota(q.clone());
    }
    (b.build(), time)
}

/// Requests `reqs` of [`requests`] on a limiter of `quotas` on `s`: every decision is the
/// model's, read at the store's resolution, and none is degraded.
pub(crate) async fn agrees_with_the_reference_model<S: Store>(
    s: &S,
    name: &str,
    quotas: &[Quota],
    reqs: &[(u64, u8, u32, bool)],
) -> Result<(), TestCaseError> {
    let (clock, time) = Clock::manual();
    let limiter = s.build(quotas, name, &clock);
    let mut model = Model::new(quotas);
    for (i, &(gap_us, key, cost, evict)) in reqs.iter().enumerate() {
        time.advance(Duration::from_micros(gap_us));
        if evict {
            s.evict_idle(&limiter);
        }
        let now = time.now().as_nanos() / S::TICK_NS * S::TICK_NS;
        let d = s.check_n(&limiter, &key.to_string(), cost).await;
        prop_assert!(!d.is_degraded(), "the store failed at request {}", i);
        let want = model.decide(key, now, cost);
        let got = Answer {
            outcome: d.outcome(),
            retry_after: d.retry_after().map(|r| r.as_nanos()),
            remaining: d
                .states()
                .iter()
                .map(|s| u128::from(s.remaining()))
                .collect(),
            reset_after: d.reset_after().as_nanos(),
        };
        prop_assert_eq!(got, want, "request {}", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn memory_store_agrees_with_the_reference_model(
        quotas in prop::collection::vec(quota(), 1..=4),
        reqs in requests(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(agrees_with_the_reference_model(&Memory, "p", &quotas, &reqs))?;
    }

    #[test]
    fn no_interval_admits_more_than_burst_plus_its_length_over_t(
        quotas in prop::collection::vec(quota(), 1..=3),
        reqs in requests(),
    ) {
        let (limiter, time) = limiter(&quotas);
        let mut admitted: Vec<(u128, u128)> = Vec::new(); // (time, cost) for key 0
        for &(gap_us, _key, cost, _) in &reqs {
            time.advance(Duration::from_micros(gap_us));
            if limiter.check_n(&0, cost).is_allowed() && cost > 0 {
                admitted.push((time.now().as_nanos(), u128::from(cost)));
            }
        }
        for q in &quotas {
            let t = q.emission_interval().as_nanos();
            let burst = u128::from(q.burst_size());
            for i in 0..admitted.len() {
                let mut sum = 0;
                for j in i..admitted.len() {
                    sum += admitted[j].1;
                    let d = admitted[j].0 - admitted[i].0;
                    // Cost admitted in [t_i, t_j] is at most burst + floor(D / T).
                    prop_assert!(sum <= burst + d / t, "{} > {} + {}/{}", sum, burst, d, t);
                }
            }
        }
    }
}

crate::over_both_stores!(a_clock_stepping_backwards_grants_no_extra_burst);

/// A clock that steps back (a failover to a server whose clock is behind) never grants more
/// than the configured burst, and never panics.
async fn a_clock_stepping_backwards_grants_no_extra_burst(s: &impl Store) {
    let (clock, time) = Clock::manual();
    let l = s.build(&[Quota::per_second(10).burst(5)], "backwards", &clock);
    time.set(Duration::from_secs(100));
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(s.check(&l, "k").await.is_allowed());
    }
    assert_eq!(admitted, 5);
    // The clock jumps 30 s back: nothing more until it has caught up.
    time.set(Duration::from_secs(70));
    for _ in 0..10 {
        let d = s.check(&l, "k").await;
        assert!(!d.is_allowed() && !d.is_degraded());
    }
    // Back where it was plus one interval: exactly one more.
    time.set(Duration::from_millis(100_100));
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(s.check(&l, "k").await.is_allowed());
    }
    assert_eq!(again, [true, false, false]);
}
