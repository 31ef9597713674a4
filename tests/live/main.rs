//! Limits changed while serving (docs/design.md section 3, "A live quota change"): rate limits
//! in memory and on Redis, concurrency limits and shaping; every clone and instance follows,
//! and an invalid change leaves the old limits.

#[path = "../common/mod.rs"]
mod common;

mod curve_bound;
mod curve_idle_edge;
mod curve_renewal;
mod fields_kept;
mod fields_overlap;
mod fields_stacked;
mod late_refunds_race;
mod live;
mod live_concurrency;
mod live_fields;
mod live_redis;
mod live_refunds;
mod span_bound;
