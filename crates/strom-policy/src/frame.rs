//! The compression frame of a compressed topic's data parts
//! (docs/compression.md): one codec for every side that writes or reads
//! them. Strom's client frames whole batches with it (`Packer` in
//! strom-client) and checks and decodes each event's frame; the Kafka
//! port frames and unframes records on a Kafka client's behalf.
//!
//! ```text
//! u8[2] magic "SZ"
//! u8    codec      0 stored (not compressed), 1 zstd, 2 lz4 (block)
//! u8    flags      0 (anything else is refused)
//! u64   length     uncompressed length, little-endian
//! ...   payload    the compressed bytes, or the data itself (stored)
//! ```
//!
//! An event whose data does not shrink is stored (codec 0), so the frame
//! costs 12 bytes at most. An empty data part stays empty (no frame).
//! Decoding trusts no length: the header's is checked against a cap and
//! against what the payload can hold before anything is allocated.

use std::cell::RefCell;

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 12;
const MAGIC: [u8; 2] = *b"SZ";
/// The codec byte of a stored (not compressed) payload.
pub const STORED: u8 = 0;
/// The codec byte of a zstd payload.
pub const ZSTD: u8 = 1;
/// The codec byte of an LZ4 block payload.
pub const LZ4: u8 = 2;
/// The most an LZ4 block expands: one byte of input ends up as at most
/// 255 bytes of output, plus a short literal tail.
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
    #[error("the data part has {len} bytes, fewer than a compression frame header ({HEADER_LEN})")]
    Truncated { len: usize },
    #[error("the data part does not start with a compression frame (magic {found:02x?}); it was not written by a Strom producer of this compressed topic")]
    BadMagic { found: [u8; 2] },
    #[error("unknown codec {0} in the compression frame")]
    UnknownCodec(u8),
    #[error("reserved compression frame flags {0:#04x} are set")]
    Flags(u8),
    #[error("the compression frame claims {claimed} uncompressed bytes, above the cap of {cap}")]
    TooLarge { claimed: u64, cap: u64 },
    #[error("the compression frame claims {claimed} uncompressed bytes, but {found}")]
    LengthMismatch { claimed: u64, found: String },
    #[error("{codec} decompression failed: {reason}")]
    Corrupt { codec: &'static str, reason: String },
}

thread_local! {
    /// zstd contexts of the threads that compress and decompress (the
    /// runtime's blocking pool), kept between batches: making one costs
    /// more than compressing a small batch. The level is the last one set.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Compresses `src` into `dst` with this thread's zstd context at `level`.
pub fn zstd_encode(level: i32, src: &[u8], dst: &mut [u8]) -> std::io::Result<usize> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        match c.as_mut() {
            Some((l, _)) if *l == level => {}
            Some((l, z)) => {
                z.set_compression_level(level)?;
                *l = level;
            }
            None => *c = Some((level, zstd::bulk::Compressor::new(level)?)),
        }
        match c.as_mut() {
            Some((_, z)) => z.compress_to_buffer(src, dst),
            None => Err(std::io::Error::other("no zstd compressor")),
        }
    })
}

/// Decodes one zstd payload into `out` with this thread's context.
fn zstd_decode(payload: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        match d.as_mut() {
            Some(d) => d.decompress_to_buffer(payload, out),
            None => Err(std::io::Error::other("no zstd decompressor")),
        }
    })
}

/// A checked frame: its codec, uncompressed length and payload.
#[derive(Debug)]
pub struct Frame<'a> {
    codec: u8,
    len: u64,
    payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Checks the header of `bytes` and that the payload can hold `len`
    /// bytes (stored: exactly; lz4: within its largest ratio; zstd: the
    /// length zstd's own frame header records), with `len <= cap`.
    pub fn parse(bytes: &'a [u8], cap: u64) -> Result<Frame<'a>, FrameError> {
        let Some((head, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
            return Err(FrameError::Truncated { len: bytes.len() });
        };
        let found = [head[0], head[1]];
        if found != MAGIC {
            return Err(FrameError::BadMagic { found });
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
        let frame = Frame {
            codec: head[2],
            len,
            payload,
        };
        frame.check_len()?;
        Ok(frame)
    }

    fn mismatch(&self, found: String) -> FrameError {
        FrameError::LengthMismatch {
            claimed: self.len,
            found,
        }
    }

    fn check_len(&self) -> Result<(), FrameError> {
        let n = self.payload.len() as u64;
        match self.codec {
            STORED if n != self.len => Err(self.mismatch(format!("{n} are stored"))),
            LZ4 if self.len > n.saturating_mul(LZ4_MAX_RATIO).saturating_add(16) => {
                Err(self.mismatch(format!("{n} lz4 bytes cannot expand to that many")))
            }
            ZSTD => match zstd::zstd_safe::get_frame_content_size(self.payload) {
                Ok(Some(m)) if m == self.len => Ok(()),
                Ok(Some(m)) => Err(self.mismatch(format!("the zstd frame holds {m}"))),
                Ok(None) => Err(self.mismatch("the zstd frame records no length".into())),
                Err(_) => Err(FrameError::Corrupt {
                    codec: "zstd",
                    reason: "no valid zstd frame header".into(),
                }),
            },
            STORED | LZ4 => Ok(()),
            c => Err(FrameError::UnknownCodec(c)),
        }
    }

    /// The uncompressed length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes (a producer never frames an empty part).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Decodes into `out`, which must be exactly [`len`](Self::len) bytes.
    pub fn decode_into(&self, out: &mut [u8]) -> Result<(), FrameError> {
        debug_assert_eq!(out.len() as u64, self.len);
        let corrupt = |codec, e: std::io::Error| FrameError::Corrupt {
            codec,
            reason: e.to_string(),
        };
        let n = match self.codec {
            STORED => {
                out.copy_from_slice(self.payload);
                out.len()
            }
            ZSTD => zstd_decode(self.payload, out).map_err(|e| corrupt("zstd", e))?,
            _ => {
                let size = i32::try_from(out.len())
                    .map_err(|_| self.mismatch("lz4 blocks hold less than 2 GiB".into()))?;
                lz4::block::decompress_to_buffer(self.payload, Some(size), out)
                    .map_err(|e| corrupt("lz4", e))?
            }
        };
        if n != out.len() {
            return Err(self.mismatch(format!("it decodes to {n}")));
        }
        Ok(())
    }

    /// Decodes into a new buffer.
    pub fn decode(&self) -> Result<Vec<u8>, FrameError> {
        let mut out = vec![0u8; self.len as usize];
        self.decode_into(&mut out)?;
        Ok(out)
    }
}

pub fn header(codec: u8, len: u64) -> [u8; HEADER_LEN] {
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
    Frame::parse(bytes, cap)?.decode()
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
            Err(FrameError::BadMagic { found: *b"pl" })
        );
        let mut lie = header(LZ4, 1 << 30).to_vec();
        lie.extend_from_slice(&[0u8; 10]);
        assert!(matches!(
            unpack(&lie, u64::MAX),
            Err(FrameError::LengthMismatch { .. })
        ));
    }
}
