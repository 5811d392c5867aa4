#![no_main]
use strom_fuzz::{proto, replay};

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay::run_one("response", proto::response, data, proto::bound, "input")
});
