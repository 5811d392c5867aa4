//! The JSON serializer: the fast path hands back the caller's bytes without
//! parsing or copying, and decode is the inverse of prepare.

use bytes::Bytes;
use serde_json::json;
use strom_policy::{MetadataInput, TopicPolicy};

fn same_buffer(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

#[test]
fn fast_path_returns_the_same_bytes() {
    let raw = Bytes::from(br#"{"step":1,"file":"a.h5"}"#.to_vec());
    for (validator, selector, explicit) in [
        ("none", "round-robin", None),
        ("json", "round-robin", None),
        ("none", "explicit", Some(1)),
        ("json", "hash:step", Some(0)),
    ] {
        let p = TopicPolicy::new(validator, None, selector, "json").unwrap();
        let (_, out) = p
            .prepare(MetadataInput::Json(raw.clone()), explicit, 2)
            .unwrap();
        assert!(same_buffer(&out, &raw), "{validator} {selector}");
    }
}

#[test]
fn parsed_paths_still_return_the_callers_json_text() {
    let raw = Bytes::from(r#"{ "user" : "bob",  "x": 2 }"#);
    let hash = TopicPolicy::new("none", None, "hash:user", "json").unwrap();
    let (_, out) = hash
        .prepare(MetadataInput::Json(raw.clone()), None, 4)
        .unwrap();
    assert!(same_buffer(&out, &raw));
    let schema = r#"{"type":"object","required":["x"]}"#;
    let checked = TopicPolicy::new("json-schema", Some(schema), "round-robin", "json").unwrap();
    let (_, out) = checked
        .prepare(MetadataInput::Json(raw.clone()), None, 4)
        .unwrap();
    assert!(same_buffer(&out, &raw));
}

#[test]
fn json_serializer_round_trips_values() {
    let p = TopicPolicy::new("json", None, "round-robin", "json").unwrap();
    assert!(p.serializer_is_json());
    let value = json!({"a": [1, 2.5, "x", null, {"b": true}]});
    let (_, bytes) = p.prepare(value.clone().into(), None, 1).unwrap();
    assert_eq!(p.decode(&bytes).unwrap(), value);
}

#[test]
fn json_decode_of_garbage_is_a_decode_error() {
    let p = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    for bad in [&b"{"[..], b"\xff\xfe", b"", b"[1] 2"] {
        assert_eq!(p.decode(bad).unwrap_err().code(), 404);
    }
}
