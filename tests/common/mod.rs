//! Shared test support.
pub mod redis_server;
pub mod spec;
