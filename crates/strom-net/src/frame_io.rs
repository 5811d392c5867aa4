//! Reading and writing frames on a byte stream.
//!
//! [`FrameReader`] buffers headers and bodies, and hands the bulk payload out
//! separately: straight into a caller's buffer ([`FrameReader::read_bulk_into`])
//! or as chunks whose allocation grows only as bytes arrive, so a peer that
//! announces a huge frame and sends nothing costs nothing.
//! [`FrameWriter`] coalesces small frames into one write and writes large bulk
//! chunks directly from the caller's buffers.
//!
//! Both move bulk payloads inline on the stream unless the transport gave
//! them an out-of-band bulk path ([`crate::bulk`]); callers use the same
//! methods either way.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use parking_lot::Mutex;
use strom_proto::{FrameHeader, FrameKind, ProtoError, Push, Request, Response, FRAME_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::bulk::{BulkReceiver, BulkSender};
use crate::error::NetError;

const READ_CHUNK: usize = 64 << 10;
const BULK_CHUNK: usize = 4 << 20;
const COPY_LIMIT: usize = 32 << 10;
const FLUSH_AT: usize = 1 << 20;
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

    /// Reads the next `dst.len()` bulk bytes straight into `dst`.
    pub async fn read_bulk_into(&mut self, dst: &mut [u8]) -> Result<(), NetError> {
        if dst.len() as u64 > self.pending_bulk {
            return Err(NetError::BulkMismatch {
                announced: self.pending_bulk,
                expected: dst.len() as u64,
            });
        }
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

/// A frame ready to send: encoded body plus bulk chunks sent without copying.
#[derive(Debug)]
pub struct OutFrame {
    /// The protocol version the body was encoded in.
    pub version: u8,
    pub kind: FrameKind,
    pub opcode: u16,
    pub id: u64,
    pub body: Bytes,
    /// The rest of the body, written after `body` from these buffers
    /// without joining them to it: a message's `@rest` field (a batch's
    /// metadata section), so its bytes are not copied into the body.
    pub body_rest: Vec<Bytes>,
    pub bulk: Vec<Bytes>,
    /// Dropped once the frame has been written (or discarded): a sender
    /// attaches a memory-budget permit here to bound queued bytes.
    pub hold: Option<Hold>,
}

/// Something kept alive until its frame is written, such as a permit.
pub struct Hold(pub Box<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

impl OutFrame {
    fn new(
        version: u8,
        kind: FrameKind,
        opcode: u16,
        id: u64,
        encode_head: impl FnOnce(&mut BytesMut),
        rest: Option<&Bytes>,
    ) -> Self {
        let mut body = BytesMut::new();
        encode_head(&mut body);
        OutFrame {
            version,
            kind,
            opcode,
            id,
            body: body.freeze(),
            body_rest: rest
                .filter(|r| !r.is_empty())
                .cloned()
                .into_iter()
                .collect(),
            bulk: Vec::new(),
            hold: None,
        }
    }
    /// A request encoded at protocol `version` (the connection's).
    pub fn request(version: u8, id: u64, msg: &Request) -> Self {
        Self::new(
            version,
            FrameKind::Request,
            msg.opcode(),
            id,
            |b| msg.encode_head(version, b),
            msg.rest(),
        )
    }
    /// A request whose `@rest` field (empty in `msg`) is `rest`, in pieces
    /// that are written as they are (a batch's [`strom_proto::Section`]).
    pub fn request_with_rest(version: u8, id: u64, msg: &Request, rest: Vec<Bytes>) -> Self {
        debug_assert!(msg.rest().is_some_and(|r| r.is_empty()));
        let mut f = Self::request(version, id, msg);
        f.body_rest = rest;
        f
    }
    /// A response encoded at protocol `version` (the connection's).
    pub fn response(version: u8, id: u64, msg: &Response) -> Self {
        Self::new(
            version,
            FrameKind::Response,
            msg.opcode(),
            id,
            |b| msg.encode_head(version, b),
            msg.rest(),
        )
    }
    /// A push encoded at protocol `version` (the connection's).
    pub fn push(version: u8, stream: u64, msg: &Push) -> Self {
        Self::new(
            version,
            FrameKind::Push,
            msg.opcode(),
            stream,
            |b| msg.encode_head(version, b),
            msg.rest(),
        )
    }
    /// The frame's header, checked against `max_frame`; a body past `u32`
    /// is refused too (the header's field would wrap).
    fn header(&self, max_frame: u32) -> Result<[u8; FRAME_HEADER_LEN], NetError> {
        let len = self.body_len();
        let body_len =
            u32::try_from(len).map_err(|_| ProtoError::FrameTooLarge { len, max: u32::MAX })?;
        let h = FrameHeader {
            version: self.version,
            kind: self.kind,
            opcode: self.opcode,
            id: self.id,
            body_len,
            bulk_len: self.bulk_len(),
        };
        Ok(h.encode(max_frame)?)
    }
    /// Bytes of the whole body (`body` and `body_rest`).
    pub fn body_len(&self) -> u64 {
        self.body.len() as u64 + self.body_rest.iter().map(|b| b.len() as u64).sum::<u64>()
    }
    pub fn with_bulk(mut self, bulk: Vec<Bytes>) -> Self {
        self.bulk = bulk;
        self
    }
    /// Keeps `hold` alive until this frame has been written or discarded.
    pub fn with_hold(mut self, hold: impl std::any::Any + Send + Sync) -> Self {
        self.hold = Some(Hold(Box::new(hold)));
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
    /// The out-of-band bulk path (None: payloads follow the body inline).
    bulk: Option<Arc<dyn BulkSender>>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer of frames whose bulk payloads follow their body inline.
    pub fn new(inner: W, max_frame: u32) -> Self {
        FrameWriter {
            inner,
            // Allocated on the first write: an idle connection costs little.
            buf: BytesMut::new(),
            max_frame,
            bulk: None,
        }
    }

    /// A writer of frames whose bulk payloads go through `bulk`.
    pub fn with_bulk(inner: W, max_frame: u32, bulk: Arc<dyn BulkSender>) -> Self {
        FrameWriter {
            bulk: Some(bulk),
            ..Self::new(inner, max_frame)
        }
    }

    /// Whether bulk payloads travel inline on the frame stream.
    pub fn bulk_is_inline(&self) -> bool {
        self.bulk.is_none()
    }

    /// Queues a frame; small parts are coalesced, large bulk chunks written directly.
    pub async fn write(&mut self, f: &OutFrame) -> Result<(), NetError> {
        let header = f.header(self.max_frame)?;
        if let (Some(bulk), false) = (&self.bulk, f.bulk.is_empty()) {
            bulk.send(&f.bulk).await?;
        }
        self.buf.extend_from_slice(&header);
        self.buf.extend_from_slice(&f.body);
        let inline: &[Bytes] = if self.bulk.is_none() { &f.bulk } else { &[] };
        for chunk in f.body_rest.iter().chain(inline) {
            if chunk.len() <= COPY_LIMIT {
                self.buf.extend_from_slice(chunk);
            } else {
                self.write_buf_and(chunk).await?;
            }
        }
        if self.buf.len() >= FLUSH_AT {
            self.flush_buf().await?;
        }
        Ok(())
    }

    async fn write_item(&mut self, item: &Item) -> Result<(), NetError> {
        match item {
            Item::Frame(f) => self.write(f).await,
            Item::Raw(pieces) => {
                for p in pieces {
                    self.buf.extend_from_slice(p);
                }
                Ok(())
            }
        }
    }

    /// Writes what is buffered, then `chunk`, in as few (vectored) writes
    /// as the socket takes: one segment, not a small write then a large one.
    async fn write_buf_and(&mut self, chunk: &[u8]) -> Result<(), NetError> {
        let (mut head, mut tail) = (0, 0);
        while head < self.buf.len() || tail < chunk.len() {
            let parts = [
                std::io::IoSlice::new(&self.buf[head..]),
                std::io::IoSlice::new(&chunk[tail..]),
            ];
            let n = self
                .inner
                .write_vectored(&parts)
                .await
                .map_err(|e| NetError::io("writing a frame", e))?;
            if n == 0 {
                return Err(NetError::io(
                    "writing a frame",
                    std::io::ErrorKind::WriteZero.into(),
                ));
            }
            let from_head = n.min(self.buf.len() - head);
            head += from_head;
            tail += n - from_head;
        }
        self.buf.clear();
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

/// A socket that can also be written without waiting, from any thread
/// (TCP), so an idle connection's frames skip the writer task.
pub trait DirectWrite: Send + Sync {
    fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize>;
}

/// What the writer task writes: a frame, or the rest of a frame a sender
/// started writing directly.
enum Item {
    Frame(OutFrame),
    Raw(Vec<Bytes>),
}

/// Frames at most this large, in at most this many pieces, may be written
/// directly by the sending thread.
const DIRECT_MAX_BYTES: u64 = 1 << 20;
const DIRECT_MAX_PIECES: usize = 64;

/// Orders direct writes against the writer task: a sender writes directly
/// only while nothing is queued for (or being written by) the task.
struct Gate {
    queued: Mutex<usize>,
    direct: Option<Arc<dyn DirectWrite>>,
    max_frame: u32,
    /// Bulk payloads go inline (else frames with one skip the direct write).
    inline_bulk: bool,
}

enum Direct {
    /// Fully written.
    Done,
    /// Partly written (or not at all): the bytes still to write.
    Rest(Vec<Bytes>),
    /// Not attempted; queue the frame.
    Skip(OutFrame),
}

impl Gate {
    /// Called with `queued` locked and zero.
    fn write_direct(&self, f: OutFrame) -> Direct {
        let Some(sock) = &self.direct else {
            return Direct::Skip(f);
        };
        let total = FRAME_HEADER_LEN as u64 + f.body_len() + f.bulk_len();
        let count = f.body_rest.len() + f.bulk.len() + 2;
        if total > DIRECT_MAX_BYTES
            || count > DIRECT_MAX_PIECES
            || (!self.inline_bulk && !f.bulk.is_empty())
        {
            return Direct::Skip(f);
        }
        let Ok(header) = f.header(self.max_frame) else {
            return Direct::Skip(f);
        };
        let mut pieces = Vec::with_capacity(count);
        pieces.push(Bytes::copy_from_slice(&header));
        pieces.push(f.body.clone());
        pieces.extend(f.body_rest.iter().cloned());
        pieces.extend(f.bulk.iter().cloned());
        let slices: Vec<std::io::IoSlice<'_>> =
            pieces.iter().map(|p| std::io::IoSlice::new(p)).collect();
        let mut written = match sock.try_write_vectored(&slices) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(_) => return Direct::Skip(f),
        };
        if written as u64 == total {
            return Direct::Done;
        }
        let mut rest = Vec::new();
        for p in pieces {
            if written >= p.len() {
                written -= p.len();
            } else {
                rest.push(p.slice(written..));
                written = 0;
            }
        }
        Direct::Rest(rest)
    }
}

/// Sends frames to a connection's writer task (or straight to an idle
/// socket). Cheap to clone.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Item>,
    gate: Arc<Gate>,
}

impl WriterHandle {
    /// Writes directly if idle, else queues; `Err` gives the frame back if
    /// the queue is full or the writer stopped.
    pub fn try_send_frame(&self, f: OutFrame) -> Result<(), OutFrame> {
        let mut queued = self.gate.queued.lock();
        let item = if *queued == 0 {
            match self.gate.write_direct(f) {
                Direct::Done => return Ok(()),
                Direct::Rest(r) => Item::Raw(r),
                Direct::Skip(f) => Item::Frame(f),
            }
        } else {
            Item::Frame(f)
        };
        match self.tx.try_send(item) {
            Ok(()) => {
                *queued += 1;
                Ok(())
            }
            Err(e) => match e.into_inner() {
                Item::Frame(f) => Err(f),
                // Part of it is on the wire: the connection cannot be used
                // in order any more, so let the writer stop it.
                Item::Raw(_) => Ok(()),
            },
        }
    }

    /// Sends without waiting; fails if the queue is full or the writer stopped.
    pub fn try_send(&self, f: OutFrame) -> Result<(), NetError> {
        self.try_send_frame(f).map_err(|_| NetError::Closed)
    }

    /// Writes directly if idle, else queues, waiting for room.
    pub async fn send(&self, f: OutFrame) -> Result<(), NetError> {
        let item = {
            let mut queued = self.gate.queued.lock();
            let f = if *queued == 0 {
                match self.gate.write_direct(f) {
                    Direct::Done => return Ok(()),
                    Direct::Rest(r) => {
                        // The rest of a half-written frame must be next on
                        // the wire: queue it before releasing the gate (the
                        // queue is empty, so there is room).
                        return match self.tx.try_send(Item::Raw(r)) {
                            Ok(()) => {
                                *queued += 1;
                                Ok(())
                            }
                            Err(_) => Err(NetError::Closed),
                        };
                    }
                    Direct::Skip(f) => f,
                }
            } else {
                f
            };
            *queued += 1;
            Item::Frame(f)
        };
        if self.tx.send(item).await.is_err() {
            *self.gate.queued.lock() -= 1;
            return Err(NetError::Closed);
        }
        Ok(())
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The largest frame this connection writes (`frame_len`).
    pub fn max_frame(&self) -> u32 {
        self.gate.max_frame
    }
}

/// Starts a task that writes queued frames, batching whatever is queued into
/// as few writes as possible; senders write directly to `direct` (if given)
/// while nothing is queued. The task ends when every handle is dropped or a
/// write fails (the error is logged and reported through `on_exit`).
pub fn spawn_writer<W>(
    mut writer: FrameWriter<W>,
    direct: Option<Arc<dyn DirectWrite>>,
    peer: String,
    on_exit: impl FnOnce(Option<NetError>) + Send + 'static,
) -> WriterHandle
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Item>(1024);
    let gate = Arc::new(Gate {
        queued: Mutex::new(0),
        direct,
        max_frame: writer.max_frame,
        inline_bulk: writer.bulk_is_inline(),
    });
    let task_gate = gate.clone();
    tokio::spawn(async move {
        let result: Result<(), NetError> = async {
            while let Some(item) = rx.recv().await {
                let mut n = 1;
                writer.write_item(&item).await?;
                while let Ok(item) = rx.try_recv() {
                    writer.write_item(&item).await?;
                    n += 1;
                }
                writer.flush().await?;
                *task_gate.queued.lock() -= n;
            }
            Ok(())
        }
        .await;
        rx.close();
        if let Err(e) = &result {
            tracing::debug!(peer = %peer, error = %e, "connection writer stopped");
        }
        on_exit(result.err());
    });
    WriterHandle { tx, gate }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
