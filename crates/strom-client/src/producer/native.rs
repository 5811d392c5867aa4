//! The native producer: per-partition queues of batches sent to Strom
//! servers from the driver's runtime, with leases, idempotent resends
//! and refreshes of the topic's partitions (`refresh.rs`, `retry.rs`).
//! The queues all three work on are `state.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};
use strom_policy::MetadataInput;
use strom_proto::{BatchBuilder, Compression, PartitionInfo, ProducerStamp, Request, Response};
use tokio::sync::mpsc;

use crate::backend::ProducerBackend;
use crate::batching::{event_limit, EventLimit, Trigger};
use crate::conn::{Callback, ServerLimits};
use crate::error::unexpected;
use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::topic::Topic;

use super::refresh::{learn_limits, refresh_loop, unanswered_loop};
use super::retry;
use super::state::{Inner, PartQueue, QueueState, Sealed};
use crate::push::{Acks, BatchAck, Data, ProducerOptions, PushFuture};

/// Pushes events to a topic. Dropping a producer flushes it (except on a
/// panicking thread) but does not close its part of the stream; call
/// [`close`](Self::close) for that.
/// A leased producer that is dropped stops being renewed, so its part
/// ends when the lease runs out ([`ProducerOptions::lease`]).
/// A producer writing to Strom servers.
pub(crate) struct NativeProducer {
    pub(super) inner: Arc<Inner>,
}

impl NativeProducer {
    pub(crate) fn new(topic: Topic, opts: ProducerOptions) -> Result<NativeProducer> {
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
        let holds_appends = info.spec.effective_overflow() == Some(strom_proto::Overflow::Block);
        let request_timeout = (!holds_appends).then_some(opts.request_timeout);
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
            request_timeout,
        });
        inner.add_partitions(&info.partitions, &limits);
        inner
            .topic
            .driver
            .inner
            .handle
            .spawn(refresh_loop(Arc::downgrade(&inner)));
        inner
            .topic
            .driver
            .inner
            .handle
            .spawn(unanswered_loop(Arc::downgrade(&inner)));
        if inner.opts.batch.trigger != Trigger::Adaptive {
            let weak = Arc::downgrade(&inner);
            inner.topic.driver.inner.handle.spawn(linger_loop(weak));
        }
        Ok(NativeProducer { inner })
    }
}

impl ProducerBackend for NativeProducer {
    fn push_with(
        &self,
        metadata: MetadataInput,
        data: Data,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("producer"));
        }
        self.inner.check_lease()?;
        let parts = self.inner.parts.read();
        let n = parts.len() as u32;
        let (p, meta) = self.inner.policy.prepare(metadata, partition, n)?;
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
        let meta_size = size - data.len();
        let target = &inner.batch_target;
        loop {
            let full = match inner.opts.batch.trigger {
                Trigger::Count(c) => st.builder.count() >= c.max(1),
                Trigger::Full => target.reached(st.meta_bytes, st.bytes),
                Trigger::Adaptive => false,
            } || (!st.builder.is_empty()
                && target.overflows(st.meta_bytes, st.bytes, meta_size, size))
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
        st.meta_bytes += meta_size;
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
    /// Flushes, unless the thread is panicking: then what is unacknowledged
    /// may never be (a `block` partition holds appends until readers free
    /// room), and waiting for it would turn the panic into a hang.
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::warn!(topic = %self.inner.topic.name(), "producer dropped by a panicking thread: its unacknowledged events are not waited for");
            return;
        }
        let expired = self.inner.lease.as_ref().is_some_and(|l| l.is_expired());
        if !expired && !self.inner.closed.load(Ordering::Acquire) {
            if let Err(e) = self.flush() {
                tracing::warn!(topic = %self.inner.topic.name(), error = %e, "flush on producer drop failed");
            }
        }
    }
}

pub(super) fn seal(st: &mut QueueState) {
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
    let meta = st.builder.finish_section(stamp);
    let data = std::mem::take(&mut st.data);
    let slot = std::mem::replace(&mut st.slot, Arc::new(Slot::new()));
    st.bytes = 0;
    st.meta_bytes = 0;
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
    pub(super) fn add_partitions(
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
                former: Mutex::new(Vec::new()),
                queued: AtomicUsize::new(0),
                state: Mutex::new(QueueState {
                    limit: self.event_limit(&info.addr, limits.get(&info.addr).copied()),
                    builder: BatchBuilder::new(),
                    data: Vec::new(),
                    bytes: 0,
                    meta_bytes: 0,
                    slot: Arc::new(Slot::new()),
                    sealed: VecDeque::new(),
                    in_flight: 0,
                    answered_at: std::time::Instant::now(),
                    error: None,
                    stamp: self.idempotent.then_some(self.id),
                    next_seq: 0,
                    resend: Default::default(),
                    resending: false,
                    gave_up: false,
                    not_hosted: None,
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
    pub(super) fn dispatch(self: &Arc<Self>, q: &Arc<PartQueue>, st: &mut QueueState) {
        while st.in_flight < self.opts.max_batches && !st.resending {
            if st.sealed.is_empty() && self.opts.batch.trigger == Trigger::Adaptive {
                seal(st);
            }
            let Some(b) = st.sealed.pop_front() else {
                return;
            };
            st.sending();
            st.in_flight += 1;
            if let Some(b) = self.send_batch(q, b) {
                // The sender task is gone: the driver is shutting down.
                st.in_flight -= 1;
                b.slot.complete(Err(Error::Closed("driver")));
            }
        }
    }

    pub(super) fn event_limit(&self, addr: &str, server: Option<ServerLimits>) -> EventLimit {
        event_limit(
            self.opts.batch.max_event_bytes,
            server,
            addr,
            self.topic.name(),
        )
    }

    pub(super) fn produce_request(&self, q: &PartQueue, b: &Sealed) -> Request {
        Request::Produce {
            topic: self.topic.name().to_string(),
            partition: q.partition,
            count: b.count,
            acks_all: self.opts.acks == Acks::All,
            // The section follows the request's head in its own pieces.
            meta: Bytes::new(),
        }
    }

    /// Writes the batch straight to the owner's connection when nothing is
    /// queued ahead of it; otherwise hands it to the partition's sender task.
    /// Called with the partition's state locked; returns the batch if it
    /// could not be sent at all.
    pub(super) fn send_batch(
        self: &Arc<Self>,
        q: &Arc<PartQueue>,
        mut b: Sealed,
    ) -> Option<Sealed> {
        // Batches to compress go through the sender task, which frames them.
        let direct = b.packed || self.compression.is_none();
        if direct && q.queued.load(Ordering::Acquire) == 0 {
            let conn = q.conn.lock().clone().filter(|c| !c.is_dead());
            if let Some(conn) = conn {
                let req = self.produce_request(q, &b);
                let done = self.completion(q, &b);
                match conn.try_send_with(&req, b.meta.pieces(), b.data, done) {
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
    pub(super) fn completion(self: &Arc<Self>, q: &Arc<PartQueue>, b: &Sealed) -> Callback {
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
            st.answered_at = std::time::Instant::now();
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
            // Compression reads and rewrites the section whole.
            let mut meta = b.meta.to_bytes();
            let packed = crate::compress::pack(inner.compression, &mut meta, &mut b.data).await;
            b.meta = meta.into();
            if let Err(e) = packed {
                inner.completion(&q, &b)(Err(e));
                q.queued.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            b.packed = true;
        }
        let done = inner.completion(&q, &b);
        let addr = q.owner.lock().1.clone();
        match open(&inner, &addr).await {
            Ok(conn) => {
                *q.conn.lock() = Some(conn.clone());
                let req = inner.produce_request(&q, &b);
                conn.send_with(&req, b.meta.pieces(), b.data, done).await;
            }
            Err(e) => done(Err(e)),
        }
        q.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection to a partition's owner, opened within the request
/// timeout (a server that accepts and never answers the greeting).
async fn open(inner: &Inner, addr: &str) -> Result<Arc<crate::conn::ClientConn>> {
    let opening = inner.topic.driver.conn(addr);
    let Some(limit) = inner.request_timeout else {
        return opening.await;
    };
    tokio::time::timeout(limit, opening)
        .await
        .unwrap_or_else(|_| {
            Err(Error::coded(
                strom_proto::ErrorCode::CONNECTION_FAILED,
                format!("server {addr} did not open a connection within {limit:?}"),
            ))
        })
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
