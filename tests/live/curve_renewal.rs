//! A change of a warm-up curve renews every key idle under the old curve, in a sweep of the
//! table under each shard's lock, where the bounded table also drops idle keys, turns new keys
//! away when full and evicts idle keys on request. A bounded table that refuses new keys, the
//! single key of `()` and an unbounded table that is never swept decide alike on random
//! sequences of requests, waits, changes of curve and sweeps; a table full of active keys
//! refuses exactly when an unbounded one holds `max_keys` active keys; a key whose idle time
//! an admission after a change moved earlier (a narrowed window, a faster curve) gives way to
//! a new key in a full table once idle; threads racing changes of curve, inserts and sweeps
//! leave the table's count of keys exact.
//!
//! Pins docs/design.md section 3 ("A live quota change": an idle key is a new key under the
//! new quotas, so evicting idle keys changes no decision; "Keyed state" and "One bound per
//! layer": `len() ≤ max_keys`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use tollgate::store::OnFull;
use tollgate::{Clock, Quota, RateLimiter};

const MS: Duration = Duration::from_millis(1);

/// Policies of one warm-up quota (curves of every setting, rates and bursts), and the same
/// beside a fixed window that binds now and then (the general state), to change among.
fn policies(mixed: bool) -> Vec<Vec<Quota>> {
    let warm = [
        Quota::per_second(4).warm_up(Duration::from_millis(900), 3),
        Quota::per_second(4).warm_up(Duration::from_millis(3_000), 3),
        Quota::per_second(10)
            .burst(3)
            .warm_up(Duration::from_millis(900), 5),
        Quota::per_second(2)
            .burst(5)
            .warm_up(Duration::from_millis(2_000), 2),
    ];
    warm.into_iter()
        .enumerate()
        .map(|(i, w)| {
            if mixed {
                let n = [6, 4, 9, 5][i];
                vec![w, Quota::fixed_window(n, Duration::from_millis(700))]
            } else {
                vec![w]
            }
        })
        .collect()
}

fn build<K>(quotas: &[Quota], clock: &Clock, bound: Option<usize>) -> RateLimiter<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync,
{
    let mut b = RateLimiter::<K>::builder(quotas[0].clone()).clock(clock.clone());
    for q in &quotas[1..] {
        b = b.quota(q.clone());
    }
    if let Some(n) = bound {
        b = b.max_keys(n).on_full(OnFull::RejectNewKeys);
    }
    b.build()
}

#[derive(Debug, Clone)]
enum Op {
    Check(u8, u32),
    Wait(u64),
    Change(usize),
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..6, 0u32..4).prop_map(|(k, c)| Op::Check(k, c)),
        3 => prop_oneof![0u64..200, 200u64..4_000].prop_map(Op::Wait),
        2 => (0usize..4).prop_map(Op::Change),
        1 => Just(Op::Evict),
    ]
}

/// Key 0's requests to the single key of `()`, and every key's to a table bounded to
/// `max_keys` that turns new keys away and to a table never swept, side by side: they decide
/// alike, whatever changes of curve and sweeps come between; a new key is turned away only
/// when the unbounded table holds `max_keys` keys still active (sweeping it changes no
/// decision), and the bounded one never holds more.
fn replay(mixed: bool, start: u64, ops: &[Op], max_keys: usize) -> Result<(), TestCaseError> {
    replay_policies(&policies(mixed), start, ops, max_keys)
}

/// Policies of sliding windows to change among, each narrower and wider than others: a
/// sliding counter alone (`kind` 0), a sliding log alone (1), or both with a GCRA quota (2).
fn windows(kind: usize) -> Vec<Vec<Quota>> {
    let ms = Duration::from_millis;
    [(1_000, 1_500), (300, 500), (2_000, 800), (600, 3_000)]
        .into_iter()
        .enumerate()
        .map(|(i, (counter, log))| {
            let counter = Quota::sliding_window([3, 3, 5, 2][i], ms(counter));
            let log = Quota::sliding_log([4, 4, 2, 6][i], ms(log));
            match kind {
                0 => vec![counter],
                1 => vec![log],
                _ => vec![Quota::per_second(4).burst(6), counter, log],
            }
        })
        .collect()
}

/// [`replay`] over `policies`.
fn replay_policies(
    policies: &[Vec<Quota>],
    start: u64,
    ops: &[Op],
    max_keys: usize,
) -> Result<(), TestCaseError> {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_millis(start));
    let bounded = build::<u8>(&policies[0], &clock, Some(max_keys));
    let direct = build::<()>(&policies[0], &clock, None);
    let open = build::<u8>(&policies[0], &clock, None);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Check(key, cost) => {
                let b = bounded.check_n(&key, cost);
                if b.is_store_full() {
                    prop_assert!(!b.is_allowed(), "op {}", i);
                    prop_assert_eq!(open.evict_idle(), max_keys, "op {}", i);
                    prop_assert_eq!(bounded.len(), max_keys, "op {}", i);
                    continue;
                }
                let o = open.check_n(&key, cost);
                prop_assert_eq!(b, o, "op {}", i);
                if key == 0 {
                    prop_assert_eq!(direct.check_n(&(), cost), o, "op {}", i);
                }
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
            Op::Change(p) => {
                for l in [&bounded, &open] {
                    l.set_quotas(policies[p].clone()).unwrap();
                }
                direct.set_quotas(policies[p].clone()).unwrap();
            }
            Op::Evict => {
                let _ = bounded.evict_idle();
                let _ = direct.evict_idle();
            }
        }
        prop_assert!(bounded.len() <= max_keys, "op {}", i);
    }
    Ok(())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 192,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// With room for every key (six), at the clock's first instant or far from it: the
    /// renewals of a change of curve, the sweeps and the evictions change no decision.
    #[test]
    fn a_swept_table_and_the_single_key_decide_as_a_table_never_swept_through_changes_of_curve(
        mixed in any::<bool>(),
        start in prop_oneof![Just(0u64), 1u64..5_000, Just(u64::MAX / 2_000_000)],
        ops in prop::collection::vec(op(), 1..90),
    ) {
        replay(mixed, start, &ops, 6)?;
    }

    /// With room for three of the six keys.
    #[test]
    fn a_full_table_turns_a_new_key_away_only_when_it_holds_as_many_active_keys_as_it_may(
        mixed in any::<bool>(),
        start in prop_oneof![Just(0u64), 1u64..5_000, Just(u64::MAX / 2_000_000)],
        ops in prop::collection::vec(op(), 1..90),
    ) {
        replay(mixed, start, &ops, 3)?;
    }

    /// The same through changes that narrow and widen sliding windows and logs, which move
    /// the time a kept key goes idle earlier or later than it stored.
    #[test]
    fn a_full_table_turns_a_new_key_away_only_when_full_of_active_keys_through_narrowings(
        kind in 0usize..3,
        start in prop_oneof![Just(0u64), 1u64..5_000, Just(u64::MAX / 2_000_000)],
        ops in prop::collection::vec(op(), 1..90),
    ) {
        replay_policies(&windows(kind), start, &ops, 3)?;
    }
}

/// Threads admitting on ever new keys of a table bounded to 32 while another thread moves
/// the clock and changes the warm-up curve, and a third evicts idle keys: the table never
/// holds more than 32 keys, and once every key is idle it holds none and admits 32 new keys
/// exactly; the 33rd is turned away as the table is full, or takes the place of one under
/// `OnFull::EvictNearestIdle`: the sweeps of a change of curve, the evictions and the inserts
/// kept one count.
#[test]
fn changes_of_curve_racing_inserts_and_evictions_keep_the_table_count_exact() {
    race_changes_of_curve(OnFull::RejectNewKeys);
}

#[test]
fn changes_of_curve_racing_inserts_that_evict_keep_the_table_count_exact() {
    race_changes_of_curve(OnFull::EvictNearestIdle);
}

fn race_changes_of_curve(on_full: OnFull) {
    const BOUND: usize = 32;
    let curves = [
        Quota::per_second(5).warm_up(Duration::from_millis(500), 3),
        Quota::per_second(5).warm_up(Duration::from_millis(800), 4),
    ];
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1));
    let limiter = RateLimiter::<u64>::builder(curves[0].clone())
        .clock(clock.clone())
        .max_keys(BOUND)
        .on_full(on_full)
        .build();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (limiter, done) = (&limiter, &done);
            s.spawn(move || {
                let mut key = t << 40;
                while !done.load(Ordering::Relaxed) {
                    let _ = limiter.check(&key);
                    key += 1;
                    assert!(limiter.len() <= BOUND);
                }
            });
        }
        {
            let (limiter, done) = (&limiter, &done);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let _ = limiter.evict_idle();
                    assert!(limiter.len() <= BOUND);
                }
            });
        }
        for i in 0..3_000 {
            time.advance(7 * MS);
            limiter
                .set_quotas([curves[i % curves.len()].clone()])
                .unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    time.advance(Duration::from_secs(3_600));
    assert_eq!(limiter.evict_idle(), 0);
    assert!(limiter.is_empty());
    for key in 0..BOUND as u64 {
        let d = limiter.check(&(u64::MAX - key));
        assert!(d.is_allowed(), "new key {key}: {d:?}");
    }
    assert_eq!(limiter.len(), BOUND);
    let d = limiter.check(&7);
    match on_full {
        OnFull::RejectNewKeys => assert!(!d.is_allowed() && d.is_store_full(), "{d:?}"),
        _ => assert!(d.is_allowed(), "{d:?}"),
    }
    assert_eq!(limiter.len(), BOUND);
}

/// A table of one key that turns new keys away, and an unbounded twin that sees the same
/// requests: `first` admitted at 10 s, the quota changed to `second`, then one more
/// admission of the key in place 100 ms later, which moves the time the key goes idle earlier
/// than the first quota said. The clock is then moved on, a millisecond at a time, to the
/// first instant the twin drops the key as idle (its sweep visits every entry). Returns the
/// bounded limiter and the clock.
fn idle_sooner_after_a_change(
    first: Quota,
    second: Quota,
) -> (RateLimiter<u8>, tollgate::ManualClock) {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let bounded = build::<u8>(std::slice::from_ref(&first), &clock, Some(1));
    let twin = build::<u8>(std::slice::from_ref(&first), &clock, None);
    for l in [&bounded, &twin] {
        assert!(l.check(&1).is_allowed());
        l.set_quotas([second.clone()]).unwrap();
    }
    time.advance(100 * MS);
    for l in [&bounded, &twin] {
        assert!(l.check(&1).is_allowed());
    }
    let mut waited = 0;
    while twin.evict_idle() > 0 {
        time.advance(MS);
        waited += 1;
        assert!(waited < 60_000);
    }
    (bounded, time)
}

/// A sliding-window counter narrowed from 10 s to 1 s: the key's second admission, at
/// 10.1 s, leaves it idle at 12 s where the first said 30 s. From then on a new key takes
/// the idle key's place in a full table at once, as `OnFull::RejectNewKeys` turns new keys
/// away only while the table is full of active keys.
#[test]
fn a_key_idle_sooner_after_its_counter_narrowed_gives_way_to_a_new_key_in_a_full_table() {
    let (bounded, _time) = idle_sooner_after_a_change(
        Quota::sliding_window(2, Duration::from_secs(10)),
        Quota::sliding_window(2, Duration::from_secs(1)),
    );
    let d = bounded.check(&2);
    assert!(d.is_allowed(), "{d:?}");
}

/// The same with a sliding log narrowed from 10 s to 1 s: idle at 11.1 s where the first
/// admission said 20 s.
#[test]
fn a_key_idle_sooner_after_its_log_narrowed_gives_way_to_a_new_key_in_a_full_table() {
    let (bounded, _time) = idle_sooner_after_a_change(
        Quota::sliding_log(2, Duration::from_secs(10)),
        Quota::sliding_log(2, Duration::from_secs(1)),
    );
    let d = bounded.check(&2);
    assert!(d.is_allowed(), "{d:?}");
}

/// The same with a warm-up quota whose curve changes from one that regains slowly to one
/// that regains fast: the new key takes the idle key's place once it is idle.
#[test]
fn a_key_idle_sooner_after_its_curve_changed_gives_way_to_a_new_key_in_a_full_table() {
    let (bounded, _time) = idle_sooner_after_a_change(
        Quota::per_second(4).warm_up(Duration::from_secs(30), 3),
        Quota::per_second(20).warm_up(Duration::from_millis(500), 2),
    );
    let d = bounded.check(&2);
    assert!(d.is_allowed(), "{d:?}");
}

/// A fixed window whose period is shortened keeps the end it opened with, so its idle time
/// never moves earlier: the new key takes the idle key's place at once.
#[test]
fn a_fixed_window_shortened_gives_way_to_a_new_key_in_a_full_table_once_idle() {
    let (bounded, _time) = idle_sooner_after_a_change(
        Quota::fixed_window(3, Duration::from_secs(10)),
        Quota::fixed_window(3, Duration::from_secs(1)),
    );
    let d = bounded.check(&2);
    assert!(d.is_allowed(), "{d:?}");
}

/// A table of one key that turns new keys away, whose warm-up curve changed at 10 s before
/// any key came, beside a twin built with the new curve from the start; at 11 s one key is
/// admitted on both. Returns the bounded limiter and the clock at the first millisecond the
/// twin drops the key as idle.
fn stored_after_a_change_of_curve() -> (RateLimiter<u8>, tollgate::ManualClock) {
    let old = Quota::per_second(4).warm_up(Duration::from_secs(30), 3);
    let new = Quota::per_second(2).warm_up(Duration::from_secs(2), 3);
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let bounded = build::<u8>(std::slice::from_ref(&old), &clock, Some(1));
    bounded.set_quotas([new.clone()]).unwrap();
    let twin = build::<u8>(std::slice::from_ref(&new), &clock, None);
    time.advance(Duration::from_secs(1));
    for l in [&bounded, &twin] {
        assert!(l.check_n(&1, 2).is_allowed());
    }
    let mut waited = 0;
    while twin.evict_idle() > 0 {
        time.advance(MS);
        waited += 1;
        assert!(waited < 60_000);
    }
    (bounded, time)
}

/// Once the key is idle, a new key takes its place at once.
#[test]
fn a_key_stored_after_a_change_of_curve_gives_way_to_a_new_key_once_idle() {
    let (bounded, _time) = stored_after_a_change_of_curve();
    let d = bounded.check(&2);
    assert!(d.is_allowed(), "{d:?}");
}

/// A new key turned away is told when to retry, and is admitted then.
#[test]
fn a_new_key_turned_away_after_a_change_of_curve_is_admitted_when_told_to_retry() {
    let (bounded, time) = stored_after_a_change_of_curve();
    let d = bounded.check(&2);
    if !d.is_allowed() {
        assert!(d.is_store_full(), "{d:?}");
        let wait = d.retry_after().expect("a full table says when to retry");
        time.advance(wait);
        let again = bounded.check(&2);
        assert!(again.is_allowed(), "told to wait {wait:?}: {again:?}");
    }
}

/// A key that spent its whole burst, held by a table swept every millisecond, and the single
/// key of `()`, which is never forgotten, when the warm-up curve changes to one that cools
/// far more slowly, no request coming after: the table keeps the key until it is idle under
/// the new curve, so that when the table drops it the two read alike. The time the key was
/// stored to go idle (under the old curve) comes before that, and later than the new curve's
/// cooling after the change (its time is ahead by the burst it spent).
#[test]
fn a_key_ahead_at_a_change_to_a_slower_curve_is_kept_until_idle_under_it() {
    let old = Quota::per_second(2)
        .burst(6)
        .warm_up(Duration::from_millis(200), 2);
    let new = Quota::per_second(2)
        .burst(6)
        .warm_up(Duration::from_millis(2_000), 3);
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(10));
    let swept = build::<u8>(std::slice::from_ref(&old), &clock, Some(4));
    let direct = build::<()>(std::slice::from_ref(&old), &clock, None);
    loop {
        let (a, b) = (swept.check(&1), direct.check(&()));
        assert_eq!(a, b);
        if !a.is_allowed() {
            break;
        }
    }
    time.advance(MS);
    swept.set_quotas([new.clone()]).unwrap();
    direct.set_quotas([new]).unwrap();
    let mut waited = 0;
    while swept.evict_idle() > 0 {
        time.advance(MS);
        waited += 1;
        assert!(waited < 60_000);
    }
    // Both spend what they hold alike, request by request.
    for n in 0.. {
        let (a, b) = (swept.check(&1), direct.check(&()));
        assert_eq!(
            a, b,
            "request {n}, the key dropped {waited} ms after the change"
        );
        if !a.is_allowed() {
            break;
        }
    }
}
