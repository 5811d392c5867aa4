//! `strom gen --topic T --devices N --rate R`: a rate-controlled telemetry
//! generator (see docs/ingest.md). K worker threads, each with its own
//! producer and its own devices, share the target rate; the main thread
//! reports once a second (a line on stderr, or a JSON object per line on
//! stdout with `--json`), applies `--ramp`, and stops everything at
//! `--duration` or on SIGINT / SIGTERM. Then every worker flushes, waits
//! for its futures and closes its producer, so once every producer of the
//! topic closed, consumers see the end of the stream; a summary follows.
//!
//! Exit status: 0 when every event was stored (also after Ctrl-C, the
//! usual way to end an open-ended run), 1 if some failed.

mod control;
mod pacer;
pub mod telemetry;
mod worker;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;
use strom_client::ProducerOptions;

use crate::interrupt;
use pacer::{check_rate, parse_ramp, Ramp};
use telemetry::SchemaArgs;

/// Most devices one generator simulates (8 bytes of state each).
const MAX_DEVICES: u64 = 10_000_000;
/// Most worker threads.
const MAX_WORKERS: u64 = 256;
/// How often the main loop looks at signals, the ramp and the clock.
const POLL: Duration = Duration::from_millis(20);
/// Report interval.
const REPORT: Duration = Duration::from_secs(1);

#[derive(Args)]
pub struct GenArgs {
    /// The topic to write to (it must exist).
    #[arg(long)]
    topic: String,
    /// Devices simulated; device i is PREFIX followed by i on 6+ digits.
    #[arg(long, default_value_t = 1000)]
    devices: u64,
    /// Device id prefix; give generators running side by side different
    /// prefixes so their devices are disjoint.
    #[arg(long, default_value = "dev-")]
    device_prefix: String,
    /// Target rate in events per second, all workers together.
    #[arg(long, value_parser = parse_rate_arg, conflicts_with = "ramp")]
    rate: Option<f64>,
    /// start:end:step:every_s: the target starts at `start` and moves by
    /// `step` toward `end` every `every_s` seconds.
    #[arg(long, value_parser = parse_ramp)]
    ramp: Option<Ramp>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<f64>,
    /// Worker threads, each with its own producer; devices are split
    /// between them.
    #[arg(long, default_value_t = 1)]
    workers: u64,
    /// Report as JSON lines on stdout instead of text on stderr.
    #[arg(long)]
    json: bool,
    /// Idempotent producers (`true`/`false`; default: on for replicated
    /// topics): pushes ride through partition moves without failing, also
    /// on a topic without replication whose partitions move.
    #[arg(long)]
    idempotent: Option<bool>,
    /// Serve the HTTP control endpoint on HOST:PORT (port 0 picks one;
    /// the address is printed on stderr). Without --rate or --ramp the
    /// generator starts stopped with a target of 0.
    #[arg(long, value_name = "HOST:PORT")]
    control_listen: Option<String>,
    /// Start stopped; `POST /start` on the control endpoint starts it.
    #[arg(long, requires = "control_listen")]
    paused: bool,
    #[command(flatten)]
    schema: SchemaArgs,
}

fn parse_rate_arg(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of events per second"))?;
    check_rate(r)
}

/// State shared by the workers, the reporter and the control endpoint.
pub struct Shared {
    /// Target rate (f64 bits), events/s for all workers together.
    target: AtomicU64,
    /// Rate achieved over the last report interval (f64 bits).
    achieved: AtomicU64,
    pub running: AtomicBool,
    pub quit: AtomicBool,
    /// The rate was set over HTTP: the ramp no longer applies.
    pub manual: AtomicBool,
    pub sent: AtomicU64,
    pub acked: AtomicU64,
    pub errors: AtomicU64,
}

impl Shared {
    fn new(target: f64, running: bool) -> Shared {
        Shared {
            target: AtomicU64::new(target.to_bits()),
            achieved: AtomicU64::new(0f64.to_bits()),
            running: AtomicBool::new(running),
            quit: AtomicBool::new(false),
            manual: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    pub fn target(&self) -> f64 {
        f64::from_bits(self.target.load(Ordering::Acquire))
    }

    pub fn set_target(&self, r: f64) {
        self.target.store(r.to_bits(), Ordering::Release);
    }

    pub fn achieved(&self) -> f64 {
        f64::from_bits(self.achieved.load(Ordering::Acquire))
    }
}

/// Checks the arguments; returns the duration.
fn validate(a: &GenArgs) -> anyhow::Result<Option<Duration>> {
    anyhow::ensure!(
        (1..=MAX_DEVICES).contains(&a.devices),
        "--devices must be 1 to {MAX_DEVICES}"
    );
    anyhow::ensure!(
        (1..=MAX_WORKERS).contains(&a.workers),
        "--workers must be 1 to {MAX_WORKERS}"
    );
    anyhow::ensure!(
        a.workers <= a.devices,
        "--workers ({}) must not exceed --devices ({}): each worker owns devices",
        a.workers,
        a.devices
    );
    anyhow::ensure!(
        a.device_prefix.len() <= 64
            && a.device_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c)),
        "--device-prefix takes up to 64 letters, digits or -_.:/"
    );
    anyhow::ensure!(
        a.rate.is_some() || a.ramp.is_some() || a.control_listen.is_some(),
        "give --rate or --ramp (or --control-listen to set the rate over HTTP)"
    );
    a.duration
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| anyhow::anyhow!("--duration takes a positive number of seconds"))
        })
        .transpose()
}

pub fn run(a: GenArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let duration = validate(&a)?;
    let initial = a.rate.or(a.ramp.map(|r| r.at(0.0))).unwrap_or(0.0);
    let shared = Arc::new(Shared::new(initial, !a.paused && initial > 0.0));
    let d = crate::connect(group_file)?;
    let topic = d
        .open_topic(&a.topic)
        .with_context(|| format!("opening topic '{}'", a.topic))?;
    let partitions = topic.partitions();
    anyhow::ensure!(partitions > 0, "topic '{}' has no partitions", a.topic);
    // Bound first: a bad address fails before anything is produced.
    if let Some(addr) = &a.control_listen {
        control::spawn(addr, shared.clone())?;
    }
    interrupt::install()?;
    let producers = open_producers(&topic, a.workers, a.idempotent)?;
    let handles = spawn_workers(&a, partitions, producers, &shared)?;
    let mut report = Reporter::new(a.json);
    // Whatever ends the loop (a failed report write too), the workers
    // close their producers before this returns.
    let outcome = main_loop(&a, duration, &shared, &mut report);
    report.freeze(&shared);
    shared.quit.store(true, Ordering::Release);
    let close_error = join_workers(handles);
    let stopped_by = outcome?;
    report.summary(&shared, stopped_by)?;
    if let Some(e) = close_error {
        return Err(e.context("closing a producer"));
    }
    if shared.errors.load(Ordering::Relaxed) > 0 {
        return Err(crate::Exit(1).into());
    }
    Ok(())
}

/// One producer per worker; closes those opened if one fails.
fn open_producers(
    topic: &strom_client::Topic,
    workers: u64,
    idempotent: Option<bool>,
) -> anyhow::Result<Vec<strom_client::Producer>> {
    let mut producers = Vec::new();
    let opts = ProducerOptions {
        idempotent,
        ..ProducerOptions::default()
    };
    for _ in 0..workers {
        match topic.producer_with(opts.clone()) {
            Ok(p) => producers.push(p),
            Err(e) => {
                for p in &producers {
                    let _ = p.close();
                }
                return Err(anyhow::Error::new(e).context("opening a producer"));
            }
        }
    }
    Ok(producers)
}

type WorkerHandle = std::thread::JoinHandle<anyhow::Result<()>>;

/// Waits for every worker; returns the first failure.
fn join_workers(handles: Vec<WorkerHandle>) -> Option<anyhow::Error> {
    let mut first = None;
    for h in handles {
        let e = match h.join() {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => anyhow::anyhow!("a worker thread panicked"),
        };
        first.get_or_insert(e);
    }
    first
}

/// Starts one worker thread per producer.
fn spawn_workers(
    a: &GenArgs,
    partitions: u32,
    producers: Vec<strom_client::Producer>,
    shared: &Arc<Shared>,
) -> anyhow::Result<Vec<WorkerHandle>> {
    let mut handles = Vec::new();
    for (index, producer) in (0..).zip(producers) {
        let w = worker::Worker {
            index,
            workers: a.workers,
            devices: a.devices,
            partitions,
            prefix: a.device_prefix.clone(),
            schema: a.schema.clone(),
            producer,
            shared: shared.clone(),
        };
        let h = std::thread::Builder::new()
            .name(format!("gen-{index}"))
            .spawn(move || w.run());
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                shared.quit.store(true, Ordering::Release);
                for h in handles {
                    let _ = h.join();
                }
                return Err(anyhow::Error::new(e).context("starting a worker thread"));
            }
        }
    }
    Ok(handles)
}

/// Reports once a second, applies the ramp, and returns why the run
/// stopped ("duration" or the signal's name).
fn main_loop(
    a: &GenArgs,
    duration: Option<Duration>,
    shared: &Shared,
    report: &mut Reporter,
) -> anyhow::Result<&'static str> {
    let start = Instant::now();
    loop {
        std::thread::sleep(POLL);
        if let Some(sig) = interrupt::received() {
            return Ok(interrupt::name(sig));
        }
        let t = start.elapsed();
        if let Some(r) = &a.ramp {
            if !shared.manual.load(Ordering::Acquire) {
                shared.set_target(r.at(t.as_secs_f64()));
            }
        }
        report.tick(shared)?;
        if duration.is_some_and(|d| t >= d) {
            return Ok("duration");
        }
    }
}

/// Once-a-second progress and the final summary.
struct Reporter {
    json: bool,
    start: Instant,
    last: Instant,
    last_sent: u64,
    /// Seconds spent running (not paused), for the mean rate.
    active: f64,
}

impl Reporter {
    fn new(json: bool) -> Reporter {
        let now = Instant::now();
        Reporter {
            json,
            start: now,
            last: now,
            last_sent: 0,
            active: 0.0,
        }
    }

    fn tick(&mut self, s: &Shared) -> anyhow::Result<()> {
        let dt = self.last.elapsed();
        if dt < REPORT {
            return Ok(());
        }
        self.last = Instant::now();
        let sent = s.sent.load(Ordering::Relaxed);
        let rate = (sent - self.last_sent) as f64 / dt.as_secs_f64();
        self.last_sent = sent;
        s.achieved.store(rate.to_bits(), Ordering::Release);
        let running = s.running.load(Ordering::Acquire);
        if running {
            self.active += dt.as_secs_f64();
        }
        let errors = s.errors.load(Ordering::Relaxed);
        let elapsed = self.start.elapsed().as_secs_f64();
        if self.json {
            let line = json!({
                "type": "progress",
                "elapsed": round3(elapsed),
                "state": if running { "running" } else { "stopped" },
                "sent": sent,
                "acked": s.acked.load(Ordering::Relaxed),
                "errors": errors,
                "target_rate": s.target(),
                "rate": round3(rate),
            });
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")?;
            out.flush()?;
        } else {
            eprintln!(
                "gen: {elapsed:7.1}s sent {sent} errors {errors} target {:.0}/s achieved {rate:.0}/s{}",
                s.target(),
                if running { "" } else { " (stopped)" }
            );
        }
        Ok(())
    }

    /// Sending stops: the partial last interval counts as running time.
    fn freeze(&mut self, s: &Shared) {
        if s.running.load(Ordering::Acquire) {
            self.active += self.last.elapsed().as_secs_f64();
        }
        self.last = Instant::now();
    }

    fn summary(&mut self, s: &Shared, stopped_by: &str) -> anyhow::Result<()> {
        let sent = s.sent.load(Ordering::Relaxed);
        let mean = if self.active > 0.0 {
            sent as f64 / self.active
        } else {
            0.0
        };
        let elapsed = (self.last - self.start).as_secs_f64();
        let (acked, errors) = (
            s.acked.load(Ordering::Relaxed),
            s.errors.load(Ordering::Relaxed),
        );
        if self.json {
            let line = json!({
                "type": "summary",
                "stopped_by": stopped_by,
                "sent": sent,
                "acked": acked,
                "errors": errors,
                "elapsed": round3(elapsed),
                "active": round3(self.active),
                "mean_rate": round3(mean),
            });
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}")?;
            out.flush()?;
        } else {
            eprintln!(
                "gen: done ({stopped_by}): sent {sent}, acked {acked}, errors {errors}, \
                 elapsed {elapsed:.2}s, mean rate {mean:.0}/s over {:.2}s running",
                self.active
            );
        }
        Ok(())
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
