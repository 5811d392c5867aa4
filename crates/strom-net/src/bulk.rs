//! The bulk path: how a connection moves the bulk payload of its frames.
//!
//! A frame's header announces how many bulk bytes belong to it; the header
//! and body always travel on the frame stream. Where the bulk bytes travel
//! is the transport's choice, made when it builds a [`Conn`](crate::Conn):
//!
//! - **Inline** (TCP; what [`FrameReader::new`](crate::FrameReader::new) and
//!   [`FrameWriter::new`](crate::FrameWriter::new) give): the payload follows
//!   the body on the frame stream, and the receiver reads it straight into
//!   its destination.
//! - **Out of band**: the transport gives the writer a [`BulkSender`] and
//!   the reader a [`BulkReceiver`] ([`FrameWriter::with_bulk`](crate::FrameWriter::with_bulk),
//!   [`FrameReader::with_bulk`](crate::FrameReader::with_bulk)). The frame
//!   stream then carries only headers and bodies, and payloads move through
//!   the transport's own channel: a shared-memory segment, an RDMA read or
//!   write. The in-process [`MemTransport`](crate::MemTransport) is one.
//!
//! Code above this crate sees a payload only as `OutFrame::bulk` when
//! sending and through `FrameReader::{pending_bulk, read_bulk_into,
//! read_bulk, skip_bulk}` when receiving, and must never assume where the
//! bytes are.
//!
//! The contract of an out-of-band path:
//!
//! - The writer calls [`BulkSender::send`] once per frame that has a
//!   payload, in frame order, never concurrently, before the frame's header
//!   is written. The sender may keep the chunks (they are reference counted)
//!   until the receiver is done with them; that is how a one-sided transport
//!   lets the other side pull.
//! - The reader asks the [`BulkReceiver`] for exactly the bytes each header
//!   announces, in order, in as many pieces as it likes. Payloads are
//!   delivered in frame order, so the receiver's next bytes always belong to
//!   the frame just read.
//! - The announced length comes from the peer: a receiver checks it against
//!   what the peer really made available and fails (ending the connection)
//!   rather than trusting it. It never allocates from it up front.
//! - Frames with a payload on an out-of-band path always go through the
//!   connection's writer task (never the direct write from a sender's
//!   thread), because [`BulkSender::send`] may wait.

use bytes::Bytes;

use crate::{BoxFuture, NetError};

/// The sending side of an out-of-band bulk path.
pub trait BulkSender: Send + Sync {
    /// Moves the payload of the frame about to be written: its chunks, in
    /// order. Called once per frame with a payload, in frame order.
    fn send<'a>(&'a self, chunks: &'a [Bytes]) -> BoxFuture<'a, Result<(), NetError>>;
}

/// The receiving side of an out-of-band bulk path. Each method takes the
/// next bytes of the current frame's payload; the reader never asks for
/// more than the header announced.
pub trait BulkReceiver: Send {
    /// Copies the next `dst.len()` payload bytes into `dst`.
    fn read_into<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), NetError>>;

    /// Takes the next `len` payload bytes as shared chunks (no copy where
    /// the transport allows).
    fn read(&mut self, len: u64) -> BoxFuture<'_, Result<Vec<Bytes>, NetError>>;

    /// Discards the next `len` payload bytes.
    fn skip(&mut self, len: u64) -> BoxFuture<'_, Result<(), NetError>>;
}
