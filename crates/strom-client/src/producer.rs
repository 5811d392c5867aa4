//! The producer: validates, routes and serializes each event on the caller's
//! thread, accumulates per-partition batches, and sends them from the
//! background runtime with at most `max_batches` in flight per partition.
//! Past that, `push` blocks (backpressure) instead of growing memory.
//!
//! Batching and size limits are one type, [`Batching`] (see `batching.rs`):
//! `Count(n)` and `Full` send a batch when it is full (or after `linger`);
//! `Adaptive` sends whatever is ready as soon as an in-flight slot frees
//! up, so batches grow with load and latency stays low when idle.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use strom_policy::{MetadataInput, TopicPolicy};
use strom_proto::{BatchBuilder, Compression, PartitionInfo, ProducerStamp, Request, Response};
use tokio::sync::mpsc;

use crate::batching::{event_limit, Batching, EventLimit, Trigger};
use crate::conn::{Callback, ClientConn, ServerLimits};
use crate::error::unexpected;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::slot::Slot;
use crate::topic::Topic;

#[path = "producer_refresh.rs"]
mod refresh;
use refresh::{learn_limits, refresh_loop};
#[path = "producer_retry.rs"]
pub(crate) mod retry;

#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// When batches are sent and how large batches and events may be.
    pub batch: Batching,
    /// Batches per partition sent and not yet acknowledged (at least 1; at
    /// most 64 for an idempotent producer).
    pub max_batches: usize,
    /// Longest a partial `Count`/`Full` batch waits before it is sent.
    pub linger: Duration,
    /// The producer's lease: the driver renews it in the background, and if
    /// the process dies the registry master closes this producer's part of
    /// the stream once the lease runs out (reported as expired). The
    /// default, `Some(Duration::ZERO)`, takes the server's
    /// `producer_lease_ms`; other durations are clamped to 1 s ..= 300 s.
    /// `None` takes no lease: the producer stays open until closed, even
    /// after its process exits (to hand a stream over to others).
    pub lease: Option<Duration>,
    /// When a push to a replicated partition is acknowledged: after every
    /// in-sync replica has it (`All`, the default), or after the leader's
    /// append (`Leader`: faster, and lost if the leader dies before its
    /// followers copied it). Unreplicated partitions ignore it.
    pub acks: Acks,
    /// Idempotence: each batch carries this producer's id and its sequence
    /// number in the partition, so the producer resends batches whose
    /// answer was lost (a dead or deposed leader, a dropped connection) to
    /// the partition's current leader, in order, for up to
    /// [`retry_for`](Self::retry_for), and the partition appends each
    /// batch once. `None` (the default) turns it on for replicated topics.
    pub idempotent: Option<bool>,
    /// How long an idempotent producer keeps resending a batch before its
    /// push fails.
    pub retry_for: Duration,
}

/// See [`ProducerOptions::acks`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Acks {
    Leader,
    #[default]
    All,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            batch: Batching::adaptive(),
            max_batches: 2,
            linger: Duration::from_millis(5),
            lease: Some(Duration::ZERO),
            acks: Acks::All,
            idempotent: None,
            retry_for: Duration::from_secs(30),
        }
    }
}

/// An event's data part: zero or more segments sent back to back without
/// being copied into one buffer.
#[derive(Clone, Debug, Default)]
pub struct Data(pub Vec<Bytes>);

impl Data {
    pub fn none() -> Self {
        Data(Vec::new())
    }
    pub fn len(&self) -> u64 {
        self.0.iter().map(|b| b.len() as u64).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Data {
    fn from(b: Bytes) -> Self {
        Data(vec![b])
    }
}
impl From<Vec<u8>> for Data {
    fn from(b: Vec<u8>) -> Self {
        Data(vec![Bytes::from(b)])
    }
}
impl From<&'static [u8]> for Data {
    fn from(b: &'static [u8]) -> Self {
        Data(vec![Bytes::from_static(b)])
    }
}
impl From<Vec<Bytes>> for Data {
    fn from(b: Vec<Bytes>) -> Self {
        Data(b)
    }
}
impl From<()> for Data {
    fn from(_: ()) -> Self {
        Data::none()
    }
}

/// Where an acknowledged event was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    pub partition: u32,
    pub offset: u64,
}

#[derive(Clone, Copy)]
pub(crate) struct BatchAck {
    pub base_offset: u64,
}

/// Resolves to the event's [`EventId`] once its batch is acknowledged.
/// Wait for it with [`wait`](Self::wait), or `.await` it in any executor.
pub struct PushFuture {
    slot: Arc<Slot<BatchAck>>,
    partition: u32,
    index: u32,
}

impl PushFuture {
    /// The future of one event stored alone at the slot's `base_offset`
    /// (the Kafka backend: one delivery report per record).
    #[cfg(feature = "kafka")]
    pub(crate) fn single(slot: Arc<Slot<BatchAck>>, partition: u32) -> Self {
        PushFuture {
            slot,
            partition,
            index: 0,
        }
    }

    pub fn wait(self) -> Result<EventId> {
        self.wait_timeout(None)
    }

    pub fn wait_timeout(&self, timeout: Option<Duration>) -> Result<EventId> {
        match self.slot.wait(timeout) {
            Some(r) => self.id(r),
            None => Err(Error::Timeout(timeout.unwrap_or_default())),
        }
    }

    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// The partition the event was routed to (known before it is stored).
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// Polls through a shared reference (for bindings that both wait on and
    /// await the same future).
    pub fn poll_ref(&self, cx: &mut Context<'_>) -> Poll<Result<EventId>> {
        self.slot.poll(cx).map(|r| self.id(r))
    }

    fn id(&self, r: Result<BatchAck>) -> Result<EventId> {
        r.map(|a| EventId {
            partition: self.partition,
            offset: a.base_offset + self.index as u64,
        })
    }
}

impl std::future::Future for PushFuture {
    type Output = Result<EventId>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_ref(cx)
    }
}

struct Sealed {
    meta: Bytes,
    count: u32,
    data: Vec<Bytes>,
    slot: Arc<Slot<BatchAck>>,
    /// An idempotent producer's sequence number for the batch.
    seq: Option<u32>,
    /// When its first attempt failed (resent batches).
    failed_at: Option<std::time::Instant>,
    /// Its data parts are framed already (compressed topics).
    packed: bool,
}

struct QueueState {
    /// The largest event this partition takes.
    limit: EventLimit,
    builder: BatchBuilder,
    data: Vec<Bytes>,
    bytes: u64,
    slot: Arc<Slot<BatchAck>>,
    sealed: VecDeque<Sealed>,
    in_flight: usize,
    error: Option<Error>,
    /// Idempotence: the producer id the batches are stamped with.
    stamp: Option<u64>,
    next_seq: u32,
    /// Batches whose attempt failed, by sequence number, to resend in order.
    resend: std::collections::BTreeMap<u32, Sealed>,
    /// A resend is being prepared: nothing new is sent before it.
    resending: bool,
    /// A batch was given up: later ones cannot follow it in order.
    gave_up: bool,
}

struct PartQueue {
    partition: u32,
    /// The member owning the partition and its address (refreshed).
    owner: Mutex<(u32, String)>,
    /// The owner's connection once the sender task opened it.
    conn: Mutex<Option<Arc<ClientConn>>>,
    /// Batches handed to the sender task and not yet written: while any
    /// are, later batches queue behind them to keep their order.
    queued: AtomicUsize,
    state: Mutex<QueueState>,
    cond: Condvar,
    /// Batches to send, in seal order, to this partition's sender task.
    outbox: mpsc::UnboundedSender<Sealed>,
}

struct Inner {
    topic: Topic,
    id: u64,
    policy: TopicPolicy,
    opts: ProducerOptions,
    /// Grows when partitions are added to the topic.
    parts: RwLock<Vec<Arc<PartQueue>>>,
    closed: AtomicBool,
    /// Bytes at which a batch is sent even if the mode would keep filling it.
    batch_target: u64,
    /// The producer's lease, renewed by the driver while this is alive.
    lease: Option<Arc<Lease>>,
    /// Batches are stamped and resent (see [`ProducerOptions::idempotent`]).
    idempotent: bool,
    /// The topic's data-part compression: batches are then framed on the
    /// partition's sender task, never on the pushing thread.
    compression: Compression,
}

impl Inner {
    /// `PRODUCER_EXPIRED` once the master reported the lease lost.
    fn check_lease(&self) -> Result<()> {
        match &self.lease {
            Some(l) if l.is_expired() => Err(l.error()),
            _ => Ok(()),
        }
    }
}

/// Pushes events to a topic. Dropping a producer flushes it but does not
/// close its part of the stream; call [`close`](Self::close) for that.
/// A leased producer that is dropped stops being renewed, so its part
/// ends when the lease runs out ([`ProducerOptions::lease`]).
pub struct Producer(Backend);

/// What a producer writes to: Strom servers, or a Kafka cluster.
enum Backend {
    Native(NativeProducer),
    /// Boxed: the native variant stays one pointer wide.
    #[cfg(feature = "kafka")]
    Kafka(Box<crate::kafka::KafkaProducer>),
}

/// Calls the same method on whichever backend the producer has.
macro_rules! backend {
    ($self:ident, $p:ident => $e:expr) => {
        match &$self.0 {
            Backend::Native($p) => $e,
            #[cfg(feature = "kafka")]
            Backend::Kafka($p) => $e,
        }
    };
}

impl Producer {
    pub(crate) fn new(topic: Topic, opts: ProducerOptions) -> Result<Producer> {
        #[cfg(feature = "kafka")]
        if topic.driver.kafka().is_some() {
            let p = crate::kafka::KafkaProducer::new(topic, opts)?;
            return Ok(Producer(Backend::Kafka(Box::new(p))));
        }
        Ok(Producer(Backend::Native(NativeProducer::new(topic, opts)?)))
    }

    /// Queues an event; returns at once unless the partition's in-flight
    /// limit is reached (backpressure).
    pub fn push(
        &self,
        metadata: impl Into<MetadataInput>,
        data: impl Into<Data>,
    ) -> Result<PushFuture> {
        self.push_with(metadata, data, None, &[])
    }

    /// [`push`](Self::push) with an explicit partition and a data descriptor.
    pub fn push_with(
        &self,
        metadata: impl Into<MetadataInput>,
        data: impl Into<Data>,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture> {
        backend!(self, p => p.push_with(metadata, data, partition, descriptor))
    }

    /// Sends every pending event and waits until all are acknowledged.
    /// Returns the first error any batch met since the last flush.
    pub fn flush(&self) -> Result<()> {
        backend!(self, p => p.flush())
    }

    /// Flushes, then ends this producer's contribution to the stream. When
    /// every producer of the topic has closed, consumers see end-of-stream.
    pub fn close(&self) -> Result<()> {
        backend!(self, p => p.close())
    }

    pub fn topic(&self) -> &Topic {
        backend!(self, p => p.topic())
    }

    /// This producer's id in the topic's registry (see [`Topic::close_producer`]).
    pub fn id(&self) -> u64 {
        backend!(self, p => p.id())
    }
}

/// A producer writing to Strom servers.
struct NativeProducer {
    inner: Arc<Inner>,
}

impl NativeProducer {
    fn new(topic: Topic, opts: ProducerOptions) -> Result<NativeProducer> {
        if opts.max_batches == 0 {
            return Err(Error::InvalidArgument(
                "max_batches must be at least 1".into(),
            ));
        }
        let info = topic.refresh_blocking()?;
        let policy = topic.policy()?;
        let (id, lease) = crate::lease::register(&topic, opts.lease)?;
        let limits = learn_limits(&topic, &info.partitions);
        // Large batches amortize the fdatasync of file partitions under
        // `always`; memory partitions never sync.
        let fsync_bound = info.spec.durability == strom_proto::Durability::Always
            && info.spec.partition_type == strom_proto::PartitionType::File;
        let batch_target = opts.batch.target(fsync_bound, limits.values().copied());
        let idempotent = opts.idempotent.unwrap_or(info.spec.replicas() > 1);
        if idempotent && opts.max_batches > retry::MAX_IN_FLIGHT {
            return Err(Error::InvalidArgument(format!(
                "an idempotent producer keeps at most {} batches in flight per partition (the \
                 partition remembers that many for resends), not {}",
                retry::MAX_IN_FLIGHT,
                opts.max_batches
            )));
        }
        let compression = Compression::parse(&info.spec.compression)
            .map_err(|e| Error::coded(strom_proto::ErrorCode::INVALID_TOPIC_SPEC, e))?;
        let inner = Arc::new(Inner {
            topic,
            id,
            policy,
            opts,
            parts: RwLock::new(Vec::new()),
            closed: AtomicBool::new(false),
            batch_target,
            lease,
            idempotent,
            compression,
        });
        inner.add_partitions(&info.partitions, &limits);
        inner
            .topic
            .driver
            .inner
            .handle
            .spawn(refresh_loop(Arc::downgrade(&inner)));
        if inner.opts.batch.trigger != Trigger::Adaptive {
            let weak = Arc::downgrade(&inner);
            inner.topic.driver.inner.handle.spawn(linger_loop(weak));
        }
        Ok(NativeProducer { inner })
    }

    fn push_with(
        &self,
        metadata: impl Into<MetadataInput>,
        data: impl Into<Data>,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("producer"));
        }
        self.inner.check_lease()?;
        let parts = self.inner.parts.read();
        let n = parts.len() as u32;
        let (p, meta) = self.inner.policy.prepare(metadata.into(), partition, n)?;
        let data = data.into();
        // A compressed topic's data part may be stored with a frame header.
        let frame = match data.is_empty() || self.inner.compression.is_none() {
            true => 0,
            false => crate::compress::HEADER_LEN as u64,
        };
        let size = meta.len() as u64 + descriptor.len() as u64 + data.len() + frame + 16;
        let q = parts[p as usize].clone();
        drop(parts);
        let q = &q;
        let inner = &self.inner;
        let mut st = q.state.lock();
        if size > st.limit.bytes {
            return Err(Error::coded(
                strom_proto::ErrorCode::BATCH_TOO_LARGE,
                format!(
                    "an event of {size} bytes is larger than partition {p} of topic '{}' accepts ({} bytes): {}, or split the data",
                    inner.topic.name(),
                    st.limit.bytes,
                    st.limit.reason
                ),
            ));
        }
        loop {
            let full = match inner.opts.batch.trigger {
                Trigger::Count(c) => st.builder.count() >= c.max(1),
                Trigger::Full => st.bytes >= inner.batch_target,
                Trigger::Adaptive => false,
            } || (!st.builder.is_empty() && st.bytes + size > inner.batch_target)
                || st.builder.count() >= strom_proto::batch::MAX_EVENTS;
            if !full {
                break;
            }
            if st.sealed.is_empty() {
                seal(&mut st);
                inner.dispatch(q, &mut st);
            } else {
                q.cond.wait(&mut st);
            }
        }
        let index = st.builder.count();
        st.builder.push(&meta, descriptor, data.len());
        st.bytes += size;
        st.data.extend(data.0.into_iter().filter(|b| !b.is_empty()));
        let fut = PushFuture {
            slot: st.slot.clone(),
            partition: p,
            index,
        };
        if inner.opts.batch.trigger == Trigger::Adaptive {
            inner.dispatch(q, &mut st);
        }
        Ok(fut)
    }

    fn flush(&self) -> Result<()> {
        self.inner.check_lease()?;
        let mut first = None;
        let parts = self.inner.parts.read().clone();
        for q in &parts {
            let mut st = q.state.lock();
            while !st.builder.is_empty() {
                if st.sealed.is_empty() {
                    seal(&mut st);
                }
                self.inner.dispatch(q, &mut st);
                if !st.builder.is_empty() {
                    q.cond.wait(&mut st);
                }
            }
            self.inner.dispatch(q, &mut st);
            while st.in_flight > 0 || !st.sealed.is_empty() {
                q.cond.wait(&mut st);
            }
            if let Some(e) = st.error.take() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn close(&self) -> Result<()> {
        let flushed = self.flush();
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return flushed;
        }
        if let Some(l) = &self.inner.lease {
            self.inner.topic.driver.inner.leases.release(l);
            self.inner.check_lease()?;
        }
        let d = self.inner.topic.driver.clone();
        let req = Request::CloseProducer {
            topic: self.inner.topic.name().to_string(),
            producer: self.inner.id,
        };
        self.inner
            .topic
            .driver
            .block_on(async move { d.master_call(req).await })?;
        flushed
    }

    fn topic(&self) -> &Topic {
        &self.inner.topic
    }

    fn id(&self) -> u64 {
        self.inner.id
    }
}

impl Drop for NativeProducer {
    fn drop(&mut self) {
        let expired = self.inner.lease.as_ref().is_some_and(|l| l.is_expired());
        if !expired && !self.inner.closed.load(Ordering::Acquire) {
            if let Err(e) = self.flush() {
                tracing::warn!(topic = %self.inner.topic.name(), error = %e, "flush on producer drop failed");
            }
        }
    }
}

fn seal(st: &mut QueueState) {
    if st.builder.is_empty() {
        return;
    }
    let count = st.builder.count();
    let stamp = st.stamp.map(|producer| ProducerStamp {
        producer,
        sequence: st.next_seq,
        restart: false,
    });
    st.next_seq = st.next_seq.wrapping_add(u32::from(stamp.is_some()));
    let meta = st.builder.finish_stamped(stamp);
    let data = std::mem::take(&mut st.data);
    let slot = std::mem::replace(&mut st.slot, Arc::new(Slot::new()));
    st.bytes = 0;
    st.sealed.push_back(Sealed {
        meta,
        count,
        data,
        slot,
        seq: stamp.map(|s| s.sequence),
        failed_at: None,
        packed: false,
    });
}

impl Inner {
    /// Adds queues (and sender tasks) for the partitions not known yet;
    /// `limits` are the known servers' limits by address.
    fn add_partitions(
        self: &Arc<Self>,
        infos: &[PartitionInfo],
        limits: &HashMap<String, ServerLimits>,
    ) {
        let mut parts = self.parts.write();
        for info in infos.iter().skip(parts.len()) {
            let (outbox, rx) = mpsc::unbounded_channel();
            let q = Arc::new(PartQueue {
                partition: parts.len() as u32,
                owner: Mutex::new((info.member, info.addr.clone())),
                conn: Mutex::new(None),
                queued: AtomicUsize::new(0),
                state: Mutex::new(QueueState {
                    limit: self.event_limit(&info.addr, limits.get(&info.addr).copied()),
                    builder: BatchBuilder::new(),
                    data: Vec::new(),
                    bytes: 0,
                    slot: Arc::new(Slot::new()),
                    sealed: VecDeque::new(),
                    in_flight: 0,
                    error: None,
                    stamp: self.idempotent.then_some(self.id),
                    next_seq: 0,
                    resend: Default::default(),
                    resending: false,
                    gave_up: false,
                }),
                cond: Condvar::new(),
                outbox,
            });
            let handle = &self.topic.driver.inner.handle;
            handle.spawn(send_loop(Arc::downgrade(self), q.clone(), rx));
            parts.push(q);
        }
    }

    /// Sends sealed batches (and, in adaptive mode, the open one) while
    /// in-flight slots are free.
    fn dispatch(self: &Arc<Self>, q: &Arc<PartQueue>, st: &mut QueueState) {
        while st.in_flight < self.opts.max_batches && !st.resending {
            if st.sealed.is_empty() && self.opts.batch.trigger == Trigger::Adaptive {
                seal(st);
            }
            let Some(b) = st.sealed.pop_front() else {
                return;
            };
            st.in_flight += 1;
            if let Some(b) = self.send_batch(q, b) {
                // The sender task is gone: the driver is shutting down.
                st.in_flight -= 1;
                b.slot.complete(Err(Error::Closed("driver")));
            }
        }
    }

    fn event_limit(&self, addr: &str, server: Option<ServerLimits>) -> EventLimit {
        event_limit(
            self.opts.batch.max_event_bytes,
            server,
            addr,
            self.topic.name(),
        )
    }

    fn produce_request(&self, q: &PartQueue, b: &Sealed) -> Request {
        Request::Produce {
            topic: self.topic.name().to_string(),
            partition: q.partition,
            count: b.count,
            acks_all: self.opts.acks == Acks::All,
            meta: b.meta.clone(),
        }
    }

    /// Writes the batch straight to the owner's connection when nothing is
    /// queued ahead of it; otherwise hands it to the partition's sender task.
    /// Called with the partition's state locked; returns the batch if it
    /// could not be sent at all.
    fn send_batch(self: &Arc<Self>, q: &Arc<PartQueue>, mut b: Sealed) -> Option<Sealed> {
        // Batches to compress go through the sender task, which frames them.
        let direct = b.packed || self.compression.is_none();
        if direct && q.queued.load(Ordering::Acquire) == 0 {
            let conn = q.conn.lock().clone().filter(|c| !c.is_dead());
            if let Some(conn) = conn {
                let req = self.produce_request(q, &b);
                let done = self.completion(q, &b);
                match conn.try_send_with(&req, b.data, done) {
                    Ok(()) => return None,
                    Err((data, _unused)) => b.data = data,
                }
            }
        }
        q.queued.fetch_add(1, Ordering::AcqRel);
        match q.outbox.send(b) {
            Ok(()) => None,
            Err(mpsc::error::SendError(b)) => {
                q.queued.fetch_sub(1, Ordering::AcqRel);
                Some(b)
            }
        }
    }

    /// What runs when a batch's response (or failure) arrives: settle its
    /// futures, free the in-flight slot and send what waits.
    fn completion(self: &Arc<Self>, q: &Arc<PartQueue>, b: &Sealed) -> Callback {
        let (inner, q, slot, count) = (self.clone(), q.clone(), b.slot.clone(), b.count);
        let again = b.seq.map(|_| b.copy());
        Box::new(move |r| {
            let r = match (r, again) {
                (Err(e), Some(again)) => match retry::resend_later(&inner, &q, again, e) {
                    None => return,
                    Some(e) => Err(e),
                },
                (r, _) => r,
            };
            let result = match r {
                Ok((
                    Response::Produced {
                        base_offset,
                        count: c,
                        ..
                    },
                    _,
                )) if c == count => Ok(BatchAck { base_offset }),
                Ok((other, _)) => Err(unexpected(other)),
                Err(e) => {
                    let (member, addr) = q.owner.lock().clone();
                    Err(Error::coded(
                        e.code(),
                        format!(
                            "partition {} of topic '{}' on member {member} ({addr}): {}",
                            q.partition,
                            inner.topic.name(),
                            e.message()
                        ),
                    ))
                }
            };
            let mut st = q.state.lock();
            if let Err(e) = &result {
                st.error.get_or_insert_with(|| e.shared());
            }
            slot.complete(result);
            st.in_flight -= 1;
            inner.dispatch(&q, &mut st);
            drop(st);
            q.cond.notify_all();
        })
    }
}

/// Writes the batches handed to it in order, opening (and reopening) the
/// owner's connection; responses settle through each batch's completion.
async fn send_loop(weak: Weak<Inner>, q: Arc<PartQueue>, mut rx: mpsc::UnboundedReceiver<Sealed>) {
    while let Some(mut b) = rx.recv().await {
        let Some(inner) = weak.upgrade() else { return };
        if !b.packed && !inner.compression.is_none() {
            if let Err(e) = crate::compress::pack(inner.compression, &mut b.meta, &mut b.data).await
            {
                inner.completion(&q, &b)(Err(e));
                q.queued.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            b.packed = true;
        }
        let done = inner.completion(&q, &b);
        let addr = q.owner.lock().1.clone();
        match inner.topic.driver.conn(&addr).await {
            Ok(conn) => {
                *q.conn.lock() = Some(conn.clone());
                let req = inner.produce_request(&q, &b);
                conn.send_with(&req, b.data, done).await;
            }
            Err(e) => done(Err(e)),
        }
        q.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends partial `Count`/`Bytes` batches that waited `linger`.
async fn linger_loop(weak: Weak<Inner>) {
    loop {
        let every = match weak.upgrade() {
            Some(i) => i.opts.linger.max(Duration::from_millis(1)),
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(inner) = weak.upgrade() else { return };
        let parts = inner.parts.read().clone();
        for q in &parts {
            let mut st = q.state.lock();
            if st.sealed.is_empty() && !st.builder.is_empty() {
                seal(&mut st);
                inner.dispatch(q, &mut st);
            }
        }
    }
}
