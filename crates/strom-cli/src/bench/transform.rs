//! `strom bench transform`: how fast in-transit transforms carry a
//! topic (docs/transforms.md). It fills a source topic with `--events`
//! events of `--data-size` bytes over `--partitions` partitions (metadata
//! `{"i": n, "keep": n is even}`), ends its stream, and reads it once with
//! a plain consumer: the peer, measured in the same run. Then it runs
//! three transforms of the whole source, one after the other, each into
//! its own output: `copy` (no steps), `filter` (`keep == true`, half the
//! events) and `zstd` (compress the output with zstd:1), and times each
//! until its output's stream ended. On a group (`--target
//! strom://GROUP_FILE`) the servers run them; on the embedded default the
//! client-side loop (`run_all`, what `strom.transform` runs) does.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use strom_client::transform::{self, defs, Builtin, Op, Pipeline, TransformSpec};
use strom_client::{Driver, Next, ProducerOptions, StartPos, TopicSpec};

use super::{BenchArgs, Config};

const GIVE_UP: Duration = Duration::from_secs(3600);

struct Row {
    case: &'static str,
    secs: f64,
    events_out: u64,
}

pub fn run(args: BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<()> {
    let group = match args.target.as_deref() {
        None | Some("embedded") => None,
        Some(s) => match s.strip_prefix("strom://").unwrap_or(s) {
            "" => Some(group_file.context("--target strom:// needs --group-file")?),
            g => Some(PathBuf::from(g)),
        },
    };
    let cfg = Config::new(args)?;
    let tmp = tempfile::tempdir()?;
    let d = match &group {
        Some(g) => Driver::connect(g)?,
        None => Driver::embedded(tmp.path().join("data"))?,
    };
    let name = format!("bench-transform-{}", std::process::id());
    let spec = TopicSpec {
        partition_type: cfg.partition_type,
        durability: cfg.durability,
        replication_factor: cfg.args.replication_factor,
        ..TopicSpec::new(&name, cfg.args.partitions)
    };
    let src = d.create_topic(spec.clone())?;
    fill(&src, &cfg)?;
    let bytes = cfg.args.events * cfg.payload.data.len() as u64;
    let t0 = Instant::now();
    let read = consume_all(&src)?;
    let peer = t0.elapsed().as_secs_f64();
    anyhow::ensure!(read == cfg.args.events, "the peer read {read} events");
    let cases: [(&'static str, Vec<Op>, &str); 3] = [
        ("copy", vec![], "none"),
        (
            "filter",
            vec![Op::Filter {
                expr: "keep == true".into(),
            }],
            "none",
        ),
        (
            "zstd",
            vec![Op::Compress {
                codec: "zstd:1".into(),
            }],
            "zstd:1",
        ),
    ];
    let mut rows = Vec::new();
    for (case, ops, compression) in cases {
        let out = format!("{name}-{case}");
        d.create_topic(TopicSpec {
            name: out.clone(),
            compression: compression.into(),
            ..spec.clone()
        })?;
        let t = TransformSpec {
            name: out.clone(),
            from: name.clone(),
            to: out.clone(),
            ops,
        };
        let start = Instant::now();
        let events_out = match group.is_some() {
            true => on_servers(&d, &t)?,
            false => in_process(&d, &t)?,
        };
        rows.push(Row {
            case,
            secs: start.elapsed().as_secs_f64(),
            events_out,
        });
    }
    report(&cfg, group.is_some(), bytes, peer, &rows);
    Ok(())
}

fn fill(src: &strom_client::Topic, cfg: &Config) -> anyhow::Result<()> {
    let p = src.producer_with(ProducerOptions {
        batch: cfg.batch,
        acks: cfg.acks,
        ..Default::default()
    })?;
    let parts = u64::from(cfg.args.partitions);
    for i in 0..cfg.args.events {
        let meta = format!("{{\"i\":{i},\"keep\":{}}}", i % 2 == 0);
        p.push_with(
            meta,
            cfg.payload.data.clone(),
            Some((i % parts) as u32),
            &[],
        )?;
    }
    p.close()?;
    Ok(())
}

/// Reads every event of the topic to its end; returns how many.
fn consume_all(t: &strom_client::Topic) -> anyhow::Result<u64> {
    let c = t.consumer_with(
        "bench-peer",
        strom_client::ConsumerOptions {
            start: StartPos::Beginning,
            ..Default::default()
        },
    )?;
    let mut n = 0;
    loop {
        match c.pull_timeout(GIVE_UP)? {
            Next::Event(e) => {
                std::hint::black_box(e.data());
                n += 1;
            }
            Next::EndOfStream => return Ok(n),
        }
    }
}

/// Defines the transform on the group and waits for its output to end.
fn on_servers(d: &Driver, t: &TransformSpec) -> anyhow::Result<u64> {
    defs::create(d, t)?;
    let start = Instant::now();
    loop {
        let info = d.describe(&t.to)?;
        if info.state.ended {
            defs::delete(d, &t.name)?;
            return Ok(info.partitions.iter().map(|p| p.next_offset).sum());
        }
        anyhow::ensure!(
            start.elapsed() < GIVE_UP,
            "transform {} did not end",
            t.name
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the transform with the client-side loop until the source ends.
fn in_process(d: &Driver, t: &TransformSpec) -> anyhow::Result<u64> {
    let (src, dst) = (d.open_topic(&t.from)?, d.open_topic(&t.to)?);
    let b = Builtin::new(Pipeline::new(&t.ops)?, true);
    let stop = Arc::new(AtomicBool::new(false));
    let p = transform::run_all(&t.name, &src, &dst, Arc::new(b), stop)?;
    Ok(p.written)
}

fn report(cfg: &Config, servers: bool, bytes: u64, peer: f64, rows: &[Row]) {
    let mbs = |s: f64| bytes as f64 / s.max(1e-9) / 1e6;
    let evs = |s: f64| cfg.args.events as f64 / s.max(1e-9);
    let runs = if servers { "servers" } else { "in-process" };
    if cfg.args.json {
        let cases: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"case": r.case, "seconds": r.secs, "mb_per_s": mbs(r.secs),
                    "events_per_s": evs(r.secs), "events_out": r.events_out})
            })
            .collect();
        let v = serde_json::json!({"mode": "transform", "runs": runs, "events": cfg.args.events,
            "data_size": cfg.args.data_size, "partitions": cfg.args.partitions,
            "peer_consume": {"seconds": peer, "mb_per_s": mbs(peer), "events_per_s": evs(peer)},
            "cases": cases});
        println!("{v}");
        return;
    }
    println!(
        "transform bench ({runs}): {} events x {} B over {} partitions",
        cfg.args.events, cfg.args.data_size, cfg.args.partitions
    );
    println!(
        "{:<14} {:>9} {:>11} {:>12} {:>11}",
        "CASE", "SECONDS", "MB/s", "EVENTS/s", "OUT"
    );
    println!(
        "{:<14} {:>9.3} {:>11.1} {:>12.0} {:>11}",
        "peer consume",
        peer,
        mbs(peer),
        evs(peer),
        "-"
    );
    for r in rows {
        println!(
            "{:<14} {:>9.3} {:>11.1} {:>12.0} {:>11}",
            r.case,
            r.secs,
            mbs(r.secs),
            evs(r.secs),
            r.events_out
        );
    }
}
