//! What only the Redis store has (docs/design.md section 3, "Redis"; section 4, "Through
//! Redis"): the scripts, outages and the local fallback, probing, leases, key names, errors
//! about one key, duration settings at their edges, the keys' expiry after a live change,
//! the penalty box in dry run. Each test starts its own redis-server.

#[path = "../common/mod.rs"]
mod common;

mod adversary;
mod curve_renewal_redis;
mod dry_run_penalty;
mod fallback;
mod fallback_fields;
mod fallback_refunds;
mod hostile_settings;
mod key_errors;
mod lease;
mod lease_hostile;
mod lease_model;
mod lease_walk;
mod live_expiry;
mod live_local;
mod log_rebase;
mod long_log;
mod meet_lua;
mod meet_split;
mod namespace;
mod one_name_stacked;
mod penalty_outage;
mod plain_limits;
mod plain_meets;
mod probe;
mod renewal_width;
mod script_versions;
mod scripts;
mod slow_answer;
mod store;
