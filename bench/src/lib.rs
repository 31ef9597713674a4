//! Benchmarks of tollgate and its comparisons with other crates: everything is in `benches/`
//! and `examples/` (see `Cargo.toml` for the commands). This library is empty.
