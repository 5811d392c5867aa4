//! Consumer-group names that reach a partition owner in raw frames: a name
//! becomes `groups/<name>.ledger` in the partition directory, so one that
//! climbs out (`../../x`) must be refused before any file is created or
//! removed, and a shared group the registry never created is not opened.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::raw::{connect, read_until_reply, request_frame, responses};
use common::ServerProcess;
use std::time::Duration;

use strom_client::{ConsumerGroupMode, ErrorCode, GroupOptions, Next, TopicSpec};
use strom_proto::{ConsumerGroupSpec, Request, Response};

/// A server with topic `t` (one file partition); returns it and the
/// partition's directory.
fn server_with_topic(base: &Path) -> (ServerProcess, PathBuf) {
    let server = ServerProcess::start(base);
    let d = server.connect();
    d.create_topic(TopicSpec::new("t", 1)).expect("creating t");
    let topics = server.data_dir.join("topics");
    let dir = std::fs::read_dir(&topics)
        .expect("listing topics/")
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with("t."))
        .expect("t's directory")
        .path()
        .join("0");
    assert!(dir.is_dir(), "partition 0 lives in {}", dir.display());
    (server, dir)
}

/// A group name that makes `<partition dir>/groups/<name>.ledger` the
/// file `<base>/<file>.ledger`, outside the data directory.
fn climbing_name(base: &Path, partition_dir: &Path, file: &str) -> String {
    let depth = partition_dir
        .strip_prefix(base)
        .expect("the partition is under the test's directory")
        .components()
        .count()
        + 1; // groups/
    format!("{}{file}", "../".repeat(depth))
}

/// Sends `req` on a fresh raw connection and returns the answer.
fn ask(addr: &str, req: &Request) -> Response {
    let mut s = connect(addr);
    s.write_all(&request_frame(5, req, b"")).expect("sending");
    let got = read_until_reply(&mut s, 5, "a raw request");
    responses(&got)
        .into_iter()
        .find(|(id, _)| *id == 5)
        .map(|(_, r)| r)
        .expect("an answer")
}

fn subscribe(spec: ConsumerGroupSpec) -> Request {
    Request::GroupSubscribe {
        stream: 1,
        spec,
        partition: 0,
        consumer: 1,
        epoch: 0,
        prefetch: 16,
    }
}

/// Every file under `dir` whose name ends with `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().ends_with(suffix) {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_climbing_group_name_is_refused_and_creates_no_file() {
    let base = tempfile::tempdir().expect("tempdir");
    let (server, dir) = server_with_topic(base.path());
    let name = climbing_name(base.path(), &dir, "escape");
    let spec = ConsumerGroupSpec::new(name.clone(), "t", ConsumerGroupMode::Shared);
    match ask(&server.addr, &subscribe(spec.clone())) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::INVALID_ARGUMENT, "{message}");
            assert!(message.contains("consumer group name"), "{message}");
        }
        other => panic!("GroupSubscribe for group {name:?} was taken: {other:?}"),
    }
    // The owner's stats path opens group state too.
    let stats = Request::ConsumerGroupStats {
        spec,
        partitions: vec![0],
    };
    let _ = ask(&server.addr, &stats);
    assert_eq!(
        files_ending(base.path(), "escape.ledger"),
        Vec::<PathBuf>::new(),
        "no ledger file was created for {name:?}"
    );
}

#[test]
fn drop_consumer_group_with_a_climbing_name_deletes_nothing() {
    let base = tempfile::tempdir().expect("tempdir");
    let (server, dir) = server_with_topic(base.path());
    let victim = base.path().join("victim.ledger");
    std::fs::write(&victim, b"not the server's").expect("writing the victim file");
    let group = climbing_name(base.path(), &dir, "victim");
    let req = Request::DropConsumerGroup {
        topic: "t".into(),
        group: group.clone(),
    };
    match ask(&server.addr, &req) {
        Response::Error { .. } => {}
        other => panic!("DropConsumerGroup of {group:?} was taken: {other:?}"),
    }
    assert!(
        victim.exists(),
        "DropConsumerGroup of {group:?} deleted {}",
        victim.display()
    );
}

#[test]
fn group_subscribe_for_a_group_the_registry_never_created_is_refused() {
    let base = tempfile::tempdir().expect("tempdir");
    let (server, dir) = server_with_topic(base.path());
    let spec = ConsumerGroupSpec::new("ghost", "t", ConsumerGroupMode::Shared);
    match ask(&server.addr, &subscribe(spec)) {
        Response::Error { code, message } => {
            assert_eq!(code, ErrorCode::CONSUMER_GROUP_NOT_FOUND, "{message}");
            assert!(message.contains("ghost"), "{message}");
        }
        other => panic!("a GroupSubscribe for an unknown group was taken: {other:?}"),
    }
    assert_eq!(
        files_ending(&dir, ".ledger"),
        Vec::<PathBuf>::new(),
        "no ledger was created for the unknown group"
    );
    // A group the registry created is still served.
    let d = server.connect();
    let t = d.open_topic("t").expect("opening t");
    let p = t.producer().expect("a producer");
    p.push("{\"n\":1}", ()).expect("push");
    p.close().expect("closing the producer");
    let c = t
        .consumer_group("real", GroupOptions::shared())
        .expect("joining a real shared group");
    match c.pull_timeout(Duration::from_secs(20)) {
        Ok(Next::Event(ev)) => assert_eq!(&ev.raw()[..], b"{\"n\":1}"),
        Ok(_) => panic!("the real group's stream ended without its event"),
        Err(e) => panic!("the real group's member failed: {e}"),
    }
}
