//! One conformance suite run against every partition log backend (memory and
//! file): each case is a function taking a backend factory, and the
//! `conformance!` macro instantiates it once per backend.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{check_batch, payload, read_all, TestBatch};
use strom_storage::{
    now_us, AppendBatch, FileLog, LogConfig, MemoryLog, OffsetStore, PartitionLog, StorageError,
};
use tempfile::TempDir;

/// A log under test plus whatever must outlive it.
struct Backend {
    log: Arc<dyn PartitionLog>,
    _dir: Option<TempDir>,
}

type Factory = dyn Fn(LogConfig) -> Backend;

fn memory_backend(config: LogConfig) -> Backend {
    Backend {
        log: Arc::new(MemoryLog::new(config)),
        _dir: None,
    }
}

fn file_backend(config: LogConfig) -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::create(&dir.path().join("p0"), config).unwrap();
    Backend {
        log: Arc::new(log),
        _dir: Some(dir),
    }
}

/// Small segments so that the file backend rolls often.
fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 8 * 1024,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $( #[test] fn $case() { super::$case(&super::memory_backend); } )*
        }
        mod file {
            $( #[test] fn $case() { super::$case(&super::file_backend); } )*
        }
    };
}

conformance!(
    appends_get_dense_offsets_and_read_back_in_order,
    read_from_the_middle_of_a_batch_returns_the_containing_batch,
    read_respects_max_bytes_but_returns_at_least_one_batch,
    read_data_returns_ranges_byte_for_byte,
    read_data_rejects_bad_ranges_and_unknown_batches,
    read_outside_the_log_is_out_of_range_or_empty,
    timestamps_never_decrease_and_offset_for_timestamp_finds_them,
    retention_by_size_drops_the_oldest_data,
    retention_by_age_drops_old_data_only,
    concurrent_appends_and_syncs_keep_offsets_dense_and_batches_intact,
    oversized_and_empty_batches_are_rejected_and_the_log_carries_on,
    a_healthy_log_reports_no_failure_and_its_scrub_finds_nothing,
);

fn appends_get_dense_offsets_and_read_back_in_order(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    assert_eq!((log.first_offset(), log.next_offset()), (0, 0));
    let mut expected = 0;
    for i in 0..60 {
        let batch = TestBatch::standard(i);
        let a = batch.append(log);
        assert_eq!(a.base_offset, expected);
        assert_eq!(a.count, batch.count);
        expected += u64::from(batch.count);
    }
    assert_eq!(log.next_offset(), expected);
    let all = read_all(log, 0);
    assert_eq!(all.len(), 60);
    for (i, stored) in all.iter().enumerate() {
        assert_eq!(stored.meta, Bytes::from(TestBatch::standard(i as u64).meta));
    }
    let stats = log.stats();
    assert_eq!((stats.first_offset, stats.next_offset), (0, expected));
    assert!(stats.bytes > 0 && stats.segments >= 1);
}

fn read_from_the_middle_of_a_batch_returns_the_containing_batch(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    for i in 0..3 {
        TestBatch::new(i, 10, 50, 2).append(log);
    }
    for from in [10, 13, 19] {
        let got = log.read(from, 1).unwrap();
        assert_eq!(got[0].base_offset, 10, "read from {from}");
        assert_eq!(got[0].count, 10);
    }
    let got = log.read(25, usize::MAX).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].base_offset, 20);
}

fn read_respects_max_bytes_but_returns_at_least_one_batch(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    for i in 0..20 {
        TestBatch::new(i, 1, 10, 1).append(log);
    }
    let meta_len = log.read(0, 1).unwrap()[0].meta.len();
    assert_eq!(log.read(0, 0).unwrap().len(), 1);
    assert_eq!(log.read(0, 1).unwrap().len(), 1);
    assert_eq!(log.read(0, meta_len * 3).unwrap().len(), 3);
    assert_eq!(log.read(0, meta_len * 3 + 1).unwrap().len(), 4);
    assert_eq!(log.read(5, usize::MAX).unwrap().len(), 15);
}

fn read_data_returns_ranges_byte_for_byte(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    let big = TestBatch::new(7, 3, 5000, 7); // data given as 7 segments
    let empty = TestBatch::new(8, 1, 0, 1);
    let a = big.append(log);
    let e = empty.append(log);
    let expected = payload(7, 5000);
    // Ranges inside one segment, spanning segments, zero-length, whole,
    // overlapping, out of order.
    let ranges = [
        (0u64, 10u64),
        (700, 200),
        (714, 0),
        (4999, 1),
        (0, 5000),
        (2500, 2000),
        (0, 0),
        (5000, 0),
    ];
    let mut out = Vec::new();
    log.read_data(a.base_offset, &ranges, &mut out).unwrap();
    assert_eq!(out.len(), ranges.len());
    for (got, &(pos, len)) in out.iter().zip(&ranges) {
        assert_eq!(
            &got[..],
            &expected[pos as usize..(pos + len) as usize],
            "range ({pos}, {len})"
        );
    }
    // Partial ranges only (no whole-data read).
    let ranges = [(10u64, 5u64), (15, 5), (3000, 1), (100, 0)];
    let mut out = vec![Bytes::from_static(b"kept")];
    log.read_data(a.base_offset, &ranges, &mut out).unwrap();
    assert_eq!(&out[0][..], b"kept");
    for (got, &(pos, len)) in out[1..].iter().zip(&ranges) {
        assert_eq!(&got[..], &expected[pos as usize..(pos + len) as usize]);
    }
    let mut out = Vec::new();
    log.read_data(e.base_offset, &[(0, 0), (0, 0)], &mut out)
        .unwrap();
    assert_eq!(out, vec![Bytes::new(), Bytes::new()]);
    check_batch(log, &log.read(a.base_offset, 1).unwrap()[0]);
}

fn read_data_rejects_bad_ranges_and_unknown_batches(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    let a = TestBatch::new(1, 4, 100, 2).append(log);
    TestBatch::new(2, 1, 0, 1).append(log);
    let mut out = Vec::new();
    for bad in [
        (0u64, 101u64),
        (100, 1),
        (101, 0),
        (u64::MAX, 2),
        (1, u64::MAX),
    ] {
        let err = log
            .read_data(a.base_offset, &[(0, 1), bad], &mut out)
            .unwrap_err();
        assert!(
            matches!(err, StorageError::BadDataRange { data_len: 100, .. }),
            "{bad:?}: {err}"
        );
        assert_eq!(err.code(), 303);
    }
    assert!(out.is_empty(), "nothing is returned for a rejected request");
    let err = log.read_data(4, &[(0, 1)], &mut out).unwrap_err();
    assert!(matches!(
        err,
        StorageError::BadDataRange { data_len: 0, .. }
    ));
    // Offset inside a batch but not its base, and past the end.
    for base in [1, 2, 5, 1000] {
        let err = log.read_data(base, &[(0, 0)], &mut out).unwrap_err();
        assert!(
            matches!(err, StorageError::OffsetOutOfRange { requested, .. } if requested == base)
        );
        assert_eq!(err.code(), 302);
    }
}

fn read_outside_the_log_is_out_of_range_or_empty(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    assert!(log.read(0, 100).unwrap().is_empty());
    TestBatch::new(1, 2, 10, 1).append(log);
    assert!(log.read(2, 100).unwrap().is_empty());
    assert!(log.read(u64::MAX, 100).unwrap().is_empty());
}

fn timestamps_never_decrease_and_offset_for_timestamp_finds_them(make: &Factory) {
    let b = make(small_segments());
    let log = &*b.log;
    let before = now_us();
    let mut appended = Vec::new();
    for i in 0..40 {
        appended.push(TestBatch::standard(i).append(log));
        if i % 10 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    for w in appended.windows(2) {
        assert!(w[1].timestamp_us >= w[0].timestamp_us);
    }
    assert!(appended[0].timestamp_us >= before);
    let stored = read_all(log, 0);
    for (s, a) in stored.iter().zip(&appended) {
        assert_eq!(s.timestamp_us, a.timestamp_us);
    }
    assert_eq!(log.offset_for_timestamp(0), 0);
    assert_eq!(log.offset_for_timestamp(u64::MAX), log.next_offset());
    for a in &appended {
        // The first batch carrying this timestamp.
        let first = appended
            .iter()
            .find(|x| x.timestamp_us >= a.timestamp_us)
            .unwrap();
        assert_eq!(log.offset_for_timestamp(a.timestamp_us), first.base_offset);
        let next = appended.iter().find(|x| x.timestamp_us > a.timestamp_us);
        assert_eq!(
            log.offset_for_timestamp(a.timestamp_us + 1),
            next.map_or(log.next_offset(), |x| x.base_offset)
        );
    }
}

fn retention_by_size_drops_the_oldest_data(make: &Factory) {
    let limit = 16 * 1024;
    let b = make(LogConfig {
        retention_bytes: Some(limit),
        ..small_segments()
    });
    let log = &*b.log;
    for i in 0..200 {
        TestBatch::new(i, 2, 300, 2).append(log);
    }
    let before = log.stats();
    assert!(before.bytes > limit);
    let dropped = log.enforce_retention(now_us()).unwrap();
    assert!(dropped > 0);
    let after = log.stats();
    assert!(
        after.bytes <= limit,
        "{} bytes left over a limit of {limit}",
        after.bytes
    );
    assert!(after.first_offset > 0 && after.first_offset < after.next_offset);
    assert_eq!(after.next_offset, before.next_offset);
    assert_eq!(log.first_offset(), after.first_offset);
    let err = log.read(0, 1).unwrap_err();
    assert!(
        matches!(err, StorageError::OffsetOutOfRange { first, .. } if first == after.first_offset)
    );
    let kept = read_all(log, after.first_offset);
    assert_eq!(kept[0].base_offset, after.first_offset);
    assert_eq!(
        log.enforce_retention(now_us()).unwrap(),
        0,
        "nothing more to drop"
    );
    TestBatch::new(999, 1, 10, 1).append(log);
    assert_eq!(log.next_offset(), before.next_offset + 1);
}

fn retention_by_age_drops_old_data_only(make: &Factory) {
    let b = make(LogConfig {
        retention_ms: Some(60_000),
        ..small_segments()
    });
    let log = &*b.log;
    for i in 0..100 {
        TestBatch::new(i, 1, 300, 1).append(log);
    }
    let next = log.next_offset();
    assert_eq!(
        log.enforce_retention(now_us()).unwrap(),
        0,
        "fresh data is kept"
    );
    assert_eq!(log.first_offset(), 0);
    let later = now_us() + 120_000_000;
    assert!(log.enforce_retention(later).unwrap() > 0);
    let first = log.first_offset();
    assert!(first > 0 && first < next, "the newest data is always kept");
    assert_eq!(log.next_offset(), next);
    read_all(log, first);
}

fn concurrent_appends_and_syncs_keep_offsets_dense_and_batches_intact(make: &Factory) {
    let b = make(small_segments());
    let log = b.log.clone();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for i in 0..50u64 {
                    let batch = TestBatch::new(
                        t * 1000 + i,
                        (i % 3 + 1) as u32,
                        (i * 37 % 500) as usize,
                        3,
                    );
                    let a = batch.append(&*log);
                    log.sync(a.token).unwrap();
                    got.push(a);
                }
                got
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let log = log.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    for s in log.read(0, usize::MAX).unwrap() {
                        check_batch(&*log, &s);
                    }
                }
            })
        })
        .collect();
    let mut all: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    log.sync_all().unwrap();
    all.sort_by_key(|a| a.base_offset);
    let mut next = 0;
    for a in &all {
        assert_eq!(a.base_offset, next);
        next += u64::from(a.count);
    }
    assert_eq!(log.next_offset(), next);
    assert_eq!(read_all(&*log, 0).len(), 200);
}

fn oversized_and_empty_batches_are_rejected_and_the_log_carries_on(make: &Factory) {
    let b = make(LogConfig {
        max_batch_bytes: 1000,
        ..small_segments()
    });
    let log = &*b.log;
    TestBatch::new(1, 1, 10, 1).append(log);
    let data = [Bytes::from(vec![0u8; 990])];
    let err = log
        .append(AppendBatch {
            count: 1,
            meta: b"0123456789a",
            data: &data,
        })
        .unwrap_err();
    assert!(matches!(
        err,
        StorageError::BatchTooLarge {
            size: 1001,
            limit: 1000
        }
    ));
    assert_eq!(err.code(), 305);
    let err = log
        .append(AppendBatch {
            count: 0,
            meta: b"m",
            data: &[],
        })
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidArgument(_)));
    let a = TestBatch::new(2, 1, 10, 1).append(log);
    assert_eq!(a.base_offset, 1);
    read_all(log, 0);
}

#[test]
fn offset_store_commits_and_gets_for_both_kinds() {
    let dir = tempfile::tempdir().unwrap();
    for store in [
        OffsetStore::in_memory(),
        OffsetStore::open(&dir.path().join("offsets")).unwrap(),
    ] {
        assert_eq!(store.get("a"), None);
        store.commit("a", 5).unwrap();
        store.commit("b", 7).unwrap();
        store.commit("a", 9).unwrap();
        store.commit("", 1).unwrap();
        assert_eq!(store.get("a"), Some(9));
        assert_eq!(store.get("b"), Some(7));
        assert_eq!(store.get(""), Some(1));
        assert_eq!(
            store.all(),
            vec![
                ("".to_string(), 1),
                ("a".to_string(), 9),
                ("b".to_string(), 7)
            ]
        );
        let long = "x".repeat(70_000);
        assert!(store.commit(&long, 1).is_err());
    }
}

fn a_healthy_log_reports_no_failure_and_its_scrub_finds_nothing(make: &Factory) {
    let b = make(small_segments());
    let log = b.log.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..200 {
            TestBatch::standard(i).append(&*log);
        }
        log.sync_all().unwrap();
    });
    // Scrubs run while appends go on.
    for _ in 0..5 {
        let report = b.log.verify().unwrap();
        assert!(report.damaged.is_empty(), "{report:?}");
        assert!(report.quarantined.is_empty(), "{report:?}");
    }
    writer.join().unwrap();
    assert_eq!(b.log.failure(), None);
    let report = b.log.verify().unwrap();
    assert!(report.damaged.is_empty());
    assert_eq!(read_all(&*b.log, 0).len(), 200);
}
