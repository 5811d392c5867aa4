//! Idempotent producers on a real `strom server` (docs/replication.md): a
//! batch resent with the same producer stamp, as after a lost reply, is
//! answered with the offsets it got the first time and stored once, also
//! after the server restarts; a batch that skips a sequence number is
//! refused with `OUT_OF_ORDER_SEQUENCE`.

mod common;

use std::time::Duration;

use common::raw::produce_stamped;
use common::{read_all, ServerProcess};
use strom_client::{ErrorCode, TopicSpec};
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
    assert_eq!(offset_of(&send(&server.addr, 0, "a")), first, "resent batch 0");
    assert_eq!(offset_of(&send(&server.addr, 1, "b")), second, "resent batch 1");
    match send(&server.addr, 5, "gap") {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::OUT_OF_ORDER_SEQUENCE, "{message}");
            assert!(message.contains("missing"), "{message}");
        }
        other => panic!("a batch after a gap was taken: {other:?}"),
    }
    // Another producer's numbering is its own.
    let other = offset_of(&produce_stamped(&server.addr, TOPIC, 0, 42, 0, "{\"e\":\"c\"}"));
    assert_eq!(other, second + 1);
    // After a restart the partition knows the stamps from its log.
    let addr = server.addr.clone();
    drop(d);
    server.kill9();
    let server = ServerProcess::restart_on(tmp.path(), &addr);
    assert_eq!(offset_of(&send(&server.addr, 1, "b")), second, "resent after a restart");
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
        ["{\"e\":\"a\"}", "{\"e\":\"b\"}", "{\"e\":\"c\"}", "{\"e\":\"d\"}"],
        "each batch once, in order"
    );
}
