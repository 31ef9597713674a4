//! Where a rate limit's state lives: [`Memory`] (the default) or, with the `redis` feature,
//! `redis::RedisStore`, both a [`Backend`]; and what to do when the memory store is full
//! ([`OnFull`]). The store a layer uses is chosen with
//! [`RateLimitLayer::store`](crate::RateLimitLayer::store).
//!
//! The memory store is the default; it needs no server: for one key it reads the stored times,
//! decides ([`Decision`](crate::Decision)) and replaces them atomically. With the `redis` feature,
//! `redis::RedisStore` keeps them in Redis, shared by every instance of a service; there the
//! same rule runs as a Lua script on the server, on the server's clock, and the result is
//! read back into the same [`Decision`](crate::Decision).

pub(crate) mod memory;

pub use crate::rate_limit::store::{Backend, Memory};
pub use memory::OnFull;
