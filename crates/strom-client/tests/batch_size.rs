//! The producer's automatic batch size: 256 KiB of metadata and 4 MiB in
//! all, so events with data parts travel several to a batch (each batch
//! costs a round trip through the server), while metadata alone still
//! closes a batch at 256 KiB, and a size the producer chooses bounds
//! metadata and data parts alike. The consumer sees where each batch ended
//! (`Event::batch_end`).

#[allow(dead_code)]
mod common;

use std::time::Duration;

use strom_client::{Batching, Driver, PartitionType, ProducerOptions, TopicSpec};

const EVENTS: u64 = 16;

/// Pushes `EVENTS` events of `meta_pad` bytes of metadata padding and
/// `data` bytes of data as one batch trigger allows (`Count(EVENTS)`, a long
/// linger) and returns each event's `batch_end`, in order.
fn batch_ends(batch: Batching, meta_pad: usize, data: usize) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d
        .create_topic(TopicSpec {
            partition_type: PartitionType::Memory,
            ..TopicSpec::new("batches", 1)
        })
        .unwrap();
    let p = t
        .producer_with(ProducerOptions {
            batch,
            linger: Duration::from_secs(30),
            ..Default::default()
        })
        .unwrap();
    let pad = "x".repeat(meta_pad);
    let pushes: Vec<_> = (0..EVENTS)
        .map(|i| {
            p.push(
                format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"),
                vec![i as u8; data],
            )
            .unwrap()
        })
        .collect();
    p.close().unwrap();
    for f in pushes {
        f.wait().unwrap();
    }
    let c = t.consumer("ends").unwrap();
    (0..EVENTS)
        .map(|i| {
            let ev = common::next_event(&c);
            assert_eq!(ev.meta().offset, i);
            assert_eq!(ev.data(), &vec![i as u8; data][..]);
            ev.batch_end()
        })
        .collect()
}

#[test]
fn events_with_data_parts_travel_several_to_an_automatic_batch() {
    // 16 × 64 KiB of data is 1 MiB: one batch under the automatic 4 MiB
    // (it was four batches of at most 256 KiB).
    let ends = batch_ends(Batching::count(EVENTS as u32), 0, 64 << 10);
    assert_eq!(ends, vec![EVENTS; EVENTS as usize]);
}

#[test]
fn metadata_alone_still_closes_an_automatic_batch_at_256_kib() {
    let ends = batch_ends(Batching::count(EVENTS as u32), 64 << 10, 0);
    assert!(ends[0] <= 4, "{ends:?}");
    assert_eq!(*ends.last().unwrap(), EVENTS);
}

#[test]
fn a_chosen_batch_size_bounds_data_parts_too() {
    let ends = batch_ends(
        Batching::count(EVENTS as u32).with_bytes(256 << 10),
        0,
        64 << 10,
    );
    assert!(ends[0] <= 4, "{ends:?}");
    assert_eq!(*ends.last().unwrap(), EVENTS);
}
