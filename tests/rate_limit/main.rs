//! The rate-limit decision, on the limiter and both stores (docs/design.md section 1): the
//! semantics case by case, quota kinds and warm-up, the reference model on random inputs,
//! waiting for admission, threads on one key, and what a sliding log costs in memory.

#[path = "../common/mod.rs"]
mod common;

mod adversarial;
mod fast_paths;
mod kinds;
mod kinds_redis;
mod limiter;
mod log_bytes;
mod meet_slot;
mod properties;
mod properties_redis;
mod recent_sets;
mod spec_memory;
mod waiting;
mod warm_remaining;
mod warmup;
mod warmup_redis;
