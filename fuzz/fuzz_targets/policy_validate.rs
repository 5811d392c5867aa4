#![no_main]
use strom_fuzz::{policy, replay};

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay::run_one(
        "policy_validate",
        policy::validate,
        data,
        policy::bound,
        "input",
    )
});
