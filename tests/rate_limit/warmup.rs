//! Warm-up quotas, hostile cases: floods and the quiet after them, races on one key, a clock
//! that steps back, numeric edges, every builder order. The table of ordinary cases is in
//! tests/common/spec.rs (run against memory, HTTP and Redis).
//!
//! Quota throughout unless said: 1 per second, warm-up 4 s, cold factor 3. From cold the
//! requests cost 2.5 s, 1.5 s, then 1 s each; an idle key stores 4 s of permits.
//!
//! Pins docs/design.md section 1 ("Other kinds": warm-up).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::warmup::{WarmUp, MAX_WARM_UP_PERIOD};
use tollgate::{Clock, ConfigError, Outcome, Quota, QuotaKind, RateLimiter};

const SEC: Duration = Duration::from_secs(1);

fn warm(burst: u32) -> Quota {
    Quota::per_second(1)
        .burst(burst)
        .warm_up(Duration::from_secs(4), 3)
}

#[test]
fn a_flood_after_idle_is_admitted_at_the_cold_rate_then_the_quiet_cools_the_key_again() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<&str>::builder(warm(1)).clock(clock).build();
    // A flood: one request every 10 ms for 10 s. Admitted at 0, 2.5, 4, 5, 6, ... 9 s.
    let mut admitted = Vec::new();
    for i in 0..1_000u64 {
        if limiter.check(&"k").is_allowed() {
            admitted.push(i * 10);
        }
        time.advance(Duration::from_millis(10));
    }
    assert_eq!(
        admitted,
        [0, 2_500, 4_000, 5_000, 6_000, 7_000, 8_000, 9_000]
    );
    // The quiet: the key is tracked until it is as cold as a key never seen, then dropped.
    // Last admitted at 9 s (TAT 10 s, nothing stored): cold 4 s after the TAT. The loop left
    // the clock at 10 s.
    time.advance(Duration::from_secs(4) - Duration::from_nanos(1));
    assert_eq!(limiter.evict_idle(), 1);
    time.advance(Duration::from_nanos(1));
    assert_eq!(limiter.evict_idle(), 0);
    // The next flood starts slow again.
    let mut again = Vec::new();
    for i in 0..500u64 {
        if limiter.check(&"k").is_allowed() {
            again.push(i * 10);
        }
        time.advance(Duration::from_millis(10));
    }
    assert_eq!(again, [0, 2_500, 4_000]);
}

#[test]
fn racing_threads_on_one_cold_key_are_admitted_as_one_thread_would_be() {
    // Burst 10 from cold, all at one instant: the cold surcharge leaves room for fewer.
    let quota = Quota::per_second(1)
        .burst(10)
        .warm_up(Duration::from_secs(20), 3);
    let (clock, _time) = Clock::manual();
    let alone = RateLimiter::<u8>::builder(quota.clone())
        .clock(clock.clone())
        .build();
    let mut expected = 0;
    while alone.check(&0).is_allowed() {
        expected += 1;
    }
    assert!(expected < 10, "cold: {expected}");
    let limiter = Arc::new(RateLimiter::<u8>::builder(quota).clock(clock).build());
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            std::thread::spawn(move || {
                for _ in 0..1_000 {
                    if limiter.check(&0).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), expected);
}

#[test]
fn a_clock_that_steps_back_admits_nothing_extra_and_regains_nothing() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<&str>::builder(warm(1)).clock(clock).build();
    time.set(Duration::from_secs(100));
    assert!(limiter.check(&"k").is_allowed()); // TAT 102.5 s
    time.set(Duration::from_secs(50));
    let d = limiter.check(&"k");
    assert_eq!(d.outcome(), Outcome::Limited);
    assert_eq!(d.retry_after(), Some(Duration::from_millis(52_500)));
    // Back at 102.5 s: the key has not cooled while the clock was behind.
    time.set(Duration::from_millis(102_500));
    assert!(limiter.check(&"k").is_allowed());
    assert_eq!(
        limiter.peek(&"k").reset_after(),
        Duration::from_millis(1_500)
    );
}

#[test]
fn numeric_edges_decide_without_panicking() {
    let (clock, time) = Clock::manual();
    for quota in [
        Quota::per_second(1).warm_up(Duration::from_nanos(1), 1),
        Quota::per_second(1).warm_up(Duration::from_nanos(1), u32::MAX),
        Quota::per_second(1_000_000_000).warm_up(MAX_WARM_UP_PERIOD, u32::MAX),
        Quota::per_day(1)
            .burst(1 << 15)
            .warm_up(MAX_WARM_UP_PERIOD, 2),
        Quota::new(1, Duration::from_secs(1 << 32)).warm_up(SEC, 3),
        Quota::new(u32::MAX, Duration::from_secs(5))
            .burst(u32::MAX)
            .warm_up(SEC, 7),
    ] {
        let limiter = RateLimiter::<u8>::builder(quota.clone())
            .clock(clock.clone())
            .build();
        for cost in [0, 1, 2, u32::MAX] {
            let d = limiter.check_n(&0, cost);
            let _ = (d.remaining(), d.reset_after(), d.retry_after());
        }
        time.advance(Duration::from_secs(1 << 30));
        let _ = limiter.check(&0);
        let _ = limiter.evict_idle();
    }
}

#[test]
fn cost_above_the_burst_is_never_admitted_even_when_warm() {
    let (clock, time) = Clock::manual();
    let limiter = RateLimiter::<&str>::builder(warm(3)).clock(clock).build();
    assert_eq!(limiter.check_n(&"k", 4).outcome(), Outcome::Exceeds);
    assert_eq!(limiter.check_n(&"k", u32::MAX).outcome(), Outcome::Exceeds);
    time.advance(Duration::from_secs(60));
    assert_eq!(limiter.check_n(&"k", 4).outcome(), Outcome::Exceeds);
    // Nothing was consumed: still fully cold, where the first request uses 2.5 s of the 3 s
    // tolerance.
    assert_eq!(limiter.peek(&"k").remaining(), 1);
}

#[test]
fn cold_factor_1_decides_exactly_like_plain_gcra() {
    let (clock, time) = Clock::manual();
    let plain = RateLimiter::<u8>::builder(Quota::per_second(7).burst(3))
        .clock(clock.clone())
        .build();
    let flat = RateLimiter::<u8>::builder(
        Quota::per_second(7)
            .burst(3)
            .warm_up(Duration::from_secs(2), 1),
    )
    .clock(clock)
    .build();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        time.advance(Duration::from_micros(x % 400_000));
        let cost = (x >> 40) as u32 % 4;
        let (a, b) = (plain.check_n(&1, cost), flat.check_n(&1, cost));
        assert_eq!(a.outcome(), b.outcome());
        assert_eq!(a.retry_after(), b.retry_after());
        assert_eq!(a.remaining(), b.remaining());
        assert_eq!(a.reset_after(), b.reset_after());
    }
}

#[test]
fn every_builder_order_gives_the_same_quota() {
    let p = Duration::from_secs(4);
    let a = Quota::per_second(1).burst(2).warm_up(p, 3).named("w");
    let b = Quota::per_second(1).warm_up(p, 3).burst(2).named("w");
    let c = Quota::per_second(1).named("w").warm_up(p, 3).burst(2);
    assert_eq!(a, b);
    assert_eq!(b, c);
    assert_eq!(a.kind(), QuotaKind::WarmUp);
    assert_eq!(a.warm_up_settings(), Some(WarmUp::new(p, 3)));
    // Set twice: the last one counts.
    let d = Quota::per_second(1)
        .warm_up(SEC, 5)
        .warm_up(p, 3)
        .burst(2)
        .named("w");
    assert_eq!(d, a);
}

#[test]
fn invalid_warm_up_settings_are_configuration_errors() {
    let q = Quota::per_second(1);
    assert_eq!(
        q.clone().try_warm_up(Duration::ZERO, 3),
        Err(ConfigError::InvalidWarmUpPeriod(Duration::ZERO))
    );
    assert_eq!(
        q.clone().try_warm_up(SEC, 0),
        Err(ConfigError::InvalidColdFactor(0))
    );
    let too_long = MAX_WARM_UP_PERIOD + Duration::from_nanos(1);
    assert_eq!(
        q.try_warm_up(too_long, 3),
        Err(ConfigError::InvalidWarmUpPeriod(too_long))
    );
    assert_eq!(
        Quota::fixed_window(3, SEC).try_warm_up(SEC, 3),
        Err(ConfigError::WarmUpOnWindow)
    );
}
