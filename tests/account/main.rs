//! A key's account (docs/design.md section 3, "An account per key", "A live quota change",
//! "Stacked layers are all or nothing"): what a request took is what it gives back, through
//! refunds, settlements and stacked layers, and where that meets the bounded table, the
//! penalty box and leases. Shared suites run over the memory store and a real redis-server
//! (`tests/common/stores.rs`).

#[path = "../common/mod.rs"]
mod common;

mod account;
mod account_redis;
mod debt_raised;
mod five_kinds_race;
mod kinds_stacked;
mod lease_change_redis;
mod lease_race_redis;
mod log_comes_back;
mod log_debt;
mod log_debt_model;
mod log_growth;
mod meetings;
mod meetings_redis;
mod mixed_model;
mod mixed_threads;
mod settle;
mod settle_redis;
mod stacked;
mod stacked_redis;
mod warm_mix_redis;
