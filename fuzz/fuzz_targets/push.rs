#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strom_fuzz::proto::push(data));
