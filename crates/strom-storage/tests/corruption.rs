//! Damage on disk: a bad record or bad data in the middle of a segment never
//! truncates the valid batches after it nor lets new appends reuse its
//! offsets. The damaged offsets are quarantined (persistently) and readers
//! get an explicit `DataCorrupt { first, last }` gap they can step over.

mod common;

use common::disk::{copy_dir, files, flip_byte, record_positions, same_batches, small_segments};
use common::{check_batch, read_all, TestBatch};
use strom_storage::{FileLog, LogConfig, PartitionLog, StorageError, StoredBatch};

/// Reads everything from `from`, stepping over reported gaps; returns the
/// batches and the gaps.
fn read_with_gaps(log: &dyn PartitionLog, from: u64) -> (Vec<StoredBatch>, Vec<(u64, u64)>) {
    let mut batches: Vec<StoredBatch> = Vec::new();
    let mut gaps = Vec::new();
    let mut next = from;
    while next < log.next_offset() {
        match log.read(next, 4096) {
            Ok(got) => {
                assert!(!got.is_empty(), "empty read at {next}");
                for b in got {
                    check_batch(log, &b);
                    next = b.base_offset + u64::from(b.count);
                    batches.push(b);
                }
            }
            Err(StorageError::DataCorrupt { first, last }) => {
                assert!(
                    first <= next && next <= last,
                    "gap {first}..={last} at {next}"
                );
                gaps.push((first, last));
                next = last + 1;
            }
            Err(e) => panic!("read at {next}: {e}"),
        }
    }
    (batches, gaps)
}

/// 12 batches of 2 events with 400 data bytes each, in one active segment,
/// left as after a crash (no checkpoint of the active segment: recovery
/// scans all of it).
fn twelve_batches(dir: &std::path::Path) -> Vec<StoredBatch> {
    let good = twelve_batches_closed(dir);
    for p in files(dir, "index")
        .into_iter()
        .chain(files(dir, "timeindex"))
    {
        std::fs::remove_file(p).unwrap();
    }
    good
}

/// The same, closed cleanly (the active segment is checkpointed).
fn twelve_batches_closed(dir: &std::path::Path) -> Vec<StoredBatch> {
    let log = FileLog::open(dir, LogConfig::default()).unwrap();
    for i in 0..12 {
        TestBatch::new(i, 2, 400, 2).append(&log);
    }
    log.sync_all().unwrap();
    read_all(&log, 0)
}

#[test]
fn mid_segment_damage_is_quarantined_not_truncated_and_offsets_are_never_reused() {
    let src = tempfile::tempdir().unwrap();
    let good = twelve_batches(src.path());
    let positions = record_positions(&good);
    let end = good[11].base_offset + 2;
    let cases = [
        ("log", positions[7] + 64 + 3), // meta of batch 7
        ("log", positions[7] + 20),     // header of batch 7
        ("log", positions[7]),          // magic of batch 7
        ("data", 7 * 400 + 123),        // data of batch 7
    ];
    for (ext, pos) in cases {
        let work = tempfile::tempdir().unwrap();
        copy_dir(src.path(), work.path());
        flip_byte(&files(work.path(), ext)[0], pos);
        let what = format!("{ext} byte {pos}");
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        assert_eq!(log.next_offset(), end, "{what}: nothing truncated");
        let (kept, gaps) = read_with_gaps(&log, 0);
        assert_eq!(gaps, vec![(14, 15)], "{what}");
        let mut expected = good.clone();
        expected.remove(7);
        same_batches(&expected, &kept);
        let err = log.read(14, 1).unwrap_err();
        assert_eq!(err.code(), 309, "{what}: {err}");
        assert!(err.to_string().contains("14..=15"), "{err}");
        assert!(err.to_string().contains("from offset 16"), "{err}");
        let err = log.read(15, 1).unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::DataCorrupt {
                    first: 14,
                    last: 15
                }
            ),
            "{err}"
        );
        assert!(matches!(
            log.read_data(14, &[(0, 1)], &mut Vec::new()),
            Err(StorageError::DataCorrupt {
                first: 14,
                last: 15
            })
        ));
        assert_eq!(log.read(16, 1).unwrap()[0].meta, good[8].meta);
        assert_eq!(
            log.read(13, usize::MAX).unwrap().len(),
            1,
            "{what}: stops at the gap"
        );
        let a = TestBatch::new(99, 1, 5, 1).append(&log);
        assert_eq!(
            a.base_offset, end,
            "{what}: appends continue after the highest offset"
        );
        log.sync_all().unwrap();
        drop(log);
        // The quarantine survives a reopen (the damaged bytes may also have
        // been rewritten meanwhile: the quarantine file alone must suffice).
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        assert_eq!(log.next_offset(), end + 1, "{what}");
        let (kept, gaps) = read_with_gaps(&log, 0);
        assert_eq!(gaps, vec![(14, 15)], "{what} after reopen");
        assert_eq!(kept.len(), 12);
        assert!(work.path().join("quarantine").exists());
    }
}

#[test]
fn damage_in_the_last_record_is_a_torn_tail_and_is_truncated() {
    let src = tempfile::tempdir().unwrap();
    let good = twelve_batches(src.path());
    let positions = record_positions(&good);
    for (ext, pos) in [("log", positions[11] + 64), ("data", 11 * 400 + 399)] {
        let work = tempfile::tempdir().unwrap();
        copy_dir(src.path(), work.path());
        flip_byte(&files(work.path(), ext)[0], pos);
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        same_batches(&good[..11], &read_all(&log, 0));
        assert_eq!(log.next_offset(), good[11].base_offset, "{ext} byte {pos}");
        assert!(!work.path().join("quarantine").exists());
    }
}

#[test]
fn two_damaged_regions_are_two_gaps() {
    let src = tempfile::tempdir().unwrap();
    let good = twelve_batches(src.path());
    let positions = record_positions(&good);
    let log_file = files(src.path(), "log")[0].clone();
    flip_byte(&log_file, positions[2] + 70);
    flip_byte(&log_file, positions[3] + 70);
    flip_byte(&log_file, positions[9] + 30);
    let log = FileLog::open(src.path(), LogConfig::default()).unwrap();
    let (kept, gaps) = read_with_gaps(&log, 0);
    assert_eq!(gaps, vec![(4, 7), (18, 19)]);
    assert_eq!(kept.len(), 9);
    assert_eq!(log.next_offset(), 24);
}

/// 40 one-event batches of 300 data bytes over several small sealed segments.
fn sealed_segments(dir: &std::path::Path) -> Vec<StoredBatch> {
    let log = FileLog::open(dir, small_segments()).unwrap();
    for i in 0..40 {
        TestBatch::new(i, 1, 300, 2).append(&log);
    }
    log.sync_all().unwrap();
    assert!(log.stats().segments > 2);
    read_all(&log, 0)
}

#[test]
fn damage_in_a_sealed_segment_is_the_same_gap_with_or_without_its_index() {
    let src = tempfile::tempdir().unwrap();
    let good = sealed_segments(src.path());
    let positions = record_positions(&good);
    let seg0_batches = files(src.path(), "log")[1]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse::<usize>()
        .unwrap();
    for drop_index in [false, true] {
        let work = tempfile::tempdir().unwrap();
        copy_dir(src.path(), work.path());
        flip_byte(&files(work.path(), "log")[0], positions[2] + 64 + 1); // meta of batch 2
        flip_byte(
            &files(work.path(), "log")[0],
            positions[seg0_batches - 1] + 10,
        ); // last of seg 0
        if drop_index {
            for p in files(work.path(), "index") {
                std::fs::remove_file(p).unwrap();
            }
        }
        let log = FileLog::open(work.path(), small_segments()).unwrap();
        let (kept, gaps) = read_with_gaps(&log, 0);
        let last = seg0_batches as u64 - 1;
        assert_eq!(
            gaps,
            vec![(2, 2), (last, last)],
            "index dropped: {drop_index}"
        );
        assert_eq!(kept.len(), good.len() - 2);
        // A consumer that keeps asking at the gap gets the same answer and
        // can always move on.
        for _ in 0..3 {
            assert!(matches!(
                log.read(2, 1),
                Err(StorageError::DataCorrupt { first: 2, last: 2 })
            ));
            assert_eq!(log.read(3, 1).unwrap()[0].meta, good[3].meta);
        }
        drop(log);
        let log = FileLog::open(work.path(), small_segments()).unwrap();
        assert_eq!(read_with_gaps(&log, 0).1, vec![(2, 2), (last, last)]);
    }
}

#[test]
fn partial_data_reads_are_verified_and_damaged_data_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let good = sealed_segments(dir.path());
    flip_byte(&files(dir.path(), "data")[0], 4 * 300 + 250); // data of batch 4
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    // Metadata is intact; the data of batch 4 is not, even outside the
    // requested range.
    assert_eq!(log.read(4, 1).unwrap()[0].meta, good[4].meta);
    let err = log.read_data(4, &[(0, 10)], &mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, StorageError::DataCorrupt { first: 4, last: 4 }),
        "{err}"
    );
    // From then on the batch is quarantined, also for metadata reads and
    // after a reopen.
    assert!(matches!(
        log.read(4, 1),
        Err(StorageError::DataCorrupt { first: 4, last: 4 })
    ));
    assert_eq!(log.read(3, usize::MAX).unwrap().len(), 1);
    drop(log);
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    assert_eq!(read_with_gaps(&log, 0).1, vec![(4, 4)]);
}

#[test]
fn damage_below_a_checkpoint_is_quarantined_when_read_even_at_the_end() {
    let src = tempfile::tempdir().unwrap();
    let good = twelve_batches_closed(src.path());
    let positions = record_positions(&good);
    // The checkpoint says these bytes were durable: damage there is bit rot,
    // not a torn write, and is never truncated.
    let cases = [
        ("log", positions[7] + 64 + 3, 7),
        ("log", positions[11] + 64, 11),
        ("data", 11 * 400 + 399, 11),
    ];
    for (ext, pos, batch) in cases {
        let work = tempfile::tempdir().unwrap();
        copy_dir(src.path(), work.path());
        flip_byte(&files(work.path(), ext)[0], pos);
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        assert_eq!(log.next_offset(), 24, "{ext} byte {pos}");
        let base = good[batch].base_offset;
        let err = if ext == "data" {
            log.read_data(base, &[(0, 1)], &mut Vec::new()).unwrap_err()
        } else {
            log.read(base, 1).unwrap_err()
        };
        assert!(
            matches!(err, StorageError::DataCorrupt { first, last } if first == base && last == base + 1),
            "{ext} byte {pos}: {err}"
        );
        let (kept, gaps) = read_with_gaps(&log, 0);
        assert_eq!(gaps, vec![(base, base + 1)], "{ext} byte {pos}");
        assert_eq!(kept.len(), 11);
        assert_eq!(TestBatch::new(99, 1, 5, 1).append(&log).base_offset, 24);
    }
}

#[test]
fn verify_checks_every_crc_online_and_quarantines_what_it_finds() {
    let dir = tempfile::tempdir().unwrap();
    let good = sealed_segments(dir.path());
    {
        let log = FileLog::open(dir.path(), small_segments()).unwrap();
        let report = log.verify().unwrap();
        assert!(report.damaged.is_empty(), "{report:?}");
        assert_eq!(report.batches, good.len() as u64);
        assert!(report.bytes >= 40 * 300);
    }
    let datas = files(dir.path(), "data");
    let logs = files(dir.path(), "log");
    let positions = record_positions(&good);
    flip_byte(&datas[0], 4 * 300 + 250); // data of batch 4 (sealed)
    flip_byte(&logs[0], positions[6] + 64 + 2); // meta of batch 6 (sealed)
    let active_first = logs.last().unwrap().file_stem().unwrap().to_str().unwrap();
    let active_first: u64 = active_first.parse().unwrap();
    flip_byte(datas.last().unwrap(), 10); // data of the active segment's first batch
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    // Nothing was read yet: opening trusts indexes and checkpoints.
    let report = log.verify().unwrap();
    assert_eq!(
        report.damaged,
        vec![(4, 4), (6, 6), (active_first, active_first)],
        "{report:?}"
    );
    assert_eq!(report.quarantined, report.damaged);
    assert_eq!(report.batches, good.len() as u64 - 3);
    let (kept, gaps) = read_with_gaps(&log, 0);
    assert_eq!(gaps, report.damaged);
    assert_eq!(kept.len(), good.len() - 3);
    // A second pass finds nothing new, and appends go on.
    let again = log.verify().unwrap();
    assert!(again.damaged.is_empty(), "{again:?}");
    assert_eq!(again.quarantined.len(), 3);
    TestBatch::new(77, 1, 10, 1).append(&log);
}

#[test]
fn durable_batches_lost_below_a_checkpoint_keep_their_offsets_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let good = twelve_batches_closed(dir.path());
    // The disk lost the end of both files although a checkpoint said they
    // were durable.
    let positions = record_positions(&good);
    common::disk::set_len(&files(dir.path(), "log")[0], positions[9]);
    common::disk::set_len(&files(dir.path(), "data")[0], 9 * 400);
    let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(
        log.next_offset(),
        24,
        "offsets of lost batches are not reused"
    );
    let (kept, gaps) = read_with_gaps(&log, 0);
    assert_eq!(gaps, vec![(18, 23)]);
    assert_eq!(kept.len(), 9);
    assert_eq!(TestBatch::new(99, 1, 5, 1).append(&log).base_offset, 24);
}
