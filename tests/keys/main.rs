//! Keys and the bound on tracked keys (docs/design.md section 2, missing keys; section 3,
//! "Keyed state" and "One bound per layer"): client IPs, spoofed and garbage headers, floods
//! of distinct keys and the quiet after them, and servers that can give no key at all.

#[path = "../common/mod.rs"]
mod common;

mod bound_property;
mod bound_race;
mod bounds;
mod flood;
mod hostile;
mod idle_hint;
mod key_ip;
mod lag_elsewhere;
mod misconfigured;
