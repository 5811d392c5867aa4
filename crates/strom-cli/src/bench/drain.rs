//! `strom bench drain --target strom://GROUP_FILE`: how long draining a
//! member takes and what a producer sees meanwhile (docs/elasticity.md).
//! On a running group of at least two members it creates a topic with
//! every partition led by the member to drain (the highest id that does
//! not keep the registry), fills it with `--events` events of
//! `--data-size` bytes, then runs one producer pushing windows of 16
//! events and waiting for their acknowledgements (at most `--rate` events
//! per second, if given), starts
//! `strom member drain` of that member, and reports when the member left,
//! the bytes it held, and the producer's throughput before and during the
//! drain with its longest pause between two acknowledgements.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use strom_client::{Driver, Producer, ProducerOptions, TopicSpec};

use super::{BenchArgs, Config};

/// How long the producer runs before the drain starts, and after it ends.
const AROUND: Duration = Duration::from_secs(3);
/// Longest a drain may take.
const GIVE_UP: Duration = Duration::from_secs(3600);

/// One window of pushes: when it was acknowledged, its bytes, whether
/// every push in it succeeded.
struct Window {
    done: Instant,
    bytes: u64,
    ok: bool,
}

pub fn run(args: BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let spec = args.target.clone().unwrap_or_else(|| "strom://".into());
    let rest = spec.strip_prefix("strom://").unwrap_or(&spec).to_string();
    let group = match rest.is_empty() {
        false => PathBuf::from(rest),
        true => group_file.context("drain needs --target strom://GROUP_FILE of a running group")?,
    };
    let cfg = Config::new(args)?;
    let d = Driver::connect(&group)?;
    let member = victim(&d)?;
    let topic = d.create_topic_on(
        TopicSpec {
            partition_type: cfg.partition_type,
            durability: cfg.durability,
            replication_factor: cfg.args.replication_factor,
            ..TopicSpec::new(&cfg.topic, cfg.args.partitions)
        },
        Some(member),
    )?;
    let producer = topic.producer_with(ProducerOptions {
        batch: cfg.batch,
        acks: cfg.acks,
        idempotent: Some(cfg.args.idempotent.unwrap_or(true)),
        ..Default::default()
    })?;
    let fill_start = Instant::now();
    fill(&producer, &cfg)?;
    let fill_s = fill_start.elapsed().as_secs_f64();
    let held = bytes_on(&d, member, &cfg.topic)?;
    let stop = AtomicBool::new(false);
    let log = Mutex::new(Vec::<Window>::new());
    let (started, left) = std::thread::scope(|s| {
        s.spawn(|| produce(&producer, &cfg, &stop, &log));
        let r = drain(&d, member);
        std::thread::sleep(AROUND);
        stop.store(true, Ordering::Release);
        r
    })?;
    let log = log
        .into_inner()
        .map_err(|_| anyhow::anyhow!("log lock poisoned"))?;
    report(&cfg, member, held, fill_s, started, left, &log);
    Ok(())
}

/// The member to drain: the highest id that does not keep the registry.
fn victim(d: &Driver) -> anyhow::Result<u32> {
    d.members()?
        .into_iter()
        .filter(|m| m.alive && m.role.is_empty())
        .map(|m| m.id)
        .max()
        .context("no live member that does not keep the registry: start at least 2 (`strom cluster up --servers 4`)")
}

/// Pushes `--events` events round-robin over the partitions.
fn fill(producer: &Producer, cfg: &Config) -> anyhow::Result<()> {
    let parts = cfg.args.partitions;
    let mut pending = std::collections::VecDeque::new();
    for i in 0..cfg.args.events {
        let f = producer.push_with(
            cfg.payload.meta.clone(),
            cfg.payload.data.clone(),
            Some((i % u64::from(parts)) as u32),
            &[],
        )?;
        pending.push_back(f);
        if pending.len() >= 256 {
            pending.pop_front().map(|f| f.wait()).transpose()?;
        }
    }
    for f in pending {
        f.wait()?;
    }
    Ok(())
}

/// Bytes the member stores for the topic (its metrics snapshot).
fn bytes_on(d: &Driver, member: u32, topic: &str) -> anyhow::Result<u64> {
    let addr = d
        .members()?
        .into_iter()
        .find(|m| m.id == member)
        .map(|m| m.addr)
        .context("the member to drain is gone")?;
    let v: serde_json::Value = serde_json::from_str(&d.server_snapshot_at(&addr)?)?;
    Ok(v["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["topic"] == topic)
        .filter_map(|p| p["storage_bytes"].as_u64())
        .sum())
}

/// Pushes windows of 16 events until `stop`, waiting for each window.
fn produce(producer: &Producer, cfg: &Config, stop: &AtomicBool, log: &Mutex<Vec<Window>>) {
    let parts = u64::from(cfg.args.partitions);
    let mut i = 0u64;
    // `--rate`: windows of 16 events at most that many events per second.
    let every = (cfg.args.rate > 0).then(|| Duration::from_secs_f64(16.0 / cfg.args.rate as f64));
    while !stop.load(Ordering::Acquire) {
        let next = every.map(|e| Instant::now() + e);
        let window: Vec<_> = (0..16)
            .map(|_| {
                i += 1;
                let p = Some((i % parts) as u32);
                producer.push_with(cfg.payload.meta.clone(), cfg.payload.data.clone(), p, &[])
            })
            .collect();
        let _ = producer.flush();
        let ok = window.into_iter().all(|f| f.and_then(|f| f.wait()).is_ok());
        let bytes = 16 * (cfg.payload.data.len() + cfg.payload.meta.len()) as u64;
        if let Ok(mut l) = log.lock() {
            l.push(Window {
                done: Instant::now(),
                bytes,
                ok,
            });
        }
        if let Some(wait) = next.map(|t| t.saturating_duration_since(Instant::now())) {
            std::thread::sleep(wait);
        }
    }
}

/// Starts the drain after [`AROUND`]; returns when it started and when the
/// member had left.
fn drain(d: &Driver, member: u32) -> anyhow::Result<(Instant, Instant)> {
    std::thread::sleep(AROUND);
    let started = Instant::now();
    d.drain_member(member, false)?;
    loop {
        if !d.members()?.iter().any(|m| m.id == member) {
            return Ok((started, Instant::now()));
        }
        anyhow::ensure!(
            started.elapsed() < GIVE_UP,
            "member {member} still holds partitions after {GIVE_UP:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn report(
    cfg: &Config,
    member: u32,
    held: u64,
    fill_s: f64,
    started: Instant,
    left: Instant,
    log: &[Window],
) {
    let rate = |from: Instant, to: Instant| {
        let bytes: u64 = log
            .iter()
            .filter(|w| w.ok && w.done > from && w.done <= to)
            .map(|w| w.bytes)
            .sum();
        bytes as f64 / (to - from).as_secs_f64().max(1e-9) / 1e6
    };
    let before = started.checked_sub(AROUND).unwrap_or(started);
    let mut acks: Vec<Instant> = log.iter().filter(|w| w.ok).map(|w| w.done).collect();
    acks.sort();
    let gaps: Vec<(f64, f64)> = acks
        .windows(2)
        .filter(|w| w[1] > started && w[0] < left)
        .map(|w| {
            let at = w[0].saturating_duration_since(started).as_secs_f64();
            ((w[1] - w[0]).as_secs_f64() * 1e3, at)
        })
        .collect();
    let (pause, pause_at) = gaps
        .iter()
        .copied()
        .fold((0.0, 0.0), |m, g| if g.0 > m.0 { g } else { m });
    // Windows take a while anyway: the usual gap before the drain.
    let usual = {
        let mut before: Vec<f64> = acks
            .windows(2)
            .filter(|w| w[1] <= started)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .collect();
        before.sort_by(f64::total_cmp);
        before.get(before.len() / 2).copied().unwrap_or(0.0)
    };
    let drain_s = (left - started).as_secs_f64();
    let out = serde_json::json!({
        "mode": "drain",
        "topic": cfg.topic,
        "partitions": cfg.args.partitions,
        "replication_factor": cfg.args.replication_factor,
        "acks": cfg.args.acks,
        "data_size": cfg.args.data_size,
        "drained_member": member,
        "bytes_held": held,
        "fill_s": fill_s,
        "drain_s": drain_s,
        "copy_mb_s": held as f64 / drain_s / 1e6,
        "producer_mb_s_before": rate(before, started),
        "producer_mb_s_during": rate(started, left),
        "longest_pause_ms": pause,
        "longest_pause_at_s": pause_at,
        "median_gap_before_ms": usual,
        "gaps_over_500ms": gaps.iter().filter(|g| g.0 > 500.0).count(),
        "failed_windows": log.iter().filter(|w| !w.ok).count(),
        "windows": log.len(),
    });
    if cfg.args.json {
        println!("{out}");
    } else {
        println!(
            "drain: member {member} held {:.2} GiB; it left {drain_s:.1} s after the drain started ({:.0} MB/s copied). The producer: {:.1} MB/s before, {:.1} MB/s during, longest pause {pause:.0} ms ({pause_at:.1} s into the drain; median gap before it {usual:.0} ms), {} of {} windows failed",
            held as f64 / (1u64 << 30) as f64,
            out["copy_mb_s"].as_f64().unwrap_or(0.0),
            out["producer_mb_s_before"].as_f64().unwrap_or(0.0),
            out["producer_mb_s_during"].as_f64().unwrap_or(0.0),
            out["failed_windows"],
            out["windows"],
        );
    }
}
