//! Fuzz target bodies for the `strom-policy` decoders, and their seeds.
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, nightly) and
//! the stable replay test (`crates/strom-policy/tests/hostile_input.rs`,
//! which includes this file with `#[path]`). The first input byte picks one
//! of [`SCHEMAS`]; the rest is the untrusted metadata.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::{json, Value};
use strom_policy::{MetadataInput, TopicPolicy};

/// Size of a decoded JSON value in memory.
pub const VALUE: usize = std::mem::size_of::<serde_json::Value>();

/// Most bytes one decoded copy may take for an input of `len` bytes: every
/// input byte can become a `Value` (a one-byte boolean, a 32-byte `Value`),
/// a vector may be grown to twice its length, and one array of nulls may
/// hold `MAX_ZERO_WIDTH_ITEMS` items, which take no input bytes at all.
pub fn one_copy(len: usize) -> usize {
    4 * VALUE * len + 2 * VALUE * strom_policy::binary::MAX_ZERO_WIDTH_ITEMS as usize + 64 * 1024
}

/// The binary target holds up to three copies at once (the decoded value,
/// its clone handed to the encoder, and the re-encoding decoded again).
pub fn bound(len: usize) -> usize {
    4 * one_copy(len)
}

/// A fuzz target: its directory name under `fuzz/corpus/`, and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target of this module.
pub const TARGETS: &[Target] = &[
    ("policy_binary", binary_decode),
    ("policy_validate", validate),
];

/// Schemas covering every binary shape: scalars, nested objects with
/// optional fields (a presence bitmap over a byte boundary), arrays of
/// objects, of arrays and of zero-width nulls, "any" positions, and deep
/// nesting near the depth cap.
pub const SCHEMAS: &[&str] = &[
    r#"{"type":"object","required":["id","name","tags","pos"],"properties":{
        "id":{"type":"integer"},"name":{"type":"string"},"score":{"type":"number"},
        "ok":{"type":"boolean"},"nothing":{"type":"null"},
        "tags":{"type":"array","items":{"type":"string"}},
        "pos":{"type":"object","required":["x"],"properties":{
            "x":{"type":"number"},"y":{"type":"number"},"label":{"type":["string","null"]}}},
        "samples":{"type":"array","items":{"type":"object","required":["t"],
            "properties":{"t":{"type":"integer"},"v":{"type":"number"}}}},
        "matrix":{"type":"array","items":{"type":"array","items":{"type":"integer"}}},
        "any":{},
        "o1":{"type":"integer"},"o2":{"type":"integer"},"o3":{"type":"integer"},
        "o4":{"type":"integer"},"o5":{"type":"integer"},"o6":{"type":"integer"},
        "o7":{"type":"integer"},"o8":{"type":"integer"},"o9":{"type":"integer"}}}"#,
    r#"{"type":"integer"}"#,
    r#"{"type":"number","minimum":0}"#,
    r#"{"type":"string","maxLength":64}"#,
    r#"{"type":"array","items":{"type":"null"}}"#,
    r#"{"type":"array","items":{"type":"array","items":{"type":"null"}}}"#,
    r#"{"type":"array","items":{"type":"boolean"}}"#,
    r#"{"oneOf":[{"type":"string"},{"type":"integer"}]}"#,
    r#"{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"array","items":{"type":"object","additionalProperties":false,"properties":{"c":{"type":"string","pattern":"^[a-z]+$"}}}}}}}}"#,
];

/// The deepest nesting the binary serializer accepts: 64 levels of arrays.
fn deep_schema() -> String {
    let mut s = r#"{"type":"integer"}"#.to_string();
    for _ in 0..strom_policy::binary::MAX_DEPTH {
        s = format!(r#"{{"type":"array","items":{s}}}"#);
    }
    s
}

fn all_schemas() -> &'static [String] {
    static ALL: OnceLock<Vec<String>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut v: Vec<String> = SCHEMAS.iter().map(|s| s.to_string()).collect();
        v.push(deep_schema());
        v
    })
}

/// `(binary serializer, json-schema validator + hash selector)` per schema,
/// compiled once.
fn policies() -> &'static [(TopicPolicy, TopicPolicy)] {
    static P: OnceLock<Vec<(TopicPolicy, TopicPolicy)>> = OnceLock::new();
    P.get_or_init(|| {
        all_schemas()
            .iter()
            .map(|s| {
                let binary = TopicPolicy::new("none", Some(s), "round-robin", "binary")
                    .expect("seed schemas compile");
                let checked = TopicPolicy::new("json-schema", Some(s), "hash:/id", "json")
                    .expect("seed schemas compile");
                (binary, checked)
            })
            .collect()
    })
}

fn pick(data: &[u8]) -> Option<(&(TopicPolicy, TopicPolicy), &[u8])> {
    let (&sel, rest) = data.split_first()?;
    let all = policies();
    Some((&all[usize::from(sel) % all.len()], rest))
}

/// Input: schema selector byte, then a binary-serializer encoding. What
/// decodes must encode again, and that encoding must decode to the same value.
pub fn binary_decode(data: &[u8]) {
    let Some(((binary, _), encoded)) = pick(data) else {
        return;
    };
    let Ok(value) = binary.decode(encoded) else {
        return;
    };
    let (_, again) = binary
        .prepare(MetadataInput::Value(value.clone()), None, 1)
        .unwrap_or_else(|e| panic!("decoded {value} does not encode again: {e}"));
    let back = binary.decode(&again);
    assert_eq!(back.as_ref().ok(), Some(&value), "{back:?}");
}

/// Input: schema selector byte, then raw JSON metadata as a producer hands
/// it over: validated against the schema, a partition chosen by `hash:/id`,
/// and decoded as the JSON serializer's output on the consumer side.
pub fn validate(data: &[u8]) {
    let Some(((_, checked), raw)) = pick(data) else {
        return;
    };
    let input = Bytes::copy_from_slice(raw);
    if let Ok((partition, out)) = checked.prepare(MetadataInput::Json(input.clone()), Some(1), 4) {
        assert_eq!(partition, 1);
        assert_eq!(
            out, input,
            "the JSON serializer hands raw input back unchanged"
        );
    }
    if let Ok((partition, _)) = checked.prepare(MetadataInput::Json(input), None, 4) {
        assert!(partition < 4);
    }
    let _ = checked.decode(raw);
}

/// Sample values per schema (index into [`all_schemas`]), valid or nearly so.
fn samples() -> Vec<(usize, Value)> {
    let mut nested = json!(7);
    for _ in 0..strom_policy::binary::MAX_DEPTH {
        nested = json!([nested]);
    }
    vec![
        (
            0,
            json!({"id": 123456, "name": "detector-7/frame", "score": 0.875, "ok": true,
                   "tags": ["raw", "calibrated"], "pos": {"x": 1.5, "y": -2.25, "label": "roi-3"},
                   "samples": [{"t": 1, "v": 0.5}, {"t": 2}], "matrix": [[1, 2], [3]],
                   "any": {"free": [1, "x"]}, "o9": -9, "extra": "kept"}),
        ),
        (
            0,
            json!({"id": -1, "name": "", "tags": [], "pos": {"x": 3}, "nothing": null}),
        ),
        (1, json!(-9_223_372_036_854_775_808i64)),
        (1, json!(u64::MAX)),
        (2, json!(2.5)),
        (2, json!(17)),
        (3, json!("héllo")),
        (4, json!([null, null, null])),
        (5, json!([[null], [], [null, null]])),
        (6, json!([true, false, true])),
        (7, json!("either")),
        (7, json!(12)),
        (8, json!({"a": {"b": [{"c": "abc"}, {}]}})),
        (9, nested),
    ]
}

/// The seed corpus: `(target, file name, bytes)`, committed under
/// `fuzz/corpus/<target>/<name>`; the stable test checks the files match.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    for (n, (schema, value)) in samples().into_iter().enumerate() {
        let (binary, _) = &policies()[schema];
        let sel = u8::try_from(schema).expect("few schemas");
        if let Ok((_, enc)) = binary.prepare(MetadataInput::Value(value.clone()), None, 1) {
            let mut v = vec![sel];
            v.extend_from_slice(&enc);
            out.push(("policy_binary", format!("s{schema}-{n:02}"), v));
        }
        let mut v = vec![sel];
        v.extend_from_slice(value.to_string().as_bytes());
        out.push(("policy_validate", format!("s{schema}-{n:02}"), v));
    }
    out
}
