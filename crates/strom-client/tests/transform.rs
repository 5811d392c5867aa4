//! A user-defined transform from Rust (`transform::run_all` with a
//! closure), end to end against an embedded server: each source event
//! becomes zero, one or two output events, in source order per partition;
//! a second run after the source ended writes nothing more; an error from
//! the closure stops the run and names the event.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use strom_client::transform::{run_all, FnTransformer, Out};
use strom_client::{Driver, Event, MetadataInput, Next, StartPos, TopicSpec};

fn outputs(ev: &Event) -> Vec<Out> {
    let i = ev.json().unwrap()["i"].as_u64().unwrap();
    let out = |k: u64| Out {
        metadata: MetadataInput::Value(serde_json::json!({ "i": i, "k": k })),
        descriptor: Bytes::new(),
        data: Bytes::from(ev.data_vec()),
    };
    match i % 3 {
        0 => vec![],
        1 => vec![out(0)],
        _ => vec![out(0), out(1)],
    }
}

fn read(d: &Driver, topic: &str) -> Vec<(u32, u64, u64, Vec<u8>)> {
    let c = d
        .open_topic(topic)
        .unwrap()
        .consumer_with(
            "check",
            strom_client::ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    let mut got = Vec::new();
    while let Ok(Next::Event(e)) = c.pull_timeout(std::time::Duration::from_secs(2)) {
        let v = e.json().unwrap();
        got.push((
            e.partition,
            v["i"].as_u64().unwrap(),
            v["k"].as_u64().unwrap(),
            e.data_vec(),
        ));
    }
    got.sort_by_key(|g| (g.0, g.1, g.2));
    got
}

#[test]
fn a_closure_transform_writes_its_outputs_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let src = d.create_topic(TopicSpec::new("src", 2)).unwrap();
    let dst = d.create_topic(TopicSpec::new("dst", 2)).unwrap();
    let p = src.producer().unwrap();
    for i in 0..30u64 {
        let meta = serde_json::json!({ "i": i });
        p.push_with(meta, vec![i as u8; 8], Some((i % 2) as u32), &[])
            .unwrap();
    }
    p.close().unwrap();
    let f = Arc::new(FnTransformer(|ev: Event| Ok(outputs(&ev))));
    let stop = Arc::new(AtomicBool::new(false));
    let done = run_all("mine", &src, &dst, f.clone(), stop.clone()).unwrap();
    assert_eq!((done.read, done.written, done.ended), (30, 30, true));
    let mut want = Vec::new();
    for i in 0..30u64 {
        let ks = [0, 1, 2][(i % 3) as usize];
        for k in 0..ks {
            want.push(((i % 2) as u32, i, k, vec![i as u8; 8]));
        }
    }
    want.sort_by_key(|g| (g.0, g.1, g.2));
    assert_eq!(read(&d, "dst"), want);
    // Run again: it resumes at the end, reads nothing, writes nothing.
    let again = run_all("mine", &src, &dst, f, stop).unwrap();
    assert_eq!((again.read, again.written), (0, 0));
    assert_eq!(read(&d, "dst").len(), want.len());
}

#[test]
fn an_error_from_the_closure_stops_the_run_and_names_the_event() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let src = d.create_topic(TopicSpec::new("src", 1)).unwrap();
    let dst = d.create_topic(TopicSpec::new("dst", 1)).unwrap();
    let p = src.producer().unwrap();
    for i in 0..5u64 {
        p.push(serde_json::json!({ "i": i }), ()).unwrap();
    }
    p.close().unwrap();
    let f = Arc::new(FnTransformer(|ev: Event| {
        if ev.offset == 3 {
            return Err(strom_client::Error::InvalidArgument("no good".into()));
        }
        Ok(vec![])
    }));
    let e = run_all("bad", &src, &dst, f, Arc::new(AtomicBool::new(false))).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("0/3") && msg.contains("no good"), "{msg}");
}
