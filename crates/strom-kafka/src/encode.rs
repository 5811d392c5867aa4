//! Kafka record batches (v2) out, on the fetch path: one uncompressed
//! batch per stored Strom batch, with the same offsets. Written here rather
//! than with `kafka-protocol`'s encoder, whose records keep headers in a
//! map (a record may carry a header name twice) and need one allocation
//! per field.

use bytes::{BufMut, Bytes, BytesMut};

use crate::mapping::OutRecord;

fn varlong(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn nullable(out: &mut BytesMut, b: &Option<Bytes>) {
    match b {
        None => varlong(out, -1),
        Some(b) => {
            varlong(out, b.len() as i64);
            out.put_slice(b);
        }
    }
}

/// Appends one record batch holding `records` (offsets from `base`, each
/// with its timestamp or `default_ts`) to `out`.
pub fn batch(out: &mut BytesMut, base: u64, default_ts: i64, records: &[OutRecord]) {
    let ts = |r: &OutRecord| r.timestamp_ms.unwrap_or(default_ts);
    let first_ts = records.first().map_or(default_ts, ts);
    let max_ts = records.iter().map(ts).max().unwrap_or(default_ts);
    let start = out.len();
    out.put_i64(base as i64);
    out.put_i32(0); // batch length, set below
    out.put_i32(0); // partition leader epoch
    out.put_i8(2); // magic
    out.put_u32(0); // CRC, set below
    let crc_from = out.len();
    out.put_i16(0); // attributes: no compression, CreateTime
    out.put_i32(records.len().saturating_sub(1) as i32);
    out.put_i64(first_ts);
    out.put_i64(max_ts);
    out.put_i64(-1); // producer id
    out.put_i16(-1); // producer epoch
    out.put_i32(-1); // base sequence
    out.put_i32(records.len() as i32);
    let mut body = BytesMut::new();
    for (i, r) in records.iter().enumerate() {
        body.clear();
        body.put_i8(0);
        varlong(&mut body, ts(r) - first_ts);
        varlong(&mut body, i as i64);
        nullable(&mut body, &r.key);
        nullable(&mut body, &r.value);
        varlong(&mut body, r.headers.len() as i64);
        for (name, value) in &r.headers {
            varlong(&mut body, name.len() as i64);
            body.put_slice(name);
            nullable(&mut body, value);
        }
        varlong(out, body.len() as i64);
        out.put_slice(&body);
    }
    let len = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[crc_from..]);
    out[crc_from - 4..crc_from].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;

    fn recs() -> Vec<OutRecord> {
        vec![
            OutRecord {
                timestamp_ms: Some(5_000),
                key: Some(Bytes::from_static(b"k")),
                value: Some(Bytes::from_static(b"value")),
                headers: vec![
                    (Bytes::from_static(b"a"), Some(Bytes::from_static(b"1"))),
                    (Bytes::from_static(b"a"), Some(Bytes::from_static(b"2"))),
                    (Bytes::from_static(b"n"), None),
                ],
            },
            OutRecord {
                timestamp_ms: None,
                key: None,
                value: None,
                headers: vec![],
            },
        ]
    }

    #[test]
    fn a_batch_parses_back_with_duplicate_headers() {
        let mut out = BytesMut::new();
        batch(&mut out, 40, 4_000, &recs());
        let back = crate::records::parse(out.clone().freeze(), 1 << 20).unwrap();
        let r = &back[0].records;
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].headers, recs()[0].headers, "both 'a' headers kept");
        assert_eq!((r[0].timestamp_ms, r[1].timestamp_ms), (5_000, 4_000));
        assert_eq!(r[1].value, None);
        // And kafka-protocol, an independent decoder, agrees (offsets too).
        let set = RecordBatchDecoder::decode(&mut out.freeze()).unwrap();
        assert_eq!(set.records[0].offset, 40);
        assert_eq!(set.records[1].offset, 41);
        assert_eq!(set.records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(set.records[0].value.as_deref(), Some(&b"value"[..]));
    }
}
