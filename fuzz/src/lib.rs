//! Fuzz target bodies for Strom's decoders. Each `fuzz_targets/<name>.rs`
//! is a libFuzzer entry point that runs a body here through
//! [`replay::run_one`] under the counting allocator, so fuzzing checks the
//! same allocation bound as the stable tests; the same
//! modules are included by the stable replay tests under
//! `crates/strom-proto/tests/` and `crates/strom-policy/tests/`, so nothing
//! in them may need nightly or `cfg(fuzzing)`.

pub mod kafka;
pub mod policy;
pub mod proto;
pub mod replay;
