//! Hostile input over raw TCP: every malformed frame closes only its own
//! connection, the server process stays up, and a well-behaved client that
//! produces and consumes throughout sees all its events intact.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::raw::{
    assert_error_reply, connect, expect_closed, header, read_until_reply, request_frame,
};
use common::{event_payload, Rng, ServerProcess};
use strom_client::{ConsumerOptions, Driver, Next, StartPos, TopicSpec};
use strom_proto::Request;

/// Produce batches whose offset table lies: one event announcing 5000
/// bytes of metadata in a 10-byte payload; one announcing 1000 data bytes
/// while the bulk carries 10. Returns (what, meta section, bulk).
fn lying_batches() -> Vec<(&'static str, Bytes, Vec<u8>)> {
    let mut meta_lie = BytesMut::new();
    meta_lie.put_u32_le(1);
    meta_lie.put_u32_le(5000);
    meta_lie.put_u32_le(0);
    meta_lie.put_u64_le(0);
    meta_lie.put_slice(b"{\"x\":1}xyz");
    let mut data_lie = BytesMut::new();
    data_lie.put_u32_le(1);
    data_lie.put_u32_le(7);
    data_lie.put_u32_le(0);
    data_lie.put_u64_le(1000);
    data_lie.put_slice(b"{\"x\":2}");
    vec![
        ("meta length lie", meta_lie.freeze(), Vec::new()),
        ("data length lie", data_lie.freeze(), vec![9u8; 10]),
    ]
}

/// A Produce frame of one event to partition 0 of `topic`.
fn lying_produce(id: u64, topic: &str, meta: Bytes, bulk: &[u8]) -> Vec<u8> {
    let req = Request::Produce {
        topic: topic.into(),
        partition: 0,
        count: 1,
        acks_all: false,
        meta,
    };
    request_frame(id, &req, bulk)
}

/// Reads until the response to `id` arrived (or the connection closed).
/// The well-behaved client: rounds of 20 events produced to the single
/// partition of `topic`, then read back and checked, until `stop`.
fn good_client(
    group_file: std::path::PathBuf,
    rounds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> u64 {
    let driver = Driver::connect(&group_file).expect("good client connects");
    let topic = driver.open_topic("good").expect("open");
    let producer = topic.producer().expect("producer");
    let consumer = topic
        .consumer_with(
            "good-reader",
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .expect("consumer");
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) || rounds.load(Ordering::Acquire) < 3 {
        let futures: Vec<_> = (next..next + 20)
            .map(|i| {
                let (meta, data) = event_payload("good", i);
                producer.push(meta, data).expect("good push")
            })
            .collect();
        producer.flush().expect("good flush");
        for (k, f) in futures.into_iter().enumerate() {
            let id = f
                .wait_timeout(Some(Duration::from_secs(30)))
                .expect("good event acked");
            assert_eq!(
                (id.partition, id.offset),
                (0, next + k as u64),
                "the good client's events get dense offsets (nothing foreign was appended)"
            );
        }
        for i in next..next + 20 {
            let ev = match consumer
                .pull_timeout(Duration::from_secs(30))
                .expect("good pull")
            {
                Next::Event(ev) => ev,
                Next::EndOfStream => panic!("unexpected end of stream"),
            };
            let (meta, data) = event_payload("good", i);
            assert_eq!(ev.offset, i);
            assert_eq!(ev.raw().as_ref(), meta.as_slice(), "metadata of event {i}");
            assert!(ev.data_vec() == data, "data of event {i}");
        }
        next += 20;
        rounds.fetch_add(1, Ordering::AcqRel);
    }
    next
}

fn wait_rounds(rounds: &AtomicU64, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while rounds.load(Ordering::Acquire) < at_least {
        assert!(Instant::now() < deadline, "the good client stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn hostile_frames_close_only_their_connection() {
    let mut rng = Rng::from_time();
    let base = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(base.path());
    let admin = server.connect();
    admin
        .create_topic(TopicSpec::new("good", 1))
        .expect("creating the topic");

    let rounds = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let good = {
        let (gf, rounds, stop) = (server.group_file.clone(), rounds.clone(), stop.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                good_client(gf, rounds, stop)
            }));
            let _ = done_tx.send(());
            r
        })
    };
    wait_rounds(&rounds, 1);
    let addr = server.addr.clone();
    let mut malformed = 0;

    // (a) random bytes (never the magic, so the header is certainly bad).
    {
        let mut junk = rng.bytes(4096);
        junk[4] = 0;
        let mut s = connect(&addr);
        let _ = s.write_all(&junk);
        expect_closed(s, "random bytes");
        malformed += 1;
    }
    assert!(server.is_alive(), "server survives random bytes");

    // (b) a valid header announcing a ~4 GiB frame.
    {
        let mut s = connect(&addr);
        s.write_all(&header(u32::MAX, 1, 0, 3, 11, 16))
            .expect("write header");
        let got = expect_closed(s, "4 GiB frame");
        let msg = assert_error_reply(&got, 11, "4 GiB frame");
        assert!(
            msg.contains("frame"),
            "the error says the frame was too large: {msg}"
        );
        malformed += 1;
    }
    assert!(server.is_alive(), "server survives a 4 GiB frame header");

    // (c) a truncated frame: 100 bytes announced, 10 sent, then EOF.
    {
        let mut s = connect(&addr);
        s.write_all(&header(100, 1, 0, 3, 12, 80))
            .expect("write header");
        s.write_all(&[7u8; 10]).expect("write partial body");
        s.shutdown(std::net::Shutdown::Write).expect("half close");
        expect_closed(s, "truncated frame");
    }
    assert!(server.is_alive(), "server survives a truncated frame");

    // (d) a valid header with an unknown opcode.
    {
        let mut s = connect(&addr);
        s.write_all(&header(20, 1, 0, 0xFFEE, 13, 0))
            .expect("write header");
        let got = expect_closed(s, "unknown opcode");
        assert_error_reply(&got, 13, "unknown opcode");
        malformed += 1;
    }
    assert!(server.is_alive(), "server survives an unknown opcode");

    // (d') a bad protocol version, and a response frame sent by a client.
    for (what, frame) in [
        ("bad version", header(20, 99, 0, 3, 14, 0)),
        ("response kind from a client", header(20, 1, 1, 3, 15, 0)),
    ] {
        let mut s = connect(&addr);
        s.write_all(&frame).expect("write header");
        expect_closed(s, what);
        malformed += 1;
    }
    assert!(server.is_alive());

    // (e) Produce whose offset table lies about lengths: answered with an
    // error, nothing appended (the good client checks its offsets stay
    // dense), the server carries on. That the connection is also closed is
    // checked by `produce_with_lying_batch_table_closes_its_connection`.
    for (k, (what, meta, bulk)) in lying_batches().into_iter().enumerate() {
        let id = 20 + k as u64;
        let mut s = connect(&addr);
        s.write_all(&lying_produce(id, "good", meta, &bulk))
            .expect("write produce");
        let got = read_until_reply(&mut s, id, what);
        let msg = assert_error_reply(&got, id, what);
        assert!(
            msg.contains("batch"),
            "{what}: the error names the batch: {msg}"
        );
        assert!(server.is_alive(), "server survives a {what}");
    }

    // Everything at once, while the good client keeps going.
    let before = rounds.load(Ordering::Acquire);
    let burst: Vec<_> = (0..16u64)
        .map(|k| {
            let addr = addr.clone();
            let junk = rng.bytes(1 + k as usize * 997);
            std::thread::spawn(move || {
                let mut s = connect(&addr);
                match k % 3 {
                    0 => {
                        let mut junk = junk;
                        if junk.len() > 5 {
                            junk[4] = 0;
                        } else {
                            junk.resize(24, 0);
                        }
                        let _ = s.write_all(&junk);
                    }
                    1 => {
                        let _ = s.write_all(&header(u32::MAX, 1, 0, 9, k, 100));
                    }
                    _ => {
                        let _ = s.write_all(&header(20, 1, 0, 0xF000 + k as u16, k, 0));
                    }
                }
                expect_closed(s, "burst");
            })
        })
        .collect();
    for b in burst {
        b.join().expect("every burst connection was closed");
    }
    malformed += 16;
    wait_rounds(&rounds, before + 2);

    stop.store(true, Ordering::Release);
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the good client finished within 60 s");
    let produced = match good.join().expect("good client thread") {
        Ok(n) => n,
        Err(e) => std::panic::resume_unwind(e),
    };
    assert!(server.is_alive(), "the server is still running");
    let info = admin.describe("good").expect("describe");
    assert_eq!(
        info.partitions[0].next_offset, produced,
        "only the good client's events were appended"
    );

    let stderr = server.stderr();
    let warned = stderr
        .matches("closing connection after a malformed frame")
        .count();
    assert!(
        warned >= malformed,
        "the server logs each malformed frame ({warned} of {malformed} logged); stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "no panic in the server; stderr:\n{stderr}"
    );
}

#[test]
fn produce_with_lying_batch_table_closes_its_connection() {
    let base = tempfile::tempdir().expect("tempdir");
    let mut server = ServerProcess::start(base.path());
    let admin = server.connect();
    admin
        .create_topic(TopicSpec::new("good", 1))
        .expect("creating the topic");
    for (k, (what, meta, bulk)) in lying_batches().into_iter().enumerate() {
        let id = 30 + k as u64;
        let mut s = connect(&server.addr);
        s.write_all(&lying_produce(id, "good", meta, &bulk))
            .expect("write produce");
        let got = expect_closed(s, what);
        assert_error_reply(&got, id, what);
        assert!(server.is_alive(), "server survives a {what}");
    }
    let info = admin.describe("good").expect("describe");
    assert_eq!(info.partitions[0].next_offset, 0, "nothing was appended");
}
