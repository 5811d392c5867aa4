//! Idempotent producers on a real `strom server` (docs/replication.md): a
//! batch resent with the same producer stamp, as after a lost reply, is
//! answered with the offsets it got the first time and stored once, also
//! after the server restarts; a batch that skips a sequence number is
//! refused with `OUT_OF_ORDER_SEQUENCE`. An idempotent producer rides out
//! a `kill -9` and restart of its server: it resends what was cut off, no
//! push fails, and every event is stored once, in push order. A push to a
//! server that stopped answering ends after the request timeout, and an
//! idempotent producer resends it; so does a registry request (the
//! driver's request timeout).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::raw::produce_stamped;
use common::{read_all, wait_for, ServerProcess};
use strom_client::{Driver, ErrorCode, ProducerOptions, TopicSpec};
use strom_proto::Response;

const TOPIC: &str = "once";

fn offset_of(r: &Response) -> u64 {
    match r {
        Response::Produced { base_offset, .. } => *base_offset,
        other => panic!("expected Produced, got {other:?}"),
    }
}

#[test]
fn a_resent_batch_is_stored_once_and_answered_with_its_first_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    let d = server.connect();
    d.create_topic(TopicSpec::new(TOPIC, 1)).unwrap();
    let send = |addr: &str, seq: u32, tag: &str| {
        produce_stamped(addr, TOPIC, 0, 41, seq, &format!("{{\"e\":\"{tag}\"}}"))
    };
    let first = offset_of(&send(&server.addr, 0, "a"));
    let second = offset_of(&send(&server.addr, 1, "b"));
    assert_eq!(
        offset_of(&send(&server.addr, 0, "a")),
        first,
        "resent batch 0"
    );
    assert_eq!(
        offset_of(&send(&server.addr, 1, "b")),
        second,
        "resent batch 1"
    );
    match send(&server.addr, 5, "gap") {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::OUT_OF_ORDER_SEQUENCE, "{message}");
            assert!(message.contains("missing"), "{message}");
        }
        other => panic!("a batch after a gap was taken: {other:?}"),
    }
    // Another producer's numbering is its own.
    let other = offset_of(&produce_stamped(
        &server.addr,
        TOPIC,
        0,
        42,
        0,
        "{\"e\":\"c\"}",
    ));
    assert_eq!(other, second + 1);
    // After a restart the partition knows the stamps from its log.
    let addr = server.addr.clone();
    drop(d);
    server.kill9();
    let server = ServerProcess::restart_on(tmp.path(), &addr);
    assert_eq!(
        offset_of(&send(&server.addr, 1, "b")),
        second,
        "resent after a restart"
    );
    let third = offset_of(&send(&server.addr, 2, "d"));
    assert_eq!(third, other + 1);
    let d = server.connect();
    let stored: Vec<String> = read_all(&d, TOPIC, "check", Duration::from_secs(10))
        .events
        .values()
        .map(|e| String::from_utf8_lossy(&e.meta).into_owned())
        .collect();
    assert_eq!(
        stored,
        [
            "{\"e\":\"a\"}",
            "{\"e\":\"b\"}",
            "{\"e\":\"c\"}",
            "{\"e\":\"d\"}"
        ],
        "each batch once, in order"
    );
}

/// Pushes events 0, 1, 2, ... in windows of 20 until `stop`; records the
/// offset each one was acknowledged at, or `None` when its push failed.
fn push_until(d: Driver, stop: Arc<AtomicBool>, out: Arc<Mutex<Vec<Option<u64>>>>) {
    let t = d.open_topic(TOPIC).unwrap();
    let opts = ProducerOptions {
        idempotent: Some(true),
        ..Default::default()
    };
    let p = t.producer_with(opts).unwrap();
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) {
        let window: Vec<_> = (next..next + 20)
            .map(|i| p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 32]).ok())
            .collect();
        next += 20;
        let _ = p.flush();
        let mut out = out.lock().unwrap();
        for f in window {
            out.push(f.and_then(|f| f.wait().ok()).map(|id| id.offset));
        }
    }
}

#[test]
fn an_idempotent_producer_rides_out_a_restart_of_its_server() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    server
        .connect()
        .create_topic(TopicSpec::new(TOPIC, 1))
        .unwrap();
    let (stop, acked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let d = Driver::connect(&server.group_file).unwrap();
    let (s, a) = (stop.clone(), acked.clone());
    let pusher = std::thread::spawn(move || push_until(d, s, a));
    wait_for("acks before the kill", || {
        acked.lock().unwrap().len() >= 200
    });
    let addr = server.addr.clone();
    server.kill9();
    std::thread::sleep(Duration::from_millis(300));
    let server = ServerProcess::restart_on(tmp.path(), &addr);
    let at_restart = acked.lock().unwrap().len();
    wait_for("acks after the restart", || {
        acked.lock().unwrap().len() >= at_restart + 200
    });
    stop.store(true, Ordering::Release);
    pusher.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    let failed: Vec<usize> = (0..acked.len()).filter(|i| acked[*i].is_none()).collect();
    assert_eq!(failed, Vec::<usize>::new(), "pushes that failed");
    let stored = read_all(&server.connect(), TOPIC, "check", Duration::from_secs(30)).events;
    let seqs: Vec<u64> = stored
        .values()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_slice(&e.meta).unwrap();
            v["i"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(
        seqs,
        (0..acked.len() as u64).collect::<Vec<_>>(),
        "each event once, in order"
    );
    let offsets: Vec<u64> = stored.keys().map(|(_, o)| *o).collect();
    assert_eq!(acked.into_iter().flatten().collect::<Vec<_>>(), offsets);
}

#[test]
fn an_idempotent_producer_keeps_at_most_64_batches_in_flight() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    let d = server.connect();
    let t = d.create_topic(TopicSpec::new(TOPIC, 1)).unwrap();
    let opts = ProducerOptions {
        idempotent: Some(true),
        max_batches: 65,
        ..Default::default()
    };
    let e = t
        .producer_with(opts)
        .err()
        .expect("65 batches in flight refused");
    assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
}

fn signal(server: &ServerProcess, sig: i32) {
    // SAFETY: kill(2) on the server this test started; no memory involved.
    unsafe { libc::kill(server.pid(), sig) };
}

/// A producer (`idempotent` or not, with a 1 s request timeout) pushes to
/// the topic while its server is stopped (SIGSTOP: its connections stay
/// open), for `stopped_for` or until the push ends; the push's outcome and
/// how long it took. The producer must work again once the server does.
fn push_to_a_stopped_server(
    server: &ServerProcess,
    idempotent: bool,
    stopped_for: Option<Duration>,
) -> (Result<strom_client::EventId, strom_client::Error>, Duration) {
    let d = server.connect();
    d.create_topic(TopicSpec::new(TOPIC, 1)).unwrap();
    let opts = ProducerOptions {
        idempotent: Some(idempotent),
        request_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let p = d.open_topic(TOPIC).unwrap().producer_with(opts).unwrap();
    p.push("{\"i\":0}", vec![0u8; 16]).unwrap().wait().unwrap();
    signal(server, libc::SIGSTOP);
    let started = std::time::Instant::now();
    let pushed = p.push("{\"i\":1}", vec![1u8; 16]).unwrap();
    if let Some(pause) = stopped_for {
        std::thread::sleep(pause);
        signal(server, libc::SIGCONT);
    }
    let outcome = pushed.wait_timeout(Some(Duration::from_secs(60)));
    let took = started.elapsed();
    signal(server, libc::SIGCONT);
    let last = p.push("{\"i\":2}", vec![2u8; 16]).unwrap().wait();
    assert!(
        last.is_ok(),
        "the producer works again once the server answers: {last:?}"
    );
    (outcome, took)
}

/// `ProducerOptions::request_timeout` (Kafka's `request.timeout.ms`): a
/// push to a server that stopped answering fails as on a lost connection
/// once nothing was answered for the request timeout, instead of waiting
/// for ever; the producer opens a new connection for the next push.
#[test]
fn a_push_to_a_server_that_stopped_answering_fails_after_the_request_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    let (outcome, took) = push_to_a_stopped_server(&server, false, None);
    let e = outcome.expect_err("no server answered");
    assert_eq!(e.code(), ErrorCode::CONNECTION_CLOSED, "{e}");
    assert!(e.to_string().contains("request timeout"), "{e}");
    assert!(
        took >= Duration::from_secs(1),
        "failed before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// An idempotent producer resends what the request timeout cut off; the
/// server, answering again, may also take the first attempt, still queued
/// on the connection given up, and stores the batch once.
#[test]
fn a_batch_the_request_timeout_cut_off_is_stored_once_when_resent() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    let (outcome, _) = push_to_a_stopped_server(&server, true, Some(Duration::from_secs(3)));
    assert_eq!(outcome.expect("resent once the server answers").offset, 1);
    let stored = read_all(&server.connect(), TOPIC, "check", Duration::from_secs(30)).events;
    let metas: Vec<Vec<u8>> = stored.values().map(|e| e.meta.clone()).collect();
    let want: Vec<Vec<u8>> = (0..3)
        .map(|i| format!("{{\"i\":{i}}}").into_bytes())
        .collect();
    assert_eq!(metas, want, "each event once, in order");
}

/// `Driver::set_request_timeout`: a registry request to a master that
/// stopped answering (SIGSTOP: its connections stay open) fails with
/// `TIMEOUT` once the timeout has passed, instead of waiting for ever; the
/// same driver works again once the server does.
#[test]
fn a_registry_request_to_a_server_that_stopped_answering_fails_after_the_request_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path());
    let d = server.connect();
    d.set_request_timeout(Duration::from_secs(1));
    d.create_topic(TopicSpec::new(TOPIC, 1)).unwrap();
    signal(&server, libc::SIGSTOP);
    let started = std::time::Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let asking = d.clone();
    std::thread::spawn(move || {
        let _ = tx.send(asking.describe(TOPIC));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(30));
    let took = started.elapsed();
    signal(&server, libc::SIGCONT);
    let outcome = outcome.expect("still waiting after 30 s: no request timeout");
    let e = outcome.expect_err("no server answered");
    assert_eq!(e.code(), ErrorCode::TIMEOUT, "{e}");
    assert!(e.to_string().contains("request timeout"), "{e}");
    assert!(
        took >= Duration::from_secs(1),
        "failed before the timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    let info = d.describe(TOPIC).expect("the server answers again");
    assert_eq!(info.partitions.len(), 1);
}
