//! Data-part compression, per topic (`TopicSpec::compression`, see
//! docs/compression.md). Producers frame every non-empty data part of a
//! compressed topic on their background threads, a whole batch into one
//! buffer (`Packer`); consumers check and decode the frame before
//! selectors, brokers and the application see the data (`unpack.rs`).
//! Servers store frames as opaque bytes. The frame itself (layout, checks,
//! decoding) is `strom_policy::frame`, shared with the Kafka port.

use bytes::{BufMut, Bytes, BytesMut};
use strom_proto::Compression;

use strom_policy::frame::{header, zstd_encode, LZ4, STORED, ZSTD};
pub(crate) use strom_policy::frame::{Frame, HEADER_LEN};

use crate::error::{Error, Result};

/// The largest uncompressed data part a consumer decodes: what a producer
/// can push at all (its frame limit), so larger claims are lies.
pub(crate) const MAX_UNCOMPRESSED: u64 = strom_proto::DEFAULT_MAX_FRAME as u64;

/// One event's framed data: a slice of the batch's new buffer, or one of
/// the event's own segments (stored events keep their buffers).
enum Piece {
    Own(std::ops::Range<usize>),
    Theirs(Bytes),
}

/// Compresses the data parts of one batch with one codec.
pub(crate) struct Packer {
    codec: Compression,
    /// An event's segments joined, when it has several.
    scratch: Vec<u8>,
}

impl Packer {
    pub fn new(codec: Compression) -> Self {
        Packer {
            codec,
            scratch: Vec::new(),
        }
    }

    /// The most bytes compressing `len` bytes can take (`None`: the codec
    /// cannot take that much; the event is stored).
    fn bound(&self, len: usize) -> Option<usize> {
        match self.codec {
            Compression::None => None,
            Compression::Zstd(_) => Some(zstd::zstd_safe::compress_bound(len)),
            Compression::Lz4(_) => lz4::block::compress_bound(len).ok(),
        }
    }

    /// Compresses `src` into `dst`; `None` when it fails or does not shrink.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<(u8, usize)> {
        let (codec, n) = match self.codec {
            Compression::None => return None,
            Compression::Zstd(level) => (ZSTD, zstd_encode(level, src, dst)),
            Compression::Lz4(level) => {
                let mode = match level {
                    0 => None,
                    l => Some(lz4::block::CompressionMode::HIGHCOMPRESSION(l as i32)),
                };
                (LZ4, lz4::block::compress_to_buffer(src, mode, false, dst))
            }
        };
        n.ok().filter(|&n| n < src.len()).map(|n| (codec, n))
    }

    /// Frames one event's data (`segs`, `len` bytes in all) into `out`.
    fn pack_one(
        &mut self,
        segs: Vec<Bytes>,
        len: u64,
        out: &mut BytesMut,
        pieces: &mut Vec<Piece>,
    ) {
        let start = out.len();
        let bound = usize::try_from(len).ok().and_then(|l| self.bound(l));
        if let Some(bound) = bound {
            out.resize(start + HEADER_LEN + bound, 0);
            let joined = match segs.as_slice() {
                [_] => None,
                _ => {
                    self.scratch.clear();
                    segs.iter().for_each(|s| self.scratch.extend_from_slice(s));
                    Some(std::mem::take(&mut self.scratch))
                }
            };
            let src = joined.as_deref().unwrap_or_else(|| &segs[0][..]);
            let packed = self.compress(src, &mut out[start + HEADER_LEN..]);
            if let Some(buf) = joined {
                self.scratch = buf;
            }
            if let Some((codec, n)) = packed {
                out[start..start + HEADER_LEN].copy_from_slice(&header(codec, len));
                out.truncate(start + HEADER_LEN + n);
                pieces.push(Piece::Own(start..start + HEADER_LEN + n));
                return;
            }
            out.truncate(start);
        }
        out.put_slice(&header(STORED, len));
        pieces.push(Piece::Own(start..start + HEADER_LEN));
        pieces.extend(segs.into_iter().map(Piece::Theirs));
    }
}

/// Frames the data parts of a sealed batch (`meta`, its metadata
/// section, and `data`, its events' segments back to back): returns the
/// section with each event's stored length and the framed segments.
pub(crate) fn pack_batch(
    codec: Compression,
    meta: &Bytes,
    data: Vec<Bytes>,
) -> Result<(Bytes, Vec<Bytes>), strom_proto::ProtoError> {
    let view = strom_proto::BatchView::parse(meta.clone())?;
    let lens: Vec<u64> = view.iter().map(|e| e.data_len).collect();
    let room = lens
        .iter()
        .filter(|&&l| l > 0)
        .map(|&l| {
            HEADER_LEN.saturating_add(
                usize::try_from(l)
                    .unwrap_or(0)
                    .saturating_add(l as usize / 200 + 1024),
            )
        })
        .fold(0usize, usize::saturating_add);
    let mut out = BytesMut::with_capacity(room);
    let mut pieces = Vec::with_capacity(lens.len() * 2);
    let mut packer = Packer::new(codec);
    let mut segs = data.into_iter();
    let mut carry = None;
    let mut stored = Vec::with_capacity(lens.len());
    for &len in &lens {
        if len == 0 {
            stored.push(0);
            continue;
        }
        let parts = take_event(&mut segs, &mut carry, len)?;
        let before = pieces.len();
        packer.pack_one(parts, len, &mut out, &mut pieces);
        stored.push(pieces[before..].iter().map(piece_len).sum::<u64>());
    }
    let out = out.freeze();
    let data = pieces
        .into_iter()
        .map(|p| match p {
            Piece::Own(r) => out.slice(r),
            Piece::Theirs(b) => b,
        })
        .collect();
    Ok((with_lengths(meta, &stored), data))
}

fn piece_len(p: &Piece) -> u64 {
    match p {
        Piece::Own(r) => r.len() as u64,
        Piece::Theirs(b) => b.len() as u64,
    }
}

/// The next `len` bytes of a batch's segments, as whole segments or
/// slices of them (`carry` holds what is left of a split one).
fn take_event(
    segs: &mut impl Iterator<Item = Bytes>,
    carry: &mut Option<Bytes>,
    mut len: u64,
) -> Result<Vec<Bytes>, strom_proto::ProtoError> {
    let mut out = Vec::new();
    while len > 0 {
        let Some(mut s) = carry.take().or_else(|| segs.next()) else {
            return Err(strom_proto::ProtoError::Invalid {
                what: "batch",
                detail: "the events' data lengths add up to more than their data".into(),
            });
        };
        if s.len() as u64 > len {
            *carry = Some(s.split_off(len as usize));
        }
        len -= s.len() as u64;
        out.push(s);
    }
    Ok(out)
}

/// `meta` with event *i*'s data length set to `lens[i]`.
fn with_lengths(meta: &Bytes, lens: &[u64]) -> Bytes {
    let table = if strom_proto::stamp_of(meta).is_some() {
        16
    } else {
        4
    };
    let mut m = BytesMut::from(&meta[..]);
    for (i, l) in lens.iter().enumerate() {
        let at = table + i * 16 + 8;
        m[at..at + 8].copy_from_slice(&l.to_le_bytes());
    }
    m.freeze()
}

// The producer's background half (the consumer's is `unpack.rs`).

/// Frames a batch's data parts on the runtime's blocking pool, so the
/// sender task's runtime thread keeps moving other partitions' batches.
pub(crate) async fn pack(
    codec: Compression,
    meta: &mut Bytes,
    data: &mut Vec<Bytes>,
) -> Result<()> {
    let (m, d) = (meta.clone(), std::mem::take(data));
    let packed = tokio::task::spawn_blocking(move || pack_batch(codec, &m, d))
        .await
        .map_err(|e| {
            Error::coded(
                strom_proto::ErrorCode::INTERNAL,
                format!("compressing a batch: {e}"),
            )
        })?;
    (*meta, *data) = packed?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FrameError;
    use strom_proto::{BatchBuilder, BatchView, ProducerStamp};

    /// Compressible: a slowly varying array of little-endian f64s.
    fn array(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| ((i / 7) as f64).to_le_bytes())
            .collect()
    }

    /// Incompressible: xorshift bytes.
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Packs one batch of `events` and returns each event's stored frame.
    fn pack(codec: Compression, events: &[Vec<Bytes>], stamped: bool) -> Vec<Bytes> {
        let mut b = BatchBuilder::new();
        let mut data = Vec::new();
        for segs in events {
            let len = segs.iter().map(|s| s.len() as u64).sum();
            b.push(b"{}", b"", len);
            data.extend(segs.iter().filter(|s| !s.is_empty()).cloned());
        }
        let stamp = stamped.then_some(ProducerStamp {
            producer: 7,
            sequence: 1,
            restart: false,
        });
        let meta = b.finish_stamped(stamp);
        let (meta, data) = pack_batch(codec, &meta, data).unwrap();
        let joined: Vec<u8> = data.iter().flat_map(|b| b.iter().copied()).collect();
        let joined = Bytes::from(joined);
        let view = BatchView::parse(meta).unwrap();
        assert_eq!(view.stamp().is_some(), stamped);
        view.iter()
            .map(|e| joined.slice(e.data_pos as usize..(e.data_pos + e.data_len) as usize))
            .collect()
    }

    fn unframe(frame: &[u8]) -> Result<Vec<u8>, FrameError> {
        Frame::parse(frame, MAX_UNCOMPRESSED)?.decode()
    }

    #[test]
    fn frames_round_trip_for_zstd_and_lz4_at_their_levels() {
        let a = array(64 << 10);
        for codec in [
            Compression::Zstd(1),
            Compression::Zstd(3),
            Compression::Zstd(19),
            Compression::Lz4(0),
            Compression::Lz4(9),
        ] {
            // One event in three segments, one in one, one empty.
            let (x, y) = a.split_at(1000);
            let segs = vec![
                Bytes::copy_from_slice(x),
                Bytes::new(),
                Bytes::copy_from_slice(y),
            ];
            let frames = pack(codec, &[segs, vec![Bytes::from(a.clone())], vec![]], true);
            assert_eq!(frames.len(), 3);
            for f in &frames[..2] {
                assert!(f.len() < a.len() / 4, "{codec}: {} bytes stored", f.len());
                assert_ne!(f[2], STORED, "{codec}");
                assert_eq!(unframe(f).unwrap(), a, "{codec}");
            }
            assert!(frames[2].is_empty(), "an empty data part stays empty");
        }
    }

    #[test]
    fn higher_zstd_levels_store_fewer_bytes_here() {
        let a: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 1000 + i / 5000).to_le_bytes())
            .collect();
        let one = pack(Compression::Zstd(1), &[vec![a.clone().into()]], false);
        let high = pack(Compression::Zstd(19), &[vec![a.into()]], false);
        assert!(
            high[0].len() < one[0].len(),
            "{} vs {}",
            high[0].len(),
            one[0].len()
        );
    }

    #[test]
    fn incompressible_data_is_stored_raw_behind_a_header() {
        let n = noise(10_000);
        for codec in [Compression::Zstd(3), Compression::Lz4(0)] {
            let frames = pack(codec, &[vec![Bytes::from(n.clone())]], false);
            let f = &frames[0];
            assert_eq!(f.len(), n.len() + HEADER_LEN);
            assert_eq!(f[2], STORED);
            assert_eq!(&f[HEADER_LEN..], &n[..]);
            assert_eq!(unframe(f).unwrap(), n);
        }
    }

    fn frame_of(codec: u8, len: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = header(codec, len).to_vec();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn corrupt_frames_are_refused_without_panic() {
        let a = array(4096);
        let good = pack(Compression::Zstd(3), &[vec![Bytes::from(a.clone())]], false)[0].to_vec();
        let lz = pack(Compression::Lz4(0), &[vec![Bytes::from(a.clone())]], false)[0].to_vec();
        let len = a.len() as u64;
        // Truncated: shorter than a header, and a cut payload.
        assert_eq!(unframe(&good[..5]), Err(FrameError::Truncated { len: 5 }));
        assert!(unframe(&good[..good.len() - 3]).is_err());
        assert!(unframe(&lz[..lz.len() - 3]).is_err());
        // Bad magic, codec and flags.
        let mut f = good.clone();
        f[0] = b'X';
        assert!(matches!(unframe(&f), Err(FrameError::BadMagic { .. })));
        let mut f = good.clone();
        f[2] = 9;
        assert_eq!(unframe(&f), Err(FrameError::UnknownCodec(9)));
        let mut f = good.clone();
        f[3] = 1;
        assert_eq!(unframe(&f), Err(FrameError::Flags(1)));
        // Lying lengths: zstd's own header disagrees; lz4 decodes to less.
        let zstd_payload = &good[HEADER_LEN..];
        let lying = frame_of(ZSTD, len + 1, zstd_payload);
        assert!(matches!(
            unframe(&lying),
            Err(FrameError::LengthMismatch { .. })
        ));
        let lying = frame_of(LZ4, len + 5, &lz[HEADER_LEN..]);
        assert!(unframe(&lying).is_err());
        let lying = frame_of(LZ4, len - 5, &lz[HEADER_LEN..]);
        assert!(unframe(&lying).is_err());
        let lying = frame_of(STORED, 10, b"abc");
        assert!(matches!(
            unframe(&lying),
            Err(FrameError::LengthMismatch { .. })
        ));
        // Huge lengths: above the cap, and more than the payload can hold.
        let huge = frame_of(ZSTD, u64::MAX, zstd_payload);
        assert!(matches!(unframe(&huge), Err(FrameError::TooLarge { .. })));
        let big = frame_of(LZ4, 100 << 20, &[0u8; 16]);
        assert!(matches!(
            unframe(&big),
            Err(FrameError::LengthMismatch { .. })
        ));
        let big = frame_of(ZSTD, 100 << 20, &[0u8; 16]);
        assert!(unframe(&big).is_err());
        // Garbage after a valid header.
        for codec in [ZSTD, LZ4] {
            assert!(unframe(&frame_of(codec, 64, &noise(40))).is_err());
        }
    }
}
