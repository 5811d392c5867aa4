//! Frame header: the fixed 24-byte prefix of every frame on a connection.
//!
//! ```text
//! offset size field
//!      0    4 frame_len   bytes after this field (20 + body_len + bulk_len), LE
//!      4    2 magic       0x5354 ("ST")
//!      6    1 version     protocol version the body is encoded in
//!      7    1 kind        0 request, 1 response, 2 push (server-initiated)
//!      8    2 opcode      message type
//!     10    2 flags       reserved, 0
//!     12    8 id          request id (responses echo it; pushes carry a stream id)
//!     20    4 body_len    length of the encoded message body
//!     24      body        body_len bytes
//!             bulk        frame_len - 20 - body_len bytes of bulk payload (data parts)
//! ```
//!
//! The bulk payload follows the body so a receiver can read it straight into
//! its final destination once it has decoded the body.

use crate::error::ProtoError;
use crate::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

pub const FRAME_HEADER_LEN: usize = 24;
pub const MAGIC: u16 = 0x5354;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Response = 1,
    Push = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The protocol version the body is encoded in.
    pub version: u8,
    pub kind: FrameKind,
    pub opcode: u16,
    pub id: u64,
    pub body_len: u32,
    pub bulk_len: u64,
}

impl FrameHeader {
    /// Encodes the header; fails if the frame would exceed `max_frame`.
    pub fn encode(&self, max_frame: u32) -> Result<[u8; FRAME_HEADER_LEN], ProtoError> {
        let frame_len = 20 + self.body_len as u64 + self.bulk_len;
        if frame_len > max_frame as u64 {
            return Err(ProtoError::FrameTooLarge {
                len: frame_len,
                max: max_frame,
            });
        }
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[0..4].copy_from_slice(&(frame_len as u32).to_le_bytes());
        h[4..6].copy_from_slice(&MAGIC.to_le_bytes());
        h[6] = self.version;
        h[7] = self.kind as u8;
        h[8..10].copy_from_slice(&self.opcode.to_le_bytes());
        h[12..20].copy_from_slice(&self.id.to_le_bytes());
        h[20..24].copy_from_slice(&self.body_len.to_le_bytes());
        Ok(h)
    }

    /// Decodes and checks a header. `max_frame` caps `frame_len` and
    /// `max_body` caps the body (which the receiver buffers whole).
    pub fn decode(h: &[u8; FRAME_HEADER_LEN], max_frame: u32) -> Result<Self, ProtoError> {
        let frame_len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let magic = u16::from_le_bytes([h[4], h[5]]);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let version = h[6];
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(ProtoError::UnsupportedVersion(version));
        }
        if frame_len > max_frame {
            return Err(ProtoError::FrameTooLarge {
                len: frame_len as u64,
                max: max_frame,
            });
        }
        let kind = match h[7] {
            0 => FrameKind::Request,
            1 => FrameKind::Response,
            2 => FrameKind::Push,
            k => {
                return Err(ProtoError::Unknown {
                    what: "frame kind",
                    value: k as u64,
                })
            }
        };
        let body_len = u32::from_le_bytes([h[20], h[21], h[22], h[23]]);
        if frame_len < 20 || body_len > frame_len - 20 {
            return Err(ProtoError::invalid(
                "frame header",
                format!("body of {body_len} bytes does not fit a frame of {frame_len} bytes"),
            ));
        }
        Ok(FrameHeader {
            version,
            kind,
            opcode: u16::from_le_bytes([h[8], h[9]]),
            id: u64::from_le_bytes(h[12..20].try_into().expect("8-byte slice")),
            body_len,
            bulk_len: (frame_len - 20 - body_len) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = FrameHeader {
            version: PROTOCOL_VERSION,
            kind: FrameKind::Push,
            opcode: 7,
            id: 42,
            body_len: 10,
            bulk_len: 1000,
        };
        let enc = h.encode(1 << 20).unwrap();
        assert_eq!(FrameHeader::decode(&enc, 1 << 20).unwrap(), h);
    }

    /// An encoded empty request header.
    fn empty_request() -> [u8; FRAME_HEADER_LEN] {
        FrameHeader {
            version: MIN_PROTOCOL_VERSION,
            kind: FrameKind::Request,
            opcode: 1,
            id: 1,
            body_len: 0,
            bulk_len: 0,
        }
        .encode(1024)
        .unwrap()
    }

    #[test]
    fn rejects_oversized_and_garbage() {
        let mut h = empty_request();
        h[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::decode(&h, 1024),
            Err(ProtoError::FrameTooLarge { .. })
        ));
        assert!(matches!(
            FrameHeader::decode(&[0xAB; FRAME_HEADER_LEN], 1024),
            Err(ProtoError::BadMagic(_))
        ));
    }

    #[test]
    fn a_version_outside_the_supported_range_is_refused_by_number() {
        for v in [0u8, PROTOCOL_VERSION + 1, u8::MAX] {
            let mut h = empty_request();
            h[6] = v;
            assert!(matches!(
                FrameHeader::decode(&h, 1024),
                Err(ProtoError::UnsupportedVersion(got)) if got == v
            ));
        }
    }
}
