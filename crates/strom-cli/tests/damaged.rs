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
