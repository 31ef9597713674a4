//! The penalty box (docs/design.md section 3, "The penalty box punishes the client's own
//! traffic"): strikes, bans, escalation, forgiveness and the allow list, in memory and on a
//! real redis-server.

#[path = "../common/mod.rs"]
mod common;

mod ban_change;
mod debt_strikes;
mod meet_keyed;
mod penalty;
mod penalty_redis;
