#![no_main]
use strom_fuzz::{policy, replay};

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay::run_one(
        "policy_binary",
        policy::binary_decode,
        data,
        policy::bound,
        "input",
    )
});
