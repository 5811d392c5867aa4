//! The mapping between Kafka records and Strom events (docs/kafka.md).
//!
//! - Kafka → Strom: the record's value is the event's data; its key,
//!   headers and timestamp go into the event's metadata, a JSON object
//!   `{"kafka": {"key": K, "headers": [[NAME, V], ...], "timestamp_ms": T}}`
//!   where a key or value is a string when it is UTF-8, `{"base64": "..."}`
//!   otherwise, and `null` when absent. A null value is stored as empty
//!   data with `"null_value": true`.
//!   A record with no key whose only header is `strom.meta` (what a
//!   native event reads back as, and what strom-client's Kafka backend
//!   writes) is the inverse: that header's bytes are the metadata.
//! - A compressed topic's data parts are compression frames: a record's
//!   value is framed with the topic's codec on produce, and a frame is
//!   decoded into the record's value on fetch (`strom_policy::frame`).
//! - Strom → Kafka: an event whose metadata has that shape comes back as
//!   the record it was; any other event comes out with its metadata as the
//!   header `strom.meta` (bytes as stored), no key, its data as the value
//!   and the batch's timestamp.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use strom_policy::frame::FrameCodec;

use crate::records::InRecord;

/// The header that carries a native event's metadata.
pub const META_HEADER: &str = "strom.meta";

fn to_json(b: &Option<Bytes>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Value::String(s.to_owned()),
            Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
        },
    }
}

fn from_json(v: &Value) -> Option<Option<Bytes>> {
    match v {
        Value::Null => Some(None),
        Value::String(s) => Some(Some(Bytes::copy_from_slice(s.as_bytes()))),
        Value::Object(o) => {
            let s = o.get("base64")?.as_str()?;
            let b = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
            Some(Some(Bytes::from(b)))
        }
        _ => None,
    }
}

/// How a topic's data parts are framed (docs/compression.md): `None` for
/// a topic not compressed (or not hosted here).
pub fn topic_codec(svc: &strom_server::Services, topic: &str) -> Option<FrameCodec> {
    let spec = svc.data.host().spec(topic)?;
    match strom_proto::Compression::parse(&spec.compression).ok()? {
        strom_proto::Compression::None => None,
        strom_proto::Compression::Zstd(l) => Some(FrameCodec::Zstd(l)),
        strom_proto::Compression::Lz4(l) => Some(FrameCodec::Lz4(l)),
    }
}

/// The metadata of the event a record becomes.
pub fn record_meta(r: &InRecord) -> Vec<u8> {
    if let (None, [(name, Some(meta))]) = (&r.key, r.headers.as_slice()) {
        if name.as_ref() == META_HEADER.as_bytes() {
            return meta.to_vec();
        }
    }
    let headers: Vec<Value> = r
        .headers
        .iter()
        .map(|(n, v)| Value::Array(vec![to_json(&Some(n.clone())), to_json(v)]))
        .collect();
    let mut k = Map::new();
    k.insert("key".into(), to_json(&r.key));
    k.insert("headers".into(), Value::Array(headers));
    k.insert("timestamp_ms".into(), json!(r.timestamp_ms));
    if r.value.is_none() {
        k.insert("null_value".into(), Value::Bool(true));
    }
    let mut top = Map::new();
    top.insert("kafka".into(), Value::Object(k));
    // Serializing a Value of strings and numbers cannot fail.
    serde_json::to_vec(&Value::Object(top)).unwrap_or_default()
}

/// A stored event seen as a Kafka record.
#[derive(Debug, PartialEq, Eq)]
pub struct OutRecord {
    pub timestamp_ms: Option<i64>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// Reads back an event's metadata: the record it came from, or a native
/// event with its metadata as the `strom.meta` header.
pub fn event_record(meta: &Bytes, data: Bytes) -> OutRecord {
    if let Some(r) = kafka_shaped(meta, &data) {
        return r;
    }
    OutRecord {
        timestamp_ms: None,
        key: None,
        value: Some(data),
        headers: vec![(
            Bytes::from_static(META_HEADER.as_bytes()),
            Some(meta.clone()),
        )],
    }
}

fn kafka_shaped(meta: &Bytes, data: &Bytes) -> Option<OutRecord> {
    // Cheap test first: native metadata rarely starts like this.
    if !meta.starts_with(b"{\"kafka\":") {
        return None;
    }
    let v: Value = serde_json::from_slice(meta).ok()?;
    let top = v.as_object()?;
    if top.len() != 1 {
        return None;
    }
    let k = top.get("kafka")?.as_object()?;
    let key = from_json(k.get("key").unwrap_or(&Value::Null))?;
    let mut headers = Vec::new();
    for h in k.get("headers")?.as_array()? {
        let pair = h.as_array()?;
        if pair.len() != 2 {
            return None;
        }
        headers.push((from_json(&pair[0])??, from_json(&pair[1])?));
    }
    let null_value = k
        .get("null_value")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Some(OutRecord {
        timestamp_ms: k.get("timestamp_ms").and_then(Value::as_i64),
        key,
        value: (!null_value).then(|| data.clone()),
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_metadata() {
        let r = InRecord {
            timestamp_ms: 1234,
            key: Some(Bytes::from_static(b"key-1")),
            value: Some(Bytes::from_static(b"value")),
            headers: vec![
                (Bytes::from_static(b"a"), Some(Bytes::from_static(b"1"))),
                (
                    Bytes::from_static(b"bin"),
                    Some(Bytes::from_static(&[0xff, 0])),
                ),
                (Bytes::from_static(b"nul"), None),
            ],
        };
        let meta = Bytes::from(record_meta(&r));
        let back = event_record(&meta, r.value.clone().unwrap());
        assert_eq!(back.key, r.key);
        assert_eq!(back.value, r.value);
        assert_eq!(back.headers, r.headers);
        assert_eq!(back.timestamp_ms, Some(1234));
    }

    #[test]
    fn a_record_carrying_only_the_meta_header_stores_it_as_the_metadata() {
        let meta = Bytes::from_static(br#"{"step": 3}"#);
        let r = InRecord {
            timestamp_ms: 1234,
            key: None,
            value: Some(Bytes::from_static(b"data")),
            headers: vec![(Bytes::from_static(b"strom.meta"), Some(meta.clone()))],
        };
        assert_eq!(record_meta(&r), meta.to_vec(), "exact metadata bytes");
        let back = event_record(&Bytes::from(record_meta(&r)), Bytes::from_static(b"data"));
        assert_eq!(back.headers, r.headers, "and it reads back as it came");
        // A key or a second header keeps the record's own shape.
        let keyed = InRecord {
            key: Some(Bytes::from_static(b"k")),
            ..r
        };
        assert!(record_meta(&keyed).starts_with(b"{\"kafka\":"));
    }

    #[test]
    fn a_native_event_carries_its_metadata_as_a_header() {
        let meta = Bytes::from_static(br#"{"step":3}"#);
        let back = event_record(&meta, Bytes::from_static(b"data"));
        assert_eq!(back.key, None);
        assert_eq!(back.value.as_deref(), Some(&b"data"[..]));
        assert_eq!(
            back.headers,
            vec![(Bytes::from_static(b"strom.meta"), Some(meta))]
        );
    }
}
