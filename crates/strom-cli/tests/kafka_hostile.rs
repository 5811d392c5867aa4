//! Hostile input on the Kafka port of a real `strom server`: huge and
//! negative frame sizes, counts that lie, garbage and corrupt record
//! batches. A malformed frame closes only its connection with a logged
//! error; an unsupported API key or version is answered with
//! `UNSUPPORTED_VERSION` and the connection stays; a corrupt record batch
//! is answered `CORRUPT_MESSAGE`. The server keeps serving kcat throughout.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::kafka::start;
use common::kafka_raw::{connect, i16_at, request, response, string};
use common::ServerProcess;
use strom_client::TopicSpec;

/// True once the server closed `s` (EOF or reset), within the timeout.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

/// ApiVersions v0 on `s` answers with error 0 and our correlation id.
fn api_versions_ok(s: &mut TcpStream, correlation: i32) {
    s.write_all(&request(18, 0, correlation, &[]))
        .expect("sending ApiVersions");
    let r = response(s).expect("an ApiVersions answer");
    assert_eq!(&r[..4], &correlation.to_be_bytes());
    assert_eq!(i16_at(&r, 4), 0, "ApiVersions error code");
}

/// Produce v3 of `records` to partition 0 of `topic`, acks 1.
fn produce_body(topic: &str, records: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes());
    b.extend_from_slice(&5000i32.to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes());
    string(&mut b, topic);
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(records);
    b
}

/// A v2 record batch of one record whose CRC is wrong.
fn bad_crc_batch() -> Vec<u8> {
    let record = [0x10u8, 0, 0, 0, 1, b'k', 6, b'v', b'a', b'l', 0];
    let mut after_len = Vec::new();
    after_len.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
    after_len.push(2); // magic
    after_len.extend_from_slice(&0xdead_beefu32.to_be_bytes());
    after_len.extend_from_slice(&0i16.to_be_bytes());
    after_len.extend_from_slice(&0i32.to_be_bytes());
    after_len.extend_from_slice(&1000i64.to_be_bytes());
    after_len.extend_from_slice(&1000i64.to_be_bytes());
    after_len.extend_from_slice(&(-1i64).to_be_bytes());
    after_len.extend_from_slice(&(-1i16).to_be_bytes());
    after_len.extend_from_slice(&(-1i32).to_be_bytes());
    after_len.extend_from_slice(&1i32.to_be_bytes());
    after_len.extend_from_slice(&record);
    let mut b = 0i64.to_be_bytes().to_vec();
    b.extend_from_slice(&(after_len.len() as i32).to_be_bytes());
    b.extend(after_len);
    b
}

fn kcat_lists(broker: &str, topic: &str) {
    let out = Command::new("kcat")
        .args(["-b", broker, "-L", "-t", topic])
        .output()
        .expect("running kcat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(&format!("topic \"{topic}\"")),
        "kcat -L after hostile input: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hostile_kafka_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut server, broker) = start(dir.path());
    server
        .connect()
        .create_topic(TopicSpec::new("h", 1))
        .expect("creating the topic");

    // A huge size prefix: closed before anything is allocated.
    let mut s = connect(&broker);
    s.write_all(&i32::MAX.to_be_bytes()).expect("writing");
    assert!(closed(&mut s), "a 2 GiB frame closes the connection");
    // A negative size.
    let mut s = connect(&broker);
    s.write_all(&(-5i32).to_be_bytes()).expect("writing");
    assert!(closed(&mut s), "a negative size closes the connection");
    // Garbage too short for a header.
    let mut s = connect(&broker);
    s.write_all(&[0, 0, 0, 3, 1, 2, 3]).expect("writing");
    assert!(closed(&mut s), "a 3-byte frame closes the connection");
    // Metadata v1 whose topic array claims 2^31-1 entries.
    let mut s = connect(&broker);
    let mut body = i32::MAX.to_be_bytes().to_vec();
    string(&mut body, "h");
    s.write_all(&request(3, 1, 1, &body)).expect("writing");
    assert!(closed(&mut s), "a lying array count closes the connection");
    // Produce v3 whose partition array lies.
    let mut s = connect(&broker);
    let mut body = produce_body("h", &bad_crc_batch());
    let at = 2 + 2 + 4 + 4 + 3; // acks, timeout, topics, name
    body[at..at + 4].copy_from_slice(&0x0fff_ffffi32.to_be_bytes());
    s.write_all(&request(0, 3, 2, &body)).expect("writing");
    assert!(
        closed(&mut s),
        "a lying partition count closes the connection"
    );

    // An unknown API key and an unsupported version are answered, and the
    // connection goes on.
    let mut s = connect(&broker);
    s.write_all(&request(999, 0, 41, &[1, 2, 3]))
        .expect("writing");
    let r = response(&mut s).expect("an answer to an unknown key");
    assert_eq!(&r[..4], &41i32.to_be_bytes());
    assert_eq!(i16_at(&r, 4), 35, "UNSUPPORTED_VERSION");
    s.write_all(&request(0, 99, 42, &[])).expect("writing");
    let r = response(&mut s).expect("an answer to an unsupported version");
    assert_eq!(&r[..4], &42i32.to_be_bytes());
    assert_eq!(i16_at(&r, 4), 35, "UNSUPPORTED_VERSION");
    api_versions_ok(&mut s, 43);
    // ApiVersions at a version from the future: the v0 error answer.
    s.write_all(&request(18, 42, 44, &[])).expect("writing");
    let r = response(&mut s).expect("an answer to ApiVersions v42");
    assert_eq!(i16_at(&r, 4), 35, "UNSUPPORTED_VERSION");

    // A record batch with a bad CRC: CORRUPT_MESSAGE, connection stays.
    s.write_all(&request(0, 3, 45, &produce_body("h", &bad_crc_batch())))
        .expect("writing");
    let r = response(&mut s).expect("an answer to a corrupt batch");
    // corr, topics count, name "h", partitions count, index, error code.
    let at = 4 + 4 + 3 + 4 + 4;
    assert_eq!(i16_at(&r, at), 2, "CORRUPT_MESSAGE");
    api_versions_ok(&mut s, 46);

    // Random garbage frames on fresh connections.
    let mut rng = common::Rng::new(0x006b_6166_6b61);
    for _ in 0..200 {
        let mut s = connect(&broker);
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let n = 10 + rng.below(200) as usize;
        let mut f = (n as i32).to_be_bytes().to_vec();
        f.extend(rng.bytes(n));
        let _ = s.write_all(&f);
        // Answered or closed; either way, nothing hangs past the timeout.
        let _ = response(&mut s);
    }

    assert!(server.is_alive(), "the server survived");
    let err = server.stderr();
    assert!(
        err.contains("closing Kafka connection") && err.contains("exceeds max_frame_bytes"),
        "malformed frames are logged; stderr:\n{err}"
    );
    // And the next client is served.
    let mut s = connect(&broker);
    api_versions_ok(&mut s, 99);
    kcat_lists(&broker, "h");
}

#[test]
fn a_silent_kafka_connection_is_closed_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The Kafka listener from the config file this time.
    let server = ServerProcess::start_with_config(
        dir.path(),
        "kafka_listen = \"127.0.0.1:0\"\nhandshake_timeout_ms = 300\n",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let broker = loop {
        let err = server.stderr();
        if let Some(a) = err
            .lines()
            .find_map(|l| l.strip_prefix("strom kafka listening on "))
        {
            break a.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no Kafka address; stderr:\n{err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut silent = connect(&broker);
    let t0 = Instant::now();
    assert!(closed(&mut silent), "a silent connection is closed");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // A connection that speaks is served, and stays open while idle.
    let mut s = connect(&broker);
    api_versions_ok(&mut s, 1);
    std::thread::sleep(Duration::from_millis(600));
    api_versions_ok(&mut s, 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.stderr().contains("no request within") {
        assert!(Instant::now() < deadline, "logged: {}", server.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
}
