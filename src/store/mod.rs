//! Where theoretical arrival times live.
//!
//! The memory store is the default; it needs no server. Every store offers the same thing: for
//! one key, read the stored times, decide with [`crate::gcra`], and replace them atomically.

pub(crate) mod memory;

pub use memory::OnFull;
