//! The Kafka front end with real Kafka clients: the `strom server` binary
//! with `--kafka-listen 127.0.0.1:0`, kcat (librdkafka) producing and
//! consuming, and the native Strom client on the other side of the same
//! topics. Needs `kcat` on PATH (`make setup-test` installs it).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::kafka::{kcat, start};
use common::{read_all, JoinedMember, ServerProcess};
use strom_client::TopicSpec;

/// One record as kcat prints it with `-f '%p\t%o\t%k\t%h\t%s\n'`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    partition: u32,
    offset: u64,
    key: String,
    headers: String,
    value: String,
}

fn consume_all(broker: &str, topic: &str) -> Vec<Rec> {
    let out = kcat(
        &[
            "-b",
            broker,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%k\t%h\t%s\n",
        ],
        b"",
    );
    let text = String::from_utf8(out).expect("kcat output is UTF-8");
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, '\t').collect();
            assert_eq!(f.len(), 5, "unexpected kcat line {l:?}");
            Rec {
                partition: f[0].parse().expect("partition"),
                offset: f[1].parse().expect("offset"),
                key: f[2].to_string(),
                headers: f[3].to_string(),
                value: f[4].to_string(),
            }
        })
        .collect()
}

#[test]
fn kcat_round_trips_10000_keyed_messages_with_headers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("kc", 4))
        .expect("creating the topic");

    // Ten kcat runs of 1,000 messages, each run with its own headers; run 3
    // compresses with lz4, run 5 with zstd, run 7 with gzip, run 9 with
    // snappy, and every run uses librdkafka's idempotent producer.
    let mut expected: Vec<(String, String, String)> = Vec::new(); // key, headers, value
    for run in 0..10u32 {
        let mut input = String::new();
        let mut batch = Vec::new();
        for j in 0..1000u32 {
            let i = run * 1000 + j;
            let key = format!("key-{}", i % 37);
            let value = format!("value-{i}-{}", "x".repeat((i % 97) as usize));
            input.push_str(&format!("{key}:{value}\n"));
            batch.push((key, format!("run={run},src=kcat"), value));
        }
        let run_h = format!("run={run}");
        let mut args = vec![
            "-b",
            &broker,
            "-P",
            "-t",
            "kc",
            "-K:",
            "-H",
            &run_h,
            "-H",
            "src=kcat",
            "-X",
            "enable.idempotence=true",
        ];
        let codec = match run {
            3 => Some("lz4"),
            5 => Some("zstd"),
            7 => Some("gzip"),
            9 => Some("snappy"),
            _ => None,
        };
        if let Some(c) = codec {
            args.extend_from_slice(&["-z", c]);
        }
        kcat(&args, input.as_bytes());
        expected.extend(batch);
    }

    let got = consume_all(&broker, "kc");
    assert_eq!(got.len(), 10_000, "every message comes back once");
    // Offsets dense from 0 in every partition, each key on one partition.
    let mut by_part: BTreeMap<u32, Vec<&Rec>> = BTreeMap::new();
    for r in &got {
        by_part.entry(r.partition).or_default().push(r);
    }
    assert!(by_part.len() > 1, "keys spread over partitions");
    let mut key_part: BTreeMap<&str, u32> = BTreeMap::new();
    for (p, recs) in &by_part {
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.offset, i as u64, "partition {p}: offsets dense from 0");
            let prev = key_part.insert(&r.key, *p);
            assert!(
                prev.is_none() || prev == Some(*p),
                "key {} on one partition",
                r.key
            );
        }
    }
    // Per partition, records come in production order with their bytes,
    // keys and headers intact.
    for (p, recs) in &by_part {
        let want: Vec<(String, String, String)> = expected
            .iter()
            .filter(|(k, _, _)| key_part.get(k.as_str()) == Some(p))
            .cloned()
            .collect();
        let have: Vec<(String, String, String)> = recs
            .iter()
            .map(|r| (r.key.clone(), r.headers.clone(), r.value.clone()))
            .collect();
        assert_eq!(have, want, "partition {p}: records in order, intact");
    }

    // The same events through the native client: offsets agree, the value
    // is the data and the key and headers are in the metadata.
    let native = read_all(&driver, "kc", "native-reader", Duration::from_secs(60));
    assert_eq!(native.len(), 10_000);
    for r in got.iter().take(50) {
        let ev = &native.events[&(r.partition, r.offset)];
        assert_eq!(ev.data, r.value.as_bytes());
        let meta: serde_json::Value = serde_json::from_slice(&ev.meta).expect("JSON metadata");
        assert_eq!(meta["kafka"]["key"], r.key.as_str(), "{meta}");
        assert_eq!(meta["kafka"]["headers"][1][0], "src", "{meta}");
        assert!(
            meta["kafka"]["timestamp_ms"].as_i64().unwrap_or(0) > 0,
            "{meta}"
        );
    }
}

#[test]
fn native_events_are_read_by_kcat_and_kcat_records_natively() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("cross", 1))
        .expect("creating the topic");

    // Native producer -> kcat: metadata as the strom.meta header, data as
    // the value, Strom offsets as Kafka offsets.
    let p = topic.producer().expect("producer");
    for i in 0..100u32 {
        p.push(format!("{{\"i\":{i}}}"), format!("data-{i}").into_bytes())
            .expect("push")
            .wait()
            .expect("stored");
    }
    let got = consume_all(&broker, "cross");
    assert_eq!(got.len(), 100);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        assert_eq!(r.value, format!("data-{i}"));
        assert_eq!(r.headers, format!("strom.meta={{\"i\":{i}}}"));
        assert_eq!(r.key, "");
    }

    // kcat -> native consumer: the value is the data, key and headers in
    // the metadata, offsets follow on.
    let input: String = (0..50).map(|i| format!("k{i}:from-kcat-{i}\n")).collect();
    kcat(
        &[
            "-b",
            &broker,
            "-P",
            "-t",
            "cross",
            "-K:",
            "-H",
            "origin=kafka",
            "-H",
            "origin=again",
        ],
        input.as_bytes(),
    );
    let native = read_all(&driver, "cross", "reader", Duration::from_secs(30));
    assert_eq!(native.len(), 150);
    for i in 0..50u64 {
        let ev = &native.events[&(0, 100 + i)];
        assert_eq!(ev.data, format!("from-kcat-{i}").as_bytes());
        let meta: serde_json::Value = serde_json::from_slice(&ev.meta).expect("JSON metadata");
        assert_eq!(meta["kafka"]["key"], format!("k{i}"), "{meta}");
        assert_eq!(
            meta["kafka"]["headers"],
            serde_json::json!([["origin", "kafka"], ["origin", "again"]]),
            "{meta}"
        );
    }
    // Read back through Kafka, a header name given twice stays twice.
    let got = consume_all(&broker, "cross");
    assert_eq!(got.len(), 150);
    for r in &got[100..] {
        assert_eq!(r.headers, "origin=kafka,origin=again");
        assert_eq!(r.key, format!("k{}", r.offset - 100));
    }
}

#[test]
fn kcat_waits_for_events_produced_later() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("later", 1))
        .expect("creating the topic");
    // A consumer that waits for 3 messages (long-poll fetches) while they
    // are produced 300 ms apart by the native client.
    let b = broker.clone();
    let consumer = std::thread::spawn(move || {
        kcat(
            &[
                "-b",
                &b,
                "-C",
                "-t",
                "later",
                "-o",
                "beginning",
                "-c",
                "3",
                "-q",
                "-f",
                "%o:%s\n",
            ],
            b"",
        )
    });
    let p = topic.producer().expect("producer");
    for i in 0..3u32 {
        std::thread::sleep(Duration::from_millis(300));
        p.push("{}", format!("late-{i}").into_bytes())
            .expect("push")
            .wait()
            .expect("stored");
    }
    let out = String::from_utf8(consumer.join().expect("consumer thread")).expect("UTF-8");
    assert_eq!(out, "0:late-0\n1:late-1\n2:late-2\n");
}

#[test]
fn kcat_lists_topics_and_partitions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_server, broker) = start(dir.path());
    // Created through the CLI's Kafka backend, which says the cluster's
    // settings decide durability (not Strom's file-partition promise).
    let url = format!("kafka://{broker}");
    let created = common::run_cli(
        &[
            "--address",
            &url,
            "topic",
            "create",
            "listed",
            "--partitions",
            "3",
        ],
        "",
        &[],
        Duration::from_secs(60),
    );
    assert!(created.status.success(), "{}", created.stderr);
    assert!(
        created.stderr.contains("on the Kafka cluster") && !created.stderr.contains("fdatasync"),
        "{}",
        created.stderr
    );
    let out = String::from_utf8(kcat(&["-b", &broker, "-L", "-J"], b"")).expect("UTF-8");
    let v: serde_json::Value = serde_json::from_str(&out).expect("kcat -L -J prints JSON");
    let t = v["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .find(|t| t["topic"] == "listed")
        .unwrap_or_else(|| panic!("topic listed: {v}"));
    assert_eq!(t["partitions"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(v["brokers"][0]["name"], broker.as_str(), "{v}");
}

#[test]
fn kcat_group_commits_are_strom_consumer_offsets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("grouped", 2))
        .expect("creating the topic");
    let input: String = (0..100).map(|i| format!("k{}:g-{i}\n", i % 5)).collect();
    kcat(
        &["-b", &broker, "-P", "-t", "grouped", "-K:"],
        input.as_bytes(),
    );
    // A balanced consumer (JoinGroup, SyncGroup, OffsetFetch, Fetch,
    // OffsetCommit) reads everything and commits on exit.
    let group_read = |args: &[&str]| {
        let mut a = vec![
            "-b",
            broker.as_str(),
            "-G",
            "kgroup",
            "-e",
            "-q",
            "-f",
            "%s\n",
        ];
        a.extend_from_slice(args);
        a.push("grouped");
        String::from_utf8(kcat(&a, b"")).expect("UTF-8")
    };
    let first = group_read(&["-o", "beginning"]);
    let mut seen: Vec<&str> = first.lines().collect();
    seen.sort_unstable();
    let mut want: Vec<String> = (0..100).map(|i| format!("g-{i}")).collect();
    want.sort_unstable();
    assert_eq!(seen, want);
    // The commits are the Strom consumer offsets of a consumer named like
    // the group: every partition committed to its end.
    for p in 0..2 {
        let offsets = driver.consumer_offsets("grouped", p).expect("offsets");
        let info = driver
            .open_topic("grouped")
            .and_then(|t| t.describe())
            .expect("describe");
        let next = info.partitions[p as usize].next_offset;
        assert!(
            offsets.iter().any(|(n, o)| n == "kgroup" && *o == next),
            "partition {p}: {offsets:?}, next {next}"
        );
    }
    // The group resumes there: a second run sees only what came later.
    kcat(&["-b", &broker, "-P", "-t", "grouped", "-K:"], b"k1:late\n");
    assert_eq!(group_read(&[]), "late\n");
}

/// Starts a member that joins `server`'s group (data under `dir`) with a
/// Kafka listener; returns it and its Kafka address.
fn join_kafka_member(dir: &Path, server: &ServerProcess) -> (JoinedMember, String) {
    use std::io::BufRead;
    let mut member = server.join_member(
        &dir.join("member-1"),
        &["--kafka-listen", "127.0.0.1:0"],
        Stdio::piped(),
    );
    let stderr = member.0.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(a) = line.strip_prefix("strom kafka listening on ") {
                let _ = tx.send(a.trim().to_string());
            }
        }
    });
    let broker = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the member printed its Kafka address");
    (member, broker)
}

#[test]
fn a_joined_member_serves_its_partitions_over_kafka() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start(dir.path());
    let (_member, broker) = join_kafka_member(dir.path(), &server);
    let driver = server.connect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while driver
        .members()
        .map_or(0, |m| m.iter().filter(|m| m.alive).count())
        < 2
    {
        assert!(Instant::now() < deadline, "the member never joined");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two partitions, one on each member.
    driver
        .create_topic(TopicSpec::new("spread", 2))
        .expect("creating the topic");
    // The member asks the master for the topic; it leads its own partition
    // and reports the other as not available here.
    let out =
        String::from_utf8(kcat(&["-b", &broker, "-L", "-J", "-t", "spread"], b"")).expect("UTF-8");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let parts = v["topics"][0]["partitions"]
        .as_array()
        .expect("partitions")
        .clone();
    assert_eq!(parts.len(), 2, "{v}");
    let mine: Vec<u64> = parts
        .iter()
        .filter(|p| p["leader"].as_i64() == Some(1))
        .filter_map(|p| p["partition"].as_u64())
        .collect();
    assert_eq!(mine.len(), 1, "one partition led by member 1: {v}");
    assert!(
        parts.iter().any(|p| p["leader"].as_i64() == Some(-1)),
        "the other is not available here: {v}"
    );
    let p = mine[0].to_string();
    kcat(
        &["-b", &broker, "-P", "-t", "spread", "-p", &p, "-K:"],
        b"a:1\nb:2\nc:3\n",
    );
    let native = read_all(&driver, "spread", "reader", Duration::from_secs(30));
    let values: Vec<&[u8]> = native.events.values().map(|e| e.data.as_slice()).collect();
    assert_eq!(values, vec![&b"1"[..], b"2", b"3"]);
    assert!(native
        .events
        .keys()
        .all(|(part, _)| u64::from(*part) == mine[0]));
}

/// The brokers `kcat -L` lists through `broker`: (id, "host:port").
fn brokers_of(broker: &str) -> Vec<(i64, String)> {
    let out = String::from_utf8(kcat(&["-b", broker, "-L", "-J"], b"")).expect("UTF-8");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let mut b: Vec<(i64, String)> = v["brokers"]
        .as_array()
        .expect("brokers")
        .iter()
        .map(|b| {
            (
                b["id"].as_i64().unwrap_or(-1),
                b["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    b.sort();
    b
}

/// Every member serving Kafka publishes its address: one bootstrap address
/// lists both brokers, each partition is led by the member hosting it,
/// kcat produces to and consumes from both, and a consumer group meets in
/// the master's coordinator and commits offsets on both members.
#[test]
fn a_group_of_two_kafka_brokers_serves_every_partition_from_one_bootstrap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, master) = start(dir.path());
    let (_member, other) = join_kafka_member(dir.path(), &server);
    // The member's Kafka address reaches the master with its heartbeats.
    let deadline = Instant::now() + Duration::from_secs(15);
    let want = {
        let mut w = vec![(0, master.clone()), (1, other.clone())];
        w.sort();
        w
    };
    loop {
        let got = brokers_of(&master);
        if got.len() == 2 {
            assert_eq!(got, want, "broker ids are member ids");
            break;
        }
        assert!(Instant::now() < deadline, "the master lists {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(brokers_of(&other), want, "the member lists both too");
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("both", 2))
        .expect("creating the topic");
    let info = driver
        .open_topic("both")
        .and_then(|t| t.describe())
        .expect("describe");
    let owners: Vec<u32> = info.partitions.iter().map(|p| p.member).collect();
    let mut sorted = owners.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec![0, 1], "one partition on each member");
    let out =
        String::from_utf8(kcat(&["-b", &master, "-L", "-J", "-t", "both"], b"")).expect("UTF-8");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    for p in v["topics"][0]["partitions"].as_array().expect("partitions") {
        let id = p["partition"].as_u64().expect("partition id") as usize;
        assert_eq!(
            p["leader"].as_i64(),
            Some(i64::from(owners[id])),
            "partition {id} led by its owner: {v}"
        );
    }
    // Produced through the master's address, to both partitions.
    for p in 0..2 {
        let input: String = (0..10).map(|i| format!("k{i}:p{p}-{i}\n")).collect();
        kcat(
            &[
                "-b",
                &master,
                "-P",
                "-t",
                "both",
                "-p",
                &p.to_string(),
                "-K:",
            ],
            input.as_bytes(),
        );
    }
    let recs = consume_all(&master, "both");
    let mut values: Vec<String> = recs.iter().map(|r| r.value.clone()).collect();
    values.sort();
    let mut want: Vec<String> = (0..2)
        .flat_map(|p| (0..10).map(move |i| format!("p{p}-{i}")))
        .collect();
    want.sort();
    assert_eq!(values, want);
    // A group read through the member's address: its coordinator is the
    // master, and its commits land on both partitions' owners.
    let read = String::from_utf8(kcat(
        &[
            "-b",
            &other,
            "-G",
            "both-group",
            "-e",
            "-q",
            "-f",
            "%s\n",
            "-o",
            "beginning",
            "both",
        ],
        b"",
    ))
    .expect("UTF-8");
    assert_eq!(read.lines().count(), 20, "{read}");
    for p in 0..2u32 {
        let offsets = driver.consumer_offsets("both", p).expect("offsets");
        assert!(
            offsets.iter().any(|(n, o)| n == "both-group" && *o == 10),
            "partition {p} (member {}): {offsets:?}",
            owners[p as usize]
        );
    }
}
