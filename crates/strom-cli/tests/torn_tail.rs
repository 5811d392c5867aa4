//! Torn tails: a file partition whose active segment ends in the middle of
//! its last batch (in the `.log` record, the `.data` section, or both) is
//! recovered on restart to exactly its complete batches, which are served
//! intact, and appending continues with dense offsets.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{event_payload, read_all, ServerProcess, Stored};
use strom_client::{Batching, Driver, ProducerOptions, TopicSpec};

const BATCHES: u64 = 6;
const PER_BATCH: u64 = 20;
const TIMEOUT: Duration = Duration::from_secs(60);

/// One `.log` record header, as `docs/on-disk-format.md` lays it out.
#[derive(Debug, Clone, Copy)]
struct Record {
    pos: u64,
    len: u64,
    base: u64,
    count: u64,
    data_pos: u64,
    data_len: u64,
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as u64
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn records(log: &Path) -> Vec<Record> {
    let b = std::fs::read(log).expect("reading the .log file");
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < b.len() {
        assert!(pos + 64 <= b.len(), "partial record header at {pos}");
        assert_eq!(&b[pos..pos + 4], b"STRL", "record magic at {pos}");
        let len = u32_at(&b, pos + 12);
        assert_eq!(len, 64 + u32_at(&b, pos + 28), "record length at {pos}");
        out.push(Record {
            pos: pos as u64,
            len,
            base: u64_at(&b, pos + 16),
            count: u32_at(&b, pos + 24),
            data_pos: u64_at(&b, pos + 40),
            data_len: u64_at(&b, pos + 48),
        });
        pos += len as usize;
    }
    assert_eq!(pos, b.len(), "the log ends on a record boundary");
    out
}

/// The active segment (`.log`, `.data`) of partition 0 of `topic`.
fn active_segment(data_dir: &Path, topic: &str) -> (PathBuf, PathBuf) {
    let topics = data_dir.join("topics");
    let dirs: Vec<PathBuf> = std::fs::read_dir(&topics)
        .expect("listing the topics directory")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{topic}.")))
        })
        .collect();
    assert_eq!(dirs.len(), 1, "one directory for topic {topic}: {dirs:?}");
    let part = dirs[0].join("0");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&part)
        .expect("listing the partition directory")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let log = logs.pop().expect("a .log segment");
    let data = log.with_extension("data");
    assert!(data.exists(), "{} exists", data.display());
    (log, data)
}

fn truncate(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("opening a segment file");
    let before = f.metadata().expect("metadata").len();
    assert!(len < before, "cutting {} shortens it", path.display());
    f.set_len(len).expect("truncating");
}

/// A producer whose batches end exactly at each `flush()`.
fn batch_producer(driver: &Driver, topic: &str) -> strom_client::Producer {
    driver
        .open_topic(topic)
        .expect("open")
        .producer_with(ProducerOptions {
            batch: Batching::count(PER_BATCH as u32),
            linger: Duration::from_secs(3600),
            ..Default::default()
        })
        .expect("producer")
}

fn produce_batches(driver: &Driver, topic: &str, from: u64, batches: u64) -> Vec<Stored> {
    let producer = batch_producer(driver, topic);
    let mut out = Vec::new();
    for b in 0..batches {
        let futures: Vec<_> = (0..PER_BATCH)
            .map(|k| {
                let (meta, data) = event_payload("torn", from + b * PER_BATCH + k);
                out.push(Stored {
                    meta: meta.clone(),
                    data: data.clone(),
                });
                producer.push(meta, data).expect("push")
            })
            .collect();
        producer.flush().expect("flush");
        for (k, f) in futures.into_iter().enumerate() {
            let id = f.wait().expect("acked");
            assert_eq!(id.partition, 0);
            assert_eq!(id.offset, from + b * PER_BATCH + k as u64, "dense offsets");
        }
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Cut the `.log` this many bytes into the last record.
    Log(fn(&Record) -> u64),
    /// Cut the `.data` in the middle of the last batch's data.
    Data,
    /// Both.
    LogAndData(fn(&Record) -> u64),
}

fn torn_tail_case(cut: Cut, kill: bool) {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    driver
        .create_topic(TopicSpec::new("torn", 1))
        .expect("creating the topic");
    let produced = produce_batches(&driver, "torn", 0, BATCHES);
    drop(driver);
    let data_dir = server.data_dir.clone();
    if kill {
        server.kill9();
    } else {
        let (status, stderr) = server.terminate(Duration::from_secs(15));
        assert!(status.success(), "clean exit; stderr:\n{stderr}");
    }

    let (log, data) = active_segment(&data_dir, "torn");
    let recs = records(&log);
    assert_eq!(recs.len() as u64, BATCHES, "each flush ended one batch");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.base, i as u64 * PER_BATCH, "batch {i} base offset");
        assert_eq!(r.count, PER_BATCH, "batch {i} count");
    }
    let last = *recs.last().expect("records");
    assert!(last.data_len >= 2, "the last batch has data to cut");
    let data_cut = last.data_pos + last.data_len / 2;
    match cut {
        Cut::Log(at) => truncate(&log, last.pos + at(&last)),
        Cut::Data => truncate(&data, data_cut),
        Cut::LogAndData(at) => {
            truncate(&log, last.pos + at(&last));
            truncate(&data, data_cut);
        }
    }

    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let complete = ((BATCHES - 1) * PER_BATCH) as usize;
    let got = read_all(&driver, "torn", "after-tear", TIMEOUT);
    assert_eq!(got.start[&0], 0);
    assert_eq!(
        got.end[&0], complete as u64,
        "exactly the complete batches are kept"
    );
    for (o, want) in produced.iter().take(complete).enumerate() {
        assert_eq!(
            got.events.get(&(0, o as u64)),
            Some(want),
            "event 0/{o} is intact after recovery"
        );
    }

    // Appending continues right after the last complete batch.
    let more = produce_batches(&driver, "torn", complete as u64, 2);
    let all = read_all(&driver, "torn", "after-append", TIMEOUT);
    assert_eq!(all.len(), complete + more.len());
    for (k, want) in more.iter().enumerate() {
        let o = (complete + k) as u64;
        assert_eq!(all.events.get(&(0, o)), Some(want), "appended event 0/{o}");
    }
    drop(driver);
    let (status, stderr) = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "clean exit; stderr:\n{stderr}");

    // On disk: the torn bytes are gone and the new batches follow on.
    let recs = records(&log);
    assert_eq!(recs.len() as u64, BATCHES - 1 + 2);
    let mut data_end = 0;
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.base, i as u64 * PER_BATCH, "record {i} base");
        assert_eq!(r.data_pos, data_end, "record {i} data follows on");
        data_end += r.data_len;
    }
    assert_eq!(
        std::fs::metadata(&data).expect("data file").len(),
        data_end,
        "the .data file holds exactly the batches' data"
    );
}

#[test]
fn torn_segment_tail_serves_every_complete_batch() {
    torn_tail_case(Cut::Log(|r| r.len / 2), true);
}

#[test]
fn torn_record_header_and_data_tail_serve_every_complete_batch() {
    torn_tail_case(Cut::LogAndData(|_| 30), true);
}

#[test]
fn torn_data_tail_serves_every_complete_batch() {
    torn_tail_case(Cut::Data, true);
}

/// After a clean stop every batch was synced and checkpointed: bytes missing
/// at the end then are damage to acknowledged data, not a torn tail. The
/// lost batch is a reported gap and its offsets are never reused.
#[test]
fn data_lost_after_a_clean_stop_is_a_gap_and_its_offsets_are_not_reused() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    driver.create_topic(TopicSpec::new("torn", 1)).unwrap();
    let produced = produce_batches(&driver, "torn", 0, BATCHES);
    drop(driver);
    let data_dir = server.data_dir.clone();
    let (status, stderr) = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "clean exit; stderr:\n{stderr}");
    let (_, data) = active_segment(&data_dir, "torn");
    let last = *records(&active_segment(&data_dir, "torn").0)
        .last()
        .unwrap();
    truncate(&data, last.data_pos + last.data_len / 2);

    let server = ServerProcess::start(base.path());
    let driver = server.connect();
    let t = driver.open_topic("torn").unwrap();
    let c = t
        .consumer_with(
            "after-loss",
            strom_client::ConsumerOptions {
                start: strom_client::StartPos::Beginning,
                selector: std::sync::Arc::new(strom_client::Selection::All),
                ..Default::default()
            },
        )
        .unwrap();
    let kept = (BATCHES - 1) * PER_BATCH;
    for o in 0..kept {
        match c.pull_timeout(TIMEOUT).unwrap() {
            strom_client::Next::Event(ev) => {
                assert_eq!(ev.offset, o);
                assert_eq!(
                    ev.data(),
                    &produced[o as usize].data[..],
                    "event {o} intact"
                );
            }
            strom_client::Next::EndOfStream => panic!("unexpected end of stream"),
        }
    }
    let Err(gap) = c.pull_timeout(TIMEOUT) else {
        panic!("the lost batch must be a reported gap")
    };
    assert_eq!(gap.code(), strom_client::ErrorCode::DATA_CORRUPT, "{gap}");
    assert_eq!(gap.gap_offsets(), Some((kept, kept + PER_BATCH - 1)));
    let more = produce_batches(&driver, "torn", BATCHES * PER_BATCH, 1);
    assert_eq!(
        more.len() as u64,
        PER_BATCH,
        "appends continue after the lost offsets"
    );
}

#[test]
fn torn_log_and_data_mid_record_serve_every_complete_batch() {
    torn_tail_case(Cut::LogAndData(|r| r.len - 1), true);
}
