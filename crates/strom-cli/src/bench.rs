//! `strom bench`: produce, consume and end-to-end benchmarks that print
//! numbers (a human summary, or one JSON object with `--json`). Timing is
//! never asserted anywhere; tests only run tiny smoke versions.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use clap::{Args, ValueEnum};
use strom_client::{
    BatchSize, ConsumerOptions, Driver, Durability, Next, PartitionType, ProducerOptions,
    Selection, StartPos, Topic, TopicSpec,
};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Mode {
    Produce,
    Consume,
    E2e,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    mode: Mode,
    /// strom://GROUP_FILE, or omit for an embedded server in a temp dir.
    #[arg(long)]
    target: Option<String>,
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    #[arg(long, default_value_t = 100)]
    metadata_size: usize,
    /// Bytes of data per event (0 = metadata only).
    #[arg(long, default_value_t = 0)]
    data_size: usize,
    /// Events per batch, or "adaptive".
    #[arg(long, default_value = "adaptive")]
    batch: String,
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    #[arg(long, default_value_t = 1)]
    producers: u32,
    #[arg(long, default_value_t = 1)]
    consumers: u32,
    /// memory | file
    #[arg(long, default_value = "file")]
    partition_type: String,
    /// always | never | interval:<ms>
    #[arg(long, default_value = "never")]
    durability: String,
    /// Fraction of each data part a consumer fetches.
    #[arg(long, default_value_t = 1.0)]
    selectivity: f64,
    /// Events pushed (and consumed) before measuring.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// e2e: events per second to offer in total (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Topic to use (consume mode reads what a produce run left).
    #[arg(long)]
    topic: Option<String>,
    #[arg(long)]
    json: bool,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

struct Setup {
    driver: Driver,
    topic: Topic,
    _tmp: Option<tempfile::TempDir>,
}

fn setup(a: &BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<Setup> {
    let (driver, tmp) = match a.target.as_deref() {
        None | Some("embedded") => {
            let tmp = tempfile::tempdir()?;
            (Driver::embedded(tmp.path())?, Some(tmp))
        }
        Some(t) => match t.strip_prefix("strom://") {
            Some("") => (crate::connect(group_file)?, None),
            Some(path) => (Driver::connect(path)?, None),
            None => anyhow::bail!("unsupported target '{t}': use strom://GROUP_FILE (kafka:// and redis:// are not built yet)"),
        },
    };
    let name = a
        .topic
        .clone()
        .unwrap_or_else(|| format!("bench-{}-{}", std::process::id(), now_us()));
    let topic = match driver.open_topic(&name) {
        Ok(t) if a.topic.is_some() => t,
        _ => {
            let spec = TopicSpec {
                partition_type: PartitionType::parse(&a.partition_type)
                    .map_err(anyhow::Error::msg)?,
                durability: Durability::parse(&a.durability).map_err(anyhow::Error::msg)?,
                ..TopicSpec::new(&name, a.partitions)
            };
            driver.create_topic(spec)?
        }
    };
    Ok(Setup {
        driver,
        topic,
        _tmp: tmp,
    })
}

fn producer_options(a: &BenchArgs) -> anyhow::Result<ProducerOptions> {
    let batch = match a.batch.as_str() {
        "adaptive" => BatchSize::Adaptive,
        n => BatchSize::Count(
            n.parse()
                .map_err(|_| anyhow::anyhow!("--batch takes a count or 'adaptive'"))?,
        ),
    };
    Ok(ProducerOptions {
        batch,
        ..Default::default()
    })
}

/// Pushes `events` spread over the producer threads; returns seconds.
fn produce(a: &BenchArgs, topic: &Topic, events: u64, stamp: bool) -> anyhow::Result<f64> {
    let data = Bytes::from(vec![0xA5u8; a.data_size]);
    let pad = "x".repeat(a.metadata_size.saturating_sub(40));
    let start = Instant::now();
    let per = events / a.producers as u64;
    let extra = events % a.producers as u64;
    let interval =
        (a.rate > 0).then(|| Duration::from_secs_f64(a.producers as f64 / a.rate as f64));
    std::thread::scope(|s| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for k in 0..a.producers {
            let n = per + u64::from((k as u64) < extra);
            let (topic, data, pad) = (topic.clone(), data.clone(), pad.clone());
            let opts = producer_options(a)?;
            handles.push(s.spawn(move || -> anyhow::Result<()> {
                let p = topic.producer_with(opts)?;
                let t0 = Instant::now();
                let mut last = None;
                for i in 0..n {
                    if let Some(iv) = interval {
                        let due = t0 + iv * i as u32;
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                    }
                    let ts = if stamp { now_us() } else { 0 };
                    let meta = format!("{{\"t\":{ts},\"i\":{i},\"p\":\"{pad}\"}}");
                    last = Some(p.push(meta, data.clone())?);
                }
                p.flush()?;
                if let Some(f) = last {
                    f.wait()?;
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("producer thread panicked"))??;
        }
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// Consumes `events` with the consumer threads; returns (seconds, data bytes, latencies µs).
fn consume(
    a: &BenchArgs,
    topic: &Topic,
    events: u64,
    name: &str,
    latency: bool,
) -> anyhow::Result<(f64, u64, Vec<u64>)> {
    let n = topic.partitions();
    let consumers = a.consumers.clamp(1, n);
    let sel_len = (a.data_size as f64 * a.selectivity.clamp(0.0, 1.0)) as u64;
    let selection = if sel_len == 0 {
        Selection::None
    } else {
        Selection::Range {
            offset: 0,
            len: sel_len,
        }
    };
    let got = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let lats = std::thread::scope(|s| -> anyhow::Result<Vec<u64>> {
        let mut handles = Vec::new();
        for k in 0..consumers {
            let parts: Vec<u32> = (0..n).filter(|p| p % consumers == k).collect();
            let opts = ConsumerOptions {
                partitions: Some(parts),
                start: StartPos::Beginning,
                selector: Arc::new(selection.clone()),
                ..Default::default()
            };
            let (topic, got, bytes) = (topic.clone(), got.clone(), bytes.clone());
            handles.push(s.spawn(move || -> anyhow::Result<Vec<u64>> {
                let c = topic.consumer_with(name, opts)?;
                let mut lats = Vec::new();
                while got.load(Ordering::Relaxed) < events {
                    match c.pull_timeout(Duration::from_millis(200)) {
                        Ok(Next::Event(ev)) => {
                            if latency {
                                let now = now_us();
                                if let Some(t) = ev.json().ok().and_then(|v| v["t"].as_u64()) {
                                    lats.push(now.saturating_sub(t));
                                }
                            }
                            bytes.fetch_add(ev.fetched_len(), Ordering::Relaxed);
                            got.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Next::EndOfStream) => break,
                        Err(e) if e.code() == strom_client::ErrorCode::TIMEOUT => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(lats)
            }));
        }
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("consumer thread panicked"))??,
            );
        }
        Ok(all)
    })?;
    Ok((
        start.elapsed().as_secs_f64(),
        bytes.load(Ordering::Relaxed),
        lats,
    ))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn run(a: BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let s = setup(&a, group_file)?;
    let event_bytes = (a.metadata_size + a.data_size) as u64;
    let (seconds, bytes, lats) = match a.mode {
        Mode::Produce => {
            if a.warmup > 0 {
                produce(&a, &s.topic, a.warmup, false)?;
            }
            (
                produce(&a, &s.topic, a.events, false)?,
                a.events * event_bytes,
                Vec::new(),
            )
        }
        Mode::Consume => {
            let info = s.topic.describe()?;
            let have: u64 = info
                .partitions
                .iter()
                .map(|p| p.next_offset - p.first_offset)
                .sum();
            if have < a.events {
                produce(&a, &s.topic, a.events - have, false)?;
            }
            let name = format!("bench-consumer-{}", now_us());
            let (sec, data, _) = consume(&a, &s.topic, a.events, &name, false)?;
            (sec, data + a.events * a.metadata_size as u64, Vec::new())
        }
        Mode::E2e => {
            let name = format!("bench-e2e-{}", now_us());
            let (topic, events) = (s.topic.clone(), a.events);
            let result = std::thread::scope(|sc| -> anyhow::Result<(f64, u64, Vec<u64>)> {
                let c = sc.spawn(|| consume(&a, &topic, events, &name, true));
                std::thread::sleep(Duration::from_millis(100));
                produce(&a, &topic, events, true)?;
                c.join().map_err(|_| anyhow::anyhow!("consumer panicked"))?
            })?;
            (
                result.0,
                result.1 + a.events * a.metadata_size as u64,
                result.2,
            )
        }
    };
    let mut lats = lats;
    lats.sort_unstable();
    let eps = a.events as f64 / seconds;
    let mbps = bytes as f64 / seconds / 1e6;
    let target = a
        .target
        .clone()
        .unwrap_or_else(|| "strom://embedded".into());
    let mut out = serde_json::json!({
        "target": target,
        "mode": format!("{:?}", a.mode).to_lowercase(),
        "events": a.events,
        "bytes": bytes,
        "seconds": seconds,
        "events_per_s": eps,
        "mb_per_s": mbps,
        "metadata_size": a.metadata_size,
        "data_size": a.data_size,
        "partitions": a.partitions,
        "producers": a.producers,
        "consumers": a.consumers,
        "partition_type": a.partition_type,
        "durability": a.durability,
        "batch": a.batch,
    });
    if a.mode == Mode::E2e {
        out["p50_us"] = percentile(&lats, 0.5).into();
        out["p99_us"] = percentile(&lats, 0.99).into();
    }
    if a.json {
        println!("{out}");
    } else {
        println!(
            "{} {}: {} events in {:.3} s = {:.0} events/s, {:.1} MB/s",
            out["target"].as_str().unwrap_or(""),
            out["mode"].as_str().unwrap_or(""),
            a.events,
            seconds,
            eps,
            mbps
        );
        if a.mode == Mode::E2e {
            println!(
                "latency push->delivery: p50 {} us, p99 {} us",
                out["p50_us"], out["p99_us"]
            );
        }
    }
    drop(s.driver);
    Ok(())
}
