//! What the races between threads share: a layer's handle on either store, and a small
//! deterministic generator, so that a round is drawn from its number.
#![allow(dead_code)]

use tollgate::key::Header;
use tollgate::{RateLimitHandle, RateLimitLayer};

/// The layer's handle, on either store.
pub trait Handled {
    fn handle_of(&self) -> RateLimitHandle;
}

impl Handled for RateLimitLayer<Header> {
    fn handle_of(&self) -> RateLimitHandle {
        self.handle().unwrap()
    }
}

#[cfg(feature = "redis")]
impl Handled for RateLimitLayer<Header, tollgate::redis::RedisStore> {
    fn handle_of(&self) -> RateLimitHandle {
        self.handle().unwrap()
    }
}

/// A small deterministic generator (xorshift), one per task or round.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (> 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
