//! Replicated partitions on three real `strom server` processes
//! (docs/replication.md): a topic with replication factor 3 under a
//! producer with `acks=all` while the leader of a partition is killed with
//! SIGKILL, or paused with SIGSTOP until it is replaced and then resumed.
//! Every acknowledged event is read back exactly once, at the offset its
//! acknowledgement named, in push order per partition; the producer carries
//! on after the failover, and, idempotent, resends what the failover cut
//! off so that no push fails and none is stored twice; the copies are byte for byte the same on every
//! replica; and what a consumer saw during the run is what the final log
//! holds (nothing it saw vanished or changed).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::replicated::*;
use common::{member_id, read_all, wait_for};
use strom_client::{ConsumerOptions, Driver, ErrorCode, Next, StartPos, TopicSpec};
use strom_proto::PartitionType;

/// The base offset of a `Produced` answer.
fn offset_of(r: strom_proto::Response) -> u64 {
    match r {
        strom_proto::Response::Produced { base_offset, .. } => base_offset,
        other => panic!("expected Produced, got {other:?}"),
    }
}

#[test]
fn acked_events_survive_sigkill_of_a_partition_leader() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let p = led_by_member_1(&g.d);
    let r = run(&g);
    wait_for("acks on the partition", || r.acked_on(p) >= 50);
    let (proc1, dir1) = g.joined.remove(&1).unwrap();
    let killed = Instant::now();
    drop(proc1);
    wait_for("a new leader", || leader(&g.d, p).0 != 1);
    let (new, epoch) = leader(&g.d, p);
    assert!(epoch >= 2, "the epoch moved on");
    let before = r.acked_on(p);
    wait_for("acks on the partition after the failover", || {
        r.acked_on(p) > before + 30
    });
    let first_after = r
        .history
        .lock()
        .unwrap()
        .acked
        .iter()
        .filter(|a| a.1 == p && a.3 > killed)
        .map(|a| a.3)
        .min()
        .unwrap();
    eprintln!(
        "partition {p}: member {new} leads in epoch {epoch}; the producer's first ack there came {:?} after the SIGKILL",
        first_after - killed
    );
    // Member 1 comes back, follows, catches up and is in sync again.
    let back = g.zero.join_member(&dir1, &[], Stdio::null());
    g.joined.insert(1, (back, dir1));
    wait_for("member 1 back in sync", || all_in_sync(&g.d));
    std::thread::sleep(Duration::from_millis(500));
    // The idempotent producer resent what the failover cut off.
    finish_without_failures(&g, r);
    wait_for("every copy caught up", || {
        std::thread::sleep(Duration::from_millis(300));
        all_in_sync(&g.d)
    });
    group_copies_are_the_same(&g);
}

#[test]
fn a_paused_leader_is_replaced_and_its_stale_tail_never_seen() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let p = led_by_member_1(&g.d);
    let r = run(&g);
    wait_for("acks on the partition", || r.acked_on(p) >= 50);
    let pid = g.joined[&1].0 .0.id() as i32;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    wait_for("a new leader", || leader(&g.d, p).0 != 1);
    let before = r.acked_on(p);
    wait_for("acks after the failover", || r.acked_on(p) > before + 30);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    wait_for("the old leader back in sync as a follower", || {
        all_in_sync(&g.d)
    });
    std::thread::sleep(Duration::from_millis(500));
    finish_without_failures(&g, r);
    let _ = &mut g;
}

/// Memory partitions replicate too, and a named consumer's committed
/// offset is copied with the log: after its leader's SIGKILL, the
/// consumer resumes on the new leader where it committed.
#[test]
fn memory_copies_and_committed_offsets_survive_a_failover() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start_with(tmp.path(), PartitionType::Memory);
    let p = led_by_member_1(&g.d);
    let t = g.d.open_topic(TOPIC).unwrap();
    let producer = t.producer().unwrap();
    let acked: Vec<_> = (0..60u64)
        .map(|i| {
            producer
                .push_with(format!("{{\"i\":{i}}}"), vec![i as u8; 64], Some(p), &[])
                .unwrap()
        })
        .collect();
    producer.flush().unwrap();
    for f in acked {
        f.wait().expect("an acks=all push");
    }
    let only_p = |start| ConsumerOptions {
        partitions: Some(vec![p]),
        start,
        ..Default::default()
    };
    let reader = t
        .consumer_with("reader", only_p(StartPos::Beginning))
        .unwrap();
    for _ in 0..20 {
        match reader.pull_timeout(Duration::from_secs(10)).unwrap() {
            Next::Event(e) => e.ack().wait().unwrap(),
            Next::EndOfStream => panic!("the stream has not ended"),
        }
    }
    drop(reader);
    // The followers copy the offset with their next fetch.
    std::thread::sleep(Duration::from_secs(1));
    let (proc1, _) = g.joined.remove(&1).unwrap();
    drop(proc1);
    wait_for("a new leader", || leader(&g.d, p).0 != 1);
    let again = t
        .consumer_with("reader", only_p(StartPos::Committed))
        .unwrap();
    match again.pull_timeout(Duration::from_secs(20)).unwrap() {
        Next::Event(e) => assert_eq!(e.offset, 20, "resumes where it committed"),
        Next::EndOfStream => panic!("the stream has not ended"),
    }
    let mut n = 1;
    while let Ok(Next::Event(_)) = again.pull_timeout(Duration::from_secs(2)) {
        n += 1;
    }
    assert_eq!(n, 40, "the rest of the partition is on the new leader");
}

/// The registry asks members for offsets without holding its lock: while
/// a listing waits for a paused member, other registry requests go on.
#[test]
fn a_paused_member_does_not_hold_up_the_registry() {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let pid = g.joined[&1].0 .0.id() as i32;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let d = Driver::connect(&g.zero.group_file).unwrap();
    let listing = std::thread::spawn(move || d.list_topics().map(|t| t.len()));
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    g.d.create_topic_on(TopicSpec::new("beside", 1), Some(2))
        .expect("creating a topic on a live member");
    let took = t.elapsed();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert_eq!(listing.join().unwrap().expect("the listing"), 1);
    assert!(
        took < Duration::from_millis(2500),
        "creating a topic waited {took:?} behind a listing that waits for a paused member"
    );
}

/// Pushes events `from..from + 30` to partition `p` with `acks=all`
/// through a fresh topic handle (placement as the registry has it now).
fn push_30(d: &Driver, p: u32, from: u64) -> Vec<strom_client::Result<strom_client::EventId>> {
    let producer = d.open_topic(TOPIC).unwrap().producer().unwrap();
    let fs: Vec<_> = (from..from + 30)
        .map(|i| producer.push_with(format!("{{\"i\":{i}}}"), vec![i as u8; 64], Some(p), &[]))
        .collect();
    let _ = producer.flush();
    fs.into_iter().map(|f| f.and_then(|f| f.wait())).collect()
}

/// A leader killed and restarted (on another port) before the registry
/// failed it over hands its partitions over at once: its first join since
/// it started takes it out of every ISR, an in-sync follower leads in the
/// next epoch, and it follows and catches up. With memory partitions,
/// which a restart empties, nothing acknowledged is lost (before, it led
/// again in its epoch with an empty log, and its followers cut theirs).
fn restarted_leader_hands_over(kind: PartitionType) {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start_with(tmp.path(), kind);
    let p = led_by_member_1(&g.d);
    assert!(push_30(&g.d, p, 0).iter().all(|r| r.is_ok()));
    let (proc1, dir1) = g.joined.remove(&1).unwrap();
    drop(proc1);
    let back = g.zero.join_member(&dir1, &[], Stdio::null());
    g.joined.insert(1, (back, dir1));
    wait_for("member 1 back", || common::live_members(&g.d) == 3);
    wait_for("an in-sync follower leads", || leader(&g.d, p).0 != 1);
    assert_eq!(leader(&g.d, p).1, 2, "one failover, to the next epoch");
    let deadline = Instant::now() + WAIT;
    while !push_30(&g.d, p, 1_000).iter().all(|r| r.is_ok()) {
        assert!(Instant::now() < deadline, "acks=all pushes kept failing");
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_for("member 1 back in sync", || all_in_sync(&g.d));
    let stored = read_all(&g.d, TOPIC, "check", WAIT).events;
    let on_p: Vec<u64> = stored
        .iter()
        .filter(|((q, _), _)| *q == p)
        .map(|(_, e)| seq_of(&e.meta))
        .filter(|s| *s < 30)
        .collect();
    assert_eq!(
        on_p,
        (0..30).collect::<Vec<_>>(),
        "the events acknowledged before the restart"
    );
}

#[test]
fn a_leader_restarted_before_its_failover_hands_over_at_once() {
    restarted_leader_hands_over(PartitionType::File);
}

#[test]
fn a_replicated_memory_topic_without_a_metadata_quorum_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let spec = TopicSpec {
        replication_factor: 3,
        partition_type: PartitionType::Memory,
        ..TopicSpec::new("mem", 1)
    };
    let e = g.d.create_topic(spec).err().expect("refused");
    assert_eq!(e.code(), ErrorCode::INVALID_TOPIC_SPEC, "{e}");
    assert!(e.to_string().contains("--meta-voters 3"), "{e}");
    assert!(g.d.describe("mem").is_err(), "nothing was created");
}

#[test]
fn a_memory_leader_restarted_empty_loses_nothing_acknowledged() {
    restarted_leader_hands_over(PartitionType::Memory);
}

/// Where partition `p`'s leader listens.
fn leader_addr(d: &Driver, p: u32) -> String {
    d.describe(TOPIC).unwrap().partitions[p as usize]
        .addr
        .clone()
}

#[test]
fn a_batch_resent_to_the_new_leader_is_stored_once() {
    use common::raw::produce_stamped;
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let p = led_by_member_1(&g.d);
    let send =
        |addr: &str, seq: u32| produce_stamped(addr, TOPIC, p, 9, seq, &format!("{{\"i\":{seq}}}"));
    let old = leader_addr(&g.d, p);
    let first = offset_of(send(&old, 0));
    let second = offset_of(send(&old, 1));
    // Both are on every in-sync copy once a consumer may read them.
    wait_for("the batches replicated", || {
        read_all(&g.d, TOPIC, "probe", Duration::from_secs(2)).len() == 2
    });
    let (proc1, _dir1) = g.joined.remove(&1).unwrap();
    drop(proc1);
    wait_for("a new leader", || leader(&g.d, p).0 != 1);
    // The answer to batch 1 was "lost": the producer resends it there.
    let new = leader_addr(&g.d, p);
    assert_eq!(
        offset_of(send(&new, 1)),
        second,
        "the resent batch kept its offset"
    );
    assert_eq!(offset_of(send(&new, 2)), second + 1);
    let stored = read_all(&g.d, TOPIC, "check", WAIT).events;
    let seqs: Vec<u64> = stored.values().map(|e| seq_of(&e.meta)).collect();
    assert_eq!(seqs, [0, 1, 2], "each batch once, in order");
    assert_eq!(stored.keys().next(), Some(&(p, first)));
}

/// A dead member replaced by a server on an empty data dir that takes its
/// id (`--member-id`) copies again every replica the dead one held: the
/// copies end byte for byte the same, while the producer carries on.
#[test]
fn a_replaced_member_copies_its_replicas_again() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let r = run(&g);
    wait_for("acks on every partition", || {
        (0..PARTITIONS).all(|p| r.acked_on(p) >= 30)
    });
    let (proc1, dir1) = g.joined.remove(&1).unwrap();
    drop(proc1);
    std::fs::remove_dir_all(&dir1).unwrap();
    let fresh = tmp.path().join("m1-replacement");
    let back = g
        .zero
        .join_member(&fresh, &["--member-id", "1"], Stdio::null());
    wait_for("the replacement joined as member 1", || {
        member_id(&fresh) == Some(1)
    });
    g.joined.insert(1, (back, fresh));
    wait_for("the replacement in sync everywhere", || all_in_sync(&g.d));
    std::thread::sleep(Duration::from_millis(500));
    finish_without_failures(&g, r);
    group_copies_are_the_same(&g);
}

/// Batches a leader acknowledged alone (acks=leader) and then lost with
/// it leave a gap in the producer's sequence on the new leader: a plain
/// next batch is refused as out of order, and the sequence restart the
/// producer puts on its first resend is taken (it used to refuse every
/// later batch until the producer gave up).
#[test]
fn a_sequence_restart_skips_batches_lost_with_an_acks_leader_leader() {
    use common::raw::{produce_stamped, produce_with_stamp};
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let p = led_by_member_1(&g.d);
    let old = leader_addr(&g.d, p);
    offset_of(produce_stamped(&old, TOPIC, p, 9, 0, "{\"i\":0}"));
    wait_for("batch 0 replicated", || {
        read_all(&g.d, TOPIC, "probe", Duration::from_secs(2)).len() == 1
    });
    // The followers are paused: batch 1 is on the leader alone, answered.
    let followers = [g.zero.pid(), g.joined[&2].0 .0.id() as i32];
    for pid in followers {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    }
    // A fetch a follower sent before it stopped waits at the leader for up
    // to its long poll (500 ms), and would carry batch 1 into the stopped
    // follower's socket: let those fetches be answered empty first.
    std::thread::sleep(Duration::from_millis(800));
    offset_of(produce_stamped(&old, TOPIC, p, 9, 1, "{\"i\":1}"));
    let (proc1, _dir1) = g.joined.remove(&1).unwrap();
    drop(proc1);
    for pid in followers {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    }
    wait_for("a new leader", || leader(&g.d, p).0 != 1);
    let new = leader_addr(&g.d, p);
    match produce_stamped(&new, TOPIC, p, 9, 2, "{\"i\":2}") {
        strom_proto::Response::Error { code, .. } => {
            assert_eq!(code, ErrorCode::OUT_OF_ORDER_SEQUENCE)
        }
        other => panic!("batch 2 was taken although batch 1 is missing: {other:?}"),
    }
    let restart = strom_proto::ProducerStamp {
        producer: 9,
        sequence: 2,
        restart: true,
    };
    let at = offset_of(produce_with_stamp(&new, TOPIC, p, restart, "{\"i\":2}"));
    assert_eq!(at, 1, "batch 2 follows batch 0: batch 1 is gone");
    let seqs: Vec<u64> = read_all(&g.d, TOPIC, "check", WAIT)
        .events
        .values()
        .map(|e| seq_of(&e.meta))
        .collect();
    assert_eq!(seqs, [0, 2]);
}
