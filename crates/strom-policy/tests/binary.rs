//! The binary serializer: lossless round trips for values conforming to the
//! schema (including extras), compactness, encode errors naming the field,
//! and hostile-input safety of decode.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use strom_policy::{PolicyError, TopicPolicy};

const SCHEMA: &str = r#"{
  "type": "object",
  "required": ["id", "name", "tags", "pos"],
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string"},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "nothing": {"type": "null"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "pos": {
      "type": "object",
      "required": ["x"],
      "properties": {
        "x": {"type": "number"},
        "y": {"type": "number"},
        "label": {"type": ["string", "null"]}
      }
    },
    "samples": {
      "type": "array",
      "items": {
        "type": "object",
        "required": ["t"],
        "properties": {"t": {"type": "integer"}, "v": {"type": "number"}}
      }
    },
    "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "any": {},
    "o1": {"type": "integer"}, "o2": {"type": "integer"}, "o3": {"type": "integer"},
    "o4": {"type": "integer"}, "o5": {"type": "integer"}, "o6": {"type": "integer"},
    "o7": {"type": "integer"}, "o8": {"type": "integer"}, "o9": {"type": "integer"}
  }
}"#;

fn binary(validator: &str) -> TopicPolicy {
    TopicPolicy::new(validator, Some(SCHEMA), "round-robin", "binary").unwrap()
}

fn encode(p: &TopicPolicy, value: &Value) -> Result<Vec<u8>, PolicyError> {
    p.prepare(value.clone().into(), None, 1)
        .map(|(_, b)| b.to_vec())
}

fn typical_record() -> Value {
    json!({
        "id": 123456,
        "name": "detector-7/frame",
        "score": 0.875,
        "ok": true,
        "tags": ["raw", "calibrated"],
        "pos": {"x": 1.5, "y": -2.25, "label": "roi-3"},
        "samples": [{"t": 1, "v": 0.5}, {"t": 2, "v": 0.75}, {"t": 3}],
        "o3": 7,
        "run": "2024-06-01T12:00:00Z"
    })
}

// ---- strategies --------------------------------------------------------

/// Floats that print and parse back exactly as JSON text.
fn exact_float() -> impl Strategy<Value = f64> {
    any::<i32>().prop_map(|i| f64::from(i) / 8.0)
}

fn integer() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-100i64..100).prop_map(Value::from),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        integer(),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        exact_float().prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn optional(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v);
    }
}

fn pos() -> impl Strategy<Value = Value> {
    (
        number(),
        prop::option::of(number()),
        prop::option::of(prop_oneof![
            Just(Value::Null),
            ".{0,8}".prop_map(Value::from)
        ]),
    )
        .prop_map(|(x, y, label)| {
            let mut m = Map::new();
            m.insert("x".into(), x);
            optional(&mut m, "y", y);
            optional(&mut m, "label", label);
            Value::Object(m)
        })
}

fn sample() -> impl Strategy<Value = Value> {
    (
        integer(),
        prop::option::of(number()),
        prop::collection::btree_map("e[a-z]{0,4}", any_json(), 0..2),
    )
        .prop_map(|(t, v, extras)| {
            let mut m: Map<String, Value> = extras.into_iter().collect();
            m.insert("t".into(), t);
            optional(&mut m, "v", v);
            Value::Object(m)
        })
}

fn record() -> impl Strategy<Value = Value> {
    let required = (
        integer(),
        ".{0,16}",
        prop::collection::vec(".{0,6}".prop_map(Value::from), 0..5),
        pos(),
    );
    let optionals = (
        prop::option::of(number()),
        prop::option::of(any::<bool>()),
        prop::option::of(Just(Value::Null)),
        prop::option::of(prop::collection::vec(sample(), 0..4)),
        prop::option::of(prop::collection::vec(
            prop::collection::vec(integer(), 0..4).prop_map(Value::Array),
            0..3,
        )),
        prop::option::of(any_json()),
        prop::collection::vec(prop::option::of(integer()), 9),
    );
    let extras = prop::collection::btree_map("x_[a-z0-9]{0,6}", any_json(), 0..3);
    (required, optionals, extras).prop_map(
        |((id, name, tags, pos), (score, ok, nothing, samples, matrix, any, os), extras)| {
            let mut m: Map<String, Value> = extras.into_iter().collect();
            m.insert("id".into(), id);
            m.insert("name".into(), Value::from(name));
            m.insert("tags".into(), Value::Array(tags));
            m.insert("pos".into(), pos);
            optional(&mut m, "score", score);
            optional(&mut m, "ok", ok.map(Value::from));
            optional(&mut m, "nothing", nothing);
            optional(&mut m, "samples", samples.map(Value::Array));
            optional(&mut m, "matrix", matrix.map(Value::Array));
            optional(&mut m, "any", any);
            for (i, o) in os.into_iter().enumerate() {
                optional(&mut m, &format!("o{}", i + 1), o);
            }
            Value::Object(m)
        },
    )
}

// ---- round trips -------------------------------------------------------

proptest! {
    #[test]
    fn conforming_values_round_trip_losslessly(value in record()) {
        let p = binary("json-schema");
        let bytes = encode(&p, &value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let decoded = p.decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&decoded, &value);
        // Re-encoding the decoded value is byte-identical.
        prop_assert_eq!(encode(&p, &decoded).ok(), Some(bytes.clone()));
        // Every strict prefix is a decode error, never a panic.
        for cut in 0..bytes.len() {
            let err = p.decode(&bytes[..cut]).unwrap_err();
            prop_assert_eq!(err.code(), 404);
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let p = binary("none");
        if let Err(e) = p.decode(&bytes) {
            prop_assert_eq!(e.code(), 404);
        }
    }

    #[test]
    fn corrupted_encodings_never_panic(value in record(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let p = binary("none");
        let mut bytes = encode(&p, &value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (at, x) in flips {
            let len = bytes.len();
            if let Some(b) = bytes.get_mut(at % len) {
                *b ^= x;
            }
        }
        if let Err(e) = p.decode(&bytes) {
            prop_assert_eq!(e.code(), 404);
        }
    }
}

#[test]
fn binary_is_smaller_than_json_for_a_typical_record() {
    let value = typical_record();
    let bin = encode(&binary("json-schema"), &value).unwrap();
    let json = serde_json::to_vec(&value).unwrap();
    // Field names, quotes and separators disappear; floats cost 9 bytes.
    assert!(
        bin.len() * 3 < json.len() * 2,
        "binary {} vs json {}",
        bin.len(),
        json.len()
    );
    assert!(!binary("none").serializer_is_json());
}

#[test]
fn raw_json_input_is_parsed_for_binary() {
    let p = binary("none");
    let raw = serde_json::to_string(&typical_record()).unwrap();
    let (_, bytes) = p.prepare(raw.into(), None, 1).unwrap();
    assert_eq!(p.decode(&bytes).unwrap(), typical_record());
}

#[test]
fn integral_floats_encode_as_integers() {
    let p = TopicPolicy::new(
        "none",
        Some(r#"{"type":"integer"}"#),
        "round-robin",
        "binary",
    )
    .unwrap();
    let (_, bytes) = p.prepare(json!(3.0).into(), None, 1).unwrap();
    assert_eq!(&bytes[..], &[6]);
    assert_eq!(p.decode(&bytes).unwrap(), json!(3));
}

#[test]
fn non_object_root_schemas_work() {
    let p = TopicPolicy::new(
        "json-schema",
        Some(r#"{"type":"array","items":{"type":"integer"}}"#),
        "round-robin",
        "binary",
    )
    .unwrap();
    let (_, bytes) = p.prepare(json!([1, -1, 300]).into(), None, 1).unwrap();
    assert_eq!(&bytes[..], &[3, 2, 1, 0xd8, 0x04]);
    assert_eq!(p.decode(&bytes).unwrap(), json!([1, -1, 300]));
}

// ---- encode errors -----------------------------------------------------

fn encode_error(value: Value) -> String {
    match encode(&binary("none"), &value) {
        Err(e @ PolicyError::Encode(_)) => e.to_string(),
        other => panic!("expected an encode error, got {other:?}"),
    }
}

#[test]
fn type_mismatches_name_the_field() {
    let mut v = typical_record();
    v["id"] = json!("not a number");
    assert!(encode_error(v).contains("'/id'"));
    let mut v = typical_record();
    v["id"] = json!(1.5);
    assert!(encode_error(v).contains("'/id'"));
    let mut v = typical_record();
    v["samples"][1]["t"] = json!(true);
    assert!(encode_error(v).contains("'/samples/1/t'"));
    let mut v = typical_record();
    v["pos"] = json!([1, 2]);
    assert!(encode_error(v).contains("'/pos'"));
}

#[test]
fn missing_required_field_is_an_encode_error() {
    let mut v = typical_record();
    v.as_object_mut().unwrap().remove("name");
    let msg = encode_error(v);
    assert!(msg.contains("'name'"), "{msg}");
    assert_eq!(encode(&binary("none"), &json!(5)).unwrap_err().code(), 403);
}

#[test]
fn binary_without_schema_is_a_bad_spec() {
    let err = TopicPolicy::new("none", None, "round-robin", "binary").unwrap_err();
    assert_eq!(err.code(), 401);
}

// ---- hostile input -----------------------------------------------------

fn decode_err(schema: &str, bytes: &[u8]) -> String {
    let p = TopicPolicy::new("none", Some(schema), "round-robin", "binary").unwrap();
    match p.decode(bytes) {
        Err(e @ PolicyError::Decode(_)) => e.to_string(),
        other => panic!("expected a decode error, got {other:?}"),
    }
}

#[test]
fn huge_counts_and_lengths_are_rejected_without_allocating() {
    let huge = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
    decode_err(r#"{"type":"array","items":{"type":"integer"}}"#, &huge);
    decode_err(r#"{"type":"array","items":{"type":"null"}}"#, &huge);
    decode_err(r#"{"type":"string"}"#, &huge);
    decode_err(r#"{}"#, &huge);
    decode_err(r#"{"type":"object"}"#, &huge);
    let p = TopicPolicy::new(
        "none",
        Some(r#"{"type":"array","items":{"type":"null"}}"#),
        "round-robin",
        "binary",
    )
    .unwrap();
    assert_eq!(p.decode(&[3]).unwrap(), json!([null, null, null]));
}

#[test]
fn malformed_scalars_are_decode_errors() {
    decode_err(r#"{"type":"boolean"}"#, &[2]);
    decode_err(r#"{"type":"number"}"#, &[7, 0]);
    decode_err(r#"{"type":"number"}"#, &[0, 0, 0, 0, 0, 0, 0, 0xf8, 0x7f]); // NaN
    decode_err(r#"{"type":"string"}"#, &[2, 0xc3, 0x28]); // invalid UTF-8
    decode_err(r#"{"type":"integer"}"#, &[0x80; 11]);
    // zigzag value beyond u64
    decode_err(
        r#"{"type":"integer"}"#,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    );
    let msg = decode_err(r#"{"type":"integer"}"#, &[2, 0]);
    assert!(msg.contains("trailing"), "{msg}");
}

#[test]
fn malformed_objects_are_decode_errors() {
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#;
    decode_err(schema, &[0b10, 0]); // unused bitmap bit
    let extras = br#"{"a":1}"#;
    let mut bytes = vec![0, extras.len() as u8];
    bytes.extend_from_slice(extras);
    let msg = decode_err(schema, &bytes);
    assert!(msg.contains("'a'"), "{msg}");
    decode_err(schema, &[0, 2, b'[', b']']); // extras not an object
}

#[test]
fn deeply_nested_json_text_is_a_decode_error() {
    let mut text = "[".repeat(5000);
    text.push_str(&"]".repeat(5000));
    let mut bytes = Vec::new();
    let mut len = text.len();
    while len >= 0x80 {
        bytes.push((len as u8) | 0x80);
        len >>= 7;
    }
    bytes.push(len as u8);
    bytes.extend_from_slice(text.as_bytes());
    decode_err("{}", &bytes);
}
