//! `Event::ack_when`: a task is acked once the pushes of its results are
//! stored, with nobody waiting. A worker's plain pull loop then never
//! stalls on its prefetch window (before it, a worker holding `prefetch`
//! unacked tasks received nothing more until the visibility timeout), and a
//! task whose result failed is not acked: a shared group delivers it again.

use std::time::Duration;

use strom_client::{Driver, GroupOptions, Next, PartitionType, ProducerOptions, Topic, TopicSpec};

const PULL: Duration = Duration::from_secs(20);

fn topic(d: &Driver, name: &str) -> Topic {
    d.create_topic(TopicSpec {
        partition_type: PartitionType::File,
        ..TopicSpec::new(name, 1)
    })
    .unwrap()
}

fn produce(t: &Topic, n: u32) {
    let p = t
        .producer_with(ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .unwrap();
    for i in 0..n {
        drop(p.push(format!("{{\"i\":{i}}}"), ()).unwrap());
    }
    p.close().unwrap();
}

fn group(prefetch: u32) -> GroupOptions {
    let mut o = GroupOptions::shared();
    o.consumer.prefetch = prefetch;
    // A stalled worker would see its tasks come back after this long,
    // with a delivery count of 2.
    o.visibility_timeout = Duration::from_secs(10);
    o
}

#[test]
fn a_worker_acking_when_its_results_are_stored_never_stalls_on_its_prefetch_window() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let tasks = topic(&d, "tasks");
    let results = topic(&d, "results");
    produce(&tasks, 400);
    let worker = tasks.consumer_group("g", group(8)).unwrap();
    let out = results.producer().unwrap();
    let mut seen = Vec::new();
    // The natural loop: take a task, push its result, ack when it is stored.
    while let Next::Event(ev) = worker.pull_timeout(PULL).unwrap() {
        assert_eq!(
            ev.deliveries(),
            1,
            "task {} came back: its ack never went",
            ev.offset
        );
        let result = out.push(format!("{{\"task\":{}}}", ev.offset), ()).unwrap();
        ev.ack_when([&result]);
        seen.push(ev.offset);
    }
    assert_eq!(seen, (0..400).collect::<Vec<_>>());
    out.close().unwrap();
    assert_eq!(results.describe().unwrap().partitions[0].next_offset, 400);
    let info = d.describe_group("g").unwrap();
    let p = &info.partitions[0];
    assert_eq!(
        (p.committed, p.pending, p.redelivered),
        (400, 0, 0),
        "{p:?}"
    );
}

#[test]
fn with_no_results_ack_when_acks_at_once_and_it_waits_for_every_result() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let tasks = topic(&d, "tasks");
    let results = topic(&d, "results");
    produce(&tasks, 2);
    let worker = tasks.consumer_group("g", group(8)).unwrap();
    let Next::Event(first) = worker.pull_timeout(PULL).unwrap() else {
        panic!("no task")
    };
    first.ack_when([]);
    let Next::Event(second) = worker.pull_timeout(PULL).unwrap() else {
        panic!("no second task")
    };
    // Two results, the second held back by a producer that has not sent it.
    let out = results
        .producer_with(ProducerOptions {
            batch: strom_client::Batching::count(1000),
            linger: Duration::from_secs(3600),
            ..Default::default()
        })
        .unwrap();
    let a = out.push("{\"r\":1}", ()).unwrap();
    let b = out.push("{\"r\":2}", ()).unwrap();
    second.ack_when([&a, &b]);
    let pending = |d: &Driver| d.describe_group("g").unwrap().partitions[0].pending;
    let deadline = std::time::Instant::now() + PULL;
    while pending(&d) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first task was never acked"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    out.flush().unwrap();
    while pending(&d) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second task was not acked after its results"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_task_whose_result_failed_is_not_acked_and_a_shared_group_delivers_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let tasks = topic(&d, "tasks");
    let results = topic(&d, "results");
    produce(&tasks, 1);
    let out = results.producer().unwrap();
    results.complete().unwrap(); // later pushes fail with TOPIC_CLOSED
    let worker = tasks.consumer_group("g", group(8)).unwrap();
    let Next::Event(ev) = worker.pull_timeout(PULL).unwrap() else {
        panic!("no task")
    };
    let result = out.push("{\"r\":1}", ()).unwrap();
    ev.ack_when([&result]);
    assert!(
        result.wait_timeout(Some(PULL)).is_err(),
        "the result was stored"
    );
    let Next::Event(again) = worker.pull_timeout(PULL).unwrap() else {
        panic!("the task was not delivered again")
    };
    assert_eq!((again.offset, again.deliveries()), (0, 2));
}
