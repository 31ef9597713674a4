//! A Redis limiter and a memory limiter with the same quotas on one manual clock, decided side
//! by side: the Redis script must decide as the memory store does, to the request.

#![allow(dead_code)]
#![cfg(feature = "redis")]

use std::time::Duration;

use tokio::runtime::Runtime;
use tollgate::redis::{RedisRateLimiter, RedisStore};
use tollgate::{Clock, Decision, ManualClock, Quota, RateLimiter};

/// The runtime the twins' Redis side runs on, for tests that drive proptest (synchronous).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The two limiters and their clock.
pub struct Twins {
    pub redis: RedisRateLimiter<u8>,
    pub memory: RateLimiter<u8>,
    pub time: ManualClock,
}

impl Twins {
    /// Both limiters with `quotas` (at least one); the Redis one named `name`.
    pub fn new(store: &RedisStore, name: String, quotas: &[Quota]) -> Self {
        let (clock, time) = Clock::manual();
        let mut r = RedisRateLimiter::<u8>::builder(store.clone(), quotas[0].clone())
            .name(name)
            .clock(clock.clone());
        let mut m = RateLimiter::<u8>::builder(quotas[0].clone()).clock(clock);
        for q in &quotas[1..] {
            r = r.quota(q.clone());
            m = m.quota(q.clone());
        }
        Twins {
            redis: r.build(),
            memory: m.build(),
            time,
        }
    }

    /// Moves the clock on by `gap`, then decides `cost` for `key` on both: (Redis, memory).
    /// `None` when Redis did not decide (a degraded decision).
    pub fn decide(
        &self,
        rt: &Runtime,
        gap: Duration,
        key: u8,
        cost: u32,
    ) -> Option<(Decision, Decision)> {
        self.time.advance(gap);
        let got = rt.block_on(self.redis.check_n(&key, cost));
        if got.is_degraded() {
            return None;
        }
        Some((got, self.memory.check_n(&key, cost)))
    }

    /// Replaces the quotas of both.
    pub fn set_quotas(&self, quotas: &[Quota]) {
        self.redis.set_quotas(quotas.to_vec()).unwrap();
        self.memory.set_quotas(quotas.to_vec()).unwrap();
    }
}
