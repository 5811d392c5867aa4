//! Reading and writing frames on a byte stream.
//!
//! [`FrameReader`] (`reader.rs`) buffers headers and bodies and hands the
//! bulk payload out separately. [`FrameWriter`] coalesces small frames
//! into one write and writes large bulk chunks directly from the caller's
//! buffers.
//!
//! Both move bulk payloads inline on the stream unless the transport gave
//! them an out-of-band bulk path ([`crate::bulk`]); callers use the same
//! methods either way.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use strom_proto::{FrameHeader, FrameKind, ProtoError, Push, Request, Response, FRAME_HEADER_LEN};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::bulk::BulkSender;
use crate::error::NetError;

mod reader;

pub use reader::FrameReader;

const READ_CHUNK: usize = 64 << 10;
const BULK_CHUNK: usize = 4 << 20;
const COPY_LIMIT: usize = 32 << 10;
const FLUSH_AT: usize = 1 << 20;

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
