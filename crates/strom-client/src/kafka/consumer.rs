//! The Kafka backend's consumer. A librdkafka consumer whose group id is
//! the consumer's name is *assigned* the partitions (no group protocol: a
//! name reads every partition it asks for, as a native named consumer
//! does) at the start position. One reader thread polls it and fills the
//! same queue the native consumer's subscriptions fill, so `pull`,
//! `pull_many`, the iterator and the future work unchanged. Each record's
//! value is fetched whole; the data selector then picks the bytes copied
//! into the broker's buffers. End-of-stream markers are counted per
//! partition and never delivered; `ack` commits the offset to the group.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use strom_proto::{ErrorCode, StartPos};

use super::mapping::{self, Marker, Record};
use super::{kafka_error, unsupported};
use crate::acks::{settle, AckState};
use crate::backend::ConsumerBackend;
use crate::consumer::queue::{Feed, QueueConsumer};
use crate::consumer::state::{AckTarget, Item, PartSub, Shared};
use crate::consumer_options::ConsumerOptions;
use crate::data::{plan_fill, DataDescriptor, EventMeta};
use crate::error::{Error, Result};
use crate::event::{
    nack_refused, poll_settled, wait_settled, AckFuture, AckSource, Event, EventAcks,
};
use crate::topic::{Owner, Topic};

use super::KafkaDriver;

/// How long one poll of librdkafka waits (also how soon a seek or a drop
/// takes over the reader).
const POLL: Duration = Duration::from_millis(50);

/// Longest wait for offsets by timestamp.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A consumer named `name` on Kafka topic `topic` (see the module doc).
pub(crate) fn consumer(
    k: &KafkaDriver,
    topic: Topic,
    name: &str,
    opts: ConsumerOptions,
) -> Result<Box<dyn ConsumerBackend>> {
    let info = topic.describe()?;
    let partitions = match &opts.partitions {
        Some(p) => p.clone(),
        None => (0..info.partitions.len() as u32).collect(),
    };
    if let Some(p) = partitions
        .iter()
        .find(|p| **p as usize >= info.partitions.len())
    {
        return Err(Error::InvalidArgument(format!(
            "topic '{}' has {} partitions; {p} does not exist",
            topic.name(),
            info.partitions.len()
        )));
    }
    let mut config = k.config();
    config
        .set("group.id", name)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .set(
            "queued.max.messages.kbytes",
            (opts.prefetch_bytes / 1024)
                .clamp(1024, 2_097_151)
                .to_string(),
        );
    let kc: BaseConsumer = config
        .create()
        .map_err(|e| kafka_error(format!("cannot create a Kafka consumer '{name}'"), &e))?;
    let kc = Arc::new(kc);
    let mut parts = Vec::with_capacity(partitions.len());
    let mut acks = Vec::with_capacity(partitions.len());
    for &p in &partitions {
        let a = Arc::new(KafkaAcks {
            consumer: kc.clone(),
            topic: topic.name().to_string(),
            partition: p,
            handle: topic.driver.inner.handle.clone(),
            state: Mutex::new(AckState::default()),
            cond: Condvar::new(),
        });
        acks.push(a.clone());
        let pi = &info.partitions[p as usize];
        parts.push(Arc::new(PartSub {
            partition: p,
            owner: Arc::new(Mutex::new(Owner {
                member: pi.member,
                addr: pi.addr.clone(),
            })),
            conn: Mutex::new(None),
            acks: AckTarget::Committed(a),
            stream: AtomicU64::new(0),
            fence: None,
            end: AtomicU64::new(u64::MAX),
            task: Mutex::new(None),
        }));
    }
    let start = opts.start;
    let shared = Shared::new(topic, name, None, opts, parts, false)?;
    let inner = Arc::new(ReaderInner {
        consumer: kc,
        shared: shared.clone(),
        partitions,
        position: Mutex::new(Position::default()),
        stop: AtomicBool::new(false),
    });
    inner.assign(start, &mut inner.position.lock())?;
    let thread = {
        let inner = inner.clone();
        std::thread::Builder::new()
            .name("strom-kafka-reader".into())
            .spawn(move || inner.run())
            .map_err(|e| {
                Error::coded(
                    ErrorCode::INTERNAL,
                    format!("cannot start the Kafka reader: {e}"),
                )
            })?
    };
    let reader = KafkaReader {
        inner,
        thread: Some(thread),
    };
    Ok(Box::new(QueueConsumer::fed(shared, Box::new(reader))))
}

/// End-of-stream bookkeeping of one partition: the producers seen open
/// there and not closed yet.
#[derive(Default)]
struct PartEos {
    open: HashSet<String>,
    ended: bool,
}

/// What the reader knows of the current position; its lock is held while
/// a record is polled and queued, and by a seek.
#[derive(Default)]
struct Position {
    eos: Vec<PartEos>,
}

struct ReaderInner {
    consumer: Arc<BaseConsumer>,
    shared: Arc<Shared>,
    /// The partitions read, by slot.
    partitions: Vec<u32>,
    position: Mutex<Position>,
    stop: AtomicBool,
}

/// The consumer's reader thread; stopped and joined on drop.
pub(crate) struct KafkaReader {
    inner: Arc<ReaderInner>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaReader {
    /// Moves every partition to `pos`; `reset` empties the queue and
    /// starts a new epoch while no record is being queued (the reader
    /// never waits for room while it holds the position).
    fn seek(&self, pos: StartPos, reset: &dyn Fn() -> u64) -> Result<()> {
        let mut position = self.inner.position.lock();
        reset();
        self.inner.assign(pos, &mut position)
    }
}

impl Feed for KafkaReader {
    fn reposition(&self, pos: StartPos, reset: &dyn Fn() -> u64) -> Result<()> {
        self.seek(pos, reset)
    }
}

impl Drop for KafkaReader {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ReaderInner {
    /// Assigns the partitions at `pos` and forgets the markers seen.
    fn assign(&self, pos: StartPos, position: &mut Position) -> Result<()> {
        let topic = self.shared.topic.name();
        let offset = match pos {
            StartPos::Committed => Offset::Stored,
            StartPos::Beginning => Offset::Beginning,
            StartPos::End => Offset::End,
            StartPos::Offset(o) => Offset::Offset(i64::try_from(o).map_err(|_| {
                Error::InvalidArgument(format!("offset {o} is beyond Kafka's range"))
            })?),
            StartPos::Timestamp(_) => Offset::End,
        };
        let mut tpl = TopicPartitionList::with_capacity(self.partitions.len());
        for &p in &self.partitions {
            tpl.add_partition_offset(topic, p as i32, offset)
                .map_err(|e| kafka_error("cannot build the assignment", &e))?;
        }
        if let StartPos::Timestamp(us) = pos {
            let ms = i64::try_from(us / 1000).unwrap_or(i64::MAX);
            let mut ask = TopicPartitionList::with_capacity(self.partitions.len());
            for &p in &self.partitions {
                ask.add_partition_offset(topic, p as i32, Offset::Offset(ms))
                    .map_err(|e| kafka_error("cannot build the lookup", &e))?;
            }
            tpl = self
                .consumer
                .offsets_for_times(ask, LOOKUP_TIMEOUT)
                .map_err(|e| {
                    kafka_error(format!("cannot find offsets by time in '{topic}'"), &e)
                })?;
        }
        self.consumer
            .unassign()
            .and_then(|()| self.consumer.assign(&tpl))
            .map_err(|e| kafka_error(format!("cannot assign the partitions of '{topic}'"), &e))?;
        position.eos = self.partitions.iter().map(|_| PartEos::default()).collect();
        tracing::debug!(topic, consumer = %self.shared.name, start = ?pos, "Kafka consumer assigned");
        Ok(())
    }

    /// The reader thread: polls until stopped, while the fetched data held
    /// for events not pulled yet is under `prefetch_bytes`.
    fn run(&self) {
        let limit = self.shared.opts.prefetch_bytes;
        while !self.stop.load(Ordering::Acquire) {
            if !self.shared.budget.has_room(limit) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut position = self.position.lock();
            let epoch = self.shared.epoch();
            match self.consumer.poll(POLL) {
                None => {}
                Some(Ok(m)) => self.record(&m, epoch, &mut position),
                Some(Err(e)) => {
                    let e = kafka_error(
                        format!("reading Kafka topic '{}'", self.shared.topic.name()),
                        &e,
                    );
                    tracing::warn!(topic = %self.shared.topic.name(), error = %e, "Kafka consumer error");
                    self.shared.deliver(epoch, Item::Failed(e));
                }
            }
            // A seek waiting for the position gets it now.
            parking_lot::MutexGuard::unlock_fair(position);
        }
    }

    /// Queues one polled record: an event, or a marker counted.
    fn record(&self, m: &BorrowedMessage<'_>, epoch: u64, position: &mut Position) {
        let Some(slot) = self
            .partitions
            .iter()
            .position(|p| *p as i32 == m.partition())
        else {
            return;
        };
        let Some(eos) = position.eos.get_mut(slot) else {
            return;
        };
        if eos.ended {
            return;
        }
        match mapping::read(m) {
            Record::Marker(Marker::Open(id)) => {
                eos.open.insert(id);
            }
            Record::Marker(Marker::Close(id)) => {
                eos.open.remove(&id);
                if eos.open.is_empty() {
                    eos.ended = true;
                    tracing::debug!(
                        partition = m.partition(),
                        "Kafka partition ended: every producer seen open closed"
                    );
                    self.shared.deliver(epoch, Item::End(slot as u32));
                }
            }
            Record::Event(meta) => {
                let (item, held) = match self.event(m, slot, meta) {
                    Ok(ev) => {
                        let held = ev.fetched;
                        (Item::Events(slot as u32, VecDeque::from([ev])), held)
                    }
                    Err(e) => (Item::Failed(e), 0),
                };
                if !self.shared.deliver(epoch, item) {
                    self.shared.budget.release(held);
                }
            }
        }
    }

    /// The event a record is, its selected bytes copied into the broker's
    /// buffers (and counted in the data budget).
    fn event(&self, m: &BorrowedMessage<'_>, slot: usize, meta: Vec<u8>) -> Result<Event> {
        let shared = &self.shared;
        let sub = shared.part(slot);
        let value = m.payload().unwrap_or_default();
        let ts = m.timestamp().to_millis().unwrap_or(0).max(0) as u64;
        let em_offset = m.offset().max(0) as u64;
        let em = EventMeta::new(
            sub.partition,
            em_offset,
            ts.saturating_mul(1000),
            Bytes::from(meta),
            shared.policy.clone(),
        );
        let size = value.len() as u64;
        let mut buffers = Vec::new();
        let mut fetched = 0;
        if size > 0 {
            let desc = DataDescriptor {
                size,
                descriptor: Bytes::new(),
            };
            let picked = shared
                .opts
                .selector
                .try_select(&em, &desc)
                .map_err(Error::Selector)
                .and_then(|sel| Ok((sel.resolve(size).map_err(Error::Selector)?, sel)));
            let (ranges, sel) = picked?;
            fetched = ranges.iter().map(|r| r.1).sum();
            if fetched > 0 {
                buffers = shared
                    .opts
                    .broker
                    .buffers(&em, &sel, fetched)
                    .map_err(Error::Broker)?;
                copy_ranges(value, &ranges, &mut buffers, fetched)?;
                shared.budget.take(fetched);
            }
        }
        Ok(Event {
            meta: em,
            data_size: size,
            fetched,
            buffers,
            descriptor: Bytes::new(),
            acks: sub.acks.for_events(),
            deliveries: 1,
            batch_end: em_offset + 1,
        })
    }
}

/// Copies the `ranges` of `value` (`len` bytes in all) into `bufs` in order.
fn copy_ranges(
    value: &[u8],
    ranges: &[(u64, u64)],
    bufs: &mut [Box<dyn crate::data::DataBuffer>],
    len: u64,
) -> Result<()> {
    let mut plan = Vec::new();
    plan_fill(bufs, 0, len, &mut plan)?;
    let mut src = ranges
        .iter()
        .map(|&(o, l)| &value[o as usize..(o + l) as usize]);
    let mut cur: &[u8] = &[];
    for (b, start, n) in plan {
        let dst = &mut bufs[b].as_mut_slice()[start..start + n];
        let mut done = 0;
        while done < n {
            if cur.is_empty() {
                match src.next() {
                    Some(s) => cur = s,
                    None => break,
                }
            }
            let k = cur.len().min(n - done);
            dst[done..done + k].copy_from_slice(&cur[..k]);
            cur = &cur[k..];
            done += k;
        }
    }
    Ok(())
}

/// Commits of one partition for the consumer's Kafka group: the highest
/// acked offset, one commit in flight at a time.
pub(crate) struct KafkaAcks {
    consumer: Arc<BaseConsumer>,
    topic: String,
    partition: u32,
    handle: tokio::runtime::Handle,
    state: Mutex<AckState>,
    cond: Condvar,
}

impl KafkaAcks {
    fn commit_loop(&self) {
        loop {
            let Some(target) = self.state.lock().next_target() else {
                return;
            };
            let outcome = self.commit(target).map_err(|e| (e.code(), e.message()));
            if !settle(&self.state, &self.cond, target, outcome) {
                return;
            }
        }
    }

    fn commit(&self, offset: u64) -> Result<()> {
        let o = i64::try_from(offset).map_err(|_| unsupported("offsets beyond 2^63"))?;
        let mut tpl = TopicPartitionList::with_capacity(1);
        tpl.add_partition_offset(&self.topic, self.partition as i32, Offset::Offset(o))
            .map_err(|e| kafka_error("cannot build the commit", &e))?;
        self.consumer.commit(&tpl, CommitMode::Sync).map_err(|e| {
            kafka_error(
                format!(
                    "committing offset {offset} of '{}'/{}",
                    self.topic, self.partition
                ),
                &e,
            )
        })
    }
}

impl EventAcks for KafkaAcks {
    /// Commits everything up to the event (Kafka's committed offset is
    /// the next one to read).
    fn ack_event(self: Arc<Self>, offset: u64) -> AckFuture {
        let next = offset + 1;
        if self.state.lock().want(next) {
            let me = Arc::clone(&self);
            self.handle.spawn_blocking(move || me.commit_loop());
        }
        AckFuture::new(self, next)
    }

    fn nack_event(self: Arc<Self>, _offset: u64) -> AckFuture {
        nack_refused(self)
    }
}

impl AckSource for KafkaAcks {
    fn poll_ticket(&self, t: u64, waker: Option<&Waker>) -> Option<Result<()>> {
        poll_settled(&self.state, waker, |st| st.check(t), AckState::wakers)
    }

    fn wait_ticket(&self, t: u64, deadline: Option<Instant>) -> Option<Result<()>> {
        wait_settled(&self.state, &self.cond, deadline, |st| st.check(t))
    }
}
