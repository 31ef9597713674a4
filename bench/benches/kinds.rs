//! The quota kinds side by side: ns per check, bytes per key, and the sliding counter's error
//! against the exact sliding log.
//!
//! ```text
//! cargo bench -p tollgate-bench --bench kinds
//! # shorter, on a shared machine:
//! cargo bench -p tollgate-bench --bench kinds -- --warm-up-time 1 --measurement-time 2
//! ```
//!
//! Before criterion runs, two tables are printed (deterministic, no timing):
//!
//! * **bytes per key**: how much the resident memory grows per tracked key of a keyed
//!   `RateLimiter<u64>` (200 000 keys: the table, its entries and the allocator's overhead), for
//!   one request in the window and for a cost of 100 (the log keeps one time per unit);
//! * **counter error**: the same random traffic (exponential gaps, one key) through a sliding
//!   log and a sliding counter of 100 per second on a manual clock, at offered loads from 0.5×
//!   to 5× the limit, and bunched (2N requests within one millisecond, once a second):
//!   how many each admitted, and the most the counter let through in any window of one second
//!   (checked at every admission), against the log's exact 100.
//!
//! Then criterion, every kind in the same run:
//!
//! * `kinds_keyed_10k`: 10 000 keys visited round-robin, limit never reached (10 000 per
//!   100 ms for the window kinds; GCRA as in `rate_limit`'s `keyed_10k`, and GCRA with a
//!   warm-up of 60 s, whose keys stay in the warm zone; and, in the instructions mode only,
//!   `warm_up_near`, the same warm-up with a burst of 40, whose figures count the requests
//!   left within the warm zone, as for a key near its limit);
//! * `kinds_rejecting`: one key over its limit (1 per hour), as `rate_limit`'s `rejecting`;
//! * `kinds_mixed`: GCRA plus one quota of each window kind on one key, 10 000 keys, each seen
//!   once before the count;
//!
//! Instructions per check, the figure that repeats on a loaded machine: with
//! `KINDS_INSTRUCTIONS=<group>/<kind>` set (say `kinds_keyed_10k/fixed_window`, or
//! `kinds_mixed/all`), the binary only makes the limiter of that row and checks it
//! 100 000 times inside `measured`, for callgrind to count:
//!
//! ```text
//! KINDS_INSTRUCTIONS=kinds_keyed_10k/fixed_window valgrind --tool=callgrind \
//!     --collect-atstart=no --toggle-collect='*measured*' target/release/deps/kinds-<hash>
//! ```
//! (the `Collected` total over 100 000 is the instructions of one check). The clock stands
//! still there, so that the requests of a key in a sliding log all share one instant and one
//! entry; with `KINDS_TICK_NS=<n>` as well, the clock moves `n` ns after each check (inside
//! `measured_ticking`, whose advance of the clock every row pays alike), so that no two
//! requests of a key share an instant, as on the system clock.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use tollgate::{Clock, Quota, RateLimiter};

/// Resident memory of this process, in bytes (Linux).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

const KEYS: u64 = 10_000;

fn kinds(count: u32, window: Duration) -> [(&'static str, Quota); 5] {
    [
        ("gcra", Quota::new(count, window)),
        ("fixed_window", Quota::fixed_window(count, window)),
        ("sliding_log", Quota::sliding_log(count, window)),
        ("sliding_window", Quota::sliding_window(count, window)),
        (
            "warm_up",
            Quota::new(count, window).warm_up(Duration::from_secs(60), 3),
        ),
    ]
}

/// Keys in the memory table.
const MEMORY_KEYS: u64 = 200_000;

fn bytes_per_key() {
    println!(
        "bytes per tracked key (RateLimiter<u64>, {MEMORY_KEYS} keys, growth of resident memory):"
    );
    println!("| kind | cost 1 in the window | cost 100 in the window |");
    println!("|---|---|---|");
    // Every limiter stays alive until the end, so that each one's memory is new memory.
    let mut keep = Vec::new();
    for (name, q) in kinds(1_000, Duration::from_secs(3600)) {
        let mut cells = Vec::new();
        for cost in [1, 100] {
            let (clock, _time) = Clock::manual();
            let before = rss();
            let limiter = RateLimiter::<u64>::builder(q.clone())
                .clock(clock)
                .max_keys(MEMORY_KEYS as usize)
                .build();
            for k in 0..MEMORY_KEYS {
                assert!(limiter.check_n(&k, cost).is_allowed());
            }
            let after = rss();
            cells.push(format!(
                "{:.0}",
                after.saturating_sub(before) as f64 / MEMORY_KEYS as f64
            ));
            keep.push(limiter);
        }
        println!("| {name} | {} | {} |", cells[0], cells[1]);
    }
    println!();
}

/// xorshift64*: deterministic traffic without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// An exponential gap of mean `mean` ns.
    fn gap(&mut self, mean: f64) -> u64 {
        let u = ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        (-u.ln() * mean) as u64
    }
}

const N: u32 = 100;
const W: u64 = 1_000_000_000;

/// The most in any window `[t, t + W)` starting at an admission.
fn max_in_window(admitted: &[u64]) -> usize {
    let mut best = 0;
    let mut j = 0;
    for i in 0..admitted.len() {
        while j < admitted.len() && admitted[j] < admitted[i] + W {
            j += 1;
        }
        best = best.max(j - i);
    }
    best
}

/// Runs `times` through a log and a counter; returns (admitted by the log, by the counter,
/// the counter's most in any window).
fn compare(times: &[u64]) -> (usize, usize, usize) {
    let window = Duration::from_nanos(W);
    let (clock, hand) = Clock::manual();
    let log = RateLimiter::<()>::builder(Quota::sliding_log(N, window))
        .clock(clock.clone())
        .build();
    let counter = RateLimiter::<()>::builder(Quota::sliding_window(N, window))
        .clock(clock)
        .build();
    let (mut by_log, mut by_counter) = (0, Vec::new());
    for &t in times {
        hand.set(Duration::from_nanos(t));
        by_log += usize::from(log.check(&()).is_allowed());
        if counter.check(&()).is_allowed() {
            by_counter.push(t);
        }
    }
    (by_log, by_counter.len(), max_in_window(&by_counter))
}

fn counter_error() {
    println!("sliding counter against the exact log, {N} per 1 s, one key, 600 s of traffic:");
    println!("| offered load | log admitted | counter admitted | difference | counter's most in any 1 s |");
    println!("|---|---|---|---|---|");
    let run = 600 * W;
    for load in [0.5, 0.9, 1.0, 1.1, 2.0, 5.0] {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mean = W as f64 / (f64::from(N) * load);
        let mut times = Vec::new();
        let mut t = 1;
        while t < run {
            t += rng.gap(mean).max(1);
            times.push(t);
        }
        let (l, c, m) = compare(&times);
        println!(
            "| {load}× | {l} | {c} | {:+.2}% | {m} |",
            (c as f64 - l as f64) / l as f64 * 100.0
        );
    }
    // Bunched: 2N requests within one millisecond, once a second. (The counter's windows open
    // with the key's first request, so a client cannot aim at their boundaries without
    // knowing when that was; the property tests check the `2N - 1` bound in the worst case.)
    let mut times = Vec::new();
    for w in 0..600u64 {
        let end = 1 + (w + 1) * W;
        for i in 0..(2 * u64::from(N)) {
            times.push(end - 1_000_000 + i * 5_000);
        }
    }
    let (l, c, m) = compare(&times);
    println!(
        "| bunched (2N in 1 ms, once a second) | {l} | {c} | {:+.2}% | {m} |",
        (c as f64 - l as f64) / l as f64 * 100.0
    );
    println!();
}

/// The limiter of a row of `kinds_keyed_10k`, every key seen once.
fn keyed_limiter(name: &str, q: Quota, clock: Clock) -> RateLimiter<u64> {
    let q = match name {
        "gcra" => Quota::per_second(1).burst(u32::MAX),
        // Every key cold (seen once): the dearest case, each check pays the surcharge.
        "warm_up" => Quota::per_second(1)
            .burst(u32::MAX)
            .warm_up(Duration::from_secs(60), 3),
        // Room for fewer requests than the warm zone holds: what remains is counted on the
        // curve, not past it (eleven checks a key, all admitted).
        "warm_up_near" => Quota::per_second(1)
            .burst(40)
            .warm_up(Duration::from_secs(60), 3),
        _ => q,
    };
    let limiter = RateLimiter::<u64>::builder(q).clock(clock).build();
    for k in 0..KEYS {
        assert!(limiter.check(&k).is_allowed());
    }
    limiter
}

/// The limiter of a row of `kinds_rejecting`, its one key over its limit.
fn rejecting_limiter(q: Quota, clock: Clock) -> RateLimiter<u64> {
    let limiter = RateLimiter::<u64>::builder(q).clock(clock).build();
    assert!(limiter.check(&0).is_allowed());
    limiter
}

/// The limiter of `kinds_mixed`, every key seen once (as the keyed rows' are).
fn mixed_limiter(clock: Clock) -> RateLimiter<u64> {
    let w = Duration::from_millis(100);
    let limiter = RateLimiter::<u64>::builder(Quota::per_second(1).burst(u32::MAX))
        .quota(Quota::fixed_window(10_000, w))
        .quota(Quota::sliding_log(10_000, w))
        .quota(Quota::sliding_window(10_000, w))
        .clock(clock)
        .build();
    for k in 0..KEYS {
        assert!(limiter.check(&k).is_allowed());
    }
    limiter
}

fn keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("kinds_keyed_10k");
    for (name, q) in kinds(10_000, Duration::from_millis(100)) {
        let limiter = keyed_limiter(name, q, Clock::default());
        let mut i = 0;
        let mut rejected = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                let d = black_box(limiter.check(black_box(&i)));
                rejected += u64::from(!d.is_allowed());
                i = (i + 1) % KEYS;
            })
        });
        assert_eq!(rejected, 0, "{name} rejected checks");
    }
    group.finish();
}

fn rejecting(c: &mut Criterion) {
    let mut group = c.benchmark_group("kinds_rejecting");
    for (name, q) in kinds(1, Duration::from_secs(3600)) {
        let limiter = rejecting_limiter(q, Clock::default());
        let mut admitted = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                let d = black_box(limiter.check(black_box(&0)));
                admitted += u64::from(d.is_allowed());
            })
        });
        assert_eq!(admitted, 0, "{name} admitted checks");
    }
    group.finish();
}

fn mixed(c: &mut Criterion) {
    let mut group = c.benchmark_group("kinds_mixed");
    let limiter = mixed_limiter(Clock::default());
    let mut i = 0;
    let mut rejected = 0u64;
    group.bench_function("gcra+fixed+log+counter", |b| {
        b.iter(|| {
            let d = black_box(limiter.check(black_box(&i)));
            rejected += u64::from(!d.is_allowed());
            i = (i + 1) % KEYS;
        })
    });
    assert_eq!(rejected, 0, "mixed rejected checks");
    group.finish();
}

criterion_group!(benches, keyed, rejecting, mixed);

/// Checks `limiter` `n` times over its keys round-robin (`keys` of them); how many were
/// admitted. Not inlined, for callgrind to count it alone.
#[inline(never)]
fn measured(limiter: &RateLimiter<u64>, keys: u64, n: u64) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        admitted += u64::from(black_box(limiter.check(black_box(&(i % keys)))).is_allowed());
    }
    admitted
}

/// [`measured`] on a clock that moves `tick` after each check.
#[inline(never)]
fn measured_ticking(
    limiter: &RateLimiter<u64>,
    keys: u64,
    n: u64,
    time: &tollgate::ManualClock,
    tick: Duration,
) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        admitted += u64::from(black_box(limiter.check(black_box(&(i % keys)))).is_allowed());
        time.advance(tick);
    }
    admitted
}

/// The `KINDS_INSTRUCTIONS` mode (see the module docs): `row` is `<group>/<kind>`.
fn instructions(row: &str) {
    const N: u64 = 100_000;
    // A clock that stands still: callgrind runs the checks some fifty times slower, and no
    // window may pass in the middle of the count that would not pass in the benchmark.
    let (clock, time) = Clock::manual();
    time.set(Duration::from_secs(1_000));
    let (limiter, keys) = match row.split_once('/') {
        Some(("kinds_keyed_10k", "warm_up_near")) => {
            let q = Quota::per_second(1);
            (keyed_limiter("warm_up_near", q, clock), KEYS)
        }
        Some(("kinds_keyed_10k", kind)) => {
            let (name, q) = kinds(10_000, Duration::from_millis(100))
                .into_iter()
                .find(|(name, _)| *name == kind)
                .expect("a kind of the keyed rows");
            (keyed_limiter(name, q, clock), KEYS)
        }
        Some(("kinds_rejecting", kind)) => {
            let (_, q) = kinds(1, Duration::from_secs(3600))
                .into_iter()
                .find(|(name, _)| *name == kind)
                .expect("a kind of the rejecting rows");
            (rejecting_limiter(q, clock), 1)
        }
        Some(("kinds_mixed", _)) => (mixed_limiter(clock), KEYS),
        _ => panic!("KINDS_INSTRUCTIONS names a row: <group>/<kind>"),
    };
    let tick = std::env::var("KINDS_TICK_NS")
        .ok()
        .filter(|n| !n.is_empty())
        .map(|n| {
            Duration::from_nanos(n.parse().expect("KINDS_TICK_NS is a number of nanoseconds"))
        });
    let admitted = match tick {
        Some(tick) => measured_ticking(&limiter, keys, N, &time, tick),
        None => measured(&limiter, keys, N),
    };
    println!("{row}: {admitted} of {N} admitted");
}

fn main() {
    if let Ok(row) = std::env::var("KINDS_INSTRUCTIONS") {
        instructions(&row);
        return;
    }
    bytes_per_key();
    counter_error();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
