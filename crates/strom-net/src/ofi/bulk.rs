//! The bulk path over RMA: **the receiver pulls.**
//!
//! [`OfiBulkSender`] registers a frame's chunks (through the hub's
//! `MrCache`), keeps them in the connection's held map and sends `Desc`
//! messages listing `(addr, key, len)`; payloads under [`INLINE_MAX`] go in
//! an `Inline` message instead. [`OfiBulkReceiver`] `fi_read`s the regions
//! straight into the reader's destination (or into fresh buffers of at
//! most [`PIECE`] bytes) and sends `Release{id}` once a `Desc`'s regions are
//! consumed, so the sender drops them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use strom_ofi::{Access, RemoteRegion};
use tokio::sync::mpsc;

use super::hub::{BulkMsg, Held};
use super::stream::{io_err, ConnShared};
use super::wire;
use crate::bulk::{BulkReceiver, BulkSender};
use crate::{BoxFuture, NetError};

/// Payloads smaller than this travel inside the message.
pub(crate) const INLINE_MAX: usize = 16 << 10;
/// Largest buffer `read` allocates at once (the peer's lengths are not
/// trusted for allocation).
const PIECE: usize = 4 << 20;

/// Whether the provider reports a read of a bogus region as an error
/// completion. shm 1.17 never completes a read of an unmapped address, so
/// over shm a read that a hostile peer could stall goes through a buffer
/// the operation owns (and can give up on), then is copied.
fn reads_fail_cleanly(provider: &str) -> bool {
    !provider.starts_with("shm")
}

fn net(context: &str, e: strom_ofi::OfiError) -> NetError {
    NetError::io(context.to_string(), io_err(e))
}

/// Sends bulk payloads of one connection. An accepted connection (a
/// server sending what it stores) keeps registrations in the hub's cache
/// for the next send of the same memory; a dialed one (a client sending
/// its user's buffers) registers each payload for its transfer only, so
/// a buffer is let go once the peer released it: libstrom's lent data is
/// given back to its owner then, not when the cache evicts it.
pub(crate) struct OfiBulkSender {
    pub(crate) conn: Arc<ConnShared>,
    pub(crate) held: Held,
    pub(crate) next_id: AtomicU64,
    pub(crate) cache: bool,
}

impl OfiBulkSender {
    async fn send_chunks(&self, chunks: &[Bytes]) -> Result<(), NetError> {
        let chunks: Vec<&Bytes> = chunks.iter().filter(|c| !c.is_empty()).collect();
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        if total == 0 {
            return Ok(());
        }
        if total < INLINE_MAX {
            let owned: Vec<Bytes> = chunks.into_iter().cloned().collect();
            let msg = wire::inline(self.conn.peer_id, self.conn.seq(), &owned);
            return self
                .conn
                .send(&msg)
                .await
                .map_err(|e| net("sending a bulk payload", e));
        }
        for group in chunks.chunks(wire::MAX_REGIONS) {
            let mut mrs = Vec::with_capacity(group.len());
            for c in group {
                let mr = match self.cache {
                    true => self.conn.hub.cache.get((*c).clone()),
                    false => (self.conn.hub.ep)
                        .register((*c).clone(), Access::RemoteRead)
                        .map(Arc::new),
                };
                mrs.push(mr.map_err(|e| net("registering a bulk payload", e))?);
            }
            let regions: Vec<RemoteRegion> = mrs.iter().map(|m| m.remote()).collect();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.held.lock().insert(id, mrs);
            let msg = wire::desc(self.conn.peer_id, self.conn.seq(), id, &regions);
            if let Err(e) = self.conn.send(&msg).await {
                self.held.lock().remove(&id);
                return Err(net("announcing a bulk payload", e));
            }
        }
        Ok(())
    }
}

impl BulkSender for OfiBulkSender {
    fn send<'a>(&'a self, chunks: &'a [Bytes]) -> BoxFuture<'a, Result<(), NetError>> {
        Box::pin(self.send_chunks(chunks))
    }
}

/// The `Desc` being consumed: its regions and how far we are.
struct Remote {
    id: u64,
    regions: Vec<RemoteRegion>,
    index: usize,
    offset: u64,
}

/// The next bytes available: inline, or `len` bytes of a remote region.
enum Piece {
    Inline(Bytes),
    Remote(RemoteRegion, usize),
}

pub(crate) struct OfiBulkReceiver {
    pub(crate) conn: Arc<ConnShared>,
    pub(crate) rx: mpsc::UnboundedReceiver<BulkMsg>,
    inline: Bytes,
    remote: Option<Remote>,
}

impl OfiBulkReceiver {
    pub(crate) fn new(conn: Arc<ConnShared>, rx: mpsc::UnboundedReceiver<BulkMsg>) -> Self {
        OfiBulkReceiver {
            conn,
            rx,
            inline: Bytes::new(),
            remote: None,
        }
    }

    /// At most `want` (> 0) next bytes, waiting for the peer's next
    /// message if nothing is left.
    async fn next(&mut self, want: usize) -> Result<Piece, NetError> {
        loop {
            if !self.inline.is_empty() {
                let n = self.inline.len().min(want);
                return Ok(Piece::Inline(self.inline.split_to(n)));
            }
            if let Some(r) = &self.remote {
                let region = r.regions[r.index];
                let left = region.len - r.offset;
                let n = left.min(want as u64) as usize;
                let at = region.offset(r.offset).ok_or(NetError::Closed)?;
                return Ok(Piece::Remote(at, n));
            }
            match self.rx.recv().await.ok_or(NetError::Closed)? {
                BulkMsg::Inline(b) => self.inline = b,
                BulkMsg::Desc { id, regions } => {
                    self.remote = Some(Remote {
                        id,
                        regions,
                        index: 0,
                        offset: 0,
                    })
                }
            }
        }
    }

    /// Marks `n` bytes of the current remote region consumed; releases the
    /// `Desc` when all its regions are.
    async fn consumed(&mut self, n: usize) -> Result<(), NetError> {
        let Some(r) = self.remote.as_mut() else {
            return Ok(());
        };
        r.offset += n as u64;
        if r.offset == r.regions[r.index].len {
            r.index += 1;
            r.offset = 0;
        }
        if r.index == r.regions.len() {
            let id = r.id;
            self.remote = None;
            let msg = wire::release(self.conn.peer_id, self.conn.seq(), id);
            self.conn
                .send(&msg)
                .await
                .map_err(|e| net("releasing a bulk payload", e))?;
        }
        Ok(())
    }

    async fn pull_into(&mut self, dst: &mut [u8]) -> Result<(), NetError> {
        let mut at = 0;
        while at < dst.len() {
            match self.next(dst.len() - at).await? {
                Piece::Inline(b) => {
                    dst[at..at + b.len()].copy_from_slice(&b);
                    at += b.len();
                }
                Piece::Remote(region, n) => {
                    let n = n.min(PIECE);
                    let (ep, peer) = (&self.conn.hub.ep, self.conn.peer);
                    let dst = &mut dst[at..at + n];
                    if reads_fail_cleanly(&ep.traits().provider) {
                        ep.read(peer, dst, region).await
                    } else {
                        let limit = self.conn.hub.rma_timeout();
                        let buf = ep.read_owned(peer, vec![0u8; n], region, limit).await;
                        buf.map(|b| dst.copy_from_slice(&b))
                    }
                    .map_err(|e| net("reading a bulk payload", e))?;
                    at += n;
                    self.consumed(n).await?;
                }
            }
        }
        Ok(())
    }

    async fn pull(&mut self, len: u64) -> Result<Vec<Bytes>, NetError> {
        let mut out = Vec::new();
        let mut left = len;
        while left > 0 {
            let want = left.min(PIECE as u64) as usize;
            match self.next(want).await? {
                Piece::Inline(b) => {
                    left -= b.len() as u64;
                    out.push(b);
                }
                Piece::Remote(region, n) => {
                    let (ep, peer) = (&self.conn.hub.ep, self.conn.peer);
                    let buf = ep
                        .read_owned(peer, vec![0u8; n], region, self.conn.hub.rma_timeout())
                        .await
                        .map_err(|e| net("reading a bulk payload", e))?;
                    left -= n as u64;
                    out.push(Bytes::from(buf));
                    self.consumed(n).await?;
                }
            }
        }
        Ok(out)
    }

    async fn discard(&mut self, len: u64) -> Result<(), NetError> {
        let mut left = len;
        while left > 0 {
            let want = left.min(usize::MAX as u64) as usize;
            match self.next(want).await? {
                Piece::Inline(mut b) => {
                    left -= b.len() as u64;
                    b.advance(b.len());
                }
                Piece::Remote(_, n) => {
                    left -= n as u64;
                    self.consumed(n).await?;
                }
            }
        }
        Ok(())
    }
}

impl BulkReceiver for OfiBulkReceiver {
    fn read_into<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), NetError>> {
        Box::pin(self.pull_into(dst))
    }

    fn read(&mut self, len: u64) -> BoxFuture<'_, Result<Vec<Bytes>, NetError>> {
        Box::pin(self.pull(len))
    }

    fn skip(&mut self, len: u64) -> BoxFuture<'_, Result<(), NetError>> {
        Box::pin(self.discard(len))
    }
}
