//! An in-process transport whose bulk payloads move out of band.
//!
//! Frames travel over an in-memory pipe. Bulk payloads skip the pipe: the
//! sender hands its chunks (shared [`Bytes`], no copy) to a side channel and
//! the receiver takes them from there, the way a shared-memory transport
//! lets one side read the other's memory. It exists so the bulk seam (see
//! [`bulk`](crate::bulk)) has a second implementation that tests run the
//! whole stack over, and for in-process pairs that want no sockets.
//!
//! Addresses are names: `listen("a")` serves `mem://a` on this transport
//! value only (two `MemTransport`s never see each other's names); an empty
//! name or `0` picks a fresh one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::bulk::{BulkReceiver, BulkSender};
use crate::{BoxFuture, Conn, FrameReader, FrameWriter, Listener, NetError, Transport};

/// Bytes the frame pipe buffers in each direction.
const PIPE_BYTES: usize = 256 << 10;

type Registry = Arc<Mutex<HashMap<String, mpsc::Sender<Conn>>>>;

/// In-process frames over a pipe, bulk payloads through a side channel.
pub struct MemTransport {
    max_frame: u32,
    listeners: Registry,
    next_name: AtomicU64,
}

impl MemTransport {
    pub fn new(max_frame: u32) -> Self {
        MemTransport {
            max_frame,
            listeners: Arc::default(),
            next_name: AtomicU64::new(1),
        }
    }
}

impl Default for MemTransport {
    fn default() -> Self {
        MemTransport::new(strom_proto::DEFAULT_MAX_FRAME)
    }
}

/// One end of a connection: reads from `r`, writes to `w`, gets bulk from
/// `bulk_in`, sends bulk to `bulk_out`.
fn end(
    r: tokio::io::ReadHalf<tokio::io::DuplexStream>,
    w: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    bulk_in: mpsc::UnboundedReceiver<Bytes>,
    bulk_out: mpsc::UnboundedSender<Bytes>,
    max_frame: u32,
    peer: String,
) -> Conn {
    let receiver = SideReceiver {
        rx: bulk_in,
        current: Bytes::new(),
    };
    Conn {
        reader: FrameReader::with_bulk(Box::new(r), max_frame, Box::new(receiver)),
        writer: FrameWriter::with_bulk(Box::new(w), max_frame, Arc::new(SideSender(bulk_out))),
        direct: None,
        direct_read: None,
        peer,
        identity: Default::default(),
    }
}

/// A connected pair: (client end, server end).
fn pair(max_frame: u32, name: &str) -> (Conn, Conn) {
    let (a, b) = tokio::io::duplex(PIPE_BYTES);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let (a_tx, b_rx) = mpsc::unbounded_channel();
    let (b_tx, a_rx) = mpsc::unbounded_channel();
    let client = end(ar, aw, a_rx, a_tx, max_frame, format!("mem://{name}"));
    let server = end(
        br,
        bw,
        b_rx,
        b_tx,
        max_frame,
        format!("mem://{name} (client)"),
    );
    (client, server)
}

struct SideSender(mpsc::UnboundedSender<Bytes>);

impl BulkSender for SideSender {
    fn send<'a>(&'a self, chunks: &'a [Bytes]) -> BoxFuture<'a, Result<(), NetError>> {
        let sent = chunks
            .iter()
            .filter(|c| !c.is_empty())
            .try_for_each(|c| self.0.send(c.clone()).map_err(|_| NetError::Closed));
        Box::pin(std::future::ready(sent))
    }
}

struct SideReceiver {
    rx: mpsc::UnboundedReceiver<Bytes>,
    current: Bytes,
}

impl SideReceiver {
    /// At most `want` bytes of the payload, waiting for the sender if
    /// nothing is left of its last chunk.
    async fn take(&mut self, want: u64) -> Result<Bytes, NetError> {
        while self.current.is_empty() {
            self.current = self.rx.recv().await.ok_or(NetError::Closed)?;
        }
        let n = (self.current.len() as u64).min(want) as usize;
        Ok(self.current.split_to(n))
    }
}

impl BulkReceiver for SideReceiver {
    fn read_into<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), NetError>> {
        Box::pin(async move {
            let mut at = 0;
            while at < dst.len() {
                let mut piece = self.take((dst.len() - at) as u64).await?;
                let n = piece.len();
                dst[at..at + n].copy_from_slice(&piece);
                piece.advance(n);
                at += n;
            }
            Ok(())
        })
    }

    fn read(&mut self, len: u64) -> BoxFuture<'_, Result<Vec<Bytes>, NetError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut left = len;
            while left > 0 {
                let piece = self.take(left).await?;
                left -= piece.len() as u64;
                out.push(piece);
            }
            Ok(out)
        })
    }

    fn skip(&mut self, len: u64) -> BoxFuture<'_, Result<(), NetError>> {
        Box::pin(async move {
            let mut left = len;
            while left > 0 {
                left -= self.take(left).await?.len() as u64;
            }
            Ok(())
        })
    }
}

struct MemListener {
    name: String,
    incoming: mpsc::Receiver<Conn>,
    registry: Registry,
}

impl Drop for MemListener {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.name);
    }
}

impl Listener for MemListener {
    fn local_addr(&self) -> String {
        format!("mem://{}", self.name)
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move { self.incoming.recv().await.ok_or(NetError::Closed) })
    }
}

fn io_error(kind: std::io::ErrorKind, context: String) -> NetError {
    NetError::io(context, std::io::Error::from(kind))
}

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(async move {
            let listener = self.listeners.lock().get(addr).cloned();
            let refused = || {
                io_error(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("connecting to mem://{addr}"),
                )
            };
            let listener = listener.ok_or_else(refused)?;
            let (client, server) = pair(self.max_frame, addr);
            listener.send(server).await.map_err(|_| refused())?;
            Ok(client)
        })
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let name = match addr {
                "" | "0" => format!("anon-{}", self.next_name.fetch_add(1, Ordering::Relaxed)),
                name => name.to_string(),
            };
            let (tx, incoming) = mpsc::channel(64);
            let mut listeners = self.listeners.lock();
            if listeners.contains_key(&name) {
                return Err(io_error(
                    std::io::ErrorKind::AddrInUse,
                    format!("binding mem://{name}"),
                ));
            }
            listeners.insert(name.clone(), tx);
            Ok(Box::new(MemListener {
                name,
                incoming,
                registry: self.listeners.clone(),
            }) as Box<dyn Listener>)
        })
    }
}
