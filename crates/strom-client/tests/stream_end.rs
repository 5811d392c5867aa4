//! A producer that died without closing can be closed on its behalf, which
//! lets the stream end.

use std::time::Duration;

use strom_client::{Driver, ErrorCode, Next, TopicSpec};

#[test]
fn closing_a_dead_producer_by_id_ends_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("s", 1)).unwrap();
    let alive = t.producer().unwrap();
    let dead = t.producer().unwrap();
    let dead_id = dead.id();
    dead.push("{\"who\":\"dead\"}", ()).unwrap().wait().unwrap();
    drop(dead); // flushed, never closed: as if its process had died
    alive.push("{\"who\":\"alive\"}", ()).unwrap();
    alive.close().unwrap();
    let c = t.consumer("c").unwrap();
    for _ in 0..2 {
        assert!(matches!(c.pull().wait().unwrap(), Next::Event(_)));
    }
    let err = match c.pull_timeout(Duration::from_millis(300)) {
        Err(e) => e,
        Ok(_) => panic!("the stream must not end while a producer is open"),
    };
    assert_eq!(err.code(), ErrorCode::TIMEOUT);
    t.close_producer(dead_id).unwrap();
    assert!(matches!(
        c.pull_timeout(Duration::from_secs(10)).unwrap(),
        Next::EndOfStream
    ));
    let unknown = t.close_producer(9999).unwrap_err();
    assert_eq!(unknown.code(), ErrorCode::PRODUCER_NOT_FOUND);
}
