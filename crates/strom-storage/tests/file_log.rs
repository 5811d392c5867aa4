//! File-backend behaviour that the memory backend has no equivalent for:
//! persistence across reopen, recovery from torn tails and flipped bytes,
//! segment rolling, index rebuilding and hostile lengths on disk (the
//! persistent offset store: `offsets.rs`).

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;

use common::disk::{
    copy_dir, files, flip_byte, record_positions, same_batches, set_len, size, small_segments,
};
use common::{read_all, TestBatch};
use strom_storage::{FileLog, LogConfig, PartitionLog, StorageError};

#[test]
fn reopen_after_drop_keeps_offsets_timestamps_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
        for i in 0..50 {
            TestBatch::standard(i).append(&log);
        }
        log.sync_all().unwrap();
        read_all(&log, 0)
    };
    let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
    let after = read_all(&log, 0);
    same_batches(&before, &after);
    let last = before.last().unwrap();
    assert_eq!(log.next_offset(), last.base_offset + u64::from(last.count));
    let a = TestBatch::standard(50).append(&log);
    assert_eq!(a.base_offset, log.next_offset() - u64::from(a.count));
    assert!(a.timestamp_us >= last.timestamp_us);
    assert_eq!(
        log.offset_for_timestamp(last.timestamp_us),
        before
            .iter()
            .find(|b| b.timestamp_us >= last.timestamp_us)
            .unwrap()
            .base_offset
    );
}

#[test]
fn torn_tail_at_every_cut_point_keeps_complete_batches_and_appends_continue() {
    let src = tempfile::tempdir().unwrap();
    let (good, log_cut_range, data_cut_range) = {
        let log = FileLog::open(src.path(), LogConfig::default()).unwrap();
        for i in 0..10 {
            TestBatch::standard(i).append(&log);
        }
        log.sync_all().unwrap();
        let l0 = size(&files(src.path(), "log")[0]);
        let d0 = size(&files(src.path(), "data")[0]);
        TestBatch::new(100, 3, 3000, 4).append(&log);
        log.sync_all().unwrap();
        let l1 = size(&files(src.path(), "log")[0]);
        let d1 = size(&files(src.path(), "data")[0]);
        (read_all(&log, 0), l0..l1, d0..d1)
    };
    // As after a crash: no checkpoint of the active segment (a checkpoint
    // would say the cut bytes had been durable, which a torn write is not).
    for p in files(src.path(), "index")
        .into_iter()
        .chain(files(src.path(), "timeindex"))
    {
        fs::remove_file(p).unwrap();
    }
    let last = good.last().unwrap().clone();
    let complete = &good[..good.len() - 1];
    let mut cuts: Vec<(&str, u64)> = log_cut_range.map(|c| ("log", c)).collect();
    let (d0, d1) = (data_cut_range.start, data_cut_range.end);
    cuts.extend([d0, d0 + 1, (d0 + d1) / 2, d1 - 1].map(|c| ("data", c)));
    for (ext, cut) in cuts {
        let work = tempfile::tempdir().unwrap();
        copy_dir(src.path(), work.path());
        set_len(&files(work.path(), ext)[0], cut);
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        assert_eq!(log.next_offset(), last.base_offset, "cut {ext} at {cut}");
        same_batches(complete, &read_all(&log, 0));
        let a = TestBatch::new(200, 2, 500, 2).append(&log);
        assert_eq!(a.base_offset, last.base_offset, "cut {ext} at {cut}");
        assert_eq!(read_all(&log, 0).len(), complete.len() + 1);
        drop(log);
        let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
        assert_eq!(
            read_all(&log, 0).len(),
            complete.len() + 1,
            "after a second reopen"
        );
    }
    // Garbage after the last record is dropped too.
    let work = tempfile::tempdir().unwrap();
    copy_dir(src.path(), work.path());
    let log_path = &files(work.path(), "log")[0];
    let f = OpenOptions::new().write(true).open(log_path).unwrap();
    f.write_all_at(&[0u8; 100], size(log_path)).unwrap();
    let log = FileLog::open(work.path(), LogConfig::default()).unwrap();
    same_batches(&good, &read_all(&log, 0));
}

#[test]
fn flipped_byte_in_a_sealed_segment_is_reported_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let good = {
        let log = FileLog::open(dir.path(), small_segments()).unwrap();
        for i in 0..40 {
            TestBatch::new(i, 1, 300, 2).append(&log);
        }
        read_all(&log, 0)
    };
    let seg0_log = files(dir.path(), "log")[0].clone();
    let seg0_data = files(dir.path(), "data")[0].clone();
    flip_byte(&seg0_log, record_positions(&good)[2] + 64 + 1); // meta of batch 2
    flip_byte(&seg0_data, 4 * 300 + 10); // data of batch 4
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    assert!(log.stats().segments > 2);
    let ok = log.read(0, 1).unwrap();
    assert_eq!(ok[0].meta, good[0].meta);
    let err = log.read(2, 1).unwrap_err();
    assert!(
        matches!(err, StorageError::DataCorrupt { first: 2, last: 2 }),
        "{err}"
    );
    assert_eq!(err.code(), 309);
    assert!(matches!(
        log.read_data(2, &[(0, 1)], &mut Vec::new()),
        Err(StorageError::DataCorrupt { first: 2, last: 2 })
    ));
    // Data reads, even partial ones, verify the data CRC.
    let err = log.read_data(4, &[(0, 1)], &mut Vec::new()).unwrap_err();
    assert!(
        matches!(err, StorageError::DataCorrupt { first: 4, last: 4 }),
        "{err}"
    );
    assert_eq!(log.read(3, 1).unwrap()[0].meta, good[3].meta);
    // The rest of the log is still served.
    let seg1 = log.read(good.len() as u64 - 1, 1).unwrap();
    assert_eq!(seg1[0].meta, good.last().unwrap().meta);
}

#[test]
fn rolling_creates_several_segments_readable_across_them_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let log = FileLog::open(dir.path(), small_segments()).unwrap();
        for i in 0..150 {
            TestBatch::standard(i).append(&log);
        }
        let stats = log.stats();
        assert!(stats.segments >= 5, "{} segments", stats.segments);
        assert_eq!(files(dir.path(), "log").len() as u32, stats.segments);
        // Rolled segments are sealed off the append path (here, by hand).
        assert_eq!(files(dir.path(), "index").len(), 0);
        assert_eq!(log.seal_rolled().unwrap(), stats.segments - 1);
        assert_eq!(files(dir.path(), "index").len() as u32, stats.segments - 1);
        assert_eq!(
            files(dir.path(), "timeindex").len() as u32,
            stats.segments - 1
        );
        for log_file in files(dir.path(), "log") {
            let data_file = log_file.with_extension("data");
            assert!(size(&log_file) + size(&data_file) <= 4096 + 3000 + 200);
        }
        read_all(&log, 0)
    };
    let names: Vec<String> = files(dir.path(), "log")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names[0], "00000000000000000000.log");
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    same_batches(&before, &read_all(&log, 0));
    for b in before.iter().step_by(7) {
        assert_eq!(
            log.read(b.base_offset + u64::from(b.count) - 1, 1).unwrap()[0].base_offset,
            b.base_offset
        );
        assert_eq!(
            log.offset_for_timestamp(b.timestamp_us),
            before
                .iter()
                .find(|x| x.timestamp_us >= b.timestamp_us)
                .unwrap()
                .base_offset
        );
    }
    let next = log.next_offset();
    assert_eq!(TestBatch::standard(150).append(&log).base_offset, next);
}

#[test]
fn deleted_or_corrupt_index_files_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let log = FileLog::open(dir.path(), small_segments()).unwrap();
        for i in 0..120 {
            TestBatch::standard(i).append(&log);
        }
        read_all(&log, 0)
    };
    let index = files(dir.path(), "index");
    let timeindex = files(dir.path(), "timeindex");
    assert!(index.len() >= 4);
    let originals: Vec<Vec<u8>> = index
        .iter()
        .chain(&timeindex)
        .map(|p| fs::read(p).unwrap())
        .collect();
    fs::remove_file(&index[0]).unwrap();
    flip_byte(&timeindex[1], 40);
    set_len(&index[2], size(&index[2]) / 2);
    set_len(&index[3], 4 << 30); // hostile size: must not be read into memory
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    same_batches(&before, &read_all(&log, 0));
    for b in before.iter().step_by(5) {
        assert_eq!(
            log.offset_for_timestamp(b.timestamp_us),
            before
                .iter()
                .find(|x| x.timestamp_us >= b.timestamp_us)
                .unwrap()
                .base_offset
        );
    }
    let rebuilt: Vec<Vec<u8>> = index
        .iter()
        .chain(&timeindex)
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert!(
        rebuilt == originals,
        "rebuilt index files differ from the ones written at seal time"
    );
}

#[test]
fn hostile_record_length_does_not_allocate_or_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = {
        let log = FileLog::open(dir.path(), small_segments()).unwrap();
        for i in 0..40 {
            TestBatch::new(i, 1, 300, 1).append(&log);
        }
        read_all(&log, 0)
    };
    // A header claiming a 4 GiB record at the end of the active log.
    let mut h = [0u8; 64];
    h[0..4].copy_from_slice(b"STRL");
    h[8..10].copy_from_slice(&1u16.to_le_bytes());
    h[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    h[24..28].copy_from_slice(&1u32.to_le_bytes());
    h[28..32].copy_from_slice(&(u32::MAX - 64).to_le_bytes());
    h[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
    let logs = files(dir.path(), "log");
    let active = logs.last().unwrap();
    let f = OpenOptions::new().write(true).open(active).unwrap();
    f.write_all_at(&h, size(active)).unwrap();
    // The same lengths written over the first record of a sealed segment.
    let f0 = OpenOptions::new().write(true).open(&logs[0]).unwrap();
    f0.write_all_at(&h[12..16], 12).unwrap();
    f0.write_all_at(&h[28..32], 28).unwrap();
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    let last = good.last().unwrap();
    assert_eq!(
        log.next_offset(),
        last.base_offset + 1,
        "hostile tail truncated"
    );
    assert!(matches!(
        log.read(0, 1),
        Err(StorageError::DataCorrupt { first: 0, .. })
    ));
    assert_eq!(log.read(last.base_offset, 1).unwrap()[0].meta, last.meta);
    drop(log);
    // Without index files the sealed segment is rescanned: still no panic.
    for p in files(dir.path(), "index") {
        fs::remove_file(p).unwrap();
    }
    let log = FileLog::open(dir.path(), small_segments()).unwrap();
    assert!(matches!(
        log.read(0, usize::MAX),
        Err(StorageError::DataCorrupt { first: 0, last: 0 })
    ));
    let served = log.read(1, usize::MAX).unwrap();
    assert_eq!(served.len(), good.len() - 1, "the rest is served");
}

#[test]
fn empty_leftover_segment_from_an_interrupted_roll_is_handled() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
        for i in 0..10 {
            TestBatch::standard(i).append(&log);
        }
        read_all(&log, 0)
    };
    let next = before
        .last()
        .map(|b| b.base_offset + u64::from(b.count))
        .unwrap();
    // The crash happened after creating the new .log but before its .data.
    fs::write(dir.path().join(format!("{next:020}.log")), b"").unwrap();
    let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.next_offset(), next);
    assert_eq!(log.stats().segments, 2);
    same_batches(&before, &read_all(&log, 0));
    assert_eq!(TestBatch::standard(10).append(&log).base_offset, next);
    drop(log);
    let log = FileLog::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(read_all(&log, 0).len(), 11);
}

#[test]
fn invalid_config_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileLog::open(
        dir.path(),
        LogConfig {
            segment_bytes: 0,
            ..LogConfig::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(err.code(), 307);
    assert!(err.to_string().contains("segment_bytes"));
}

#[test]
fn open_refuses_a_missing_partition_directory_and_create_makes_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("topic").join("p0");
    let err = FileLog::open(&dir, LogConfig::default())
        .err()
        .expect("opening a missing partition must fail");
    assert_eq!(err.code(), 300, "{err}");
    assert!(err.to_string().contains("create"), "{err}");
    assert!(!dir.exists(), "open must not create anything");
    let log = FileLog::create(&dir, LogConfig::default()).unwrap();
    TestBatch::standard(0).append(&log);
    log.sync_all().unwrap();
    drop(log);
    let log = FileLog::open(&dir, LogConfig::default()).unwrap();
    assert_eq!(read_all(&log, 0).len(), 1);
    drop(log);
    // A directory whose segments are gone (but that held a partition) is
    // not silently restarted at offset 0.
    for p in files(&dir, "log").into_iter().chain(files(&dir, "data")) {
        fs::remove_file(p).unwrap();
    }
    fs::write(dir.join("consumer-offsets"), b"").unwrap();
    let err = FileLog::open(&dir, LogConfig::default())
        .err()
        .expect("a partition without segments must not open");
    assert!(err.to_string().contains("no segment"), "{err}");
}
