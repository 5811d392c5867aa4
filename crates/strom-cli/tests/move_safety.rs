//! A partition that moves back and forth under a pipelined, idempotent
//! `acks=all` producer keeps every acknowledged event (docs/elasticity.md,
//! "What a move guarantees"). A move hands the leadership to a new copy
//! as soon as the registry records it in sync; the new leader must then
//! hold everything the old one acknowledged, or the old one, following it,
//! cuts acknowledged events from its log.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::replicated::{start, Group};
use common::{ok, read_all};
use strom_client::{Driver, ProducerOptions, PushFuture};

const CLI: Duration = Duration::from_secs(120);
/// Moves of the partition in one run.
const MOVES: usize = 10;
/// Pushes in flight at most: the producer never waits for one ack before
/// sending more, so the new copy is always a fetch behind the leader.
const IN_FLIGHT: usize = 512;

/// Three members and topic `plain` of one partition without replication:
/// the temp dir, the group, the partition's owner and another member.
fn plain_on_three() -> (tempfile::TempDir, Group, u32, u32) {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    g.d.create_topic(strom_client::TopicSpec::new("plain", 1))
        .unwrap();
    let owner = g.d.describe("plain").unwrap().partitions[0].member;
    let other = (0..=2).find(|m| *m != owner).unwrap();
    (tmp, g, owner, other)
}

/// What the producer saw: (seq, offset) of each ack, and failed pushes.
type Acks = (Vec<(u64, u64)>, usize);

/// Pushes to `plain/0` until `stop`, keeping up to [`IN_FLIGHT`] pushes
/// unanswered, at about 5,000 events/s (a copy that pauses after each
/// fetch still catches up with one fetch, so the moves end).
fn push_pipelined(d: Driver, stop: Arc<AtomicBool>) -> Acks {
    let t = d.open_topic("plain").unwrap();
    let p = t
        .producer_with(ProducerOptions {
            idempotent: Some(true),
            ..Default::default()
        })
        .unwrap();
    let mut window: VecDeque<(u64, Option<PushFuture>)> = VecDeque::new();
    let (mut acked, mut failed) = (Vec::new(), 0);
    let mut settle = |(s, f): (u64, Option<PushFuture>)| match f.map(|f| f.wait()) {
        Some(Ok(id)) => acked.push((s, id.offset)),
        _ => failed += 1,
    };
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let meta = format!("{{\"i\":{seq}}}");
        let f = p.push_with(meta, vec![seq as u8; 200], Some(0), &[]).ok();
        window.push_back((seq, f));
        seq += 1;
        if window.len() >= IN_FLIGHT {
            settle(window.pop_front().unwrap());
        }
        if seq.is_multiple_of(50) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    p.flush().unwrap();
    window.into_iter().for_each(&mut settle);
    p.close().unwrap();
    (acked, failed)
}

/// Followers pause this long after each fetch (the servers' test hook
/// `STROM_TEST_REPLICA_FETCH_DELAY_MS`): longer than the registry's tick,
/// so a copy a round behind is what a move hands the leadership to unless
/// the ISR rules keep it from joining early.
const FETCH_DELAY_MS: &str = "300";

#[test]
fn a_partition_moved_back_and_forth_under_a_pipelined_producer_keeps_every_acknowledged_event() {
    // The servers this test starts inherit it.
    std::env::set_var("STROM_TEST_REPLICA_FETCH_DELAY_MS", FETCH_DELAY_MS);
    let (_tmp, g, first, other) = plain_on_three();
    let stop = Arc::new(AtomicBool::new(false));
    let pusher = {
        let (d, stop) = (Driver::connect(&g.zero.group_file).unwrap(), stop.clone());
        std::thread::spawn(move || push_pipelined(d, stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..MOVES {
        let to = if i % 2 == 0 { other } else { first };
        let args = ["partition", "move", "plain/0", "--to", &to.to_string()];
        ok(g.zero.cli(&args, "", CLI), "partition move");
        assert_eq!(g.d.describe("plain").unwrap().partitions[0].member, to);
    }
    stop.store(true, Ordering::Release);
    let (acked, failed) = pusher.join().unwrap();
    assert_eq!(failed, 0, "no push failed");
    let stored = read_all(&g.d, "plain", "check", Duration::from_secs(60)).events;
    let mut at: BTreeMap<u64, u64> = BTreeMap::new();
    for ((_, o), ev) in &stored {
        let s = common::replicated::seq_of(&ev.meta);
        assert!(at.insert(s, *o).is_none(), "event {s} is stored twice");
        assert_eq!(ev.data, vec![s as u8; 200], "data of event {s}");
    }
    let lost: Vec<u64> = acked
        .iter()
        .filter(|(s, o)| at.get(s) != Some(o))
        .map(|(s, _)| *s)
        .collect();
    eprintln!(
        "{} acknowledged over {MOVES} moves, {} stored",
        acked.len(),
        stored.len()
    );
    assert!(
        lost.is_empty(),
        "{} acknowledged events are not where their acks said (first: {:?})",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(
        acked.len() > 1000,
        "the producer kept pushing during the moves"
    );
}

/// A consumer that reads on across a move keeps committing its acks: they
/// go to the partition's new owner, and its committed offset there covers
/// what it read after the move (else a restart would read it all again).
#[test]
fn a_consumers_acks_follow_its_partition_when_it_moves() {
    let (_tmp, g, _, to) = plain_on_three();
    let t = g.d.open_topic("plain").unwrap();
    // Idempotent, so that its pushes ride through the move (docs/elasticity.md).
    let p = t
        .producer_with(ProducerOptions {
            idempotent: Some(true),
            ..Default::default()
        })
        .unwrap();
    let c = t.consumer("reader").unwrap();
    let push = |i: u64| {
        p.push(format!("{{\"i\":{i}}}"), ())
            .unwrap()
            .wait()
            .unwrap();
    };
    let read_and_ack = || match c.pull_timeout(Duration::from_secs(60)) {
        Ok(strom_client::Next::Event(e)) => {
            e.ack().wait().expect("the ack is committed");
            e.offset
        }
        other => panic!("the consumer stopped: {:?}", other.map(|_| "end of stream")),
    };
    (0..10).for_each(push);
    assert_eq!(
        (0..10).map(|_| read_and_ack()).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let args = ["partition", "move", "plain/0", "--to", &to.to_string()];
    ok(g.zero.cli(&args, "", CLI), "partition move");
    (10..20).for_each(push);
    assert_eq!(
        (0..10).map(|_| read_and_ack()).collect::<Vec<_>>(),
        (10..20).collect::<Vec<_>>()
    );
    let committed = g.d.consumer_offsets("plain", 0).unwrap();
    assert!(
        committed.contains(&("reader".to_string(), 20)),
        "the new owner has the consumer's commits: {committed:?}"
    );
}
