//! What the crate's layers are made of, written once: see [`common`].

pub(crate) mod allow;
pub(crate) mod common;
