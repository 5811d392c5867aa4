//! A `memory` partition without its own retention stays within the server's
//! `memory_retention_bytes`: the oldest batches are dropped as new ones come,
//! and consumers read on from the oldest event still held.

use strom_client::{ConsumerOptions, Driver, Next, PartitionType, StartPos, TopicSpec};

#[test]
fn memory_partitions_drop_oldest_batches_past_the_bound() {
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
            ..TopicSpec::new("bounded", 1)
        })
        .unwrap();
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
