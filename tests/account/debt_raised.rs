//! A debt settled after a response, then a live change that raises the limit within the same
//! window: the debt stands (settle.rs, "A larger settled cost is a debt charged now, and it
//! stands"), so the key admits only what the new limit leaves beside everything it was
//! charged, each request counted at the price it was charged (docs/design.md section 3, "A
//! live quota change": no sequence of changes admits more over any span than the most
//! generous quota in force over it). On both stores, for each kind.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change").

use std::time::Duration;

use crate::common::account::rig::{failures, manual, settles, Rig};
use crate::common::stores::Store;
use tollgate::Quota;
use tower::Layer;

const S: Duration = Duration::from_secs(1);

crate::over_both_stores!(a_debt_stands_when_a_window_limit_is_raised);

/// A request of 1 settles 10 under a limit of 4 in a 60 s window; the limit goes to `raised`;
/// how many requests of 1 the key then admits in the same window.
async fn admitted_after_a_debt(
    s: &impl Store,
    name: &str,
    quota: fn(u32) -> Quota,
    raised: u32,
) -> usize {
    let (clock, time) = manual();
    let l = s.layer(&[quota(4)], name, &clock);
    let lim = s.limiter(&l, name);
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![quota(raised)]);
    failures(&mut rig, "k", 12).await
}

async fn a_debt_stands_when_a_window_limit_is_raised(s: &impl Store) {
    let fixed: fn(u32) -> Quota = |n| Quota::fixed_window(n, 60 * S);
    let counter: fn(u32) -> Quota = |n| Quota::sliding_window(n, 60 * S);
    // GCRA: 10 charged at 15 s each put the key 150 s ahead, 149 s a second later; a burst
    // of 12 (180 s) leaves room for 2 more.
    let gcra: fn(u32) -> Quota = |n| Quota::new(4, 60 * S).burst(n);
    for (name, quota, raised, admitted) in [
        ("fixed", fixed, 12, 2),
        ("counter", counter, 12, 2),
        ("gcra", gcra, 12, 2),
    ] {
        assert_eq!(
            admitted_after_a_debt(s, name, quota, raised).await,
            admitted,
            "{name}"
        );
    }
}

/// The log records a debt whole, as one entry, in memory as on Redis: raising the limit to
/// 12 leaves room for 2 beside the 10 charged.
async fn a_log_debt_stands_when_its_limit_is_raised(s: &impl Store) {
    let log: fn(u32) -> Quota = |n| Quota::sliding_log(n, 60 * S);
    assert_eq!(admitted_after_a_debt(s, "log", log, 12).await, 2);
}

#[tokio::test]
async fn a_log_debt_stands_when_its_limit_is_raised_in_memory() {
    a_log_debt_stands_when_its_limit_is_raised(&crate::common::stores::Memory).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_log_debt_stands_when_its_limit_is_raised_on_redis() {
    let s = crate::common::stores::OnRedis::start().await;
    a_log_debt_stands_when_its_limit_is_raised(&s).await;
}
