//! Raw protocol frames over a plain `TcpStream`, for tests that play a
//! hostile or broken client: hand-built headers, requests, and readers that
//! wait for the server to close the connection.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strom_proto::{FrameHeader, FrameKind, Request, Response, FRAME_HEADER_LEN};

pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A raw 24-byte frame header.
pub fn header(
    frame_len: u32,
    version: u8,
    kind: u8,
    opcode: u16,
    id: u64,
    body_len: u32,
) -> Vec<u8> {
    let mut h = Vec::with_capacity(FRAME_HEADER_LEN);
    h.extend_from_slice(&frame_len.to_le_bytes());
    h.extend_from_slice(&0x5354u16.to_le_bytes());
    h.push(version);
    h.push(kind);
    h.extend_from_slice(&opcode.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&body_len.to_le_bytes());
    h
}

/// A request frame: header, body, bulk.
pub fn request_frame(id: u64, req: &Request, bulk: &[u8]) -> Vec<u8> {
    let mut body = BytesMut::new();
    req.encode(strom_proto::MIN_PROTOCOL_VERSION, &mut body);
    let mut f = header(
        (20 + body.len() + bulk.len()) as u32,
        1,
        0,
        req.opcode(),
        id,
        body.len() as u32,
    );
    f.extend_from_slice(&body);
    f.extend_from_slice(bulk);
    f
}

pub fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("raw connection to the server");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    s
}

/// Reads until the server closes the connection; returns what it sent.
/// Panics if the connection is still open after `CLOSE_TIMEOUT`.
pub fn expect_closed(mut s: TcpStream, what: &str) -> Vec<u8> {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                assert!(
                    Instant::now() < deadline,
                    "{what}: the server kept the connection open for {CLOSE_TIMEOUT:?} \
                     (received {} bytes: {:?})",
                    got.len(),
                    responses(&got)
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Reset: closed with our bytes unread.
            Err(_) => return got,
        }
    }
}

/// Decodes the response frames in `bytes` (as far as they are complete).
pub fn responses(bytes: &[u8]) -> Vec<(u64, Response)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= FRAME_HEADER_LEN {
        let h: [u8; FRAME_HEADER_LEN] = rest[..FRAME_HEADER_LEN].try_into().unwrap();
        let Ok(h) = FrameHeader::decode(&h, u32::MAX) else {
            break;
        };
        let end = FRAME_HEADER_LEN + h.body_len as usize + h.bulk_len as usize;
        if h.kind != FrameKind::Response || rest.len() < end {
            break;
        }
        let body =
            Bytes::copy_from_slice(&rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.body_len as usize]);
        if let Ok(r) = Response::decode(h.version, h.opcode, &body) {
            out.push((h.id, r));
        }
        rest = &rest[end..];
    }
    out
}

/// Asserts the server answered with an error before closing: to request
/// `id`, or with id 0 when it refused the frame header itself.
pub fn assert_error_reply(got: &[u8], id: u64, what: &str) -> String {
    let rs = responses(got);
    match rs.iter().find(|(i, _)| *i == id || *i == 0) {
        Some((_, Response::Error { message, .. })) => message.clone(),
        _ => panic!("{what}: expected an error response to request {id}, got {rs:?}"),
    }
}

/// Reads until the answer to request `id` (or an answer to id 0, a
/// rejected frame) arrives or the server closes; returns what it sent.
pub fn read_until_reply(s: &mut TcpStream, id: u64, what: &str) -> Vec<u8> {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !responses(&got).iter().any(|(i, _)| *i == id || *i == 0) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                assert!(
                    Instant::now() < deadline,
                    "{what}: no answer within {CLOSE_TIMEOUT:?}"
                );
            }
            Err(_) => break,
        }
    }
    got
}

/// Sends one event to `partition` of `topic` at `addr` as batch `seq` of
/// idempotent producer `producer`, on a fresh connection, and returns the
/// answer: what a producer resending after a lost reply does.
#[allow(dead_code)] // not every test binary uses it
pub fn produce_stamped(
    addr: &str,
    topic: &str,
    partition: u32,
    producer: u64,
    seq: u32,
    meta: &str,
) -> Response {
    let stamp = strom_proto::ProducerStamp {
        producer,
        sequence: seq,
        restart: false,
    };
    produce_with_stamp(addr, topic, partition, stamp, meta)
}

/// [`produce_stamped`] with any stamp (a sequence restart, say).
pub fn produce_with_stamp(
    addr: &str,
    topic: &str,
    partition: u32,
    stamp: strom_proto::ProducerStamp,
    meta: &str,
) -> Response {
    let mut b = strom_proto::BatchBuilder::new();
    b.push(meta.as_bytes(), b"", 3);
    let req = Request::Produce {
        topic: topic.into(),
        partition,
        count: 1,
        acks_all: false,
        meta: b.finish_stamped(Some(stamp)),
    };
    let mut s = connect(addr);
    std::io::Write::write_all(&mut s, &request_frame(7, &req, b"abc")).expect("sending");
    let got = read_until_reply(&mut s, 7, "a stamped produce");
    let answer = responses(&got).into_iter().find(|(id, _)| *id == 7);
    answer.expect("an answer to the produce").1
}
