//! The client conformance suite: what a user of the Rust client relies on,
//! checked end to end against an embedded server. Every test body runs once
//! per partition type (`memory::*` and `file::*`), each against its own
//! server in its own temporary directory, so tests run in parallel.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::{
    drain, field, next_event, no_data, offsets, push_n, random_bytes, spec, take, Server,
};
use serde_json::json;
use strom_client::{
    Batching, ChunkPart, ConsumerOptions, DataBuffer, DataDescriptor, ErrorCode, EventMeta,
    PartitionType, PoolBroker, PooledBuffer, ProducerOptions, Selection,
};

conformance!(
    one_producer_keeps_push_order_within_a_partition,
    large_and_small_batches_from_one_producer_keep_their_order,
    each_producer_keeps_its_order_and_offsets_are_dense,
    every_data_selector_fetches_exactly_the_selected_bytes,
    custom_broker_receives_the_bytes_across_its_buffers_in_order,
    the_pool_broker_shares_chunks_among_small_parts_only,
    json_schema_validator_rejects_bad_metadata_and_names_the_rule,
    json_validator_rejects_text_that_is_not_json,
    acks_persist_across_a_consumer_restart_per_name,
);

// ---------------------------------------------------------------- ordering

fn each_producer_keeps_its_order_and_offsets_are_dense(pt: PartitionType) {
    const N: u64 = 300;
    let s = Server::start();
    let t = s.driver.create_topic(spec("order", 1, pt)).expect("topic");
    // Register every producer before any closes: the stream ends when all
    // registered producers have closed.
    let producers: Vec<_> = (0..3).map(|_| t.producer().expect("producer")).collect();
    std::thread::scope(|scope| {
        for (k, p) in producers.into_iter().enumerate() {
            let k = k as u64;
            scope.spawn(move || {
                let futs: Vec<_> = (0..N)
                    .map(|i| {
                        let meta = json!({ "producer": k, "seq": i });
                        p.push(meta, vec![k as u8; (i % 5) as usize]).expect("push")
                    })
                    .collect();
                p.close().expect("close");
                let ids: Vec<_> = futs
                    .into_iter()
                    .map(|f| f.wait().expect("stored"))
                    .collect();
                assert!(
                    ids.windows(2).all(|w| w[0].offset < w[1].offset),
                    "producer {k}'s offsets are not increasing in push order"
                );
            });
        }
    });
    let events = drain(&t.consumer("c").expect("consumer"));
    assert_eq!(
        offsets(&events),
        (0..3 * N).collect::<Vec<_>>(),
        "offsets are not dense from 0"
    );
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut seen = vec![0u64; 3];
    for e in &events {
        let (k, seq) = (field(e, "producer"), field(e, "seq"));
        if let Some(prev) = last.insert(k, seq) {
            assert!(seq > prev, "producer {k}: seq {seq} arrived after {prev}");
        }
        assert_eq!(
            e.data(),
            &vec![k as u8; (seq % 5) as usize][..],
            "data of producer {k} seq {seq}"
        );
        seen[k as usize] += 1;
    }
    assert_eq!(seen, vec![N; 3], "events per producer");
}

fn one_producer_keeps_push_order_within_a_partition(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("order1", 1, pt)).expect("topic");
    let p = t.producer().expect("producer");
    // Each burst starts on an idle producer, so its first events go out as
    // separate batches that are in flight together.
    let mut ids = Vec::new();
    for burst in 0..100u64 {
        let futs: Vec<_> = (0..4)
            .map(|j| p.push(json!({ "i": burst * 4 + j }), ()).expect("push"))
            .collect();
        p.flush().expect("flush");
        ids.extend(futs.into_iter().map(|f| f.wait().expect("stored").offset));
    }
    p.close().expect("close");
    assert_eq!(ids, (0..400).collect::<Vec<_>>(), "offsets in push order");
    let events = drain(&t.consumer("c").expect("consumer"));
    let order: Vec<u64> = events.iter().map(|e| field(e, "i")).collect();
    assert_eq!(order, (0..400).collect::<Vec<_>>(), "events in push order");
}

fn large_and_small_batches_from_one_producer_keep_their_order(pt: PartitionType) {
    // Batches over 256 KiB are appended while the connection receives the
    // next request; a small batch right behind a large one must still get
    // the next offset, never overtake it.
    const N: u64 = 40;
    const LARGE: usize = 300 << 10;
    let size = |i: u64| if i.is_multiple_of(2) { LARGE } else { 3 };
    let s = Server::start();
    let t = s.driver.create_topic(spec("mixed", 1, pt)).expect("topic");
    let p = t
        .producer_with(ProducerOptions {
            batch: Batching::count(1),
            max_batches: 4,
            ..Default::default()
        })
        .expect("producer");
    let futs: Vec<_> = (0..N)
        .map(|i| {
            let data = random_bytes(i, size(i));
            p.push(json!({ "i": i }), data).expect("push")
        })
        .collect();
    p.close().expect("close");
    let ids: Vec<u64> = futs
        .into_iter()
        .map(|f| f.wait().expect("stored").offset)
        .collect();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "offsets in push order");
    let events = drain(&t.consumer("c").expect("consumer"));
    let order: Vec<u64> = events.iter().map(|e| field(e, "i")).collect();
    assert_eq!(order, (0..N).collect::<Vec<_>>(), "events in push order");
    for e in &events {
        let i = field(e, "i");
        assert_eq!(e.data(), &random_bytes(i, size(i))[..], "data of event {i}");
    }
}

// ---------------------------------------------------- selectors and brokers

const DATA_LEN: usize = 4096;

/// A topic holding 4 events of `DATA_LEN` pseudo-random bytes each, with
/// metadata `{"i": i}`; returns the server and the bytes.
fn data_topic(pt: PartitionType) -> (Server, Vec<Vec<u8>>) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("data", 1, pt)).expect("topic");
    let originals: Vec<Vec<u8>> = (0..4).map(|i| random_bytes(i + 1, DATA_LEN)).collect();
    let p = t.producer().expect("producer");
    push_n(&p, 4, |i| originals[i as usize].clone());
    p.close().expect("close");
    (s, originals)
}

fn every_data_selector_fetches_exactly_the_selected_bytes(pt: PartitionType) {
    let (s, orig) = data_topic(pt);
    let t = s.driver.open_topic("data").expect("open topic");
    let read = |name: &str, selector: Arc<dyn strom_client::DataSelector>| {
        let opts = ConsumerOptions {
            selector,
            ..Default::default()
        };
        let events = drain(&t.consumer_with(name, opts).expect("consumer"));
        assert_eq!(events.len(), orig.len(), "selector {name}: event count");
        for e in &events {
            assert_eq!(e.data_size(), DATA_LEN as u64, "selector {name}: data_size");
            assert_eq!(
                e.fetched_len(),
                e.data_vec().len() as u64,
                "selector {name}: fetched_len"
            );
        }
        events
    };

    for e in &read("none", Arc::new(Selection::None)) {
        assert_eq!(e.fetched_len(), 0);
        assert!(
            e.data().is_empty() && e.data_vec().is_empty(),
            "Selection::None fetched bytes"
        );
    }
    for e in &read("all", Arc::new(Selection::All)) {
        assert_eq!(
            e.data_vec(),
            orig[field(e, "i") as usize],
            "Selection::All at {}",
            e.offset
        );
        assert_eq!(e.data(), &orig[field(e, "i") as usize][..]);
    }
    for e in &read(
        "range",
        Arc::new(Selection::Range {
            offset: 100,
            len: 1000,
        }),
    ) {
        assert_eq!(
            e.data_vec(),
            orig[field(e, "i") as usize][100..1100],
            "Selection::Range at {}",
            e.offset
        );
    }
    let strided = Selection::Strided {
        offset: 7,
        block: 16,
        stride: 100,
        count: 40,
    };
    for e in &read("strided", Arc::new(strided)) {
        let o = &orig[field(e, "i") as usize];
        let want: Vec<u8> = (0..40)
            .flat_map(|i| o[7 + i * 100..7 + i * 100 + 16].to_vec())
            .collect();
        assert_eq!(e.data_vec(), want, "Selection::Strided at {}", e.offset);
    }
    let ranges = Selection::Ranges(vec![(4000, 96), (0, 10), (2048, 1), (11, 5)]);
    for e in &read("ranges", Arc::new(ranges)) {
        let o = &orig[field(e, "i") as usize];
        let want = [&o[4000..4096], &o[0..10], &o[2048..2049], &o[11..16]].concat();
        assert_eq!(
            e.data_vec(),
            want,
            "Selection::Ranges (in the given order) at {}",
            e.offset
        );
    }
    // A closure choosing per event from its metadata and descriptor.
    let per_event = |m: &EventMeta, d: &DataDescriptor| {
        let i = m.json().expect("metadata")["i"].as_u64().expect("i");
        match i {
            0 => Selection::None,
            1 => Selection::All,
            2 => Selection::Range {
                offset: d.size - 10,
                len: 10,
            },
            _ => Selection::Strided {
                offset: 0,
                block: 1,
                stride: 2,
                count: d.size / 2,
            },
        }
    };
    let events = read("closure", Arc::new(per_event));
    let want: Vec<Vec<u8>> = vec![
        Vec::new(),
        orig[1].clone(),
        orig[2][DATA_LEN - 10..].to_vec(),
        orig[3].iter().step_by(2).copied().collect(),
    ];
    for e in &events {
        let want = &want[field(e, "i") as usize];
        assert_eq!(&e.data_vec(), want, "closure selector at {}", e.offset);
    }
}

fn custom_broker_receives_the_bytes_across_its_buffers_in_order(pt: PartitionType) {
    let (s, orig) = data_topic(pt);
    let t = s.driver.open_topic("data").expect("open topic");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let broker = move |m: &EventMeta,
                       sel: &Selection,
                       len: u64|
          -> Result<Vec<Box<dyn DataBuffer>>, String> {
        seen.lock().unwrap().push((m.offset, sel.clone(), len));
        let len = len as usize;
        Ok(vec![Box::new(vec![0u8; 10]), Box::new(vec![0u8; len - 10])])
    };
    let opts = ConsumerOptions {
        broker: Arc::new(broker),
        ..Default::default()
    };
    let events = drain(&t.consumer_with("broker", opts).expect("consumer"));
    assert_eq!(events.len(), orig.len());
    for e in &events {
        let o = &orig[field(e, "i") as usize];
        let bufs = e.buffers();
        assert_eq!(bufs.len(), 2, "the broker's two buffers are handed back");
        assert_eq!(bufs[0].as_slice(), &o[..10], "first buffer at {}", e.offset);
        assert_eq!(
            bufs[1].as_slice(),
            &o[10..],
            "second buffer at {}",
            e.offset
        );
        assert_eq!(e.data_vec(), *o, "data_vec concatenates the buffers");
    }
    let calls = calls.lock().unwrap().clone();
    let want: Vec<_> = (0..4)
        .map(|o| (o, Selection::All, DATA_LEN as u64))
        .collect();
    assert_eq!(calls, want, "broker calls (offset, selection, len)");
}

/// Sizes of the events of [`the_pool_broker_shares_chunks_among_small_parts_only`]:
/// small ones (more than one chunk's worth), none, and large ones between.
fn mixed_size(i: u64) -> usize {
    match i {
        0 => 1000,
        1 => 0,
        2 => 20_000,
        3 => 3000,
        4 => (16 << 10) - 1,
        5 => 16 << 10,
        _ => 1024 + i as usize,
    }
}

fn the_pool_broker_shares_chunks_among_small_parts_only(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("mixed", 1, pt)).expect("topic");
    let n = 80;
    let orig: Vec<Vec<u8>> = (0..n).map(|i| random_bytes(i + 7, mixed_size(i))).collect();
    let p = t.producer().expect("producer");
    push_n(&p, n, |i| orig[i as usize].clone());
    p.close().expect("close");
    // Event 3 selects two ranges, out of order; every other one all of it.
    let selector = |m: &EventMeta, _: &DataDescriptor| match m.offset {
        3 => Selection::Ranges(vec![(2000, 100), (0, 50)]),
        _ => Selection::All,
    };
    let opts = ConsumerOptions {
        selector: Arc::new(selector),
        broker: Arc::new(PoolBroker::default()),
        ..Default::default()
    };
    let mut events = drain(&t.consumer_with("pool", opts).expect("consumer"));
    assert_eq!(events.len(), n as usize);
    let mut parts = Vec::new();
    for e in &mut events {
        let i = field(e, "i") as usize;
        let o = &orig[i];
        let want = match i {
            3 => [&o[2000..2100], &o[..50]].concat(),
            _ => o.clone(),
        };
        assert_eq!(e.data_vec(), want, "event {i}");
        let bufs = e.take_buffers();
        if want.is_empty() {
            assert!(bufs.is_empty(), "event {i}: nothing fetched, no buffer");
            continue;
        }
        let [b] = <[_; 1]>::try_from(bufs).unwrap_or_else(|_| panic!("event {i}: one buffer"));
        let any = b.into_any();
        if want.len() < 16 << 10 {
            let part = any
                .downcast::<ChunkPart>()
                .unwrap_or_else(|_| panic!("event {i}: {} bytes, a chunk part", want.len()));
            let at = part.as_slice().as_ptr() as usize;
            assert_eq!(at % 16, 0, "event {i}: its part is aligned");
            parts.push((i, part));
        } else {
            assert!(
                any.downcast::<PooledBuffer>().is_ok(),
                "event {i}: {} bytes, a pooled buffer",
                want.len()
            );
        }
    }
    // Each part is its own: writing one leaves its neighbours as they were,
    // and parts outlive the events (and each other) they came with.
    let (first, mut part) = parts.remove(0);
    assert_eq!(first, 0);
    part.as_mut_slice().fill(0xAA);
    drop(events);
    for (i, p) in &parts {
        let want = match i {
            3 => [&orig[3][2000..2100], &orig[3][..50]].concat(),
            _ => orig[*i].clone(),
        };
        assert_eq!(
            p.as_slice(),
            &want[..],
            "event {i} after its neighbour was written"
        );
    }
    assert!(part.as_slice().iter().all(|&b| b == 0xAA));
}

// -------------------------------------------------------------- validators

fn json_schema_validator_rejects_bad_metadata_and_names_the_rule(pt: PartitionType) {
    let s = Server::start();
    let schema = json!({
        "type": "object",
        "required": ["step"],
        "properties": { "step": { "type": "integer", "minimum": 0 } }
    });
    let mut sp = spec("schema", 1, pt);
    sp.validator = "json-schema".into();
    sp.schema = Some(schema.to_string());
    let t = s.driver.create_topic(sp).expect("topic");
    let p = t.producer().expect("producer");
    let rejected = |meta: serde_json::Value, rule: &str| {
        let err = match p.push(meta.clone(), ()).map(|f| f.wait()) {
            Err(e) | Ok(Err(e)) => e,
            Ok(Ok(id)) => panic!("metadata {meta} was accepted as {id:?}"),
        };
        assert_eq!(err.code(), ErrorCode::INVALID_METADATA, "{meta}: {err}");
        assert!(
            err.to_string().contains(&format!("rule '{rule}'")),
            "the error for {meta} does not name rule '{rule}': {err}"
        );
    };
    rejected(json!({ "step": -1 }), "minimum");
    rejected(json!({ "other": 1 }), "required");
    rejected(json!({ "step": "one" }), "type");
    for (i, step) in [0u64, 1, 7].into_iter().enumerate() {
        let f = p
            .push(json!({ "step": step, "extra": "x" }), ())
            .expect("valid metadata is accepted");
        assert_eq!(
            f.wait().expect("stored").offset,
            i as u64,
            "rejected events took no offsets"
        );
    }
    p.close().expect("close");
    let events = drain(&t.consumer("c").expect("consumer"));
    assert_eq!(events.len(), 3, "only the valid events were stored");
    assert_eq!(field(&events[2], "step"), 7);
}

fn json_validator_rejects_text_that_is_not_json(pt: PartitionType) {
    let s = Server::start();
    let mut sp = spec("json", 1, pt);
    sp.validator = "json".into();
    let t = s.driver.create_topic(sp).expect("topic");
    let p = t.producer().expect("producer");
    for bad in ["not json", "{\"a\":", "{\"a\": 1} trailing"] {
        let err = match p.push(bad, ()).map(|f| f.wait()) {
            Err(e) | Ok(Err(e)) => e,
            Ok(Ok(id)) => panic!("'{bad}' was accepted as {id:?}"),
        };
        assert_eq!(err.code(), ErrorCode::INVALID_METADATA, "'{bad}': {err}");
        assert!(
            err.to_string().contains("rule 'json'"),
            "the error for '{bad}' does not name the rule: {err}"
        );
    }
    let id = p
        .push("{\"ok\": true}", ())
        .expect("valid JSON is accepted")
        .wait()
        .expect("stored");
    assert_eq!(id.offset, 0, "rejected events took no offsets");
    p.close().expect("close");
    let events = drain(&t.consumer("c").expect("consumer"));
    assert_eq!(events.len(), 1);
    assert_eq!(&events[0].raw()[..], b"{\"ok\": true}");
}

// ------------------------------------------------------------------- acks

fn acks_persist_across_a_consumer_restart_per_name(pt: PartitionType) {
    const N: u64 = 20;
    const K: usize = 7;
    let s = Server::start();
    let t = s.driver.create_topic(spec("acks", 1, pt)).expect("topic");
    let p = t.producer().expect("producer");
    push_n(&p, N, no_data);
    {
        let c = t.consumer("c").expect("consumer");
        let first = take(&c, K);
        assert_eq!(offsets(&first), (0..K as u64).collect::<Vec<_>>());
        first[K - 1].ack().wait().expect("ack is persisted");
    }
    let c = t.consumer("c").expect("consumer under the same name");
    assert_eq!(
        next_event(&c).offset,
        K as u64,
        "the same name resumes after its last ack"
    );
    assert_eq!(
        s.driver.consumer_offsets("acks", 0).expect("offsets"),
        vec![("c".to_string(), K as u64)],
        "the committed offset is the one after the acked event"
    );
    let other = t.consumer("other").expect("consumer under another name");
    assert_eq!(
        next_event(&other).offset,
        0,
        "another name starts at the beginning"
    );
}
