//! A flood of distinct keys, the quiet after it, then ordinary traffic: how long until the store
//! is back to the active keys, and the resident set before, during and after.
//!
//! ```text
//! cargo run --release --example flood [flood_keys] [clients]
//! ```
//!
//! Defaults: 1 000 000 flood keys (the default `max_keys`), then an hour of quiet on a manual
//! clock, then 1 000 clients each sending once per simulated second. Linux only (reads
//! `/proc/self/statm`).

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use tollgate::key::IpKey;
use tollgate::{Clock, Quota, RateLimiter};

fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (pages * 4096) as f64 / 1_048_576.0
}

fn ip(i: u32) -> IpKey {
    IpKey::from(IpAddr::V4(Ipv4Addr::from(i)))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let flood: u32 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let clients: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let (clock, time) = Clock::manual();
    // The defaults otherwise: max_keys 1 000 000, EvictNearestIdle.
    let limiter = RateLimiter::<IpKey>::builder(Quota::per_second(10))
        .clock(clock)
        .build();

    let before = rss_mib();
    let start = Instant::now();
    for i in 0..flood {
        let _ = limiter.check(&ip(0x0a00_0000 + i));
    }
    let flood_time = start.elapsed();
    let during = rss_mib();
    let flooded = limiter.len();

    time.advance(Duration::from_secs(3600));

    // Ordinary traffic, one round per simulated second, until only active keys are tracked.
    let start = Instant::now();
    let mut rounds = 0u32;
    while limiter.len() > clients as usize && rounds < 3_600 {
        for c in 0..clients {
            assert!(limiter.check(&ip(0xc000_0000 + c)).is_allowed());
        }
        time.advance(Duration::from_secs(1));
        rounds += 1;
    }
    let shrink_time = start.elapsed();
    let after = rss_mib();

    println!("flood keys              {flood}");
    println!("flood time              {flood_time:?}");
    println!("tracked after flood     {flooded}");
    println!("RSS before              {before:.1} MiB");
    println!("RSS during              {during:.1} MiB");
    println!("ordinary clients        {clients}");
    println!("rounds to shrink        {rounds} (one simulated second each)");
    println!("time to shrink          {shrink_time:?}");
    println!("tracked after           {}", limiter.len());
    println!("RSS after               {after:.1} MiB");
}
