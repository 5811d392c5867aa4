//! `strom bench tasks`: a task-queue benchmark, the same workload against
//! a Strom shared consumer group and a Redis Streams consumer group in one
//! run. A dispatcher pushes `--tasks` small JSON tasks (a task id and the
//! dispatch time, plus an optional `--task-bytes` payload) into a
//! one-partition topic (one stream); `--workers` threads of one consumer
//! group take them `--batch` at a time, busy-wait `--work-us` per task, ack
//! every task on its own and produce a result (the task's metadata) to a
//! results topic (stream); a collector reads the results and records each
//! task's dispatch→result latency. Throughput is tasks over the time from
//! the first dispatch to the last result.
//!
//! Each system implements [`Queue`] (its dispatcher, workers and collector);
//! this module opens them all, releases them together, and reports.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::workload::{now_us, percentile, Pacer};
use super::Config;

/// Worker batch when `--batch` is left at `adaptive`.
pub const DEFAULT_BATCH: usize = 64;
/// How long a worker or the collector blocks for one poll.
pub const POLL: Duration = Duration::from_millis(100);
/// A run fails when no new result arrived for this long.
const STALL: Duration = Duration::from_secs(60);

/// Task metadata: `{"task":"<20 digits>","t":"<20 digits>"}`, fixed width
/// so the id and dispatch time are read back without a JSON parser.
const ID_AT: usize = 9;
const T_AT: usize = 36;
const DIGITS: usize = 20;
const TEMPLATE: &[u8] = b"{\"task\":\"00000000000000000000\",\"t\":\"00000000000000000000\"}";

fn put(buf: &mut [u8], at: usize, mut v: u64) {
    for b in buf[at..at + DIGITS].iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

fn get(buf: &[u8], at: usize) -> Option<u64> {
    buf.get(at..at + DIGITS)?.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit()
            .then(|| acc.wrapping_mul(10).wrapping_add(u64::from(d - b'0')))
    })
}

/// The metadata of task `id` dispatched at `t_us`.
pub fn task_meta(id: u64, t_us: u64) -> Vec<u8> {
    let mut m = TEMPLATE.to_vec();
    put(&mut m, ID_AT, id);
    put(&mut m, T_AT, t_us);
    m
}

/// (task id, dispatch time) of a task's or result's metadata.
pub fn read_task(meta: &[u8]) -> Option<(u64, u64)> {
    if meta.len() != TEMPLATE.len() {
        return None;
    }
    Some((get(meta, ID_AT)?, get(meta, T_AT)?))
}

/// Pushes tasks into the queue.
pub trait Dispatch: Send {
    fn push(&mut self, meta: &[u8]) -> anyhow::Result<()>;
    /// Sends whatever is still buffered.
    fn flush(&mut self) -> anyhow::Result<()>;
}

/// One member of the consumer group.
pub trait Work: Send {
    /// Takes up to `max` tasks (blocking up to [`POLL`] for the first),
    /// calls `process` on each task's metadata, acks each and publishes
    /// its result; returns how many tasks it took and how many of them
    /// were redeliveries (when the system tells).
    fn step(&mut self, max: usize, process: &dyn Fn(&[u8])) -> anyhow::Result<(usize, u64)>;
}

/// Reads results.
pub trait Collect: Send {
    /// Blocks up to [`POLL`]; calls `seen` with each result's metadata.
    fn poll(&mut self, seen: &mut dyn FnMut(&[u8])) -> anyhow::Result<()>;
}

/// A system under test, ready for one run (topics or streams created).
pub trait Queue: Sync {
    fn name(&self) -> &'static str;
    fn dispatcher(&self) -> anyhow::Result<Box<dyn Dispatch + '_>>;
    fn worker(&self, index: u32) -> anyhow::Result<Box<dyn Work + '_>>;
    fn collector(&self) -> anyhow::Result<Box<dyn Collect + '_>>;
    /// Waits until the workers are ready to take tasks (a partitioned
    /// group has assigned every partition); called before dispatching.
    fn ready(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The options of a tasks run.
pub struct TaskOpts {
    pub tasks: u64,
    pub workers: u32,
    pub batch: usize,
    pub work_us: u64,
    pub task_bytes: usize,
    pub interval: Option<Duration>,
}

impl TaskOpts {
    pub fn new(cfg: &Config) -> anyhow::Result<TaskOpts> {
        let a = &cfg.args;
        if a.tasks == 0 || a.workers == 0 {
            anyhow::bail!("--tasks and --workers must be at least 1");
        }
        let batch = match a.batch.as_str() {
            "adaptive" => DEFAULT_BATCH,
            n => n.parse().map_err(|_| anyhow::anyhow!("bad --batch {n}"))?,
        };
        Ok(TaskOpts {
            tasks: a.tasks,
            workers: a.workers,
            batch,
            work_us: a.work_us,
            task_bytes: a.task_bytes,
            interval: (a.rate > 0).then(|| Duration::from_secs_f64(1.0 / a.rate as f64)),
        })
    }
}

/// What one system did in one run.
pub struct Outcome {
    pub system: &'static str,
    /// Distinct tasks whose result arrived.
    pub completed: u64,
    /// Results beyond the first for a task (a redelivered task done twice).
    pub duplicates: u64,
    /// Tasks the workers took, redeliveries included.
    pub taken: u64,
    /// Tasks delivered again (Strom reports this; Redis does not).
    pub redelivered: u64,
    pub seconds: f64,
    pub lats_us: Vec<u64>,
}

impl Outcome {
    pub fn json(&self) -> serde_json::Value {
        let mut lats = self.lats_us.clone();
        lats.sort_unstable();
        serde_json::json!({
            "system": self.system,
            "completed": self.completed,
            "duplicates": self.duplicates,
            "taken": self.taken,
            "redelivered": self.redelivered,
            "seconds": self.seconds,
            "tasks_per_s": self.completed as f64 / self.seconds.max(1e-9),
            "p50_us": percentile(&lats, 0.5),
            "p99_us": percentile(&lats, 0.99),
            "max_us": lats.last().copied().unwrap_or(0),
        })
    }
}

fn busy(us: u64) {
    if us == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_micros(us);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Runs the workload once against `q`.
pub fn run(q: &dyn Queue, o: &TaskOpts) -> anyhow::Result<Outcome> {
    let mut dispatcher = q.dispatcher()?;
    let mut workers = (0..o.workers)
        .map(|i| q.worker(i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut collector = q.collector()?;
    q.ready()?;
    let done = AtomicBool::new(false);
    let (taken, redelivered) = (AtomicU64::new(0), AtomicU64::new(0));
    let barrier = Barrier::new(workers.len() + 2);
    let n = o.tasks;
    let (dispatch_r, worker_rs, collect_r) = std::thread::scope(|s| {
        let (done, barrier, taken, redelivered) = (&done, &barrier, &taken, &redelivered);
        let d = s.spawn(move || {
            barrier.wait();
            let start = Instant::now();
            let pacer = Pacer::new(o.interval);
            let r = (|| -> anyhow::Result<()> {
                for i in 0..n {
                    pacer.wait(i);
                    dispatcher.push(&task_meta(i, now_us()))?;
                }
                dispatcher.flush()
            })();
            if r.is_err() {
                done.store(true, Ordering::Release);
            }
            r.map(|()| start)
        });
        let ws: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                s.spawn(move || {
                    barrier.wait();
                    let r = (|| -> anyhow::Result<()> {
                        while !done.load(Ordering::Acquire) {
                            let (k, again) = w.step(o.batch, &|_| busy(o.work_us))?;
                            taken.fetch_add(k as u64, Ordering::Relaxed);
                            redelivered.fetch_add(again, Ordering::Relaxed);
                        }
                        Ok(())
                    })();
                    if r.is_err() {
                        done.store(true, Ordering::Release);
                    }
                    r
                })
            })
            .collect();
        let c = s.spawn(move || {
            barrier.wait();
            let mut seen = vec![false; n as usize];
            let (mut completed, mut duplicates) = (0u64, 0u64);
            let mut lats = Vec::with_capacity(n as usize);
            let mut last = Instant::now();
            let r = (|| -> anyhow::Result<()> {
                while completed < n && !done.load(Ordering::Acquire) {
                    collector.poll(&mut |meta| {
                        let Some((id, t)) = read_task(meta) else {
                            return;
                        };
                        match seen.get_mut(id as usize) {
                            Some(s) if !*s => {
                                *s = true;
                                completed += 1;
                                lats.push(now_us().saturating_sub(t));
                                last = Instant::now();
                            }
                            Some(_) => duplicates += 1,
                            None => {}
                        }
                    })?;
                    if last.elapsed() > STALL {
                        anyhow::bail!("no result for {STALL:?}: {completed} of {n} tasks done");
                    }
                }
                Ok(())
            })();
            done.store(true, Ordering::Release);
            r.map(|()| (completed, duplicates, lats, last))
        });
        let join = |e| anyhow::anyhow!("a bench tasks thread panicked: {e:?}");
        (
            d.join().map_err(join),
            ws.into_iter()
                .map(|h| h.join().map_err(join))
                .collect::<Vec<_>>(),
            c.join().map_err(join),
        )
    });
    let start = dispatch_r??;
    for w in worker_rs {
        w??;
    }
    let (completed, duplicates, lats_us, last) = collect_r??;
    if completed < n {
        anyhow::bail!("{}: only {completed} of {n} tasks completed", q.name());
    }
    Ok(Outcome {
        system: q.name(),
        completed,
        duplicates,
        taken: taken.into_inner(),
        redelivered: redelivered.into_inner(),
        seconds: last.saturating_duration_since(start).as_secs_f64(),
        lats_us,
    })
}

/// Prints the outcomes as a table, or as one JSON object with `--json`.
pub fn report(cfg: &Config, o: &TaskOpts, outcomes: &[Outcome]) {
    let a = &cfg.args;
    let results: Vec<_> = outcomes.iter().map(Outcome::json).collect();
    if a.json {
        let out = serde_json::json!({
            "mode": "tasks",
            "group": a.group,
            "tasks": o.tasks,
            "workers": o.workers,
            "batch": o.batch,
            "work_us": o.work_us,
            "task_bytes": o.task_bytes,
            "rate": a.rate,
            "partition_type": a.partition_type,
            "results": results,
        });
        println!("{out}");
        return;
    }
    println!(
        "tasks: {} tasks, {} workers, batch {}, work {} us, payload {} B, {} group",
        o.tasks, o.workers, o.batch, o.work_us, o.task_bytes, a.group
    );
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "system", "tasks/s", "seconds", "p50 us", "p99 us", "max us", "done"
    );
    for r in &results {
        println!(
            "{:<8} {:>10.0} {:>10.3} {:>10} {:>10} {:>10} {:>9}",
            r["system"].as_str().unwrap_or(""),
            r["tasks_per_s"].as_f64().unwrap_or(0.0),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["p50_us"].as_u64().unwrap_or(0),
            r["p99_us"].as_u64().unwrap_or(0),
            r["max_us"].as_u64().unwrap_or(0),
            r["completed"].as_u64().unwrap_or(0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_metadata_is_json_and_round_trips() {
        let m = task_meta(12_345, 1_700_000_000_123_456);
        assert_eq!(read_task(&m), Some((12_345, 1_700_000_000_123_456)));
        let v: serde_json::Value = serde_json::from_slice(&m).unwrap();
        assert_eq!(v["task"], "00000000000000012345");
        assert_eq!(read_task(b"{}"), None);
    }
}
