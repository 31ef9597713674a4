//! Runs N rate-limit checks of one kind, for instruction-level profiling of a single check
//! (the criterion bench `benches/rate_limit.rs` gives times; this gives instruction counts).
//!
//! ```text
//! cargo build --profile bench -p tollgate-bench --example bench_check
//! valgrind --tool=callgrind --toggle-collect='bench_check::run*' \
//!     target/release/examples/bench_check tg-direct 1000000
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! Kinds: `{tg,gv}-{direct,keyed,reject,reject-keyed}`; `tg` is tollgate, `gv` governor 0.10,
//! configured as in the criterion bench (1/s with burst `u32::MAX` when accepting, 1/hour when
//! rejecting; 10 000 IPv4 keys when keyed). Only the `run_*` functions are meant to be
//! collected, so setup (clock calibration, pre-populating keys) stays out of the counts.
//!
//! `{tg,gv}-keyed-idle` are `keyed` with a quota of 1e9 per second (burst 1e9): every key is
//! idle again 1 ns after its check, which tollgate's store treats as absent (it drops such keys
//! whenever a shard grows), so tollgate goes through its insert path instead of its lookup.
//!
//! Two more kinds time one ingredient of tollgate's check on its own, to weigh the instruction
//! counts: `x-rwlock` takes and drops a `std::sync::RwLock` read guard (what the memory store
//! does around every decision), `x-div` does the two dependent 64-bit divisions a single-quota
//! decision makes (`Gcra::burst` and `Gcra::remaining`).
//!
//! Without valgrind, the binary also prints the mean time per check (a rough figure; use the
//! criterion bench for times).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;

const KEYS: usize = 10_000;

fn ip_keys() -> Vec<IpAddr> {
    (0..KEYS as u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)))
        .collect()
}

#[inline(never)]
fn run_tg_direct(l: &tollgate::RateLimiter<()>, n: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..n {
        allowed += u64::from(black_box(l.check(black_box(&()))).is_allowed());
    }
    allowed
}

#[inline(never)]
fn run_gv_direct(l: &governor::DefaultDirectRateLimiter, n: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..n {
        allowed += u64::from(black_box(l.check()).is_ok());
    }
    allowed
}

#[inline(never)]
fn run_tg_keyed(l: &tollgate::RateLimiter<IpAddr>, keys: &[IpAddr], n: u64) -> u64 {
    let mut allowed = 0;
    let mut i = 0;
    for _ in 0..n {
        allowed += u64::from(black_box(l.check(black_box(&keys[i]))).is_allowed());
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

#[inline(never)]
fn run_gv_keyed(l: &governor::DefaultKeyedRateLimiter<IpAddr>, keys: &[IpAddr], n: u64) -> u64 {
    let mut allowed = 0;
    let mut i = 0;
    for _ in 0..n {
        allowed += u64::from(black_box(l.check_key(black_box(&keys[i]))).is_ok());
        i += 1;
        if i == keys.len() {
            i = 0;
        }
    }
    allowed
}

#[inline(never)]
fn run_x_rwlock(lock: &std::sync::RwLock<u64>, n: u64) -> u64 {
    let mut sum = 0u64;
    for _ in 0..n {
        sum = sum.wrapping_add(*black_box(lock).read().unwrap());
    }
    sum
}

#[inline(never)]
fn run_x_div(tolerance: u64, interval: u64, n: u64) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        let (t, iv) = (black_box(tolerance), black_box(interval));
        let burst = t / iv;
        let remaining = t.saturating_sub(i ^ burst) / iv;
        sum = sum.wrapping_add(black_box(burst + remaining));
    }
    sum
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "tg-direct".into());
    let n: u64 = args.next().map_or(1_000_000, |s| s.parse().expect("N"));

    let open_tg = || tollgate::Quota::per_second(1).burst(u32::MAX);
    let open_gv =
        || governor::Quota::per_second(NonZeroU32::new(1).unwrap()).allow_burst(NonZeroU32::MAX);
    let closed_tg = || tollgate::Quota::per_hour(1);
    let closed_gv = || governor::Quota::per_hour(NonZeroU32::new(1).unwrap());
    let keys = ip_keys();

    let started = std::time::Instant::now();
    let (allowed, expected) = match kind.as_str() {
        "tg-direct" => {
            let l = tollgate::RateLimiter::<()>::new(open_tg());
            (run_tg_direct(&l, n), n)
        }
        "gv-direct" => {
            let l = governor::RateLimiter::direct(open_gv());
            (run_gv_direct(&l, n), n)
        }
        "tg-reject" => {
            let l = tollgate::RateLimiter::<()>::new(closed_tg());
            assert!(l.check(&()).is_allowed());
            (run_tg_direct(&l, n), 0)
        }
        "gv-reject" => {
            let l = governor::RateLimiter::direct(closed_gv());
            assert!(l.check().is_ok());
            (run_gv_direct(&l, n), 0)
        }
        "tg-keyed" | "tg-reject-keyed" => {
            let reject = kind == "tg-reject-keyed";
            let l =
                tollgate::RateLimiter::<IpAddr>::new(if reject { closed_tg() } else { open_tg() });
            for k in &keys {
                assert!(l.check(k).is_allowed());
            }
            assert_eq!(l.len(), KEYS);
            if reject {
                (run_tg_keyed(&l, &keys[..1], n), 0)
            } else {
                (run_tg_keyed(&l, &keys, n), n)
            }
        }
        "tg-keyed-idle" => {
            let l =
                tollgate::RateLimiter::<IpAddr>::new(tollgate::Quota::per_second(1_000_000_000));
            for k in &keys {
                assert!(l.check(k).is_allowed());
            }
            (run_tg_keyed(&l, &keys, n), n)
        }
        "gv-keyed-idle" => {
            let l = governor::RateLimiter::keyed(governor::Quota::per_second(
                NonZeroU32::new(1_000_000_000).unwrap(),
            ));
            for k in &keys {
                assert!(l.check_key(k).is_ok());
            }
            (run_gv_keyed(&l, &keys, n), n)
        }
        "gv-keyed" | "gv-reject-keyed" => {
            let reject = kind == "gv-reject-keyed";
            let l = governor::RateLimiter::keyed(if reject { closed_gv() } else { open_gv() });
            for k in &keys {
                assert!(l.check_key(k).is_ok());
            }
            if reject {
                (run_gv_keyed(&l, &keys[..1], n), 0)
            } else {
                (run_gv_keyed(&l, &keys, n), n)
            }
        }
        "x-rwlock" => {
            let lock = std::sync::RwLock::new(1);
            (run_x_rwlock(&lock, n), n)
        }
        "x-div" => {
            // Quota::per_second(1).burst(u32::MAX): T = 1e9 ns, tau = T * (2^32 - 1).
            let interval = 1_000_000_000u64;
            black_box(run_x_div(interval * u64::from(u32::MAX), interval, n));
            (n, n)
        }
        other => panic!("unknown kind {other}"),
    };
    let elapsed = started.elapsed();
    assert_eq!(allowed, expected, "{kind}: wrong number of admitted checks");
    println!(
        "{kind}: {n} checks, {allowed} admitted, {:.2} ns each (setup included)",
        elapsed.as_nanos() as f64 / n as f64
    );
}
