//! The policy decoders (the binary serializer's decode, and JSON-schema
//! validation of raw producer input) never panic on arbitrary bytes and
//! never hold memory out of proportion to their input.
//!
//! The properties live in the fuzz target bodies (`fuzz/src/policy.rs`),
//! shared with the cargo-fuzz targets; here, on the stable toolchain, they
//! run over the committed corpus and 100,000 deterministically mutated
//! inputs under a counting global allocator.

use strom_policy::binary::MAX_ZERO_WIDTH_ITEMS;
use strom_policy::TopicPolicy;

#[allow(dead_code)]
#[macro_use]
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
#[path = "../../../fuzz/src/policy.rs"]
mod targets;

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

replay_tests!(0x5354_524F_4D00_0002);

const NESTED_NULLS: &str = r#"{"type":"array","items":{"type":"array","items":{"type":"null"}}}"#;

fn nested_nulls() -> TopicPolicy {
    TopicPolicy::new("none", Some(NESTED_NULLS), "round-robin", "binary").unwrap()
}

/// `count` arrays of `inner` nulls each, as the binary serializer writes them.
fn nested_null_encoding(count: u8, inner: u64) -> Vec<u8> {
    let mut v = vec![count];
    for _ in 0..count {
        let mut n = inner;
        while n >= 0x80 {
            v.push(n as u8 | 0x80);
            n >>= 7;
        }
        v.push(n as u8);
    }
    v
}

/// Regression: arrays of nulls take no bytes, so each was capped at
/// `MAX_ZERO_WIDTH_ITEMS` items, but their number was not: 3 bytes per
/// array made 2 MiB of `Value`s, and a 193-byte encoding held 128 MiB.
/// The cap now holds for all arrays of nulls of one encoding together.
#[test]
fn many_arrays_of_nulls_cannot_multiply_the_zero_width_cap() {
    let p = nested_nulls();
    let hostile = nested_null_encoding(64, MAX_ZERO_WIDTH_ITEMS);
    assert_eq!(hostile.len(), 1 + 64 * 3);
    let peak = replay::measure(|| {
        let err = p.decode(&hostile).unwrap_err();
        assert_eq!(err.code(), 404, "{err}");
        assert!(err.to_string().contains("null items"), "{err}");
    });
    assert!(
        peak <= targets::one_copy(hostile.len()),
        "held {peak} bytes"
    );

    // Up to the cap in all, split over arrays, still decodes.
    let half = MAX_ZERO_WIDTH_ITEMS / 2;
    let fine = nested_null_encoding(2, half);
    let value = p.decode(&fine).unwrap();
    assert_eq!(value[1].as_array().map(Vec::len), Some(half as usize));
    assert!(p.decode(&nested_null_encoding(3, half)).is_err());
}

/// The encoder applies the same total, so it never writes metadata that
/// consumers refuse to decode.
#[test]
fn the_encoder_refuses_what_the_decoder_would() {
    let p = nested_nulls();
    let half = vec![serde_json::Value::Null; MAX_ZERO_WIDTH_ITEMS as usize / 2];
    let ok = serde_json::json!([half.clone(), half.clone()]);
    let (_, enc) = p.prepare(ok.clone().into(), None, 1).unwrap();
    assert_eq!(p.decode(&enc).unwrap(), ok);
    let over = serde_json::json!([half.clone(), half.clone(), [null]]);
    let err = p.prepare(over.into(), None, 1).unwrap_err();
    assert_eq!(err.code(), 403, "{err}");
    assert!(err.to_string().contains("in all"), "{err}");
}
