//! Traffic shaping and the stream adapters (docs/design.md section 1, "Shaping"): departures,
//! order, bounds, cancellation, warm-up, and streams limited in memory and through Redis.
//! Every test on tokio's paused clock.

#[path = "../common/mod.rs"]
mod common;

mod bounded_model;
mod meetings;
mod shape;
mod shape_warmup;
mod shaper_model;
mod stream;
mod stream_redis;
