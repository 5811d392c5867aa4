//! Reading and writing frames on a byte stream.
//!
//! [`FrameReader`] buffers headers and bodies, and hands the bulk payload out
//! separately: straight into a caller's buffer ([`FrameReader::read_bulk_into`])
//! or as chunks whose allocation grows only as bytes arrive, so a peer that
//! announces a huge frame and sends nothing costs nothing.
//! [`FrameWriter`] coalesces small frames into one write and writes large bulk
//! chunks directly from the caller's buffers.

use bytes::{Buf, Bytes, BytesMut};
use strom_proto::{FrameHeader, FrameKind, Push, Request, Response, FRAME_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::error::NetError;

const READ_CHUNK: usize = 64 << 10;
const BULK_CHUNK: usize = 4 << 20;
const COPY_LIMIT: usize = 32 << 10;
const FLUSH_AT: usize = 1 << 20;

pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_frame: u32,
    pending_bulk: u64,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame: u32) -> Self {
        FrameReader {
            inner,
            buf: BytesMut::with_capacity(READ_CHUNK),
            max_frame,
            pending_bulk: 0,
        }
    }

    /// Reads more bytes into the buffer; `Ok(false)` on end of stream.
    async fn fill(&mut self, want: usize) -> Result<bool, NetError> {
        self.buf.reserve(want.clamp(READ_CHUNK, BULK_CHUNK));
        let n = self
            .inner
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

    /// Reads the next frame's header and body. The previous frame's bulk
    /// payload must have been consumed. `None` means the peer closed cleanly
    /// between frames.
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
        self.buf.advance(FRAME_HEADER_LEN);
        if !self.buffered(header.body_len as usize).await? {
            return Err(NetError::Closed);
        }
        let body = self.buf.split_to(header.body_len as usize).freeze();
        self.pending_bulk = header.bulk_len;
        Ok(Some((header, body)))
    }

    /// Bulk bytes of the current frame not yet consumed.
    pub fn pending_bulk(&self) -> u64 {
        self.pending_bulk
    }

    /// Reads the next `dst.len()` bulk bytes straight into `dst`.
    pub async fn read_bulk_into(&mut self, dst: &mut [u8]) -> Result<(), NetError> {
        if dst.len() as u64 > self.pending_bulk {
            return Err(NetError::BulkMismatch {
                announced: self.pending_bulk,
                expected: dst.len() as u64,
            });
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

    /// Reads the rest of the bulk payload as chunks of at most 4 MiB each.
    pub async fn read_bulk(&mut self) -> Result<Vec<Bytes>, NetError> {
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
        let mut scratch = vec![0u8; (self.pending_bulk.min(READ_CHUNK as u64)) as usize];
        while self.pending_bulk > 0 {
            let n = self.pending_bulk.min(scratch.len() as u64) as usize;
            self.read_bulk_into(&mut scratch[..n]).await?;
        }
        Ok(())
    }
}

/// A frame ready to send: encoded body plus bulk chunks sent without copying.
#[derive(Debug)]
pub struct OutFrame {
    pub kind: FrameKind,
    pub opcode: u16,
    pub id: u64,
    pub body: Bytes,
    pub bulk: Vec<Bytes>,
}

impl OutFrame {
    fn new(kind: FrameKind, opcode: u16, id: u64, encode: impl FnOnce(&mut BytesMut)) -> Self {
        let mut body = BytesMut::new();
        encode(&mut body);
        OutFrame {
            kind,
            opcode,
            id,
            body: body.freeze(),
            bulk: Vec::new(),
        }
    }
    pub fn request(id: u64, msg: &Request) -> Self {
        Self::new(FrameKind::Request, msg.opcode(), id, |b| msg.encode(b))
    }
    pub fn response(id: u64, msg: &Response) -> Self {
        Self::new(FrameKind::Response, msg.opcode(), id, |b| msg.encode(b))
    }
    pub fn push(stream: u64, msg: &Push) -> Self {
        Self::new(FrameKind::Push, msg.opcode(), stream, |b| msg.encode(b))
    }
    pub fn with_bulk(mut self, bulk: Vec<Bytes>) -> Self {
        self.bulk = bulk;
        self
    }
    pub fn bulk_len(&self) -> u64 {
        self.bulk.iter().map(|b| b.len() as u64).sum()
    }
}

pub struct FrameWriter<W> {
    inner: W,
    buf: BytesMut,
    max_frame: u32,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(inner: W, max_frame: u32) -> Self {
        FrameWriter {
            inner,
            buf: BytesMut::with_capacity(READ_CHUNK),
            max_frame,
        }
    }

    /// Queues a frame; small parts are coalesced, large bulk chunks written directly.
    pub async fn write(&mut self, f: &OutFrame) -> Result<(), NetError> {
        let header = FrameHeader {
            kind: f.kind,
            opcode: f.opcode,
            id: f.id,
            body_len: f.body.len() as u32,
            bulk_len: f.bulk_len(),
        }
        .encode(self.max_frame)?;
        self.buf.extend_from_slice(&header);
        self.buf.extend_from_slice(&f.body);
        for chunk in &f.bulk {
            if chunk.len() <= COPY_LIMIT {
                self.buf.extend_from_slice(chunk);
            } else {
                self.flush_buf().await?;
                self.inner
                    .write_all(chunk)
                    .await
                    .map_err(|e| NetError::io("writing a bulk payload", e))?;
            }
        }
        if self.buf.len() >= FLUSH_AT {
            self.flush_buf().await?;
        }
        Ok(())
    }

    async fn flush_buf(&mut self) -> Result<(), NetError> {
        if !self.buf.is_empty() {
            self.inner
                .write_all(&self.buf)
                .await
                .map_err(|e| NetError::io("writing to the connection", e))?;
            self.buf.clear();
        }
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<(), NetError> {
        self.flush_buf().await?;
        self.inner
            .flush()
            .await
            .map_err(|e| NetError::io("flushing the connection", e))
    }
}

/// Sends frames to a connection's writer task. Cheap to clone.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<OutFrame>,
}

impl WriterHandle {
    pub async fn send(&self, f: OutFrame) -> Result<(), NetError> {
        self.tx.send(f).await.map_err(|_| NetError::Closed)
    }

    /// Sends without waiting; fails if the queue is full or the writer stopped.
    pub fn try_send(&self, f: OutFrame) -> Result<(), NetError> {
        self.tx.try_send(f).map_err(|_| NetError::Closed)
    }

    /// Sends without waiting; hands the frame back if the queue is full
    /// or the writer stopped.
    pub fn try_send_frame(&self, f: OutFrame) -> Result<(), OutFrame> {
        self.tx.try_send(f).map_err(|e| match e {
            mpsc::error::TrySendError::Full(f) | mpsc::error::TrySendError::Closed(f) => f,
        })
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Starts a task that writes queued frames, batching whatever is queued into
/// as few writes as possible. It ends when every handle is dropped or a write
/// fails (the error is logged and reported through `on_exit`).
pub fn spawn_writer<W>(
    mut writer: FrameWriter<W>,
    peer: String,
    on_exit: impl FnOnce(Option<NetError>) + Send + 'static,
) -> WriterHandle
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<OutFrame>(1024);
    tokio::spawn(async move {
        let result: Result<(), NetError> = async {
            while let Some(f) = rx.recv().await {
                writer.write(&f).await?;
                while let Ok(f) = rx.try_recv() {
                    writer.write(&f).await?;
                }
                writer.flush().await?;
            }
            Ok(())
        }
        .await;
        if let Err(e) = &result {
            tracing::debug!(peer = %peer, error = %e, "connection writer stopped");
        }
        on_exit(result.err());
    });
    WriterHandle { tx }
}
