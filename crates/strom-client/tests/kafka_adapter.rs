//! The Kafka backend of strom-client (`kafka://host:port`) against Strom's
//! own Kafka front end, started in-process on port 0 beside an embedded
//! server: the same Driver, Topic, Producer and Consumer API, events read
//! back through the adapter and across to the native client both ways.
#![cfg(feature = "kafka")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use strom_client::{
    ConsumerOptions, DataBuffer, Driver, ErrorCode, EventMeta, GroupOptions, Next, Selection,
    StartPos, TopicSpec,
};

/// Longest a pull may wait before the test counts it as a hang.
const PULL: Duration = Duration::from_secs(20);

/// A Strom server and its Kafka listener in this process, data in a
/// temporary directory.
struct Stack {
    rt: tokio::runtime::Runtime,
    server: Option<strom_server::ServerHandle>,
    kafka: Option<strom_kafka::KafkaHandle>,
    _dir: tempfile::TempDir,
}

impl Stack {
    fn start() -> Stack {
        let dir = tempfile::tempdir().expect("temporary directory");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let config = strom_server::ServerConfig {
            data_dir: dir.path().to_path_buf(),
            rank: Some(0),
            size: Some(1),
            ..Default::default()
        };
        let (server, kafka) = rt.block_on(async {
            let server = strom_server::Server::start(config)
                .await
                .expect("server starts");
            let kafka = strom_kafka::serve(server.services(), "127.0.0.1:0")
                .await
                .expect("Kafka listener starts");
            (server, kafka)
        });
        Stack {
            rt,
            server: Some(server),
            kafka: Some(kafka),
            _dir: dir,
        }
    }

    /// A driver on the Kafka listener, through the adapter.
    fn kafka(&self) -> Driver {
        let addr = self.kafka.as_ref().expect("listener").addr();
        Driver::connect_addr(&format!("kafka://{addr}")).expect("adapter connects")
    }

    /// A native driver on the same server.
    fn native(&self) -> Driver {
        let addr = self.server.as_ref().expect("server").addr().to_string();
        Driver::connect_addr(&addr).expect("native client connects")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let (kafka, server) = (self.kafka.take(), self.server.take());
        self.rt.block_on(async {
            if let Some(k) = kafka {
                k.shutdown().await;
            }
            if let Some(s) = server {
                s.shutdown().await;
            }
        });
    }
}

/// Event `i`'s data: `len` bytes that differ per event and per position.
fn data(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u64 * 31 + i * 7) as u8).collect()
}

fn meta(i: u64) -> serde_json::Value {
    json!({ "i": i, "name": format!("event-{i}") })
}

/// Pulls events until end of stream; panics on a hang or an error.
fn drain(c: &strom_client::Consumer) -> Vec<strom_client::Event> {
    let mut out = Vec::new();
    loop {
        match c.pull_timeout(PULL).expect("pull") {
            Next::Event(e) => out.push(e),
            Next::EndOfStream => return out,
        }
    }
}

fn opts(start: StartPos) -> ConsumerOptions {
    ConsumerOptions {
        start,
        ..Default::default()
    }
}

#[test]
fn events_round_trip_through_the_adapter_with_metadata_data_and_partition_order() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("frames", 3)).unwrap();
    assert_eq!(t.partitions(), 3);
    let p = t.producer().unwrap();
    let n = 60u64;
    let futs: Vec<_> = (0..n)
        .map(|i| p.push(meta(i), data(i, (i * 37 % 500) as usize)).unwrap())
        .collect();
    let ids: Vec<_> = futs.into_iter().map(|f| f.wait().unwrap()).collect();
    p.close().unwrap();
    // Round-robin over the three partitions, Kafka offsets per partition.
    let parts: std::collections::BTreeSet<u32> = ids.iter().map(|id| id.partition).collect();
    assert_eq!(parts.len(), 3, "{ids:?}");

    let c = t
        .consumer_with("reader", opts(StartPos::Beginning))
        .unwrap();
    let events = drain(&c);
    assert_eq!(events.len() as u64, n, "every event once, no marker");
    let mut last: HashMap<u32, u64> = HashMap::new();
    for e in &events {
        let v = e.json().unwrap();
        let i = v["i"].as_u64().unwrap();
        assert_eq!(v, meta(i));
        assert_eq!(
            e.raw().as_ref(),
            serde_json::to_vec(&meta(i)).unwrap().as_slice()
        );
        assert_eq!(
            e.data(),
            data(i, (i * 37 % 500) as usize).as_slice(),
            "event {i}"
        );
        assert_eq!(
            (e.partition, e.offset),
            (ids[i as usize].partition, ids[i as usize].offset)
        );
        if let Some(prev) = last.insert(e.partition, e.offset) {
            assert!(e.offset > prev, "partition {} out of order", e.partition);
        }
    }
    // Each partition in push order.
    for part in 0..3 {
        let seen: Vec<u64> = events
            .iter()
            .filter(|e| e.partition == part)
            .map(|e| e.json().unwrap()["i"].as_u64().unwrap())
            .collect();
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "partition {part}");
    }
}

#[test]
fn end_of_stream_comes_only_after_every_producer_closed() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("two-writers", 2)).unwrap();
    let a = t.producer().unwrap();
    let b = t.producer().unwrap();
    assert_ne!(a.id(), b.id());
    for i in 0..4 {
        a.push(meta(i), data(i, 10)).unwrap();
        b.push(meta(100 + i), data(100 + i, 10)).unwrap();
    }
    a.close().unwrap();
    b.flush().unwrap();
    let c = t.consumer_with("eos", opts(StartPos::Beginning)).unwrap();
    let mut got = 0;
    let early = loop {
        match c.pull_timeout(Duration::from_secs(3)) {
            Ok(Next::Event(_)) => got += 1,
            Ok(Next::EndOfStream) => break Some("end of stream"),
            Err(e) if e.code() == ErrorCode::TIMEOUT => break None,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(early, None, "no end while producer b is open");
    assert_eq!(got, 8);
    b.push(meta(200), data(200, 3)).unwrap();
    b.close().unwrap();
    let rest = drain(&c);
    assert_eq!(rest.len(), 1, "the last event, then end of stream");
    assert_eq!(rest[0].json().unwrap(), meta(200));
    assert!(
        matches!(c.pull_timeout(PULL).unwrap(), Next::EndOfStream),
        "and it stays ended"
    );
}

#[test]
fn start_positions_and_seek_move_the_consumer() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("positions", 1)).unwrap();
    let p = t.producer().unwrap();
    let ids: Vec<_> = (0..10)
        .map(|i| p.push(meta(i), data(i, 8)).unwrap().wait().unwrap())
        .collect();
    p.close().unwrap();
    let i_of = |e: &strom_client::Event| e.json().unwrap()["i"].as_u64().unwrap();

    // An offset: from that event on.
    let c = t
        .consumer_with("pos", opts(StartPos::Offset(ids[4].offset)))
        .unwrap();
    let from4 = drain(&c);
    assert_eq!(
        from4.iter().map(i_of).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );

    // Seek back to the beginning: everything again.
    c.seek(StartPos::Beginning).unwrap();
    assert_eq!(
        drain(&c).iter().map(i_of).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );

    // Seek to an offset again, then by timestamp from the start of time.
    c.seek(StartPos::Offset(ids[8].offset)).unwrap();
    assert_eq!(drain(&c).iter().map(i_of).collect::<Vec<_>>(), vec![8, 9]);
    c.seek(StartPos::Timestamp(0)).unwrap();
    assert_eq!(drain(&c).len(), 10);

    // The end: only what a later producer writes, then its end.
    let tail = t.consumer_with("tail", opts(StartPos::End)).unwrap();
    match tail.pull_timeout(Duration::from_secs(2)) {
        Err(e) if e.code() == ErrorCode::TIMEOUT => {}
        Ok(Next::Event(e)) => panic!("an old event at the end: {:?}", e.json()),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let late = t.producer().unwrap();
    late.push(meta(99), data(99, 8)).unwrap();
    late.close().unwrap();
    assert_eq!(drain(&tail).iter().map(i_of).collect::<Vec<_>>(), vec![99]);
}

#[test]
fn acks_commit_offsets_that_a_second_consumer_of_the_same_name_resumes_from() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("acked", 1)).unwrap();
    let p = t.producer().unwrap();
    for i in 0..10 {
        p.push(meta(i), data(i, 4)).unwrap();
    }
    p.close().unwrap();
    let first = t.consumer("workers").unwrap();
    let mut last = None;
    for _ in 0..4 {
        match first.pull_timeout(PULL).unwrap() {
            Next::Event(e) => last = Some(e),
            Next::EndOfStream => panic!("ended early"),
        }
    }
    let last = last.unwrap();
    assert_eq!(last.json().unwrap()["i"], 3);
    last.ack().wait_timeout(Some(PULL)).unwrap();
    drop(first);

    // The committed offset is the Strom consumer offset of that name.
    let native = stack.native();
    let offsets = native.consumer_offsets("acked", 0).unwrap();
    assert!(
        offsets.contains(&("workers".to_string(), last.offset + 1)),
        "{offsets:?}"
    );

    let second = t.consumer("workers").unwrap();
    let rest = drain(&second);
    let is: Vec<u64> = rest
        .iter()
        .map(|e| e.json().unwrap()["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, (4..10).collect::<Vec<_>>(), "resumes after the ack");
}

#[test]
fn a_range_selector_hands_only_the_selected_bytes_to_the_broker() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("selected", 1)).unwrap();
    let p = t.producer().unwrap();
    for i in 0..5 {
        p.push(meta(i), data(i, 1000)).unwrap();
    }
    p.close().unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let seen = asked.clone();
    let broker = move |_: &EventMeta, _: &Selection, len: u64| {
        seen.fetch_add(len, Ordering::Relaxed);
        Ok(vec![
            Box::new(vec![0u8; len as usize]) as Box<dyn DataBuffer>
        ])
    };
    let c = t
        .consumer_with(
            "sel",
            ConsumerOptions {
                start: StartPos::Beginning,
                selector: Arc::new(Selection::Range {
                    offset: 100,
                    len: 50,
                }),
                broker: Arc::new(broker),
                ..Default::default()
            },
        )
        .unwrap();
    let events = drain(&c);
    assert_eq!(events.len(), 5);
    for e in &events {
        let i = e.json().unwrap()["i"].as_u64().unwrap();
        assert_eq!(e.data_size(), 1000);
        assert_eq!(e.fetched_len(), 50);
        assert_eq!(e.data(), &data(i, 1000)[100..150], "event {i}");
    }
    assert_eq!(
        asked.load(Ordering::Relaxed),
        5 * 50,
        "buffers for the selection only"
    );
}

/// Whether a native event is one of the adapter's end-of-stream markers
/// (the front end shows them in its `kafka` metadata shape).
fn is_marker(meta: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(meta)
        .ok()
        .and_then(|v| {
            v["kafka"]["headers"][0][0]
                .as_str()
                .map(|h| h == "strom.eos")
        })
        .unwrap_or(false)
}

#[test]
fn events_pushed_through_the_adapter_read_the_same_with_the_native_client() {
    let stack = Stack::start();
    let k = stack.kafka();
    let t = k.create_topic(TopicSpec::new("to-native", 2)).unwrap();
    let p = t.producer().unwrap();
    let n = 20u64;
    for i in 0..n {
        p.push(meta(i), data(i, 64 + i as usize)).unwrap();
    }
    p.close().unwrap();

    let native = stack.native();
    let nt = native.open_topic("to-native").unwrap();
    let c = nt
        .consumer_with("native", opts(StartPos::Beginning))
        .unwrap();
    let mut events = Vec::new();
    let mut markers = 0;
    while (events.len() as u64) < n || markers < 4 {
        match c.pull_timeout(PULL).expect("pull") {
            Next::Event(e) if is_marker(e.raw()) => markers += 1,
            Next::Event(e) => events.push(e),
            Next::EndOfStream => panic!("the native topic did not end"),
        }
    }
    assert_eq!(markers, 4, "an open and a close marker per partition");
    assert_eq!(events.len() as u64, n);
    for e in &events {
        let i = e.json().unwrap()["i"].as_u64().unwrap();
        assert_eq!(
            e.raw().as_ref(),
            serde_json::to_vec(&meta(i)).unwrap().as_slice(),
            "exact metadata"
        );
        assert_eq!(e.data(), data(i, 64 + i as usize).as_slice(), "event {i}");
    }
}

#[test]
fn events_pushed_natively_read_the_same_through_the_adapter() {
    let stack = Stack::start();
    let native = stack.native();
    let nt = native
        .create_topic(TopicSpec::new("from-native", 2))
        .unwrap();
    let p = nt.producer().unwrap();
    let n = 20u64;
    let ids: Vec<_> = (0..n)
        .map(|i| p.push(meta(i), data(i, 100 + i as usize)).unwrap())
        .collect::<Vec<_>>()
        .into_iter()
        .map(|f| f.wait().unwrap())
        .collect();
    p.flush().unwrap();

    let k = stack.kafka();
    let t = k.open_topic("from-native").unwrap();
    assert_eq!(t.partitions(), 2);
    let c = t
        .consumer_with("adapter", opts(StartPos::Beginning))
        .unwrap();
    for _ in 0..n {
        let Next::Event(e) = c.pull_timeout(PULL).unwrap() else {
            panic!("no end of stream without markers")
        };
        let i = e.json().unwrap()["i"].as_u64().unwrap();
        assert_eq!(
            e.raw().as_ref(),
            serde_json::to_vec(&meta(i)).unwrap().as_slice(),
            "exact metadata"
        );
        assert_eq!(e.data(), data(i, 100 + i as usize).as_slice(), "event {i}");
        assert_eq!(
            (e.partition, e.offset),
            (ids[i as usize].partition, ids[i as usize].offset),
            "the same offsets"
        );
    }
}

#[test]
fn operations_the_kafka_backend_cannot_do_are_typed_errors() {
    let stack = Stack::start();
    let d = stack.kafka();
    assert!(d.is_kafka());
    let t = d.create_topic(TopicSpec::new("limits", 1)).unwrap();
    let unsupported = |e: strom_client::Error| {
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
        assert!(e.to_string().contains("kafka backend"), "{e}");
    };
    unsupported(d.members().unwrap_err());
    unsupported(t.complete().unwrap_err());
    unsupported(
        t.consumer_group("g", GroupOptions::default())
            .err()
            .unwrap(),
    );
    let p = t.producer().unwrap();
    unsupported(
        p.push_with(meta(0), data(0, 4), None, b"descriptor")
            .err()
            .unwrap(),
    );
    let missing = d.open_topic("no-such-topic").err().unwrap();
    assert_eq!(missing.code(), ErrorCode::TOPIC_NOT_FOUND, "{missing}");
    p.close().unwrap();
}

#[test]
fn a_seek_while_the_prefetch_budget_is_full_moves_the_consumer() {
    let stack = Stack::start();
    let d = stack.kafka();
    let t = d.create_topic(TopicSpec::new("full", 1)).unwrap();
    let p = t.producer().unwrap();
    let ids: Vec<_> = (0..10)
        .map(|i| p.push(meta(i), data(i, 1000)).unwrap().wait().unwrap())
        .collect();
    p.close().unwrap();
    // Room for one event's data: the reader waits for pulls after it.
    let c = t
        .consumer_with(
            "full",
            ConsumerOptions {
                start: StartPos::Beginning,
                prefetch_bytes: 1000,
                ..Default::default()
            },
        )
        .unwrap();
    // Reading has begun; then the next event fills the budget and the
    // reader waits with the one after it.
    match c.pull_timeout(PULL).unwrap() {
        Next::Event(e) => assert_eq!(e.json().unwrap()["i"], 0),
        Next::EndOfStream => panic!("ended early"),
    }
    std::thread::sleep(Duration::from_secs(1));
    let c = Arc::new(c);
    let (tx, rx) = std::sync::mpsc::channel();
    let seeker = c.clone();
    std::thread::spawn(move || tx.send(seeker.seek(StartPos::Offset(ids[7].offset))));
    let done = rx
        .recv_timeout(PULL)
        .expect("seek returns while the queue is full");
    done.unwrap();
    let is: Vec<u64> = drain(&c)
        .iter()
        .map(|e| e.json().unwrap()["i"].as_u64().unwrap())
        .collect();
    assert_eq!(is, vec![7, 8, 9]);
}

/// A TCP socket bound to a port of 127.0.0.1 that never listens: a
/// connection there is refused, and while the socket is open no other
/// process can take the port. (A port merely free a moment ago was taken
/// by a server of a test running beside this one.)
struct BoundNotListening {
    fd: libc::c_int,
    port: u16,
}

impl BoundNotListening {
    fn new() -> Self {
        // SAFETY: plain socket calls on a socket this struct owns; the
        // address structs are initialised and sized as the calls expect.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let p = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
            assert_eq!(
                libc::bind(fd, p, len),
                0,
                "bind: {}",
                std::io::Error::last_os_error()
            );
            let mut got = len;
            assert_eq!(libc::getsockname(fd, p, &mut got), 0, "getsockname");
            BoundNotListening {
                fd,
                port: u16::from_be(addr.sin_port),
            }
        }
    }
}

impl Drop for BoundNotListening {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this struct's own, closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[test]
fn connecting_where_no_kafka_listens_is_connection_failed() {
    let nobody = BoundNotListening::new();
    let e = Driver::connect_addr(&format!("kafka://127.0.0.1:{}", nobody.port))
        .err()
        .expect("no cluster");
    assert_eq!(e.code(), ErrorCode::CONNECTION_FAILED, "{e}");
    assert!(e.to_string().contains("127.0.0.1"), "{e}");
    let e = Driver::connect_addr("kafka://").err().expect("no address");
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
}
