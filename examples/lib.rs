//! Runnable examples of tollgate: `cargo run --example <name>` from the repository's root.
//! Each example's doc comment lists its commands and what they print. This library is empty.
