//! Where a limiter's state lives, and what the memory store does when it is full
//! ([`OnFull`], the one public item here).
//!
//! The memory store is the default and needs no server: it keeps each key's state on the
//! crate's bounded table, and for one key reads it, decides, and replaces it atomically. Its
//! mechanism is private to the crate; what a user sets on it (`max_keys`, [`OnFull`]) is
//! memory-only. A layer chooses its store with
//! [`RateLimitLayer::store`](crate::RateLimitLayer::store) (see
//! [`Backend`]). With the `redis` feature,
//! `redis::RedisStore` keeps the state in Redis, shared by every instance of a service; there
//! the same rules run as a Lua script on the server, on the server's clock, and the result is
//! read back into the same [`Decision`](crate::Decision).

pub(crate) mod backend;

pub use crate::keyed::OnFull;
pub use backend::{Backend, Memory};
