#![no_main]
use strom_fuzz::{kafka, replay};

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    replay::run_one("kafka_request", kafka::request, data, kafka::bound, "input")
});
