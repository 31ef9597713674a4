//! A sliding log keeps a settled debt whole (src/rate_limit/settle.rs, "A larger settled cost
//! is a debt charged now, and it stands"), where the debt meets the rest: give-backs of other
//! requests at the same instant, a count narrowed then raised live, a policy of several
//! quotas, a dry run, the penalty box, and idle keys dropped. On both stores, on the manual
//! clock, with exact numbers.
//!
//! Pins docs/design.md section 3 ("An account per key", "A live quota change").

use std::time::Duration;

use crate::common::account::rig::{failures, manual, settles, Rig, OK};
use crate::common::stores::{self, Store};
use tollgate::penalty::PenaltyBox;
use tollgate::Quota;
use tower::Layer;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn log(n: u32) -> Quota {
    Quota::sliding_log(n, 60 * S)
}

crate::over_both_stores!(
    a_debt_and_give_backs_at_one_instant_leave_the_whole_debt,
    a_debt_stands_when_a_count_is_narrowed_then_raised,
    a_debt_stands_in_every_log_of_a_policy_and_beside_other_kinds,
    a_debt_stands_in_a_dry_run,
    a_debt_is_no_strike_but_what_it_refuses_after_a_raise_is,
    a_debt_keeps_its_key_when_idle_keys_are_dropped,
    the_largest_debts_stand_whole_under_the_largest_count,
);

/// Three requests at one instant (1, 3 and 2 of a count of 10): the first settles 20, the
/// second 1, the third succeeds (gives back all); in either order of answers the key holds
/// 1 + 19 + 1, so a count raised to 30 leaves 9.
async fn a_debt_and_give_backs_at_one_instant_leave_the_whole_debt(s: &impl Store) {
    for debt_first in [true, false] {
        let name = format!("instant{debt_first}");
        let (clock, time) = manual();
        let l = s.layer(&[log(10)], &name, &clock);
        let lim = s.limiter(&l, &name);
        let mut rig = Rig::new(|h| l.layer(h));
        let a = rig.send("k", 1).await.unwrap();
        let b = rig.send("k", 3).await.unwrap();
        let c = rig.send("k", 2).await.unwrap();
        let mut answers = vec![(a, settles(20)), (b, settles(1)), (c, OK)];
        if !debt_first {
            answers.reverse();
        }
        for (id, reply) in answers {
            rig.answer(id, reply).await;
        }
        s.keep(&lim, "k").await;
        time.advance(S);
        s.set_quotas(&lim, vec![log(30)]);
        assert_eq!(s.left(&l, &name, "k").await, vec![9], "{debt_first}");
        assert_eq!(failures(&mut rig, "k", 12).await, 9, "{debt_first}");
    }
}

/// A debt of 10 under a count of 4; the count goes to 2, then to 12: the debt is judged by
/// each in turn and forgiven by neither.
async fn a_debt_stands_when_a_count_is_narrowed_then_raised(s: &impl Store) {
    let (clock, time) = manual();
    let l = s.layer(&[log(4)], "narrowed", &clock);
    let lim = s.limiter(&l, "narrowed");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![log(2)]);
    assert_eq!(failures(&mut rig, "k", 3).await, 0);
    time.advance(S);
    s.set_quotas(&lim, vec![log(12)]);
    assert_eq!(failures(&mut rig, "k", 12).await, 2);
}

/// A debt of 10 counts whole in each log of a policy (the log is shared, the widest window
/// keeps it) and in a fixed window beside it; after a raise, a request passes only where
/// every quota has room (all or nothing), and the debt stays in the wider log once it has
/// left the narrower.
async fn a_debt_stands_in_every_log_of_a_policy_and_beside_other_kinds(s: &impl Store) {
    // A log and a fixed window.
    let (clock, time) = manual();
    let fixed = Quota::fixed_window(100, 60 * S);
    let l = s.layer(&[log(4), fixed.clone()], "mixed", &clock);
    let lim = s.limiter(&l, "mixed");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![log(12), fixed]);
    assert_eq!(failures(&mut rig, "k", 12).await, 2);
    assert_eq!(s.left(&l, "mixed", "k").await, vec![0, 88]);

    // Two logs, of 60 s and 120 s.
    let (clock, time) = manual();
    let wide = |n| Quota::sliding_log(n, 120 * S);
    let l = s.layer(&[log(4), wide(6)], "logs", &clock);
    let lim = s.limiter(&l, "logs");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![log(12), wide(20)]);
    assert_eq!(failures(&mut rig, "k", 12).await, 2);
    assert_eq!(s.left(&l, "logs", "k").await, vec![0, 8]);
    // At 60.5 s the debt has left the 60 s window, not the 120 s one.
    time.advance(59 * S + 500 * MS);
    assert_eq!(s.left(&l, "logs", "k").await, vec![10, 8]);
    assert_eq!(failures(&mut rig, "k", 12).await, 8);
}

/// A dry run admits every request but keeps the state as when enforced: the debt stands
/// whole after a raise, and would-be rejections take nothing.
async fn a_debt_stands_in_a_dry_run(s: &impl Store) {
    let (clock, time) = manual();
    let l = s.on(stores::layer(&[log(4)], "dry", &clock).dry_run(true));
    let lim = s.limiter(&l, "dry");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![log(12)]);
    assert_eq!(s.left(&l, "dry", "k").await, vec![2]);
    assert_eq!(failures(&mut rig, "k", 12).await, 12);
    assert_eq!(s.left(&l, "dry", "k").await, vec![0]);
}

/// A penalty box that bans at the first refusal: the debt itself is no refusal, so no ban;
/// after a raise to 12 the key passes twice, and the third request, refused by the debt that
/// stands, bans it.
async fn a_debt_is_no_strike_but_what_it_refuses_after_a_raise_is(s: &impl Store) {
    let (clock, time) = manual();
    let boxed = PenaltyBox::new(1, 60 * S, 10 * S);
    let l = s.on(stores::layer(&[log(4)], "strikes", &clock).penalty_box(boxed));
    let lim = s.limiter(&l, "strikes");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    assert_eq!(s.ban_left(&l, "strikes", "k").await, None);
    time.advance(S);
    s.set_quotas(&lim, vec![log(12)]);
    assert_eq!(s.ban_left(&l, "strikes", "k").await, None);
    assert_eq!(failures(&mut rig, "k", 12).await, 2);
    assert!(s.ban_left(&l, "strikes", "k").await.is_some());
}

/// Idle keys dropped 59 s after a debt (by the table in memory; Redis keeps the key as long
/// as its newest entry, the debt, counts): the key still holds the debt, and a raise leaves 2.
async fn a_debt_keeps_its_key_when_idle_keys_are_dropped(s: &impl Store) {
    let (clock, time) = manual();
    let l = s.layer(&[log(4)], "idle", &clock);
    let lim = s.limiter(&l, "idle");
    let mut rig = Rig::new(|h| l.layer(h));
    let id = rig.send("k", 1).await.unwrap();
    rig.answer(id, settles(10)).await;
    s.keep(&lim, "k").await;
    time.advance(59 * S);
    s.evict_idle(&lim);
    s.set_quotas(&lim, vec![log(12)]);
    assert_eq!(failures(&mut rig, "k", 12).await, 2);
}

/// Two requests at one instant each settle u32::MAX, the largest a request may cost: the log
/// holds all 2 (2^32 - 1) units, so a count raised to the largest a log may have leaves
/// nothing until both have left the window.
async fn the_largest_debts_stand_whole_under_the_largest_count(s: &impl Store) {
    let (clock, time) = manual();
    let l = s.layer(&[log(4)], "largest", &clock);
    let lim = s.limiter(&l, "largest");
    let mut rig = Rig::new(|h| l.layer(h));
    let a = rig.send("k", 1).await.unwrap();
    let b = rig.send("k", 1).await.unwrap();
    rig.answer(a, settles(u32::MAX)).await;
    rig.answer(b, settles(u32::MAX)).await;
    s.keep(&lim, "k").await;
    time.advance(S);
    s.set_quotas(&lim, vec![log(Quota::MAX_LOG_COUNT)]);
    assert_eq!(s.left(&l, "largest", "k").await, vec![0]);
    assert_eq!(failures(&mut rig, "k", 2).await, 0);
    time.advance(59 * S);
    let all = u64::from(Quota::MAX_LOG_COUNT);
    assert_eq!(s.left(&l, "largest", "k").await, vec![all]);
    assert_eq!(failures(&mut rig, "k", 2).await, 2);
}
