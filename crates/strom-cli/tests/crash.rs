//! Crash tests against a real `strom server` process: every event whose
//! push future resolved Ok survives SIGKILL of the server, byte for byte and
//! in order; SIGTERM shuts down cleanly and keeps topics, events and
//! consumer offsets.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{event_payload, read_all, read_from, ReadResult, Rng, ServerProcess, Stored};
use strom_client::{ConsumerOptions, Durability, EventId, Next, PushFuture, StartPos, TopicSpec};

const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Asserts that every acknowledged event is in `got`, byte for byte, and
/// that one producer's acked events got increasing offsets per partition.
fn assert_acked_present(acked: &[(EventId, Stored)], got: &ReadResult) {
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for (id, want) in acked {
        if let Some(prev) = last.insert(id.partition, id.offset) {
            assert!(
                id.offset > prev,
                "partition {}: offset {} acked after {prev}",
                id.partition,
                id.offset
            );
        }
        let have = got
            .events
            .get(&(id.partition, id.offset))
            .unwrap_or_else(|| {
                panic!(
                    "acked event {}/{} is missing after the restart (partition holds {}..{})",
                    id.partition, id.offset, got.start[&id.partition], got.end[&id.partition]
                )
            });
        assert_eq!(
            have.meta,
            want.meta,
            "metadata of acked event {}/{} changed: {:?} vs {:?}",
            id.partition,
            id.offset,
            String::from_utf8_lossy(&have.meta),
            String::from_utf8_lossy(&want.meta)
        );
        assert!(
            have.data == want.data,
            "data of acked event {}/{} changed ({} bytes stored, {} acked)",
            id.partition,
            id.offset,
            have.data.len(),
            want.data.len()
        );
    }
}

fn acked_events_survive_kill_9(durability: Durability) {
    const EVENTS: u64 = 2000;
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec {
            durability,
            ..TopicSpec::new("crash", 2)
        })
        .expect("creating the topic");
    let producer = topic.producer().expect("producer");
    let mut pending: Vec<(PushFuture, Stored)> = Vec::new();
    for i in 0..EVENTS {
        let (meta, data) = event_payload("kill9", i);
        let f = producer
            .push(meta.clone(), data.clone())
            .expect("push accepted");
        pending.push((f, Stored { meta, data }));
    }
    let acked: Vec<(EventId, Stored)> = pending
        .into_iter()
        .map(|(f, s)| {
            let id = f
                .wait_timeout(Some(Duration::from_secs(60)))
                .expect("every push is acknowledged");
            (id, s)
        })
        .collect();
    assert!(
        acked.iter().any(|(id, _)| id.partition == 0)
            && acked.iter().any(|(id, _)| id.partition == 1),
        "round-robin spreads events over both partitions"
    );

    server.kill9();
    drop(producer);
    drop(topic);
    drop(driver);

    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let got = read_all(&driver, "crash", "after-kill", READ_TIMEOUT);
    assert_acked_present(&acked, &got);
    assert_eq!(
        got.len() as u64,
        EVENTS,
        "exactly the produced events are stored"
    );
    assert!(got.start.values().all(|s| *s == 0));
}

#[test]
fn acked_events_survive_kill_9_with_always() {
    acked_events_survive_kill_9(Durability::Always);
}

#[test]
fn acked_events_survive_kill_9_with_never() {
    acked_events_survive_kill_9(Durability::Never);
}

/// One producer pushing `mid` events numbered from `first` until the
/// server dies; kills the server after a random number of acks. Returns the
/// events acked before the kill, in push order.
fn push_until_killed(
    server: ServerProcess,
    driver: &strom_client::Driver,
    first: u64,
    rng: &mut Rng,
) -> Vec<(EventId, Stored)> {
    let producer = driver
        .open_topic("midstream")
        .expect("open")
        .producer()
        .expect("producer");
    let acked: Arc<Mutex<Vec<(u64, EventId)>>> = Arc::default();
    let acked_count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let pusher = {
        let (acked, acked_count, stop) = (acked.clone(), acked_count.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut pending: std::collections::VecDeque<(u64, PushFuture)> = Default::default();
            let mut failed = 0usize;
            let settle = |i: u64, f: PushFuture, failed: &mut usize| match f
                .wait_timeout(Some(Duration::from_secs(30)))
            {
                Ok(id) => {
                    acked.lock().unwrap().push((i, id));
                    acked_count.fetch_add(1, Ordering::Release);
                }
                Err(_) => *failed += 1,
            };
            let mut i = first;
            // Keep pushing until the test says stop (or push fails).
            while !stop.load(Ordering::Acquire) {
                let (meta, data) = event_payload("mid", i);
                match producer.push(meta, data) {
                    Ok(f) => pending.push_back((i, f)),
                    Err(_) => break,
                }
                i += 1;
                while pending.front().is_some_and(|(_, f)| f.is_done()) || pending.len() > 4096 {
                    let (j, f) = pending.pop_front().expect("non-empty");
                    settle(j, f, &mut failed);
                }
            }
            for (j, f) in pending {
                settle(j, f, &mut failed);
            }
            drop(producer);
            let _ = done_tx.send((i - first, failed));
        })
    };

    // Kill after a random number of acks, at a random moment.
    let threshold = 100 + rng.below(1500) as usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked_count.load(Ordering::Acquire) < threshold {
        assert!(
            Instant::now() < deadline,
            "only {} acks within 60 s",
            acked_count.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(rng.below(30)));
    server.kill9();
    // Pushing may go on failing batch by batch; stop it and settle what
    // is pending. Only the server could have resolved a future Ok, so every
    // Ok seen now was acknowledged before the kill.
    stop.store(true, Ordering::Release);
    let (pushed, failed) = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the producer thread settled its futures within 60 s");
    pusher.join().expect("producer thread");
    let acked: Vec<(u64, EventId)> = std::mem::take(&mut *acked.lock().unwrap());
    eprintln!(
        "pushed {pushed}, acked {} before the kill, {failed} failed",
        acked.len()
    );
    assert!(acked.len() >= threshold);
    // Futures were settled first in, first out: this is push order.
    acked
        .into_iter()
        .map(|(i, id)| {
            let (meta, data) = event_payload("mid", i);
            (id, Stored { meta, data })
        })
        .collect()
}

#[test]
fn kill_9_mid_stream_loses_no_acked_event() {
    const ROUNDS: u64 = 3;
    let mut rng = Rng::from_time();
    let base = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(base.path());
    let mut driver = server.connect();
    driver
        .create_topic(TopicSpec::new("midstream", 2))
        .expect("creating the topic");
    let mut all_acked: Vec<(EventId, Stored)> = Vec::new();
    let mut got = None;
    for round in 0..ROUNDS {
        let acked = push_until_killed(server, &driver, round * 1_000_000, &mut rng);
        all_acked.extend(acked);
        drop(driver);

        server = ServerProcess::start(base.path());
        driver = server.connect();
        let read = read_all(
            &driver,
            "midstream",
            &format!("after-kill-{round}"),
            READ_TIMEOUT,
        );
        // Every acked event of every round so far.
        assert_acked_present(&all_acked, &read);
        // Whatever else survived is an event that was pushed, intact.
        for ((p, o), s) in &read.events {
            let v: serde_json::Value =
                serde_json::from_slice(&s.meta).unwrap_or_else(|e| panic!("event {p}/{o}: {e}"));
            let i = v["i"].as_u64().expect("an event of ours");
            let (meta, data) = event_payload("mid", i);
            assert!(
                s.meta == meta && s.data == data,
                "event {p}/{o} is not intact"
            );
        }
        got = Some(read);
    }

    // Appending continues with dense offsets.
    let mut next = got.expect("at least one round").end;
    let producer = driver
        .open_topic("midstream")
        .expect("open")
        .producer()
        .expect("producer");
    for k in 0..10u64 {
        let id = producer
            .push(format!("{{\"after\":{k}}}").into_bytes(), ())
            .expect("push")
            .wait_timeout(Some(Duration::from_secs(30)))
            .expect("append after restart");
        let n = next.get_mut(&id.partition).expect("known partition");
        assert_eq!(id.offset, *n, "offsets stay dense after the restart");
        *n += 1;
    }
}

#[test]
fn sigterm_shuts_down_cleanly_and_keeps_data() {
    const EVENTS: u64 = 500;
    const CONSUMED: usize = 200;
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("term", 2))
        .expect("creating the topic");
    let producer = topic.producer().expect("producer");
    let futures: Vec<_> = (0..EVENTS)
        .map(|i| {
            let (meta, data) = event_payload("term", i);
            producer.push(meta, data).expect("push")
        })
        .collect();
    let mut produced = BTreeMap::new();
    for (i, f) in futures.into_iter().enumerate() {
        let id = f
            .wait_timeout(Some(Duration::from_secs(30)))
            .expect("acked");
        let (meta, data) = event_payload("term", i as u64);
        produced.insert((id.partition, id.offset), Stored { meta, data });
    }

    // Consume part of it under a name and ack, waiting for the commits.
    let consumer = topic
        .consumer_with(
            "reader",
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .expect("consumer");
    let mut acks = BTreeMap::new();
    for _ in 0..CONSUMED {
        match consumer
            .pull_timeout(Duration::from_secs(30))
            .expect("an event")
        {
            Next::Event(ev) => {
                acks.insert(ev.partition, (ev.offset, ev.ack()));
            }
            Next::EndOfStream => panic!("unexpected end of stream"),
        }
    }
    let mut committed = BTreeMap::new();
    for (p, (offset, ack)) in acks {
        ack.wait_timeout(Some(Duration::from_secs(30)))
            .expect("ack persisted");
        committed.insert(p, offset + 1);
    }

    // SIGTERM with clients still connected.
    let (status, stderr) = server.terminate(Duration::from_secs(15));
    assert!(
        status.success(),
        "strom server exited with {status} after SIGTERM; stderr:\n{stderr}"
    );
    drop(consumer);
    drop(producer);
    drop(topic);
    drop(driver);

    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let topics = driver.list_topics().expect("list");
    assert!(
        topics.iter().any(|t| t.spec.name == "term"),
        "the topic survives a clean shutdown"
    );
    let info = driver.describe("term").expect("describe");
    assert_eq!(info.partitions.len(), 2);
    let total: u64 = info.partitions.iter().map(|p| p.next_offset).sum();
    assert_eq!(total, EVENTS, "every event survives a clean shutdown");
    for (p, c) in &committed {
        let offsets = driver.consumer_offsets("term", *p).expect("offsets");
        assert!(
            offsets.contains(&("reader".to_string(), *c)),
            "partition {p}: committed offset {c} of 'reader' survives, found {offsets:?}"
        );
    }

    // Everything is there, byte for byte.
    let all = read_all(&driver, "term", "auditor", READ_TIMEOUT);
    assert_eq!(all.events, produced);

    // 'reader' resumes right after its last ack.
    let rest = read_from(&driver, "term", "reader", StartPos::Committed, READ_TIMEOUT);
    for p in 0..2u32 {
        assert_eq!(
            rest.start[&p],
            committed.get(&p).copied().unwrap_or(0),
            "partition {p} resumes after the last ack"
        );
    }
    assert_eq!(rest.len(), EVENTS as usize - CONSUMED);
    for (k, s) in &rest.events {
        assert_eq!(Some(s), produced.get(k), "event {k:?} intact");
    }
}
