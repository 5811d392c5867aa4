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
