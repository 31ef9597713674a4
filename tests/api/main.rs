//! What a user of the crate meets (docs/design.md sections 2 and 4): builders in any order,
//! errors that name the caller's line, configuration files, the first mistakes a newcomer
//! makes, and every example's documented commands replayed.

#[path = "../common/mod.rs"]
mod common;

mod examples;
mod layers;
mod names;
mod newcomer;
mod redis_stream;
mod serde;
mod warmup_plot;
