//! A partition whose files cannot be opened does not stop the server: the
//! other partitions come up and serve, and the damaged one is reported as
//! unavailable, with the reason, by describe and by every request for it.

mod common;

use std::time::Duration;

use common::ServerProcess;
use strom_client::{ConsumerOptions, ErrorCode, Next, StartPos, TopicSpec};

#[test]
fn one_damaged_partition_does_not_stop_the_server() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    {
        let d = server.connect();
        let t = d.create_topic(TopicSpec::new("t", 2)).unwrap();
        let p = t.producer().unwrap();
        let futs: Vec<_> = (0..20u32)
            .map(|i| {
                p.push_with(
                    format!("{{\"i\":{i}}}"),
                    vec![i as u8; 16],
                    Some(i % 2),
                    &[],
                )
            })
            .collect::<Result<_, _>>()
            .unwrap();
        for f in futs {
            f.wait().unwrap();
        }
    }
    let (status, stderr) = server.terminate(Duration::from_secs(10));
    assert!(status.success(), "{stderr}");

    // Damage partition 0: its directory becomes a plain file.
    let topics = base.path().join("data").join("topics");
    let topic_dir = std::fs::read_dir(&topics)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("t."))
        .expect("the topic's directory");
    let p0 = topic_dir.join("0");
    std::fs::remove_dir_all(&p0).unwrap();
    std::fs::write(&p0, b"not a partition").unwrap();

    let server = ServerProcess::start(base.path());
    let d = server.connect();
    let info = d.describe("t").unwrap();
    assert_eq!(
        info.partitions[0].status.as_str(),
        "unavailable",
        "{info:?}"
    );
    assert!(!info.partitions[0].status.reason().is_empty());
    assert!(info.partitions[1].status.is_ok(), "{info:?}");
    assert_eq!(info.partitions[1].next_offset, 10);

    // Partition 1 serves all of its events.
    let t = d.open_topic("t").unwrap();
    let c = t
        .consumer_with(
            "r",
            ConsumerOptions {
                partitions: Some(vec![1]),
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    for i in 0..10 {
        match c.pull_timeout(Duration::from_secs(10)).unwrap() {
            Next::Event(ev) => assert_eq!(ev.offset, i),
            Next::EndOfStream => panic!("unexpected end of stream"),
        }
    }
    // Writing to partition 0 is refused with a clear code.
    let err = t
        .producer()
        .unwrap()
        .push_with("{}", Vec::<u8>::new(), Some(0), &[])
        .unwrap()
        .wait()
        .expect_err("the damaged partition cannot accept events");
    assert_eq!(err.code(), ErrorCode::PARTITION_UNAVAILABLE, "{err}");
}

/// The directory of partition `p` of the only topic named `name`.
fn partition_dir(base: &std::path::Path, name: &str, p: u32) -> std::path::PathBuf {
    let topics = base.join("data").join("topics");
    std::fs::read_dir(&topics)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|d| {
            d.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}."))
        })
        .expect("the topic's directory")
        .join(p.to_string())
}

#[test]
fn a_missing_partition_directory_is_unavailable_not_an_empty_log() {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    {
        let t = server
            .connect()
            .create_topic(TopicSpec::new("t", 2))
            .unwrap();
        let p = t.producer().unwrap();
        for i in 0..4u32 {
            p.push_with("{}", vec![1u8; 8], Some(i % 2), &[])
                .unwrap()
                .wait()
                .unwrap();
        }
    }
    server.terminate(Duration::from_secs(10));
    std::fs::remove_dir_all(partition_dir(base.path(), "t", 1)).unwrap();
    let server = ServerProcess::start(base.path());
    let info = server.connect().describe("t").unwrap();
    assert_eq!(
        info.partitions[1].status.as_str(),
        "unavailable",
        "{info:?}"
    );
    assert!(info.partitions[0].status.is_ok());
    assert_eq!(info.partitions[0].next_offset, 2);
}

#[test]
fn damage_found_by_scrub_is_a_reported_gap_and_offsets_are_never_reused() {
    damage_in_the_middle(true);
}

#[test]
fn damage_found_by_a_reader_is_a_reported_gap_and_offsets_are_never_reused() {
    damage_in_the_middle(false);
}

fn damage_in_the_middle(scrub_first: bool) {
    let base = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(base.path());
    {
        let t = server
            .connect()
            .create_topic(TopicSpec::new("t", 1))
            .unwrap();
        let p = t.producer().unwrap();
        for i in 0..30u32 {
            // One batch per event: wait for each.
            p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 64])
                .unwrap()
                .wait()
                .unwrap();
        }
    }
    server.terminate(Duration::from_secs(10));
    // Flip a byte in the middle of the segment's log.
    let dir = partition_dir(base.path(), "t", 0);
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|f| f.extension().is_some_and(|x| x == "log"))
        .expect("a .log segment file");
    let mut bytes = std::fs::read(&log).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&log, bytes).unwrap();

    let server = ServerProcess::start(base.path());
    let g = server.group_file.to_str().unwrap().to_string();
    let scrub = || {
        let out = common::run_cli(
            &["--group-file", &g, "scrub", "t"],
            "",
            &[],
            Duration::from_secs(30),
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "scrub reports damage: {}",
            out.stderr
        );
        let report: serde_json::Value = serde_json::from_str(out.lines()[0]).unwrap();
        let ranges = report["quarantined"].as_array().unwrap().clone();
        assert_eq!(ranges.len(), 1, "{report}");
        (
            ranges[0][0].as_u64().unwrap(),
            ranges[0][1].as_u64().unwrap(),
        )
    };
    let found = scrub_first.then(scrub);

    // A reader gets every intact event, and one explicit gap naming the range.
    let d = server.connect();
    let t = d.open_topic("t").unwrap();
    let c = t
        .consumer_with(
            "r",
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    let mut seen = Vec::new();
    let mut gaps = Vec::new();
    while seen.len() as u64
        + gaps
            .iter()
            .map(|(f, l): &(u64, u64)| l - f + 1)
            .sum::<u64>()
        < 30
    {
        match c.pull_timeout(Duration::from_secs(10)) {
            Ok(Next::Event(ev)) => {
                assert_eq!(ev.data(), &vec![ev.offset as u8; 64][..]);
                seen.push(ev.offset);
            }
            Ok(Next::EndOfStream) => panic!("unexpected end of stream"),
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::DATA_CORRUPT, "{e}");
                gaps.push(e.gap_offsets().expect("the gap names its offsets"));
            }
        }
    }
    assert_eq!(gaps.len(), 1, "one gap: {gaps:?}");
    let (first, last) = gaps[0];
    assert!(first > 0 && last < 29 && first <= last, "{gaps:?}");
    // The scrub and the reader name the same range, whichever came first.
    assert_eq!(found.unwrap_or_else(scrub), (first, last));
    let expected: Vec<u64> = (0..30).filter(|o| *o < first || *o > last).collect();
    assert_eq!(seen, expected);
    // strom consume reads across the gap, warning about it on stderr.
    let out = common::run_cli(
        &[
            "--group-file",
            &g,
            "consume",
            "t",
            "--name",
            "cli",
            "--from",
            "beginning",
        ],
        "",
        &[],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.lines().len(), expected.len(), "{}", out.stderr);
    assert!(out.stderr.contains("damaged on disk"), "{}", out.stderr);
    // New events get new offsets: none of the quarantined ones is reused.
    let id = t
        .producer()
        .unwrap()
        .push("{}", vec![0u8; 4])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(id.offset, 30);
}
