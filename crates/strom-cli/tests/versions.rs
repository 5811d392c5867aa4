//! Protocol versions: `Hello` settles the newest version both sides speak,
//! whatever version the client offers, and a frame in a version the server
//! does not speak is refused by number.

mod common;

use std::io::Write;

use common::raw::{connect, expect_closed, header, read_until_reply, request_frame, responses};
use common::ServerProcess;
use strom_proto::{ErrorCode, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

fn hello(max_version: u8) -> Request {
    Request::Hello {
        client: "versions test".into(),
        max_version,
        nonce: Default::default(),
    }
}

/// Sends `Hello` offering `max_version` and returns the answer.
fn answer_to_hello(addr: &str, max_version: u8) -> Response {
    let mut s = connect(addr);
    s.write_all(&request_frame(1, &hello(max_version), &[]))
        .unwrap();
    let got = read_until_reply(&mut s, 1, "hello");
    let (id, r) = responses(&got).into_iter().next().expect("an answer");
    assert_eq!(id, 1);
    r
}

#[test]
fn hello_settles_the_newest_version_both_sides_speak() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    // A newer client: the server's newest version.
    match answer_to_hello(&server.addr, u8::MAX) {
        Response::Hello { version, .. } => assert_eq!(version, PROTOCOL_VERSION),
        other => panic!("expected Hello, got {other:?}"),
    }
    // A client as old as the oldest version the server speaks.
    match answer_to_hello(&server.addr, MIN_PROTOCOL_VERSION) {
        Response::Hello { version, .. } => assert_eq!(version, MIN_PROTOCOL_VERSION),
        other => panic!("expected Hello, got {other:?}"),
    }
    // A client older than that is told so, by number.
    match answer_to_hello(&server.addr, MIN_PROTOCOL_VERSION - 1) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::UNSUPPORTED_VERSION);
            assert!(message.contains("up to 0"), "{message}");
        }
        other => panic!("expected UNSUPPORTED_VERSION, got {other:?}"),
    }
    // The client library negotiates on connect and works as before.
    let d = server.connect();
    d.create_topic(strom_client::TopicSpec::new("v", 1))
        .unwrap();
}

#[test]
fn a_frame_in_an_unspoken_version_is_refused_naming_it() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    let mut s = connect(&server.addr);
    // An empty `ListTopics` (opcode 4) in version PROTOCOL_VERSION + 1.
    s.write_all(&header(20, PROTOCOL_VERSION + 1, 0, 4, 7, 0))
        .unwrap();
    let got = expect_closed(s, "unspoken version");
    match responses(&got).first() {
        Some((_, Response::Error { code, message })) => {
            assert_eq!(*code, ErrorCode::UNSUPPORTED_VERSION);
            assert!(
                message.contains(&(PROTOCOL_VERSION + 1).to_string()),
                "{message}"
            );
        }
        other => panic!("expected UNSUPPORTED_VERSION, got {other:?}"),
    }
}

#[test]
fn a_version_1_client_registers_producers_and_reads_topic_state_without_leases() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    server
        .connect()
        .create_topic(strom_client::TopicSpec::new("old", 1))
        .unwrap();
    let mut s = connect(&server.addr);
    s.write_all(&request_frame(1, &hello(MIN_PROTOCOL_VERSION), &[]))
        .unwrap();
    read_until_reply(&mut s, 1, "hello");
    let ask = |s: &mut std::net::TcpStream, id: u64, req: Request| {
        s.write_all(&request_frame(id, &req, &[])).unwrap();
        let got = read_until_reply(s, id, "a version-1 request");
        let h: [u8; strom_proto::FRAME_HEADER_LEN] =
            got[..strom_proto::FRAME_HEADER_LEN].try_into().unwrap();
        let h = strom_proto::FrameHeader::decode(&h, u32::MAX).unwrap();
        assert_eq!(h.version, MIN_PROTOCOL_VERSION, "answered in version 1");
        responses(&got).into_iter().next().expect("an answer").1
    };
    match ask(
        &mut s,
        2,
        Request::RegisterProducer {
            topic: "old".into(),
        },
    ) {
        Response::Producer { id } => assert_eq!(id, 1),
        other => panic!("expected Producer, got {other:?}"),
    }
    let describe = Request::DescribeTopic {
        name: "old".into(),
        offsets: false,
    };
    match ask(&mut s, 3, describe) {
        // Decoded at version 1: the TopicState has no expired_producers.
        Response::Topic(info) => {
            assert_eq!(info.state.open_producers, 1);
            assert_eq!(info.state.expired_producers, 0);
        }
        other => panic!("expected Topic, got {other:?}"),
    }
}
