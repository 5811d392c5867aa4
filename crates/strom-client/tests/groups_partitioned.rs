//! Partitioned consumer groups (Kafka's model): members split the topic's
//! partitions, a rebalance moves only what must move, a partition changes
//! hands at its committed offset (events pulled and not acked are read
//! again, nothing is skipped), a zombie's commits are fenced, the listener
//! hears of a partition before its events, and the end of the stream
//! reaches every member.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strom_client::{
    Consumer, Driver, ErrorCode, Event, GroupOptions, Next, PartitionType, Producer,
    ProducerOptions, RebalanceListener, Topic, TopicSpec,
};

fn topic(d: &Driver, name: &str, partitions: u32) -> Topic {
    d.create_topic(TopicSpec {
        partition_type: PartitionType::File,
        ..TopicSpec::new(name, partitions)
    })
    .unwrap()
}

fn producer(t: &Topic) -> Producer {
    t.producer_with(ProducerOptions {
        lease: None,
        ..Default::default()
    })
    .unwrap()
}

/// Pushes events `{"i": from}` .. `{"i": to - 1}` and waits for them.
fn push(p: &Producer, from: u32, to: u32) {
    let futs: Vec<_> = (from..to)
        .map(|i| p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 8]).unwrap())
        .collect();
    p.flush().unwrap();
    for f in futs {
        f.wait().unwrap();
    }
}

fn index(e: &Event) -> u64 {
    e.json().unwrap()["i"].as_u64().unwrap()
}

fn opts() -> GroupOptions {
    let mut o = GroupOptions {
        session_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    o.consumer.prefetch = 16;
    o
}

/// Waits until `pred` holds over the members' assignments.
fn await_assignment(cs: &[&Consumer], what: &str, pred: impl Fn(&[Vec<u32>]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a: Vec<Vec<u32>> = cs.iter().map(|c| c.assignment()).collect();
        if pred(&a) {
            let all: BTreeSet<u32> = a.iter().flatten().copied().collect();
            assert_eq!(
                all.len(),
                a.iter().map(Vec::len).sum::<usize>(),
                "disjoint: {a:?}"
            );
            return;
        }
        assert!(Instant::now() < deadline, "no {what} in time: {a:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sizes(a: &[Vec<u32>]) -> Vec<usize> {
    a.iter().map(Vec::len).collect()
}

/// Pulls and acks until nothing arrives for `quiet`; returns (partition,
/// offset, i) of every event, its ack persisted.
fn pull_acked(c: &Consumer, quiet: Duration) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    while let Some(batch) = c.pull_many(64, quiet).unwrap() {
        if batch.is_empty() {
            break;
        }
        let mut acks = Vec::new();
        for e in &batch {
            out.push((e.partition, e.offset, index(e)));
            acks.push(e.ack());
        }
        for a in acks {
            a.wait().unwrap();
        }
    }
    out
}

/// Pulls and acks to the end of the stream.
fn pull_to_end(c: &Consumer) -> Vec<(u32, u64, u64)> {
    let mut out = Vec::new();
    loop {
        match c.pull_timeout(Duration::from_secs(20)).unwrap() {
            Next::Event(e) => {
                out.push((e.partition, e.offset, index(&e)));
                e.ack().wait().unwrap();
            }
            Next::EndOfStream => return out,
        }
    }
}

#[test]
fn members_split_partitions_evenly_and_a_rebalance_duplicates_nothing_acked() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "split", 6);
    let p = producer(&t);
    push(&p, 0, 300);
    let a = t.consumer_group("g", opts()).unwrap();
    let b = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&a, &b], "3/3 split", |x| sizes(x) == [3, 3]);
    let mut seen = pull_acked(&a, Duration::from_millis(500));
    seen.extend(pull_acked(&b, Duration::from_millis(500)));
    let before: BTreeMap<usize, Vec<u32>> = [(0, a.assignment()), (1, b.assignment())].into();
    let c = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&a, &b, &c], "2/2/2 split", |x| sizes(x) == [2, 2, 2]);
    // Sticky: the old members kept two of their three each.
    for (i, m) in [&a, &b].iter().enumerate() {
        let kept = m
            .assignment()
            .iter()
            .filter(|p| before[&i].contains(p))
            .count();
        assert_eq!(
            kept,
            2,
            "member {i} kept {:?} of {:?}",
            m.assignment(),
            before[&i]
        );
    }
    push(&p, 300, 600);
    p.close().unwrap();
    let rest: Vec<Vec<(u32, u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = [&a, &b, &c]
            .into_iter()
            .map(|m| s.spawn(move || pull_to_end(m)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        rest.iter().all(|r| !r.is_empty()),
        "each member read after the rebalance"
    );
    seen.extend(rest.into_iter().flatten());
    let mut is: Vec<u64> = seen.iter().map(|s| s.2).collect();
    is.sort_unstable();
    assert_eq!(is, (0..600).collect::<Vec<_>>(), "every event exactly once");
}

/// A TCP relay to the master that can be cut, so a member's heartbeats
/// stop without it leaving (its process "crashed" as far as the master
/// can tell). Its partitions' data connections go straight to the owner.
struct Relay {
    addr: String,
    cut: Arc<AtomicBool>,
}

impl Relay {
    fn start(to: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let (to, flag) = (to.to_string(), cut.clone());
        std::thread::spawn(move || {
            let mut open: Vec<TcpStream> = Vec::new();
            while !flag.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        inbound.set_nonblocking(false).unwrap();
                        let outbound = TcpStream::connect(&to).unwrap();
                        for (mut from, mut into) in [
                            (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                            (outbound.try_clone().unwrap(), inbound.try_clone().unwrap()),
                        ] {
                            std::thread::spawn(move || {
                                let mut buf = [0u8; 16 << 10];
                                while let Ok(n @ 1..) = from.read(&mut buf) {
                                    if into.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            });
                        }
                        open.extend([inbound, outbound]);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for s in open {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        });
        Relay { addr, cut }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }
}

/// A member reached through a relay holds both partitions of a 200-event
/// topic, pulls 80 events, acks the first 40 of them, then goes silent.
/// Returns what it acked and what it pulled without acking (kept as
/// events, to ack later), its consumer and relay.
struct Zombie {
    acked: Vec<(u32, u64, u64)>,
    unacked: Vec<Event>,
    consumer: Consumer,
    relay: Relay,
    _driver: Driver,
}

fn zombie(t: &Topic, d: &Driver) -> Zombie {
    let p = producer(t);
    push(&p, 0, 200);
    p.close().unwrap();
    let relay = Relay::start(&d.master_addr());
    let zd = Driver::connect_addr(&relay.addr).unwrap();
    let zt = zd.open_topic(t.name()).unwrap();
    let z = zt.consumer_group("g", opts()).unwrap();
    await_assignment(&[&z], "both partitions", |x| x[0] == [0, 1]);
    let mut events = Vec::new();
    while events.len() < 80 {
        match z.pull_timeout(Duration::from_secs(5)).unwrap() {
            Next::Event(e) => events.push(e),
            Next::EndOfStream => panic!("the group cannot end with 120 events unread"),
        }
    }
    let unacked = events.split_off(40);
    // Cumulative per partition: ack each partition's last event of the 40.
    let mut last: BTreeMap<u32, &Event> = BTreeMap::new();
    for e in &events {
        last.insert(e.partition, e);
    }
    for e in last.values() {
        e.ack().wait().unwrap();
    }
    let acked = events
        .iter()
        .map(|e| (e.partition, e.offset, index(e)))
        .collect();
    relay.cut();
    Zombie {
        acked,
        unacked,
        consumer: z,
        relay,
        _driver: zd,
    }
}

#[test]
fn a_crashed_member_hands_over_at_its_committed_offset() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "crash", 2);
    let z = zombie(&t, &d);
    let started = Instant::now();
    let s = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&s], "the survivor holding both", |x| x[0] == [0, 1]);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "handover took {:?} with a 1 s session",
        started.elapsed()
    );
    let got = pull_to_end(&s);
    let mut all: Vec<u64> = z.acked.iter().chain(&got).map(|e| e.2).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..200).collect::<Vec<_>>(),
        "nothing skipped, acked events not read again"
    );
    let again: BTreeSet<u64> = got.iter().map(|e| e.2).collect();
    for e in &z.unacked {
        assert!(
            again.contains(&index(e)),
            "unacked event {} read again",
            index(e)
        );
    }
    drop(z.relay);
}

#[test]
fn a_zombies_commit_with_an_old_epoch_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "zombie", 2);
    let z = zombie(&t, &d);
    let s = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&s], "the survivor holding both", |x| x[0] == [0, 1]);
    // The zombie still believes it holds the partitions; its acks reach
    // the owner directly, and are refused.
    let last = z.unacked.last().unwrap();
    let e = last.ack().wait().unwrap_err();
    assert_eq!(e.code(), ErrorCode::FENCED, "{e}");
    // The group's position did not move: the survivor reads those events.
    let got: BTreeSet<u64> = pull_to_end(&s).iter().map(|e| e.2).collect();
    assert!(got.contains(&index(last)));
    assert!(z.consumer.group().is_some());
}

/// Records what the listener heard, and checks each pulled event against
/// the partitions it was told of.
#[derive(Default)]
struct Log {
    held: Mutex<BTreeSet<u32>>,
    calls: Mutex<Vec<String>>,
}

impl RebalanceListener for Log {
    fn on_assigned(&self, ps: &[u32]) {
        self.held.lock().unwrap().extend(ps);
        self.calls.lock().unwrap().push(format!("+{ps:?}"));
    }
    fn on_revoked(&self, ps: &[u32]) {
        let mut h = self.held.lock().unwrap();
        ps.iter().for_each(|p| {
            h.remove(p);
        });
        self.calls.lock().unwrap().push(format!("-{ps:?}"));
    }
}

#[test]
fn the_listener_hears_of_a_partition_before_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "listen", 4);
    let p = producer(&t);
    push(&p, 0, 200);
    let log = Arc::new(Log::default());
    let mut o = opts();
    o.listener = Some(log.clone());
    let a = t.consumer_group("g", o).unwrap();
    let check = |c: &Consumer, n: usize| {
        for _ in 0..n {
            let Next::Event(e) = c.pull_timeout(Duration::from_secs(10)).unwrap() else {
                panic!("end of stream");
            };
            let held = log.held.lock().unwrap().clone();
            assert!(
                held.contains(&e.partition),
                "event of {} before on_assigned: {held:?}",
                e.partition
            );
            e.ack().wait().unwrap();
        }
    };
    check(&a, 50);
    assert_eq!(
        log.held.lock().unwrap().len(),
        4,
        "{:?}",
        log.calls.lock().unwrap()
    );
    let b = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&a, &b], "2/2 split", |x| sizes(x) == [2, 2]);
    push(&p, 200, 400);
    check(&a, 60);
    let calls = log.calls.lock().unwrap().clone();
    assert!(
        calls.iter().any(|c| c.starts_with('-')),
        "on_revoked ran: {calls:?}"
    );
    assert_eq!(log.held.lock().unwrap().len(), 2, "{calls:?}");
}

#[test]
fn the_end_of_the_stream_reaches_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "ends", 2);
    let members: Vec<Consumer> = (0..3)
        .map(|_| t.consumer_group("g", opts()).unwrap())
        .collect();
    let refs: Vec<&Consumer> = members.iter().collect();
    await_assignment(&refs, "1/1/0 split", |x| {
        x.iter().map(Vec::len).sum::<usize>() == 2
    });
    let p = producer(&t);
    push(&p, 0, 100);
    p.close().unwrap();
    let got: Vec<Vec<(u32, u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|m| s.spawn(move || pull_to_end(m)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = got.iter().flatten().map(|e| e.2).collect();
    all.sort_unstable();
    assert_eq!(all, (0..100).collect::<Vec<_>>());
    assert_eq!(
        got.iter().filter(|g| g.is_empty()).count(),
        1,
        "one member idle, and it ended too"
    );
    assert!(
        d.describe_group("g").unwrap().ended,
        "describe says the group ended"
    );
}

#[test]
fn added_partitions_are_split_among_the_members() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "grows", 2);
    let a = t.consumer_group("g", opts()).unwrap();
    let b = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&a, &b], "1/1 split", |x| sizes(x) == [1, 1]);
    let before = (a.assignment(), b.assignment());
    d.add_partitions("grows", 2, None).unwrap();
    await_assignment(&[&a, &b], "2/2 split", |x| sizes(x) == [2, 2]);
    assert!(
        a.assignment().contains(&before.0[0]),
        "a kept its partition"
    );
    assert!(
        b.assignment().contains(&before.1[0]),
        "b kept its partition"
    );
    let p = producer(&t);
    push(&p, 0, 200);
    p.close().unwrap();
    let got: Vec<Vec<(u32, u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = [&a, &b]
            .into_iter()
            .map(|m| s.spawn(move || pull_to_end(m)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let parts: BTreeSet<u32> = got.iter().flatten().map(|e| e.0).collect();
    assert_eq!(parts.len(), 4, "events of the new partitions were read too");
    let mut all: Vec<u64> = got.iter().flatten().map(|e| e.2).collect();
    all.sort_unstable();
    assert_eq!(all, (0..200).collect::<Vec<_>>());
}

#[test]
fn a_plain_commit_under_a_partitioned_groups_name_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = topic(&d, "named", 1);
    let p = producer(&t);
    push(&p, 0, 10);
    let m = t.consumer_group("g", opts()).unwrap();
    await_assignment(&[&m], "the partition", |x| x[0] == [0]);
    let plain = t.consumer("g").unwrap();
    let Next::Event(e) = plain.pull_timeout(Duration::from_secs(5)).unwrap() else {
        panic!("end of stream");
    };
    let err = e.ack().wait().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FENCED, "{err}");
    // The member's own acks go through.
    let Next::Event(e) = m.pull_timeout(Duration::from_secs(5)).unwrap() else {
        panic!("end of stream");
    };
    e.ack().wait().unwrap();
}
