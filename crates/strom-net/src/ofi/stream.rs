//! A connection's frame byte stream over messages: [`OfiWrite`] cuts what
//! it is given into `Data` messages, [`OfiRead`] reads the pieces the hub
//! routed to the connection, so `FrameReader`/`FrameWriter` work unchanged.
//! [`ConnShared`] is what both halves and the bulk path share; when the
//! last of them goes, the connection is forgotten.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use strom_ofi::{OfiError, Peer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::hub::Hub;
use super::wire;

/// One connection: our id, the peer and its id for the connection.
pub(crate) struct ConnShared {
    pub(crate) hub: Arc<Hub>,
    pub(crate) id: u32,
    pub(crate) peer: Peer,
    pub(crate) peer_id: u32,
    closed: AtomicBool,
    /// A send on this connection failed (the provider lost the peer).
    failed: Arc<AtomicBool>,
    /// The sequence number of our next message on this connection.
    seq: AtomicU32,
}

impl ConnShared {
    pub(crate) fn new(hub: Arc<Hub>, id: u32, peer: Peer, peer_id: u32) -> Arc<Self> {
        Arc::new(ConnShared {
            hub,
            id,
            peer,
            peer_id,
            closed: AtomicBool::new(false),
            failed: Arc::default(),
            seq: AtomicU32::new(0),
        })
    }

    /// The sequence number for our next message (take it right before
    /// building the message to post).
    pub(crate) fn seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a message to the peer (returns once posted). If the send
    /// fails later, the connection is marked failed and its inbound
    /// channels close, so both halves see the end.
    pub(crate) async fn send(&self, msg: &[u8]) -> Result<(), OfiError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(OfiError::Closed);
        }
        let (failed, hub, id) = (self.failed.clone(), self.hub.clone(), self.id);
        let on_done = move |r: Result<usize, OfiError>| {
            if let Err(e) = r {
                tracing::debug!(error = %e, conn = id, "an ofi send failed; closing");
                failed.store(true, Ordering::Release);
                hub.fail_conn(id);
            }
        };
        // A refused post calls on_done with its error too: a message the
        // peer never gets leaves a gap in the sequence, so the connection
        // ends either way.
        self.hub.ep.send_then(self.peer, msg, on_done).await
    }

    /// Whether we told the peer we are done writing (then sets it).
    fn mark_closed(&self) -> bool {
        self.closed.swap(true, Ordering::AcqRel)
    }

    /// Tells the peer no more frames come, without waiting (for drops):
    /// posted right away if the provider takes it, else retried from a task
    /// when there is a runtime, else on this thread.
    pub(crate) fn close_now(&self) {
        if self.mark_closed() {
            return;
        }
        let msg = wire::close(self.peer_id, self.seq());
        if let Ok(true) = self.hub.ep.try_send(self.peer, &msg) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let (hub, peer) = (self.hub.clone(), self.peer);
                rt.spawn(async move { hub.send(peer, &msg).await });
            }
            Err(_) => {
                let _ = self.hub.ep.send_blocking(self.peer, &msg);
            }
        }
    }
}

impl Drop for ConnShared {
    fn drop(&mut self) {
        self.close_now();
        self.hub.remove_conn(self.id);
    }
}

pub(crate) fn io_err(e: OfiError) -> io::Error {
    io::Error::other(e)
}

/// The read half: the frame bytes the peer sent, in order; end of stream
/// once the peer closed.
pub(crate) struct OfiRead {
    pub(crate) rx: mpsc::UnboundedReceiver<Bytes>,
    pub(crate) current: Bytes,
    pub(crate) _conn: Arc<ConnShared>,
}

impl AsyncRead for OfiRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.current.is_empty() {
            match ready!(self.rx.poll_recv(cx)) {
                Some(b) => self.current = b,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.current.len().min(buf.remaining());
        buf.put_slice(&self.current[..n]);
        self.current.advance(n);
        Poll::Ready(Ok(()))
    }
}

type Pending = Pin<Box<dyn Future<Output = Result<(), OfiError>> + Send>>;

/// The write half: each write posts one `Data` message (of at most the
/// endpoint's message size) and returns once it is posted.
pub(crate) struct OfiWrite {
    conn: Arc<ConnShared>,
    pending: Option<Pending>,
}

impl OfiWrite {
    pub(crate) fn new(conn: Arc<ConnShared>) -> Self {
        OfiWrite {
            conn,
            pending: None,
        }
    }

    /// Drives the post in progress, if any.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(p) = self.pending.as_mut() {
            let r = ready!(p.as_mut().poll(cx));
            self.pending = None;
            r.map_err(io_err)?;
        }
        Poll::Ready(Ok(()))
    }

    fn post(&self, msg: bytes::BytesMut) -> Pending {
        let conn = self.conn.clone();
        Box::pin(async move { conn.send(&msg).await })
    }
}

impl AsyncWrite for OfiWrite {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if self.conn.closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let n = buf.len().min(self.conn.hub.max_data());
        let seq = self.conn.seq();
        let mut p = self.post(wire::data(self.conn.peer_id, seq, &buf[..n]));
        match p.as_mut().poll(cx) {
            Poll::Ready(r) => r.map_err(io_err)?,
            Poll::Pending => self.pending = Some(p),
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_pending(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        if !self.conn.mark_closed() {
            let seq = self.conn.seq();
            self.pending = Some(self.post(wire::close(self.conn.peer_id, seq)));
            ready!(self.poll_pending(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for OfiWrite {
    fn drop(&mut self) {
        // Like dropping a socket's write half: the peer reads end of stream,
        // after the last write (whose post may still be retrying: dropping
        // it would leave a gap in the sequence the peer waits on).
        match (self.pending.take(), tokio::runtime::Handle::try_current()) {
            (Some(p), Ok(rt)) => {
                let conn = self.conn.clone();
                rt.spawn(async move {
                    let _ = p.await;
                    conn.close_now();
                });
            }
            _ => self.conn.close_now(),
        }
    }
}
