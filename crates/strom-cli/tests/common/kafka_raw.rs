//! Raw Kafka frames for hostile-client tests: a connection with a read
//! timeout, request frames (size, key, version, correlation id, client id
//! "test", body), responses, and big-endian field helpers.

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

/// A connection to a Kafka listener, reads bounded to 10 s.
pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connecting to the Kafka port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s
}

/// A request frame: size, key, version, correlation id, client id, body.
pub fn request(key: i16, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&correlation.to_be_bytes());
    string(&mut f, "test");
    f.extend_from_slice(body);
    let mut out = (f.len() as i32).to_be_bytes().to_vec();
    out.extend(f);
    out
}

/// Reads one response (after its size); `None` if the connection closed.
pub fn response(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// A Kafka STRING: i16 length, then the bytes.
pub fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as i16).to_be_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// Kafka BYTES: i32 length, then the bytes.
pub fn bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
    b.extend_from_slice(v);
}

pub fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

pub fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// CRC-32C (Castagnoli), as record batches carry it.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zigzag varint, as records carry their fields.
pub fn varint(b: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        b.push((z as u8) | 0x80);
        z >>= 7;
    }
    b.push(z as u8);
}

/// A v2 record batch of `values` (no keys, no headers) from producer `pid`
/// at `epoch`, first sequence `seq` (`pid` -1: not idempotent).
pub fn record_batch(pid: i64, epoch: i16, seq: i32, values: &[&[u8]]) -> Vec<u8> {
    let count = values.len() as i32;
    let mut records = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut r = vec![0u8]; // attributes
        varint(&mut r, 0); // timestamp delta
        varint(&mut r, i as i64); // offset delta
        varint(&mut r, -1); // no key
        varint(&mut r, v.len() as i64);
        r.extend_from_slice(v);
        varint(&mut r, 0); // headers
        varint(&mut records, r.len() as i64);
        records.extend(r);
    }
    let mut tail = Vec::new(); // what the CRC covers
    tail.extend_from_slice(&0i16.to_be_bytes()); // attributes
    tail.extend_from_slice(&(count - 1).to_be_bytes());
    tail.extend_from_slice(&1000i64.to_be_bytes());
    tail.extend_from_slice(&1000i64.to_be_bytes());
    tail.extend_from_slice(&pid.to_be_bytes());
    tail.extend_from_slice(&epoch.to_be_bytes());
    tail.extend_from_slice(&seq.to_be_bytes());
    tail.extend_from_slice(&count.to_be_bytes());
    tail.extend(records);
    let mut after_len = 0i32.to_be_bytes().to_vec(); // leader epoch
    after_len.push(2); // magic
    after_len.extend_from_slice(&crc32c(&tail).to_be_bytes());
    after_len.extend(tail);
    let mut b = 0i64.to_be_bytes().to_vec();
    b.extend_from_slice(&(after_len.len() as i32).to_be_bytes());
    b.extend(after_len);
    b
}

/// InitProducerId v0: (error, producer id, epoch).
pub fn init_producer_id(s: &mut TcpStream, corr: i32) -> (i16, i64, i16) {
    let mut b = (-1i16).to_be_bytes().to_vec(); // no transactional id
    b.extend_from_slice(&60_000i32.to_be_bytes());
    std::io::Write::write_all(s, &request(22, 0, corr, &b)).expect("sending InitProducerId");
    let r = response(s).expect("an InitProducerId answer");
    // corr, throttle, error, producer id, epoch
    (i16_at(&r, 8), i64_at(&r, 10), i16_at(&r, 18))
}

/// Produce v3 (acks all) of `records` to `topic`/0: (error, base offset).
pub fn produce(s: &mut TcpStream, corr: i32, topic: &str, records: &[u8]) -> (i16, i64) {
    let mut b = (-1i16).to_be_bytes().to_vec(); // transactional id
    b.extend_from_slice(&(-1i16).to_be_bytes()); // acks all
    b.extend_from_slice(&10_000i32.to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes());
    string(&mut b, topic);
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    bytes(&mut b, records);
    std::io::Write::write_all(s, &request(0, 3, corr, &b)).expect("sending Produce");
    let r = response(s).expect("a Produce answer");
    // corr, topics(1), topic name, partitions(1), index, error, base offset
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    (i16_at(&r, at), i64_at(&r, at + 2))
}
