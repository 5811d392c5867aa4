//! The Kafka backend's producer: an idempotent librdkafka producer
//! (`ThreadedProducer`, whose thread runs the delivery reports). The
//! topic's policy validates each event, serializes its metadata and picks
//! its partition on the caller's thread, as the native producer does; the
//! record goes to that partition with the metadata as the `strom.meta`
//! header and the data as the value. Each `push` returns the native
//! [`PushFuture`], settled by the record's delivery report. End of stream:
//! an `open` marker goes to every partition when the producer starts, a
//! `close` marker on [`close`](KafkaProducer::close).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};
use rdkafka::util::Timeout;
use strom_policy::{MetadataInput, TopicPolicy};

use super::mapping::{Marker, EOS_HEADER, META_HEADER};
use super::{kafka_error, unsupported};
use crate::backend::ProducerBackend;
use crate::error::{Error, Result};
use crate::push::{BatchAck, Data, ProducerOptions, PushFuture};
use crate::slot::Slot;
use crate::topic::Topic;

use super::KafkaDriver;

/// How long a full librdkafka queue is given to drain before `push` tries
/// again (backpressure: `push` blocks, memory does not grow).
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(10);

/// Settles each record's future from its delivery report and keeps the
/// first failure for the next `flush`.
struct Reports {
    topic: String,
    first_error: Mutex<Option<Error>>,
}

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Arc<Slot<BatchAck>>;

    fn delivery(&self, r: &DeliveryResult<'_>, slot: Self::DeliveryOpaque) {
        match r {
            Ok(m) => slot.complete(Ok(BatchAck {
                base_offset: m.offset().max(0) as u64,
            })),
            Err((e, m)) => {
                let e = kafka_error(
                    format!(
                        "partition {} of Kafka topic '{}'",
                        m.partition(),
                        self.topic
                    ),
                    e,
                );
                tracing::debug!(topic = %self.topic, partition = m.partition(), error = %e, "Kafka delivery failed");
                self.first_error.lock().get_or_insert_with(|| e.shared());
                slot.complete(Err(e));
            }
        }
    }
}

/// A producer on a Kafka topic (see the module doc).
pub(crate) struct KafkaProducer {
    topic: Topic,
    /// Names this producer in its end-of-stream markers.
    id: u64,
    policy: TopicPolicy,
    partitions: u32,
    producer: ThreadedProducer<Reports>,
    closed: AtomicBool,
}

impl KafkaProducer {
    pub fn new(k: &KafkaDriver, topic: Topic, opts: ProducerOptions) -> Result<KafkaProducer> {
        let info = topic.describe()?;
        let partitions = info.partitions.len() as u32;
        let mut config = k.config();
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", opts.linger.as_millis().to_string())
            .set(
                "max.in.flight.requests.per.connection",
                opts.max_batches.clamp(1, 5).to_string(),
            );
        if let Some(max) = opts.batch.max_event_bytes {
            config.set(
                "message.max.bytes",
                max.clamp(1000, 1_000_000_000).to_string(),
            );
        }
        let reports = Reports {
            topic: topic.name().to_string(),
            first_error: Mutex::new(None),
        };
        let producer: ThreadedProducer<Reports> =
            config.create_with_context(reports).map_err(|e| {
                kafka_error(
                    format!("cannot create a Kafka producer for '{}'", topic.name()),
                    &e,
                )
            })?;
        let p = KafkaProducer {
            policy: topic.policy()?,
            topic,
            id: producer_id(),
            partitions,
            producer,
            closed: AtomicBool::new(false),
        };
        p.mark(Marker::Open(p.id.to_string()))?;
        tracing::debug!(topic = %p.topic.name(), producer = p.id, partitions, "Kafka producer open");
        Ok(p)
    }

    /// Hands a record to librdkafka, waiting while its queue is full.
    fn send(&self, mut record: BaseRecord<'_, (), [u8], Arc<Slot<BatchAck>>>) -> Result<()> {
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.producer.poll(QUEUE_FULL_WAIT);
                }
                Err((e, _)) => {
                    return Err(kafka_error(
                        format!("cannot produce to Kafka topic '{}'", self.topic.name()),
                        &e,
                    ))
                }
            }
        }
    }

    /// Writes `marker` to every partition and waits until all are stored.
    fn mark(&self, marker: Marker) -> Result<()> {
        let value = marker.value();
        let mut slots = Vec::with_capacity(self.partitions as usize);
        for p in 0..self.partitions {
            let slot = Arc::new(Slot::new());
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
                key: EOS_HEADER,
                value: Some(value.as_bytes()),
            });
            let record = BaseRecord::<(), [u8], _>::with_opaque_to(self.topic.name(), slot.clone())
                .partition(p as i32)
                .payload(&[][..])
                .headers(headers);
            self.send(record)?;
            slots.push(slot);
        }
        self.flush()?;
        for s in slots {
            if let Some(Err(e)) = s.wait(Some(Duration::ZERO)) {
                return Err(e);
            }
        }
        Ok(())
    }
}

impl ProducerBackend for KafkaProducer {
    fn push_with(
        &self,
        metadata: MetadataInput,
        data: Data,
        partition: Option<u32>,
        descriptor: &[u8],
    ) -> Result<PushFuture> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("producer"));
        }
        if !descriptor.is_empty() {
            return Err(unsupported(
                "a data descriptor (a Kafka record has no place for it)",
            ));
        }
        let (p, meta) = self.policy.prepare(metadata, partition, self.partitions)?;
        let joined;
        let value: &[u8] = match data.0.as_slice() {
            [] => &[],
            [one] => one,
            many => {
                joined = many.concat();
                &joined
            }
        };
        let slot = Arc::new(Slot::new());
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: META_HEADER,
            value: Some(&meta[..]),
        });
        let record = BaseRecord::<(), [u8], _>::with_opaque_to(self.topic.name(), slot.clone())
            .partition(p as i32)
            .payload(value)
            .headers(headers);
        self.send(record)?;
        Ok(PushFuture::single(slot, p))
    }

    fn flush(&self) -> Result<()> {
        self.producer.flush(Timeout::Never).map_err(|e| {
            kafka_error(
                format!("flushing the producer of '{}'", self.topic.name()),
                &e,
            )
        })?;
        match self.producer.context().first_error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn close(&self) -> Result<()> {
        let flushed = self.flush();
        if self.closed.swap(true, Ordering::AcqRel) {
            return flushed;
        }
        self.mark(Marker::Close(self.id.to_string()))?;
        tracing::debug!(topic = %self.topic.name(), producer = self.id, "Kafka producer closed");
        flushed
    }

    fn topic(&self) -> &Topic {
        &self.topic
    }

    fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for KafkaProducer {
    fn drop(&mut self) {
        // As the native producer: flushed, not closed.
        if let Err(e) = self.flush() {
            tracing::warn!(topic = %self.topic.name(), error = %e, "flush on producer drop failed");
        }
    }
}

/// A producer id unique across processes with high probability: the
/// clock's nanoseconds, the process id and a per-process counter.
fn producer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (nanos ^ (u64::from(std::process::id()) << 40))
        .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        >> 1
}
