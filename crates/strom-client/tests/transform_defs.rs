//! Transform definitions against an embedded server: a cycle of
//! transforms (a self-loop, two topics, or longer) is refused when it
//! would be created, naming it; a member's transform host runs no more
//! workers than its cap; definitions are read once each, not again from
//! the beginning on every poll.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use strom_client::transform::defs::{self, Defs, TransformSpec};
use strom_client::transform::host::TransformHost;
use strom_client::{Driver, ErrorCode, TopicSpec};

fn spec(name: &str, from: &str, to: &str) -> TransformSpec {
    TransformSpec {
        name: name.into(),
        from: from.into(),
        to: to.into(),
        ops: vec![],
    }
}

fn embedded(topics: &[(&str, u32)]) -> (tempfile::TempDir, Driver) {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    for (t, n) in topics {
        d.create_topic(TopicSpec::new(*t, *n)).unwrap();
    }
    (dir, d)
}

#[test]
fn creating_a_cycle_of_transforms_is_refused_and_names_it() {
    let (_dir, d) = embedded(&[("x", 1), ("y", 1), ("z", 1)]);
    defs::create(&d, &spec("a", "x", "y")).unwrap();
    let refused = |s: TransformSpec, cycle: &str| {
        let e = defs::create(&d, &s).expect_err("a cycle was created");
        assert_eq!(e.code(), ErrorCode::INVALID_ARGUMENT, "{e}");
        assert!(e.message().contains(cycle), "{e}");
    };
    refused(spec("b", "y", "x"), "x -> y (a), y -> x (b)");
    refused(spec("self", "z", "z"), "read and write topic 'z'");
    defs::create(&d, &spec("c", "y", "z")).unwrap();
    refused(spec("d", "z", "x"), "x -> y (a), y -> z (c), z -> x (d)");
    let names: Vec<String> = defs::list(&d).unwrap().into_keys().collect();
    assert_eq!(names, ["a", "c"], "only the acyclic ones were recorded");
    // Deleting a link of the would-be cycle makes room for the edge.
    defs::delete(&d, "c").unwrap();
    defs::create(&d, &spec("d", "z", "x")).unwrap();
}

#[test]
fn a_definitions_reader_reads_each_record_once() {
    let (_dir, d) = embedded(&[("x", 1), ("y", 1), ("z", 1)]);
    let mut r = Defs::default();
    assert!(
        r.refresh(&d).unwrap().is_empty(),
        "no definitions topic yet"
    );
    defs::create(&d, &spec("a", "x", "y")).unwrap();
    defs::create(&d, &spec("b", "x", "z")).unwrap();
    assert_eq!(r.refresh(&d).unwrap().len(), 2);
    assert_eq!((r.records_read(), r.next_offset()), (2, 2));
    for _ in 0..3 {
        r.refresh(&d).unwrap();
    }
    assert_eq!(r.records_read(), 2, "polls with nothing new read nothing");
    defs::delete(&d, "a").unwrap();
    let now: Vec<String> = r.refresh(&d).unwrap().keys().cloned().collect();
    assert_eq!(now, ["b"]);
    assert_eq!(
        (r.records_read(), r.next_offset()),
        (3, 3),
        "only the new record was read"
    );
}

/// Waits (bounded) until `ok` holds.
fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_transform_host_runs_at_most_its_cap_and_reads_definitions_once() {
    let (_dir, d) = embedded(&[("src", 3), ("o1", 1), ("o2", 1)]);
    defs::create(&d, &spec("t1", "src", "o1")).unwrap();
    defs::create(&d, &spec("t2", "src", "o2")).unwrap();
    let me = d.members().unwrap()[0].clone();
    let host = TransformHost::start(
        None,
        me.addr.clone(),
        move || me.id,
        2,
        Box::new(|| Ok(None)),
    );
    let stats = host.stats();
    wait_until("three rounds of the host", || {
        stats.rounds.load(Ordering::Acquire) >= 3
    });
    assert_eq!(
        stats.wanted.load(Ordering::Relaxed),
        6,
        "2 transforms x 3 partitions"
    );
    assert_eq!(stats.running.load(Ordering::Relaxed), 2, "the cap holds");
    assert_eq!(
        stats.defs_read.load(Ordering::Relaxed),
        2,
        "each definition record was read once over three rounds"
    );
    host.stop();
}
