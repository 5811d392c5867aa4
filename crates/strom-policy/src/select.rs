//! Partition selectors: `round-robin`, `hash:<field>` and `explicit`.
//!
//! # The stable hash
//!
//! `hash:<field>` must place a key on the same partition from every
//! language, so the hash is specified here and pinned by tests:
//!
//! 1. Take the field value (`<field>` is a top-level key, or a JSON pointer
//!    when it starts with `/`).
//! 2. Bytes: a string contributes its UTF-8 without quotes; any other value
//!    contributes its compact JSON text as `serde_json` writes it (no
//!    whitespace; object keys sorted by byte order; integers in decimal such
//!    as `5` or `-3`, floats in shortest round-trip form such as `2.5`).
//! 3. FNV-1a 64-bit over those bytes (offset basis `0xcbf29ce484222325`,
//!    prime `0x100000001b3`).
//! 4. Partition = `hash % partitions`.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::PolicyError;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64-bit hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a(FNV_OFFSET);
    h.update(bytes);
    h.0
}

/// Streaming FNV-1a state; also an `io::Write` sink so values can be
/// hashed while being serialized, without a buffer.
struct Fnv1a(u64);

impl Fnv1a {
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

impl io::Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes `value` as compact JSON with object keys sorted, so the hash does
/// not depend on the map implementation `serde_json` was built with.
fn write_canonical(out: &mut Fnv1a, value: &Value) {
    match value {
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(out, item);
            }
            out.update(b"]");
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.update(b"{");
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                // Writing into an infallible sink cannot fail.
                let _ = serde_json::to_writer(&mut *out, k);
                out.update(b":");
                write_canonical(out, v);
            }
            out.update(b"}");
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// The stable hash used by `hash:<field>` (see the module documentation):
/// FNV-1a 64-bit over the value's bytes (strings: UTF-8 without quotes;
/// other values: compact JSON), then `% partitions`. Returns 0 when
/// `partitions` is 0.
pub fn hash_partition(value: &Value, partitions: u32) -> u32 {
    if partitions == 0 {
        return 0;
    }
    let mut h = Fnv1a(FNV_OFFSET);
    match value {
        Value::String(s) => h.update(s.as_bytes()),
        other => write_canonical(&mut h, other),
    }
    // The remainder is < partitions, so it fits in u32.
    (h.0 % u64::from(partitions)) as u32
}

/// A compiled partition selector.
#[derive(Debug)]
pub enum Selector {
    /// Cycles through partitions with an internal atomic counter.
    RoundRobin(AtomicU64),
    /// Hashes a metadata field: a top-level key, or a JSON pointer.
    Hash(HashField),
    /// The producer names the partition of every event.
    Explicit,
}

/// The field a `hash:` selector reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashField {
    Key(String),
    Pointer(String),
}

impl Selector {
    /// Parses `round-robin`, `hash:<field>` or `explicit`.
    pub fn parse(spec: &str) -> Result<Self, PolicyError> {
        match spec {
            "round-robin" => Ok(Selector::RoundRobin(AtomicU64::new(0))),
            "explicit" => Ok(Selector::Explicit),
            _ => match spec.strip_prefix("hash:") {
                Some("") => Err(PolicyError::BadSpec(
                    "hash selector needs a field: 'hash:<key>' or 'hash:/json/pointer'".into(),
                )),
                Some(field) if field.starts_with('/') => {
                    Ok(Selector::Hash(HashField::Pointer(field.to_owned())))
                }
                Some(field) => Ok(Selector::Hash(HashField::Key(field.to_owned()))),
                None => Err(PolicyError::BadSpec(format!(
                    "unknown partition selector '{spec}' \
                     (expected 'round-robin', 'hash:<field>' or 'explicit')"
                ))),
            },
        }
    }

    /// True when selection without an explicit partition reads the metadata.
    pub fn needs_value(&self) -> bool {
        matches!(self, Selector::Hash(_))
    }

    /// Chooses the partition of one event. `explicit`, when given, wins for
    /// every selector. `value` is needed only by the hash selector.
    pub fn select(
        &self,
        value: Option<&Value>,
        explicit: Option<u32>,
        partitions: u32,
    ) -> Result<u32, PolicyError> {
        if partitions == 0 {
            return Err(PolicyError::Selection("topic has no partitions".into()));
        }
        if let Some(p) = explicit {
            if p >= partitions {
                return Err(PolicyError::Selection(format!(
                    "partition {p} is out of range: the topic has {partitions} partitions"
                )));
            }
            return Ok(p);
        }
        match self {
            Selector::RoundRobin(counter) => {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                Ok((n % u64::from(partitions)) as u32)
            }
            Selector::Explicit => Err(PolicyError::Selection(
                "the topic uses the explicit selector: name a partition for every event".into(),
            )),
            Selector::Hash(field) => {
                let Some(value) = value else {
                    return Err(PolicyError::Selection(
                        "hash selector needs parsed metadata".into(),
                    ));
                };
                if !value.is_object() {
                    return Err(PolicyError::Selection(
                        "hash selector needs object metadata".into(),
                    ));
                }
                let (found, name) = match field {
                    HashField::Key(k) => (value.get(k), k),
                    HashField::Pointer(p) => (value.pointer(p), p),
                };
                match found {
                    Some(v) => Ok(hash_partition(v, partitions)),
                    None => Err(PolicyError::Selection(format!(
                        "hash field '{name}' is missing from the metadata"
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn strings_hash_without_quotes_and_others_as_compact_json() {
        let p = 1_000_003;
        let expect = |b: &[u8]| (fnv1a64(b) % p as u64) as u32;
        assert_eq!(hash_partition(&json!("foobar"), p), expect(b"foobar"));
        assert_eq!(hash_partition(&json!(42), p), expect(b"42"));
        assert_eq!(hash_partition(&json!(-2.5), p), expect(b"-2.5"));
        assert_eq!(hash_partition(&json!(true), p), expect(b"true"));
        assert_eq!(hash_partition(&json!(null), p), expect(b"null"));
        assert_eq!(
            hash_partition(&json!({"b": [1, "x"], "a": {}}), p),
            expect(br#"{"a":{},"b":[1,"x"]}"#)
        );
    }

    #[test]
    fn zero_partitions_never_divides_by_zero() {
        assert_eq!(hash_partition(&json!("k"), 0), 0);
        let s = Selector::parse("round-robin").unwrap();
        assert!(s.select(None, None, 0).is_err());
    }

    #[test]
    fn hash_spec_distinguishes_keys_and_pointers() {
        assert!(matches!(
            Selector::parse("hash:/a/b").unwrap(),
            Selector::Hash(HashField::Pointer(p)) if p == "/a/b"
        ));
        assert!(matches!(
            Selector::parse("hash:user").unwrap(),
            Selector::Hash(HashField::Key(k)) if k == "user"
        ));
    }
}
