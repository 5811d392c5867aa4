//! Kafka record batches (v2) in, on the produce path: the batch header,
//! bounded decompression (gzip, snappy, lz4, zstd) and the records, parsed
//! here rather than by `kafka-protocol`, whose decoder reserves memory for
//! record and header counts read off the wire. Every length is checked
//! against the bytes that remain, and decompressed output is capped.
//!
//! Values are `Bytes` slices of the request frame (or of the decompressed
//! buffer): no copy of the data part.

use std::io::Read;

use bytes::{Buf, Bytes};

/// Bytes of a v2 record batch header, through the record count.
const HEADER: usize = 61;
/// The smallest record: seven one-byte varints and the attributes byte.
const MIN_RECORD: u64 = 7;

/// One Kafka record, as produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InRecord {
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// A record batch's records and the producer fields the response echoes.
#[derive(Debug)]
pub struct InBatch {
    pub records: Vec<InRecord>,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// What is wrong with a produced record set (answered `CORRUPT_MESSAGE`).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{what}: needs {needed} bytes, {remaining} remain")]
    Short {
        what: &'static str,
        needed: u64,
        remaining: usize,
    },
    #[error(
        "record batch magic {0}: only v2 record batches are accepted (Kafka clients since 0.11)"
    )]
    Magic(i8),
    #[error("record batch CRC mismatch (stated {stated:#x}, computed {computed:#x})")]
    Crc { stated: u32, computed: u32 },
    #[error("unknown compression codec {0}")]
    Codec(i16),
    #[error("decompressing {codec}: {detail}")]
    Decompress { codec: &'static str, detail: String },
    #[error("decompressed batch exceeds {0} bytes (max_batch_bytes)")]
    TooLarge(u64),
    #[error("{0}")]
    Invalid(&'static str),
}

fn need(buf: &Bytes, n: u64, what: &'static str) -> Result<(), RecordError> {
    if n > buf.len() as u64 {
        return Err(RecordError::Short {
            what,
            needed: n,
            remaining: buf.len(),
        });
    }
    Ok(())
}

fn varlong(buf: &mut Bytes) -> Result<i64, RecordError> {
    let mut v = 0u64;
    for i in 0..10 {
        need(buf, 1, "varint")?;
        let b = buf.get_u8();
        v |= u64::from(b & 0x7f) << (i * 7);
        if b < 0x80 {
            return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    Err(RecordError::Invalid("varint longer than 10 bytes"))
}

fn varint(buf: &mut Bytes) -> Result<i32, RecordError> {
    i32::try_from(varlong(buf)?).map_err(|_| RecordError::Invalid("varint out of range"))
}

/// A varint length, then that many bytes; -1 is null.
fn nullable(buf: &mut Bytes, what: &'static str) -> Result<Option<Bytes>, RecordError> {
    match varint(buf)? {
        -1 => Ok(None),
        n if n < 0 => Err(RecordError::Invalid("negative length")),
        n => {
            need(buf, n as u64, what)?;
            Ok(Some(buf.split_to(n as usize)))
        }
    }
}

/// Parses every record batch in a produce request's record set.
pub fn parse(mut set: Bytes, max_bytes: u64) -> Result<Vec<InBatch>, RecordError> {
    let mut out = Vec::new();
    while set.has_remaining() {
        need(&set, 12, "record batch offset and length")?;
        let _base_offset = set.get_i64();
        let len = set.get_i32();
        if len < (HEADER - 12) as i32 {
            return Err(RecordError::Invalid("record batch length below its header"));
        }
        need(&set, len as u64, "record batch")?;
        let batch = set.split_to(len as usize);
        if let Some(b) = parse_batch(batch, max_bytes)? {
            out.push(b);
        }
    }
    Ok(out)
}

/// One batch, after its base offset and length. `None` for control batches
/// (transaction markers), which carry no events.
fn parse_batch(mut b: Bytes, max_bytes: u64) -> Result<Option<InBatch>, RecordError> {
    let _leader_epoch = b.get_i32();
    let magic = b.get_i8();
    if magic != 2 {
        return Err(RecordError::Magic(magic));
    }
    let stated = b.get_u32();
    let computed = crc32c::crc32c(&b);
    if stated != computed {
        return Err(RecordError::Crc { stated, computed });
    }
    let attributes = b.get_i16();
    let _last_offset_delta = b.get_i32();
    let first_ts = b.get_i64();
    let _max_ts = b.get_i64();
    let producer_id = b.get_i64();
    let producer_epoch = b.get_i16();
    let base_sequence = b.get_i32();
    let count = b.get_i32();
    if attributes & (1 << 5) != 0 {
        return Ok(None);
    }
    if count < 0 {
        return Err(RecordError::Invalid("negative record count"));
    }
    let mut body = decompress(attributes & 0x7, b, max_bytes)?;
    // Every record takes at least MIN_RECORD bytes: check before reserving.
    need(&body, count as u64 * MIN_RECORD, "records")?;
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = varint(&mut body)?;
        if len < 0 {
            return Err(RecordError::Invalid("negative record length"));
        }
        need(&body, len as u64, "record")?;
        let mut r = body.split_to(len as usize);
        need(&r, 1, "record attributes")?;
        r.advance(1);
        let ts_delta = varlong(&mut r)?;
        let _offset_delta = varint(&mut r)?;
        let key = nullable(&mut r, "record key")?;
        let value = nullable(&mut r, "record value")?;
        let n = varint(&mut r)?;
        if n < 0 {
            return Err(RecordError::Invalid("negative header count"));
        }
        // A header takes at least two bytes.
        need(&r, n as u64 * 2, "record headers")?;
        let mut headers = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name =
                nullable(&mut r, "header name")?.ok_or(RecordError::Invalid("null header name"))?;
            headers.push((name, nullable(&mut r, "header value")?));
        }
        records.push(InRecord {
            timestamp_ms: first_ts.saturating_add(ts_delta),
            key,
            value,
            headers,
        });
    }
    Ok(Some(InBatch {
        records,
        producer_id,
        producer_epoch,
        base_sequence,
    }))
}

/// Reads all of `r`, failing past `max` bytes.
fn read_capped(
    mut r: impl Read,
    max: u64,
    codec: &'static str,
    hint: usize,
) -> Result<Bytes, RecordError> {
    let mut out = Vec::with_capacity(hint.min(max as usize));
    (&mut r)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| RecordError::Decompress {
            codec,
            detail: e.to_string(),
        })?;
    if out.len() as u64 > max {
        return Err(RecordError::TooLarge(max));
    }
    Ok(Bytes::from(out))
}

/// Xerial's framing of snappy (what Kafka's Java clients write).
const XERIAL: &[u8] = b"\x82SNAPPY\x00";

fn snappy(mut data: Bytes, max: u64) -> Result<Bytes, RecordError> {
    let err = |e: snap::Error| RecordError::Decompress {
        codec: "snappy",
        detail: e.to_string(),
    };
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), RecordError> {
        let n = snap::raw::decompress_len(block).map_err(err)?;
        if (out.len() + n) as u64 > max {
            return Err(RecordError::TooLarge(max));
        }
        let start = out.len();
        out.resize(start + n, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(err)?;
        Ok(())
    };
    let mut out = Vec::new();
    if data.len() < 16 || &data[..8] != XERIAL {
        raw(&data, &mut out)?;
        return Ok(Bytes::from(out));
    }
    data.advance(16);
    while data.has_remaining() {
        need(&data, 4, "snappy block length")?;
        let n = data.get_u32();
        need(&data, u64::from(n), "snappy block")?;
        let block = data.split_to(n as usize);
        raw(&block, &mut out)?;
    }
    Ok(Bytes::from(out))
}

fn decompress(codec: i16, data: Bytes, max: u64) -> Result<Bytes, RecordError> {
    let hint = data.len().saturating_mul(4);
    match codec {
        0 => Ok(data),
        1 => read_capped(
            flate2::read::GzDecoder::new(data.reader()),
            max,
            "gzip",
            hint,
        ),
        2 => snappy(data, max),
        3 => {
            let d = lz4::Decoder::new(data.reader()).map_err(|e| RecordError::Decompress {
                codec: "lz4",
                detail: e.to_string(),
            })?;
            read_capped(d, max, "lz4", hint)
        }
        4 => {
            let d = zstd::stream::read::Decoder::new(data.reader()).map_err(|e| {
                RecordError::Decompress {
                    codec: "zstd",
                    detail: e.to_string(),
                }
            })?;
            read_capped(d, max, "zstd", hint)
        }
        c => Err(RecordError::Codec(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(i: i64) -> Record {
        let mut headers = IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from(format!("v{i}"))),
        );
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: i as i32,
            timestamp: 1_000 + i,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(vec![i as u8; 100])),
            headers,
        }
    }

    fn encoded(compression: Compression) -> Bytes {
        let recs: Vec<Record> = (0..5).map(record).collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            recs.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    #[test]
    fn every_codec_round_trips() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let batches = parse(encoded(c), 1 << 20).unwrap();
            let recs: Vec<&InRecord> = batches.iter().flat_map(|b| &b.records).collect();
            assert_eq!(recs.len(), 5, "{c:?}");
            for (i, r) in recs.iter().enumerate() {
                assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
                assert_eq!(r.value.as_deref(), Some(&[i as u8; 100][..]));
                assert_eq!(r.timestamp_ms, 1_000 + i as i64);
                assert_eq!(r.headers[0].1.as_deref(), Some(format!("v{i}").as_bytes()));
            }
        }
    }

    #[test]
    fn decompression_past_the_cap_is_refused() {
        assert!(matches!(
            parse(encoded(Compression::Gzip), 100),
            Err(RecordError::TooLarge(100))
        ));
    }

    #[test]
    fn a_flipped_byte_fails_the_crc_and_truncation_is_refused() {
        let good = encoded(Compression::None);
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(matches!(
            parse(Bytes::from(bad), 1 << 20),
            Err(RecordError::Crc { .. })
        ));
        assert!(parse(good.slice(..good.len() - 3), 1 << 20).is_err());
    }

    #[test]
    fn a_huge_record_count_is_refused_before_reserving() {
        let mut b = encoded(Compression::None).to_vec();
        // Record count at 57..61; then recompute the CRC over 21.. .
        b[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            parse(Bytes::from(b), 1 << 20),
            Err(RecordError::Short { .. })
        ));
    }
}
