//! Kafka consumer groups are Strom consumer groups: a kcat balanced
//! consumer (the Kafka group protocol, librdkafka) against the `strom
//! server` binary's Kafka listener shows up in `group list` and
//! `group describe` with mode `kafka`, its members and assignment, and per
//! partition its committed offset and lag; it cannot be deleted while a
//! member is alive, nor joined through the native protocol.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::kafka::{kcat, start};
use strom_client::{ConsumerGroupInfo, ConsumerGroupMode, Driver, GroupOptions, TopicSpec};

/// Polls `describe_group` until `done` holds; panics with the last answer.
fn describe_until(
    driver: &Driver,
    group: &str,
    what: &str,
    done: impl Fn(&ConsumerGroupInfo) -> bool,
) -> ConsumerGroupInfo {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = driver.describe_group(group);
        if let Ok(g) = &got {
            if done(g) {
                return g.clone();
            }
        }
        assert!(Instant::now() < deadline, "{what}: last answer {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A kcat balanced consumer of `topic` in `group` that stays in the group,
/// committing every 100 ms.
fn group_member(broker: &str, group: &str, topic: &str) -> Child {
    Command::new("kcat")
        .args([
            "-b",
            broker,
            "-G",
            group,
            "-o",
            "beginning",
            "-q",
            "-u",
            "-f",
            "%s\n",
            "-X",
            "auto.commit.interval.ms=100",
            topic,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning kcat (install it: apt-get install kcat, or make setup-test)")
}

/// The lines `out` prints, as they come.
fn read_lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn a_kafka_group_is_listed_and_described_like_a_strom_consumer_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (server, broker) = start(dir.path());
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("kviewed", 2))
        .expect("creating the topic");
    let input: String = (0..60).map(|i| format!("k{}:v-{i}\n", i % 7)).collect();
    kcat(
        &["-b", &broker, "-P", "-t", "kviewed", "-K:"],
        input.as_bytes(),
    );

    let mut member = group_member(&broker, "kview", "kviewed");
    let lines = read_lines(member.stdout.take().expect("stdout"));
    let next = || lines.recv_timeout(Duration::from_secs(30)).ok();
    for i in 0..60 {
        assert!(next().is_some(), "kcat printed only {i} records in time");
    }

    // Listed, with its mode, its one live member and no lag once the
    // member committed what it read.
    let g = describe_until(
        &driver,
        "kview",
        "a member that read and committed everything",
        |g| {
            g.consumers.iter().filter(|c| c.alive).count() == 1
                && g.partitions.len() == 2
                && g.partitions
                    .iter()
                    .all(|p| p.lag() == 0 && p.next_offset > 0)
        },
    );
    assert_eq!(g.spec.mode, ConsumerGroupMode::Kafka);
    assert_eq!(g.spec.topic, "kviewed");
    assert!(g.generation >= 1, "generation {}", g.generation);
    let c = &g.consumers[0];
    assert_eq!(c.partitions, vec![0, 1], "the only member holds both");
    assert!(c.label.starts_with("rdkafka"), "label {:?}", c.label);
    for p in &g.partitions {
        assert_eq!(p.holder, Some((c.id, g.generation)), "partition {p:?}");
        assert_eq!(p.committed, p.next_offset);
    }
    let total: u64 = g.partitions.iter().map(|p| p.next_offset).sum();
    assert_eq!(total, 60);
    let listed = driver.list_groups().expect("list");
    assert!(
        listed
            .iter()
            .any(|l| l.spec.name == "kview" && l.spec.mode == ConsumerGroupMode::Kafka),
        "{listed:?}"
    );

    // New records show as lag until the member reads and commits them.
    kcat(&["-b", &broker, "-P", "-t", "kviewed", "-K:"], b"k1:late\n");
    assert_eq!(next().as_deref(), Some("late"));
    describe_until(&driver, "kview", "the late record committed", |g| {
        g.partitions.iter().map(|p| p.committed).sum::<u64>() == 61
    });

    // The CLI shows it too.
    let out = server.cli(&["group", "describe", "kview"], "", Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("(kafka mode)"),
        "group describe:\n{}",
        out.stdout
    );

    // Not deletable while the member lives; not joinable natively.
    let refused = driver.delete_group("kview");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("live member")),
        "{refused:?}"
    );
    let native = driver
        .open_topic("kviewed")
        .expect("open")
        .consumer_group(
            "kview",
            GroupOptions {
                mode: ConsumerGroupMode::Kafka,
                ..Default::default()
            },
        )
        .map(|_| ());
    assert!(
        native
            .as_ref()
            .is_err_and(|e| e.to_string().contains("Kafka client")),
        "{native:?}"
    );

    // A member that leaves (SIGTERM: kcat closes its consumer) is gone
    // from the view; the committed offsets stay; then it can be deleted.
    let stopped = Command::new("kill")
        .args(["-TERM", &member.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    common::wait_bounded(&mut member, Duration::from_secs(20)).expect("kcat exits");
    let g = describe_until(&driver, "kview", "the member gone", |g| {
        g.consumers.is_empty()
    });
    assert_eq!(g.partitions.iter().map(|p| p.committed).sum::<u64>(), 61);
    driver
        .delete_group("kview")
        .expect("deleting an empty Kafka group");
    assert!(driver.describe_group("kview").is_err());
}
