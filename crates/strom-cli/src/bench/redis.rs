//! The Redis target: Redis Streams, one stream per partition
//! (`TOPIC:P`), one entry per event with a single field whose value is
//! metadata followed by data. Producers pipeline XADDs (a `--batch` count,
//! or in adaptive mode whatever fits in 1 MiB, one at a time when paced);
//! consumers XREAD up to 1024 entries per call across their streams.
//! Durability is whatever the server's AOF settings say.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use redis::Value;
use strom_client::Trigger;

use super::sys::pid_listening_on;
use super::workload::{now_us, stamp, Pacer, Tally};
use super::{Config, ConsumeJob, Outcome, ProduceJob, Target, Worker};

const READ_COUNT: usize = 1024;
const ADAPTIVE_BYTES: usize = 1 << 20;

pub struct RedisTarget {
    addr: String,
    client: redis::Client,
}

impl RedisTarget {
    pub fn new(addr: &str) -> anyhow::Result<RedisTarget> {
        if addr.is_empty() {
            anyhow::bail!("--target redis://HOST:PORT needs the server's address");
        }
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        Ok(RedisTarget {
            addr: addr.into(),
            client,
        })
    }

    fn conn(&self) -> anyhow::Result<redis::Connection> {
        self.client
            .get_connection()
            .with_context(|| format!("cannot connect to Redis at {}", self.addr))
    }
}

fn key(topic: &str, p: u32) -> String {
    format!("{topic}:{p}")
}

impl Target for RedisTarget {
    fn prepare(&mut self, _cfg: &Config) -> anyhow::Result<()> {
        redis::cmd("PING").exec(&mut self.conn()?)?;
        Ok(())
    }

    fn stored(&self, cfg: &Config) -> anyhow::Result<Vec<u64>> {
        let mut c = self.conn()?;
        (0..cfg.args.partitions)
            .map(|p| {
                Ok(redis::cmd("XLEN")
                    .arg(key(&cfg.topic, p))
                    .query::<u64>(&mut c)?)
            })
            .collect()
    }

    fn producer(&self, cfg: &Config, job: &ProduceJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        let value = cfg.payload.joined();
        let pacer = Pacer::new(cfg.interval());
        let depth = match cfg.batch {
            _ if pacer.is_paced() => 1,
            _ if cfg.batch.trigger == Trigger::Adaptive => {
                (ADAPTIVE_BYTES / value.len()).clamp(1, READ_COUNT)
            }
            b => match (b.trigger, b.bytes) {
                (Trigger::Count(n), _) => n as usize,
                (_, Some(bytes)) => (bytes as usize / value.len()).max(1),
                _ => (ADAPTIVE_BYTES / value.len()).clamp(1, READ_COUNT),
            },
        };
        Ok(Box::new(RedisProducer {
            conn: self.conn()?,
            keys: job.partitions.iter().map(|&p| key(&cfg.topic, p)).collect(),
            job: job.clone(),
            value,
            depth,
            pacer,
        }))
    }

    fn consumer(&self, cfg: &Config, job: &ConsumeJob) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(Box::new(RedisConsumer {
            conn: self.conn()?,
            keys: job.partitions.iter().map(|&p| key(&cfg.topic, p)).collect(),
            last: vec!["0-0".to_string(); job.partitions.len()],
            job: job.clone(),
        }))
    }

    fn child_target(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn server_pid(&self) -> Option<u32> {
        pid_listening_on(self.addr.rsplit(':').next()?.parse().ok()?)
    }
}

struct RedisProducer {
    conn: redis::Connection,
    keys: Vec<String>,
    job: ProduceJob,
    value: Vec<u8>,
    depth: usize,
    pacer: Pacer,
}

impl Worker for RedisProducer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let mut pipe = redis::pipe();
        let mut queued = 0;
        for i in 0..self.job.events {
            self.pacer.wait(i);
            if self.job.stamp && i >= self.job.warmup {
                stamp(&mut self.value, now_us());
            }
            let k = &self.keys[(i % self.keys.len() as u64) as usize];
            pipe.cmd("XADD")
                .arg(k)
                .arg("*")
                .arg("v")
                .arg(&self.value[..])
                .ignore();
            queued += 1;
            if queued == self.depth || i + 1 == self.job.events {
                pipe.exec(&mut self.conn).context("Redis XADD failed")?;
                pipe.clear();
                progress.fetch_add(queued as u64, Ordering::Relaxed);
                queued = 0;
            }
        }
        Ok(Outcome {
            events: self.job.events,
            ..Default::default()
        })
    }
}

struct RedisConsumer {
    conn: redis::Connection,
    keys: Vec<String>,
    last: Vec<String>,
    job: ConsumeJob,
}

pub(super) fn bulk(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

pub(super) fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

impl Worker for RedisConsumer {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome> {
        let mut tally = Tally::new(&self.job);
        while tally.remaining() > 0 {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT").arg(READ_COUNT).arg("BLOCK").arg(500);
            cmd.arg("STREAMS").arg(&self.keys).arg(&self.last);
            let reply: Value = cmd.query(&mut self.conn).context("Redis XREAD failed")?;
            // RESP2: [[key, [[id, [field, value]], ...]], ...]; RESP3: a map.
            let streams: Vec<(&Value, &Value)> = match &reply {
                Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
                other => array(other)
                    .iter()
                    .filter_map(|s| match array(s) {
                        [k, v] => Some((k, v)),
                        _ => None,
                    })
                    .collect(),
            };
            for (k, entries) in streams {
                let Some(slot) =
                    bulk(k).and_then(|k| self.keys.iter().position(|x| x.as_bytes() == k))
                else {
                    continue;
                };
                for e in array(entries) {
                    let [id, fields] = array(e) else { continue };
                    if let Some(id) = bulk(id) {
                        self.last[slot] = String::from_utf8_lossy(id).into_owned();
                    }
                    let value = array(fields).get(1).and_then(bulk).unwrap_or_default();
                    tally.record(slot, value, value.len() as u64, progress);
                }
            }
        }
        Ok(tally.finish())
    }
}
