//! Fuzz target bodies for Strom's decoders. Each `fuzz_targets/<name>.rs`
//! is a one-line libFuzzer entry point into a function here; the same
//! modules are included by the stable replay tests under
//! `crates/strom-proto/tests/` and `crates/strom-policy/tests/`, so nothing
//! in them may need nightly or `cfg(fuzzing)`.

pub mod policy;
pub mod proto;
