//! `truncate_from` on both backends: in the middle of a segment, at a
//! segment boundary, across several segments, inside a batch, at or past the
//! end (a no-op), at the first offset (empties the log) and below it (an
//! error); appends continue at the new end, and a reopen finds the same
//! log. Power loss at every step of a file truncation leaves the old log or
//! the truncated one, and never loses a byte below the cut.

mod common;

use bytes::Bytes;
use common::{create_sim, open_sim, read_all, TestBatch, SIM_DIR};
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{now_us, LogConfig, MemoryLog, PartitionLog};

/// (base, count, timestamp, meta) of every batch, data checked by read_all.
type Content = Vec<(u64, u32, u64, Bytes)>;

fn content(log: &dyn PartitionLog) -> Content {
    read_all(log, log.first_offset())
        .into_iter()
        .map(|b| (b.base_offset, b.count, b.timestamp_us, b.meta))
        .collect()
}

/// Appends standard batches 0..n; returns each batch's (base, end).
fn fill(log: &dyn PartitionLog, n: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| {
            let a = TestBatch::standard(i).append(log);
            (a.base_offset, a.base_offset + u64::from(a.count))
        })
        .collect()
}

/// What truncating `before` at `offset` must leave.
fn prefix(before: &Content, offset: u64) -> Content {
    before
        .iter()
        .filter(|b| b.0 + u64::from(b.1) <= offset)
        .cloned()
        .collect()
}

/// Segment base offsets present on the simulated disk.
fn segment_bases(fs: &SimFs) -> Vec<u64> {
    let mut v: Vec<u64> = fs
        .list(std::path::Path::new(SIM_DIR))
        .unwrap()
        .iter()
        .filter_map(|n| n.strip_suffix(".log").and_then(|s| s.parse().ok()))
        .collect();
    v.sort();
    v
}

/// Truncates at `offset`, expects the log to end at `want_next`, checks
/// content, appends, reopens (file backend), checks again.
fn truncate_and_check(offset: u64, want_next: u64, batches: u64) {
    let memory = MemoryLog::new(common::small_segments());
    fill(&memory, batches);
    let before = content(&memory);
    assert_eq!(memory.truncate_from(offset).unwrap(), want_next, "memory");
    assert_eq!(memory.next_offset(), want_next);
    assert_eq!(content(&memory), prefix(&before, offset), "memory content");
    let a = TestBatch::standard(1000).append(&memory);
    assert_eq!(
        a.base_offset, want_next,
        "memory appends continue at the cut"
    );

    let fs = SimFs::new();
    let log = create_sim(&fs);
    fill(&log, batches);
    // Sealed segments have index files, the active one a checkpoint.
    log.sync_all().unwrap();
    let untimed = |c: &Content| {
        c.iter()
            .map(|b| (b.0, b.1, b.3.clone()))
            .collect::<Vec<_>>()
    };
    let before_file = content(&log);
    assert_eq!(
        untimed(&before_file),
        untimed(&before),
        "same batches in both backends"
    );
    let before = before_file;
    assert_eq!(log.truncate_from(offset).unwrap(), want_next, "file");
    assert_eq!(log.next_offset(), want_next);
    let kept = prefix(&before, offset);
    assert_eq!(content(&log), kept, "file content");
    assert!(
        segment_bases(&fs).iter().all(|&b| b == 0 || b < offset),
        "segments at or past the cut are gone: {:?}",
        segment_bases(&fs)
    );
    assert!(!fs.exists(std::path::Path::new("/p0/truncation")).unwrap());
    drop(log);
    let log = open_sim(&fs);
    assert_eq!(content(&log), kept, "after reopen");
    assert_eq!(log.next_offset(), want_next);
    let a = TestBatch::standard(1000).append(&log);
    assert_eq!(a.base_offset, want_next, "file appends continue at the cut");
    fill_more(&log, 40);
    drop(log);
    let log = open_sim(&fs);
    assert_eq!(content(&log).len(), kept.len() + 41, "later appends kept");
    assert!(log.quarantined().is_empty());
}

fn fill_more(log: &dyn PartitionLog, n: u64) {
    for i in 0..n {
        TestBatch::standard(2000 + i).append(log);
    }
}

/// Batch ends and segment bases of the standard fill, to pick cut points.
fn layout(batches: u64) -> (Vec<(u64, u64)>, Vec<u64>) {
    let fs = SimFs::new();
    let log = create_sim(&fs);
    let ends = fill(&log, batches);
    drop(log);
    (ends, segment_bases(&fs))
}

#[test]
fn truncate_in_the_middle_of_a_segment() {
    let (batches, bases) = layout(40);
    // A batch start strictly inside the second segment.
    let (base, _) = *batches
        .iter()
        .find(|b| b.0 > bases[1] + 2 && b.0 < bases[2])
        .unwrap();
    truncate_and_check(base, base, 40);
}

#[test]
fn truncate_at_a_segment_boundary() {
    let (_, bases) = layout(40);
    assert!(bases.len() > 3);
    truncate_and_check(bases[2], bases[2], 40);
}

#[test]
fn truncate_across_several_segments() {
    let (batches, bases) = layout(60);
    assert!(bases.len() > 5, "{bases:?}");
    let (base, _) = *batches.iter().find(|b| b.0 > bases[1]).unwrap();
    truncate_and_check(base, base, 60);
}

#[test]
fn truncate_inside_a_batch_removes_the_whole_batch() {
    let (batches, _) = layout(40);
    let (base, end) = *batches.iter().skip(10).find(|b| b.1 - b.0 >= 3).unwrap();
    truncate_and_check(base + 1, base, 40);
    truncate_and_check(end - 1, base, 40);
}

#[test]
fn truncate_at_the_first_offset_empties_the_log() {
    truncate_and_check(0, 0, 30);
}

#[test]
fn truncate_at_or_past_the_end_is_a_no_op() {
    for log in [
        Box::new(MemoryLog::new(LogConfig::default())) as Box<dyn PartitionLog>,
        Box::new(create_sim(&SimFs::new())),
    ] {
        fill(&*log, 10);
        let before = content(&*log);
        let next = log.next_offset();
        assert_eq!(log.truncate_from(next).unwrap(), next);
        assert_eq!(log.truncate_from(next + 100).unwrap(), next);
        assert_eq!(content(&*log), before);
    }
}

#[test]
fn truncate_below_the_first_offset_is_out_of_range() {
    let config = LogConfig {
        retention_bytes: Some(8 * 1024),
        ..common::small_segments()
    };
    let memory = MemoryLog::new(config.clone());
    let fs = SimFs::new();
    let vfs: std::sync::Arc<dyn Vfs> = std::sync::Arc::new(fs.clone());
    let file =
        strom_storage::FileLog::create_with(vfs, std::path::Path::new(SIM_DIR), config).unwrap();
    for log in [&memory as &dyn PartitionLog, &file] {
        fill(log, 40);
        log.enforce_retention(now_us()).unwrap();
        let first = log.first_offset();
        assert!(first > 0);
        let e = log.truncate_from(first - 1).unwrap_err();
        assert_eq!(e.code(), 302, "{e}");
        assert_eq!(log.truncate_from(first).unwrap(), first, "down to empty");
        assert!(log.read(first, 1 << 20).unwrap().is_empty());
        let a = TestBatch::standard(7).append(log);
        assert_eq!(a.base_offset, first);
    }
}

#[test]
fn truncation_lowers_the_timestamp_floor_for_replica_appends() {
    for log in [
        Box::new(MemoryLog::new(LogConfig::default())) as Box<dyn PartitionLog>,
        Box::new(create_sim(&SimFs::new())),
    ] {
        let data = [Bytes::from_static(b"d")];
        let batch = |base_offset, timestamp_us| strom_storage::ReplicaBatch {
            base_offset,
            count: 1,
            timestamp_us,
            meta: b"m",
            data: &data,
        };
        log.append_replica(batch(0, 10)).unwrap();
        log.append_replica(batch(1, 50)).unwrap();
        assert_eq!(log.truncate_from(1).unwrap(), 1);
        // The new leader's batch is older than the one cut away.
        let a = log.append_replica(batch(1, 20)).unwrap();
        assert_eq!(a.timestamp_us, 20);
        assert_eq!(log.append_replica(batch(2, 19)).unwrap_err().code(), 308);
    }
}

/// Power loss at every mutating step of a truncation (several crash images
/// per step): the reopened log is the old one or the truncated one, whole.
fn power_loss_during(offset_of: impl Fn(&[(u64, u64)], &[u64]) -> u64) {
    let (batches, bases) = layout(60);
    let offset = offset_of(&batches, &bases);
    for step in 0.. {
        let fs = SimFs::new();
        let log = create_sim(&fs);
        fill(&log, 60);
        log.sync_all().unwrap();
        let old = content(&log);
        let new = prefix(&old, offset);
        fs.crash_after(step);
        let result = log.truncate_from(offset);
        let finished = !fs.crashed();
        drop(log);
        for seed in 0..3 {
            let img = fs.crash_image(&mut SimRng::new(seed * 1000 + step));
            let log = open_sim(&img);
            let got = content(&log);
            assert!(
                got == old || got == new,
                "step {step} seed {seed}: {} batches, neither the old {} nor the new {}",
                got.len(),
                old.len(),
                new.len()
            );
            assert!(log.quarantined().is_empty(), "step {step} seed {seed}");
            let a = TestBatch::standard(999).append(&log);
            assert_eq!(a.base_offset, log.next_offset() - u64::from(a.count));
            drop(log);
            let log = open_sim(&img);
            assert_eq!(
                content(&log).len(),
                got.len() + 1,
                "step {step}: append kept"
            );
        }
        if finished {
            assert!(result.is_ok(), "{result:?}");
            assert!(step > 5, "the truncation took a few steps");
            return;
        }
    }
}

#[test]
fn power_loss_during_a_truncation_across_segments() {
    power_loss_during(|batches, bases| batches.iter().find(|b| b.0 > bases[1]).unwrap().0);
}

#[test]
fn power_loss_during_a_truncation_inside_a_batch() {
    power_loss_during(|batches, bases| {
        let b = batches
            .iter()
            .find(|b| b.0 > bases[3] && b.1 - b.0 >= 2)
            .unwrap();
        b.0 + 1
    });
}

/// A full disk while the intent file is written changes nothing and leaves
/// the log working; an I/O error after it stops the log, and a reopen
/// (with or without power loss) finishes the truncation or finds the old log.
#[test]
fn disk_errors_during_a_truncation_stop_the_log_or_change_nothing() {
    use strom_storage::sim::{Fault, FaultOp};
    let (batches, bases) = layout(60);
    let offset = batches.iter().find(|b| b.0 > bases[2]).unwrap().0;

    let fs = SimFs::new();
    let log = create_sim(&fs);
    fill(&log, 60);
    log.sync_all().unwrap();
    let old = content(&log);
    fs.inject(Fault {
        op: FaultOp::Write,
        errno: libc::ENOSPC,
        path_contains: "truncation".into(),
        times: Some(1),
    });
    assert_eq!(log.truncate_from(offset).unwrap_err().code(), 304);
    assert!(log.failure().is_none(), "a full disk does not stop the log");
    assert_eq!(content(&log), old);
    assert_eq!(log.truncate_from(offset).unwrap(), offset, "a retry works");

    for (what, path) in [("the cut .log", ".log"), ("the cut .data", ".data")] {
        let fs = SimFs::new();
        let log = create_sim(&fs);
        fill(&log, 60);
        log.sync_all().unwrap();
        let old = content(&log);
        let new = prefix(&old, offset);
        // Only the cut fdatasyncs segment files.
        fs.inject(Fault {
            op: FaultOp::Sync,
            errno: libc::EIO,
            path_contains: path.into(),
            times: Some(1),
        });
        let result = log.truncate_from(offset);
        assert!(result.is_err(), "{what}: {result:?}");
        assert!(log.failure().is_some(), "{what}: the log stopped");
        let b = TestBatch::standard(5);
        let refused = log.append(strom_storage::AppendBatch {
            count: b.count,
            meta: &b.meta,
            data: &b.data,
        });
        assert_eq!(refused.unwrap_err().code(), 311, "{what}: appends refused");
        drop(log);
        for seed in 0..3 {
            let img = fs.crash_image(&mut SimRng::new(seed));
            let got = content(&open_sim(&img));
            assert!(got == old || got == new, "{what} seed {seed}");
        }
        let log = open_sim(&fs);
        assert_eq!(
            content(&log),
            new,
            "{what}: a reopen finishes the truncation"
        );
    }
}
