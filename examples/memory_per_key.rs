//! Memory per tracked key: 1 000 000 distinct IPv4 keys (as `PeerIp` produces them) in a `RateLimiter`, measured as the
//! growth of the resident set, then given back once the keys are idle and evicted.
//!
//! ```text
//! cargo run --release --example memory_per_key [keys]
//! ```
//!
//! Linux only (reads `/proc/self/statm`).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tollgate::key::IpKey;
use tollgate::{Clock, Quota, RateLimiter};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let keys: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<IpKey>::builder(Quota::per_second(10))
        .clock(clock)
        .max_keys(keys as usize * 2)
        .build();

    let before = rss_bytes();
    for i in 0..keys {
        // The key type of `PeerIp` and `ClientIp`.
        let ip = IpKey::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
        assert!(limiter.check(&ip).is_allowed());
    }
    let full = rss_bytes();
    let tracked = limiter.len();

    // One emission interval later every key is idle again: evicting them changes no decision.
    time.advance(Duration::from_secs(1));
    let left = limiter.evict_idle();
    let after = rss_bytes();

    let per_key = (full.saturating_sub(before)) as f64 / f64::from(keys);
    println!("keys inserted           {keys}");
    println!("keys tracked            {tracked}");
    println!(
        "RSS before              {:.1} MiB",
        before as f64 / 1048576.0
    );
    println!("RSS with keys           {:.1} MiB", full as f64 / 1048576.0);
    println!("bytes per tracked key   {per_key:.1}");
    println!("keys left after evict   {left}");
    println!(
        "RSS after eviction      {:.1} MiB",
        after as f64 / 1048576.0
    );
    println!(
        "given back              {:.1}% of the growth",
        100.0 * (full.saturating_sub(after)) as f64 / (full.saturating_sub(before)).max(1) as f64
    );
}
