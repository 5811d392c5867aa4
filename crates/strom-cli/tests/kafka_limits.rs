//! Hostile Kafka clients against a real `strom server --kafka-listen`:
//! frames that announce 256 MiB and send 10 bytes cost no memory, request
//! bytes in flight are bounded across connections
//! (`kafka_queued_max_request_bytes`), a client cycling group ids leaves no
//! permanent groups behind (`kafka_group_retention_ms`), groups have a
//! member cap (`kafka_group_max_size`), and a flood of new idempotent
//! producers does not wipe an active producer's duplicate protection
//! (the partition's producer table forgets the idlest first).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::kafka_raw::{self, bytes, connect, i16_at, i32_at, request, response, string};
use common::ServerProcess;
use strom_client::TopicSpec;

const MIB: u64 = 1 << 20;

/// A server with a Kafka listener and `extra` config, and the broker. The
/// groups here are joined one member at a time over the raw protocol: no
/// initial rebalance wait (3 s per new group by default).
fn start(base: &std::path::Path, extra: &str) -> (ServerProcess, String) {
    common::kafka::start_with_config(
        base,
        &format!("transforms = false\nkafka_group_initial_rebalance_delay_ms = 0\n{extra}"),
    )
}

/// Waits until the server has read every byte sent on `s`: the client's
/// send queue and the server's receive queue of that connection are both
/// empty in /proc/net/tcp. The server takes a frame step's budget before
/// reading its bytes, so this is when the budget for them is held.
fn wait_read_by_server(s: &TcpStream) {
    let (local, peer) = (
        s.local_addr().expect("local address").port(),
        s.peer_addr().expect("peer address").port(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        // Fields: sl local rem st tx_queue:rx_queue ...; ports in hex.
        let queue = |from: u16, to: u16| {
            table.lines().skip(1).find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
                if f.len() > 4 && port(f[1]) == Some(from) && port(f[2]) == Some(to) {
                    let (tx, rx) = f[4].split_once(':')?;
                    Some((
                        u64::from_str_radix(tx, 16).ok()?,
                        u64::from_str_radix(rx, 16).ok()?,
                    ))
                } else {
                    None
                }
            })
        };
        if let (Some((tx, _)), Some((_, rx))) = (queue(local, peer), queue(peer, local)) {
            if tx == 0 && rx == 0 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the server did not read what was sent in 30 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A field of /proc/PID/status, in bytes.
fn vm(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/PID/status"));
    kb * 1024
}

#[test]
fn frames_announcing_256_mib_cost_only_the_bytes_that_arrive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path(), "");
    let (rss, data) = (server.rss_bytes(), vm(server.pid(), "VmData"));
    // Just under the default max_frame_bytes (256 MiB), 10 bytes sent.
    let conns: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = connect(&broker);
            s.write_all(&((256i32 << 20) - 16).to_be_bytes()).unwrap();
            s.write_all(&[0, 18, 0, 0, 0, 0, 0, 1, 0, 0]).unwrap();
            s
        })
        .collect();
    conns.iter().for_each(wait_read_by_server);
    let rss_grown = server.rss_bytes().saturating_sub(rss);
    // Memory allocated, touched or not: a fresh process's zeroed pages are
    // mapped lazily, so RSS alone hides an allocation a busy server (whose
    // allocator reuses dirty memory) pays in full.
    let data_grown = vm(server.pid(), "VmData").saturating_sub(data);
    eprintln!(
        "8 announced 256 MiB frames: server RSS +{} KiB, allocated +{} KiB",
        rss_grown / 1024,
        data_grown / 1024
    );
    assert!(
        rss_grown < 8 * MIB,
        "8 frames of 10 bytes grew the server's RSS by {} MiB",
        rss_grown / MIB
    );
    assert!(
        data_grown < 128 * MIB,
        "8 frames of 10 bytes made the server allocate {} MiB",
        data_grown / MIB
    );
    drop(conns);
}

#[test]
fn request_bytes_in_flight_are_bounded_across_connections() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(
        dir.path(),
        "max_frame_bytes = 1048576\nkafka_queued_max_request_bytes = 1048576\n",
    );
    // One connection sends all but the last 100 bytes of a 1 MiB frame:
    // the whole budget is in flight.
    let mut big = connect(&broker);
    big.write_all(&(MIB as i32).to_be_bytes()).unwrap();
    big.write_all(&vec![0u8; MIB as usize - 100]).unwrap();
    wait_read_by_server(&big);
    // Another client's request waits for budget...
    let mut other = connect(&broker);
    other.write_all(&request(18, 0, 7, &[])).unwrap();
    other
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut b = [0u8; 1];
    match other.read(&mut b) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("answered while the in-flight budget was used up: {other:?}"),
    }
    // ... and is served once the budget comes back.
    drop(big);
    other
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = [0u8; 9];
    other
        .read_exact(&mut rest)
        .expect("an answer once the budget is back");
    assert_eq!(&rest[4..8], &7i32.to_be_bytes(), "the ApiVersions answer");
    drop(server);
}

/// JoinGroup v0 of a new member of `group` (a consumer of topic `t`);
/// returns the error code and the member id.
fn join(s: &mut TcpStream, corr: i32, group: &str) -> (i16, String) {
    s.write_all(&join_frame(corr, group)).unwrap();
    let r = response(s).expect("a JoinGroup answer");
    join_answer(&r)
}

fn join_frame(corr: i32, group: &str) -> Vec<u8> {
    let mut sub = 0i16.to_be_bytes().to_vec();
    sub.extend_from_slice(&1i32.to_be_bytes());
    string(&mut sub, "t");
    sub.extend_from_slice(&0i32.to_be_bytes()); // user data
    let mut b = Vec::new();
    string(&mut b, group);
    b.extend_from_slice(&30_000i32.to_be_bytes()); // session timeout
    string(&mut b, ""); // member id: new
    string(&mut b, "consumer");
    b.extend_from_slice(&1i32.to_be_bytes());
    string(&mut b, "range");
    bytes(&mut b, &sub);
    request(11, 0, corr, &b)
}

/// (error, member id) of a JoinGroup v0 answer.
fn join_answer(r: &[u8]) -> (i16, String) {
    let code = i16_at(r, 4);
    // corr, error, generation, protocol, leader, member id
    let mut at = 4 + 2 + 4;
    at += 2 + i16_at(r, at) as usize;
    at += 2 + i16_at(r, at) as usize;
    let n = i16_at(r, at) as usize;
    (
        code,
        String::from_utf8_lossy(&r[at + 2..at + 2 + n]).into_owned(),
    )
}

fn leave(s: &mut TcpStream, corr: i32, group: &str, member: &str) -> i16 {
    let mut b = Vec::new();
    string(&mut b, group);
    string(&mut b, member);
    s.write_all(&request(13, 0, corr, &b)).unwrap();
    let r = response(s).expect("a LeaveGroup answer");
    i16_at(&r, 4)
}

/// The registry's consumer groups whose name starts with `prefix`.
fn registry_groups(d: &strom_client::Driver, prefix: &str) -> usize {
    d.list_groups()
        .expect("listing groups")
        .iter()
        .filter(|g| g.spec.name.starts_with(prefix))
        .count()
}

#[test]
fn a_client_cycling_group_ids_leaves_no_groups_past_the_retention() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path(), "kafka_group_retention_ms = 1000\n");
    let d = server.connect();
    d.create_topic(TopicSpec::new("t", 1)).expect("topic");
    let mut s = connect(&broker);
    let mut members = Vec::new();
    for i in 0..12 {
        let g = format!("cyc-{i}");
        let (code, m) = join(&mut s, i, &g);
        assert_eq!(code, 0, "join {g}");
        members.push((g, m));
    }
    // The groups reach the registry while they have members.
    common::wait_for("the Kafka groups in the registry", || {
        registry_groups(&d, "cyc-") == 12
    });
    for (i, (g, m)) in members.iter().enumerate() {
        assert_eq!(leave(&mut s, 100 + i as i32, g, m), 0, "leave {g}");
    }
    // Empty, they expire after the retention: from the registry too.
    common::wait_for("the empty Kafka groups expire", || {
        registry_groups(&d, "cyc-") == 0
    });
    // And from the coordinator: ListGroups v0 lists none.
    s.write_all(&request(16, 0, 999, &[])).unwrap();
    let r = response(&mut s).expect("a ListGroups answer");
    assert_eq!(i16_at(&r, 4), 0);
    assert_eq!(i32_at(&r, 6), 0, "groups the coordinator still lists");
}

#[test]
fn a_group_at_its_max_size_refuses_another_member() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path(), "kafka_group_max_size = 2\n");
    server
        .connect()
        .create_topic(TopicSpec::new("t", 1))
        .expect("topic");
    let mut a = connect(&broker);
    assert_eq!(join(&mut a, 1, "full").0, 0, "the first member");
    // The second joins (its answer waits for the rebalance).
    let mut b = connect(&broker);
    b.write_all(&join_frame(2, "full")).unwrap();
    let mut probe = connect(&broker);
    common::wait_for("the second member in the group", || {
        members(&mut probe, "full") == 2
    });
    // The third is refused at once: GROUP_MAX_SIZE_REACHED.
    let mut c = connect(&broker);
    let (code, _) = join(&mut c, 3, "full");
    assert_eq!(code, 81, "GROUP_MAX_SIZE_REACHED");
}

/// The members DescribeGroups v0 lists in `group`.
fn members(s: &mut TcpStream, group: &str) -> i32 {
    let mut b = 1i32.to_be_bytes().to_vec();
    string(&mut b, group);
    s.write_all(&request(15, 0, 1, &b)).unwrap();
    let r = response(s).expect("a DescribeGroups answer");
    // corr, groups count, error, group id, state, protocol type, protocol
    let mut at = 4 + 4 + 2;
    for _ in 0..4 {
        at += 2 + i16_at(&r, at) as usize;
    }
    i32_at(&r, at)
}

/// A v2 record batch of `count` records ("val") of idempotent producer
/// `pid` at epoch 0, first sequence `seq`.
fn batch(pid: i64, seq: i32, count: usize) -> Vec<u8> {
    kafka_raw::record_batch(pid, 0, seq, &vec![&b"val"[..]; count])
}

/// InitProducerId v0: the producer id handed out.
fn init_producer_id(s: &mut TcpStream, corr: i32) -> i64 {
    let (error, pid, _) = kafka_raw::init_producer_id(s, corr);
    assert_eq!(error, 0, "InitProducerId error");
    pid
}

/// Produce v3 (acks all) of `records` to t/0: (error, base offset).
fn produce(s: &mut TcpStream, corr: i32, records: &[u8]) -> (i16, i64) {
    kafka_raw::produce(s, corr, "t", records)
}

#[test]
fn a_flood_of_new_producers_keeps_an_active_producers_duplicate_protection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path(), "kafka_max_producer_states = 8\n");
    server
        .connect()
        .create_topic(TopicSpec::new("t", 1))
        .expect("topic");
    let mut s = connect(&broker);
    let mut corr = 0;
    let mut next = || {
        corr += 1;
        corr
    };
    let active = init_producer_id(&mut s, next());
    let mut seq = 0;
    let mut last = (batch(active, 0, 3), 0i64);
    let (code, off) = produce(&mut s, next(), &last.0);
    assert_eq!(code, 0);
    last.1 = off;
    // 40 new producers, each with one batch; the active one keeps
    // producing every fourth.
    for i in 0..40 {
        let pid = init_producer_id(&mut s, next());
        assert_eq!(produce(&mut s, next(), &batch(pid, 0, 1)).0, 0);
        if i % 4 == 3 {
            seq += 3;
            let b = batch(active, seq, 3);
            let (code, off) = produce(&mut s, next(), &b);
            assert_eq!(code, 0);
            last = (b, off);
        }
    }
    // Its last batch retried (the answer was lost): not stored again.
    let (code, off) = produce(&mut s, next(), &last.0);
    assert!(
        code == 0 || code == 46,
        "a retried batch is a duplicate, not an error: {code}"
    );
    if code == 0 {
        assert_eq!(off, last.1, "the retry answers with the first offset");
    }
    let end = server
        .connect()
        .open_topic("t")
        .expect("topic")
        .describe()
        .expect("describe")
        .partitions[0]
        .next_offset;
    assert_eq!(end, 3 + 40 + 10 * 3, "nothing stored twice");
}
