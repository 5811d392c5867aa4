//! The compression frame of a compressed topic's data parts
//! (docs/compression.md), for the front ends that must produce and read
//! them on a client's behalf (the Kafka port). Strom's own client frames
//! data in `strom-client/src/compress.rs`, with the same layout:
//!
//! ```text
//! u8[2] magic "SZ"
//! u8    codec      0 stored (not compressed), 1 zstd, 2 lz4 (block)
//! u8    flags      0 (anything else is refused)
//! u64   length     uncompressed length, little-endian
//! ...   payload    the compressed bytes, or the data itself (stored)
//! ```
//!
//! Decoding trusts no length: the header's is checked against a cap and
//! against what the payload can hold before anything is allocated.

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 12;
const MAGIC: [u8; 2] = *b"SZ";
const STORED: u8 = 0;
const ZSTD: u8 = 1;
const LZ4: u8 = 2;
/// The most an LZ4 block expands per input byte.
const LZ4_MAX_RATIO: u64 = 255;

/// How to compress a data part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameCodec {
    /// zstd at this level.
    Zstd(i32),
    /// LZ4 block: level 0 the fast mode, 1..=12 high compression.
    Lz4(u32),
}

/// Why a data part is not a frame that decodes.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("the data part has {0} bytes, fewer than a compression frame header")]
    Truncated(usize),
    #[error("the data part does not start with a compression frame")]
    BadMagic,
    #[error("unknown codec {0} in the compression frame")]
    UnknownCodec(u8),
    #[error("reserved compression frame flags {0:#04x} are set")]
    Flags(u8),
    #[error("the compression frame claims {claimed} uncompressed bytes, above the cap of {cap}")]
    TooLarge { claimed: u64, cap: u64 },
    #[error("the compression frame claims {claimed} bytes, but {found}")]
    LengthMismatch { claimed: u64, found: String },
    #[error("{codec} decompression failed: {reason}")]
    Corrupt { codec: &'static str, reason: String },
}

fn header(codec: u8, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..2].copy_from_slice(&MAGIC);
    h[2] = codec;
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

/// Frames `data` with `codec`; stored (codec 0) when it does not shrink.
/// An empty data part stays empty (no frame).
pub fn pack(codec: FrameCodec, data: &[u8]) -> Vec<u8> {
    if data.is_empty() {
        return Vec::new();
    }
    let packed = match codec {
        FrameCodec::Zstd(level) => zstd::bulk::compress(data, level).ok().map(|c| (ZSTD, c)),
        FrameCodec::Lz4(level) => {
            let mode = match level {
                0 => None,
                l => Some(lz4::block::CompressionMode::HIGHCOMPRESSION(l as i32)),
            };
            lz4::block::compress(data, mode, false)
                .ok()
                .map(|c| (LZ4, c))
        }
    };
    let len = data.len() as u64;
    match packed.filter(|(_, c)| c.len() < data.len()) {
        Some((code, c)) => {
            let mut out = Vec::with_capacity(HEADER_LEN + c.len());
            out.extend_from_slice(&header(code, len));
            out.extend_from_slice(&c);
            out
        }
        None => {
            let mut out = Vec::with_capacity(HEADER_LEN + data.len());
            out.extend_from_slice(&header(STORED, len));
            out.extend_from_slice(data);
            out
        }
    }
}

/// The data a frame holds, at most `cap` bytes. An empty part is empty.
pub fn unpack(bytes: &[u8], cap: u64) -> Result<Vec<u8>, FrameError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let Some((head, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(FrameError::Truncated(bytes.len()));
    };
    if head[..2] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if head[3] != 0 {
        return Err(FrameError::Flags(head[3]));
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&head[4..12]);
    let len = u64::from_le_bytes(len8);
    if len > cap {
        return Err(FrameError::TooLarge { claimed: len, cap });
    }
    let n = payload.len() as u64;
    let mismatch = |found: String| FrameError::LengthMismatch {
        claimed: len,
        found,
    };
    let corrupt = |codec, e: std::io::Error| FrameError::Corrupt {
        codec,
        reason: e.to_string(),
    };
    let out = match head[2] {
        STORED if n != len => return Err(mismatch(format!("{n} are stored"))),
        STORED => payload.to_vec(),
        ZSTD => {
            match zstd::zstd_safe::get_frame_content_size(payload) {
                Ok(Some(m)) if m == len => {}
                _ => return Err(mismatch("the zstd frame records another length".into())),
            }
            zstd::bulk::decompress(payload, len as usize).map_err(|e| corrupt("zstd", e))?
        }
        LZ4 => {
            if len > n.saturating_mul(LZ4_MAX_RATIO).saturating_add(16) {
                return Err(mismatch(format!(
                    "{n} lz4 bytes cannot expand to that many"
                )));
            }
            let size = i32::try_from(len)
                .map_err(|_| mismatch("lz4 blocks hold less than 2 GiB".into()))?;
            lz4::block::decompress(payload, Some(size)).map_err(|e| corrupt("lz4", e))?
        }
        c => return Err(FrameError::UnknownCodec(c)),
    };
    if out.len() as u64 != len {
        return Err(mismatch(format!("it decodes to {}", out.len())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_lies_are_refused() {
        let data = vec![7u8; 4096];
        for codec in [FrameCodec::Zstd(3), FrameCodec::Lz4(0), FrameCodec::Lz4(9)] {
            let f = pack(codec, &data);
            assert!(f.len() < 200, "{codec:?} compresses: {}", f.len());
            assert_eq!(unpack(&f, 1 << 20).unwrap(), data);
            assert!(matches!(unpack(&f, 100), Err(FrameError::TooLarge { .. })));
        }
        let stored = pack(FrameCodec::Zstd(3), b"ab");
        assert_eq!(stored[2], STORED);
        assert_eq!(unpack(&stored, 10).unwrap(), b"ab");
        assert!(pack(FrameCodec::Lz4(0), b"").is_empty());
        assert_eq!(unpack(b"", 0).unwrap(), b"");
        assert_eq!(
            unpack(b"plain text, no frame", 99),
            Err(FrameError::BadMagic)
        );
        let mut lie = header(LZ4, 1 << 30).to_vec();
        lie.extend_from_slice(&[0u8; 10]);
        assert!(matches!(
            unpack(&lie, u64::MAX),
            Err(FrameError::LengthMismatch { .. })
        ));
    }
}
