//! The Strom target: an embedded server (default) or a running group,
//! driven through the ordinary client API. Metadata and data travel on
//! their own paths; a consumer fetches the `--selectivity` part of the data.
//! A memory topic is created with an explicit size bound sized for the run
//! (`Config::memory_retention`), never the server's silent default.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use strom_client::{
    ConsumerOptions, Driver, ErrorCode, Next, Overflow, PartitionType, PoolBroker, Producer,
    ProducerOptions, Selection, StartPos, Topic, TopicSpec,
};

use super::sys::pid_listening_on;
use super::workload::{now_us, stamp, Pacer, Tally};
use super::{Config, ConsumeJob, Outcome, ProduceJob, Target, Worker};

pub struct StromTarget {
    driver: Driver,
    topic: Option<Topic>,
    embedded: bool,
    _tmp: Option<tempfile::TempDir>,
}

impl StromTarget {
    pub fn embedded() -> anyhow::Result<StromTarget> {
        let tmp = tempfile::tempdir()?;
        Ok(StromTarget {
            driver: Driver::embedded(tmp.path())?,
            topic: None,
            embedded: true,
            _tmp: Some(tmp),
        })
    }

    /// `rest` is a group file path or HOST:PORT; empty means the
    /// `--group-file` / `STROM_GROUP_FILE` one.
    pub fn connect(rest: &str, group_file: Option<PathBuf>) -> anyhow::Result<StromTarget> {
        let driver = if rest.is_empty() {
            crate::connect(group_file)?
        } else if rest.parse::<std::net::SocketAddr>().is_ok() {
            Driver::connect_addr(rest)?
        } else {
            Driver::connect(rest)?
        };
        Ok(StromTarget {
            driver,
            topic: None,
            embedded: false,
            _tmp: None,
        })
    }

    pub fn driver(&self) -> &Driver {
        &self.driver
    }

    fn topic(&self, cfg: &Config) -> anyhow::Result<Topic> {
        match &self.topic {
            Some(t) => Ok(t.clone()),
            None => Ok(self.driver.open_topic(&cfg.topic)?),
        }
    }
}

impl Target for StromTarget {
    fn prepare(&mut self, cfg: &Config) -> anyhow::Result<()> {
        let memory = cfg.partition_type == PartitionType::Memory;
        let topic = match self.driver.open_topic(&cfg.topic) {
            Ok(t) => t,
            Err(e) if e.code() == ErrorCode::TOPIC_NOT_FOUND => {
                self.driver.create_topic(TopicSpec {
                    partition_type: cfg.partition_type,
                    durability: cfg.durability,
                    // A produce-only run has no consumer to ack, so a
                    // `block` memory topic would stall once full: the bound
                    // is sized to hold the whole run instead, and should it
                    // still drop (too small a --retention-bytes), the
                    // consume run sees fewer events stored and fails.
                    overflow: memory.then_some(Overflow::DropOldest),
                    retention_bytes: memory.then(|| cfg.memory_retention()),
                    replication_factor: cfg.args.replication_factor,
                    compression: match cfg.args.compression.as_str() {
                        "none" => String::new(),
                        c => c.to_string(),
                    },
                    ..TopicSpec::new(&cfg.topic, cfg.args.partitions)
                })?
            }
            Err(e) => return Err(e.into()),
        };
        let rf = topic.describe()?.spec.replication_factor.max(1);
        if rf != cfg.args.replication_factor {
            anyhow::bail!(
                "topic '{}' has replication factor {rf}, not --replication-factor {}",
                cfg.topic,
                cfg.args.replication_factor
            );
        }
        if topic.partitions() != cfg.args.partitions {
            anyhow::bail!(
                "topic '{}' has {} partitions, not --partitions {}",
                cfg.topic,
                topic.partitions(),
                cfg.args.partitions
            );
        }
        self.topic = Some(topic);
        Ok(())
    }

    fn stored(&self, cfg: &Config) -> anyhow::Result<Vec<u64>> {
        let info = self.topic(cfg)?.describe()?;
        Ok(info
            .partitions
            .iter()
            .map(|p| p.next_offset - p.first_offset)
            .collect())
    }

    fn producer(&self, cfg: &Config, job: &ProduceJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        let producer = self.topic(cfg)?.producer_with(ProducerOptions {
            batch: cfg.batch,
            acks: cfg.acks,
            idempotent: cfg.args.idempotent,
            ..Default::default()
        })?;
        Ok(Box::new(StromProducer {
            producer,
            job: job.clone(),
            meta: cfg.payload.meta.clone(),
            data: cfg.payload.data.clone(),
            pacer: Pacer::new(cfg.interval()),
        }))
    }

    fn consumer(&self, cfg: &Config, job: &ConsumeJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        let sel = cfg.selected_len();
        let selection = match sel {
            0 => Selection::None,
            n if n >= cfg.args.data_size as u64 => Selection::All,
            n => Selection::Range { offset: 0, len: n },
        };
        // An e2e consumer reads over its own connection, as one in another
        // process does (and as the Redis peer's does): sharing the
        // producer's, it would also carry the producer's acknowledgements.
        let topic = match (cfg.args.mode, self.embedded) {
            (super::Mode::E2e, false) => {
                Driver::connect_addr(&self.driver.master_addr())?.open_topic(&cfg.topic)?
            }
            _ => self.topic(cfg)?,
        };
        let consumer = topic.consumer_with(
            &job.name,
            ConsumerOptions {
                partitions: Some(job.partitions.clone()),
                start: StartPos::Beginning,
                selector: Arc::new(selection),
                // Data lands in recycled buffers, as in an application that
                // reads into its own arrays: warm memory, nothing zeroed.
                broker: Arc::new(PoolBroker::default()),
                spin: cfg
                    .args
                    .spin_us
                    .map_or_else(strom_client::default_spin, Duration::from_micros),
                read_on_pull: !cfg.args.no_read_on_pull,
                ..Default::default()
            },
        )?;
        Ok(Box::new(StromConsumer {
            consumer,
            job: job.clone(),
        }))
    }

    fn child_target(&self) -> String {
        format!("strom://{}", self.driver.master_addr())
    }

    fn retention(&self, cfg: &Config) -> anyhow::Result<Option<(u64, &'static str)>> {
        let spec = self.topic(cfg)?.describe()?.spec;
        Ok(match (spec.partition_type, spec.effective_overflow()) {
            (PartitionType::Memory, Some(o)) => {
                // No bound in the spec: the server's default (512 MiB unless
                // its config says otherwise); topics made here always have one.
                Some((spec.retention_bytes.unwrap_or(512 << 20), o.as_str()))
            }
            _ => None,
        })
    }

    fn stored_data_bytes(&self) -> Option<u64> {
        self._tmp.as_ref().map(|t| data_file_bytes(t.path()))
    }

    fn server_pid(&self) -> Option<u32> {
        if self.embedded {
            return Some(std::process::id());
        }
        port_of(&self.driver.master_addr()).and_then(pid_listening_on)
    }

    /// Every member of the group (a replicated topic costs CPU on each);
    /// a member that is not alive and has no process is left out, one that
    /// is alive but not found here makes the set unknown (empty).
    fn server_pids(&self) -> Vec<u32> {
        if self.embedded {
            return vec![std::process::id()];
        }
        let Ok(members) = self.driver.members() else {
            return self.server_pid().into_iter().collect();
        };
        let mut pids = Vec::new();
        for m in &members {
            let pid = std::iter::once(&m.addr)
                .chain(&m.addrs)
                .find_map(|a| port_of(a).and_then(pid_listening_on));
            match pid {
                Some(p) if !pids.contains(&p) => pids.push(p),
                Some(_) => {}
                None if !m.alive => {}
                None => return Vec::new(),
            }
        }
        pids
    }
}

/// The TCP port of a `HOST:PORT` address (`None` for shm:// and others).
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Bytes in the `.data` files under `dir` (an embedded server's data
/// directory: the stored data parts, compressed or not).
fn data_file_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => data_file_bytes(&e.path()),
            Ok(_) if e.path().extension().is_some_and(|x| x == "data") => {
                e.metadata().map_or(0, |m| m.len())
            }
            _ => 0,
        })
        .sum()
}

/// A push's waker: when the push's future resolves, records the time since
/// the push (its acknowledgement latency), on the thread that resolved it.
struct AckClock {
    pushed: Instant,
    lats: Arc<Mutex<Vec<u64>>>,
}

impl AckClock {
    fn record(&self) {
        let us = self.pushed.elapsed().as_micros() as u64;
        if let Ok(mut l) = self.lats.lock() {
            l.push(us);
        }
    }
}

impl Wake for AckClock {
    fn wake(self: Arc<Self>) {
        self.record();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.record();
    }
}

struct StromProducer {
    producer: Producer,
    job: ProduceJob,
    meta: Bytes,
    data: Bytes,
    pacer: Pacer,
}

impl Worker for StromProducer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let parts = &self.job.partitions;
        let mut stamped = self.meta.to_vec();
        let lats = Arc::new(Mutex::new(Vec::with_capacity(if self.job.ack_latency {
            self.job.events as usize
        } else {
            0
        })));
        for i in 0..self.job.events {
            self.pacer.wait(i);
            let meta = if self.job.stamp && i >= self.job.warmup {
                stamp(&mut stamped, now_us());
                Bytes::copy_from_slice(&stamped)
            } else {
                self.meta.clone()
            };
            let p = parts[(i % parts.len() as u64) as usize];
            let pushed = Instant::now();
            let fut = self
                .producer
                .push_with(meta, self.data.clone(), Some(p), &[])?;
            if self.job.ack_latency {
                let clock = Arc::new(AckClock {
                    pushed,
                    lats: lats.clone(),
                });
                // Registers the clock with the push's batch; resolved
                // already means acknowledged during the push itself.
                if fut
                    .poll_ref(&mut Context::from_waker(&Waker::from(clock.clone())))
                    .is_ready()
                {
                    clock.record();
                }
            }
            if i % 1024 == 1023 {
                progress.fetch_add(1024, Ordering::Relaxed);
            }
        }
        self.producer.flush()?;
        progress.fetch_add(self.job.events % 1024, Ordering::Relaxed);
        // flush() returned, so every push is resolved; a resolving thread
        // may still be running the last clocks (wakers run after waiters).
        let want = if self.job.ack_latency {
            self.job.events
        } else {
            0
        };
        let until = Instant::now() + Duration::from_secs(1);
        let lats_us = loop {
            let mut l = lats
                .lock()
                .map_err(|_| anyhow::anyhow!("ack latency lock poisoned"))?;
            if l.len() as u64 >= want || Instant::now() > until {
                break std::mem::take(&mut *l);
            }
            drop(l);
            std::thread::sleep(Duration::from_millis(1));
        };
        Ok(Outcome {
            events: self.job.events,
            lats_us,
            ..Default::default()
        })
    }
}

struct StromConsumer {
    consumer: strom_client::Consumer,
    job: ConsumeJob,
}

impl Worker for StromConsumer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let mut tally = Tally::new(&self.job);
        while tally.remaining() > 0 {
            let ev = match self.consumer.pull_timeout(Duration::from_millis(500)) {
                Ok(Next::Event(ev)) => ev,
                Ok(Next::EndOfStream) => anyhow::bail!(
                    "end of stream with {} events still expected on partitions {:?}",
                    tally.remaining(),
                    self.job.partitions
                ),
                Err(e) if e.code() == ErrorCode::TIMEOUT => continue,
                Err(e) => return Err(e.into()),
            };
            let meta = ev.meta();
            let Some(slot) = self
                .job
                .partitions
                .iter()
                .position(|&p| p == meta.partition)
            else {
                continue;
            };
            let bytes = meta.raw().len() as u64 + ev.fetched_len();
            tally.record(slot, meta.raw(), bytes, progress);
        }
        Ok(tally.finish())
    }
}
