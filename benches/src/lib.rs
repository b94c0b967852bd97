//! Benchmarks for SCD; see benches/benches.
