//! Concurrency limits (docs/design.md section 1, "Concurrency limit"; section 2): permits,
//! queues, per-key limits, and adaptive limits with priority shedding, on a paused clock.

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod adaptive_bound;
mod concurrency;
mod debt_race;
mod live_model;
mod meetings;
