//! Schema-driven decoder of the binary serializer (format in the parent
//! module). Input is untrusted: every length is checked before use, counts
//! never size an allocation beyond the remaining input, and nesting is capped.

use serde_json::{Map, Number, Value};

use super::wire::{unzigzag, Reader};
use super::{ObjectShape, Shape, MAX_DEPTH, MAX_ZERO_WIDTH_ITEMS};
use crate::PolicyError;

fn integer(r: &mut Reader<'_>) -> Result<Value, PolicyError> {
    let start = r.position();
    let n = unzigzag(r.varint("integer")?);
    if let Ok(i) = i64::try_from(n) {
        Ok(Value::from(i))
    } else if let Ok(u) = u64::try_from(n) {
        Ok(Value::from(u))
    } else {
        Err(PolicyError::Decode(format!(
            "integer at byte {start} is outside the i64/u64 range"
        )))
    }
}

/// Decodes one value of `shape` at nesting `depth`. `nulls_left` is how
/// many more items arrays of nulls may hold in this encoding: they take no
/// input bytes, so without a total cap a few bytes per array could make
/// each of many arrays [`MAX_ZERO_WIDTH_ITEMS`] long.
pub fn decode(
    shape: &Shape,
    r: &mut Reader<'_>,
    depth: usize,
    nulls_left: &mut u64,
) -> Result<Value, PolicyError> {
    if depth > MAX_DEPTH {
        return Err(PolicyError::Decode(format!(
            "nesting deeper than {MAX_DEPTH} levels"
        )));
    }
    match shape {
        Shape::Integer => integer(r),
        Shape::Number => {
            let at = r.position();
            match r.byte("number tag")? {
                0 => {
                    let le: [u8; 8] = r.take(8, "f64")?.try_into().map_err(|_| {
                        PolicyError::Decode(format!("short f64 at byte {}", at + 1))
                    })?;
                    Number::from_f64(f64::from_le_bytes(le))
                        .map(Value::Number)
                        .ok_or_else(|| {
                            PolicyError::Decode(format!("non-finite number at byte {at}"))
                        })
                }
                1 => integer(r),
                tag => Err(PolicyError::Decode(format!(
                    "unknown number tag {tag} at byte {at}"
                ))),
            }
        }
        Shape::String => {
            let len = r.len("string length")?;
            let at = r.position();
            let raw = r.take(len, "string")?;
            std::str::from_utf8(raw)
                .map(|s| Value::String(s.to_owned()))
                .map_err(|e| PolicyError::Decode(format!("string at byte {at}: {e}")))
        }
        Shape::Boolean => {
            let at = r.position();
            match r.byte("boolean")? {
                0 => Ok(Value::Bool(false)),
                1 => Ok(Value::Bool(true)),
                b => Err(PolicyError::Decode(format!(
                    "boolean byte {b} at byte {at} is neither 0 nor 1"
                ))),
            }
        }
        Shape::Null => Ok(Value::Null),
        Shape::Array(items) => {
            let at = r.position();
            let count = r.varint("array count")?;
            // Every item but a null takes at least one byte.
            let zero_width = **items == Shape::Null;
            let limit = if zero_width {
                *nulls_left
            } else {
                r.remaining() as u64
            };
            let count = match u64::try_from(count) {
                Ok(c) if c <= limit => c as usize,
                _ if zero_width => {
                    return Err(PolicyError::Decode(format!(
                        "array count {count} at byte {at} exceeds the {limit} null items left \
                         of the {MAX_ZERO_WIDTH_ITEMS} allowed in one encoding"
                    )))
                }
                _ => {
                    return Err(PolicyError::Decode(format!(
                        "array count {count} at byte {at} exceeds the limit {limit}"
                    )))
                }
            };
            if zero_width {
                *nulls_left -= count as u64;
            }
            // A null array's count is capped above; any other count is at
            // most the bytes that remain.
            let mut values = Vec::with_capacity(if zero_width {
                count
            } else {
                count.min(r.remaining())
            });
            for _ in 0..count {
                values.push(decode(items, r, depth + 1, nulls_left)?);
            }
            Ok(Value::Array(values))
        }
        Shape::Object(obj) => decode_object(obj, r, depth, nulls_left),
        Shape::Any => {
            let len = r.len("JSON length")?;
            let at = r.position();
            let raw = r.take(len, "JSON text")?;
            serde_json::from_slice(raw)
                .map_err(|e| PolicyError::Decode(format!("JSON text at byte {at}: {e}")))
        }
    }
}

fn decode_object(
    obj: &ObjectShape,
    r: &mut Reader<'_>,
    depth: usize,
    nulls_left: &mut u64,
) -> Result<Value, PolicyError> {
    let at = r.position();
    let bitmap = r.take(obj.bitmap_len(), "presence bitmap")?;
    let used_in_last = obj.optional % 8;
    if used_in_last != 0 {
        if let Some(last) = bitmap.last() {
            if last >> used_in_last != 0 {
                return Err(PolicyError::Decode(format!(
                    "presence bitmap at byte {at} sets unused bits"
                )));
            }
        }
    }
    let mut map = Map::new();
    for field in &obj.fields {
        let present = match field.bit {
            None => true,
            Some(bit) => bitmap
                .get(bit / 8)
                .is_some_and(|byte| byte & (1 << (bit % 8)) != 0),
        };
        if present {
            let value = decode(&field.shape, r, depth + 1, nulls_left)?;
            map.insert(field.name.clone(), value);
        }
    }
    let len = r.len("extras length")?;
    if len > 0 {
        let at = r.position();
        let raw = r.take(len, "extras")?;
        let extras: Map<String, Value> = serde_json::from_slice(raw)
            .map_err(|e| PolicyError::Decode(format!("extras at byte {at}: {e}")))?;
        for (k, v) in extras {
            if obj.field(&k).is_some() || map.contains_key(&k) {
                return Err(PolicyError::Decode(format!(
                    "extras at byte {at} repeat the schema property '{k}'"
                )));
            }
            map.insert(k, v);
        }
    }
    Ok(Value::Object(map))
}
