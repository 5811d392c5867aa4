//! A `memory` partition stays within its bound (`retention_bytes`, or the
//! server's `memory_retention_bytes`). With `--overflow drop-oldest` the
//! oldest batches go first, are counted in `dropped_events`, and a reader
//! that fell behind gets an explicit `DATA_EXPIRED` gap naming the lost
//! offsets, never a silent skip. (`block`, the default, is in `overflow.rs`.)

use strom_client::{
    ConsumerOptions, Driver, ErrorCode, Next, Overflow, PartitionType, StartPos, TopicSpec,
};

/// An embedded server whose memory partitions keep at most 1 MiB, and a
/// one-partition memory topic on it with the given overflow policy.
fn bounded_memory_topic(
    name: &str,
    overflow: Option<Overflow>,
) -> (tempfile::TempDir, Driver, strom_client::Topic) {
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
            overflow,
            ..TopicSpec::new(name, 1)
        })
        .unwrap();
    (dir, d, t)
}

#[test]
fn drop_oldest_partitions_drop_past_the_bound_and_count_the_dropped_events() {
    let (_dir, _d, t) = bounded_memory_topic("bounded", Some(Overflow::DropOldest));
    let p = t.producer().unwrap();
    for i in 0..64u32 {
        // 64 KiB per event, one batch each: 4 MiB in all, 4x the bound.
        p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 64 << 10])
            .unwrap()
            .wait()
            .unwrap();
    }
    let info = t.describe().unwrap();
    assert_eq!(info.spec.overflow, Some(Overflow::DropOldest));
    let part = &info.partitions[0];
    assert_eq!(part.next_offset, 64);
    assert!(
        part.first_offset >= 40,
        "old batches must be dropped: first offset {}",
        part.first_offset
    );
    assert_eq!(
        part.dropped_events, part.first_offset,
        "every dropped event is counted"
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

/// Pulls to the end of the stream; returns the delivered offsets and the
/// gaps reported, checking each event's data.
fn read_with_gaps(c: &strom_client::Consumer) -> (Vec<u64>, Vec<(u64, u64)>) {
    let (mut events, mut gaps) = (Vec::new(), Vec::new());
    loop {
        match c.pull_timeout(std::time::Duration::from_secs(10)) {
            Ok(Next::Event(ev)) => {
                assert_eq!(ev.data(), &vec![ev.offset as u8; 64 << 10][..]);
                events.push(ev.offset);
            }
            Ok(Next::EndOfStream) => break,
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::DATA_EXPIRED, "{e}");
                let (first, last) = e.expired_offsets().expect("a gap names its offsets");
                assert!(
                    e.to_string().contains(&format!("{first}..={last}")),
                    "the message names the lost offsets: {e}"
                );
                gaps.push((first, last));
            }
        }
    }
    (events, gaps)
}

/// Events and gaps together cover `0..n` exactly once, in order.
fn assert_accounted(events: &[u64], gaps: &[(u64, u64)], n: u64) {
    let mut all: Vec<(u64, u64)> = events
        .iter()
        .map(|&o| (o, o))
        .chain(gaps.iter().copied())
        .collect();
    all.sort();
    let mut next = 0;
    for (first, last) in all {
        assert_eq!(
            first, next,
            "offsets {next}..{first} were skipped silently: {events:?} {gaps:?}"
        );
        assert!(last >= first);
        next = last + 1;
    }
    assert_eq!(next, n, "every offset is delivered or reported lost");
}

#[test]
fn a_reader_overrun_by_drop_oldest_gets_a_data_expired_gap_then_carries_on() {
    let (_dir, _d, t) = bounded_memory_topic("overrun", Some(Overflow::DropOldest));
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
    let (events, gaps) = read_with_gaps(&c);
    assert!(!gaps.is_empty(), "the reader was told it lost events");
    assert_accounted(&events, &gaps, 64);
    assert_eq!(
        *events.last().unwrap(),
        63,
        "the newest events still arrive"
    );
}

#[test]
fn a_consumer_resuming_after_dropped_events_gets_a_gap_from_its_last_ack() {
    let (_dir, _d, t) = bounded_memory_topic("resume", Some(Overflow::DropOldest));
    let p = t.producer().unwrap();
    let push = |i: u32| {
        p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 64 << 10])
            .unwrap()
            .wait()
            .unwrap()
    };
    for i in 0..3 {
        push(i);
    }
    {
        let c = t.consumer("resumer").unwrap();
        for want in 0..2 {
            match c.pull().wait().unwrap() {
                Next::Event(ev) => {
                    assert_eq!(ev.offset, want);
                    ev.ack().wait().unwrap();
                }
                Next::EndOfStream => panic!("expected an event"),
            }
        }
    }
    for i in 3..64 {
        push(i);
    }
    p.close().unwrap();
    let first = t.describe().unwrap().partitions[0].first_offset;
    assert!(first > 2);
    let c = t.consumer("resumer").unwrap();
    let (events, gaps) = read_with_gaps(&c);
    assert_eq!(
        gaps.first(),
        Some(&(2, first - 1)),
        "the gap starts at the last ack"
    );
    assert_eq!(events.first(), Some(&first));
    assert_accounted(&[&[0, 1][..], &events].concat(), &gaps, 64);
}
