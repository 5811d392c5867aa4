//! A `memory` partition without its own retention stays within the server's
//! `memory_retention_bytes`: the oldest batches are dropped as new ones come,
//! and consumers read on from the oldest event still held.

use strom_client::{ConsumerOptions, Driver, Next, PartitionType, StartPos, TopicSpec};

/// An embedded server whose memory partitions keep at most 1 MiB, and a
/// one-partition memory topic on it.
fn bounded_memory_topic(name: &str) -> (tempfile::TempDir, Driver, strom_client::Topic) {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded_with(strom_server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        memory_retention_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let t = d
        .create_topic(TopicSpec {
            partition_type: PartitionType::Memory,
            ..TopicSpec::new(name, 1)
        })
        .unwrap();
    (dir, d, t)
}

#[test]
fn memory_partitions_drop_oldest_batches_past_the_bound() {
    let (_dir, _d, t) = bounded_memory_topic("bounded");
    let p = t.producer().unwrap();
    for i in 0..64u32 {
        // 64 KiB per event, one batch each: 4 MiB in all, 4x the bound.
        p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 64 << 10])
            .unwrap()
            .wait()
            .unwrap();
    }
    let info = t.describe().unwrap();
    let part = &info.partitions[0];
    assert_eq!(part.next_offset, 64);
    assert!(
        part.first_offset >= 40,
        "old batches must be dropped: first offset {}",
        part.first_offset
    );
    let c = t
        .consumer_with(
            "late",
            ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    match c.pull().wait().unwrap() {
        Next::Event(ev) => {
            assert_eq!(ev.offset, part.first_offset);
            assert_eq!(ev.data(), &vec![ev.offset as u8; 64 << 10][..]);
        }
        Next::EndOfStream => panic!("expected the oldest retained event"),
    }
}

#[test]
fn consumer_data_budget_smaller_than_an_event_still_delivers_everything() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("big", 2)).unwrap();
    let p = t.producer().unwrap();
    for i in 0..40u32 {
        p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 300 << 10])
            .unwrap();
    }
    p.close().unwrap();
    let c = t
        .consumer_with(
            "small-budget",
            ConsumerOptions {
                prefetch_bytes: 100 << 10,
                ..Default::default()
            },
        )
        .unwrap();
    let mut n = 0;
    for ev in &c {
        let ev = ev.unwrap();
        let i = ev.json().unwrap()["i"].as_u64().unwrap() as u8;
        assert_eq!(ev.data(), &vec![i; 300 << 10][..]);
        n += 1;
    }
    assert_eq!(n, 40);
}

#[test]
fn a_consumer_overrun_by_retention_gets_one_error_then_carries_on() {
    let (_dir, _d, t) = bounded_memory_topic("overrun");
    // A one-event data budget: metadata arrives ahead, data waits for pulls.
    let c = t
        .consumer_with(
            "slow",
            ConsumerOptions {
                prefetch_bytes: 64 << 10,
                ..Default::default()
            },
        )
        .unwrap();
    let p = t.producer().unwrap();
    for i in 0..64u32 {
        p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 64 << 10])
            .unwrap()
            .wait()
            .unwrap();
    }
    p.close().unwrap();
    let (mut events, mut errors) = (Vec::new(), Vec::new());
    loop {
        match c.pull().wait() {
            Ok(Next::Event(ev)) => {
                assert_eq!(ev.data(), &vec![ev.offset as u8; 64 << 10][..]);
                events.push(ev.offset);
            }
            Ok(Next::EndOfStream) => break,
            Err(e) => errors.push(e),
        }
    }
    assert_eq!(errors.len(), 1, "one coalesced error: {errors:?}");
    assert_eq!(
        errors[0].code(),
        strom_client::ErrorCode::OFFSET_OUT_OF_RANGE
    );
    assert!(
        errors[0].to_string().contains("dropped by retention"),
        "{}",
        errors[0]
    );
    assert_eq!(
        *events.last().unwrap(),
        63,
        "the newest events still arrive"
    );
    assert!(events.len() < 64, "some events were lost to retention");
}
