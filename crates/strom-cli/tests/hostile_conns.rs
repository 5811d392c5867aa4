//! Hostile connections: a client that asks for data and never reads the
//! answers, connections that stall mid-frame or never speak, and more
//! connections than the server allows. The server's memory stays bounded
//! (measured as its RSS), stalled connections are closed, idle ones are
//! not, and a well-behaved client keeps working.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::raw::{connect, expect_closed, request_frame, responses};
use common::ServerProcess;
use strom_client::TopicSpec;
use strom_proto::{Request, Response};

const MIB: u64 = 1 << 20;

/// Creates a file topic holding one event with `size` bytes of data.
fn one_big_event(server: &ServerProcess, size: usize) {
    let d = server.connect();
    let t = d.create_topic(TopicSpec::new("big", 1)).unwrap();
    let p = t.producer().unwrap();
    p.push("{}", vec![7u8; size]).unwrap().wait().unwrap();
}

fn hello_works(addr: &str) {
    let mut s = connect(addr);
    let hello = Request::Hello {
        client: "probe".into(),
        max_version: strom_proto::PROTOCOL_VERSION,
        nonce: Default::default(),
    };
    s.write_all(&request_frame(1, &hello, &[])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !responses(&got).iter().any(|(id, _)| *id == 1) {
        assert!(Instant::now() < deadline, "no answer to Hello");
        if let Ok(n) = s.read(&mut buf) {
            assert!(n > 0, "the server closed a well-behaved connection");
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert!(matches!(responses(&got)[0].1, Response::Hello { .. }));
}

#[test]
fn fetch_flood_without_reading_answers_keeps_server_memory_bounded() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_config(
        base.path(),
        "max_connection_buffer_bytes = 4194304\n", // 4 MiB
    );
    one_big_event(&server, MIB as usize);
    let before = server.rss_bytes();
    // 2,000 fetches of the whole 1 MiB event (2 GB), answers never read.
    let fetch = Request::FetchData {
        topic: "big".into(),
        partition: 0,
        items: vec![(0, vec![(0, MIB)])],
    };
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sent = 0;
    for id in 1..=2000u64 {
        // The server stops reading once its budget is used up, so our
        // writes eventually block; that is the point.
        if s.write_all(&request_frame(id, &fetch, &[])).is_err() {
            break;
        }
        sent += 1;
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = server.rss_bytes();
    let grown = after.saturating_sub(before);
    eprintln!(
        "{sent} unread 1 MiB fetches: server RSS +{} KiB",
        grown / 1024
    );
    assert!(
        grown < 96 * MIB,
        "server RSS grew by {} MiB ({} -> {} MiB) after {sent} unread fetches",
        grown / MIB,
        before / MIB,
        after / MIB
    );
    // Other clients are served meanwhile.
    hello_works(&server.addr);
    drop(s);
}

#[test]
fn stalled_connections_are_closed_and_idle_ones_are_not() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_config(
        base.path(),
        "handshake_timeout_ms = 500\nframe_timeout_ms = 500\n",
    );
    let before = server.rss_bytes();
    // 500 connections that send part of a header, then nothing.
    let stalled: Vec<TcpStream> = (0..500)
        .map(|_| {
            let mut s = connect(&server.addr);
            s.write_all(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
            s
        })
        .collect();
    // One that never speaks, and one that stalls in its second frame.
    let silent = connect(&server.addr);
    let mut second = connect(&server.addr);
    let hello = Request::Hello {
        client: "stall".into(),
        max_version: strom_proto::PROTOCOL_VERSION,
        nonce: Default::default(),
    };
    second.write_all(&request_frame(1, &hello, &[])).unwrap();
    second
        .write_all(&request_frame(2, &hello, &[])[..12])
        .unwrap();
    // An idle, well-behaved connection outlives the timeouts.
    let mut idle = connect(&server.addr);
    idle.write_all(&request_frame(1, &hello, &[])).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let grown = server.rss_bytes().saturating_sub(before);
    eprintln!("500 stalled connections: server RSS +{} KiB", grown / 1024);
    assert!(
        grown < 64 * MIB,
        "500 stalled connections cost {} MiB",
        grown / MIB
    );
    for (i, s) in stalled.into_iter().enumerate() {
        expect_closed(s, &format!("stalled connection {i}"));
    }
    expect_closed(silent, "a connection that never spoke");
    expect_closed(second, "a connection stalled in its second frame");
    idle.write_all(&request_frame(2, &hello, &[])).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !responses(&got).iter().any(|(id, _)| *id == 2) {
        assert!(
            Instant::now() < deadline,
            "the idle connection got no answer"
        );
        match idle.read(&mut buf) {
            Ok(0) => panic!("the server closed an idle, well-behaved connection"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
}

#[test]
fn connections_past_the_limit_are_closed_at_accept() {
    let base = tempfile::tempdir().unwrap();
    // Without the transform host, whose client would take a slot.
    let server =
        ServerProcess::start_with_config(base.path(), "max_connections = 20\ntransforms = false\n");
    // The test's own probes below need a slot: hold 19 of the 20.
    let held: Vec<TcpStream> = (0..19).map(|_| connect(&server.addr)).collect();
    hello_works(&server.addr);
    let extra: Vec<TcpStream> = (0..20).map(|_| connect(&server.addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // At most one of the extra connections got the free slot.
    let mut closed = 0;
    for mut s in extra {
        if peer_closed(&mut s) {
            closed += 1;
        }
    }
    assert!(
        closed >= 19,
        "only {closed} of 20 extra connections were refused"
    );
    drop(held);
    // Slots come back when connections close.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect(&server.addr);
        let hello = Request::Hello {
            client: "x".into(),
            max_version: strom_proto::PROTOCOL_VERSION,
            nonce: Default::default(),
        };
        s.write_all(&request_frame(1, &hello, &[])).unwrap();
        let mut buf = [0u8; 4096];
        if matches!(s.read(&mut buf), Ok(n) if n > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "no slot came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// True if the server closed `s` (EOF or reset), not merely silent.
fn peer_closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    match s.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn a_fetch_larger_than_a_frame_is_refused_before_anything_is_read() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with_config(base.path(), "max_frame_bytes = 16777216\n"); // 16 MiB
    one_big_event(&server, MIB as usize);
    let before = server.rss_bytes();
    // The whole 1 MiB event asked for 4,000 times, each as its own item
    // (its own read): about 4 GB in one answer.
    let fetch = Request::FetchData {
        topic: "big".into(),
        partition: 0,
        items: vec![(0, vec![(0, MIB)]); 4000],
    };
    let mut s = connect(&server.addr);
    s.write_all(&request_frame(7, &fetch, &[])).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !responses(&got).iter().any(|(id, _)| *id == 7) {
        assert!(
            Instant::now() < deadline,
            "no answer to the oversized fetch"
        );
        if let Ok(n) = s.read(&mut buf) {
            assert!(
                n > 0,
                "the server closed the connection instead of answering"
            );
            got.extend_from_slice(&buf[..n]);
        }
    }
    match &responses(&got)[0].1 {
        Response::Error { code, message } => {
            assert_eq!(*code, strom_proto::ErrorCode::FRAME_TOO_LARGE, "{message}");
        }
        other => panic!("expected FRAME_TOO_LARGE, got {other:?}"),
    }
    let grown = server.rss_bytes().saturating_sub(before);
    assert!(
        grown < 32 * MIB,
        "the refused fetch still grew the server by {} MiB",
        grown / MIB
    );
    hello_works(&server.addr);
}
