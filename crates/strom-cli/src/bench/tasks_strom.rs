//! `strom bench tasks` on Strom: a one-partition tasks topic read by a
//! shared consumer group (`pull_many`, one ack per task, the acks awaited
//! at the end of each batch), or with `--group partitioned` a tasks topic
//! of one partition per worker read by a partitioned group; results pushed
//! by one producer per worker into a one-partition results topic, read
//! back by a plain consumer.

use bytes::Bytes;
use std::time::{Duration, Instant};

use strom_client::{
    AckFuture, ConsumerGroupMode, ConsumerOptions, Driver, ErrorCode, GroupOptions, Producer,
    StartPos, Topic, TopicSpec,
};

use super::tasks::{Collect, Dispatch, Queue, Work, POLL};
use super::workload::now_us;
use super::Config;

pub struct StromTasks<'a> {
    driver: &'a Driver,
    tasks: Topic,
    results: Topic,
    group: String,
    batch: u32,
    payload: Bytes,
    mode: ConsumerGroupMode,
}

impl<'a> StromTasks<'a> {
    /// Creates fresh tasks and results topics for one run.
    pub fn new(
        driver: &'a Driver,
        cfg: &Config,
        batch: usize,
        run: u32,
        mode: ConsumerGroupMode,
    ) -> anyhow::Result<StromTasks<'a>> {
        let base = format!("{}-{run}", cfg.topic);
        let make = |name: String, partitions: u32| -> anyhow::Result<Topic> {
            Ok(driver.create_topic(TopicSpec {
                partition_type: cfg.partition_type,
                durability: cfg.durability,
                ..TopicSpec::new(&name, partitions)
            })?)
        };
        let task_partitions = match mode {
            ConsumerGroupMode::Shared => 1,
            ConsumerGroupMode::Partitioned | ConsumerGroupMode::Kafka => cfg.args.workers.max(1),
        };
        Ok(StromTasks {
            driver,
            tasks: make(format!("{base}-tasks"), task_partitions)?,
            results: make(format!("{base}-results"), 1)?,
            mode,
            group: format!("bench-g-{}", now_us()),
            batch: batch as u32,
            payload: Bytes::from(vec![0xA5u8; cfg.args.task_bytes]),
        })
    }

    /// Deletes the run's group and topics (best effort).
    pub fn cleanup(&self) {
        let _ = self.driver.delete_group(&self.group);
        for t in [&self.tasks, &self.results] {
            if let Err(e) = self.driver.delete_topic(t.name()) {
                if e.code() != ErrorCode::TOPIC_NOT_FOUND {
                    eprintln!("strom bench: could not delete topic {}: {e}", t.name());
                }
            }
        }
    }
}

impl Queue for StromTasks<'_> {
    fn name(&self) -> &'static str {
        "strom"
    }

    fn dispatcher(&self) -> anyhow::Result<Box<dyn Dispatch + '_>> {
        Ok(Box::new(StromDispatch {
            producer: self.tasks.producer()?,
            payload: self.payload.clone(),
            partitions: self.tasks.partitions(),
            next: 0,
        }))
    }

    fn worker(&self, _index: u32) -> anyhow::Result<Box<dyn Work + '_>> {
        let mut opts = GroupOptions {
            mode: self.mode,
            session_timeout: Duration::from_secs(5),
            ..GroupOptions::default()
        };
        opts.consumer.prefetch = self.batch;
        Ok(Box::new(StromWorker {
            consumer: self.tasks.consumer_group(&self.group, opts)?,
            producer: self.results.producer()?,
            acks: Vec::with_capacity(self.batch as usize),
        }))
    }

    fn collector(&self) -> anyhow::Result<Box<dyn Collect + '_>> {
        let consumer = self.results.consumer_with(
            &format!("{}-collector", self.group),
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )?;
        Ok(Box::new(StromCollect { consumer }))
    }

    fn ready(&self) -> anyhow::Result<()> {
        if self.mode != ConsumerGroupMode::Partitioned {
            return Ok(());
        }
        // Every partition assigned: dispatching before that would measure
        // the first rebalance, not the queue.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let g = self.driver.describe_group(&self.group)?;
            if g.partitions.iter().all(|p| p.holder.is_some()) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the partitioned group did not assign every partition within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

struct StromDispatch {
    producer: Producer,
    payload: Bytes,
    /// Task partitions, dealt round-robin.
    partitions: u32,
    next: u32,
}

impl Dispatch for StromDispatch {
    fn push(&mut self, meta: &[u8]) -> anyhow::Result<()> {
        let partition = self.next % self.partitions.max(1);
        self.next = self.next.wrapping_add(1);
        self.producer.push_with(
            Bytes::copy_from_slice(meta),
            self.payload.clone(),
            Some(partition),
            &[],
        )?;
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        Ok(self.producer.flush()?)
    }
}

struct StromWorker {
    consumer: strom_client::Consumer,
    producer: Producer,
    acks: Vec<AckFuture>,
}

impl Work for StromWorker {
    fn step(&mut self, max: usize, process: &dyn Fn(&[u8])) -> anyhow::Result<(usize, u64)> {
        let Some(batch) = self.consumer.pull_many(max, POLL)? else {
            // End of stream: nothing more will come; let the loop poll
            // `done` without spinning.
            std::thread::sleep(POLL);
            return Ok((0, 0));
        };
        let mut again = 0;
        for ev in &batch {
            let meta = ev.meta().raw();
            process(meta);
            again += u64::from(ev.deliveries() > 1);
            self.acks.push(ev.ack());
            self.producer
                .push_with(meta.clone(), Bytes::new(), Some(0), &[])?;
        }
        if !batch.is_empty() {
            self.producer.flush()?;
        }
        for a in self.acks.drain(..) {
            a.wait()?;
        }
        Ok((batch.len(), again))
    }
}

struct StromCollect {
    consumer: strom_client::Consumer,
}

impl Collect for StromCollect {
    fn poll(&mut self, seen: &mut dyn FnMut(&[u8])) -> anyhow::Result<()> {
        match self.consumer.pull_many(1024, POLL)? {
            Some(batch) => {
                for ev in &batch {
                    seen(ev.meta().raw());
                }
            }
            None => anyhow::bail!("the results topic ended"),
        }
        Ok(())
    }
}
