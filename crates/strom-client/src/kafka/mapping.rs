//! Events as Kafka records, the same way Strom's Kafka front end maps them
//! (docs/kafka.md): the data is the record's value, the metadata travels
//! as the `strom.meta` header. A record without that header (written by
//! another Kafka client) reads back with the front end's metadata shape
//! `{"kafka": {"key", "headers", "timestamp_ms"}}`. End-of-stream markers
//! are records with a `strom.eos` header and are never events.

use base64::Engine as _;
use rdkafka::message::{Headers, Message};
use serde_json::{json, Map, Value};

/// The header that carries an event's metadata (bytes as stored).
pub const META_HEADER: &str = "strom.meta";

/// The header of an end-of-stream marker: `open:<id>` or `close:<id>`.
pub const EOS_HEADER: &str = "strom.eos";

/// An end-of-stream marker: a producer opened or closed its part of a
/// partition's stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Marker {
    Open(String),
    Close(String),
}

impl Marker {
    /// The header value: `open:<id>` or `close:<id>`.
    pub fn value(&self) -> String {
        match self {
            Marker::Open(id) => format!("open:{id}"),
            Marker::Close(id) => format!("close:{id}"),
        }
    }

    /// A marker header's value, or `None` if it is not one.
    pub fn parse(v: &[u8]) -> Option<Marker> {
        let s = std::str::from_utf8(v).ok()?;
        match s.split_once(':')? {
            ("open", id) => Some(Marker::Open(id.to_string())),
            ("close", id) => Some(Marker::Close(id.to_string())),
            _ => None,
        }
    }
}

/// What a record is to a Strom consumer.
pub enum Record {
    /// An event, with its metadata bytes.
    Event(Vec<u8>),
    Marker(Marker),
}

/// Reads a consumed record: a marker, or an event's metadata.
pub fn read<M: Message>(m: &M) -> Record {
    let headers = m.headers();
    if let Some(hs) = headers {
        for h in hs.iter() {
            match (h.key, h.value) {
                (EOS_HEADER, Some(v)) => {
                    if let Some(mk) = Marker::parse(v) {
                        return Record::Marker(mk);
                    }
                }
                (META_HEADER, Some(v)) if m.key().is_none() && hs.count() == 1 => {
                    return Record::Event(v.to_vec());
                }
                _ => {}
            }
        }
    }
    let pairs: Vec<Value> = headers
        .map(|hs| {
            hs.iter()
                .map(|h| Value::Array(vec![text(Some(h.key.as_bytes())), text(h.value)]))
                .collect()
        })
        .unwrap_or_default();
    let mut k = Map::new();
    k.insert("key".into(), text(m.key()));
    k.insert("headers".into(), Value::Array(pairs));
    k.insert("timestamp_ms".into(), json!(m.timestamp().to_millis()));
    if m.payload().is_none() {
        k.insert("null_value".into(), Value::Bool(true));
    }
    let mut top = Map::new();
    top.insert("kafka".into(), Value::Object(k));
    Record::Event(serde_json::to_vec(&Value::Object(top)).unwrap_or_default())
}

/// A key or header value as the front end writes it: a string when it is
/// UTF-8, `{"base64": "..."}` otherwise, `null` when absent.
fn text(b: Option<&[u8]>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Value::String(s.to_owned()),
            Err(_) => json!({ "base64": base64::engine::general_purpose::STANDARD.encode(b) }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    fn record(key: Option<&[u8]>, headers: &[(&str, &[u8])]) -> OwnedMessage {
        let mut hs = OwnedHeaders::new();
        for (k, v) in headers {
            hs = hs.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        OwnedMessage::new(
            Some(b"value".to_vec()),
            key.map(<[u8]>::to_vec),
            "t".into(),
            Timestamp::CreateTime(1234),
            0,
            7,
            Some(hs),
        )
    }

    #[test]
    fn the_meta_header_alone_is_the_events_metadata_byte_for_byte() {
        let m = record(None, &[(META_HEADER, br#"{"i": 1}"#)]);
        match read(&m) {
            Record::Event(meta) => assert_eq!(meta, br#"{"i": 1}"#),
            Record::Marker(mk) => panic!("not a marker: {mk:?}"),
        }
    }

    #[test]
    fn other_records_read_back_in_the_front_ends_shape() {
        let m = record(Some(b"k"), &[("a", b"1"), ("bin", &[0xff])]);
        let Record::Event(meta) = read(&m) else {
            panic!("an event")
        };
        let v: Value = serde_json::from_slice(&meta).unwrap();
        assert_eq!(
            v,
            json!({"kafka": {"key": "k", "headers": [["a", "1"], ["bin", {"base64": "/w=="}]], "timestamp_ms": 1234}})
        );
    }

    #[test]
    fn markers_are_recognised_and_round_trip() {
        for mk in [Marker::Open("7".into()), Marker::Close("7".into())] {
            let m = record(None, &[(EOS_HEADER, mk.value().as_bytes())]);
            match read(&m) {
                Record::Marker(got) => assert_eq!(got, mk),
                Record::Event(_) => panic!("a marker"),
            }
        }
        assert_eq!(Marker::parse(b"ajar:7"), None);
    }
}
