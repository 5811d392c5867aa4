//! The consumer's data path: a [`DataSelector`] decides which bytes of an
//! event's data part to fetch, and a [`DataBroker`] says where they land.
//! The bytes are then read from the connection straight into those buffers.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strom_policy::TopicPolicy;
use strom_proto::Selection;

use crate::error::{Error, Result};

/// Memory that fetched data is written into. Implemented for `Vec<u8>`;
/// bindings implement it over numpy arrays or C buffers.
pub trait DataBuffer: Send + 'static {
    fn as_slice(&self) -> &[u8];
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// For recovering the concrete buffer type (`downcast`).
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl DataBuffer for Vec<u8> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Part of a chunk of memory that the small data parts of one fetch share
/// (see [`DataBroker::carve_below`]): this event's bytes alone, writable;
/// the chunk is freed once every part of it is dropped.
pub struct ChunkPart(pub(crate) bytes::BytesMut);

impl ChunkPart {
    /// The bytes, as a `BytesMut` (still sharing the chunk).
    pub fn into_bytes_mut(self) -> bytes::BytesMut {
        self.0
    }
}

impl DataBuffer for ChunkPart {
    fn as_slice(&self) -> &[u8] {
        &self.0
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// What a consumer knows about an event's data before fetching any of it.
#[derive(Clone, Debug)]
pub struct DataDescriptor {
    /// Size of the whole data part in bytes.
    pub size: u64,
    /// The producer's optional descriptor blob (for example dtype and shape).
    pub descriptor: Bytes,
}

/// The topic policy as events hold it. A consumer makes one per batch of
/// events (`Shared::batch`), so the events of a batch count references on
/// a line of their own: with one count for the whole topic, the fetching
/// thread (adding) and the pulling thread (dropping) took turns on it for
/// every event.
#[derive(Clone)]
#[expect(
    clippy::redundant_allocation,
    reason = "the outer Arc is the point: one reference count per batch"
)]
pub(crate) struct PolicyHandle(Arc<Arc<TopicPolicy>>);

impl PolicyHandle {
    pub fn new(policy: Arc<TopicPolicy>) -> Self {
        PolicyHandle(Arc::new(policy))
    }

    /// Another handle on the same policy (for another batch).
    pub fn fresh(&self) -> Self {
        Self::new(Arc::clone(&self.0))
    }
}

/// An event's metadata as seen by selectors, brokers and the application.
#[derive(Clone)]
pub struct EventMeta {
    pub partition: u32,
    pub offset: u64,
    /// Microseconds since the UNIX epoch, assigned by the server.
    pub timestamp_us: u64,
    raw: Bytes,
    policy: PolicyHandle,
}

impl EventMeta {
    pub(crate) fn new(
        partition: u32,
        offset: u64,
        timestamp_us: u64,
        raw: Bytes,
        policy: PolicyHandle,
    ) -> Self {
        EventMeta {
            partition,
            offset,
            timestamp_us,
            raw,
            policy,
        }
    }

    /// The metadata as stored (JSON text with the `json` serializer).
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// Decodes the metadata into a JSON value with the topic's serializer.
    pub fn json(&self) -> Result<serde_json::Value> {
        Ok(self.policy.0.decode(&self.raw)?)
    }
}

/// Chooses the part of each event's data to fetch. The built-in ones are
/// in [`crate::select`].
pub trait DataSelector: Send + Sync + 'static {
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection;

    /// What the consumer calls: [`select`](Self::select), or a reason to
    /// refuse the event, which fails the pull with `DATA_SELECTOR`. The
    /// default never refuses.
    fn try_select(
        &self,
        meta: &EventMeta,
        data: &DataDescriptor,
    ) -> std::result::Result<Selection, String> {
        Ok(self.select(meta, data))
    }
}

/// A fixed selection applied to every event (`Selection::All`, ...).
impl DataSelector for Selection {
    fn select(&self, _: &EventMeta, _: &DataDescriptor) -> Selection {
        self.clone()
    }
}

impl<F> DataSelector for F
where
    F: Fn(&EventMeta, &DataDescriptor) -> Selection + Send + Sync + 'static,
{
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection {
        self(meta, data)
    }
}

/// Provides destination buffers for the selected bytes of an event. The
/// buffers are filled in order and must hold at least `len` bytes in total.
pub trait DataBroker: Send + Sync + 'static {
    fn buffers(
        &self,
        meta: &EventMeta,
        selection: &Selection,
        len: u64,
    ) -> std::result::Result<Vec<Box<dyn DataBuffer>>, String>;

    /// Events whose selected bytes are fewer than this are not given
    /// buffers of this broker: the small parts of one fetch land in shared
    /// chunks of at most 64 KiB instead, each event holding its own
    /// [`ChunkPart`] (one allocation for many events; a part that is kept
    /// keeps its chunk). 0, the default: every event asks [`buffers`](Self::buffers).
    fn carve_below(&self) -> u64 {
        0
    }
}

/// The default broker: one exactly-sized `Vec<u8>` per event.
#[derive(Clone, Copy, Debug, Default)]
pub struct VecBroker;

impl DataBroker for VecBroker {
    fn buffers(
        &self,
        _: &EventMeta,
        _: &Selection,
        len: u64,
    ) -> std::result::Result<Vec<Box<dyn DataBuffer>>, String> {
        Ok(vec![Box::new(vec![0u8; buffer_len(len)?])])
    }
}

/// `len` as a buffer length, or why it cannot be one.
pub(crate) fn buffer_len(len: u64) -> std::result::Result<usize, String> {
    usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))
}

impl<F> DataBroker for F
where
    F: Fn(&EventMeta, &Selection, u64) -> std::result::Result<Vec<Box<dyn DataBuffer>>, String>
        + Send
        + Sync
        + 'static,
{
    fn buffers(
        &self,
        meta: &EventMeta,
        selection: &Selection,
        len: u64,
    ) -> std::result::Result<Vec<Box<dyn DataBuffer>>, String> {
        self(meta, selection, len)
    }
}

/// Fetched data held in the queue, with a wake-up for fetchers waiting on it.
#[derive(Default)]
pub(crate) struct DataBudget {
    held: AtomicU64,
    freed: tokio::sync::Notify,
}

impl DataBudget {
    /// Waits until `want` more bytes fit under `limit` (or nothing is held).
    pub async fn reserve(&self, want: u64, limit: u64) {
        loop {
            let freed = self.freed.notified();
            let held = self.held.load(Ordering::Acquire);
            if held == 0 || held + want <= limit {
                self.held.fetch_add(want, Ordering::AcqRel);
                return;
            }
            freed.await;
        }
    }

    /// Whether anything more may be fetched: less than `limit` is held (or
    /// nothing). The Kafka reader checks it before each poll, then takes
    /// what the record needs ([`take`](Self::take)), one record past the
    /// limit at most.
    #[cfg(feature = "kafka")]
    pub fn has_room(&self, limit: u64) -> bool {
        let held = self.held.load(Ordering::Acquire);
        held == 0 || held < limit
    }

    /// Counts `n` more bytes as held, without waiting (a Kafka record, or
    /// a compressed event that decoded to more than was fetched).
    pub fn take(&self, n: u64) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    /// Whether `want` more bytes fit under `limit` now (nothing reserved).
    pub fn fits(&self, want: u64, limit: u64) -> bool {
        self.held.load(Ordering::Acquire) + want <= limit
    }

    pub fn release(&self, n: u64) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::AcqRel);
            self.freed.notify_waiters();
        }
    }
}

/// Lays `len` bytes out over `buffers` in order, as `(buffer, start, len)`
/// pieces appended to `plan` (with buffer indexes offset by `first`).
pub(crate) fn plan_fill(
    buffers: &[Box<dyn DataBuffer>],
    first: usize,
    len: u64,
    plan: &mut Vec<(usize, usize, usize)>,
) -> Result<()> {
    let mut left = len;
    for (i, b) in buffers.iter().enumerate() {
        if left == 0 {
            break;
        }
        let n = (b.as_slice().len() as u64).min(left) as usize;
        if n > 0 {
            plan.push((first + i, 0, n));
            left -= n as u64;
        }
    }
    if left > 0 {
        return Err(Error::Broker(format!(
            "buffers hold {} bytes but {len} were selected",
            len - left
        )));
    }
    Ok(())
}
