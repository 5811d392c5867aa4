//! The Kafka target, through librdkafka (`rdkafka` crate, built from source).
//! One event is one record whose value is metadata followed by data. The
//! clients are tuned the way practitioners tune them for throughput:
//! linger.ms=5 (0 when e2e is paced, for latency), batch.size=1 MiB, acks=1,
//! no compression, large fetches. `--durability always` maps to the topic's
//! flush.messages=1 (fsync per message), `interval:MS` to flush.ms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use strom_client::Durability;

use super::sys::pid_listening_on;
use super::workload::{now_us, stamp, Pacer, Tally};
use super::{Config, ConsumeJob, Outcome, ProduceJob, Target, Worker};

const TIMEOUT: Duration = Duration::from_secs(30);

pub struct KafkaTarget {
    addr: String,
}

impl KafkaTarget {
    pub fn new(addr: &str) -> anyhow::Result<KafkaTarget> {
        if addr.is_empty() {
            anyhow::bail!("--target kafka://HOST:PORT needs the broker's address");
        }
        Ok(KafkaTarget { addr: addr.into() })
    }

    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.addr)
            .set("message.max.bytes", "67108864")
            .set("receive.message.max.bytes", "134217728");
        c
    }

    fn probe(&self) -> anyhow::Result<BaseConsumer> {
        let mut c = self.base();
        c.set("group.id", "strom-bench-probe");
        Ok(c.create()?)
    }
}

impl Target for KafkaTarget {
    fn prepare(&mut self, cfg: &Config) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.base().create()?;
        let interval;
        let mut topic = NewTopic::new(
            &cfg.topic,
            cfg.args.partitions as i32,
            TopicReplication::Fixed(1),
        )
        .set("max.message.bytes", "67108864");
        match cfg.durability {
            Durability::Always => topic = topic.set("flush.messages", "1"),
            Durability::Interval(ms) => {
                interval = ms.to_string();
                topic = topic.set("flush.ms", &interval);
            }
            Durability::Never => {}
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
        let results = rt.block_on(admin.create_topics([&topic], &opts))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => anyhow::bail!("cannot create Kafka topic {name}: {code}"),
            }
        }
        // Wait until the partitions have leaders (metadata shows them).
        let probe = self.probe()?;
        for _ in 0..100 {
            let md = probe.fetch_metadata(Some(&cfg.topic), TIMEOUT)?;
            let ready = md.topics().iter().any(|t| {
                t.partitions().len() == cfg.args.partitions as usize
                    && t.partitions().iter().all(|p| p.leader() >= 0)
            });
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("Kafka topic {} has no partition leaders", cfg.topic)
    }

    fn stored(&self, cfg: &Config) -> anyhow::Result<Vec<u64>> {
        let probe = self.probe()?;
        (0..cfg.args.partitions as i32)
            .map(|p| {
                let (lo, hi) = probe.fetch_watermarks(&cfg.topic, p, TIMEOUT)?;
                Ok((hi - lo).max(0) as u64)
            })
            .collect()
    }

    fn producer(&self, cfg: &Config, job: &ProduceJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        let linger = if cfg.args.rate > 0 { "0" } else { "5" };
        let producer: ThreadedProducer<Counter> = self
            .base()
            .set("linger.ms", linger)
            .set("batch.size", "1048576")
            .set("batch.num.messages", "100000")
            .set("acks", "1")
            .set("compression.type", "none")
            .set("queue.buffering.max.kbytes", "1048576")
            .set("queue.buffering.max.messages", "1000000")
            .create_with_context(Counter::default())?;
        Ok(Box::new(KafkaProducer {
            producer,
            topic: cfg.topic.clone(),
            job: job.clone(),
            value: cfg.payload.joined(),
            pacer: Pacer::new(cfg.interval()),
        }))
    }

    fn consumer(&self, cfg: &Config, job: &ConsumeJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        let consumer: BaseConsumer = self
            .base()
            .set("group.id", &job.name)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.max.bytes", "67108864")
            .set("max.partition.fetch.bytes", "67108864")
            .set("fetch.wait.max.ms", "100")
            .set("queued.min.messages", "1000000")
            .set("queued.max.messages.kbytes", "1048576")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for &p in &job.partitions {
            tpl.add_partition_offset(&cfg.topic, p as i32, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(Box::new(KafkaConsumer {
            consumer,
            job: job.clone(),
        }))
    }

    fn child_target(&self) -> String {
        format!("kafka://{}", self.addr)
    }

    fn server_pid(&self) -> Option<u32> {
        pid_listening_on(self.addr.rsplit(':').next()?.parse().ok()?)
    }
}

/// Counts delivery reports and failures (librdkafka calls back per record).
#[derive(Default)]
struct Counter {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for Counter {}

impl ProducerContext for Counter {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.delivered.fetch_add(1, Ordering::Relaxed),
            Err((e, _)) => {
                if let Ok(mut f) = self.first_error.lock() {
                    f.get_or_insert_with(|| e.to_string());
                }
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

struct KafkaProducer {
    producer: ThreadedProducer<Counter>,
    topic: String,
    job: ProduceJob,
    value: Vec<u8>,
    pacer: Pacer,
}

impl Worker for KafkaProducer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let parts = &self.job.partitions;
        for i in 0..self.job.events {
            self.pacer.wait(i);
            if self.job.stamp && i >= self.job.warmup {
                stamp(&mut self.value, now_us());
            }
            let p = parts[(i % parts.len() as u64) as usize] as i32;
            loop {
                let rec = BaseRecord::<(), [u8]>::to(&self.topic)
                    .partition(p)
                    .payload(&self.value[..]);
                match self.producer.send(rec) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    Err((e, _)) => return Err(e).context("Kafka produce failed"),
                }
            }
            if i % 1024 == 1023 {
                progress.fetch_add(1024, Ordering::Relaxed);
            }
        }
        self.producer.flush(TIMEOUT * 10)?;
        progress.fetch_add(self.job.events % 1024, Ordering::Relaxed);
        let ctx = self.producer.context();
        let failed = ctx.failed.load(Ordering::Relaxed);
        if failed > 0 {
            let first = ctx.first_error.lock().ok().and_then(|f| f.clone());
            anyhow::bail!(
                "{failed} Kafka records failed: {}",
                first.unwrap_or_default()
            );
        }
        Ok(Outcome {
            events: ctx.delivered.load(Ordering::Relaxed),
            ..Default::default()
        })
    }
}

struct KafkaConsumer {
    consumer: BaseConsumer,
    job: ConsumeJob,
}

impl Worker for KafkaConsumer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let mut tally = Tally::new(&self.job);
        while tally.remaining() > 0 {
            let msg = match self.consumer.poll(Duration::from_millis(500)) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => return Err(e).context("Kafka consume failed"),
                Some(Ok(m)) => m,
            };
            let Some(slot) = self
                .job
                .partitions
                .iter()
                .position(|&p| p as i32 == msg.partition())
            else {
                continue;
            };
            let value = msg.payload().unwrap_or_default();
            tally.record(slot, value, value.len() as u64, progress);
        }
        Ok(tally.finish())
    }
}
