//! The fuzz target body for the Kafka front end's request decoding
//! (`strom_kafka::check_request`): the request header, the count guard
//! and the kafka-protocol decoder of every supported key and version. It
//! must never panic, and never hold memory out of proportion to the frame
//! (the guard checks every count read off the wire before the decoder
//! reserves room for it).
//!
//! The stable-toolchain counterpart is `crates/strom-kafka/tests/decode_fuzz.rs`
//! (10,000 random and mutated frames in `make test`).

use bytes::Bytes;

/// Most bytes a decode may hold at once for a `len`-byte frame: decoded
/// structs are larger than their encoding (a 1-byte tagged-field count or
/// a 2-byte null string becomes a struct of a few hundred bytes), but an
/// allocation from an unchecked count is gigabytes whatever the input.
pub fn bound(len: usize) -> usize {
    512 * len + 1024 * 1024
}

/// One request frame (after its 4-byte size prefix).
pub fn request(data: &[u8]) {
    let _ = strom_kafka::check_request(Bytes::copy_from_slice(data));
}
