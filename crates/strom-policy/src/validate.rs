//! Metadata validators: `none`, `json` (syntax only) and `json-schema`
//! (an inline schema compiled once with the `jsonschema` crate).
//!
//! Rejections are [`PolicyError::InvalidMetadata`] naming the failing rule:
//! `json` for a syntax error, otherwise the JSON-schema keyword (`required`,
//! `type`, `minimum`, ...), plus the JSON pointer of the offending value.

use serde::de::IgnoredAny;
use serde_json::Value;

use crate::PolicyError;

/// A compiled metadata validator.
pub enum Validator {
    /// Accept anything; raw input is not even parsed.
    None,
    /// Require syntactically valid JSON (any JSON value, not only objects).
    Json,
    /// Require JSON that conforms to the topic schema.
    Schema(Box<jsonschema::Validator>),
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Validator::None => "Validator::None",
            Validator::Json => "Validator::Json",
            Validator::Schema(_) => "Validator::Schema",
        })
    }
}

/// Compiles a JSON schema, mapping a bad schema to [`PolicyError::BadSpec`].
pub fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, PolicyError> {
    jsonschema::validator_for(schema)
        .map_err(|e| PolicyError::BadSpec(format!("invalid JSON schema: {e}")))
}

impl Validator {
    /// Builds the validator named `name`. When a schema is given it is
    /// compiled (and so checked) even if the validator does not use it.
    pub fn new(name: &str, schema: Option<&Value>) -> Result<Self, PolicyError> {
        let compiled = schema.map(compile_schema).transpose()?;
        match (name, compiled) {
            ("none", _) => Ok(Validator::None),
            ("json", _) => Ok(Validator::Json),
            ("json-schema", Some(v)) => Ok(Validator::Schema(Box::new(v))),
            ("json-schema", None) => Err(PolicyError::BadSpec(
                "the json-schema validator needs a JSON schema (--schema)".into(),
            )),
            (other, _) => Err(PolicyError::BadSpec(format!(
                "unknown validator '{other}' (expected 'none', 'json' or 'json-schema')"
            ))),
        }
    }

    /// True when validation needs a parsed [`Value`].
    pub fn needs_value(&self) -> bool {
        matches!(self, Validator::Schema(_))
    }

    /// Validates raw JSON text without building a value. Only meaningful
    /// when [`Validator::needs_value`] is false.
    pub fn check_raw(&self, raw: &[u8]) -> Result<(), PolicyError> {
        match self {
            Validator::None => Ok(()),
            Validator::Json => serde_json::from_slice::<IgnoredAny>(raw)
                .map(|_| ())
                .map_err(|e| PolicyError::invalid("json", "", e.to_string())),
            Validator::Schema(_) => {
                let value = serde_json::from_slice::<Value>(raw)
                    .map_err(|e| PolicyError::invalid("json", "", e.to_string()))?;
                self.check_value(&value)
            }
        }
    }

    /// Validates an already-parsed value.
    pub fn check_value(&self, value: &Value) -> Result<(), PolicyError> {
        match self {
            Validator::None | Validator::Json => Ok(()),
            Validator::Schema(schema) => schema.validate(value).map_err(|e| {
                PolicyError::invalid(
                    e.kind().keyword(),
                    e.instance_path().as_str(),
                    e.to_string(),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule_and_path(err: PolicyError) -> (String, String) {
        match err {
            PolicyError::InvalidMetadata { rule, path, .. } => (rule, path),
            other => panic!("expected InvalidMetadata, got {other:?}"),
        }
    }

    #[test]
    fn json_validator_checks_syntax_only() {
        let v = Validator::new("json", None).unwrap();
        assert!(v.check_raw(br#"{"a":[1,2,{"b":null}]}"#).is_ok());
        assert!(v.check_raw(b"42").is_ok());
        let (rule, path) = rule_and_path(v.check_raw(br#"{"a":"#).unwrap_err());
        assert_eq!((rule.as_str(), path.as_str()), ("json", ""));
        assert!(v.check_raw(b"{} trailing").is_err());
        assert!(v.check_raw(b"").is_err());
    }

    #[test]
    fn none_validator_accepts_garbage() {
        let v = Validator::new("none", None).unwrap();
        assert!(v.check_raw(b"\xff not json").is_ok());
    }

    #[test]
    fn schema_validator_names_keyword_and_pointer() {
        let schema =
            json!({"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}}}});
        let v = Validator::new("json-schema", Some(&schema)).unwrap();
        assert!(v.check_value(&json!({"a":["x"]})).is_ok());
        let (rule, path) = rule_and_path(v.check_value(&json!({"a":["x", 3]})).unwrap_err());
        assert_eq!((rule.as_str(), path.as_str()), ("type", "/a/1"));
        let (rule, _) = rule_and_path(v.check_raw(b"[").unwrap_err());
        assert_eq!(rule, "json");
    }
}
