//! Strom topic policies: the per-topic rules every client of a topic applies
//! to event metadata, so that all producers and consumers agree (the
//! schema-registry idea).
//!
//! A topic stores three policies as strings (from CLI flags and the topic
//! registry); [`TopicPolicy::new`] compiles them once:
//!
//! - **validator** (`none` | `json` | `json-schema`), see [`validate`];
//! - **partition selector** (`round-robin` | `hash:<field>` | `explicit`), see [`select`];
//! - **serializer** (`json` | `binary`), see [`binary`] for the binary format.
//!
//! The producer calls [`TopicPolicy::prepare`] per event (parse only if a
//! policy needs the value -> validate -> select partition -> serialize); the
//! consumer calls [`TopicPolicy::decode`]. The fast path (validator `none`,
//! selector `round-robin` or `explicit`, serializer `json`, raw JSON input)
//! neither parses nor copies: it hands back the caller's `Bytes`.
//!
//! This crate is pure computation: it must never depend on I/O, async
//! runtimes, the network or storage crates.

pub mod binary;
pub mod frame;
pub mod select;
pub mod validate;

use bytes::Bytes;
use serde_json::Value;

pub use select::{fnv1a64, hash_partition, Selector};
pub use validate::Validator;

/// Errors raised by topic policies. Each variant has a stable numeric code
/// ([`PolicyError::code`]) shared with the C and Python interfaces; a retired
/// code is never reused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Metadata violates the topic validator. `rule` names the failing rule
    /// (`json` for syntax, otherwise the JSON-schema keyword such as
    /// `required`, `type`, `minimum`); `path` is the JSON pointer of the
    /// offending value (`""` for the root).
    #[error("metadata rejected by rule '{rule}' at '{path}': {message}")]
    InvalidMetadata {
        rule: String,
        path: String,
        message: String,
    },
    /// The policy specification itself is wrong: unknown validator, selector
    /// or serializer name, invalid JSON schema, binary serializer without a
    /// schema, ...
    #[error("bad policy spec: {0}")]
    BadSpec(String),
    /// No partition could be chosen: hash field missing, explicit partition
    /// missing or out of range, topic without partitions.
    #[error("partition selection failed: {0}")]
    Selection(String),
    /// The metadata cannot be encoded by the topic serializer (for the
    /// binary serializer: a value does not match its schema type; the
    /// message names the field).
    #[error("cannot encode metadata: {0}")]
    Encode(String),
    /// Encoded metadata is malformed (truncated, corrupt or hostile).
    #[error("cannot decode metadata: {0}")]
    Decode(String),
}

impl PolicyError {
    /// Stable numeric code of this error, equal to the `strom_proto::ErrorCode`
    /// constant of the same meaning (pinned by
    /// `crates/strom-proto/tests/error_codes.rs`).
    pub fn code(&self) -> u16 {
        match self {
            PolicyError::InvalidMetadata { .. } => 400,
            PolicyError::BadSpec(_) => 401,
            PolicyError::Selection(_) => 402,
            PolicyError::Encode(_) => 403,
            PolicyError::Decode(_) => 404,
        }
    }

    pub(crate) fn invalid(
        rule: impl Into<String>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        PolicyError::InvalidMetadata {
            rule: rule.into(),
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Metadata of one event as the producer hands it over.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataInput {
    /// An already-built JSON value.
    Value(Value),
    /// Raw JSON text; passed through untouched when no policy needs to parse it.
    Json(Bytes),
}

impl From<Value> for MetadataInput {
    fn from(v: Value) -> Self {
        MetadataInput::Value(v)
    }
}

impl From<Bytes> for MetadataInput {
    fn from(b: Bytes) -> Self {
        MetadataInput::Json(b)
    }
}

impl From<Vec<u8>> for MetadataInput {
    fn from(b: Vec<u8>) -> Self {
        MetadataInput::Json(Bytes::from(b))
    }
}

impl From<&'static str> for MetadataInput {
    fn from(s: &'static str) -> Self {
        MetadataInput::Json(Bytes::from_static(s.as_bytes()))
    }
}

impl From<String> for MetadataInput {
    fn from(s: String) -> Self {
        MetadataInput::Json(Bytes::from(s))
    }
}

/// The metadata serializer of a topic.
#[derive(Debug)]
enum Serializer {
    Json,
    Binary(binary::Shape),
}

/// The three compiled policies of one topic. `Send + Sync`; round-robin
/// keeps an internal atomic counter, so each producer builds its own.
#[derive(Debug)]
pub struct TopicPolicy {
    validator: Validator,
    selector: Selector,
    serializer: Serializer,
    spec: PolicySpec,
}

/// The specification strings a [`TopicPolicy`] was built from, as stored in
/// the topic registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    pub validator: String,
    pub schema: Option<String>,
    pub selector: String,
    pub serializer: String,
}

impl TopicPolicy {
    /// Compiles the policies of a topic.
    ///
    /// - `validator`: `"none"` | `"json"` | `"json-schema"`;
    /// - `schema`: inline JSON schema text, required for `json-schema` and
    ///   for the `binary` serializer; when given it is always checked;
    /// - `selector`: `"round-robin"` | `"hash:<field>"` (`field` is a
    ///   top-level key, or a JSON pointer starting with `/`) | `"explicit"`;
    /// - `serializer`: `"json"` | `"binary"`.
    pub fn new(
        validator: &str,
        schema: Option<&str>,
        selector: &str,
        serializer: &str,
    ) -> Result<Self, PolicyError> {
        let schema_value = match schema {
            Some(text) => Some(
                serde_json::from_str::<Value>(text)
                    .map_err(|e| PolicyError::BadSpec(format!("schema is not JSON: {e}")))?,
            ),
            None => None,
        };
        let validator_policy = Validator::new(validator, schema_value.as_ref())?;
        let selector_policy = Selector::parse(selector)?;
        let serializer_policy = match serializer {
            "json" => Serializer::Json,
            "binary" => {
                let Some(schema) = schema_value.as_ref() else {
                    return Err(PolicyError::BadSpec(
                        "the binary serializer needs a JSON schema (--schema)".into(),
                    ));
                };
                Serializer::Binary(binary::Shape::compile(schema)?)
            }
            other => {
                return Err(PolicyError::BadSpec(format!(
                    "unknown serializer '{other}' (expected 'json' or 'binary')"
                )))
            }
        };
        Ok(TopicPolicy {
            validator: validator_policy,
            selector: selector_policy,
            serializer: serializer_policy,
            spec: PolicySpec {
                validator: validator.to_owned(),
                schema: schema.map(str::to_owned),
                selector: selector.to_owned(),
                serializer: serializer.to_owned(),
            },
        })
    }

    /// The specification strings this policy was built from.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// Validates, selects a partition for, and serializes one event's
    /// metadata; returns `(partition, encoded bytes)`.
    ///
    /// `explicit` is the partition the producer named. It is required by the
    /// `explicit` selector and, when given, honoured by every selector; it
    /// must be `< partitions`.
    ///
    /// Raw JSON input is parsed only when a policy needs the value (the
    /// `json-schema` validator, the `hash` selector without `explicit`, the
    /// `binary` serializer); text that does not parse is then rejected as
    /// [`PolicyError::InvalidMetadata`] with rule `json`, whatever the
    /// validator. With the `json` serializer, raw input is returned as given
    /// (same `Bytes`), never re-serialized.
    pub fn prepare(
        &self,
        metadata: MetadataInput,
        explicit: Option<u32>,
        partitions: u32,
    ) -> Result<(u32, Bytes), PolicyError> {
        if partitions == 0 {
            return Err(PolicyError::Selection("topic has no partitions".into()));
        }
        let needs_value = self.validator.needs_value()
            || matches!(self.serializer, Serializer::Binary(_))
            || (explicit.is_none() && self.selector.needs_value());
        let (value, raw) = match metadata {
            MetadataInput::Json(raw) if !needs_value => {
                self.validator.check_raw(&raw)?;
                let partition = self.selector.select(None, explicit, partitions)?;
                return Ok((partition, raw));
            }
            MetadataInput::Json(raw) => {
                let value = serde_json::from_slice::<Value>(&raw)
                    .map_err(|e| PolicyError::invalid("json", "", e.to_string()))?;
                (value, Some(raw))
            }
            MetadataInput::Value(value) => (value, None),
        };
        self.validator.check_value(&value)?;
        let partition = self.selector.select(Some(&value), explicit, partitions)?;
        let encoded = match &self.serializer {
            Serializer::Json => match raw {
                Some(raw) => raw,
                None => Bytes::from(
                    serde_json::to_vec(&value).map_err(|e| PolicyError::Encode(e.to_string()))?,
                ),
            },
            Serializer::Binary(shape) => Bytes::from(shape.encode(&value)?),
        };
        Ok((partition, encoded))
    }

    /// Inverse of serialization: encoded metadata -> JSON value.
    pub fn decode(&self, encoded: &[u8]) -> Result<Value, PolicyError> {
        match &self.serializer {
            Serializer::Json => serde_json::from_slice(encoded)
                .map_err(|e| PolicyError::Decode(format!("invalid JSON: {e}"))),
            Serializer::Binary(shape) => shape.decode(encoded),
        }
    }

    /// True when encoded metadata is JSON text, so callers may hand it to
    /// users without decoding.
    pub fn serializer_is_json(&self) -> bool {
        matches!(self.serializer, Serializer::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_policy_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TopicPolicy>();
    }

    #[test]
    fn error_codes_are_stable() {
        assert_eq!(PolicyError::invalid("json", "", "x").code(), 400);
        assert_eq!(PolicyError::BadSpec(String::new()).code(), 401);
        assert_eq!(PolicyError::Selection(String::new()).code(), 402);
        assert_eq!(PolicyError::Encode(String::new()).code(), 403);
        assert_eq!(PolicyError::Decode(String::new()).code(), 404);
    }

    #[test]
    fn unknown_policy_names_are_bad_specs() {
        for (v, s, sel, ser) in [
            ("strict", None, "round-robin", "json"),
            ("none", None, "random", "json"),
            ("none", None, "hash:", "json"),
            ("none", None, "round-robin", "avro"),
            ("none", None, "round-robin", "binary"),
            ("json-schema", None, "round-robin", "json"),
            ("json-schema", Some("{not json"), "round-robin", "json"),
            (
                "json-schema",
                Some(r#"{"type":"nope"}"#),
                "round-robin",
                "json",
            ),
            (
                "json-schema",
                Some(r#"{"minimum":"zero"}"#),
                "round-robin",
                "json",
            ),
        ] {
            let err = TopicPolicy::new(v, s, sel, ser).unwrap_err();
            assert_eq!(err.code(), 401, "{v} {s:?} {sel} {ser}: {err}");
        }
    }

    #[test]
    fn spec_is_kept_verbatim() {
        let p = TopicPolicy::new("json", None, "hash:id", "json").unwrap();
        assert_eq!(p.spec().selector, "hash:id");
        assert_eq!(p.spec().schema, None);
    }
}
