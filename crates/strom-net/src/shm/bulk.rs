//! The shm bulk path: data parts move on a second socket of the
//! connection, as records, or are pulled straight out of the sender's
//! memory.
//!
//! Records, each a 16-byte header `[kind u8, 0 ×3, count u32, seq u64]`
//! (little endian) and a body:
//!
//! - `INLINE`: `count` payload bytes follow (small payloads, or a peer that
//!   may not pull).
//! - `PULL`: `count` regions `(addr u64, len u64)` of the sender's memory
//!   follow; the receiver copies them with `process_vm_readv` into its
//!   destination, then answers `RELEASE`. The sender keeps the chunks alive
//!   until then.
//! - `RELEASE`: the receiver has pulled every `PULL` record up to `seq`.
//!
//! Payloads arrive in frame order, so the receiver treats them as one
//! stream of bytes, as [`crate::bulk`] requires. A record's count is checked
//! against fixed caps before anything is allocated from it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::cma::{self, Region};
use super::STATS;
use crate::bulk::{BulkReceiver, BulkSender};
use crate::{BoxFuture, NetError};

const INLINE: u8 = 1;
const PULL: u8 = 2;
const RELEASE: u8 = 3;
const HEADER: usize = 16;
/// Largest `INLINE` record accepted.
const MAX_INLINE: usize = 1 << 20;
/// Most regions in one `PULL` record (larger payloads use several).
const MAX_REGIONS: usize = 4096;
/// Largest piece `read` copies out of inline records into one buffer
/// (a pull record is pulled into one buffer whole: the frame's announced
/// length, which the reader has checked against its frame limit, bounds
/// it, and one buffer per payload lets storage hand out zero-copy slices).
const READ_CHUNK: u64 = 4 << 20;

fn header(kind: u8, count: u32, seq: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = kind;
    h[4..8].copy_from_slice(&count.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h
}

/// What the sender keeps until the peer releases it.
#[derive(Default)]
struct Pending {
    records: VecDeque<(u64, Vec<Bytes>)>,
    bytes: u64,
}

/// The connection's bulk socket, written by the sender (payload records)
/// and the receiver (releases).
pub(crate) struct BulkOut(tokio::sync::Mutex<OwnedWriteHalf>);

impl BulkOut {
    pub(crate) fn new(w: OwnedWriteHalf) -> Arc<Self> {
        Arc::new(BulkOut(tokio::sync::Mutex::new(w)))
    }

    async fn write(&self, bytes: &[u8]) -> Result<(), NetError> {
        self.0
            .lock()
            .await
            .write_all(bytes)
            .await
            .map_err(|e| NetError::io("writing to the shm bulk socket", e))
    }
}

/// How payloads are sent: pulled by the peer above `inline_max` bytes (if
/// it may pull and less than `max_pending` bytes wait for it), inline
/// otherwise.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendPolicy {
    pub peer_pulls: bool,
    pub inline_max: usize,
    pub max_pending: u64,
}

pub(crate) struct ShmBulkSender {
    out: Arc<BulkOut>,
    policy: SendPolicy,
    next_seq: AtomicU64,
    pending: Arc<Mutex<Pending>>,
}

impl ShmBulkSender {
    /// Bytes published for the peer to pull and not yet released.
    #[cfg(test)]
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending.lock().bytes
    }

    fn publish(&self, chunks: &[Bytes]) -> Vec<u8> {
        let mut rec = Vec::new();
        let mut pending = self.pending.lock();
        for group in chunks.chunks(MAX_REGIONS) {
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
            rec.extend_from_slice(&header(PULL, group.len() as u32, seq));
            for c in group {
                rec.extend_from_slice(&(c.as_ptr() as u64).to_le_bytes());
                rec.extend_from_slice(&(c.len() as u64).to_le_bytes());
                pending.bytes += c.len() as u64;
            }
            pending.records.push_back((seq, group.to_vec()));
        }
        rec
    }

    fn inline(chunks: &[Bytes], total: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rec = Vec::with_capacity(HEADER + total.min(MAX_INLINE));
        for c in chunks {
            let mut c = &c[..];
            while !c.is_empty() {
                if rec.is_empty() {
                    rec.extend_from_slice(&[0u8; HEADER]);
                }
                let n = c.len().min(MAX_INLINE + HEADER - rec.len());
                rec.extend_from_slice(&c[..n]);
                c = &c[n..];
                if rec.len() == HEADER + MAX_INLINE {
                    out.push(std::mem::take(&mut rec));
                }
            }
        }
        if !rec.is_empty() {
            out.push(rec);
        }
        for r in &mut out {
            let len = (r.len() - HEADER) as u32;
            r[..HEADER].copy_from_slice(&header(INLINE, len, 0));
        }
        out
    }
}

impl BulkSender for ShmBulkSender {
    fn send<'a>(&'a self, chunks: &'a [Bytes]) -> BoxFuture<'a, Result<(), NetError>> {
        Box::pin(async move {
            let total: usize = chunks.iter().map(|c| c.len()).sum();
            if total == 0 {
                return Ok(());
            }
            let p = self.policy;
            let room = self.pending.lock().bytes < p.max_pending;
            if p.peer_pulls && total > p.inline_max && room {
                let rec = self.publish(chunks);
                STATS.pulled.fetch_add(total as u64, Ordering::Relaxed);
                return self.out.write(&rec).await;
            }
            STATS.inline.fetch_add(total as u64, Ordering::Relaxed);
            for rec in Self::inline(chunks, total) {
                self.out.write(&rec).await?;
            }
            Ok(())
        })
    }
}

/// A payload record as the receiver holds it.
enum Payload {
    Inline(Bytes),
    Pull {
        seq: u64,
        regions: VecDeque<Region>,
        left: u64,
    },
}

impl Payload {
    fn left(&self) -> u64 {
        match self {
            Payload::Inline(b) => b.len() as u64,
            Payload::Pull { left, .. } => *left,
        }
    }
}

pub(crate) struct ShmBulkReceiver {
    rx: mpsc::UnboundedReceiver<Payload>,
    current: Option<Payload>,
    peer_pid: i32,
    out: Arc<BulkOut>,
}

/// The regions covering the next `n` bytes of a pull record (advancing it).
fn take_regions(regions: &mut VecDeque<Region>, mut n: u64) -> Vec<Region> {
    let mut out = Vec::new();
    while n > 0 {
        let Some(r) = regions.front_mut() else { break };
        let k = r.len.min(n);
        out.push(Region {
            addr: r.addr,
            len: k,
        });
        r.addr = r.addr.wrapping_add(k);
        r.len -= k;
        n -= k;
        if r.len == 0 {
            regions.pop_front();
        }
    }
    out
}

/// What to do with the next piece of a payload.
enum Step<'a> {
    Copy(&'a mut [u8]),
    Keep(&'a mut Vec<Bytes>),
    Skip,
}

impl ShmBulkReceiver {
    /// Waits until the current payload record has bytes left.
    async fn load(&mut self) -> Result<(), NetError> {
        while self.current.as_ref().is_none_or(|p| p.left() == 0) {
            self.current = Some(self.rx.recv().await.ok_or(NetError::Closed)?);
        }
        Ok(())
    }

    /// Moves up to `want` bytes of the current payload as `step` says;
    /// returns how many.
    async fn step(&mut self, want: u64, step: Step<'_>) -> Result<u64, NetError> {
        self.load().await?;
        let pid = self.peer_pid;
        let cur = self.current.as_mut().ok_or(NetError::Closed)?;
        let n = want.min(cur.left());
        let pulled = |e: std::io::Error| NetError::io("pulling a data part (process_vm_readv)", e);
        match (cur, step) {
            (Payload::Inline(b), Step::Copy(dst)) => {
                dst[..n as usize].copy_from_slice(&b[..n as usize])
            }
            (Payload::Inline(b), Step::Keep(out)) => out.push(b.slice(..n as usize)),
            (Payload::Inline(_), Step::Skip) => {}
            (Payload::Pull { regions, left, .. }, step) => {
                let rs = take_regions(regions, n);
                *left -= n;
                match step {
                    Step::Copy(dst) => {
                        cma::read_into(pid, &mut dst[..n as usize], &rs).map_err(pulled)?
                    }
                    Step::Keep(out) => out.push(Bytes::from(
                        cma::read_vec(pid, n as usize, &rs).map_err(pulled)?,
                    )),
                    Step::Skip => {}
                }
            }
        }
        if let Some(Payload::Inline(b)) = &mut self.current {
            b.advance(n as usize);
        }
        if let Some(Payload::Pull { seq, left: 0, .. }) = self.current {
            self.current = None;
            self.out.write(&header(RELEASE, 0, seq)).await?;
        }
        Ok(n)
    }
}

impl BulkReceiver for ShmBulkReceiver {
    fn read_into<'a>(&'a mut self, dst: &'a mut [u8]) -> BoxFuture<'a, Result<(), NetError>> {
        Box::pin(async move {
            let mut at = 0;
            while at < dst.len() {
                at += self
                    .step((dst.len() - at) as u64, Step::Copy(&mut dst[at..]))
                    .await? as usize;
            }
            Ok(())
        })
    }

    fn read(&mut self, len: u64) -> BoxFuture<'_, Result<Vec<Bytes>, NetError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            let mut left = len;
            while left > 0 {
                self.load().await?;
                let pull = matches!(self.current, Some(Payload::Pull { .. }));
                let want = if pull { left } else { left.min(READ_CHUNK) };
                left -= self.step(want, Step::Keep(&mut out)).await?;
            }
            Ok(out)
        })
    }

    fn skip(&mut self, len: u64) -> BoxFuture<'_, Result<(), NetError>> {
        Box::pin(async move {
            let mut left = len;
            while left > 0 {
                left -= self.step(left, Step::Skip).await?;
            }
            Ok(())
        })
    }
}

/// Builds one end's bulk path over its bulk socket: the sender, the
/// receiver, and the task reading the socket (it ends with the socket).
pub(crate) fn bulk_path(
    r: OwnedReadHalf,
    w: OwnedWriteHalf,
    policy: SendPolicy,
    peer_pid: i32,
) -> (Arc<ShmBulkSender>, ShmBulkReceiver) {
    let out = BulkOut::new(w);
    let pending = Arc::new(Mutex::new(Pending::default()));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(read_records(r, tx, pending.clone()));
    let sender = Arc::new(ShmBulkSender {
        out: out.clone(),
        policy,
        next_seq: AtomicU64::new(0),
        pending,
    });
    let receiver = ShmBulkReceiver {
        rx,
        current: None,
        peer_pid,
        out,
    };
    (sender, receiver)
}

async fn read_records(
    r: OwnedReadHalf,
    tx: mpsc::UnboundedSender<Payload>,
    pending: Arc<Mutex<Pending>>,
) {
    let mut r = BufReader::with_capacity(64 << 10, r);
    if let Err(e) = read_loop(&mut r, &tx, &pending).await {
        tracing::debug!(error = %e, "shm bulk socket closed");
    }
}

async fn read_loop(
    r: &mut BufReader<OwnedReadHalf>,
    tx: &mpsc::UnboundedSender<Payload>,
    pending: &Mutex<Pending>,
) -> std::io::Result<()> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    loop {
        let mut h = [0u8; HEADER];
        r.read_exact(&mut h).await?;
        let count = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let seq = u64::from_le_bytes(h[8..16].try_into().unwrap_or([0; 8]));
        let payload = match h[0] {
            INLINE if (1..=MAX_INLINE).contains(&count) => {
                let mut b = vec![0u8; count];
                r.read_exact(&mut b).await?;
                Payload::Inline(Bytes::from(b))
            }
            PULL if (1..=MAX_REGIONS).contains(&count) => {
                let mut b = vec![0u8; count * 16];
                r.read_exact(&mut b).await?;
                let regions: VecDeque<Region> = b
                    .chunks_exact(16)
                    .map(|c| Region {
                        addr: u64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])),
                        len: u64::from_le_bytes(c[8..].try_into().unwrap_or([0; 8])),
                    })
                    .collect();
                let left = regions
                    .iter()
                    .try_fold(0u64, |t, r| t.checked_add(r.len))
                    .ok_or_else(|| bad("a pull record's lengths overflow".into()))?;
                Payload::Pull { seq, regions, left }
            }
            RELEASE => {
                let mut p = pending.lock();
                while p.records.front().is_some_and(|(s, _)| *s <= seq) {
                    if let Some((_, chunks)) = p.records.pop_front() {
                        p.bytes -= chunks.iter().map(|c| c.len() as u64).sum::<u64>();
                    }
                }
                continue;
            }
            k => {
                return Err(bad(format!(
                    "bad shm bulk record (kind {k}, count {count})"
                )))
            }
        };
        if tx.send(payload).is_err() {
            return Ok(());
        }
    }
}
