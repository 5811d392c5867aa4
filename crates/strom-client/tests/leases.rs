//! Producer leases against an embedded server: the driver renews a live
//! producer's lease in the background, a producer dropped without `close`
//! expires and its part of the stream ends, and a producer whose lease was
//! lost fails with `PRODUCER_EXPIRED`.

use std::time::{Duration, Instant};

use strom_client::{Driver, ErrorCode, Next, ProducerOptions, TopicSpec};

/// The shortest lease a server grants.
const LEASE: Duration = Duration::from_secs(1);

fn leased() -> ProducerOptions {
    ProducerOptions {
        lease: Some(LEASE),
        ..Default::default()
    }
}

#[test]
fn an_idle_leased_producer_keeps_its_lease_across_several_periods() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("idle", 1)).unwrap();
    let p = t.producer_with(leased()).unwrap();
    p.push("{\"n\":1}", ()).unwrap().wait().unwrap();
    // Idle for four leases: only the driver's renewals keep it.
    std::thread::sleep(LEASE * 4);
    let st = d.describe("idle").unwrap().state;
    assert_eq!(
        (st.open_producers, st.expired_producers, st.ended),
        (1, 0, false),
        "{st:?}"
    );
    let c = t.consumer("c").unwrap();
    assert!(matches!(c.pull_timeout(LEASE).unwrap(), Next::Event(_)));
    match c.pull_timeout(Duration::from_millis(300)) {
        Err(e) => assert_eq!(e.code(), ErrorCode::TIMEOUT),
        Ok(_) => panic!("the stream must stay open while the lease is renewed"),
    }
    p.push("{\"n\":2}", ()).unwrap();
    p.close().unwrap();
    assert!(matches!(c.pull_timeout(LEASE * 5).unwrap(), Next::Event(_)));
    assert!(matches!(
        c.pull_timeout(LEASE * 5).unwrap(),
        Next::EndOfStream
    ));
    let st = d.describe("idle").unwrap().state;
    assert_eq!((st.closed_producers, st.expired_producers), (1, 0));
}

#[test]
fn a_producer_dropped_without_close_expires_and_its_part_ends() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("dropped", 2)).unwrap();
    let keeper = t.producer_with(leased()).unwrap();
    let dead = t.producer_with(leased()).unwrap();
    dead.push("{\"who\":\"dead\"}", ()).unwrap().wait().unwrap();
    drop(dead); // flushed, never closed, no longer renewed
    keeper.push("{\"who\":\"keeper\"}", ()).unwrap();
    keeper.close().unwrap();
    let c = t.consumer("c").unwrap();
    for _ in 0..2 {
        assert!(matches!(c.pull_timeout(LEASE * 5).unwrap(), Next::Event(_)));
    }
    let start = Instant::now();
    assert!(
        matches!(c.pull_timeout(LEASE * 10).unwrap(), Next::EndOfStream),
        "the dropped producer's lease expires and the stream ends"
    );
    assert!(start.elapsed() < LEASE * 10);
    let st = d.describe("dropped").unwrap().state;
    assert_eq!(
        (st.open_producers, st.closed_producers, st.expired_producers),
        (0, 1, 1),
        "{st:?}"
    );
}

#[test]
fn a_producer_whose_lease_was_lost_fails_with_producer_expired() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("lost", 1)).unwrap();
    let other = t.producer_with(leased()).unwrap();
    let p = t.producer_with(leased()).unwrap();
    // Closed on its behalf: the next renewal reports the lease lost.
    t.close_producer(p.id()).unwrap();
    let deadline = Instant::now() + LEASE * 5;
    let err = loop {
        match p.push("{}", ()) {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => std::thread::sleep(LEASE / 10),
            Ok(_) => panic!("the producer never learned that its lease was lost"),
        }
    };
    assert_eq!(err.code(), ErrorCode::PRODUCER_EXPIRED, "{err}");
    assert_eq!(p.flush().unwrap_err().code(), ErrorCode::PRODUCER_EXPIRED);
    assert_eq!(p.close().unwrap_err().code(), ErrorCode::PRODUCER_EXPIRED);
    // The other producer's lease is untouched.
    other.push("{}", ()).unwrap().wait().unwrap();
    other.close().unwrap();
}

#[test]
fn a_producer_without_a_lease_stays_open_after_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("kept", 1)).unwrap();
    let p = t
        .producer_with(ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .unwrap();
    p.push("{}", ()).unwrap().wait().unwrap();
    drop(p);
    std::thread::sleep(LEASE * 3);
    let st = d.describe("kept").unwrap().state;
    assert_eq!((st.open_producers, st.ended), (1, false), "{st:?}");
}

#[test]
fn a_short_lease_opened_after_a_long_one_is_renewed_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("mixed", 1)).unwrap();
    let long = t
        .producer_with(ProducerOptions {
            lease: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .unwrap();
    // The renewal task now sleeps for a third of 60 s; a new short lease
    // must wake it.
    std::thread::sleep(Duration::from_millis(200));
    let short = t.producer_with(leased()).unwrap();
    std::thread::sleep(LEASE * 3);
    let st = d.describe("mixed").unwrap().state;
    assert_eq!((st.open_producers, st.expired_producers), (2, 0), "{st:?}");
    short.close().unwrap();
    long.close().unwrap();
}
