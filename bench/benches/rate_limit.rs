//! tollgate's `RateLimiter` against governor 0.10, one check at a time.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench rate_limit
//! # shorter, while developing (a shared 2-core machine is noisy anyway):
//! cargo bench -p tollgate-bench --bench rate_limit -- --warm-up-time 1 --measurement-time 3
//! # one group only:
//! cargo bench -p tollgate-bench --bench rate_limit -- keyed_10k
//! ```
//!
//! Every group holds two functions, `tollgate` and `governor`, configured alike and measured in
//! the same run, so the ratio between them is what carries (see BENCHMARKS.md for reference
//! figures). Both use their real default clocks: tollgate's `Clock::system()` and governor's
//! `DefaultClock` (both read the TSC through `quanta`). The full result of each check (tollgate's
//! `Decision`, governor's `Result<(), NotUntil>`) goes through `black_box`, as a caller that
//! looks at it would; each timed loop also counts the checks that went the wrong way, and the
//! count is asserted to be zero once the function has been measured.
//!
//! * `direct`: one key, one thread, limit never reached. tollgate `RateLimiter<()>` with
//!   `check(&())`; governor `RateLimiter::direct` with `check()`.
//! * `keyed_10k`: 10 000 distinct IPv4 keys (`IpAddr`, the same for both), visited round-robin,
//!   all tracked before measuring, limit never reached. tollgate `RateLimiter<IpAddr>`; governor
//!   `RateLimiter::keyed` (its default store, a `DashMap`).
//! * `keyed_500k`: as `keyed_10k` with 500 000 keys, far more than the caches hold.
//! * `keyed_10k_idle`: as `keyed_10k`, but with 1e9 per second (burst 1e9), so that every key is
//!   idle again 1 ns after its check, as for clients that send more slowly than their quota.
//!   tollgate drops idle keys whenever a shard grows and decides an absent key as an idle one,
//!   so here it goes through its insert path (shard write lock, insert, amortized sweeps);
//!   governor keeps every key and still takes its lookup path.
//! * `contended_2_threads`: one key hammered by 2 threads at once, limit never reached. Each
//!   sample spawns 2 threads that meet at a barrier and then make `iters` checks each; the figure
//!   is **wall time / total checks**: (last thread's end − first thread's start) / (2 × iters).
//!   Thread spawn and join are outside the timed span.
//! * `rejecting`: one key that is always over its limit (1 per hour, spent before measuring), as
//!   `direct` otherwise. Under a flood the rejection path is the hot path: it must cost no more
//!   than the accept path.
//! * `rejecting_keyed`: the same, but through the keyed stores, with the rejected key among
//!   10 000 tracked IPv4 keys (the shape of a per-IP HTTP limiter under a flood from one client).
//! * `rejecting_contended_2_threads`: `rejecting` on 2 threads at once, timed as
//!   `contended_2_threads` (wall time / total checks). A flood is served by every core; a
//!   rejection that writes no shared memory scales with them.
//!
//! "Limit never reached" uses 1 request per second with a burst of `u32::MAX`, for both crates:
//! a rate so low that a key's theoretical arrival time stays in the future for the whole run
//! (one second ahead per check), and a burst so large (136 years' worth) that no check is
//! refused. The keyed groups use 1 per hour with a burst of 1 000 000 (no key is checked that
//! often in a run), so that even under `valgrind` the 500 000 keys inserted before measuring
//! are all still tracked when the last goes in. A key that stays ahead of the clock is a *tracked* key in both crates. With a quota
//! of 1e9/s instead, tollgate would consider each key idle 1 ns after its check, and its store
//! drops idle keys whenever a shard grows, so `keyed_10k` would measure tollgate's insert path
//! rather than its lookup. That is what `keyed_10k_idle` measures, on purpose: on an HTTP server
//! most clients send more slowly than their quota, so their keys go idle between requests.
//!
//! Instructions per check, the figure that repeats on a loaded machine: with
//! `RATE_LIMIT_INSTRUCTIONS=<group>/<side>` set (say `keyed_10k/tollgate` or
//! `rejecting/governor`; every group but the two-thread ones), the binary only makes the
//! limiter of that row as the group does, with the same clocks, and checks it 200 000 times
//! inside `measured_*`, for callgrind to count:
//!
//! ```text
//! RATE_LIMIT_INSTRUCTIONS=keyed_10k/tollgate valgrind --tool=callgrind \
//!     --collect-atstart=no --toggle-collect='*measured_*' target/release/deps/rate_limit-<hash>
//! ```
//! (the `Collected` total over 200 000 is the instructions of one check, the loop's few
//! included, as in the timed loops).
//!
//! Wall time on a shared machine: with `RATE_LIMIT_WALL=<group>` (any group), the binary makes
//! both limiters of the group as it does, then times them in turns: 300 rounds, each a batch of
//! 20 000 checks (on each thread, for the two-thread groups) of each crate with the result
//! moved through `black_box` as the timed loops do, then of each with only the result's address
//! given to `black_box` (every byte of it still written, but not copied: tollgate's `Decision`
//! is 184 bytes, governor's `Result` a few words). Each round starts with the next of the four;
//! the keys go on round-robin from batch to batch. It prints each one's fastest batch, its 10th
//! percentile and its median, in ns per check, and the ratios. Batches a few hundred
//! microseconds long, interleaved, meet the same load on both sides, and the fastest ones are
//! those no other process interrupted: on a loaded machine these ratios repeat where
//! criterion's, a few seconds of one crate and then of the other, do not.
//!
//! ```text
//! RATE_LIMIT_WALL=keyed_500k target/release/deps/rate_limit-<hash>
//! ```

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};

/// Distinct keys in the keyed groups.
const KEYS: usize = 10_000;

/// tollgate: never reached (see the module documentation).
fn tollgate_open() -> tollgate::Quota {
    tollgate::Quota::per_second(1).burst(u32::MAX)
}

/// governor: the same quota.
fn governor_open() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(1).unwrap()).allow_burst(NonZeroU32::MAX)
}

/// tollgate: never reached by the keyed groups, each key an hour ahead per check (see the
/// module documentation).
fn tollgate_keyed_open() -> tollgate::Quota {
    tollgate::Quota::per_hour(1).burst(1_000_000)
}

/// governor: the same quota.
fn governor_keyed_open() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(1).unwrap())
        .allow_burst(NonZeroU32::new(1_000_000).unwrap())
}

/// tollgate: always over the limit once one request has been admitted.
fn tollgate_closed() -> tollgate::Quota {
    tollgate::Quota::per_hour(1)
}

/// governor: the same quota.
fn governor_closed() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(1).unwrap())
}

/// 10 000 distinct IPv4 addresses, 10.0.0.0 onwards.
fn ip_keys() -> Vec<IpAddr> {
    (0..KEYS as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)))
        .collect()
}

fn direct(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct");

    let tg = tollgate::RateLimiter::<()>::new(tollgate_open());
    let mut rejected = 0u64;
    group.bench_function("tollgate", |b| {
        b.iter(|| {
            let d = black_box(tg.check(black_box(&())));
            rejected += u64::from(!d.is_allowed());
        })
    });
    assert_eq!(rejected, 0, "tollgate rejected checks in `direct`");

    let gv = governor::RateLimiter::direct(governor_open());
    let mut rejected = 0u64;
    group.bench_function("governor", |b| {
        b.iter(|| {
            let r = black_box(gv.check());
            rejected += u64::from(r.is_err());
        })
    });
    assert_eq!(rejected, 0, "governor rejected checks in `direct`");

    group.finish();
}

fn keyed_n(c: &mut Criterion, name: &str, n: usize) {
    let mut group = c.benchmark_group(name);
    let keys: Vec<IpAddr> = (0..n as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)))
        .collect();

    let tg = tollgate::RateLimiter::<IpAddr>::new(tollgate_keyed_open());
    for k in &keys {
        assert!(tg.check(k).is_allowed());
    }
    assert_eq!(
        tg.len(),
        n,
        "tollgate must track every key before measuring"
    );
    let mut rejected = 0u64;
    let mut i = 0;
    group.bench_function("tollgate", |b| {
        b.iter(|| {
            let d = black_box(tg.check(black_box(&keys[i])));
            rejected += u64::from(!d.is_allowed());
            i += 1;
            if i == n {
                i = 0;
            }
        })
    });
    assert_eq!(rejected, 0, "tollgate rejected checks in `{name}`");
    assert_eq!(tg.len(), n, "tollgate forgot keys while measuring");

    let gv = governor::RateLimiter::keyed(governor_keyed_open());
    for k in &keys {
        assert!(gv.check_key(k).is_ok());
    }
    assert_eq!(
        gv.len(),
        n,
        "governor must track every key before measuring"
    );
    let mut rejected = 0u64;
    let mut i = 0;
    group.bench_function("governor", |b| {
        b.iter(|| {
            let r = black_box(gv.check_key(black_box(&keys[i])));
            rejected += u64::from(r.is_err());
            i += 1;
            if i == n {
                i = 0;
            }
        })
    });
    assert_eq!(rejected, 0, "governor rejected checks in `{name}`");
    assert_eq!(gv.len(), n);

    group.finish();
}

fn keyed_10k(c: &mut Criterion) {
    keyed_n(c, "keyed_10k", KEYS);
}

/// As `keyed_10k` with 500 000 keys: the tables no longer fit in the caches.
fn keyed_500k(c: &mut Criterion) {
    keyed_n(c, "keyed_500k", 500_000);
}

fn keyed_10k_idle(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed_10k_idle");
    let keys = ip_keys();

    let tg = tollgate::RateLimiter::<IpAddr>::new(tollgate::Quota::per_second(1_000_000_000));
    for k in &keys {
        assert!(tg.check(k).is_allowed());
    }
    let mut rejected = 0u64;
    let mut i = 0;
    group.bench_function("tollgate", |b| {
        b.iter(|| {
            let d = black_box(tg.check(black_box(&keys[i])));
            rejected += u64::from(!d.is_allowed());
            i += 1;
            if i == KEYS {
                i = 0;
            }
        })
    });
    assert_eq!(rejected, 0, "tollgate rejected checks in `keyed_10k_idle`");

    let gv = governor::RateLimiter::keyed(governor::Quota::per_second(
        NonZeroU32::new(1_000_000_000).unwrap(),
    ));
    for k in &keys {
        assert!(gv.check_key(k).is_ok());
    }
    let mut rejected = 0u64;
    let mut i = 0;
    group.bench_function("governor", |b| {
        b.iter(|| {
            let r = black_box(gv.check_key(black_box(&keys[i])));
            rejected += u64::from(r.is_err());
            i += 1;
            if i == KEYS {
                i = 0;
            }
        })
    });
    assert_eq!(rejected, 0, "governor rejected checks in `keyed_10k_idle`");
    assert_eq!(gv.len(), KEYS);

    group.finish();
}

/// Runs `check` `iters` times on each of 2 threads started together; returns the wall time
/// divided by 2, so that criterion's division by `iters` gives wall time / total checks.
/// `check` returns whether the check was admitted; refusals are added to `rejected`.
fn two_threads<F>(iters: u64, check: F, rejected: &mut u64) -> Duration
where
    F: Fn() -> bool + Send + Sync,
{
    const THREADS: u32 = 2;
    let barrier = Barrier::new(THREADS as usize);
    let runs: Vec<(Instant, Instant, u64)> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    let mut refused = 0u64;
                    for _ in 0..iters {
                        refused += u64::from(!check());
                    }
                    (start, Instant::now(), refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = runs.iter().map(|r| r.0).min().unwrap();
    let end = runs.iter().map(|r| r.1).max().unwrap();
    *rejected += runs.iter().map(|r| r.2).sum::<u64>();
    (end - start) / THREADS
}

fn contended_2_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_2_threads");

    let tg = tollgate::RateLimiter::<()>::new(tollgate_open());
    let mut rejected = 0u64;
    group.bench_function("tollgate", |b| {
        b.iter_custom(|iters| {
            two_threads(
                iters,
                || black_box(tg.check(black_box(&()))).is_allowed(),
                &mut rejected,
            )
        })
    });
    assert_eq!(
        rejected, 0,
        "tollgate rejected checks in `contended_2_threads`"
    );

    let gv = governor::RateLimiter::direct(governor_open());
    let mut rejected = 0u64;
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| two_threads(iters, || black_box(gv.check()).is_ok(), &mut rejected))
    });
    assert_eq!(
        rejected, 0,
        "governor rejected checks in `contended_2_threads`"
    );

    group.finish();
}

fn rejecting(c: &mut Criterion) {
    let mut group = c.benchmark_group("rejecting");

    let tg = tollgate::RateLimiter::<()>::new(tollgate_closed());
    assert!(tg.check(&()).is_allowed());
    assert!(!tg.check(&()).is_allowed());
    let mut admitted = 0u64;
    group.bench_function("tollgate", |b| {
        b.iter(|| {
            let d = black_box(tg.check(black_box(&())));
            admitted += u64::from(d.is_allowed());
        })
    });
    assert_eq!(admitted, 0, "tollgate admitted checks in `rejecting`");

    let gv = governor::RateLimiter::direct(governor_closed());
    assert!(gv.check().is_ok());
    assert!(gv.check().is_err());
    let mut admitted = 0u64;
    group.bench_function("governor", |b| {
        b.iter(|| {
            let r = black_box(gv.check());
            admitted += u64::from(r.is_ok());
        })
    });
    assert_eq!(admitted, 0, "governor admitted checks in `rejecting`");

    group.finish();
}

fn rejecting_contended_2_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("rejecting_contended_2_threads");

    let tg = tollgate::RateLimiter::<()>::new(tollgate_closed());
    assert!(tg.check(&()).is_allowed());
    let mut admitted = 0u64;
    group.bench_function("tollgate", |b| {
        b.iter_custom(|iters| {
            // `two_threads` counts refusals; here every check must be one.
            let mut refused = 0u64;
            let t = two_threads(
                iters,
                || black_box(tg.check(black_box(&()))).is_allowed(),
                &mut refused,
            );
            admitted += 2 * iters - refused;
            t
        })
    });
    assert_eq!(
        admitted, 0,
        "tollgate admitted checks in `rejecting_contended_2_threads`"
    );

    let gv = governor::RateLimiter::direct(governor_closed());
    assert!(gv.check().is_ok());
    let mut admitted = 0u64;
    group.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            let mut refused = 0u64;
            let t = two_threads(iters, || black_box(gv.check()).is_ok(), &mut refused);
            admitted += 2 * iters - refused;
            t
        })
    });
    assert_eq!(
        admitted, 0,
        "governor admitted checks in `rejecting_contended_2_threads`"
    );

    group.finish();
}

fn rejecting_keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("rejecting_keyed");
    let keys = ip_keys();
    let flooder = keys[KEYS / 2];

    let tg = tollgate::RateLimiter::<IpAddr>::new(tollgate_closed());
    for k in &keys {
        assert!(tg.check(k).is_allowed());
    }
    assert!(!tg.check(&flooder).is_allowed());
    assert_eq!(tg.len(), KEYS);
    let mut admitted = 0u64;
    group.bench_function("tollgate", |b| {
        b.iter(|| {
            let d = black_box(tg.check(black_box(&flooder)));
            admitted += u64::from(d.is_allowed());
        })
    });
    assert_eq!(admitted, 0, "tollgate admitted checks in `rejecting_keyed`");

    let gv = governor::RateLimiter::keyed(governor_closed());
    for k in &keys {
        assert!(gv.check_key(k).is_ok());
    }
    assert!(gv.check_key(&flooder).is_err());
    let mut admitted = 0u64;
    group.bench_function("governor", |b| {
        b.iter(|| {
            let r = black_box(gv.check_key(black_box(&flooder)));
            admitted += u64::from(r.is_ok());
        })
    });
    assert_eq!(admitted, 0, "governor admitted checks in `rejecting_keyed`");

    group.finish();
}

/// Checks `keys` round-robin `n` times, as the timed loops do; returns the admissions.
#[inline(never)]
fn measured_tollgate<K>(limiter: &tollgate::RateLimiter<K>, keys: &[K], n: u64) -> u64
where
    K: std::hash::Hash + Eq + Clone + Send + Sync,
{
    let mut admitted = 0u64;
    let mut i = 0;
    for _ in 0..n {
        let d = black_box(limiter.check(black_box(&keys[i])));
        admitted += u64::from(d.is_allowed());
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    admitted
}

/// [`measured_tollgate`] for governor's keyed limiter.
#[inline(never)]
fn measured_governor_keyed(
    limiter: &governor::DefaultKeyedRateLimiter<IpAddr>,
    keys: &[IpAddr],
    n: u64,
) -> u64 {
    let mut admitted = 0u64;
    let mut i = 0;
    for _ in 0..n {
        let r = black_box(limiter.check_key(black_box(&keys[i])));
        admitted += u64::from(r.is_ok());
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    admitted
}

/// [`measured_tollgate`] for governor's direct limiter.
#[inline(never)]
fn measured_governor_direct(limiter: &governor::DefaultDirectRateLimiter, n: u64) -> u64 {
    let mut admitted = 0u64;
    for _ in 0..n {
        let r = black_box(limiter.check());
        admitted += u64::from(r.is_ok());
    }
    admitted
}

/// The `RATE_LIMIT_INSTRUCTIONS` mode (see the module docs): `row` is `<group>/<side>`.
fn instructions(row: &str) {
    const N: u64 = 200_000;
    let (group, side) = row
        .split_once('/')
        .expect("RATE_LIMIT_INSTRUCTIONS names a row: <group>/<side>");
    let tollgate = side == "tollgate";
    let many = |n: usize| -> Vec<IpAddr> {
        (0..n as u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)))
            .collect()
    };
    // The limiter of the row, made and filled as its group does.
    let keyed = |keys: &[IpAddr], tg: tollgate::Quota, gv: governor::Quota| {
        if tollgate {
            let l = tollgate::RateLimiter::<IpAddr>::new(tg);
            for k in keys {
                assert!(l.check(k).is_allowed());
            }
            measured_tollgate(&l, keys, N)
        } else {
            let l = governor::RateLimiter::keyed(gv);
            for k in keys {
                assert!(l.check_key(k).is_ok());
            }
            measured_governor_keyed(&l, keys, N)
        }
    };
    let direct = |tg: tollgate::Quota, gv: governor::Quota, spend: bool| {
        if tollgate {
            let l = tollgate::RateLimiter::<()>::new(tg);
            if spend {
                assert!(l.check(&()).is_allowed());
            }
            measured_tollgate(&l, &[()], N)
        } else {
            let l = governor::RateLimiter::direct(gv);
            if spend {
                assert!(l.check().is_ok());
            }
            measured_governor_direct(&l, N)
        }
    };
    let admitted = match group {
        "direct" => direct(tollgate_open(), governor_open(), false),
        "keyed_10k" => keyed(&many(KEYS), tollgate_keyed_open(), governor_keyed_open()),
        "keyed_500k" => keyed(&many(500_000), tollgate_keyed_open(), governor_keyed_open()),
        "keyed_10k_idle" => keyed(
            &many(KEYS),
            tollgate::Quota::per_second(1_000_000_000),
            governor::Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        ),
        "rejecting" => direct(tollgate_closed(), governor_closed(), true),
        "rejecting_keyed" => {
            // The flooder's key alone is checked, among 10 000 tracked ones.
            let keys = many(KEYS);
            let flooder = [keys[KEYS / 2]];
            if tollgate {
                let l = tollgate::RateLimiter::<IpAddr>::new(tollgate_closed());
                for k in &keys {
                    assert!(l.check(k).is_allowed());
                }
                measured_tollgate(&l, &flooder, N)
            } else {
                let l = governor::RateLimiter::keyed(governor_closed());
                for k in &keys {
                    assert!(l.check_key(k).is_ok());
                }
                measured_governor_keyed(&l, &flooder, N)
            }
        }
        _ => panic!("RATE_LIMIT_INSTRUCTIONS: no row {row}"),
    };
    println!("{row}: {admitted} of {N} admitted");
}

/// Checks `keys` round-robin `n` times from `*at`, leaving `*at` where the next batch starts;
/// returns the admissions. `check` is one crate's check of a key.
#[inline(always)]
fn batch<K>(keys: &[K], at: &mut usize, n: u64, check: impl Fn(&K) -> bool) -> u64 {
    let mut admitted = 0u64;
    let mut i = *at;
    for _ in 0..n {
        admitted += u64::from(check(black_box(&keys[i])));
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    *at = i;
    admitted
}

/// The limiters of one group, both crates, made and filled as the group makes them.
enum Pair {
    Direct(
        tollgate::RateLimiter<()>,
        governor::DefaultDirectRateLimiter,
    ),
    Keyed(
        tollgate::RateLimiter<IpAddr>,
        governor::DefaultKeyedRateLimiter<IpAddr>,
        Vec<IpAddr>,
    ),
}

impl Pair {
    fn new(group: &str) -> (Pair, bool, bool) {
        let keyed = |n: usize, tg: tollgate::Quota, gv: governor::Quota| {
            let keys: Vec<IpAddr> = (0..n as u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)))
                .collect();
            let t = tollgate::RateLimiter::<IpAddr>::new(tg);
            let g = governor::RateLimiter::keyed(gv);
            for k in &keys {
                assert!(t.check(k).is_allowed());
                assert!(g.check_key(k).is_ok());
            }
            Pair::Keyed(t, g, keys)
        };
        let direct = |tg: tollgate::Quota, gv: governor::Quota, spend: bool| {
            let t = tollgate::RateLimiter::<()>::new(tg);
            let g = governor::RateLimiter::direct(gv);
            if spend {
                assert!(t.check(&()).is_allowed());
                assert!(g.check().is_ok());
            }
            Pair::Direct(t, g)
        };
        // (the limiters, whether checks are admitted, on two threads)
        match group {
            "direct" => (direct(tollgate_open(), governor_open(), false), true, false),
            "contended_2_threads" => (direct(tollgate_open(), governor_open(), false), true, true),
            "rejecting" => (
                direct(tollgate_closed(), governor_closed(), true),
                false,
                false,
            ),
            "rejecting_contended_2_threads" => (
                direct(tollgate_closed(), governor_closed(), true),
                false,
                true,
            ),
            "keyed_10k" => (
                keyed(KEYS, tollgate_keyed_open(), governor_keyed_open()),
                true,
                false,
            ),
            "keyed_500k" => (
                keyed(500_000, tollgate_keyed_open(), governor_keyed_open()),
                true,
                false,
            ),
            "keyed_10k_idle" => (
                keyed(
                    KEYS,
                    tollgate::Quota::per_second(1_000_000_000),
                    governor::Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
                ),
                true,
                false,
            ),
            "rejecting_keyed" => {
                let Pair::Keyed(t, g, keys) = keyed(KEYS, tollgate_closed(), governor_closed())
                else {
                    unreachable!()
                };
                // The flooder's key alone is checked, among 10 000 tracked ones.
                (Pair::Keyed(t, g, vec![keys[KEYS / 2]]), false, false)
            }
            _ => panic!("RATE_LIMIT_WALL: no group {group}"),
        }
    }

    /// Times a batch of `n` checks (on each of two threads with `two`) of one crate, whose
    /// results are read by value or through a reference (`BY_REF`); returns ns per check and
    /// the admissions.
    fn time<const BY_REF: bool>(
        &self,
        tollgate: bool,
        two: bool,
        at: &mut usize,
        n: u64,
    ) -> (f64, u64) {
        if two {
            let Pair::Direct(t, g) = self else {
                panic!("the two-thread groups check one key")
            };
            let mut refused = 0;
            // Wall time / 2, over `n` checks on each thread.
            let wall = if tollgate {
                two_threads(
                    n,
                    || seen::<BY_REF, _>(t.check(black_box(&()))).is_allowed(),
                    &mut refused,
                )
            } else {
                two_threads(n, || seen::<BY_REF, _>(g.check()).is_ok(), &mut refused)
            };
            return (wall.as_nanos() as f64 / n as f64, 2 * n - refused);
        }
        let one = [()];
        let start = Instant::now();
        let admitted = match self {
            Pair::Direct(t, _) if tollgate => {
                batch(&one, at, n, |k| seen::<BY_REF, _>(t.check(k)).is_allowed())
            }
            Pair::Direct(_, g) => batch(&one, at, n, |_| seen::<BY_REF, _>(g.check()).is_ok()),
            Pair::Keyed(t, _, keys) if tollgate => {
                batch(keys, at, n, |k| seen::<BY_REF, _>(t.check(k)).is_allowed())
            }
            Pair::Keyed(_, g, keys) => {
                batch(keys, at, n, |k| seen::<BY_REF, _>(g.check_key(k)).is_ok())
            }
        };
        (start.elapsed().as_nanos() as f64 / n as f64, admitted)
    }
}

/// A check's result made visible to the optimizer's blind spot: moved through `black_box` as
/// the timed loops do, or (`BY_REF`) only its address, which keeps every byte of it written
/// but copies nothing.
#[inline(always)]
fn seen<const BY_REF: bool, T>(result: T) -> T {
    if BY_REF {
        black_box(&result);
        result
    } else {
        black_box(result)
    }
}

/// The `RATE_LIMIT_WALL` mode (see the module docs).
fn wall(group: &str) {
    const ROUNDS: usize = 300;
    const BATCH: u64 = 20_000;
    let (pair, admit, two) = Pair::new(group);
    // tollgate by value, governor by value, tollgate by reference, governor by reference.
    let mut times: [Vec<f64>; 4] = Default::default();
    let mut at = [0usize; 4];
    for round in 0..ROUNDS {
        for step in 0..4 {
            // Each round starts with the next of the four, so that none always goes first.
            let which = (round + step) % 4;
            let tollgate = which % 2 == 0;
            let (ns, admitted) = if which < 2 {
                pair.time::<false>(tollgate, two, &mut at[which], BATCH)
            } else {
                pair.time::<true>(tollgate, two, &mut at[which], BATCH)
            };
            let all = if two { 2 * BATCH } else { BATCH };
            let expected = if admit { all } else { 0 };
            assert_eq!(admitted, expected, "{group}: a check went the wrong way");
            times[which].push(ns);
        }
    }
    for v in times.iter_mut() {
        v.sort_by(f64::total_cmp);
    }
    let at = |v: &[f64], q: usize| v[v.len() * q / 100];
    for (name, tg, gv) in [
        ("by value", &times[0], &times[1]),
        ("by reference", &times[2], &times[3]),
    ] {
        println!(
            "{group}, result read {name}: ns per check, tollgate / governor = ratio: \
             fastest {:.2} / {:.2} = {:.2}; p10 {:.2} / {:.2} = {:.2}; median {:.2} / {:.2} = {:.2}",
            tg[0],
            gv[0],
            tg[0] / gv[0],
            at(tg, 10),
            at(gv, 10),
            at(tg, 10) / at(gv, 10),
            at(tg, 50),
            at(gv, 50),
            at(tg, 50) / at(gv, 50),
        );
    }
}

fn main() {
    if let Ok(row) = std::env::var("RATE_LIMIT_INSTRUCTIONS") {
        instructions(&row);
        return;
    }
    if let Ok(group) = std::env::var("RATE_LIMIT_WALL") {
        wall(&group);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

criterion_group!(
    benches,
    direct,
    keyed_10k,
    keyed_500k,
    keyed_10k_idle,
    contended_2_threads,
    rejecting,
    rejecting_keyed,
    rejecting_contended_2_threads
);
