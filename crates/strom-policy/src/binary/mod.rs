//! The `binary` serializer: a compact metadata encoding driven by the
//! topic's JSON schema. Both sides compile the same schema into a [`Shape`],
//! so field names and types are never written for schema-known fields.
//!
//! # Format
//!
//! `varint` is unsigned LEB128 (7 bits per byte, low group first, high bit =
//! "more"), at most 10 bytes. An encoding is the root value encoded by the
//! root shape, with no trailing bytes. Per shape:
//!
//! | schema                                    | encoding                                                            |
//! |-------------------------------------------|---------------------------------------------------------------------|
//! | `"type":"integer"`                        | zigzag varint of the value (`(n << 1) ^ (n >> 127)` on i128); any i64 or u64; an integral float such as `3.0` is written as the integer `3` |
//! | `"type":"number"`                         | tag byte, then `0`: f64 little-endian (8 bytes), or `1`: zigzag varint (integers stay integers) |
//! | `"type":"string"`                         | varint byte length + UTF-8                                          |
//! | `"type":"boolean"`                        | one byte, `0` or `1`                                                |
//! | `"type":"null"`                           | nothing                                                             |
//! | `"type":"array"`                          | varint count + each item by the `items` shape (no `items`, tuple `items` or `prefixItems`: items are "any") |
//! | `"type":"object"`                         | see below                                                           |
//! | anything else ("any")                     | varint length + compact JSON text: no `type`, a type list with several entries, `oneOf`/`anyOf`-only schemas, `true`, ... |
//!
//! A `type` list with exactly one entry counts as that single type.
//!
//! An object is encoded as:
//!
//! 1. a presence bitmap of `ceil(k / 8)` bytes, where `k` is the number of
//!    optional properties (those in `properties` but not in `required`):
//!    bit `i % 8` of byte `i / 8` is set when the `i`-th optional property,
//!    in sorted key order, is present; unused bits are zero;
//! 2. the values of the properties in sorted (byte-wise) key order: required
//!    ones always, optional ones only when their bit is set;
//! 3. the *extras*: varint length + compact JSON object holding every member
//!    that is not in `properties` (length 0 when there is none).
//!
//! A missing required property, or a value whose JSON type does not match
//! its schema type, is an encode error naming the field (JSON pointer).
//!
//! Decoding is hostile-input safe: every varint and length is checked
//! against the remaining bytes before use, counts never size an allocation
//! beyond the remaining input, arrays of nulls hold at most
//! [`MAX_ZERO_WIDTH_ITEMS`] items in all, nesting follows the (depth-capped) schema,
//! and truncated input, bad tags, invalid UTF-8, non-finite floats, extras
//! that repeat a schema property and trailing bytes are decode errors.

mod decode;
mod encode;
mod wire;

use serde_json::{Map, Value};

use crate::PolicyError;

/// Deepest schema nesting the binary serializer accepts.
pub const MAX_DEPTH: usize = 64;

/// Most items that arrays of zero-width (`null`) items may hold in one
/// encoding, all such arrays together, since their lengths cannot be
/// checked against the remaining bytes.
pub const MAX_ZERO_WIDTH_ITEMS: u64 = 1 << 16;

/// The binary layout of one schema position.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    Integer,
    Number,
    String,
    Boolean,
    Null,
    Array(Box<Shape>),
    Object(ObjectShape),
    /// No single concrete type: compact JSON text.
    Any,
}

/// The layout of an object schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectShape {
    /// The `properties`, sorted by key.
    pub fields: Vec<Field>,
    /// How many fields are optional (bits in the presence bitmap).
    pub optional: usize,
}

/// One schema property of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    /// `None` for a required field, `Some(bit)` for an optional one.
    pub bit: Option<usize>,
    pub shape: Shape,
}

impl ObjectShape {
    fn bitmap_len(&self) -> usize {
        self.optional.div_ceil(8)
    }

    fn field(&self, name: &str) -> Option<&Field> {
        self.fields
            .binary_search_by(|f| f.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.fields.get(i))
    }
}

impl Shape {
    /// Compiles a JSON schema into its binary layout.
    pub fn compile(schema: &Value) -> Result<Shape, PolicyError> {
        compile_at(schema, 0)
    }

    /// Encodes `value`; errors name the offending field.
    pub fn encode(&self, value: &Value) -> Result<Vec<u8>, PolicyError> {
        let mut out = Vec::with_capacity(64);
        let mut nulls_left = MAX_ZERO_WIDTH_ITEMS;
        encode::encode(self, value, &mut out, None, &mut nulls_left)?;
        Ok(out)
    }

    /// Decodes one complete encoding; trailing bytes are an error.
    pub fn decode(&self, bytes: &[u8]) -> Result<Value, PolicyError> {
        let mut reader = wire::Reader::new(bytes);
        let mut nulls_left = MAX_ZERO_WIDTH_ITEMS;
        let value = decode::decode(self, &mut reader, 0, &mut nulls_left)?;
        if !reader.is_empty() {
            return Err(PolicyError::Decode(format!(
                "{} trailing bytes after the value (at byte {})",
                reader.remaining(),
                reader.position()
            )));
        }
        Ok(value)
    }
}

fn compile_at(schema: &Value, depth: usize) -> Result<Shape, PolicyError> {
    if depth > MAX_DEPTH {
        return Err(PolicyError::BadSpec(format!(
            "schema nests deeper than {MAX_DEPTH} levels; the binary serializer cannot use it"
        )));
    }
    let Value::Object(map) = schema else {
        return Ok(Shape::Any);
    };
    let ty = match map.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(list)) if list.len() == 1 => match list.first().and_then(Value::as_str) {
            Some(t) => t,
            None => return Ok(Shape::Any),
        },
        _ => return Ok(Shape::Any),
    };
    Ok(match ty {
        "integer" => Shape::Integer,
        "number" => Shape::Number,
        "string" => Shape::String,
        "boolean" => Shape::Boolean,
        "null" => Shape::Null,
        "array" => {
            let items = match (map.get("items"), map.get("prefixItems")) {
                (Some(items @ (Value::Object(_) | Value::Bool(_))), None) => {
                    compile_at(items, depth + 1)?
                }
                _ => Shape::Any,
            };
            Shape::Array(Box::new(items))
        }
        "object" => Shape::Object(compile_object(map, depth)?),
        _ => Shape::Any,
    })
}

fn compile_object(map: &Map<String, Value>, depth: usize) -> Result<ObjectShape, PolicyError> {
    let required: Vec<&str> = match map.get("required") {
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let mut fields = Vec::new();
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, sub) in props {
            fields.push(Field {
                name: name.clone(),
                bit: if required.contains(&name.as_str()) {
                    None
                } else {
                    Some(0)
                },
                shape: compile_at(sub, depth + 1)?,
            });
        }
    }
    fields.sort_by(|a, b| a.name.cmp(&b.name));
    let mut optional = 0;
    for field in &mut fields {
        if field.bit.is_some() {
            field.bit = Some(optional);
            optional += 1;
        }
    }
    Ok(ObjectShape { fields, optional })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compile_sorts_fields_and_numbers_optional_bits() {
        let shape = Shape::compile(&json!({
            "type": "object",
            "required": ["z"],
            "properties": {"z": {"type": "string"}, "b": {}, "a": {"type": ["integer"]}}
        }))
        .unwrap();
        let Shape::Object(obj) = shape else {
            panic!("expected an object shape")
        };
        let names: Vec<_> = obj.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "z"]);
        let bits: Vec<_> = obj.fields.iter().map(|f| f.bit).collect();
        assert_eq!(bits, [Some(0), Some(1), None]);
        assert_eq!(obj.fields[0].shape, Shape::Integer);
        assert_eq!(obj.fields[1].shape, Shape::Any);
    }

    #[test]
    fn type_lists_and_combinators_are_any() {
        for schema in [
            json!({"type": ["string", "null"]}),
            json!({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
            json!(true),
            json!({"type": "array", "prefixItems": [{"type": "integer"}]}),
        ] {
            let shape = Shape::compile(&schema).unwrap();
            assert!(
                matches!(shape, Shape::Any) || shape == Shape::Array(Box::new(Shape::Any)),
                "{schema}: {shape:?}"
            );
        }
    }

    #[test]
    fn over_deep_schemas_are_rejected() {
        let mut schema = json!({"type": "integer"});
        for _ in 0..=MAX_DEPTH {
            schema = json!({"type": "array", "items": schema});
        }
        assert_eq!(Shape::compile(&schema).unwrap_err().code(), 401);
    }
}
