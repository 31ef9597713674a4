//! Memory per tracked key, per kind of quota: 1 000 000 distinct IPv4 keys (as `PeerIp`
//! produces them), each admitted once, measured as the growth of the resident set, then given
//! back once the keys are idle and evicted.
//!
//! ```text
//! cargo run --release --example memory_per_key [kind] [keys]
//! ```
//!
//! `kind`: `gcra` (the default), `gcra2` (two GCRA quotas), `fixed`, `log` (a sliding log, one
//! request each), `counter` (sliding-window counter), `warmup`, or `penalty` (one strike each
//! in a penalty box's table, the record a layer keeps beside the quotas).
//!
//! Linux only (reads `/proc/self/statm`).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tollgate::key::IpKey;
use tollgate::penalty::{Penalties, PenaltyBox};
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

/// The state a kind keeps for one key, filled for `keys` keys; what is left once idle.
trait Tracker {
    fn touch(&self, key: &IpKey);
    fn len(&self) -> usize;
    fn evict_idle(&self) -> usize;
}

impl Tracker for RateLimiter<IpKey> {
    fn touch(&self, key: &IpKey) {
        assert!(self.check(key).is_allowed());
    }
    fn len(&self) -> usize {
        RateLimiter::len(self)
    }
    fn evict_idle(&self) -> usize {
        RateLimiter::evict_idle(self)
    }
}

impl Tracker for Penalties<IpKey> {
    fn touch(&self, key: &IpKey) {
        self.strike(key);
    }
    fn len(&self) -> usize {
        Penalties::len(self)
    }
    fn evict_idle(&self) -> usize {
        // A strike's run lasts a second; its record is idle after it and dropped by the next
        // insert that needs room, or by the table's sweep when a shard is next touched.
        Penalties::len(self)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "gcra".into());
    let keys: u32 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (clock, time) = Clock::manual();
    let sec = Duration::from_secs(1);
    let max_keys = keys as usize * 2;
    let limiter = |first: Quota, second: Option<Quota>| {
        let mut b = RateLimiter::<IpKey>::builder(first)
            .clock(clock.clone())
            .max_keys(max_keys);
        if let Some(q) = second {
            b = b.quota(q);
        }
        Box::new(b.build()) as Box<dyn Tracker>
    };
    let tracker: Box<dyn Tracker> = match kind.as_str() {
        "gcra" => limiter(Quota::per_second(10), None),
        "gcra2" => limiter(Quota::per_second(10), Some(Quota::per_hour(1000))),
        "fixed" => limiter(Quota::fixed_window(10, sec), None),
        "log" => limiter(Quota::sliding_log(10, sec), None),
        "counter" => limiter(Quota::sliding_window(10, sec), None),
        "warmup" => limiter(Quota::per_second(10).warm_up(10 * sec, 3), None),
        "penalty" => {
            let boxed = PenaltyBox::new(3, sec, sec);
            match Penalties::<IpKey>::try_new(&boxed, clock.clone(), max_keys) {
                Ok(p) => Box::new(p),
                Err(e) => panic!("{e}"),
            }
        }
        other => panic!("unknown kind {other}: gcra, gcra2, fixed, log, counter, warmup, penalty"),
    };

    let before = rss_bytes();
    for i in 0..keys {
        // The key type of `PeerIp` and `ClientIp`.
        let ip = IpKey::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
        tracker.touch(&ip);
    }
    let full = rss_bytes();
    let tracked = tracker.len();

    // Every window and emission interval here is at most a second (warm-up: ten): after a
    // minute every key is idle again, and evicting them changes no decision.
    time.advance(Duration::from_secs(60));
    let left = tracker.evict_idle();
    let after = rss_bytes();

    let per_key = (full.saturating_sub(before)) as f64 / f64::from(keys);
    println!("kind                    {kind}");
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
