//! Shared test support.
pub mod spec;
