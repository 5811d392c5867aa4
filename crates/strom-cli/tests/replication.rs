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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{member_id, read_all, wait_for, JoinedMember, ServerProcess};
use strom_client::{ConsumerOptions, Driver, ErrorCode, Next, PushFuture, StartPos, TopicSpec};
use strom_proto::PartitionType;

const TOPIC: &str = "replicated";
const PARTITIONS: u32 = 3;
const WAIT: Duration = Duration::from_secs(30);

struct Group {
    zero: ServerProcess,
    /// member id -> (process, data dir)
    joined: BTreeMap<u32, (JoinedMember, PathBuf)>,
    d: Driver,
}

fn start(base: &Path) -> Group {
    start_with(base, PartitionType::File)
}

fn start_with(base: &Path, kind: PartitionType) -> Group {
    let zero = ServerProcess::start(&base.join("m0"));
    let mut joined = BTreeMap::new();
    for i in 1..=2 {
        let dir = base.join(format!("m{i}"));
        let p = zero.join_member(&dir, &[], Stdio::null());
        wait_for("the member's id", || member_id(&dir).is_some());
        joined.insert(member_id(&dir).unwrap(), (p, dir));
    }
    let d = zero.connect();
    wait_for("three live members", || common::live_members(&d) == 3);
    let spec = TopicSpec {
        replication_factor: 3,
        partition_type: kind,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the replicated topic");
    Group { zero, joined, d }
}

/// What the producer saw: acked `(seq, partition, offset, when)`, and the
/// seqs that failed.
#[derive(Default)]
struct History {
    acked: Vec<(u64, u32, u64, Instant)>,
    failed: Vec<u64>,
}

/// Pushes `seq` to partition `seq % PARTITIONS` until `stop`, waiting for
/// each window of acknowledgements.
fn produce(d: Driver, stop: Arc<AtomicBool>, out: Arc<Mutex<History>>) {
    let t = d.open_topic(TOPIC).unwrap();
    let p = t.producer().unwrap();
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut window: Vec<(u64, Option<PushFuture>)> = Vec::new();
        for _ in 0..12 {
            let meta = format!("{{\"i\":{seq}}}");
            let part = (seq % u64::from(PARTITIONS)) as u32;
            window.push((
                seq,
                p.push_with(meta, vec![seq as u8; 64], Some(part), &[]).ok(),
            ));
            seq += 1;
        }
        let _ = p.flush();
        for (s, f) in window {
            let r = f.map(|f| f.wait());
            let mut h = out.lock().unwrap();
            match r {
                Some(Ok(id)) => h.acked.push((s, id.partition, id.offset, Instant::now())),
                _ => h.failed.push(s),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a consumer saw at each offset: (partition, offset) -> metadata.
type Seen = Arc<Mutex<BTreeMap<(u32, u64), Vec<u8>>>>;

/// Follows the topic from the beginning until `stop`, recording what it
/// saw at each offset.
fn watch(d: Driver, stop: Arc<AtomicBool>, seen: Seen) {
    let t = d.open_topic(TOPIC).unwrap();
    let c = t
        .consumer_with(
            "watcher",
            strom_client::ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    while !stop.load(Ordering::Acquire) {
        match c.pull_timeout(Duration::from_millis(200)) {
            Ok(Next::Event(e)) => {
                seen.lock()
                    .unwrap()
                    .insert((e.partition, e.offset), e.raw().to_vec());
            }
            Ok(Next::EndOfStream) => return,
            Err(e) if e.code() == ErrorCode::TIMEOUT => {}
            // A partition's owner died: the consumer follows the new one.
            Err(_) => {}
        }
    }
}

fn seq_of(meta: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(meta).expect("JSON metadata");
    v["i"].as_u64().expect("a sequence number")
}

/// The checks every run ends with.
fn check(g: &Group, h: &History, seen: &BTreeMap<(u32, u64), Vec<u8>>) {
    let stored = read_all(&g.d, TOPIC, "check", WAIT).events;
    let mut by_seq: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for ((p, o), ev) in &stored {
        let s = seq_of(&ev.meta);
        assert!(
            by_seq.insert(s, (*p, *o)).is_none(),
            "event {s} is stored twice"
        );
        assert_eq!(ev.data, vec![s as u8; 64], "data of event {s}");
    }
    for (s, p, o, _) in &h.acked {
        assert_eq!(
            by_seq.get(s),
            Some(&(*p, *o)),
            "acknowledged event {s} is not at {p}/{o}"
        );
    }
    for p in 0..PARTITIONS {
        let seqs: Vec<u64> = stored
            .iter()
            .filter(|((q, _), _)| *q == p)
            .map(|(_, ev)| seq_of(&ev.meta))
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of push order"
        );
    }
    for (at, meta) in seen {
        let now = stored.get(at).map(|e| &e.meta);
        assert_eq!(
            now,
            Some(meta),
            "a consumer saw {at:?} as something the log no longer holds"
        );
    }
    eprintln!(
        "{} acked, {} failed, {} stored, {} seen by the watcher",
        h.acked.len(),
        h.failed.len(),
        stored.len(),
        seen.len()
    );
}

/// Every replica's copy of each partition holds the same bytes.
fn same_copies(dirs: &[PathBuf]) {
    for p in 0..PARTITIONS {
        let logs: Vec<Vec<u8>> = dirs
            .iter()
            .map(|d| {
                let topic = std::fs::read_dir(d.join("topics"))
                    .unwrap()
                    .filter_map(|e| e.ok())
                    .find(|e| e.file_name().to_string_lossy().starts_with(TOPIC))
                    .expect("the topic's directory")
                    .path();
                let mut all = Vec::new();
                let mut files: Vec<PathBuf> = std::fs::read_dir(topic.join(p.to_string()))
                    .unwrap()
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|f| f.extension().is_some_and(|x| x == "log" || x == "data"))
                    .collect();
                files.sort();
                for f in files {
                    all.extend(std::fs::read(f).unwrap());
                }
                all
            })
            .collect();
        assert!(
            logs.windows(2).all(|w| w[0] == w[1]),
            "partition {p}: the replicas' files differ"
        );
    }
}

/// The member leading partition `p`, and the epoch.
fn leader(d: &Driver, p: u32) -> (u32, u64) {
    let info = d.describe(TOPIC).unwrap();
    let part = &info.partitions[p as usize];
    (part.member, part.epoch)
}

struct Run {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    seen: Seen,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn run(g: &Group) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let pd = Driver::connect(&g.zero.group_file).unwrap();
    let wd = Driver::connect(&g.zero.group_file).unwrap();
    let (s1, s2, h, w) = (stop.clone(), stop.clone(), history.clone(), seen.clone());
    let threads = vec![
        std::thread::spawn(move || produce(pd, s1, h)),
        std::thread::spawn(move || watch(wd, s2, w)),
    ];
    Run {
        stop,
        history,
        seen,
        threads,
    }
}

impl Run {
    fn acked_on(&self, p: u32) -> usize {
        self.history
            .lock()
            .unwrap()
            .acked
            .iter()
            .filter(|a| a.1 == p)
            .count()
    }

    fn finish(self) -> (History, BTreeMap<(u32, u64), Vec<u8>>) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().unwrap();
        }
        let h = std::mem::take(&mut *self.history.lock().unwrap());
        let s = std::mem::take(&mut *self.seen.lock().unwrap());
        (h, s)
    }
}

/// Every member's copy of each partition holds the same bytes (after a
/// moment for the last fetches).
fn group_copies_are_the_same(g: &Group) {
    std::thread::sleep(Duration::from_secs(1));
    let mut dirs = vec![g.zero.data_dir.clone()];
    dirs.extend(g.joined.values().map(|(_, d)| d.clone()));
    same_copies(&dirs);
}

/// The base offset of a `Produced` answer.
fn offset_of(r: strom_proto::Response) -> u64 {
    match r {
        strom_proto::Response::Produced { base_offset, .. } => base_offset,
        other => panic!("expected Produced, got {other:?}"),
    }
}

/// Whether every partition has all three copies in sync.
fn all_in_sync(d: &Driver) -> bool {
    let info = d.describe(TOPIC).unwrap();
    info.partitions.iter().all(|q| q.isr.len() == 3)
}

/// Stops the run, checks it, and checks that no push failed.
fn finish_without_failures(g: &Group, r: Run) {
    let (h, seen) = r.finish();
    check(g, &h, &seen);
    assert_eq!(h.failed, Vec::<u64>::new(), "pushes that failed");
}

/// The partition member 1 leads (member 0 keeps the registry).
fn led_by_member_1(d: &Driver) -> u32 {
    (0..PARTITIONS)
        .find(|p| leader(d, *p).0 == 1)
        .expect("member 1 leads a partition")
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
