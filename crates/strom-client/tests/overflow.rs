//! `block`, the default overflow policy of memory partitions: a full
//! partition holds appends (and their acknowledgements) until its consumers
//! ack, so producers get backpressure instead of losing events; a held
//! append is answered with an error, never left hanging, when the topic
//! ends or is deleted. Also the size limits a producer learns from the
//! server: one event may be as large as the server accepts, and a larger
//! one is refused at `push` naming the limit and the setting to raise it.

#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::random_bytes;
use strom_client::{
    Batching, ConsumerOptions, Driver, ErrorCode, Next, Overflow, PartitionType, ProducerOptions,
    PushFuture, TopicSpec,
};

/// An embedded server whose memory partitions hold at most `bound` bytes.
fn server(bound: u64) -> (tempfile::TempDir, Driver) {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded_with(strom_server::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        memory_retention_bytes: bound,
        ..Default::default()
    })
    .unwrap();
    (dir, d)
}

fn memory_spec(name: &str) -> TopicSpec {
    TopicSpec {
        partition_type: PartitionType::Memory,
        ..TopicSpec::new(name, 1)
    }
}

/// A producer that sends each event as its own batch. The automatic
/// batching sends whatever is ready when a slot frees, so how many events
/// share a batch depends on how soon its task runs: six 256 KiB events
/// pushed before it ran went as one 1.5 MiB batch, which an empty `block`
/// partition takes whole (it must take any one batch), and nothing was
/// held. These tests count the bound in events, so they fix the batches.
fn one_per_batch(t: &strom_client::Topic) -> strom_client::Producer {
    t.producer_with(ProducerOptions {
        batch: Batching::count(1),
        ..Default::default()
    })
    .unwrap()
}

/// Pushes `n` events of `size` bytes (data `random_bytes(i)`) without
/// waiting for their acknowledgements.
fn push_unacked(p: &strom_client::Producer, n: u64, size: usize) -> Vec<PushFuture> {
    (0..n)
        .map(|i| {
            p.push(format!("{{\"i\":{i}}}"), random_bytes(i, size))
                .unwrap()
        })
        .collect()
}

#[test]
fn a_full_block_partition_holds_appends_until_a_consumer_acks() {
    let (_dir, d) = server(1 << 20);
    let t = d.create_topic(memory_spec("held")).unwrap();
    assert_eq!(t.info().spec.effective_overflow(), Some(Overflow::Block));
    let p = one_per_batch(&t);
    // 6 x 256 KiB = 1.5 MiB into a 1 MiB bound, and no consumer yet.
    let futs = push_unacked(&p, 6, 256 << 10);
    let last = futs.last().unwrap();
    assert!(
        matches!(last.wait_timeout(Some(Duration::from_millis(500))), Err(e) if e.code() == ErrorCode::TIMEOUT),
        "the append past the bound must be held while nobody consumed"
    );
    assert!(t.describe().unwrap().partitions[0].next_offset < 6);
    let c = t.consumer("reader").unwrap();
    for i in 0..6u64 {
        let ev = common::next_event(&c);
        assert_eq!(ev.offset, i);
        assert_eq!(ev.data(), &random_bytes(i, 256 << 10)[..]);
        ev.ack().wait().unwrap();
    }
    for (i, f) in futs.into_iter().enumerate() {
        assert_eq!(f.wait().unwrap().offset, i as u64);
    }
    let info = t.describe().unwrap();
    assert_eq!(info.partitions[0].next_offset, 6);
    assert_eq!(info.partitions[0].dropped_events, 0, "block never drops");
}

#[test]
fn a_block_partition_frees_room_only_once_every_known_consumer_acked() {
    let (_dir, d) = server(1 << 20);
    let t = d.create_topic(memory_spec("two-readers")).unwrap();
    let fast = t.consumer("fast").unwrap();
    let slow = t.consumer("slow").unwrap();
    let p = one_per_batch(&t);
    let futs = push_unacked(&p, 6, 256 << 10);
    // Three events fit the bound; "fast" reads and acks them.
    for i in 0..3u64 {
        let ev = common::next_event(&fast);
        assert_eq!(ev.offset, i);
        ev.ack().wait().unwrap();
    }
    assert!(
        futs[5]
            .wait_timeout(Some(Duration::from_millis(500)))
            .is_err(),
        "\"slow\" has acked nothing: the partition stays full"
    );
    for i in 0..6u64 {
        let ev = common::next_event(&slow);
        assert_eq!(ev.offset, i);
        assert_eq!(ev.data(), &random_bytes(i, 256 << 10)[..]);
        ev.ack().wait().unwrap();
    }
    for (i, f) in futs.into_iter().enumerate() {
        assert_eq!(f.wait().unwrap().offset, i as u64);
    }
    for i in 3..6u64 {
        assert_eq!(common::next_event(&fast).offset, i, "nothing was dropped");
    }
}

#[test]
fn a_writer_streaming_large_events_waits_for_a_slow_reader_and_nothing_is_lost() {
    const BOUND: u64 = 8 << 20;
    const SIZE: usize = 1536 << 10;
    const N: u64 = 24;
    let (_dir, d) = server(BOUND);
    let t = d.create_topic(memory_spec("stream")).unwrap();
    let c = t
        .consumer_with(
            "slow",
            ConsumerOptions {
                prefetch_bytes: SIZE as u64,
                ..Default::default()
            },
        )
        .unwrap();
    let pushed = Arc::new(AtomicU64::new(0));
    let writer = {
        let p = t.producer().unwrap();
        let pushed = pushed.clone();
        std::thread::spawn(move || {
            let mut futs = Vec::new();
            for i in 0..N {
                futs.push(
                    p.push(format!("{{\"i\":{i}}}"), random_bytes(i, SIZE))
                        .unwrap(),
                );
                pushed.store(i + 1, Ordering::SeqCst);
            }
            p.close().unwrap();
            for f in futs {
                f.wait().unwrap();
            }
        })
    };
    let mut max_lead = 0;
    for i in 0..N {
        let ev = common::next_event(&c);
        assert_eq!(ev.offset, i, "in order");
        assert_eq!(common::field(&ev, "i"), i);
        assert_eq!(ev.data(), &random_bytes(i, SIZE)[..], "event {i} intact");
        // A slow reader: the writer could run far ahead meanwhile.
        std::thread::sleep(Duration::from_millis(20));
        max_lead = max_lead.max(pushed.load(Ordering::SeqCst) - i);
        ev.ack().wait().unwrap();
    }
    assert!(matches!(
        c.pull_timeout(common::PULL_LIMIT),
        Ok(Next::EndOfStream)
    ));
    writer.join().unwrap();
    // The partition holds at most BOUND / SIZE = 5 unacked events, and the
    // rest of the batch being acked (it is freed whole); then two batches
    // in flight (one may be held), one batching, one being pushed. A batch
    // holds up to 4 MiB of these events (the automatic size with data).
    let per_batch = (4 << 20) / SIZE as u64;
    let allowed = BOUND / SIZE as u64 + per_batch * 4 + 1;
    assert!(
        max_lead <= allowed,
        "the writer ran {max_lead} events ahead of the reader's acks (allowed {allowed} of {N})"
    );
    assert_eq!(t.describe().unwrap().partitions[0].dropped_events, 0);
}

/// A producer whose partition is full (1 MiB bound, nobody consuming) and
/// the futures of its held events.
fn held_producer(
    d: &Driver,
    name: &str,
) -> (strom_client::Topic, strom_client::Producer, Vec<PushFuture>) {
    let t = d.create_topic(memory_spec(name)).unwrap();
    let p = one_per_batch(&t);
    let futs = push_unacked(&p, 6, 256 << 10);
    assert!(futs[5]
        .wait_timeout(Some(Duration::from_millis(300)))
        .is_err());
    (t, p, futs)
}

#[test]
fn a_held_append_is_refused_when_the_topic_is_completed() {
    let (_dir, d) = server(1 << 20);
    let (t, _p, futs) = held_producer(&d, "completed");
    t.complete().unwrap();
    let e = futs[5]
        .wait_timeout(Some(Duration::from_secs(10)))
        .expect_err("a held append cannot be stored after the end of the stream");
    assert_eq!(e.code(), ErrorCode::TOPIC_CLOSED, "{e}");
    // What was stored before the end is still delivered.
    let c = t.consumer("after").unwrap();
    let got = common::drain(&c);
    assert!(!got.is_empty() && got.len() < 6);
}

#[test]
fn a_held_append_is_refused_when_the_topic_is_deleted() {
    let (_dir, d) = server(1 << 20);
    let (_t, _p, futs) = held_producer(&d, "deleted");
    d.delete_topic("deleted").unwrap();
    let e = futs[5]
        .wait_timeout(Some(Duration::from_secs(10)))
        .expect_err("a held append is answered when its topic goes away");
    assert_ne!(e.code(), ErrorCode::TIMEOUT, "{e}");
}

#[test]
fn overflow_is_refused_on_file_topics() {
    let (_dir, d) = server(1 << 20);
    let Err(e) = d.create_topic(TopicSpec {
        overflow: Some(Overflow::DropOldest),
        ..TopicSpec::new("file-overflow", 1)
    }) else {
        panic!("file partitions keep their retention semantics; overflow must be refused");
    };
    assert_eq!(e.code(), ErrorCode::INVALID_TOPIC_SPEC, "{e}");
    assert!(e.to_string().contains("memory"), "{e}");
}

#[test]
fn one_event_larger_than_the_producer_batch_cap_goes_as_its_own_batch() {
    // The report: a 64 MiB array plus 81 bytes of metadata, default options.
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(memory_spec("huge")).unwrap();
    let p = t.producer().unwrap();
    let meta = format!(
        "{{\"shape\":[8192,1024],\"dtype\":\"float64\",\"pad\":\"{}\"}}",
        "x".repeat(33)
    );
    assert_eq!(meta.len(), 81);
    let data = vec![0x5au8; 64 << 20];
    p.push(meta.clone(), data).unwrap().wait().unwrap();
    // Small events around it still batch normally.
    p.push("{\"after\":1}", vec![1u8; 10]).unwrap();
    p.close().unwrap();
    let c = t.consumer("numpy").unwrap();
    let ev = common::next_event(&c);
    assert_eq!(ev.data_size(), 64 << 20);
    assert!(ev.data().iter().all(|&b| b == 0x5a));
    assert_eq!(common::next_event(&c).data(), &[1u8; 10][..]);
}

#[test]
fn an_event_above_the_server_limits_is_refused_at_push_naming_the_limit() {
    for (frame, batch, setting) in [
        (256u32 << 20, 1u64 << 20, "max_batch_bytes"),
        (1u32 << 20, 256u64 << 20, "max_frame_bytes"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = Driver::embedded_with(strom_server::ServerConfig {
            data_dir: dir.path().to_path_buf(),
            max_frame_bytes: frame,
            max_batch_bytes: batch,
            ..Default::default()
        })
        .unwrap();
        let t = d.create_topic(TopicSpec::new("limits", 1)).unwrap();
        let p = t
            .producer_with(ProducerOptions {
                batch: Batching::adaptive().with_bytes(512 << 10),
                ..Default::default()
            })
            .unwrap();
        // Under the limit, above the producer's batch cap: accepted.
        p.push("{}", vec![3u8; 900 << 10]).unwrap().wait().unwrap();
        let e = match p.push("{}", vec![0u8; 2 << 20]) {
            Err(e) => e,
            Ok(f) => panic!(
                "expected a refusal at push, the event went out: {:?}",
                f.wait()
            ),
        };
        assert_eq!(e.code(), ErrorCode::BATCH_TOO_LARGE, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(setting),
            "names the server setting {setting}: {msg}"
        );
        let limit = (frame as u64).min(batch);
        assert!(
            msg.contains(&(limit / 1024).to_string()) || msg.contains(&limit.to_string()),
            "names the limit: {msg}"
        );
    }
}

#[test]
fn a_producer_dropped_by_a_panicking_thread_does_not_wait_for_held_appends() {
    let (_dir, d) = server(1 << 20);
    let t = d.create_topic(memory_spec("panics")).unwrap();
    let pusher = {
        let t = t.clone();
        std::thread::spawn(move || {
            let p = one_per_batch(&t);
            let futs = push_unacked(&p, 6, 256 << 10);
            assert!(futs[5]
                .wait_timeout(Some(Duration::from_millis(300)))
                .is_err());
            // Unwinding drops `p` with appends held: nobody will ack them.
            panic!("the pushing thread fails");
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pusher.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        pusher.is_finished(),
        "the panicking thread hangs in the producer's drop, waiting for appends nobody will free"
    );
    assert!(pusher.join().is_err(), "the thread panicked");
    // What the server stored before is still delivered.
    let c = t.consumer("after").unwrap();
    for i in 0..3u64 {
        let ev = common::next_event(&c);
        assert_eq!(ev.offset, i);
        ev.ack().wait().unwrap();
    }
}
