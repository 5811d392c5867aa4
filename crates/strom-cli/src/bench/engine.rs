//! Runs a benchmark: splits the work into producer and consumer jobs, opens
//! every worker first, releases them together, and aggregates. Workers run
//! as threads, or with `--procs` as child `strom bench` processes that get
//! their job as JSON, report `ready`, wait for `go` on stdin, and print
//! their outcome as one JSON line.
//!
//! The CPU the timed phase costs, client and server, is measured over the
//! same span as its wall time ([`super::cpu`]): from the release of the
//! workers to their end; a worker process reports its own.
//!
//! A consume run checks its counts: it fails when the target stores fewer
//! events than were produced (retention dropped some) or when the consumers
//! deliver fewer than expected, instead of timing what happened to be left.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Barrier;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};

use super::cpu::{self, CpuUse, ServerCpu};
use super::sys::Progress;
use super::workload::{now_us, parts_of, per_partition, share};
use super::{Config, ConsumeJob, Mode, Outcome, ProduceJob, Target};

/// Aggregate of one timed phase.
#[derive(Default)]
pub struct Result {
    /// Events produced for this run (consume: what the topic should hold).
    pub produced: u64,
    /// Events the consumers delivered (`None` in produce mode).
    pub consumed: Option<u64>,
    /// Events the target stores after the run (`None` in e2e mode).
    pub stored: Option<u64>,
    pub events: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub lats_us: Vec<u64>,
    /// CPU seconds of the timed phase, client and server.
    pub cpu: CpuUse,
}

fn produce_jobs(cfg: &Config, events: u64, warmup: u64, stamp: bool) -> Vec<ProduceJob> {
    let k = cfg.args.producers;
    (0..k)
        .map(|i| ProduceJob {
            partitions: parts_of(i, k, cfg.args.partitions),
            events: share(events, i as u64, k as u64),
            warmup: share(warmup, i as u64, k as u64),
            stamp,
            ack_latency: false,
        })
        .collect()
}

fn consume_jobs(cfg: &Config, per_part: &[u64], name: &str, latency: bool) -> Vec<ConsumeJob> {
    let c = cfg.consumers();
    (0..c)
        .map(|i| {
            let partitions = parts_of(i, c, cfg.args.partitions);
            ConsumeJob {
                expect: partitions.iter().map(|&p| per_part[p as usize]).collect(),
                partitions,
                name: name.to_string(),
                latency,
            }
        })
        .collect()
}

/// Runs the mode's timed phase (and its warm-up or fill) on `target`,
/// whose server's CPU is found as `server` says.
pub fn run(cfg: &Config, target: &dyn Target, server: &ServerCpu) -> anyhow::Result<Result> {
    let a = &cfg.args;
    let bytes_per_event = (cfg.payload.meta.len() + cfg.payload.data.len()) as u64;
    match a.mode {
        Mode::Produce => {
            if a.warmup > 0 {
                let jobs = produce_jobs(cfg, a.warmup, 0, false);
                run_threads(cfg, target, &jobs, &[], None, server)?;
            }
            let mut jobs = produce_jobs(cfg, a.events, 0, false);
            for j in &mut jobs {
                j.ack_latency = true;
            }
            let mut r = run_any(cfg, target, &jobs, &[], a.events, server)?;
            r.events = a.events;
            r.bytes = a.events * bytes_per_event;
            r.produced = a.events;
            r.stored = Some(target.stored(cfg)?.iter().sum());
            Ok(r)
        }
        Mode::Consume => {
            let expect = per_partition(a.events, a.producers, a.partitions);
            let stored = target.stored(cfg)?;
            let fill: Vec<ProduceJob> = expect
                .iter()
                .zip(&stored)
                .enumerate()
                .filter(|(_, (e, s))| e > s)
                .map(|(p, (e, s))| ProduceJob {
                    partitions: vec![p as u32],
                    events: e - s,
                    warmup: 0,
                    stamp: false,
                    ack_latency: false,
                })
                .collect();
            if !fill.is_empty() {
                run_threads(cfg, target, &fill, &[], None, server)?;
            }
            // Retention (a bounded memory partition) may have dropped
            // events: timing what is left would be a lie, so fail.
            let stored = target.stored(cfg)?;
            let total: u64 = expect.iter().sum();
            let kept: u64 = expect.iter().zip(&stored).map(|(e, s)| *e.min(s)).sum();
            if kept < total {
                anyhow::bail!("{}", short_of(cfg, target, "stored", total, kept)?);
            }
            if a.warmup > 0 {
                let warm: Vec<u64> = per_partition(a.warmup, a.producers, a.partitions)
                    .iter()
                    .zip(&expect)
                    .map(|(w, e)| *w.min(e))
                    .collect();
                let name = format!("bench-warmup-{}", now_us());
                run_threads(
                    cfg,
                    target,
                    &[],
                    &consume_jobs(cfg, &warm, &name, false),
                    None,
                    server,
                )?;
            }
            let name = format!("bench-consumer-{}", now_us());
            let mut r = run_any(
                cfg,
                target,
                &[],
                &consume_jobs(cfg, &expect, &name, false),
                total,
                server,
            )?;
            if r.events < total {
                anyhow::bail!("{}", short_of(cfg, target, "consumed", total, r.events)?);
            }
            r.produced = total;
            r.consumed = Some(r.events);
            r.stored = Some(stored.iter().sum());
            Ok(r)
        }
        Mode::Tasks => anyhow::bail!("the tasks mode runs in bench/tasks.rs"),
        Mode::E2e => {
            let expect = per_partition(a.events + a.warmup, a.producers, a.partitions);
            let name = format!("bench-e2e-{}", now_us());
            let consumers = consume_jobs(cfg, &expect, &name, true);
            let producers = produce_jobs(cfg, a.events + a.warmup, a.warmup, true);
            let mut r = run_any(cfg, target, &producers, &consumers, a.events, server)?;
            if r.events < a.events {
                anyhow::bail!("{}", short_of(cfg, target, "consumed", a.events, r.events)?);
            }
            r.produced = a.events;
            r.consumed = Some(r.events);
            Ok(r)
        }
        Mode::Baseline => anyhow::bail!("the baseline mode runs in bench/baseline.rs"),
        Mode::Transport => anyhow::bail!("the transport mode runs in bench/transport.rs"),
        Mode::Failover | Mode::Drain | Mode::Transform => {
            anyhow::bail!("the failover and drain modes run in bench/failover.rs and drain.rs")
        }
    }
}

/// The one-line error of a run that lost events: how many were expected,
/// how many were `what` (stored / consumed), and the memory bound if any.
fn short_of(
    cfg: &Config,
    target: &dyn Target,
    what: &str,
    expected: u64,
    got: u64,
) -> anyhow::Result<String> {
    let bound = match target.retention(cfg)? {
        Some((bytes, overflow)) => format!(
            "; the memory partitions are bounded at retention_bytes {bytes} (overflow \
             {overflow}) and {} bytes per event: raise --retention-bytes",
            cfg.event_bytes()
        ),
        None => String::new(),
    };
    Ok(format!(
        "bench {}: {expected} events were produced to topic '{}' but only {got} are {what} \
         ({} missing){bound}",
        cfg.args.mode.name(),
        cfg.topic,
        expected - got
    ))
}

fn run_any(
    cfg: &Config,
    target: &dyn Target,
    producers: &[ProduceJob],
    consumers: &[ConsumeJob],
    total: u64,
    server: &ServerCpu,
) -> anyhow::Result<Result> {
    if cfg.args.procs {
        run_procs(cfg, target, producers, consumers, server)
    } else {
        run_threads(cfg, target, producers, consumers, Some(total), server)
    }
}

/// Opens every worker, starts them together and sums their outcomes. With
/// consumers present, only consumer outcomes count (they saw the delivery).
/// CPU is counted from the release of the workers to the end of the last.
fn run_threads(
    cfg: &Config,
    target: &dyn Target,
    producers: &[ProduceJob],
    consumers: &[ConsumeJob],
    progress_total: Option<u64>,
    server: &ServerCpu,
) -> anyhow::Result<Result> {
    let mut workers = Vec::new();
    for job in consumers {
        workers.push((true, target.consumer(cfg, job)?));
    }
    for job in producers {
        workers.push((false, target.producer(cfg, job)?));
    }
    let label = cfg.args.mode.name();
    let progress = Progress::new(
        progress_total.unwrap_or(0),
        label,
        progress_total.is_some() && !cfg.args.json,
    );
    // The workers and this thread, which marks the CPU used before any
    // worker starts.
    let barrier = Barrier::new(workers.len() + 1);
    let count_consumers = !consumers.is_empty();
    let (cpu_start, results) = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|(is_consumer, mut w)| {
                let (barrier, done) = (&barrier, &*progress.done);
                // Progress counts the events that matter: delivered ones when
                // consumers run, produced ones otherwise.
                let scratch = AtomicU64::new(0);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let counter = if is_consumer == count_consumers {
                        done
                    } else {
                        &scratch
                    };
                    let out = w.run(counter);
                    (is_consumer, start, Instant::now(), out)
                })
            })
            .collect();
        let cpu_start = server.mark();
        barrier.wait();
        let results = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a bench worker panicked"))
            })
            .collect::<Vec<_>>();
        (cpu_start, results)
    });
    let mut agg = Result {
        cpu: server.since(&cpu_start, None),
        ..Result::default()
    };
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for r in results {
        let (is_consumer, start, end, out) = r?;
        let out = out?;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
        if is_consumer == count_consumers {
            agg.events += out.events;
            agg.bytes += out.bytes;
            agg.lats_us.extend(out.lats_us);
        }
    }
    if let (Some(f), Some(l)) = (first, last) {
        agg.seconds = (l - f).as_secs_f64();
    }
    Ok(agg)
}

fn job_json(role: &str, p: Option<&ProduceJob>, c: Option<&ConsumeJob>) -> String {
    match (p, c) {
        (Some(p), _) => json!({
            "role": role, "partitions": p.partitions, "events": p.events,
            "warmup": p.warmup, "stamp": p.stamp, "ack_latency": p.ack_latency,
        }),
        (_, Some(c)) => json!({
            "role": role, "partitions": c.partitions, "expect": c.expect,
            "name": c.name, "latency": c.latency,
        }),
        _ => Value::Null,
    }
    .to_string()
}

fn child_args(cfg: &Config, target: &dyn Target, job: String) -> Vec<String> {
    let a = &cfg.args;
    let mut v: Vec<String> = vec!["bench".into(), a.mode.name().into()];
    let mut flag = |k: &str, val: String| {
        v.push(format!("--{k}"));
        v.push(val);
    };
    flag("target", target.child_target());
    flag("topic", cfg.topic.clone());
    flag("events", a.events.to_string());
    flag("metadata-size", a.metadata_size.to_string());
    flag("data-size", a.data_size.to_string());
    flag("payload", format!("{:?}", a.payload).to_lowercase());
    flag("batch", a.batch.clone());
    flag("partitions", a.partitions.to_string());
    flag("producers", a.producers.to_string());
    flag("consumers", a.consumers.to_string());
    flag("partition-type", a.partition_type.clone());
    flag("durability", a.durability.clone());
    flag("replication-factor", a.replication_factor.to_string());
    flag("acks", a.acks.clone());
    flag("selectivity", a.selectivity.to_string());
    flag("rate", a.rate.to_string());
    if let Some(us) = a.spin_us {
        flag("spin-us", us.to_string());
    }
    flag("worker-job", job);
    if a.no_read_on_pull {
        v.push("--no-read-on-pull".into());
    }
    v
}

struct ChildProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    is_consumer: bool,
}

fn read_json_line(c: &mut ChildProc) -> anyhow::Result<Value> {
    let mut line = String::new();
    c.stdout.read_line(&mut line)?;
    if line.is_empty() {
        let status = c.child.wait()?;
        anyhow::bail!("bench worker process exited early ({status})");
    }
    serde_json::from_str(&line).with_context(|| format!("bad line from a bench worker: {line}"))
}

/// Runs every job as a child process of this same binary; time is from the
/// earliest worker start to the latest worker end (wall clock, one host).
/// Each worker reports the CPU it used over that span of its own (its
/// process start-up and connection set-up left out, as with threads); this
/// process's own CPU is counted from `go` to the last outcome.
fn run_procs(
    cfg: &Config,
    target: &dyn Target,
    producers: &[ProduceJob],
    consumers: &[ConsumeJob],
    server: &ServerCpu,
) -> anyhow::Result<Result> {
    let exe = std::env::current_exe().context("cannot find the strom binary to re-execute")?;
    let mut jobs: Vec<(bool, String)> = consumers
        .iter()
        .map(|c| (true, job_json("consume", None, Some(c))))
        .collect();
    jobs.extend(
        producers
            .iter()
            .map(|p| (false, job_json("produce", Some(p), None))),
    );
    let mut children = Vec::new();
    for (is_consumer, job) in jobs {
        let mut child = Command::new(&exe)
            .args(child_args(cfg, target, job))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, BufReader::new(o)),
            _ => anyhow::bail!("bench worker has no stdin/stdout pipe"),
        };
        children.push(ChildProc {
            child,
            stdin,
            stdout,
            is_consumer,
        });
    }
    for c in &mut children {
        let v = read_json_line(c)?;
        if v["ready"] != true {
            anyhow::bail!("bench worker did not report ready: {v}");
        }
    }
    let cpu_start = server.mark();
    for c in &mut children {
        c.stdin.write_all(b"go\n")?;
        c.stdin.flush()?;
    }
    let count_consumers = !consumers.is_empty();
    let mut agg = Result::default();
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut children_cpu_s = 0.0;
    for c in &mut children {
        let v = read_json_line(c)?;
        if let Some(e) = v["error"].as_str() {
            anyhow::bail!("bench worker failed: {e}");
        }
        first = first.min(v["start_us"].as_u64().unwrap_or(u64::MAX));
        last = last.max(v["end_us"].as_u64().unwrap_or(0));
        children_cpu_s += v["cpu_s"]
            .as_f64()
            .context("a bench worker reported no cpu_s")?;
        if c.is_consumer == count_consumers {
            agg.events += v["events"].as_u64().unwrap_or(0);
            agg.bytes += v["bytes"].as_u64().unwrap_or(0);
            if let Some(l) = v["lats_us"].as_array() {
                agg.lats_us.extend(l.iter().filter_map(Value::as_u64));
            }
        }
        let status = c.child.wait()?;
        if !status.success() {
            anyhow::bail!("bench worker exited with {status}");
        }
    }
    agg.seconds = last.saturating_sub(first) as f64 / 1e6;
    agg.cpu = server.since(&cpu_start, Some(children_cpu_s));
    Ok(agg)
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

/// The child side of `--procs`: one worker, driven through stdin/stdout.
pub fn run_child(cfg: &Config, target: &dyn Target, job: &str) -> anyhow::Result<()> {
    let j: Value = serde_json::from_str(job).context("bad --worker-job")?;
    let mut worker = match j["role"].as_str() {
        Some("produce") => target.producer(
            cfg,
            &ProduceJob {
                partitions: u32s(&j["partitions"]),
                events: j["events"].as_u64().unwrap_or(0),
                warmup: j["warmup"].as_u64().unwrap_or(0),
                stamp: j["stamp"].as_bool().unwrap_or(false),
                ack_latency: j["ack_latency"].as_bool().unwrap_or(false),
            },
        )?,
        Some("consume") => target.consumer(
            cfg,
            &ConsumeJob {
                partitions: u32s(&j["partitions"]),
                expect: j["expect"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default(),
                name: j["name"].as_str().unwrap_or("bench").to_string(),
                latency: j["latency"].as_bool().unwrap_or(false),
            },
        )?,
        _ => anyhow::bail!("bad --worker-job role: {job}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!({"ready": true}))?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let (start, cpu_start) = (now_us(), cpu::self_cpu_s());
    let r = worker.run(&AtomicU64::new(0));
    let (end, cpu_s) = (now_us(), cpu::self_cpu_s() - cpu_start);
    let line = match r {
        Ok(Outcome {
            events,
            bytes,
            lats_us,
        }) => json!({
            "events": events, "bytes": bytes, "start_us": start, "end_us": end, "lats_us": lats_us,
            "cpu_s": cpu_s,
        }),
        Err(e) => json!({"error": format!("{e:#}")}),
    };
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}
