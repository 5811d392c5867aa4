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

/// Bytes `varlong` writes for `v`.
fn varlong_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.leading_zeros() as usize).max(1).div_ceil(7)
}

/// Bytes `nullable` writes for `b`.
fn nullable_len(b: &Option<Bytes>) -> usize {
    match b {
        None => 1,
        Some(b) => varlong_len(b.len() as i64) + b.len(),
    }
}

/// Bytes of record `i`'s body (everything after its length varint).
fn record_len(r: &OutRecord, ts_delta: i64, i: usize) -> usize {
    1 + varlong_len(ts_delta)
        + varlong_len(i as i64)
        + nullable_len(&r.key)
        + nullable_len(&r.value)
        + varlong_len(r.headers.len() as i64)
        + r.headers
            .iter()
            .map(|(name, value)| varlong_len(name.len() as i64) + name.len() + nullable_len(value))
            .sum::<usize>()
}

/// Most bytes [`batch`] writes for `records`: a bound to reserve with.
pub fn batch_len_bound(records: &[OutRecord]) -> usize {
    61 + records
        .iter()
        .enumerate()
        .map(|(i, r)| 10 + record_len(r, i64::MAX, i))
        .sum::<usize>()
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
    // Each record straight into `out`, its length computed first: the
    // value is copied once.
    for (i, r) in records.iter().enumerate() {
        let delta = ts(r) - first_ts;
        varlong(out, record_len(r, delta, i) as i64);
        out.put_i8(0);
        varlong(out, delta);
        varlong(out, i as i64);
        nullable(out, &r.key);
        nullable(out, &r.value);
        varlong(out, r.headers.len() as i64);
        for (name, value) in &r.headers {
            varlong(out, name.len() as i64);
            out.put_slice(name);
            nullable(out, value);
        }
    }
    let len = (out.len() - start - 12) as i32;
    out[start + 8..start + 12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[crc_from..]);
    out[crc_from - 4..crc_from].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varlong_len_is_what_varlong_writes() {
        for v in [
            0,
            1,
            -1,
            63,
            64,
            -64,
            -65,
            8191,
            8192,
            i64::MAX,
            i64::MIN,
            1 << 40,
        ] {
            let mut b = BytesMut::new();
            varlong(&mut b, v);
            assert_eq!(varlong_len(v), b.len(), "{v}");
        }
    }
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
