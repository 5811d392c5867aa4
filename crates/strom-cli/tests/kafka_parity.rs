//! Kafka clients get the guarantees native clients get, against a real
//! `strom server --kafka-listen`: an idempotent Kafka producer's retry is
//! recognised after a server restart (the partition's durable producer
//! table, rebuilt from the stored batch stamps), and producer ids are never
//! handed out twice across restarts.

mod common;

use std::time::Duration;

use common::kafka_raw::{connect, init_producer_id, produce, record_batch};
use strom_client::TopicSpec;

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;

fn end_offset(server: &common::ServerProcess, topic: &str) -> u64 {
    server
        .connect()
        .open_topic(topic)
        .expect("topic")
        .describe()
        .expect("describe")
        .partitions[0]
        .next_offset
}

#[test]
fn an_idempotent_kafka_producers_retry_after_a_restart_is_not_stored_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = common::kafka::start(dir.path());
    server
        .connect()
        .create_topic(TopicSpec::new("t", 1))
        .expect("topic");
    let mut s = connect(&broker);
    let (code, pid, epoch) = init_producer_id(&mut s, 1);
    assert_eq!((code, epoch), (0, 0), "InitProducerId");
    let first = record_batch(pid, 0, 0, &[b"a", b"b", b"c"]);
    let second = record_batch(pid, 0, 3, &[b"d", b"e"]);
    assert_eq!(produce(&mut s, 2, "t", &first), (0, 0));
    assert_eq!(produce(&mut s, 3, "t", &second), (0, 3));
    drop(s);
    let (status, _) = server.terminate(Duration::from_secs(10));
    assert!(status.success(), "server stopped cleanly: {status}");

    // The answers were lost; the producer retries both after the restart.
    let (server, broker) = common::kafka::start(dir.path());
    let mut s = connect(&broker);
    assert_eq!(
        produce(&mut s, 1, "t", &second),
        (0, 3),
        "a retry answers with its first offset"
    );
    assert_eq!(produce(&mut s, 2, "t", &first), (0, 0));
    assert_eq!(end_offset(&server, "t"), 5, "nothing stored twice");
    // A gap is refused as Kafka refuses it; the next batch is taken.
    let gap = record_batch(pid, 0, 9, &[b"x"]);
    assert_eq!(
        produce(&mut s, 3, "t", &gap).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(
        produce(&mut s, 4, "t", &record_batch(pid, 0, 5, &[b"f"])),
        (0, 5)
    );
    // A bumped epoch starts from 0; a late batch of the old one is refused.
    assert_eq!(
        produce(&mut s, 5, "t", &record_batch(pid, 1, 0, &[b"g"])),
        (0, 6)
    );
    let late = record_batch(pid, 0, 6, &[b"h"]);
    assert_eq!(produce(&mut s, 6, "t", &late).0, INVALID_PRODUCER_EPOCH);
    assert_eq!(end_offset(&server, "t"), 7);
    // The restarted server never hands out the id again.
    let (code, again, _) = init_producer_id(&mut s, 7);
    assert_eq!(code, 0);
    assert_ne!(again, pid, "producer ids are unique across restarts");
}

/// kcat producing `line` with the header `strom.meta: meta` to `topic`:
/// (success, stderr).
fn kcat_produce_with_meta(broker: &str, topic: &str, meta: &str, line: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("kcat")
        .args(["-b", broker, "-P", "-t", topic, "-p", "0"])
        .args(["-H", &format!("strom.meta={meta}")])
        .args(["-X", "message.timeout.ms=10000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning kcat");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{line}\n").as_bytes())
        .expect("writing to kcat");
    let status = common::wait_bounded(&mut child, Duration::from_secs(60)).expect("kcat finished");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("kcat stderr");
    (status.success(), err)
}

#[test]
fn kafka_records_the_topics_validator_refuses_get_invalid_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = common::kafka::start(dir.path());
    let mut spec = TopicSpec::new("v", 1);
    spec.validator = "json-schema".into();
    spec.schema = Some(r#"{"type":"object","required":["run"]}"#.into());
    server.connect().create_topic(spec).expect("topic");
    let (ok, err) = kcat_produce_with_meta(&broker, "v", r#"{"run":7}"#, "good");
    assert!(ok, "a valid record is taken: {err}");
    let (ok, err) = kcat_produce_with_meta(&broker, "v", r#"{"shot":8}"#, "bad");
    assert!(!ok, "kcat reports the refused record");
    assert!(
        err.contains("validate record") || err.contains("INVALID_RECORD"),
        "kcat names Kafka's INVALID_RECORD: {err}"
    );
    // A plain Kafka record's metadata (its key, headers and timestamp) is
    // not what the schema asks for either.
    let mut s = connect(&broker);
    let (code, _) = produce(&mut s, 1, "v", &record_batch(-1, -1, -1, &[b"plain"]));
    assert_eq!(code, 87, "INVALID_RECORD");
    assert_eq!(
        end_offset(&server, "v"),
        1,
        "only the valid record is stored"
    );
}

#[test]
fn a_raw_native_producer_is_refused_what_the_validator_refuses() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = common::ServerProcess::start(dir.path());
    let mut spec = TopicSpec::new("v", 1);
    spec.validator = "json-schema".into();
    spec.schema = Some(r#"{"type":"object","required":["run"]}"#.into());
    server.connect().create_topic(spec).expect("topic");
    let good = common::raw::produce_stamped(&server.addr, "v", 0, 5, 0, r#"{"run":1}"#);
    assert!(
        matches!(good, strom_proto::Response::Produced { base_offset: 0, .. }),
        "{good:?}"
    );
    match common::raw::produce_stamped(&server.addr, "v", 0, 5, 1, r#"{"shot":2}"#) {
        strom_proto::Response::Error { code, message, .. } => {
            assert_eq!(code, strom_proto::ErrorCode::INVALID_METADATA);
            assert!(message.contains("event 0"), "names the event: {message}");
        }
        other => panic!("expected INVALID_METADATA, got {other:?}"),
    }
    assert_eq!(end_offset(&server, "v"), 1);
}

#[test]
fn a_compressed_topic_reads_and_writes_plain_values_through_the_kafka_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = common::kafka::start(dir.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("z", 1).with_compression("zstd"))
        .expect("topic");
    // A native producer frames its 4,096-byte event; kcat gets the event.
    let event: String = (0..4096).map(|i| (b'a' + (i % 7) as u8) as char).collect();
    let p = topic.producer().expect("producer");
    p.push("{}", event.clone().into_bytes())
        .expect("push")
        .wait()
        .expect("stored");
    // kcat writes a 4,096-byte value; a native consumer decodes it.
    let from_kcat: String = (0..4096).map(|i| (b'k' + (i % 5) as u8) as char).collect();
    common::kafka::kcat(
        &["-b", &broker, "-P", "-t", "z", "-p", "0"],
        format!("{from_kcat}\n").as_bytes(),
    );
    let out = common::kafka::kcat(
        &[
            "-b",
            &broker,
            "-C",
            "-t",
            "z",
            "-p",
            "0",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%s\n",
        ],
        b"",
    );
    let values: Vec<&str> = std::str::from_utf8(&out).expect("UTF-8").lines().collect();
    assert_eq!(values.len(), 2, "two records");
    assert_eq!(values[0].len(), 4096, "the event, not its frame");
    assert_eq!(values[0], event);
    assert_eq!(values[1], from_kcat);
    let read = common::read_all(&driver, "z", "reader", Duration::from_secs(10));
    let data: Vec<&[u8]> = read.events.values().map(|e| e.data.as_slice()).collect();
    assert_eq!(data, vec![event.as_bytes(), from_kcat.as_bytes()]);
}

/// kcat producing one line to `topic` with `extra` options: (success,
/// seconds it took, stderr).
fn kcat_produce(broker: &str, topic: &str, extra: &[&str]) -> (bool, f64, String) {
    use std::io::Write;
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new("kcat")
        .args(["-b", broker, "-P", "-t", topic])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning kcat");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"first\n")
        .expect("writing to kcat");
    let status = common::wait_bounded(&mut child, Duration::from_secs(90)).expect("kcat finished");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("kcat stderr");
    (status.success(), started.elapsed().as_secs_f64(), err)
}

#[test]
fn a_topic_is_created_on_first_use_when_the_setting_is_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = common::kafka::start_with_config(
        dir.path(),
        "kafka_auto_create_topics = true\nkafka_auto_create_partitions = 3\n",
    );
    let (ok, _, err) = kcat_produce(&broker, "fresh", &[]);
    assert!(ok, "kcat produced to a topic created on first use: {err}");
    let info = server
        .connect()
        .open_topic("fresh")
        .expect("the topic exists")
        .describe()
        .expect("describe");
    assert_eq!(info.partitions.len(), 3, "kafka_auto_create_partitions");
    let events: u64 = info.partitions.iter().map(|p| p.next_offset).sum();
    assert_eq!(events, 1);
}

#[test]
fn without_auto_creation_a_produce_to_a_missing_topic_fails_fast() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = common::kafka::start(dir.path());
    // librdkafka waits topic.metadata.propagation.max.ms (30 s) for a topic
    // the broker calls unknown, as with Apache Kafka; cut that short to see
    // that the server answers at once.
    let (ok, secs, err) = kcat_produce(
        &broker,
        "missing",
        &["-X", "topic.metadata.propagation.max.ms=1000"],
    );
    assert!(!ok, "kcat reports the failure");
    assert!(
        err.contains("Unknown topic or partition"),
        "kcat names UNKNOWN_TOPIC_OR_PARTITION: {err}"
    );
    assert!(secs < 10.0, "fails fast, not at a client timeout: {secs} s");
    assert!(
        server.connect().open_topic("missing").is_err(),
        "no topic made"
    );
}
