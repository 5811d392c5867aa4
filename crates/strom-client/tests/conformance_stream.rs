//! The client conformance suite, part 2: seeks, end of stream, callbacks
//! and partitions. Every test body runs once per partition type
//! (`memory::*` and `file::*`), each against its own embedded server.

#[macro_use]
mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use common::{
    drain, field, next_event, no_data, offsets, push_n, random_bytes, spec, take, Server,
};
use serde_json::json;
use strom_client::{
    Batching, ConsumerOptions, Error, ErrorCode, Next, PartitionType, Producer, ProducerOptions,
    StartPos,
};

conformance!(
    seek_to_beginning_replays_every_event,
    seek_to_end_receives_only_newer_events,
    seek_to_offset_starts_at_that_offset,
    seek_to_timestamp_starts_at_the_first_event_not_older,
    seek_to_committed_returns_after_the_last_ack,
    end_of_stream_comes_only_after_every_producer_closed,
    complete_ends_the_stream_with_a_producer_open_and_rejects_pushes,
    process_calls_start_then_each_event_in_order_then_end,
    process_on_an_empty_completed_topic_calls_start_then_end,
    empty_and_multi_segment_data_arrive_concatenated,
    round_robin_spreads_events_over_every_partition,
    hash_selector_sends_equal_keys_to_one_partition,
    consumer_restricted_to_a_partition_sees_only_that_partition,
    iterating_a_consumer_ends_at_end_of_stream,
    pipelined_data_fetches_deliver_every_byte_in_order_within_a_small_budget,
    seeks_while_data_fetches_are_in_flight_give_back_their_budget,
);

// ------------------------------------------------------------------ seeks

/// A one-partition topic with `n` events `{"i": i}` and its producer, still
/// open (`producer.topic()` is the topic).
fn seek_topic(pt: PartitionType, n: u64) -> (Server, Producer) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("seek", 1, pt)).expect("topic");
    let p = t.producer().expect("producer");
    push_n(&p, n, no_data);
    (s, p)
}

fn seek_to_beginning_replays_every_event(pt: PartitionType) {
    let (_s, p) = seek_topic(pt, 10);
    let t = p.topic().clone();
    p.close().expect("close");
    let c = t.consumer("c").expect("consumer");
    assert_eq!(offsets(&take(&c, 6)), (0..6).collect::<Vec<_>>());
    c.seek(StartPos::Beginning).expect("seek");
    assert_eq!(
        offsets(&drain(&c)),
        (0..10).collect::<Vec<_>>(),
        "replay after seek to beginning"
    );
}

fn seek_to_end_receives_only_newer_events(pt: PartitionType) {
    let (_s, p) = seek_topic(pt, 10);
    let t = p.topic().clone();
    let c = t.consumer("c").expect("consumer");
    assert_eq!(next_event(&c).offset, 0);
    c.seek(StartPos::End).expect("seek");
    let f = p.push(json!({ "i": 10 }), ()).expect("push");
    p.flush().expect("flush");
    assert_eq!(f.wait().expect("stored").offset, 10);
    let e = next_event(&c);
    assert_eq!(
        (e.offset, field(&e, "i")),
        (10, 10),
        "first event after seek to end"
    );
    p.close().expect("close");
    assert!(
        matches!(c.pull_timeout(common::PULL_LIMIT), Ok(Next::EndOfStream)),
        "nothing older follows"
    );
}

fn seek_to_offset_starts_at_that_offset(pt: PartitionType) {
    let (_s, p) = seek_topic(pt, 10);
    let t = p.topic().clone();
    p.close().expect("close");
    let c = t.consumer("c").expect("consumer");
    c.seek(StartPos::Offset(4)).expect("seek");
    assert_eq!(offsets(&drain(&c)), (4..10).collect::<Vec<_>>());
    c.seek(StartPos::Offset(8)).expect("seek back");
    assert_eq!(offsets(&drain(&c)), vec![8, 9]);
    let opts = ConsumerOptions {
        start: StartPos::Offset(3),
        ..Default::default()
    };
    let c = t
        .consumer_with("d", opts)
        .expect("consumer starting at an offset");
    assert_eq!(offsets(&drain(&c)), (3..10).collect::<Vec<_>>());
}

fn seek_to_timestamp_starts_at_the_first_event_not_older(pt: PartitionType) {
    let (_s, p) = seek_topic(pt, 5);
    let t = p.topic().clone();
    std::thread::sleep(Duration::from_millis(20));
    let ids = push_n(&p, 5, no_data);
    let group2: BTreeSet<u64> = ids.iter().map(|id| id.offset).collect();
    assert_eq!(group2, (5..10).collect(), "offsets of group 2");
    p.close().expect("close");
    let c = t.consumer("c").expect("consumer");
    let all = drain(&c);
    assert_eq!(offsets(&all), (0..10).collect::<Vec<_>>());
    let ts = all[5].timestamp_us;
    assert!(
        all[..5].iter().all(|e| e.timestamp_us < ts),
        "group 1 is not older than group 2: {:?}",
        all.iter().map(|e| e.timestamp_us).collect::<Vec<_>>()
    );
    c.seek(StartPos::Timestamp(ts)).expect("seek");
    assert_eq!(
        offsets(&drain(&c)),
        (5..10).collect::<Vec<_>>(),
        "seek to group 2's timestamp"
    );
    c.seek(StartPos::Timestamp(all[0].timestamp_us))
        .expect("seek");
    assert_eq!(
        offsets(&drain(&c)),
        (0..10).collect::<Vec<_>>(),
        "seek to the first timestamp"
    );
    c.seek(StartPos::Timestamp(all[9].timestamp_us + 1))
        .expect("seek");
    assert!(
        drain(&c).is_empty(),
        "seek past the last timestamp yields no event"
    );
}

fn seek_to_committed_returns_after_the_last_ack(pt: PartitionType) {
    let (_s, p) = seek_topic(pt, 10);
    let t = p.topic().clone();
    p.close().expect("close");
    let c = t.consumer("c").expect("consumer");
    let first = take(&c, 4);
    first[3].ack().wait().expect("ack");
    assert_eq!(offsets(&take(&c, 3)), vec![4, 5, 6]);
    c.seek(StartPos::Committed).expect("seek");
    assert_eq!(
        offsets(&drain(&c)),
        (4..10).collect::<Vec<_>>(),
        "resumes after the ack"
    );
}

// ------------------------------------------------------------ end of stream

fn end_of_stream_comes_only_after_every_producer_closed(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("eos", 2, pt)).expect("topic");
    let producers: Vec<Producer> = (0..3).map(|_| t.producer().expect("producer")).collect();
    for p in &producers {
        push_n(p, 10, no_data);
    }
    producers[0].close().expect("close");
    producers[1].close().expect("close");
    let c = t.consumer("c").expect("consumer");
    assert_eq!(take(&c, 30).len(), 30);
    match c.pull_timeout(Duration::from_millis(300)) {
        Err(e) => assert_eq!(e.code(), ErrorCode::TIMEOUT, "{e}"),
        Ok(Next::EndOfStream) => panic!("end of stream with a producer still open"),
        Ok(Next::Event(e)) => panic!("unexpected event {}/{}", e.partition, e.offset),
    }
    push_n(&producers[2], 5, no_data);
    producers[2].close().expect("close");
    let rest = drain(&c);
    assert_eq!(
        rest.len(),
        5,
        "the last producer's events before end of stream"
    );
    for _ in 0..3 {
        assert!(
            matches!(c.pull_timeout(common::PULL_LIMIT), Ok(Next::EndOfStream)),
            "end of stream repeats"
        );
    }
    assert!(matches!(c.pull().wait(), Ok(Next::EndOfStream)));
}

fn complete_ends_the_stream_with_a_producer_open_and_rejects_pushes(pt: PartitionType) {
    let s = Server::start();
    let t = s
        .driver
        .create_topic(spec("complete", 1, pt))
        .expect("topic");
    let p = t.producer().expect("producer");
    push_n(&p, 5, no_data);
    t.complete().expect("complete");
    let c = t.consumer("c").expect("consumer");
    assert_eq!(offsets(&drain(&c)), (0..5).collect::<Vec<_>>());
    let err: Error = match p.push(json!({ "late": true }), ()) {
        Err(e) => e,
        Ok(f) => {
            let flushed = p.flush();
            match f.wait() {
                Err(e) => e,
                Ok(id) => panic!("a push after complete was stored as {id:?} (flush: {flushed:?})"),
            }
        }
    };
    assert_eq!(err.code(), ErrorCode::TOPIC_CLOSED, "{err}");
    assert!(t.describe().expect("describe").state.ended);
    assert!(
        matches!(c.pull_timeout(common::PULL_LIMIT), Ok(Next::EndOfStream)),
        "no late event appears"
    );
}

// -------------------------------------------------------------- callbacks

#[derive(Debug, PartialEq)]
enum Call {
    Start,
    Event(u64),
    End,
}

fn process_calls(c: &strom_client::Consumer) -> Vec<Call> {
    let calls = Mutex::new(Vec::new());
    c.process(
        || calls.lock().unwrap().push(Call::Start),
        |e| {
            calls.lock().unwrap().push(Call::Event(e.offset));
            Ok(())
        },
        || calls.lock().unwrap().push(Call::End),
    )
    .expect("process");
    calls.into_inner().unwrap()
}

fn process_calls_start_then_each_event_in_order_then_end(pt: PartitionType) {
    let s = Server::start();
    let t = s
        .driver
        .create_topic(spec("process", 1, pt))
        .expect("topic");
    let p = t.producer().expect("producer");
    push_n(&p, 25, no_data);
    p.close().expect("close");
    let calls = process_calls(&t.consumer("c").expect("consumer"));
    let want: Vec<Call> = std::iter::once(Call::Start)
        .chain((0..25).map(Call::Event))
        .chain(std::iter::once(Call::End))
        .collect();
    assert_eq!(calls, want);
}

fn process_on_an_empty_completed_topic_calls_start_then_end(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("empty", 2, pt)).expect("topic");
    t.complete().expect("complete");
    assert_eq!(
        process_calls(&t.consumer("c").expect("consumer")),
        vec![Call::Start, Call::End]
    );
}

// ------------------------------------------------------------------- data

fn empty_and_multi_segment_data_arrive_concatenated(pt: PartitionType) {
    let s = Server::start();
    let t = s
        .driver
        .create_topic(spec("segments", 1, pt))
        .expect("topic");
    let p = t.producer().expect("producer");
    let segs = [
        random_bytes(7, 3),
        random_bytes(8, 1000),
        random_bytes(9, 70_000),
    ];
    let futs = vec![
        p.push("{\"k\":0}", Vec::<Bytes>::new())
            .expect("push empty segment list"),
        p.push("{\"k\":1}", Vec::<u8>::new())
            .expect("push empty data"),
        p.push(
            "{\"k\":2}",
            segs.iter().cloned().map(Bytes::from).collect::<Vec<_>>(),
        )
        .expect("push three segments"),
        p.push(
            "{\"k\":3}",
            vec![Bytes::new(), Bytes::from(segs[0].clone()), Bytes::new()],
        )
        .expect("push with empty segments"),
        p.push("{\"k\":4}", ()).expect("push unit data"),
    ];
    p.close().expect("close");
    let stored: Vec<u64> = futs
        .into_iter()
        .map(|f| f.wait().expect("stored").offset)
        .collect();
    let events = drain(&t.consumer("c").expect("consumer"));
    let want = [
        Vec::new(),
        Vec::new(),
        segs.concat(),
        segs[0].clone(),
        Vec::new(),
    ];
    assert_eq!(events.len(), want.len());
    let mut keys = BTreeSet::new();
    for e in &events {
        let k = field(e, "k") as usize;
        assert!(keys.insert(k), "event {k} delivered twice");
        assert_eq!(
            stored[k], e.offset,
            "event {k} is at the offset its push returned"
        );
        let want = &want[k];
        assert_eq!(
            e.data_size(),
            want.len() as u64,
            "data_size at {}",
            e.offset
        );
        assert_eq!(
            e.fetched_len(),
            want.len() as u64,
            "fetched_len at {}",
            e.offset
        );
        assert_eq!(&e.data_vec(), want, "data at {}", e.offset);
    }
}

// ------------------------------------------------------------- partitions

fn round_robin_spreads_events_over_every_partition(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("rr", 4, pt)).expect("topic");
    let p = t.producer().expect("producer");
    let ids = push_n(&p, 40, no_data);
    p.close().expect("close");
    let mut per: HashMap<u32, Vec<u64>> = HashMap::new();
    for id in &ids {
        per.entry(id.partition).or_default().push(id.offset);
    }
    assert_eq!(
        per.keys().copied().collect::<BTreeSet<_>>(),
        (0..4).collect(),
        "partitions used"
    );
    for (part, offs) in &mut per {
        offs.sort();
        assert_eq!(
            *offs,
            (0..10).collect::<Vec<_>>(),
            "partition {part} did not get a fair, dense share"
        );
    }
    let events = drain(&t.consumer("c").expect("consumer"));
    let mut got: Vec<(u32, u64, u64)> = events
        .iter()
        .map(|e| (e.partition, e.offset, field(e, "i")))
        .collect();
    got.sort();
    let mut want: Vec<(u32, u64, u64)> = ids
        .iter()
        .zip(0..)
        .map(|(id, i)| (id.partition, id.offset, i))
        .collect();
    want.sort();
    assert_eq!(
        got, want,
        "the consumer sees every event where the producer put it"
    );
}

fn hash_selector_sends_equal_keys_to_one_partition(pt: PartitionType) {
    let s = Server::start();
    let mut sp = spec("hash", 4, pt);
    sp.selector = "hash:run".into();
    let t = s.driver.create_topic(sp).expect("topic");
    let p = t.producer().expect("producer");
    let futs: Vec<_> = (0..120u64)
        .map(|i| {
            (
                i % 12,
                p.push(json!({ "run": format!("run-{}", i % 12), "i": i }), ())
                    .expect("push"),
            )
        })
        .collect();
    let err = p
        .push(json!({ "norun": 1 }), ())
        .err()
        .expect("missing hash field is rejected");
    assert_eq!(err.code(), ErrorCode::SELECTION_FAILED, "{err}");
    p.close().expect("close");
    let mut where_: HashMap<u64, BTreeSet<u32>> = HashMap::new();
    for (key, f) in futs {
        where_
            .entry(key)
            .or_default()
            .insert(f.wait().expect("stored").partition);
    }
    for (key, parts) in &where_ {
        assert_eq!(parts.len(), 1, "key run-{key} went to partitions {parts:?}");
    }
    let used: BTreeSet<u32> = where_.values().flatten().copied().collect();
    assert!(used.len() > 1, "12 keys all hashed to {used:?}");
}

fn consumer_restricted_to_a_partition_sees_only_that_partition(pt: PartitionType) {
    let s = Server::start();
    let t = s
        .driver
        .create_topic(spec("restricted", 3, pt))
        .expect("topic");
    let p = t.producer().expect("producer");
    let ids = push_n(&p, 30, no_data);
    p.close().expect("close");
    let opts = ConsumerOptions {
        partitions: Some(vec![1]),
        ..Default::default()
    };
    let events = drain(&t.consumer_with("c", opts).expect("consumer"));
    assert!(
        events.iter().all(|e| e.partition == 1),
        "an event from another partition"
    );
    let mut got: Vec<(u64, u64)> = events.iter().map(|e| (e.offset, field(e, "i"))).collect();
    got.sort();
    let mut want: Vec<(u64, u64)> = ids
        .iter()
        .zip(0..)
        .filter(|(id, _)| id.partition == 1)
        .map(|(id, i)| (id.offset, i))
        .collect();
    want.sort();
    assert_eq!(want.len(), 10, "round-robin gave partition 1 a third");
    assert_eq!(got, want, "partition 1's events, each at its offset");
    let bad = ConsumerOptions {
        partitions: Some(vec![3]),
        ..Default::default()
    };
    let err = t
        .consumer_with("d", bad)
        .err()
        .expect("a missing partition is rejected");
    assert_eq!(err.code(), ErrorCode::INVALID_ARGUMENT, "{err}");
}

fn iterating_a_consumer_ends_at_end_of_stream(pt: PartitionType) {
    let s = Server::start();
    let t = s.driver.create_topic(spec("iter", 1, pt)).expect("topic");
    let p = t.producer().expect("producer");
    push_n(&p, 50, |i| vec![i as u8; 3]);
    p.close().expect("close");
    let c = t.consumer("c").expect("consumer");
    let mut seen = BTreeSet::new();
    for (n, ev) in (&c).enumerate() {
        let ev = ev.expect("event");
        let i = field(&ev, "i");
        assert_eq!(ev.offset, n as u64, "offsets in order");
        assert_eq!(ev.data(), &[i as u8; 3], "data of event {i}");
        seen.insert(i);
    }
    assert_eq!(
        seen,
        (0..50).collect(),
        "the iterator yields every event, then ends"
    );
    assert!((&c).next().is_none(), "the iterator stays ended");
}

// ------------------------------------------------ pipelined data fetches

/// A one-partition topic holding `n` batches of one event each, event `i`
/// carrying `data(i)`.
fn one_event_batches(
    pt: PartitionType,
    name: &str,
    n: u64,
    data: impl Fn(u64) -> Vec<u8>,
) -> (Server, strom_client::Topic) {
    let s = Server::start();
    let t = s.driver.create_topic(spec(name, 1, pt)).expect("topic");
    let p = t
        .producer_with(ProducerOptions {
            batch: Batching::count(1),
            ..Default::default()
        })
        .expect("producer");
    push_n(&p, n, data);
    p.close().expect("close");
    (s, t)
}

/// The consumer asks for the next batch's data while the current one's
/// arrives, but only when it fits the data budget besides what is held:
/// with a budget of a few events, every byte still arrives, in order.
fn pipelined_data_fetches_deliver_every_byte_in_order_within_a_small_budget(pt: PartitionType) {
    let data = |i: u64| random_bytes(i, 1000 + (i as usize * 7919) % 60_000);
    let (_s, t) = one_event_batches(pt, "pipe", 80, data);
    let c = t
        .consumer_with(
            "c",
            ConsumerOptions {
                start: StartPos::Beginning,
                prefetch_bytes: 100_000,
                ..Default::default()
            },
        )
        .expect("consumer");
    let got = drain(&c);
    assert_eq!(offsets(&got), (0..80).collect::<Vec<_>>(), "in order");
    for ev in &got {
        assert_eq!(
            ev.data_vec(),
            data(ev.offset),
            "data of event {}",
            ev.offset
        );
    }
}

/// A seek drops the fetches in flight (the current batch's and the one
/// asked for ahead); the bytes they reserved of the data budget come back,
/// or the budget would run dry and the consumer stall.
fn seeks_while_data_fetches_are_in_flight_give_back_their_budget(pt: PartitionType) {
    let data = |i: u64| random_bytes(i, 40_000);
    let (_s, t) = one_event_batches(pt, "seekpipe", 30, data);
    let c = t
        .consumer_with(
            "c",
            ConsumerOptions {
                start: StartPos::Beginning,
                prefetch_bytes: 90_000,
                ..Default::default()
            },
        )
        .expect("consumer");
    for round in 0..40u64 {
        let ev = next_event(&c);
        assert_eq!(ev.data_vec(), data(ev.offset), "round {round}");
        c.seek(StartPos::Offset(round % 7)).expect("seek");
    }
    c.seek(StartPos::Beginning).expect("seek");
    let got = drain(&c);
    assert_eq!(
        offsets(&got),
        (0..30).collect::<Vec<_>>(),
        "every event after the seeks"
    );
    for ev in &got {
        assert_eq!(
            ev.data_vec(),
            data(ev.offset),
            "data of event {}",
            ev.offset
        );
    }
}
