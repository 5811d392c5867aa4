//! Each validator accepts good metadata and rejects bad metadata, naming the
//! failing rule and the JSON pointer of the offending value.

use bytes::Bytes;
use serde_json::json;
use strom_policy::{MetadataInput, PolicyError, TopicPolicy};

const SCHEMA: &str =
    r#"{"type":"object","required":["x"],"properties":{"x":{"type":"integer","minimum":0}}}"#;

fn rejection(result: Result<(u32, Bytes), PolicyError>) -> (String, String, u16) {
    match result {
        Err(e @ PolicyError::InvalidMetadata { .. }) => {
            let code = e.code();
            let PolicyError::InvalidMetadata { rule, path, .. } = e else {
                unreachable!()
            };
            (rule, path, code)
        }
        other => panic!("expected InvalidMetadata, got {other:?}"),
    }
}

fn schema_policy(serializer: &str) -> TopicPolicy {
    TopicPolicy::new("json-schema", Some(SCHEMA), "round-robin", serializer).unwrap()
}

#[test]
fn none_validator_accepts_anything_even_non_json() {
    let p = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    assert!(p.prepare("not json at all".into(), None, 1).is_ok());
    assert!(p.prepare(json!([1, 2]).into(), None, 1).is_ok());
}

#[test]
fn json_validator_accepts_any_json_and_rejects_bad_syntax() {
    let p = TopicPolicy::new("json", None, "round-robin", "json").unwrap();
    for good in [r#"{"a":1}"#, "[1,2,3]", "\"text\"", "3.5", "null", " {} \n"] {
        assert!(p.prepare(good.into(), None, 2).is_ok(), "{good}");
    }
    for bad in [r#"{"a":1"#, "{} {}", "", "nul", "{'a':1}", "\u{1}"] {
        let (rule, path, code) = rejection(p.prepare(bad.into(), None, 2));
        assert_eq!(
            (rule.as_str(), path.as_str(), code),
            ("json", "", 400),
            "{bad}"
        );
    }
    assert!(p.prepare(json!({"a": [1]}).into(), None, 2).is_ok());
}

#[test]
fn json_schema_validator_accepts_conforming_metadata() {
    let p = schema_policy("json");
    assert!(p.prepare(r#"{"x":0}"#.into(), None, 1).is_ok());
    assert!(p
        .prepare(json!({"x": 7, "other": "kept"}).into(), None, 1)
        .is_ok());
}

#[test]
fn json_schema_rejects_below_minimum_at_field_pointer() {
    let p = schema_policy("json");
    let (rule, path, _) = rejection(p.prepare(json!({"x": -1}).into(), None, 1));
    assert_eq!((rule.as_str(), path.as_str()), ("minimum", "/x"));
    let (rule, path, _) = rejection(p.prepare(r#"{"x":-1}"#.into(), None, 1));
    assert_eq!((rule.as_str(), path.as_str()), ("minimum", "/x"));
}

#[test]
fn json_schema_rejects_missing_required_at_root() {
    let p = schema_policy("binary");
    let (rule, path, _) = rejection(p.prepare(json!({}).into(), None, 1));
    assert_eq!((rule.as_str(), path.as_str()), ("required", ""));
}

#[test]
fn json_schema_rejects_wrong_type_and_bad_syntax() {
    let p = schema_policy("json");
    let (rule, path, _) = rejection(p.prepare(json!({"x": "seven"}).into(), None, 1));
    assert_eq!((rule.as_str(), path.as_str()), ("type", "/x"));
    let (rule, path, _) = rejection(p.prepare(json!([1]).into(), None, 1));
    assert_eq!((rule.as_str(), path.as_str()), ("type", ""));
    let (rule, _, _) = rejection(p.prepare(r#"{"x":"#.into(), None, 1));
    assert_eq!(rule, "json");
}

#[test]
fn rejection_message_names_rule_and_path() {
    let p = schema_policy("json");
    let err = p.prepare(json!({"x": -1}).into(), None, 1).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("'minimum'") && text.contains("'/x'"),
        "{text}"
    );
}

#[test]
fn rejected_events_do_not_advance_round_robin() {
    let p = schema_policy("json");
    let _ = p.prepare(json!({}).into(), None, 4);
    let (first, _) = p.prepare(json!({"x": 1}).into(), None, 4).unwrap();
    assert_eq!(first, 0);
}

#[test]
fn invalid_schema_is_a_bad_spec() {
    for schema in [
        r#"{"type":12}"#,
        r#"{"required":"x"}"#,
        "[",
        r#"{"$ref":"http://example.com/s.json"}"#,
    ] {
        let err = TopicPolicy::new("json-schema", Some(schema), "round-robin", "json").unwrap_err();
        assert_eq!(err.code(), 401, "{schema}: {err}");
    }
}

#[test]
fn metadata_input_conversions() {
    assert_eq!(
        MetadataInput::from(json!(1)),
        MetadataInput::Value(json!(1))
    );
    assert_eq!(
        MetadataInput::from(String::from("{}")),
        MetadataInput::Json(Bytes::from_static(b"{}"))
    );
}
