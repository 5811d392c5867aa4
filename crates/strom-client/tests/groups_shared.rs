//! Shared consumer groups (work queues): any member may receive any event,
//! each event goes to one member at a time and is acked on its own; events
//! not acked come back (nack, a member leaving, the visibility timeout)
//! with a delivery count, poison events end in the dead-letter topic, and
//! a restart redelivers exactly what was not acked.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use strom_client::{
    Driver, Event, GroupOptions, Next, PartitionType, ProducerOptions, Topic, TopicSpec,
};

fn topic(d: &Driver, name: &str, partitions: u32, kind: PartitionType) -> Topic {
    d.create_topic(TopicSpec {
        partition_type: kind,
        ..TopicSpec::new(name, partitions)
    })
    .unwrap()
}

/// Produces `n` events `{"i": i}` with `data_len` bytes of data each
/// (byte value `i % 251`), in batches of up to 100, then closes.
fn produce(t: &Topic, n: u32, data_len: usize) {
    let p = t
        .producer_with(ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .unwrap();
    let mut futs = Vec::new();
    for i in 0..n {
        futs.push(
            p.push(format!("{{\"i\":{i}}}"), vec![(i % 251) as u8; data_len])
                .unwrap(),
        );
        if i % 100 == 99 {
            p.flush().unwrap();
        }
    }
    for f in futs {
        f.wait().unwrap();
    }
    p.close().unwrap();
}

/// Opens the embedded server again once the previous one released the
/// directory: its last driver reference may go away on one of its own
/// background tasks, shortly after the test dropped its handles.
fn reopen(dir: &std::path::Path) -> Driver {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match Driver::embedded(dir) {
            Ok(d) => return d,
            Err(e)
                if e.code() == strom_client::ErrorCode::DATA_DIR_LOCKED
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("reopening: {e}"),
        }
    }
}

fn index(e: &Event) -> u64 {
    e.json().unwrap()["i"].as_u64().unwrap()
}

fn shared(prefetch: u32) -> GroupOptions {
    let mut o = GroupOptions::shared();
    o.consumer.prefetch = prefetch;
    o
}

#[test]
fn every_event_goes_to_one_member_and_out_of_order_acks_resolve_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "tasks", 2, PartitionType::File);
    produce(&t, 600, 16);
    let workers: Vec<_> = (0..3)
        .map(|_| t.consumer_group("g", shared(16)).unwrap())
        .collect();
    let results: Vec<Vec<(u32, u64, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut seen = Vec::new();
                    while let Some(batch) = c.pull_many(10, Duration::from_secs(20)).unwrap() {
                        // Ack out of order: last first.
                        let mut acks = Vec::new();
                        for e in batch.iter().rev() {
                            assert_eq!(e.deliveries(), 1, "no member died, none timed out");
                            assert_eq!(e.data(), &vec![(index(e) % 251) as u8; 16][..]);
                            seen.push((e.partition, e.offset, index(e)));
                            acks.push(e.ack());
                        }
                        for a in acks {
                            a.wait().unwrap();
                        }
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = results.iter().flatten().map(|r| r.2).collect();
    all.sort_unstable();
    assert_eq!(all, (0..600).collect::<Vec<_>>(), "each event exactly once");
    assert!(
        results.iter().all(|r| !r.is_empty()),
        "every member got work: {:?}",
        results.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let info = d.describe_group("g").unwrap();
    assert_eq!(info.partitions.len(), 2);
    for p in &info.partitions {
        assert_eq!(p.committed, p.next_offset, "floor at the end: {p:?}");
        assert_eq!((p.pending, p.redelivered), (0, 0));
    }
    assert_eq!(info.consumers.len(), 3);
}

#[test]
fn a_batch_is_shared_between_members_and_data_lands_with_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "one-batch", 1, PartitionType::Memory);
    // One batch of 40 events; each member may hold 8 at a time.
    let p = t.producer().unwrap();
    let futs: Vec<_> = (0..40u32)
        .map(|i| {
            p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 100 + i as usize])
                .unwrap()
        })
        .collect();
    p.flush().unwrap();
    for f in futs {
        f.wait().unwrap();
    }
    let a = t.consumer_group("split", shared(8)).unwrap();
    let b = t.consumer_group("split", shared(8)).unwrap();
    let mut got = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < 40 && std::time::Instant::now() < deadline {
        for c in [&a, &b] {
            for e in c.pull_many(8, Duration::from_millis(50)).unwrap().unwrap() {
                let i = index(&e);
                assert_eq!(e.data(), &vec![i as u8; 100 + i as usize][..], "event {i}");
                e.ack().wait().unwrap();
                assert!(got.insert(i, c.member_id()).is_none(), "event {i} twice");
            }
        }
    }
    assert_eq!(got.len(), 40);
    let members: BTreeSet<_> = got.values().collect();
    assert_eq!(members.len(), 2, "both members got part of the one batch");
}

#[test]
fn nack_and_a_departing_member_redeliver_with_a_higher_count() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "redeliver", 1, PartitionType::File);
    produce(&t, 20, 0);
    let a = t.consumer_group("g", shared(10)).unwrap();
    let first = match a.pull_timeout(Duration::from_secs(10)).unwrap() {
        Next::Event(e) => e,
        Next::EndOfStream => panic!("ended early"),
    };
    first.nack().wait().unwrap();
    // `a` also holds 9 prefetched events it never pulls; it leaves.
    let again = match a.pull_timeout(Duration::from_secs(10)).unwrap() {
        Next::Event(e) => e,
        Next::EndOfStream => panic!("ended early"),
    };
    drop(again);
    drop(a);
    let b = t.consumer_group("g", shared(100)).unwrap();
    let mut counts = BTreeMap::new();
    while let Some(batch) = b.pull_many(100, Duration::from_secs(10)).unwrap() {
        for e in batch {
            counts.insert(index(&e), e.deliveries());
            e.ack().wait().unwrap();
        }
    }
    assert_eq!(counts.len(), 20, "every event reached the survivor");
    assert!(counts[&0] >= 2, "the nacked event came back: {counts:?}");
    let redelivered = counts.values().filter(|c| **c >= 2).count();
    assert!(
        redelivered >= 10,
        "what the departed member held came back with a count above 1: {counts:?}"
    );
    assert!(d.describe_group("g").unwrap().partitions[0].redelivered >= 10);
}

#[test]
fn an_event_not_acked_within_the_visibility_timeout_goes_to_another_member() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "slow", 1, PartitionType::Memory);
    produce(&t, 1, 0);
    let mut o = shared(1);
    o.visibility_timeout = Duration::from_millis(300);
    let a = t.consumer_group("g", o.clone()).unwrap();
    let held = match a.pull_timeout(Duration::from_secs(10)).unwrap() {
        Next::Event(e) => e,
        Next::EndOfStream => panic!("ended early"),
    };
    assert_eq!(held.deliveries(), 1);
    let b = t.consumer_group("g", o).unwrap();
    let e = match b.pull_timeout(Duration::from_secs(10)).unwrap() {
        Next::Event(e) => e,
        Next::EndOfStream => panic!("ended early"),
    };
    assert_eq!((e.offset, e.deliveries()), (0, 2));
    e.ack().wait().unwrap();
    // The stale holder may still ack: it is accepted, nothing breaks.
    held.ack().wait().unwrap();
    assert!(matches!(
        b.pull_timeout(Duration::from_secs(10)).unwrap(),
        Next::EndOfStream
    ));
}

#[test]
fn a_poison_event_lands_in_the_dead_letter_topic_after_max_deliveries() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "jobs", 1, PartitionType::File);
    produce(&t, 5, 8);
    let mut o = shared(4);
    o.max_deliveries = Some(3);
    let c = t.consumer_group("g", o).unwrap();
    let mut done = BTreeSet::new();
    let mut poison_seen = 0;
    while let Some(batch) = c.pull_many(4, Duration::from_secs(10)).unwrap() {
        for e in batch {
            if index(&e) == 2 {
                poison_seen += 1;
                e.nack().wait().unwrap();
            } else {
                done.insert(index(&e));
                e.ack().wait().unwrap();
            }
        }
    }
    assert_eq!(done, BTreeSet::from([0, 1, 3, 4]));
    assert_eq!(
        poison_seen, 3,
        "delivered max_deliveries times, then no more"
    );
    let dlq = d.open_topic("jobs.g.dlq").unwrap();
    let r = dlq
        .consumer_with(
            "inspect",
            strom_client::ConsumerOptions {
                start: strom_client::StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    let dead = match r.pull_timeout(Duration::from_secs(10)).unwrap() {
        Next::Event(e) => e,
        Next::EndOfStream => panic!("no dead letter"),
    };
    let env = dead.json().unwrap();
    assert_eq!(env["deliveries"], 3);
    assert_eq!(env["offset"], 2);
    assert_eq!(env["group"], "g");
    assert_eq!(env["metadata"]["i"], 2);
    assert_eq!(dead.data(), &[2u8; 8]);
    assert_eq!(
        d.describe_group("g").unwrap().partitions[0].dead_lettered,
        1
    );
}

#[test]
fn a_restart_redelivers_exactly_what_was_not_acked() {
    let dir = tempfile::tempdir().unwrap();
    let acked: BTreeSet<u64> = {
        let d = Driver::embedded(dir.path()).unwrap();
        let t = topic(&d, "durable", 1, PartitionType::File);
        produce(&t, 100, 4);
        let c = t.consumer_group("g", shared(50)).unwrap();
        let mut acked = BTreeSet::new();
        // Ack the odd events of the first 50 only.
        let batch = c.pull_many(50, Duration::from_secs(10)).unwrap().unwrap();
        for e in batch.iter().filter(|e| index(e) % 2 == 1) {
            e.ack().wait().unwrap();
            acked.insert(index(e));
        }
        acked
    };
    let d = reopen(dir.path());
    let t = d.open_topic("durable").unwrap();
    let c = t.consumer_group("g", shared(100)).unwrap();
    let mut again = BTreeSet::new();
    while let Some(batch) = c.pull_many(100, Duration::from_secs(10)).unwrap() {
        for e in batch {
            assert!(
                !acked.contains(&index(&e)),
                "acked event {} came back",
                index(&e)
            );
            assert!(again.insert(index(&e)), "event {} twice", index(&e));
            e.ack().wait().unwrap();
        }
    }
    let expected: BTreeSet<u64> = (0..100).filter(|i| !acked.contains(i)).collect();
    assert_eq!(again, expected, "nothing unacked was lost");
}

#[test]
fn a_member_sees_a_lost_connection_not_a_deleted_group_when_its_server_stops() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "stopping", 1, PartitionType::File);
    produce(&t, 20, 0);
    let remote = Driver::connect_addr(&d.master_addr()).unwrap();
    let c = remote
        .open_topic("stopping")
        .unwrap()
        .consumer_group("g", shared(4))
        .unwrap();
    assert!(matches!(
        c.pull_timeout(Duration::from_secs(10)).unwrap(),
        Next::Event(_)
    ));
    drop(t);
    drop(d); // a clean shutdown of the server
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match c.pull_timeout(Duration::from_millis(100)) {
            Ok(_) => {}
            Err(e) => assert_ne!(
                e.code(),
                strom_client::ErrorCode::CONSUMER_GROUP_NOT_FOUND,
                "a stopping server is not a deleted group: {e}"
            ),
        }
    }
}
