//! The built-in selectors from Rust, end to end against an embedded
//! server: a `where` predicate choosing a sub-array of array payloads, and
//! an array selection refused with its reason.

use std::sync::Arc;
use std::time::Duration;

use strom_client::select::{ArrayLayout, Order, Selector};
use strom_client::{ConsumerOptions, Driver, ErrorCode, Next, TopicSpec};

/// A 4 x 5 row-major array of little-endian i32, element `(r, c)` = `100 k + 10 r + c`.
fn array(k: i32) -> (ArrayLayout, Vec<u8>) {
    let layout = ArrayLayout {
        dtype: "<i4".into(),
        shape: vec![4, 5],
        order: Order::C,
    };
    let bytes = (0..4)
        .flat_map(|r| (0..5).map(move |c| 100 * k + 10 * r + c))
        .flat_map(i32::to_le_bytes)
        .collect();
    (layout, bytes)
}

fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn where_then_array_fetches_only_the_sub_array_of_matching_events() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("arrays", 1)).unwrap();
    let p = t.producer().unwrap();
    for k in 0..4 {
        let (layout, bytes) = array(k);
        let meta = format!(r#"{{"k": {k}, "keep": {}}}"#, k % 2 == 0);
        p.push_with(meta, bytes, None, &layout.to_descriptor())
            .unwrap();
    }
    p.close().unwrap();
    let selector: Selector = "keep == true then [1:3, ::-2]".parse().unwrap();
    let opts = ConsumerOptions {
        selector: Arc::new(selector),
        ..Default::default()
    };
    let c = t.consumer_with("c", opts).unwrap();
    for k in 0..4 {
        let ev = match c.pull_timeout(Duration::from_secs(20)).unwrap() {
            Next::Event(ev) => ev,
            Next::EndOfStream => panic!("event {k} missing"),
        };
        assert_eq!(ev.data_size(), 80);
        if k % 2 == 0 {
            let b = 100 * k;
            assert_eq!(
                ints(&ev.data_vec()),
                vec![b + 14, b + 12, b + 10, b + 24, b + 22, b + 20],
                "rows 1..3, columns 4, 2, 0 of event {k}"
            );
        } else {
            assert_eq!(ev.fetched_len(), 0, "event {k} does not match");
        }
    }
}

#[test]
fn an_array_selection_on_plain_data_fails_the_pull_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = Driver::embedded(dir.path()).unwrap();
    let t = d.create_topic(TopicSpec::new("plain", 1)).unwrap();
    let p = t.producer().unwrap();
    p.push("{}", b"not an array".to_vec()).unwrap();
    p.close().unwrap();
    let opts = ConsumerOptions {
        selector: Arc::new(Selector::array(vec![])),
        ..Default::default()
    };
    let c = t.consumer_with("c", opts).unwrap();
    let err = match c.pull_timeout(Duration::from_secs(20)) {
        Err(e) => e,
        Ok(_) => panic!("an array selection must refuse data with no array descriptor"),
    };
    assert_eq!(err.code(), ErrorCode::DATA_SELECTOR);
    assert!(
        err.to_string()
            .contains("event 0/0 has no array descriptor"),
        "{err}"
    );
}
