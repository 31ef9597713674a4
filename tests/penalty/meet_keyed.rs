//! The keyed table's growth sweeps (src/keyed/mod.rs: a shard that has doubled since its last
//! sweep waits until that sweep is a second old, unless it is large) meet the bound and the
//! idle rule of docs/design.md section 3 ("Keyed state"): on floods of thousands of keys
//! with clock jumps around the sweep gap, idle drops and live changes, forgetting idle keys
//! changes no decision, `max_keys` holds, and a bounded table decides every key it tracks as
//! an unbounded one does.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::store::OnFull;
use tollgate::{Clock, Decision, ManualClock, Quota, RateLimiter};

const KEYS: u32 = 4_000;
const BOUND: usize = 1_024;

#[derive(Debug, Clone)]
enum Op {
    /// One request of `cost` for a key.
    Check(u32, u32),
    /// One request of cost 1 for each of `n` consecutive keys from the first.
    Flood(u32, u32),
    /// The clock moves on this many milliseconds.
    Wait(u64),
    /// `evict_idle` on the limiters that may forget.
    EvictIdle,
    /// The quotas change to the set of this index.
    Change(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS, 0u32..4).prop_map(|(k, c)| Op::Check(k, c)),
        2 => (0..KEYS, 1u32..700).prop_map(|(k, n)| Op::Flood(k, n)),
        3 => prop_oneof![0u64..50, 900u64..1_100, 0u64..2_500].prop_map(Op::Wait),
        1 => Just(Op::EvictIdle),
        1 => (0usize..4).prop_map(Op::Change),
    ]
}

const MS: u64 = 1;

/// Quota sets of every kind, with windows around the table's sweep gap of a second.
fn quotas(set: usize, kind: u8) -> Vec<Quota> {
    let ms = |n: u64| Duration::from_millis(n * MS);
    let (count, width) = [(2, 300), (3, 1_200), (1, 800), (4, 2_000)][set];
    let q = match kind {
        0 => Quota::new(count, ms(width)).burst(count),
        1 => Quota::fixed_window(count, ms(width)),
        2 => Quota::sliding_log(count, ms(width)),
        _ => Quota::sliding_window(count, ms(width)),
    };
    vec![q, Quota::new(count + 2, ms(width * 2))]
}

fn limiter(qs: Vec<Quota>, clock: &Clock, max_keys: usize) -> RateLimiter<u32> {
    let mut b = RateLimiter::<u32>::builder(qs[0].clone())
        .clock(clock.clone())
        .max_keys(max_keys)
        .on_full(OnFull::RejectNewKeys);
    for q in &qs[1..] {
        b = b.quota(q.clone());
    }
    b.build()
}

/// What a caller sees of a decision.
fn seen(d: &Decision) -> (String, Option<Duration>, Vec<(u64, Duration)>) {
    (
        format!("{:?}", d.outcome()),
        d.retry_after(),
        d.states()
            .iter()
            .map(|s| (s.remaining(), s.reset_after()))
            .collect(),
    )
}

/// Three limiters on one manual clock: `keep` never forgets on request, `forget` drops idle
/// keys whenever asked, `bounded` holds at most [`BOUND`] keys and refuses new ones when full.
fn run(kind: u8, ops: &[Op]) -> Result<(), TestCaseError> {
    let (clock, time): (Clock, ManualClock) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    let keep = limiter(quotas(0, kind), &clock, 1 << 20);
    let forget = limiter(quotas(0, kind), &clock, 1 << 20);
    let bounded = limiter(quotas(0, kind), &clock, BOUND);
    // Keys the bounded limiter turned away as new on a full table: their state differs from
    // then on.
    let mut refused: HashSet<u32> = HashSet::new();
    let mut one = |key: u32, cost: u32, i: usize| -> Result<(), TestCaseError> {
        let a = keep.check_n(&key, cost);
        let b = forget.check_n(&key, cost);
        prop_assert_eq!(seen(&a), seen(&b), "op {}: key {} cost {}", i, key, cost);
        let c = bounded.check_n(&key, cost);
        if c.is_store_full() {
            prop_assert!(
                bounded.len() >= BOUND / 2,
                "op {}: full at {}",
                i,
                bounded.len()
            );
            refused.insert(key);
        } else if !refused.contains(&key) {
            prop_assert_eq!(
                seen(&a),
                seen(&c),
                "op {}: key {} cost {} bounded",
                i,
                key,
                cost
            );
        }
        prop_assert!(bounded.len() <= BOUND, "op {}: {} keys", i, bounded.len());
        Ok(())
    };
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Check(k, cost) => one(k, cost, i)?,
            Op::Flood(first, n) => {
                for k in first..(first + n).min(KEYS) {
                    one(k, 1, i)?;
                }
            }
            Op::Wait(ms) => time.advance(Duration::from_millis(ms * MS)),
            Op::EvictIdle => {
                forget.evict_idle();
                prop_assert!(bounded.evict_idle() <= BOUND);
            }
            Op::Change(set) => {
                for l in [&keep, &forget, &bounded] {
                    l.set_quotas(quotas(set, kind)).unwrap();
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Growth sweeps deferred by the sweep gap change no decision and keep the bound, on every
    /// kind, through floods, clock jumps, idle drops and live changes.
    #[test]
    fn deferred_growth_sweeps_change_no_decision_and_keep_max_keys(
        kind in 0u8..4,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(kind, &ops)?;
    }
}

/// A log key written under a narrow window, then judged by a window narrowed and widened
/// again before it is idle, is kept by a sweep as long as its entries count under the widest.
#[test]
fn two_changes_before_a_key_idles_keep_it_as_long_as_the_sum_of_their_widening() {
    let ops = [
        Op::Flood(1_245, 275),
        Op::Change(2),
        Op::Change(3),
        Op::EvictIdle,
        Op::Wait(914),
        Op::Wait(1_038),
        Op::Flood(1_518, 651),
    ];
    if let Err(e) = run(2, &ops) {
        panic!("{e}");
    }
}

/// Four threads flood distinct and shared keys while a fifth moves the clock across the
/// sweep gap and drops idle keys: the table never holds more than `max_keys`, and one shared
/// key is never admitted beyond its burst plus what the elapsed time refills.
#[test]
fn threads_flooding_across_the_sweep_gap_keep_max_keys_and_the_shared_keys_quota() {
    let (clock, time) = Clock::manual();
    time.advance(Duration::from_secs(1_000));
    // 5 per second, burst 5.
    let l = Arc::new(limiter(vec![Quota::per_second(5)], &clock, 512));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u32)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                let mut shared = 0u64;
                let mut over = 0usize;
                for round in 0..4_000u32 {
                    let _ = l.check(&(1 + t * 100_000 + round));
                    if l.check(&0).is_allowed() {
                        shared += 1;
                    }
                    if l.len() > 512 {
                        over += 1;
                    }
                }
                (shared, over)
            })
        })
        .collect();
    let mover = {
        let (l, stop) = (l.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut moved = Duration::ZERO;
            for i in 0..400u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let step = Duration::from_millis([3, 250, 999, 1_001][i as usize % 4]);
                time.advance(step);
                moved += step;
                if i % 7 == 0 {
                    l.evict_idle();
                }
                std::thread::yield_now();
            }
            moved
        })
    };
    let mut admitted = 0;
    for w in workers {
        let (shared, over) = w.join().unwrap();
        assert_eq!(over, 0, "a worker saw more than max_keys");
        admitted += shared;
    }
    stop.store(true, Ordering::Relaxed);
    let moved = mover.join().unwrap();
    assert!(l.len() <= 512);
    // Burst 5 plus one per 200 ms of the clock's whole movement.
    let most = 5 + moved.as_millis() as u64 / 200;
    assert!(admitted <= most, "{admitted} admitted, at most {most}");
}

/// A layer's quota state and its penalty box share one bound of `max_keys` (the box at most
/// half of it) while floods of new keys and of one-off strikes grow the shards past their
/// growth sweeps and the clock jumps across the sweep gap: the bound holds after every
/// request, and a ban is never evicted or shortened: every ban told stands to its end, and the
/// banned key is refused until then.
mod shared_bound {
    use super::*;
    use crate::common::account::rig::{manual, Rig, FAILED};
    use crate::common::stores;
    use std::collections::HashMap;
    use tollgate::penalty::PenaltyBox;
    use tower::Layer;

    const MAX: usize = 1_024;

    #[derive(Debug, Clone)]
    pub(super) enum Op {
        /// One request for each of `n` new keys from the first (quota state only).
        Flood(u32, u32),
        /// Two requests for each of `n` keys from the first: the second is refused, one
        /// strike each.
        Strikes(u32, u32),
        /// Three requests for one key: two strikes, a ban.
        Hammer(u32),
        Wait(u64),
        EvictIdle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..20_000, 1u32..900).prop_map(|(k, n)| Op::Flood(k, n)),
            3 => (0u32..20_000, 1u32..400).prop_map(|(k, n)| Op::Strikes(k, n)),
            3 => (0u32..20_000).prop_map(Op::Hammer),
            3 => prop_oneof![0u64..100, 900u64..1_100, 0u64..6_000].prop_map(Op::Wait),
            1 => Just(Op::EvictIdle),
        ]
    }

    async fn run(ops: Vec<Op>) -> Result<(), String> {
        let (clock, time) = manual();
        // 1 per second, burst 1: a second request within a second is refused.
        let layer = stores::layer(&[Quota::per_second(1)], "p", &clock)
            .max_keys(MAX)
            .penalty_box(PenaltyBox::new(
                2,
                Duration::from_secs(10),
                Duration::from_secs(5),
            ));
        let lim = layer.limiter("p").unwrap().unwrap();
        let penalties = layer.penalties().unwrap().unwrap();
        let mut rig = Rig::new(|h| layer.clone().layer(h));
        // The end of every ban told, in nanoseconds of the clock.
        let mut bans: HashMap<String, u128> = HashMap::new();
        let mut sent = 0u32;
        for (i, op) in ops.into_iter().enumerate() {
            let mut keys: Vec<(String, u32)> = Vec::new();
            match op {
                Op::Flood(first, n) => {
                    keys.extend((first..first + n).map(|k| (format!("f{k}"), 1)))
                }
                Op::Strikes(first, n) => {
                    keys.extend((first..first + n).map(|k| (format!("s{k}"), 2)))
                }
                Op::Hammer(k) => keys.push((format!("h{k}"), 3)),
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::EvictIdle => {
                    lim.evict_idle();
                }
            }
            for (key, times) in keys {
                for _ in 0..times {
                    sent += 1;
                    let now = time.now().as_nanos();
                    let banned = bans.get(&key).is_some_and(|&end| end > now);
                    let admitted = rig.send(&key, 1).await;
                    if let Some(id) = admitted {
                        if banned {
                            return Err(format!("op {i}: banned {key} admitted"));
                        }
                        rig.answer(id, FAILED).await;
                    }
                    let tracked = lim.len() + penalties.len();
                    if penalties.len() > MAX / 2 || tracked > MAX {
                        return Err(format!(
                            "op {i}: {} quota keys and {} records, max_keys {MAX}",
                            lim.len(),
                            penalties.len()
                        ));
                    }
                }
                if let Some(left) = penalties.ban_left(&stores::key(&key)) {
                    let end = time.now().as_nanos() + left.as_nanos();
                    bans.entry(key).or_insert(end);
                }
            }
            let now = time.now().as_nanos();
            bans.retain(|_, end| *end > now);
            for (key, end) in &bans {
                let left = penalties.ban_left(&stores::key(key)).map(|d| d.as_nanos());
                if left != Some(end - now) {
                    return Err(format!(
                        "op {i}: the ban of {key} ends in {:?} ns, told {} ns ({sent} sent)",
                        left,
                        end - now
                    ));
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn floods_of_keys_and_strikes_keep_the_shared_bound_and_every_ban(
            ops in proptest::collection::vec(op(), 1..30),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(run(ops));
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }
}

/// Refunds bring a key's idle time earlier (the shard's idle hint follows them) while a
/// table refusing new keys is full: a new key is refused only when every tracked key still
/// counts. Checked against a layer without a bound, which gives back at once what the bounded
/// one refused, so that both track the same keys that count.
mod refunds_on_a_full_table {
    use super::*;
    use crate::common::account::rig::{manual, settles, Rig, FAILED, OK};
    use crate::common::stores;
    use tollgate::Policy;
    use tower::Layer;

    const MAX: usize = 256;

    #[derive(Debug, Clone)]
    pub(super) enum Op {
        /// Requests for `n` keys from the first, each answered at once: a success (given
        /// back), a failure (counted), or a failure settling at most the cost.
        Send(u32, u32, u8),
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..700, 1u32..200, 0u8..3).prop_map(|(k, n, a)| Op::Send(k, n, a)),
            2 => prop_oneof![0u64..200, 900u64..1_100, 0u64..3_000].prop_map(Op::Wait),
        ]
    }

    fn policy(kind: u8) -> Policy {
        let w = Duration::from_millis(1_500);
        let q = match kind {
            0 => Quota::new(2, w),
            1 => Quota::fixed_window(2, w),
            2 => Quota::sliding_log(2, w),
            _ => Quota::sliding_window(2, w),
        };
        Policy::new("p", q)
    }

    async fn run(kind: u8, ops: Vec<Op>) -> Result<(), String> {
        let (clock, time) = manual();
        let layer = |bounded: bool| {
            let l = stores::layer(policy(kind).quotas(), "p", &clock);
            if bounded {
                l.max_keys(MAX).on_full(OnFull::RejectNewKeys)
            } else {
                l
            }
        };
        let (bounded, free) = (layer(true), layer(false));
        let free_lim = free.limiter("p").unwrap().unwrap();
        let bounded_lim = bounded.limiter("p").unwrap().unwrap();
        let mut b = Rig::new(|h| bounded.clone().layer(h));
        let mut f = Rig::new(|h| free.clone().layer(h));
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Wait(ms) => time.advance(Duration::from_millis(ms)),
                Op::Send(first, n, answer) => {
                    for k in first..first + n {
                        let key = format!("k{k}");
                        let reply = [OK, FAILED, settles(k % 2)][usize::from(answer)];
                        let (x, y) = (b.send(&key, 1).await, f.send(&key, 1).await);
                        match (x, y) {
                            (Some(x), Some(y)) => {
                                b.answer(x, reply).await;
                                f.answer(y, reply).await;
                            }
                            (None, None) => {}
                            (None, Some(y)) => {
                                f.answer(y, OK).await;
                                // Refused as new: every place is taken by a key that counts.
                                let counting = free_lim.evict_idle();
                                if counting < MAX {
                                    return Err(format!(
                                        "op {i}: {key} refused on a table of {} with {counting} keys that count",
                                        bounded_lim.len()
                                    ));
                                }
                            }
                            (Some(_), None) => {
                                return Err(format!(
                                    "op {i}: {key} admitted by the bounded layer only"
                                ))
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn a_new_key_is_refused_only_when_every_tracked_key_counts(
            kind in 0u8..4,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let r = rt.block_on(run(kind, ops));
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }
}

/// Threads flood a layer's shared bound with new keys' quota state and one-off strikes, and
/// ban keys of their own, while another moves the clock across the sweep gap: the bound and
/// the penalty box's half of it hold (inserts racing on different shards never take a table
/// past its cap), and no ban is evicted or shortened.
#[test]
fn threads_flooding_a_shared_bound_never_evict_a_ban() {
    use crate::common::account::rig::manual;
    use crate::common::stores;
    use tollgate::penalty::{PenaltyBox, Strike};

    const MAX: usize = 256;
    let (clock, time) = manual();
    let layer = stores::layer(&[Quota::per_second(1)], "p", &clock)
        .max_keys(MAX)
        .penalty_box(PenaltyBox::new(
            2,
            Duration::from_secs(10),
            Duration::from_secs(600),
        ));
    let lim = layer.limiter("p").unwrap().unwrap();
    let penalties = layer.penalties().unwrap().unwrap();
    let start = time.now();
    let ban = |key: &str| {
        let k = stores::key(key);
        assert!(matches!(penalties.strike(&k), Strike::Counted(1)));
        matches!(penalties.strike(&k), Strike::Banned { .. })
    };
    let banned: Vec<String> = (0..16).map(|i| format!("ban{i}")).collect();
    for key in &banned {
        assert!(ban(key), "{key}");
    }
    let workers: Vec<_> = (0..3u32)
        .map(|t| {
            let (lim, penalties) = (lim.clone(), penalties.clone());
            std::thread::spawn(move || {
                let mut own = Vec::new();
                for i in 0..3_000u32 {
                    let _ = lim.check(&stores::key(&format!("q{t}-{i}")));
                    let _ = penalties.strike(&stores::key(&format!("s{t}-{i}")));
                    if i % 300 == 0 {
                        let key = stores::key(&format!("b{t}-{i}"));
                        let _ = penalties.strike(&key);
                        if let Strike::Banned { .. } = penalties.strike(&key) {
                            own.push(key);
                        }
                    }
                }
                own
            })
        })
        .collect();
    let mover = std::thread::spawn(move || {
        for i in 0..300u32 {
            time.advance(Duration::from_millis([3, 250, 999, 1_001][i as usize % 4]));
            std::thread::yield_now();
        }
        time
    });
    let mut all: Vec<_> = banned.iter().map(|k| stores::key(k)).collect();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    let time = mover.join().unwrap();
    // Counted when no insert is on its way (a count read during one may include its place).
    let (q, p) = (lim.len(), penalties.len());
    assert!(p <= MAX / 2 && q + p <= MAX, "{q} + {p} keys");
    let elapsed = time.now() - start;
    assert!(elapsed < Duration::from_secs(600));
    for key in &banned {
        assert_eq!(
            penalties.ban_left(&stores::key(key)),
            Some(Duration::from_secs(600) - elapsed),
            "{key}"
        );
    }
    for key in &all {
        assert!(penalties.ban_left(key).is_some(), "{key:?} lost its ban");
    }
}
