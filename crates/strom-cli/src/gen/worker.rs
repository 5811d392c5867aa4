//! One generator worker: an OS thread with its own producer and its own
//! share of the devices (device `i` belongs to worker `i % K`), so every
//! device's `seq` is pushed in order by one producer. Each device goes to
//! partition `i % partitions`, named explicitly, so its events stay in
//! order in one partition whatever the topic's selector.
//!
//! The worker wakes about every millisecond, asks its [`Pacer`] how many
//! events are due, pushes them, and settles the futures that resolved.
//! At the end it flushes, waits for every future and closes its producer.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use strom_client::{Data, Producer, PushFuture};

use super::pacer::Pacer;
use super::telemetry::{EventWriter, SchemaArgs};
use super::Shared;

/// How often a worker looks at the clock.
const TICK: Duration = Duration::from_millis(1);
/// Seconds of events a worker may owe before the excess is forgiven.
const MAX_DEBT: f64 = 0.1;
/// Events pushed before the worker looks at the control state again.
const MAX_PER_ROUND: u64 = 10_000;
/// Futures held before the oldest is waited for.
const MAX_PENDING: usize = 200_000;

/// What one worker needs; it owns its producer.
pub struct Worker {
    pub index: u64,
    pub workers: u64,
    pub devices: u64,
    pub partitions: u32,
    pub prefix: String,
    pub schema: SchemaArgs,
    pub producer: Producer,
    pub shared: Arc<Shared>,
}

/// Futures not settled yet.
struct Pending {
    futures: VecDeque<PushFuture>,
}

impl Pending {
    fn settle(&mut self, shared: &Shared, all: bool) {
        while let Some(f) = self.futures.pop_front() {
            if !all && !f.is_done() && self.futures.len() < MAX_PENDING {
                self.futures.push_front(f);
                break;
            }
            match f.wait() {
                Ok(_) => shared.acked.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tracing::debug!(error = %e, "event failed");
                    shared.errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }
}

/// The worker's devices and where it is in its round over them.
struct Fleet {
    /// Device numbers this worker owns.
    mine: Vec<u64>,
    /// Next seq of each device in `mine`.
    seqs: Vec<u64>,
    next: usize,
    rng: SmallRng,
    buf: String,
    warned: bool,
}

impl Worker {
    /// Runs until the shared state says quit; returns after the producer
    /// is closed (or failed to close).
    pub fn run(self) -> anyhow::Result<()> {
        let mine: Vec<u64> = (self.index..self.devices)
            .step_by(self.workers as usize)
            .collect();
        let mut fleet = Fleet {
            seqs: vec![0u64; mine.len()],
            mine,
            next: 0,
            rng: rand::make_rng(),
            buf: String::with_capacity(256),
            warned: false,
        };
        let mut pending = Pending {
            futures: VecDeque::new(),
        };
        let clock = Instant::now();
        let now = || clock.elapsed().as_secs_f64();
        let share = |rate: f64| rate / self.workers as f64;
        let mut pacer = Pacer::new(share(self.shared.target()), now(), MAX_DEBT);
        let mut was_running = false;
        while !self.shared.quit.load(Ordering::Acquire) {
            let running = self.shared.running.load(Ordering::Acquire);
            if running && !was_running {
                pacer.restart(now());
            }
            was_running = running;
            if !running || fleet.mine.is_empty() {
                pending.settle(&self.shared, false);
                std::thread::sleep(TICK * 10);
                continue;
            }
            pacer.set_rate(share(self.shared.target()), now());
            let due = pacer.due(now()).min(MAX_PER_ROUND);
            self.send(&mut fleet, &mut pending, due);
            pacer.sent(due);
            pending.settle(&self.shared, false);
            if due < MAX_PER_ROUND {
                std::thread::sleep(TICK);
            }
        }
        // Failures of the flush show up in the futures, counted below.
        let _ = self.producer.flush();
        pending.settle(&self.shared, true);
        self.producer.close()?;
        Ok(())
    }

    /// Pushes `n` events, one per device in turn.
    fn send(&self, fleet: &mut Fleet, pending: &mut Pending, n: u64) {
        let writer = EventWriter {
            schema: &self.schema,
            prefix: &self.prefix,
        };
        let (mut sent, mut failed) = (0, 0);
        for _ in 0..n {
            let i = fleet.next;
            let device = fleet.mine[i];
            writer.write(&mut fleet.rng, device, fleet.seqs[i], &mut fleet.buf);
            let partition = (device % self.partitions as u64) as u32;
            let meta = fleet.buf.clone();
            match self
                .producer
                .push_with(meta, Data::none(), Some(partition), &[])
            {
                Ok(f) => {
                    fleet.seqs[i] += 1;
                    pending.futures.push_back(f);
                    sent += 1;
                }
                Err(e) => {
                    // The seq is not used: each device's sequence stays
                    // contiguous in what the producer accepted.
                    if !fleet.warned {
                        tracing::warn!(worker = self.index, error = %e, "push failed");
                        fleet.warned = true;
                    }
                    failed += 1;
                }
            }
            fleet.next = (i + 1) % fleet.mine.len();
        }
        self.shared.sent.fetch_add(sent, Ordering::Relaxed);
        self.shared.errors.fetch_add(failed, Ordering::Relaxed);
    }
}
