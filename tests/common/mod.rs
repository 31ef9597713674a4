//! Shared test support.
pub mod account;
pub mod capture;
pub mod model;
pub mod race;
pub mod redis_server;
pub mod spec;
pub mod stores;
pub mod twins;
