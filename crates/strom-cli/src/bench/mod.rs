//! `strom bench`: produce, consume and end-to-end benchmarks that print
//! numbers (a human summary, or one JSON object with `--json`), with the
//! same workload against Strom, Kafka (librdkafka) or Redis Streams. Timing
//! is never asserted anywhere; tests only run tiny smoke versions.
//!
//! Layout: [`workload`] defines events and how work is split; each target
//! module implements [`Target`]; [`engine`] runs workers as threads or as
//! child processes (`--procs`) and aggregates; this file parses options and
//! prints results. The `tasks` mode (a task queue on consumer groups) has
//! its own runner in [`tasks`], with [`tasks_strom`] and `tasks_redis`.
//! The `baseline` mode measures the machine itself ([`baseline`]).
//!
//! Every produce, consume, e2e and transport run also reports the CPU
//! seconds it cost per GB moved, client plus server ([`cpu`]).
//!
//! Counts are checked, never assumed: a consume run fails (non-zero exit,
//! one line naming the counts) when fewer events are stored or consumed than
//! were produced, and the JSON carries `produced` and `consumed`.

pub(crate) mod baseline;
mod cpu;
mod drain;
mod engine;
mod failover;
#[cfg(feature = "peers")]
mod kafka;
#[cfg(feature = "peers")]
mod redis;
mod strom;
mod sys;
mod tasks;
#[cfg(feature = "peers")]
mod tasks_redis;
mod tasks_strom;
mod transform;
mod transport;
mod workload;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use clap::{Args, ValueEnum};
use strom_client::{Acks, Batching, Durability, PartitionType};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Mode {
    Produce,
    Consume,
    E2e,
    /// A task queue: Strom shared group vs Redis Streams consumer group.
    Tasks,
    /// A machine baseline, no target: `strom bench baseline memcpy`.
    Baseline,
    /// Produce and consume over each `--transport`, beside memcpy.
    Transport,
    /// SIGKILL a partition leader of a `strom cluster up` group under an
    /// acks=all producer; time until that partition acknowledges again.
    Failover,
    /// Drain a member of a running group under a producer; how long it
    /// takes and the producer's pause and throughput.
    Drain,
    /// In-transit transforms (copy, filter, zstd) carrying a topic, beside
    /// a plain consumer reading it.
    Transform,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::E2e => "e2e",
            Mode::Tasks => "tasks",
            Mode::Baseline => "baseline",
            Mode::Transport => "transport",
            Mode::Failover => "failover",
            Mode::Drain => "drain",
            Mode::Transform => "transform",
        }
    }
}

#[derive(Args, Clone)]
pub struct BenchArgs {
    #[arg(value_enum)]
    mode: Mode,
    /// baseline: what to measure (`memcpy`).
    baseline: Option<String>,
    /// baseline memcpy: bytes per copy (8MiB, 64KiB, 1GiB, or a number).
    #[arg(long, default_value = "8MiB")]
    size: String,
    /// Strom memory partitions: their size bound (retention_bytes) for this
    /// run's topic. Default: enough for every event of the run (warm-up
    /// included) plus a quarter and 64 MiB of headroom. The topic drops its
    /// oldest batches past the bound, and a consume run then fails loudly.
    #[arg(long)]
    retention_bytes: Option<u64>,
    /// strom://GROUP_FILE, strom://HOST:PORT, kafka://HOST:PORT or
    /// redis://HOST:PORT; omit for the group of --group-file / --address
    /// (or STROM_GROUP_FILE / STROM_ADDRESS), or, without either, an
    /// embedded Strom server in a temp dir.
    #[arg(long)]
    target: Option<String>,
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Bytes of metadata per event (at least 35).
    #[arg(long, default_value_t = 100)]
    metadata_size: usize,
    /// Bytes of data per event (0 = metadata only).
    #[arg(long, default_value_t = 0)]
    data_size: usize,
    /// What each data part holds: constant (one repeated byte), array (a
    /// compressible f32 field, like a simulation's output) or random
    /// (incompressible).
    #[arg(long, value_enum, default_value = "constant")]
    payload: workload::PayloadKind,
    /// Compression of the topic the bench creates (Strom only): none |
    /// zstd | zstd:<level> | lz4 | lz4:<level> (docs/compression.md).
    #[arg(long, default_value = "none")]
    compression: String,
    /// Events per batch, or "adaptive" (send whatever is ready).
    #[arg(long, default_value = "adaptive")]
    batch: String,
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Producer workers; each writes round-robin over its own partitions.
    #[arg(long, default_value_t = 1)]
    producers: u32,
    /// Consumer workers (at most one per partition).
    #[arg(long, default_value_t = 1)]
    consumers: u32,
    /// Run producers and consumers as child processes instead of threads.
    #[arg(long)]
    procs: bool,
    /// memory | file (Strom only).
    #[arg(long, default_value = "file")]
    partition_type: String,
    /// always | never | interval:<ms> (Kafka: flush.messages=1 / flush.ms;
    /// Redis: set by the server's AOF configuration).
    #[arg(long, default_value = "never")]
    durability: String,
    /// Replication factor of the topic the bench creates (Strom only; needs
    /// that many members, e.g. `strom cluster up --servers 3`).
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
    /// all | leader: when a push to a replicated partition is acknowledged
    /// (Strom producers only; `ProducerOptions::acks`).
    #[arg(long, default_value = "all")]
    acks: String,
    /// true | false: idempotent producers (Strom only;
    /// `ProducerOptions::idempotent`; default: on for replicated topics).
    #[arg(long)]
    idempotent: Option<bool>,
    /// Fraction of each data part a consumer fetches (Strom only).
    #[arg(long, default_value_t = 1.0)]
    selectivity: f64,
    /// Events produced (and, in e2e, delivered) before measuring.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Strom consumers: how long a waiting pull spins before it sleeps, in
    /// microseconds (default: the client's default, `ConsumerOptions::spin`).
    #[arg(long, value_name = "US")]
    spin_us: Option<u64>,
    /// Strom consumers: leave all reading to the client's runtime threads
    /// instead of letting a waiting pull read its connection itself
    /// (`ConsumerOptions::read_on_pull`), to compare the two.
    #[arg(long)]
    no_read_on_pull: bool,
    /// e2e: events per second offered in total; tasks: tasks per second
    /// dispatched (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Topic (Kafka topic, Redis stream prefix) to use; consume mode reads
    /// what a produce run left in it.
    #[arg(long)]
    topic: Option<String>,
    /// tasks: tasks the dispatcher pushes.
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// tasks: worker threads in the consumer group (--batch is the most
    /// tasks a worker takes at once; "adaptive" means 64).
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// tasks: consumer group mode: `shared` (one task partition, any worker
    /// takes any task; Strom and Redis) or `partitioned` (one partition per
    /// worker, each worker reads its own; Strom only).
    #[arg(long, default_value = "shared")]
    group: String,
    /// tasks: bytes of payload per task (the data part; a field in Redis).
    #[arg(long, default_value_t = 0)]
    task_bytes: usize,
    /// tasks: busy time per task in a worker, in microseconds.
    #[arg(long, default_value_t = 0)]
    work_us: u64,
    /// tasks: systems to run, in order, comma-separated (strom, redis).
    #[arg(long, default_value = DEFAULT_PEERS)]
    peers: String,
    /// tasks: a running Redis server; default: start a private
    /// `redis-server` (no persistence) on a free loopback port.
    #[arg(long)]
    redis_address: Option<String>,
    /// transport: the transports to compare, comma-separated (tcp, shm,
    /// shm-socket = shm with data parts through the socket).
    /// ofi+tcp and ofi+shm are libfabric's tcp;ofi_rxm and shm providers.
    #[arg(long, default_value = "tcp,shm,shm-socket,ofi+tcp,ofi+shm")]
    transport: String,
    /// transport: rounds per transport (a fresh server each); the median
    /// is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print one JSON object instead of a human summary.
    #[arg(long)]
    json: bool,
    /// Internal: run one worker of a `--procs` run (JSON job description).
    #[arg(long, hide = true)]
    worker_job: Option<String>,
}

/// Validated options shared by every target and worker.
pub struct Config {
    pub args: BenchArgs,
    pub payload: workload::Payload,
    pub batch: Batching,
    pub partition_type: PartitionType,
    pub durability: Durability,
    pub acks: Acks,
    pub topic: String,
}

impl Config {
    fn new(args: BenchArgs) -> anyhow::Result<Config> {
        let batch = match args.batch.as_str() {
            "adaptive" => Batching::adaptive(),
            n => Batching::count(
                n.parse()
                    .ok()
                    .filter(|&c| c > 0)
                    .ok_or_else(|| anyhow::anyhow!("--batch takes a count > 0 or 'adaptive'"))?,
            ),
        };
        if args.partitions == 0 || args.producers == 0 || args.consumers == 0 {
            anyhow::bail!("--partitions, --producers and --consumers must be at least 1");
        }
        if args.retention_bytes.is_some() && args.partition_type != "memory" {
            anyhow::bail!(
                "--retention-bytes sizes memory partitions only (--partition-type memory)"
            );
        }
        if args.replication_factor == 0 {
            anyhow::bail!("--replication-factor must be at least 1");
        }
        let acks = match args.acks.as_str() {
            "all" => Acks::All,
            "leader" => Acks::Leader,
            a => anyhow::bail!("--acks takes all or leader, not '{a}'"),
        };
        if !(0.0..=1.0).contains(&args.selectivity) {
            anyhow::bail!("--selectivity is a fraction between 0 and 1");
        }
        let topic = args
            .topic
            .clone()
            .unwrap_or_else(|| format!("bench-{}-{}", std::process::id(), workload::now_us()));
        Ok(Config {
            payload: workload::Payload::new(args.metadata_size, args.data_size, args.payload)?,
            batch,
            partition_type: PartitionType::parse(&args.partition_type)
                .map_err(anyhow::Error::msg)?,
            durability: Durability::parse(&args.durability).map_err(anyhow::Error::msg)?,
            acks,
            topic,
            args,
        })
    }

    /// Consumers actually used: at most one per partition.
    pub fn consumers(&self) -> u32 {
        self.args.consumers.min(self.args.partitions)
    }

    /// Bytes of one event (metadata + data).
    pub fn event_bytes(&self) -> u64 {
        (self.payload.meta.len() + self.payload.data.len()) as u64
    }

    /// The retention_bytes a memory topic of this run gets: `--retention-bytes`,
    /// or every event of the run (warm-up included) plus 25 % and 64 MiB.
    pub fn memory_retention(&self) -> u64 {
        self.args.retention_bytes.unwrap_or_else(|| {
            let all = (self.args.events + self.args.warmup).saturating_mul(self.event_bytes());
            all.saturating_add(all / 4).saturating_add(64 << 20)
        })
    }

    /// Bytes of data a consumer selects from each event.
    pub fn selected_len(&self) -> u64 {
        (self.args.data_size as f64 * self.args.selectivity) as u64
    }

    /// Pause between a producer's events to reach `--rate` in total.
    pub fn interval(&self) -> Option<Duration> {
        (self.args.rate > 0)
            .then(|| Duration::from_secs_f64(self.args.producers as f64 / self.args.rate as f64))
    }
}

/// What one producer worker does.
#[derive(Clone, Debug)]
pub struct ProduceJob {
    pub partitions: Vec<u32>,
    /// Events to push, round-robin over `partitions`.
    pub events: u64,
    /// How many of the first `events` are warm-up (never stamped, never timed).
    pub warmup: u64,
    /// Write the send time into each event after the warm-up (e2e).
    pub stamp: bool,
    /// Record each push's acknowledgement latency (produce).
    pub ack_latency: bool,
}

/// What one consumer worker does: read `expect[i]` events of `partitions[i]`
/// from the beginning.
#[derive(Clone, Debug)]
pub struct ConsumeJob {
    pub partitions: Vec<u32>,
    pub expect: Vec<u64>,
    /// Consumer (group) name.
    pub name: String,
    /// Record push-to-delivery latency of stamped events (e2e).
    pub latency: bool,
}

/// What a worker did. A consumer counts only stamped (timed) events in
/// e2e mode, and every event otherwise. `lats_us`: push-to-delivery
/// latencies of a consumer (e2e), push-to-acknowledgement of a producer
/// (produce).
#[derive(Default, Debug)]
pub struct Outcome {
    pub events: u64,
    pub bytes: u64,
    pub lats_us: Vec<u64>,
}

/// A worker, opened (connected, subscribed) and ready to run.
pub trait Worker: Send {
    fn run(&mut self, progress: &AtomicU64) -> anyhow::Result<Outcome>;
}

/// A system under test. Opening a worker does all setup, so that timing
/// starts when every worker is ready.
pub trait Target: Send + Sync {
    /// Creates the topic if needed (not in child workers).
    fn prepare(&mut self, cfg: &Config) -> anyhow::Result<()>;
    /// Events stored per partition now.
    fn stored(&self, cfg: &Config) -> anyhow::Result<Vec<u64>>;
    fn producer(&self, cfg: &Config, job: &ProduceJob) -> anyhow::Result<Box<dyn Worker + '_>>;
    fn consumer(&self, cfg: &Config, job: &ConsumeJob) -> anyhow::Result<Box<dyn Worker + '_>>;
    /// How child processes reach the same system (`--target` value).
    fn child_target(&self) -> String;
    /// The local server process, for its memory, if there is one.
    fn server_pid(&self) -> Option<u32>;
    /// Every local process serving the run, for their CPU (a group's
    /// members); empty when any of them cannot be found.
    fn server_pids(&self) -> Vec<u32> {
        self.server_pid().into_iter().collect()
    }
    /// A bounded (memory) topic's size bound and overflow policy, for the
    /// report and for the error when retention lost events.
    fn retention(&self, _cfg: &Config) -> anyhow::Result<Option<(u64, &'static str)>> {
        Ok(None)
    }
    /// Bytes of data the target's files hold, when it can tell (an
    /// embedded Strom server's `.data` files).
    fn stored_data_bytes(&self) -> Option<u64> {
        None
    }
}

#[cfg(feature = "peers")]
const DEFAULT_PEERS: &str = "strom,redis";
#[cfg(not(feature = "peers"))]
const DEFAULT_PEERS: &str = "strom";

#[cfg(not(feature = "peers"))]
const PEERS_HINT: &str = "this strom binary was built without the `peers` feature; rebuild with \
     `cargo build --release -p strom-cli --features peers` (needs cmake and libcurl4-openssl-dev)";

fn open_target(spec: Option<&str>, group_file: Option<PathBuf>) -> anyhow::Result<Box<dyn Target>> {
    let spec = match spec {
        Some(s) => s,
        // A group named by --group-file / --address (or their variables).
        None if group_file.is_some() || crate::has_address() => "strom://",
        None => {
            eprintln!(
                "strom bench: no --target, --group-file or --address given; benchmarking an \
                 embedded server in a temporary directory"
            );
            "embedded"
        }
    };
    if spec == "embedded" {
        return Ok(Box::new(strom::StromTarget::embedded()?));
    }
    if let Some(rest) = spec.strip_prefix("strom://") {
        return Ok(Box::new(strom::StromTarget::connect(rest, group_file)?));
    }
    if let Some(_addr) = spec.strip_prefix("kafka://") {
        #[cfg(feature = "peers")]
        return Ok(Box::new(kafka::KafkaTarget::new(_addr)?));
        #[cfg(not(feature = "peers"))]
        anyhow::bail!("--target kafka://: {PEERS_HINT}");
    }
    if let Some(_addr) = spec.strip_prefix("redis://") {
        #[cfg(feature = "peers")]
        return Ok(Box::new(redis::RedisTarget::new(_addr)?));
        #[cfg(not(feature = "peers"))]
        anyhow::bail!("--target redis://: {PEERS_HINT}");
    }
    anyhow::bail!(
        "unsupported target '{spec}': use strom://GROUP_FILE, strom://HOST:PORT, kafka://HOST:PORT or redis://HOST:PORT"
    )
}

/// `strom bench tasks`: every `--peers` system in turn, one table.
fn run_tasks(args: BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let cfg = Config::new(args)?;
    let opts = tasks::TaskOpts::new(&cfg)?;
    let mode: strom_client::ConsumerGroupMode = cfg
        .args
        .group
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--group: {e}"))?;
    anyhow::ensure!(
        mode != strom_client::ConsumerGroupMode::Kafka,
        "--group: kafka groups are run by Kafka clients; use partitioned or shared"
    );
    let mut peers: Vec<&str> = cfg.args.peers.split(',').map(str::trim).collect();
    if mode == strom_client::ConsumerGroupMode::Partitioned && peers.contains(&"redis") {
        eprintln!(
            "strom bench: Redis Streams has no partitioned consumer groups; running Strom only"
        );
        peers.retain(|p| *p != "redis");
    }
    if let Some(p) = peers.iter().find(|p| !matches!(**p, "strom" | "redis")) {
        anyhow::bail!("unknown peer '{p}' in --peers: use strom and/or redis");
    }
    let mut outcomes = Vec::new();
    for (run, peer) in peers.iter().enumerate() {
        let run = run as u32;
        if *peer == "strom" {
            let target = match cfg.args.target.as_deref() {
                None if group_file.is_some() || crate::has_address() => {
                    strom::StromTarget::connect("", group_file.clone())?
                }
                None | Some("embedded") => strom::StromTarget::embedded()?,
                Some(t) => match t.strip_prefix("strom://") {
                    Some(rest) => strom::StromTarget::connect(rest, group_file.clone())?,
                    None => anyhow::bail!(
                        "tasks: --target names the Strom side (strom://…); Redis comes from \
                         --redis-address"
                    ),
                },
            };
            let q = tasks_strom::StromTasks::new(target.driver(), &cfg, opts.batch, run, mode)?;
            let r = tasks::run(&q, &opts);
            q.cleanup();
            outcomes.push(r?);
        } else {
            #[cfg(feature = "peers")]
            {
                let local = match &cfg.args.redis_address {
                    Some(_) => None,
                    None => Some(tasks_redis::LocalRedis::start()?),
                };
                let addr = cfg
                    .args
                    .redis_address
                    .clone()
                    .or_else(|| local.as_ref().map(|l| l.addr.clone()))
                    .unwrap_or_default();
                if let Some(l) = &local {
                    eprintln!(
                        "strom bench: started redis-server pid {} on {addr}",
                        l.pid()
                    );
                }
                let q = tasks_redis::RedisTasks::new(&addr, &cfg, run)?;
                let r = tasks::run(&q, &opts);
                q.cleanup();
                outcomes.push(r?);
            }
            #[cfg(not(feature = "peers"))]
            anyhow::bail!("--peers redis: {PEERS_HINT}");
        }
    }
    tasks::report(&cfg, &opts, &outcomes);
    Ok(())
}

pub fn run(args: BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    if args.mode == Mode::Tasks && args.worker_job.is_none() {
        return run_tasks(args, group_file);
    }
    if args.mode == Mode::Baseline {
        return match args.baseline.as_deref() {
            Some("memcpy") => baseline::memcpy(&args.size, args.json),
            Some(b) => anyhow::bail!("unknown baseline '{b}': use `strom bench baseline memcpy`"),
            None => anyhow::bail!("`strom bench baseline` needs what to measure: memcpy"),
        };
    }
    if args.mode == Mode::Transport && args.worker_job.is_none() {
        return transport::run(args);
    }
    if args.mode == Mode::Failover {
        return failover::run(args, group_file);
    }
    if args.mode == Mode::Drain {
        return drain::run(args, group_file);
    }
    if args.mode == Mode::Transform {
        return transform::run(args, group_file);
    }
    if let Some(b) = &args.baseline {
        anyhow::bail!("unexpected argument '{b}': only `strom bench baseline` takes one");
    }
    let worker_job = args.worker_job.clone();
    let target_spec = args
        .target
        .clone()
        .or_else(|| (group_file.is_some() || crate::has_address()).then(|| "strom://".to_string()));
    let mut target = open_target(target_spec.as_deref(), group_file)?;
    let cfg = Config::new(args)?;
    if let Some(job) = worker_job {
        return engine::run_child(&cfg, target.as_ref(), &job);
    }
    target.prepare(&cfg)?;
    let rss = target.server_pid().map(sys::RssSampler::start);
    let server = cpu::ServerCpu::of(target.server_pids());
    let result = engine::run(&cfg, target.as_ref(), &server)?;
    let memory = rss.map(|s| (s.pid, s.finish()));
    let retention = target.retention(&cfg)?;
    let stored = target.stored_data_bytes();
    report(
        &cfg,
        target_spec.as_deref(),
        result,
        memory,
        retention,
        stored,
    );
    drop(target);
    Ok(())
}

type Memory = (u32, (u64, Option<u64>));

/// The data of the run's events as pushed (warm-up included) and as
/// stored, when the target can tell, into the report (`out`); the line the
/// human summary prints about it.
fn stored_data(cfg: &Config, stored: Option<u64>, out: &mut serde_json::Value) -> Option<String> {
    let a = &cfg.args;
    out["payload"] = format!("{:?}", a.payload).to_lowercase().into();
    out["compression"] = a.compression.clone().into();
    let stored = stored?;
    let pushed = (a.events + a.warmup).saturating_mul(a.data_size as u64);
    let ratio = pushed as f64 / stored.max(1) as f64;
    out["data_bytes_pushed"] = pushed.into();
    out["data_bytes_stored"] = stored.into();
    out["data_ratio"] = ratio.into();
    Some(format!(
        "data: {pushed} bytes pushed ({} payload), {stored} bytes in the .data files \
         (compression {}): ratio {ratio:.2}",
        out["payload"].as_str().unwrap_or(""),
        a.compression
    ))
}

fn report(
    cfg: &Config,
    target: Option<&str>,
    r: engine::Result,
    memory: Option<Memory>,
    retention: Option<(u64, &'static str)>,
    stored: Option<u64>,
) {
    let a = &cfg.args;
    let mut lats = r.lats_us;
    lats.sort_unstable();
    let eps = r.events as f64 / r.seconds;
    let mbps = r.bytes as f64 / r.seconds / 1e6;
    let mut out = serde_json::json!({
        "target": target.unwrap_or("strom://embedded"),
        "mode": a.mode.name(),
        "events": r.events,
        "produced": r.produced,
        "consumed": r.consumed,
        "stored": r.stored,
        "bytes": r.bytes,
        "seconds": r.seconds,
        "events_per_s": eps,
        "mb_per_s": mbps,
        "metadata_size": a.metadata_size,
        "data_size": a.data_size,
        "partitions": a.partitions,
        "producers": a.producers,
        "consumers": cfg.consumers(),
        "procs": a.procs,
        "partition_type": a.partition_type,
        "durability": a.durability,
        "replication_factor": a.replication_factor,
        "acks": a.acks,
        "idempotent": a.idempotent.unwrap_or(a.replication_factor > 1),
        "batch": a.batch,
        "selectivity": a.selectivity,
        "warmup": a.warmup,
        "rate": a.rate,
        "topic": cfg.topic,
    });
    let data_line = stored_data(cfg, stored, &mut out);
    if let Some((bytes, overflow)) = retention {
        out["memory_retention_bytes"] = bytes.into();
        out["memory_overflow"] = overflow.into();
        out["memory_retention"] = if a.retention_bytes.is_some() {
            "--retention-bytes"
        } else {
            "sized for the run"
        }
        .into();
    }
    // e2e: push to delivery (consumers); produce: push to acknowledgement
    // (the push's future resolving), when the target records it.
    let latency = match a.mode {
        Mode::E2e => Some("push->delivery"),
        Mode::Produce if !lats.is_empty() => Some("push->ack"),
        _ => None,
    };
    if let Some(kind) = latency {
        out["latency"] = kind.into();
        out["p50_us"] = workload::percentile(&lats, 0.5).into();
        out["p99_us"] = workload::percentile(&lats, 0.99).into();
        out["p999_us"] = workload::percentile(&lats, 0.999).into();
        out["max_us"] = lats.last().copied().unwrap_or(0).into();
        out["latency_samples"] = lats.len().into();
    }
    r.cpu.write_json(r.bytes, &mut out);
    if let Some((pid, (max_kib, hwm))) = memory {
        out["server_pid"] = pid.into();
        out["server_rss_max_mb"] = (max_kib as f64 / 1024.0).into();
        if let Some(h) = hwm {
            out["server_rss_hwm_mb"] = (h as f64 / 1024.0).into();
        }
    }
    if a.json {
        println!("{out}");
        return;
    }
    println!(
        "{} {} (replication factor {}, acks {}, durability {}): {} events, {} bytes in {:.3} s = \
         {:.0} events/s, {:.1} MB/s",
        out["target"].as_str().unwrap_or(""),
        a.mode.name(),
        a.replication_factor,
        a.acks,
        a.durability,
        r.events,
        r.bytes,
        r.seconds,
        eps,
        mbps
    );
    println!(
        "produced {}, consumed {}, stored {}{}",
        r.produced,
        r.consumed.map_or("-".to_string(), |c| c.to_string()),
        r.stored.map_or("-".to_string(), |c| c.to_string()),
        retention
            .map(|(b, o)| format!("; memory retention {b} bytes, overflow {o}"))
            .unwrap_or_default()
    );
    if let Some(line) = data_line {
        println!("{line}");
    }
    if let Some(kind) = latency {
        println!(
            "latency {kind}: p50 {} us, p99 {} us, p99.9 {} us, max {} us ({} samples)",
            out["p50_us"], out["p99_us"], out["p999_us"], out["max_us"], out["latency_samples"]
        );
    }
    println!("{}", r.cpu.line(r.bytes));
    if let Some((pid, (max_kib, hwm))) = memory {
        println!(
            "server pid {pid}: RSS max {:.1} MiB during the run{}",
            max_kib as f64 / 1024.0,
            hwm.map(|h| format!(", peak (VmHWM) {:.1} MiB", h as f64 / 1024.0))
                .unwrap_or_default()
        );
    }
}
