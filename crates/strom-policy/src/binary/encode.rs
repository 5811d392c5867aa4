//! Schema-driven encoder of the binary serializer (format in the parent
//! module). Errors name the offending field as a JSON pointer.

use serde_json::{Number, Value};

use super::wire::{put_len, put_varint, zigzag};
use super::{ObjectShape, Shape, MAX_ZERO_WIDTH_ITEMS};
use crate::PolicyError;

/// One step of the path from the root to the value being encoded; built on
/// the stack and only rendered when an error occurs.
pub struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn pointer(path: Option<&Path<'_>>) -> String {
    let mut segments = Vec::new();
    let mut cur = path;
    while let Some(p) = cur {
        segments.push(match p.segment {
            Segment::Key(k) => k.replace('~', "~0").replace('/', "~1"),
            Segment::Index(i) => i.to_string(),
        });
        cur = p.parent;
    }
    segments.iter().rev().fold(String::new(), |mut acc, s| {
        acc.push('/');
        acc.push_str(s);
        acc
    })
}

fn mismatch(path: Option<&Path<'_>>, expected: &str, value: &Value) -> PolicyError {
    let got = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    PolicyError::Encode(format!(
        "field '{}': schema type is {expected}, value is {got}",
        pointer(path)
    ))
}

/// The integer a JSON number denotes, if any (an integral float counts).
fn integer_of(n: &Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = n.as_u64() {
        return Some(u.into());
    }
    // 2^63 bounds keep the cast exact and inside i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && (-LIMIT..LIMIT).contains(&f) => Some(f as i64 as i128),
        _ => None,
    }
}

fn put_json(out: &mut Vec<u8>, value: &Value, path: Option<&Path<'_>>) -> Result<(), PolicyError> {
    let text = serde_json::to_vec(value)
        .map_err(|e| PolicyError::Encode(format!("field '{}': {e}", pointer(path))))?;
    put_len(out, text.len());
    out.extend_from_slice(&text);
    Ok(())
}

/// Appends the encoding of `value` by `shape` to `out`. `nulls_left` is
/// how many more items arrays of nulls may hold in this encoding (they take
/// no bytes, so the decoder caps their total: [`MAX_ZERO_WIDTH_ITEMS`]).
pub fn encode(
    shape: &Shape,
    value: &Value,
    out: &mut Vec<u8>,
    path: Option<&Path<'_>>,
    nulls_left: &mut u64,
) -> Result<(), PolicyError> {
    match (shape, value) {
        (Shape::Integer, Value::Number(n)) => match integer_of(n) {
            Some(i) => put_varint(out, zigzag(i)),
            None => return Err(mismatch(path, "integer", value)),
        },
        (Shape::Number, Value::Number(n)) => match (n.is_f64(), n.as_f64(), integer_of(n)) {
            (false, _, Some(i)) => {
                out.push(1);
                put_varint(out, zigzag(i));
            }
            (_, Some(f), _) => {
                out.push(0);
                out.extend_from_slice(&f.to_le_bytes());
            }
            _ => return Err(mismatch(path, "number", value)),
        },
        (Shape::String, Value::String(s)) => {
            put_len(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
        (Shape::Boolean, Value::Bool(b)) => out.push(u8::from(*b)),
        (Shape::Null, Value::Null) => {}
        (Shape::Array(items), Value::Array(values)) => {
            if **items == Shape::Null {
                match nulls_left.checked_sub(values.len() as u64) {
                    Some(left) => *nulls_left = left,
                    None => {
                        return Err(PolicyError::Encode(format!(
                            "field '{}': arrays of nulls are limited to \
                             {MAX_ZERO_WIDTH_ITEMS} items in all",
                            pointer(path)
                        )))
                    }
                }
            }
            put_len(out, values.len());
            for (i, item) in values.iter().enumerate() {
                let here = Path {
                    parent: path,
                    segment: Segment::Index(i),
                };
                encode(items, item, out, Some(&here), nulls_left)?;
            }
        }
        (Shape::Object(obj), Value::Object(_)) => encode_object(obj, value, out, path, nulls_left)?,
        (Shape::Any, _) => put_json(out, value, path)?,
        (expected, _) => {
            let name = match expected {
                Shape::Integer => "integer",
                Shape::Number => "number",
                Shape::String => "string",
                Shape::Boolean => "boolean",
                Shape::Null => "null",
                Shape::Array(_) => "array",
                Shape::Object(_) | Shape::Any => "object",
            };
            return Err(mismatch(path, name, value));
        }
    }
    Ok(())
}

fn encode_object(
    obj: &ObjectShape,
    value: &Value,
    out: &mut Vec<u8>,
    path: Option<&Path<'_>>,
    nulls_left: &mut u64,
) -> Result<(), PolicyError> {
    let Value::Object(map) = value else {
        return Err(mismatch(path, "object", value));
    };
    // 1. Presence bitmap of the optional fields.
    let bitmap_at = out.len();
    out.resize(bitmap_at + obj.bitmap_len(), 0);
    let mut known = 0usize;
    for field in &obj.fields {
        let present = map.get(&field.name);
        if present.is_some() {
            known += 1;
        }
        match (field.bit, present) {
            (Some(bit), Some(_)) => {
                if let Some(byte) = out.get_mut(bitmap_at + bit / 8) {
                    *byte |= 1 << (bit % 8);
                }
            }
            (None, None) => {
                return Err(PolicyError::Encode(format!(
                    "field '{}': required property '{}' is missing",
                    pointer(path),
                    field.name
                )))
            }
            _ => {}
        }
    }
    // 2. Field values in sorted key order.
    for field in &obj.fields {
        if let Some(v) = map.get(&field.name) {
            let here = Path {
                parent: path,
                segment: Segment::Key(&field.name),
            };
            encode(&field.shape, v, out, Some(&here), nulls_left)?;
        }
    }
    // 3. Extras: members the schema does not list, as one compact JSON object.
    if known == map.len() {
        out.push(0);
        return Ok(());
    }
    let mut extras = Vec::with_capacity(64);
    extras.push(b'{');
    let mut first = true;
    for (k, v) in map {
        if obj.field(k).is_some() {
            continue;
        }
        if !first {
            extras.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut extras, k)
            .and_then(|()| {
                extras.push(b':');
                serde_json::to_writer(&mut extras, v)
            })
            .map_err(|e| PolicyError::Encode(format!("field '{}': {e}", pointer(path))))?;
    }
    extras.push(b'}');
    put_len(out, extras.len());
    out.extend_from_slice(&extras);
    Ok(())
}
