//! A live change of a warm-up curve made together with a narrower sliding window: a key is
//! new after the change only if it was idle under the quotas in force before it, as the
//! memory store judges it, whichever quota's width changed with the curve.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::twins::{self, Twins};
use tollgate::Quota;

const SEC: Duration = Duration::from_secs(1);

fn quotas(period: u32, cold: u32, width: u32) -> Vec<Quota> {
    vec![
        Quota::per_second(1).burst(1).warm_up(period * SEC, cold),
        Quota::sliding_window(5, width * SEC),
    ]
}

/// A window of 10 s narrowed to 1 s may still count the requests when the change comes (the
/// key is not idle under the quotas before it), though the new window would not; a window of
/// 1 s widened to 10 s may have let them go (the key is idle, and new), though the new one
/// would hold them were they not gone.
#[test]
fn a_key_is_new_at_a_change_of_curve_and_width_only_if_idle_under_the_old_quotas() {
    let server = RedisServer::start();
    let rt = twins::runtime();
    let store = rt
        .block_on(tollgate::redis::RedisStore::connect(&server.url()))
        .unwrap()
        .timeout(5 * SEC);
    // The change comes at every half second after the requests: past the warm-up quota's
    // idle time under either curve, or under the old one only, always within the window's.
    for (half, (from, to)) in (1..20u64).flat_map(|h| [(h, (10, 1)), (h, (1, 10))]) {
        let name = format!("renew_width{half}_{from}");
        let t = Twins::new(&store, name, &quotas(4, 3, from));
        t.time.advance(100 * SEC);
        for _ in 0..3 {
            let (r, m) = t.decide(&rt, SEC / 4, 0, 1).unwrap();
            assert_eq!(r, m);
        }
        t.time.advance(Duration::from_millis(500 * half));
        t.set_quotas(&quotas(8, 10, to));
        for gap in [0, 100, 400, 1_000, 2_000] {
            let (r, m) = t.decide(&rt, Duration::from_millis(gap), 0, 1).unwrap();
            let after = 500 * half;
            assert_eq!(
                r, m,
                "{from} s to {to} s, {after} ms after the requests, {gap} ms after"
            );
        }
    }
}
