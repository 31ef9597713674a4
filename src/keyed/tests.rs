//! The table against a reference model: a plain map of key to idle time, bounded by the same
//! rules, stepped through the same inserts, time steps and checks.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// A value idle from a fixed time.
#[derive(Debug, Clone, Copy)]
struct Until(u64);

impl Entry for Until {
    fn idle_at(&self) -> u64 {
        self.0
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A key asks for an entry that stays active for `hold` ns.
    Touch { key: u8, hold: u16 },
    /// Time moves on.
    Advance(u16),
    /// Every idle entry is dropped on demand.
    EvictIdle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<u8>(), 1..2_000u16).prop_map(|(key, hold)| Op::Touch { key, hold }),
        2 => (0..3_000u16).prop_map(Op::Advance),
        1 => Just(Op::EvictIdle),
    ]
}

/// Runs `ops` on a table and checks every answer against the model's.
fn check(max_keys: usize, on_full: OnFull, ops: &[Op]) -> Result<(), TestCaseError> {
    let table = Table::<u8, Until>::new(max_keys, on_full);
    // The model: what each key's entry holds if it is tracked, active or not.
    let mut model: BTreeMap<u8, u64> = BTreeMap::new();
    let mut now = 1u64;
    for op in ops {
        match *op {
            Op::Touch { key, hold } => {
                let until = now + u64::from(hold);
                let hash = table.hash(&key);
                let got = table.upsert(
                    hash,
                    &key,
                    false,
                    || now,
                    |v, _| v.0,
                    |_| Absent::Insert(until, Until(until)),
                );
                let active_before = model.values().filter(|&&t| t > now).count();
                if let Some(&t) = model.get(&key) {
                    if t > now {
                        prop_assert_eq!(got, Ok(t), "active key {} must be found", key);
                        continue;
                    }
                }
                match got {
                    Ok(t) if t == until => {
                        model.insert(key, until);
                    }
                    Ok(t) => {
                        // An idle entry still tracked: its old value, which decides like none.
                        prop_assert!(t <= now, "key {} returned an active stale value", key);
                    }
                    Err(full) => {
                        // Refused only when every tracked key is active.
                        prop_assert_eq!(on_full, OnFull::RejectNewKeys);
                        prop_assert_eq!(active_before, max_keys, "refused with room");
                        let first = model.values().filter(|&&t| t > now).min().copied();
                        prop_assert_eq!(Some(full.retry_at), first, "retry hint");
                    }
                }
                // Which active keys did the table forget? Only one, only when the table was
                // full of active keys, and only under eviction.
                let mut lost = 0;
                model.retain(|k, t| {
                    let h = table.hash(k);
                    let kept = table.get(h, k, 0, |_| ()).is_some();
                    if !kept && *t > now {
                        lost += 1;
                    }
                    kept
                });
                if lost > 0 {
                    prop_assert_eq!(lost, 1, "more than one active key forgotten");
                    prop_assert_eq!(on_full, OnFull::EvictNearestIdle);
                    prop_assert_eq!(
                        active_before,
                        max_keys,
                        "an active key went while idle ones could"
                    );
                }
            }
            Op::Advance(by) => now += u64::from(by),
            Op::EvictIdle => {
                let left = table.evict_idle(now);
                model.retain(|_, t| *t > now);
                prop_assert_eq!(left, model.len());
            }
        }
        prop_assert!(
            table.len() <= max_keys,
            "len {} > {}",
            table.len(),
            max_keys
        );
        let mut counted = 0;
        table.for_each(|_, _| counted += 1);
        prop_assert_eq!(counted, table.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn tiny_tables_match_the_model(
        max_keys in 1..6usize,
        reject in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let on_full = if reject { OnFull::RejectNewKeys } else { OnFull::EvictNearestIdle };
        check(max_keys, on_full, &ops)?;
    }

    #[test]
    fn large_tables_match_the_model(
        max_keys in 20..300usize,
        reject in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..600),
    ) {
        let on_full = if reject { OnFull::RejectNewKeys } else { OnFull::EvictNearestIdle };
        check(max_keys, on_full, &ops)?;
    }
}

#[test]
fn eviction_samples_are_spread_over_the_table() {
    // 256 active keys, all equally far from idle: a sample drawn in table order would always
    // evict the same few; a random one evicts from all over.
    let table = Table::<u32, Until>::new(256, OnFull::EvictNearestIdle);
    for k in 0..256u32 {
        let h = table.hash(&k);
        let _ = table.upsert(
            h,
            &k,
            false,
            || 0,
            |_, _| (),
            |_| Absent::Insert((), Until(10)),
        );
    }
    let mut evicted = std::collections::BTreeSet::new();
    for k in 1_000..1_064u32 {
        let h = table.hash(&k);
        let _ = table.upsert(
            h,
            &k,
            false,
            || 0,
            |_, _| (),
            |_| Absent::Insert((), Until(u64::MAX)),
        );
    }
    let mut shards = std::collections::BTreeSet::new();
    for k in 0..256u32 {
        let h = table.hash(&k);
        if table.get(h, &k, 0, |_| ()).is_none() {
            evicted.insert(k);
            shards.insert(table.shard_index(h));
        }
    }
    let new_evicted = (1_000..1_064u32)
        .filter(|k| table.get(table.hash(k), k, 0, |_| ()).is_none())
        .count();
    // With 16 or more shards, 64 random picks land in at least half of them.
    assert!(
        shards.len() >= table.shards.len().min(16) / 2,
        "{shards:?} of {}, {} old and {new_evicted} new evicted",
        table.shards.len(),
        evicted.len()
    );
    // Every insert evicted exactly one key. A sample of 8 drawn from a shard that by then holds
    // mostly new keys can pick a new key (sampled eviction is approximate), so a few of the 64
    // may be new ones; most must be the old keys nearest to idle.
    assert_eq!(evicted.len() + new_evicted, 64);
    assert!(evicted.len() >= 48, "{} old keys evicted", evicted.len());
    assert_eq!(table.len(), 256);
}

#[test]
fn consecutive_integer_keys_are_spread_evenly_over_the_shards() {
    // Keys such as user ids or addresses often come in runs; the shard index must not depend
    // on the few hash bits that such runs leave alike.
    for _ in 0..20 {
        let table = Table::<u64, Until>::new(1 << 16, OnFull::RejectNewKeys);
        let mut per_shard = vec![0usize; table.shards.len()];
        for k in 0..4096u64 {
            per_shard[table.shard_index(table.hash(&k))] += 1;
        }
        let mean = 4096 / per_shard.len();
        let most = per_shard.iter().copied().max().unwrap_or(0);
        assert!(
            most <= 2 * mean,
            "{most} of 4096 in one of {} shards",
            per_shard.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// A limiter and a penalty box sharing one bound, as a layer's do: requests and strikes of
    /// random keys at random times never make them hold more than `max_keys` between them,
    /// and a ban, once made, stands to its end whatever the flood.
    #[test]
    fn a_shared_bound_holds_over_quota_state_and_penalty_records(
        reject in any::<bool>(),
        max_keys in 1usize..6,
        ops in prop::collection::vec((0u8..3, 0u8..12, 0u64..4), 1..200),
    ) {
        use std::time::Duration;
        use crate::penalty::{Penalties, PenaltyBox, Strike};
        use crate::{Clock, Quota, RateLimiter};
        let (clock, time) = Clock::manual();
        let on_full = if reject { OnFull::RejectNewKeys } else { OnFull::EvictNearestIdle };
        let limiter = RateLimiter::<u8>::builder(Quota::per_second(1).burst(2))
            .clock(clock.clone())
            .max_keys(max_keys)
            .on_full(on_full)
            .build();
        let bound = Arc::new(Bound::new(max_keys));
        limiter.share_bound(&bound);
        let boxed = PenaltyBox::new(2, Duration::from_secs(5), Duration::from_secs(3));
        let penalties = Penalties::sharing(&boxed, clock.clone(), &bound);
        let mut bans: BTreeMap<u8, Duration> = BTreeMap::new();
        let mut now = Duration::ZERO;
        for (op, key, dt) in ops {
            now += Duration::from_millis(500 * dt);
            time.set(now);
            match op {
                0 => drop(limiter.check(&key)),
                1 => {
                    if let Strike::Banned { ban, .. } = penalties.strike(&key) {
                        bans.insert(key, now + ban);
                    }
                }
                _ => drop(limiter.check_n(&key, 0)),
            }
            prop_assert!(
                limiter.len() + penalties.len() <= max_keys,
                "{} + {} > {}", limiter.len(), penalties.len(), max_keys
            );
            for (k, &end) in &bans {
                let left = end.checked_sub(now).filter(|d| !d.is_zero());
                prop_assert_eq!(penalties.ban_left(k), left, "key {}", k);
            }
        }
    }
}

/// Inserts `keys` into a table one nanosecond apart from `start` on, each idle 1 ns after its
/// insertion; returns how many of them are still tracked afterwards, and the time then.
fn touch_idle(table: &Table<u64, Until>, keys: std::ops::Range<u64>, start: u64) -> (usize, u64) {
    let mut now = start;
    for k in keys.clone() {
        now += 1;
        let hash = table.hash(&k);
        let _ = table.upsert(
            hash,
            &k,
            false,
            || now,
            |_, _| (),
            |_| Absent::Insert((), Until(now + 1)),
        );
    }
    let tracked = keys
        .filter(|k| table.get(table.hash(k), k, now, |_| ()).is_some())
        .count();
    (tracked, now)
}

#[test]
fn keys_going_idle_between_requests_stay_tracked_within_a_second_of_the_last_sweep() {
    let table = Table::<u64, Until>::new(1 << 20, OnFull::EvictNearestIdle);
    // About twice `MIN_SWEEP` keys in each shard, all idle 1 ns after insertion.
    let n = (2 * MIN_SWEEP * table.shards.len()) as u64;
    let start = 10 * SWEEP_GAP;
    assert_eq!(table.evict_idle(start), 0);
    // Within a second of the last sweep a shard that doubles is not swept: the keys are
    // looked up again, not inserted again.
    assert_eq!(touch_idle(&table, 0..n, start).0, n as usize);
    assert_eq!(table.len(), n as usize);
    // Two seconds later, a shard that had doubled is swept at its first insertion: the first
    // keys go, the new ones stay for the next second.
    let (tracked, end) = touch_idle(&table, n..2 * n, start + 2 * SWEEP_GAP);
    assert_eq!(tracked, n as usize);
    assert!(table.len() < 2 * n as usize, "{} keys tracked", table.len());
    assert_eq!(table.evict_idle(end + 2), 0);
    assert!(table.hints_hold());
}

#[test]
fn a_large_shard_that_doubles_is_swept_at_once() {
    let table = Table::<u64, Until>::new(1 << 22, OnFull::EvictNearestIdle);
    let shards = table.shards.len();
    let start = 10 * SWEEP_GAP;
    assert_eq!(table.evict_idle(start), 0);
    // Well within a second of the last sweep, but every shard passes `GROWTH_SWEEP` entries
    // three times over: each is swept as it doubles, and keeps fewer than twice that.
    let n = (3 * GROWTH_SWEEP * shards) as u64;
    let _ = touch_idle(&table, 0..n, start);
    assert!(
        table.len() <= 2 * GROWTH_SWEEP * shards,
        "{} idle keys tracked in {shards} shards",
        table.len()
    );
    assert!(table.hints_hold());
}

/// A value whose idle time something outside the table may move (as a change of the quotas
/// a key is judged by moves a key's).
struct Moving(AtomicU64);

impl Entry for Moving {
    fn idle_at(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A visit of every entry that keeps them all but brings one's idle time earlier and the
/// others' later leaves each shard's hint the earliest idle time of its entries: a full table
/// that turns new keys away finds the entry idle as soon as it is, in whichever shard, and
/// tells the next key it turns away to come back when the first entry goes idle, not before.
#[test]
fn a_visit_that_moves_idle_times_either_way_leaves_every_shard_hint_exact() {
    const KEYS: u64 = 64;
    let table = Table::<u64, Moving>::new(KEYS as usize, OnFull::RejectNewKeys);
    let insert = |key: u64, now: u64, idle_at: u64| {
        table.upsert(
            table.hash(&key),
            &key,
            false,
            || now,
            |_, _| (),
            |_| Absent::Insert((), Moving(AtomicU64::new(idle_at))),
        )
    };
    // Key 5 goes idle at 999, the others at 1 000; every shard's hint is made exact.
    for k in 0..KEYS {
        assert_eq!(insert(k, 1, if k == 5 { 999 } else { 1_000 }), Ok(()));
    }
    assert_eq!(table.evict_idle(2), KEYS as usize);
    assert_eq!(
        insert(KEYS, 2, 3_000),
        Err(Full {
            retry_at: 999,
            elsewhere: u64::MAX
        })
    );
    // The visit: key 5 now goes idle at 10, the others at 2 000.
    let visit = table.drop_where(|v| {
        let at = v.0.load(Ordering::Relaxed);
        v.0.store(if at == 999 { 10 } else { 2_000 }, Ordering::Relaxed);
        false
    });
    assert_eq!(visit, 0);
    assert!(table.hints_hold());
    assert_eq!(
        insert(KEYS, 9, 3_000),
        Err(Full {
            retry_at: 10,
            elsewhere: u64::MAX
        })
    );
    assert_eq!(insert(KEYS, 10, 3_000), Ok(()));
    assert_eq!(table.len(), KEYS as usize);
    // The others' hints say 2 000 now, where they said 1 000 before the visit.
    assert_eq!(
        insert(KEYS + 1, 11, 3_000),
        Err(Full {
            retry_at: 2_000,
            elsewhere: u64::MAX
        })
    );
    assert!(table.hints_hold());
}
