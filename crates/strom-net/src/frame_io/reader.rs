//! [`FrameReader`]: reads frames from a byte stream, buffering headers
//! and bodies, and hands each frame's bulk payload out separately:
//! straight into a caller's buffer ([`FrameReader::read_bulk_into`]), as
//! consecutive slices for a run of small pieces
//! ([`FrameReader::read_bulk_with`]), or as chunks whose allocation grows
//! only as bytes arrive, so a peer that announces a huge frame and sends
//! nothing costs nothing.

use bytes::{Buf, Bytes, BytesMut};
use strom_proto::{FrameHeader, FRAME_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::bulk::BulkReceiver;
use crate::error::NetError;

use super::{BULK_CHUNK, COPY_LIMIT, READ_CHUNK};

/// An inline payload at least this large makes the reader *lean*: for the
/// next few frames it reads about one header and body at a time, so the
/// payload of a frame like it lands in its own buffer instead of in this
/// reader's read-ahead, from which it would be copied once more.
const LEAN_MIN: u64 = 16 << 10;
/// How much a lean reader reads ahead (more if a body needs it).
const LEAN_AHEAD: usize = 4 << 10;
/// Frames a reader stays lean for after the last large payload.
const LEAN_FRAMES: u8 = 4;

pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_frame: u32,
    pending_bulk: u64,
    /// The out-of-band bulk path (None: payloads follow the body inline).
    bulk: Option<Box<dyn BulkReceiver>>,
    /// Frames left to read lean (see [`LEAN_MIN`]).
    lean: u8,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of frames whose bulk payloads follow their body inline.
    pub fn new(inner: R, max_frame: u32) -> Self {
        FrameReader {
            inner,
            // Allocated on the first read: an idle connection costs little.
            buf: BytesMut::new(),
            max_frame,
            pending_bulk: 0,
            bulk: None,
            lean: 0,
        }
    }

    /// A reader of frames whose bulk payloads arrive through `bulk`.
    pub fn with_bulk(inner: R, max_frame: u32, bulk: Box<dyn BulkReceiver>) -> Self {
        FrameReader {
            bulk: Some(bulk),
            ..Self::new(inner, max_frame)
        }
    }

    /// Whether bulk payloads travel inline on the frame stream.
    pub fn bulk_is_inline(&self) -> bool {
        self.bulk.is_none()
    }

    /// Between frames with nothing of the next one read yet: another
    /// reader of the same socket may take over here.
    pub(crate) fn at_boundary(&self) -> bool {
        self.buf.is_empty() && self.pending_bulk == 0
    }

    /// Puts `inner` in the place of the byte source (a thread reading the
    /// socket itself, `here.rs`); returns the one it replaced.
    pub(crate) fn replace_inner(&mut self, inner: R) -> R {
        std::mem::replace(&mut self.inner, inner)
    }

    /// Reads more bytes into the buffer; `Ok(false)` on end of stream.
    async fn fill(&mut self, want: usize) -> Result<bool, NetError> {
        // Read ahead in large chunks, except while completing a header on a
        // fresh connection (a stalled peer then pins no large buffer).
        let header_only = self.buf.len() + want <= FRAME_HEADER_LEN;
        let ahead = if header_only && self.buf.capacity() < READ_CHUNK {
            want
        } else {
            want.clamp(READ_CHUNK, BULK_CHUNK)
        };
        self.buf.reserve(ahead);
        let limit = match self.lean {
            0 => u64::MAX,
            _ => want.max(LEAN_AHEAD) as u64,
        };
        let n = (&mut self.inner)
            .take(limit)
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| NetError::io("reading from the connection", e))?;
        Ok(n > 0)
    }

    async fn buffered(&mut self, n: usize) -> Result<bool, NetError> {
        while self.buf.len() < n {
            if !self.fill(n - self.buf.len()).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits until the next frame has started to arrive (at least one byte
    /// is buffered); `Ok(false)` if the peer closed first. Cancel-safe: a
    /// server waits here without a deadline, then gives the frame itself a
    /// bounded time.
    pub async fn ready(&mut self) -> Result<bool, NetError> {
        if !self.buf.is_empty() || self.pending_bulk > 0 {
            return Ok(true);
        }
        if self.buf.capacity() == 0 {
            // A small first read: a connection that sends a few bytes and
            // stalls pins no large buffer.
            self.buf.reserve(FRAME_HEADER_LEN);
            let n = self
                .inner
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| NetError::io("reading from the connection", e))?;
            return Ok(n > 0);
        }
        let want = if self.lean > 0 {
            FRAME_HEADER_LEN
        } else {
            READ_CHUNK
        };
        self.fill(want).await
    }

    /// Reads the next frame's header and body. The previous frame's bulk
    /// payload must have been consumed. `None` means the peer closed cleanly
    /// between frames. Cancel-safe until the body is complete: nothing is
    /// consumed from the buffer before that.
    pub async fn next(&mut self) -> Result<Option<(FrameHeader, Bytes)>, NetError> {
        debug_assert_eq!(self.pending_bulk, 0, "bulk payload not consumed");
        if !self.buffered(FRAME_HEADER_LEN).await? {
            return if self.buf.is_empty() {
                Ok(None)
            } else {
                Err(NetError::Closed)
            };
        }
        let mut h = [0u8; FRAME_HEADER_LEN];
        h.copy_from_slice(&self.buf[..FRAME_HEADER_LEN]);
        let header = FrameHeader::decode(&h, self.max_frame)?;
        if !self
            .buffered(FRAME_HEADER_LEN + header.body_len as usize)
            .await?
        {
            return Err(NetError::Closed);
        }
        self.buf.advance(FRAME_HEADER_LEN);
        let body = self.buf.split_to(header.body_len as usize).freeze();
        self.pending_bulk = header.bulk_len;
        self.lean = match self.bulk.is_none() && header.bulk_len >= LEAN_MIN {
            true => LEAN_FRAMES,
            false => self.lean.saturating_sub(1),
        };
        Ok(Some((header, body)))
    }

    /// Bulk bytes of the current frame not yet consumed.
    pub fn pending_bulk(&self) -> u64 {
        self.pending_bulk
    }

    /// Whether `n` more bulk bytes of this frame are left to read.
    fn check_pending(&self, n: u64) -> Result<(), NetError> {
        if n > self.pending_bulk {
            return Err(NetError::BulkMismatch {
                announced: self.pending_bulk,
                expected: n,
            });
        }
        Ok(())
    }

    /// Reads the next `dst.len()` bulk bytes straight into `dst`.
    pub async fn read_bulk_into(&mut self, dst: &mut [u8]) -> Result<(), NetError> {
        self.check_pending(dst.len() as u64)?;
        if let Some(bulk) = &mut self.bulk {
            bulk.read_into(dst).await?;
            self.pending_bulk -= dst.len() as u64;
            return Ok(());
        }
        let from_buf = dst.len().min(self.buf.len());
        dst[..from_buf].copy_from_slice(&self.buf[..from_buf]);
        self.buf.advance(from_buf);
        if from_buf < dst.len() {
            self.inner
                .read_exact(&mut dst[from_buf..])
                .await
                .map_err(|e| NetError::io("reading a bulk payload", e))?;
        }
        self.pending_bulk -= dst.len() as u64;
        Ok(())
    }

    /// Hands the next `n` bulk bytes to `sink`, in one or more consecutive
    /// slices, read in as few reads as the transport allows: inline, they
    /// pass through the read-ahead (reads of up to the rest of this frame's
    /// payload); through a bulk path, they come in one transfer. For runs
    /// of small pieces, which [`read_bulk_into`](Self::read_bulk_into)
    /// would read one by one.
    pub async fn read_bulk_with(
        &mut self,
        n: usize,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<(), NetError> {
        self.check_pending(n as u64)?;
        if let Some(bulk) = &mut self.bulk {
            for chunk in bulk.read(n as u64).await? {
                sink(&chunk);
            }
            self.pending_bulk -= n as u64;
            return Ok(());
        }
        while self.buf.len() < n {
            // Never past this frame's payload: the next frame's may be
            // large, and it should land in its own buffer.
            let rest = self.pending_bulk - self.buf.len() as u64;
            self.buf.reserve(n - self.buf.len());
            let got = (&mut self.inner)
                .take(rest)
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| NetError::io("reading a bulk payload", e))?;
            if got == 0 {
                return Err(NetError::Closed);
            }
        }
        sink(&self.buf[..n]);
        self.buf.advance(n);
        self.pending_bulk -= n as u64;
        Ok(())
    }

    /// Reads the rest of the bulk payload as chunks of at most 4 MiB each.
    pub async fn read_bulk(&mut self) -> Result<Vec<Bytes>, NetError> {
        if let Some(bulk) = &mut self.bulk {
            let out = bulk.read(self.pending_bulk).await?;
            self.pending_bulk = 0;
            return Ok(out);
        }
        let mut out = Vec::new();
        while self.pending_bulk > 0 {
            let want = self.pending_bulk.min(BULK_CHUNK as u64) as usize;
            if self.buf.len() >= want || (!self.buf.is_empty() && want <= COPY_LIMIT) {
                let n = want.min(self.buf.len());
                out.push(self.buf.split_to(n).freeze());
                self.pending_bulk -= n as u64;
                continue;
            }
            let mut chunk = BytesMut::with_capacity(want);
            let take = self.buf.len().min(want);
            chunk.extend_from_slice(&self.buf[..take]);
            self.buf.advance(take);
            while chunk.len() < want {
                let n = (&mut self.inner)
                    .take((want - chunk.len()) as u64)
                    .read_buf(&mut chunk)
                    .await
                    .map_err(|e| NetError::io("reading a bulk payload", e))?;
                if n == 0 {
                    return Err(NetError::Closed);
                }
            }
            self.pending_bulk -= want as u64;
            out.push(chunk.freeze());
        }
        Ok(out)
    }

    /// Discards the rest of the bulk payload.
    pub async fn skip_bulk(&mut self) -> Result<(), NetError> {
        if let Some(bulk) = &mut self.bulk {
            bulk.skip(self.pending_bulk).await?;
            self.pending_bulk = 0;
            return Ok(());
        }
        if self.pending_bulk == 0 {
            return Ok(());
        }
        let mut scratch = vec![0u8; (self.pending_bulk.min(READ_CHUNK as u64)) as usize];
        while self.pending_bulk > 0 {
            let n = self.pending_bulk.min(scratch.len() as u64) as usize;
            self.read_bulk_into(&mut scratch[..n]).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame_io::{FrameWriter, OutFrame};
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    fn frame_with_bulk(id: u64, bulk: Vec<u8>) -> OutFrame {
        OutFrame {
            version: strom_proto::PROTOCOL_VERSION,
            kind: strom_proto::FrameKind::Response,
            opcode: 0,
            id,
            body: Bytes::from_static(b"body"),
            body_rest: Vec::new(),
            bulk: vec![Bytes::from(bulk)],
            hold: None,
        }
    }

    /// After a large payload read into its own buffer, the next frames are
    /// read lean: their payloads do not pass through the read-ahead (where
    /// they would be copied once more), and every byte still arrives.
    #[tokio::test]
    async fn payloads_after_a_large_one_skip_the_read_ahead() {
        let max = strom_proto::DEFAULT_MAX_FRAME;
        let mut w = FrameWriter::new(Vec::new(), max);
        for id in 1..=3u64 {
            let bulk: Vec<u8> = (0..64 << 10).map(|i| (i as u64 * id) as u8).collect();
            w.write(&frame_with_bulk(id, bulk)).await.unwrap();
        }
        w.flush().await.unwrap();
        let bytes = w.inner;
        let mut r = FrameReader::new(&bytes[..], max);
        for id in 1..=3u64 {
            let (h, body) = r.next().await.unwrap().unwrap();
            assert_eq!((h.id, &body[..]), (id, &b"body"[..]));
            if id > 1 {
                assert!(
                    r.buf.len() <= LEAN_AHEAD,
                    "frame {id}: {} bytes of its payload read ahead",
                    r.buf.len()
                );
            }
            let mut dst = vec![0u8; 64 << 10];
            r.read_bulk_into(&mut dst).await.unwrap();
            assert!(dst
                .iter()
                .enumerate()
                .all(|(i, b)| *b == (i as u64 * id) as u8));
        }
        assert!(r.next().await.unwrap().is_none());
    }

    /// A byte source that counts the reads that returned bytes.
    struct Counting<'a> {
        inner: &'a [u8],
        reads: Arc<AtomicUsize>,
    }

    impl AsyncRead for Counting<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let before = buf.filled().len();
            let r = Pin::new(&mut self.inner).poll_read(cx, buf);
            if buf.filled().len() > before {
                self.reads.fetch_add(1, Ordering::Relaxed);
            }
            r
        }
    }

    /// The fetch of many small events: after a large payload made the
    /// reader lean, a frame carrying 64 payloads of 1 KiB is read in one
    /// read, not 64, every byte lands where it belongs, and the read stops
    /// at the end of the frame's payload (the next frame is not read ahead).
    #[tokio::test]
    async fn a_run_of_small_payloads_comes_in_one_read() {
        let max = strom_proto::DEFAULT_MAX_FRAME;
        let mut w = FrameWriter::new(Vec::new(), max);
        w.write(&frame_with_bulk(1, vec![7u8; 64 << 10]))
            .await
            .unwrap();
        let small: Vec<u8> = (0..64 << 10).map(|i: u32| (i / 1024 + i) as u8).collect();
        w.write(&frame_with_bulk(2, small.clone())).await.unwrap();
        w.write(&frame_with_bulk(3, vec![9u8; 64 << 10]))
            .await
            .unwrap();
        w.flush().await.unwrap();
        let bytes = w.inner;
        let reads = Arc::new(AtomicUsize::new(0));
        let src = Counting {
            inner: &bytes[..],
            reads: reads.clone(),
        };
        let mut r = FrameReader::new(src, max);
        r.next().await.unwrap().unwrap();
        r.skip_bulk().await.unwrap();
        let (h, _) = r.next().await.unwrap().unwrap();
        assert_eq!(h.id, 2);
        let before = reads.load(Ordering::Relaxed);
        let mut pieces = vec![Vec::new(); 64];
        let mut at = 0usize;
        r.read_bulk_with(64 << 10, |s| {
            for &b in s {
                pieces[at / 1024].push(b);
                at += 1;
            }
        })
        .await
        .unwrap();
        let used = reads.load(Ordering::Relaxed) - before;
        assert!(used <= 1, "{used} reads for 64 payloads of 1 KiB");
        assert_eq!(pieces.concat(), small);
        assert!(r.buf.is_empty(), "read past the frame's payload");
        let (h, _) = r.next().await.unwrap().unwrap();
        assert_eq!(h.id, 3);
        let mut dst = vec![0u8; 64 << 10];
        r.read_bulk_into(&mut dst).await.unwrap();
        assert!(dst.iter().all(|&b| b == 9));
        assert!(
            r.read_bulk_with(1, |_| {}).await.is_err(),
            "past the payload"
        );
    }
}
