//! Blocking calls made where they would deadlock (on the driver's own
//! threads, from a data selector) fail with a clear error instead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use strom_client::{
    ConsumerOptions, DataDescriptor, Driver, ErrorCode, EventMeta, Next, Selection, TopicSpec,
};

#[test]
fn a_blocking_call_from_a_data_selector_fails_instead_of_deadlocking() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("b", 1)).unwrap();
    let p = t.producer().unwrap();
    p.push("{}", b"data".to_vec()).unwrap().wait().unwrap();
    p.close().unwrap();
    let seen: Arc<Mutex<Vec<strom_client::Result<u32>>>> = Arc::default();
    let (seen2, d2) = (seen.clone(), d.clone());
    let selector = move |_: &EventMeta, _: &DataDescriptor| {
        // Runs on a driver thread: describing the topic there must not wait.
        seen2
            .lock()
            .unwrap()
            .push(d2.describe("b").map(|i| i.spec.partitions));
        Selection::All
    };
    let opts = ConsumerOptions {
        selector: Arc::new(selector),
        ..Default::default()
    };
    let c = t.consumer_with("c", opts).unwrap();
    match c.pull_timeout(Duration::from_secs(20)).unwrap() {
        Next::Event(ev) => assert_eq!(ev.data_vec(), b"data"),
        Next::EndOfStream => panic!("the event was lost"),
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let err = seen[0].as_ref().unwrap_err();
    assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT);
    assert!(err.to_string().contains("would deadlock"), "{err}");
    // From the application's thread the same call works.
    assert_eq!(d.describe("b").unwrap().spec.partitions, 1);
}
