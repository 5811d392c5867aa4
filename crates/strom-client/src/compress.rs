//! Data-part compression, per topic (`TopicSpec::compression`, see
//! docs/compression.md). Producers frame every non-empty data part of a
//! compressed topic on their background threads; consumers check and
//! decode the frame before selectors, brokers and the application see the
//! data. Servers store frames as opaque bytes.
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
use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use strom_proto::{Compression, ErrorCode};

use crate::consumer::Shared;
use crate::data::{plan_fill, DataBroker, DataBuffer, DataDescriptor, DataSelector};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::subscription::Fetched;

/// Bytes of the frame header.
pub(crate) const HEADER_LEN: usize = 12;
const MAGIC: [u8; 2] = *b"SZ";
const STORED: u8 = 0;
const ZSTD: u8 = 1;
const LZ4: u8 = 2;
/// The most an LZ4 block expands: one byte of input ends up as at most
/// 255 bytes of output, plus a short literal tail.
const LZ4_MAX_RATIO: u64 = 255;

/// The largest uncompressed data part a consumer decodes: what a producer
/// can push at all (its frame limit), so larger claims are lies.
pub(crate) const MAX_UNCOMPRESSED: u64 = strom_proto::DEFAULT_MAX_FRAME as u64;

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
fn zstd_encode(level: i32, src: &[u8], dst: &mut [u8]) -> std::io::Result<usize> {
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

/// Why a stored data part is not a frame this client can decode.
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

/// A checked frame: its codec, uncompressed length and payload.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
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

fn header(codec: u8, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..2].copy_from_slice(&MAGIC);
    h[2] = codec;
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

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

/// What a consumer of a compressed topic runs on each event once its
/// stored frame was fetched (alone, into the event's one buffer).
pub(crate) struct Unpacker {
    pub topic: String,
    pub selector: Arc<dyn DataSelector>,
    pub broker: Arc<dyn DataBroker>,
}

impl Unpacker {
    /// Checks and decodes the event's frame, runs the selector and broker
    /// on the uncompressed view, and fills the broker's buffers with the
    /// selected bytes. A bad frame is a [`Error::DataFrame`]; selector and
    /// broker failures are what they are on other topics.
    pub fn unpack(&self, mut ev: Event) -> Result<Event> {
        if ev.data_size == 0 {
            return Ok(ev);
        }
        let stored = std::mem::take(&mut ev.buffers);
        let bytes = match stored.first() {
            Some(b) => &b.as_slice()[..ev.fetched as usize],
            // Not fetched: more than any frame of an event can hold.
            None => {
                let claimed = ev.data_size;
                return Err(self.bad(
                    &ev,
                    FrameError::TooLarge {
                        claimed,
                        cap: MAX_UNCOMPRESSED,
                    },
                ));
            }
        };
        let frame = Frame::parse(bytes, MAX_UNCOMPRESSED).map_err(|e| self.bad(&ev, e))?;
        let size = frame.len();
        let desc = DataDescriptor {
            size,
            descriptor: ev.descriptor.clone(),
        };
        let sel = self
            .selector
            .try_select(&ev.meta, &desc)
            .map_err(Error::Selector)?;
        let ranges = sel.resolve(size).map_err(Error::Selector)?;
        let fetched: u64 = ranges.iter().map(|r| r.1).sum();
        (ev.data_size, ev.fetched) = (size, fetched);
        if fetched == 0 {
            return Ok(ev);
        }
        let mut bufs = self
            .broker
            .buffers(&ev.meta, &sel, fetched)
            .map_err(Error::Broker)?;
        let mut plan = Vec::new();
        plan_fill(&bufs, 0, fetched, &mut plan)?;
        if ranges == [(0, size)] && plan.len() == 1 {
            // The whole part into one buffer: decoded in place, no copy.
            let out = &mut bufs[0].as_mut_slice()[..size as usize];
            frame.decode_into(out).map_err(|e| self.bad(&ev, e))?;
        } else {
            let full = frame.decode().map_err(|e| self.bad(&ev, e))?;
            scatter(&full, &ranges, &mut bufs, &plan);
        }
        ev.buffers = bufs;
        Ok(ev)
    }

    fn bad(&self, ev: &Event, source: FrameError) -> Error {
        Error::DataFrame {
            topic: self.topic.clone(),
            partition: ev.meta.partition,
            offset: ev.meta.offset,
            source,
        }
    }
}

/// Copies the `ranges` of `full` in order over the `(buffer, start, len)`
/// pieces of `plan` (which add up to the ranges' length).
fn scatter(
    full: &[u8],
    ranges: &[(u64, u64)],
    bufs: &mut [Box<dyn DataBuffer>],
    plan: &[(usize, usize, usize)],
) {
    let mut pieces = plan.iter().copied();
    let mut cur = pieces.next();
    for &(o, l) in ranges {
        let mut src = &full[o as usize..(o + l) as usize];
        while let (false, Some((b, pos, left))) = (src.is_empty(), cur.as_mut()) {
            let n = (*left).min(src.len());
            bufs[*b].as_mut_slice()[*pos..*pos + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            *pos += n;
            *left -= n;
            if *left == 0 {
                cur = pieces.next();
            }
        }
    }
}

// The background halves: what the producer's sender task and the
// consumer's subscription task run for a compressed topic.

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

/// Decodes a compressed topic's fetched events on the blocking pool (the
/// selectors and brokers run there too), and moves the data budget from
/// the stored frames to the selected bytes handed out.
pub(crate) async fn unpack_all(
    shared: &Shared,
    u: Arc<Unpacker>,
    events: VecDeque<Event>,
) -> Result<Fetched> {
    let stored: u64 = events.iter().map(|e| e.fetched_len()).sum();
    let decoded = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            match u.unpack(ev) {
                Ok(ev) => out.push(Ok(ev)),
                Err(e @ Error::DataFrame { .. }) => out.push(Err(e)),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::coded(ErrorCode::INTERNAL, format!("decoding data parts: {e}")));
    let decoded = match decoded.and_then(|d| d) {
        Ok(d) => d,
        Err(e) => {
            shared.budget.release(stored);
            return Err(e);
        }
    };
    let held: u64 = decoded.iter().flatten().map(|e| e.fetched_len()).sum();
    match held.cmp(&stored) {
        std::cmp::Ordering::Greater => shared.budget.take(held - stored),
        _ => shared.budget.release(stored - held),
    }
    Ok(decoded)
}

/// A buffer for a compressed event's whole stored frame (`len` bytes),
/// planned to be filled; 0 (nothing fetched) when no frame can be that
/// large, which decoding then reports.
pub(crate) fn stored_frame(
    len: u64,
    buffers: &mut Vec<Box<dyn DataBuffer>>,
    plan: &mut Vec<(usize, usize, usize)>,
) -> u64 {
    let most = MAX_UNCOMPRESSED + HEADER_LEN as u64;
    if len > most {
        return 0;
    }
    plan.push((buffers.len(), 0, len as usize));
    buffers.push(Box::new(vec![0u8; len as usize]));
    len
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn selected_ranges_are_scattered_over_the_brokers_buffers() {
        let full: Vec<u8> = (0..100u8).collect();
        let mut bufs: Vec<Box<dyn DataBuffer>> =
            vec![Box::new(vec![0u8; 3]), Box::new(vec![0u8; 9])];
        let mut plan = Vec::new();
        plan_fill(&bufs, 0, 12, &mut plan).unwrap();
        scatter(&full, &[(10, 5), (50, 7)], &mut bufs, &plan);
        assert_eq!(bufs[0].as_slice(), &[10, 11, 12]);
        assert_eq!(bufs[1].as_slice(), &[13, 14, 50, 51, 52, 53, 54, 55, 56]);
    }
}
