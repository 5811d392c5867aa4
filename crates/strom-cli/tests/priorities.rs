//! Priorities (docs/quotas.md, "Priorities") against a real `strom
//! server`: bulk producers saturate the server while a small stream of
//! high-priority events is produced and consumed with its data; the
//! consumer's latency is measured without priorities, then with the
//! urgent topic at a high priority, in the same run. The numbers are
//! printed, not asserted (timings on a shared machine vary); the test
//! checks that both phases ran and that every urgent event arrived whole.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{wait_for, ServerProcess};
use strom_client::{Driver, Next, Overflow, PartitionType, TopicSpec};

const BULK_EVENT: usize = 256 << 10;
const BULK_PRODUCERS: u32 = 3;
/// Bytes each bulk partition keeps (memory, oldest dropped past it).
const BULK_KEPT: u64 = 32 << 20;
const URGENT_EVENT: usize = 4 << 10;
const PHASE: Duration = Duration::from_secs(2);

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Bulk producers, one connection each, pushing to their own partition
/// of `bulk` until `stop`; bytes pushed.
fn bulk(s: &ServerProcess, stop: Arc<AtomicBool>) -> Vec<thread::JoinHandle<u64>> {
    (0..BULK_PRODUCERS)
        .map(|i| {
            let d = s.connect();
            let stop = stop.clone();
            thread::spawn(move || {
                let p = d.open_topic("bulk").unwrap().producer().unwrap();
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    p.push_with("{}", vec![1u8; BULK_EVENT], Some(i), &[])
                        .expect("a bulk push");
                    sent += BULK_EVENT as u64;
                }
                p.flush().unwrap();
                sent
            })
        })
        .collect()
}

/// One phase: urgent events every 5 ms for `PHASE`, each read back with
/// its data by a consumer; the latencies in microseconds, sorted.
fn urgent_phase(d: &Driver, topic: &str) -> Vec<u64> {
    let t = d.open_topic(topic).unwrap();
    let c = t.consumer("reader").unwrap();
    let p = t.producer().unwrap();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut lat = Vec::new();
    while start.elapsed() < PHASE {
        p.push_with(
            format!("{{\"us\":{}}}", now_us()),
            vec![9u8; URGENT_EVENT],
            Some(0),
            &[],
        )
        .unwrap();
        p.flush().unwrap();
        sent += 1;
        match c
            .pull_timeout(Duration::from_secs(30))
            .expect("an urgent event")
        {
            Next::Event(ev) => {
                assert_eq!(ev.data_vec(), vec![9u8; URGENT_EVENT], "whole data");
                let meta: serde_json::Value = serde_json::from_slice(ev.raw()).unwrap();
                lat.push(now_us().saturating_sub(meta["us"].as_u64().unwrap()));
            }
            Next::EndOfStream => panic!("urgent ended"),
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(lat.len() as u64, sent, "every urgent event arrived");
    lat.sort_unstable();
    lat
}

fn pct(v: &[u64], q: f64) -> u64 {
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn enforced(s: &ServerProcess) -> u64 {
    let json = s.connect().server_snapshot_at(&s.addr).expect("a snapshot");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["quotas"]["version"].as_u64().unwrap_or(0)
}

#[test]
fn a_high_priority_consumer_latency_with_and_without_priorities_under_a_bulk_load() {
    let tmp = tempfile::tempdir().unwrap();
    let s = ServerProcess::start(tmp.path());
    let d = s.connect();
    // The bulk load moves gigabytes in a few seconds: a memory topic that
    // drops its oldest past 32 MiB a partition keeps it off the disk (a
    // file topic filled a CI machine's disk mid-run).
    let mut bulk_spec = TopicSpec::new("bulk", BULK_PRODUCERS);
    bulk_spec.partition_type = PartitionType::Memory;
    bulk_spec.overflow = Some(Overflow::DropOldest);
    bulk_spec.retention_bytes = Some(BULK_KEPT);
    d.create_topic(bulk_spec).unwrap();
    // One urgent topic per phase, so each phase's reader starts afresh.
    let mut open = Vec::new();
    for t in ["urgent.0", "urgent.1"] {
        d.create_topic(TopicSpec::new(t, 1)).unwrap();
        open.push(d.open_topic(t).unwrap().producer().unwrap());
    }
    let mut results = Vec::new();
    for (phase, priority) in [("without priorities", false), ("with priorities", true)] {
        if priority {
            let before = enforced(&s);
            let out = s.cli(
                &[
                    "quota",
                    "set",
                    "--topic-prefix",
                    "urgent.",
                    "--priority",
                    "100",
                ],
                "",
                Duration::from_secs(20),
            );
            assert!(out.status.success(), "{}", out.stderr);
            wait_for("the priority to be enforced", || enforced(&s) > before);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let producers = bulk(&s, stop.clone());
        let started = Instant::now();
        let lat = urgent_phase(&d, &format!("urgent.{}", u8::from(priority)));
        stop.store(true, Ordering::Relaxed);
        let bytes: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{phase}: urgent events {}, latency p50 {} us, p99 {} us, max {} us; bulk {:.1} MiB/s",
            lat.len(),
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            lat[lat.len() - 1],
            bytes as f64 / secs / (1 << 20) as f64
        );
        assert!(lat.len() >= 20, "{phase}: only {} urgent events", lat.len());
        assert!(bytes > 0, "{phase}: the bulk producers pushed nothing");
        results.push(pct(&lat, 0.99));
    }
    eprintln!(
        "p99 of the urgent consumer: {} us without priorities, {} us with",
        results[0], results[1]
    );
}
