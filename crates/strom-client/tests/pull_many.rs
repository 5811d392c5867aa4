//! `Consumer::pull_many`: everything that has arrived, up to a count, in
//! one call, for workers that process in batches.

use std::time::{Duration, Instant};

use strom_client::{Batching, Driver, ProducerOptions, TopicSpec};

fn offsets(events: &[strom_client::Event]) -> Vec<u64> {
    events.iter().map(|e| e.offset).collect()
}

#[test]
fn pull_many_takes_what_has_arrived_up_to_max_then_reports_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("tasks", 1)).unwrap();
    // One batch of ten, so they all arrive together: with adaptive batching
    // the first event goes alone and the first `pull_many` could see only it.
    let p = t
        .producer_with(ProducerOptions {
            batch: Batching::count(10),
            ..Default::default()
        })
        .unwrap();
    for i in 0..10 {
        p.push(format!("{{\"task\":{i}}}"), ()).unwrap();
    }
    p.flush().unwrap();
    let c = t.consumer("workers").unwrap();
    let first = c.pull_many(4, Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(offsets(&first), vec![0, 1, 2, 3]);
    // The rest, in one call, once all six have arrived.
    let mut rest = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rest.len() < 6 && Instant::now() < deadline {
        rest.extend(c.pull_many(100, Duration::from_secs(1)).unwrap().unwrap());
    }
    assert_eq!(offsets(&rest), (4..10).collect::<Vec<_>>());
    // Nothing more has arrived: an empty batch after the timeout, no error.
    let started = Instant::now();
    let empty = c
        .pull_many(10, Duration::from_millis(200))
        .unwrap()
        .unwrap();
    assert!(empty.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(150));
    // Zero timeout drains without waiting.
    assert!(c.pull_many(10, Duration::ZERO).unwrap().unwrap().is_empty());
    p.push("{\"task\":10}", ()).unwrap();
    p.close().unwrap();
    let last = c.pull_many(10, Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(offsets(&last), vec![10]);
    assert!(c.pull_many(10, Duration::from_secs(10)).unwrap().is_none());
}
