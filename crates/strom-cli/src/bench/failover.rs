//! `strom bench failover --target strom://GROUP_FILE`: the failover time a
//! producer sees. Against a group started by `strom cluster up` (its
//! `cluster.json` beside the group file names the member pids), it creates
//! a replicated topic (`--replication-factor`, at least 2; `--partitions`),
//! runs one producer (`--acks`, default all) that pushes one event to every
//! partition and waits for each acknowledgement, in a loop, picks a
//! partition whose leader is not the registry master, SIGKILLs that
//! leader's process, and reports the time from the kill to the first
//! successful acknowledgement on that partition of a push made after the
//! kill, and how many pushes failed. The killed member stays dead: start a
//! fresh cluster for the next run (bench/failover.sh does).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use strom_client::{Driver, ProducerOptions, TopicSpec};

use super::sys::pid_listening_on;
use super::{BenchArgs, Config};

/// Acknowledged events on the partition before the kill.
const WARM_ACKS: usize = 200;
/// Longest wait for the partition to acknowledge again.
const GIVE_UP: Duration = Duration::from_secs(60);

/// One push: its partition, when it was pushed and resolved, and whether
/// it was acknowledged.
struct Push {
    partition: u32,
    pushed: Instant,
    done: Instant,
    ok: bool,
}

fn group_file(args: &BenchArgs, group_file: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let spec = args.target.as_deref().unwrap_or("strom://");
    let rest = spec.strip_prefix("strom://").unwrap_or(spec);
    if !rest.is_empty() {
        return Ok(PathBuf::from(rest));
    }
    group_file
        .or_else(|| std::env::var_os("STROM_GROUP_FILE").map(PathBuf::from))
        .context("failover needs --target strom://GROUP_FILE of a `strom cluster up` group")
}

/// The member pids `strom cluster up` recorded beside the group file.
fn cluster_pids(group: &Path) -> anyhow::Result<Vec<u32>> {
    let record = group
        .parent()
        .unwrap_or(Path::new("."))
        .join("cluster.json");
    let text = std::fs::read(&record).with_context(|| {
        format!(
            "failover kills a member started by `strom cluster up`; no {}",
            record.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_slice(&text)?;
    Ok(v["pids"]
        .as_array()
        .context("cluster.json has no pids")?
        .iter()
        .filter_map(|p| p.as_u64())
        .map(|p| p as u32)
        .collect())
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next()?.parse().ok()
}

/// Pushes one event to every partition and waits for each, until `stop`.
fn produce(
    producer: strom_client::Producer,
    cfg: &Config,
    stop: &AtomicBool,
    log: &Mutex<Vec<Push>>,
) {
    while !stop.load(Ordering::Acquire) {
        let mut window = Vec::new();
        for p in 0..cfg.args.partitions {
            let pushed = Instant::now();
            let f = producer.push_with(
                cfg.payload.meta.clone(),
                cfg.payload.data.clone(),
                Some(p),
                &[],
            );
            window.push((p, pushed, f));
        }
        for (partition, pushed, f) in window {
            let ok = f.and_then(|f| f.wait()).is_ok();
            let done = Instant::now();
            if let Ok(mut l) = log.lock() {
                l.push(Push {
                    partition,
                    pushed,
                    done,
                    ok,
                });
            }
        }
    }
    // Takes the failed pushes' error here, so that the drop's flush does
    // not log it again.
    let _ = producer.flush();
}

pub fn run(args: BenchArgs, group_file_arg: Option<PathBuf>) -> anyhow::Result<()> {
    let group = group_file(&args, group_file_arg)?;
    let pids = cluster_pids(&group)?;
    let cfg = Config::new(args)?;
    let a = &cfg.args;
    anyhow::ensure!(
        a.replication_factor >= 2,
        "failover needs a replicated topic: --replication-factor 3"
    );
    let d = Driver::connect(&group)?;
    let topic = d.create_topic(TopicSpec {
        partition_type: cfg.partition_type,
        durability: cfg.durability,
        replication_factor: a.replication_factor,
        ..TopicSpec::new(&cfg.topic, a.partitions)
    })?;
    // The registry lives on the master: killing it is another failover
    // (the registry's), not the one measured here.
    let master = d.master_addr();
    let info = d.describe(&cfg.topic)?;
    let part = info
        .partitions
        .iter()
        .find(|p| p.addr != master)
        .with_context(|| {
            format!(
                "every partition of '{}' is led by the registry master {master}; use more \
                 --partitions (3 on a 3-member group)",
                cfg.topic
            )
        })?;
    let (p, victim_member, victim_addr) = (part.id, part.member, part.addr.clone());
    let pid = port_of(&victim_addr)
        .and_then(pid_listening_on)
        .with_context(|| format!("no local process listens on {victim_addr}"))?;
    anyhow::ensure!(
        pids.contains(&pid),
        "pid {pid} on {victim_addr} is not one of the cluster's members {pids:?}; left alone"
    );

    let producer = topic.producer_with(ProducerOptions {
        batch: cfg.batch,
        acks: cfg.acks,
        idempotent: cfg.args.idempotent,
        ..Default::default()
    })?;
    let stop = AtomicBool::new(false);
    let log = Mutex::new(Vec::<Push>::new());
    let count =
        |f: &dyn Fn(&Push) -> bool| log.lock().map_or(0, |l| l.iter().filter(|x| f(x)).count());
    let outcome = std::thread::scope(|s| {
        s.spawn(|| produce(producer, &cfg, &stop, &log));
        let r = (|| {
            let until = Instant::now() + GIVE_UP;
            while count(&|x| x.partition == p && x.ok) < WARM_ACKS {
                anyhow::ensure!(
                    Instant::now() < until,
                    "no {WARM_ACKS} acks before the kill"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            // SAFETY: kill(2) on a pid checked above to be a member of this
            // cluster; no memory involved.
            anyhow::ensure!(
                unsafe { libc::kill(pid as i32, libc::SIGKILL) } == 0,
                "kill {pid}: {}",
                std::io::Error::last_os_error()
            );
            let killed = Instant::now();
            let first = loop {
                let first = log.lock().ok().and_then(|l| {
                    l.iter()
                        .filter(|x| x.partition == p && x.ok && x.pushed >= killed)
                        .map(|x| x.done)
                        .min()
                });
                if let Some(t) = first {
                    break Some(t);
                }
                if killed.elapsed() > GIVE_UP {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            Ok((killed, first))
        })();
        stop.store(true, Ordering::Release);
        r
    });
    let (killed, first) = outcome?;
    let log = log
        .into_inner()
        .map_err(|_| anyhow::anyhow!("log lock poisoned"))?;
    let failed_p = log.iter().filter(|x| x.partition == p && !x.ok).count();
    let failed_other = log.iter().filter(|x| x.partition != p && !x.ok).count();
    let last_before = log
        .iter()
        .filter(|x| x.partition == p && x.ok && x.done <= killed)
        .map(|x| x.done)
        .max();
    // Any push's acknowledgement, also of one pushed before the kill.
    let first_any = log
        .iter()
        .filter(|x| x.partition == p && x.ok && x.done > killed)
        .map(|x| x.done)
        .min();
    // When the failed pushes failed: right away (connection refused) or
    // after a wait (an append waiting on the dead leader).
    let failed_at = |pick: fn(Instant, Instant) -> Instant| {
        log.iter()
            .filter(|x| x.partition == p && !x.ok)
            .map(|x| x.done)
            .reduce(pick)
    };
    let after = d.describe(&cfg.topic)?.partitions[p as usize].clone();
    let ms =
        |t: Option<Instant>| t.map(|t| (t.saturating_duration_since(killed)).as_secs_f64() * 1e3);
    let failover_ms = ms(first);
    let out = serde_json::json!({
        "mode": "failover",
        "target": format!("strom://{}", group.display()),
        "topic": cfg.topic,
        "partitions": a.partitions,
        "replication_factor": a.replication_factor,
        "acks": a.acks,
        "idempotent": a.idempotent.unwrap_or(true),
        "durability": a.durability,
        "data_size": a.data_size,
        "partition": p,
        "killed_member": victim_member,
        "killed_pid": pid,
        "new_leader": after.member,
        "epoch": after.epoch,
        "failover_ms": failover_ms,
        "first_ack_any_push_ms": ms(first_any),
        "last_ack_before_kill_ms": last_before.map(|t| -(killed - t).as_secs_f64() * 1e3),
        "failed_pushes": failed_p,
        "first_failure_ms": ms(failed_at(Instant::min)),
        "last_failure_ms": ms(failed_at(Instant::max)),
        "failed_pushes_other_partitions": failed_other,
        "acked": log.iter().filter(|x| x.partition == p && x.ok).count(),
    });
    if a.json {
        println!("{out}");
    } else {
        match failover_ms {
            Some(ms) => println!(
                "failover: partition {p} (replication factor {}, acks {}): leader member \
                 {victim_member} (pid {pid}) SIGKILLed; first acknowledgement of a later push \
                 {ms:.0} ms after the kill; {failed_p} pushes failed there ({failed_other} on \
                 other partitions); now led by member {} in epoch {}",
                a.replication_factor, a.acks, after.member, after.epoch
            ),
            None => println!(
                "failover: partition {p}: no acknowledgement within {} s of the SIGKILL of member \
                 {victim_member} (pid {pid}); {failed_p} pushes failed",
                GIVE_UP.as_secs()
            ),
        }
    }
    anyhow::ensure!(first.is_some(), "partition {p} did not fail over");
    Ok(())
}
