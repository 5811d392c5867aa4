//! Injected disk errors, through the simulated disk: a failed fdatasync or
//! write stops the log (PARTITION_FAILED, 311) until it is reopened from what
//! is on disk; a full disk is DISK_FULL (304) and the log carries on once
//! space returns.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{create_sim, open_sim, read_all, small_segments, TestBatch};
use strom_storage::sim::{Fault, FaultOp, SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{FileLog, PartitionLog, StorageError};

fn fault(op: FaultOp, errno: i32, path: &str, times: Option<u32>) -> Fault {
    Fault {
        op,
        errno,
        path_contains: path.into(),
        times,
    }
}

fn append(log: &FileLog, i: u64) -> Result<u64, StorageError> {
    let b = TestBatch::standard(i);
    log.append(strom_storage::AppendBatch {
        count: b.count,
        meta: &b.meta,
        data: &b.data,
    })
    .map(|a| a.base_offset)
}

#[test]
fn a_failed_fdatasync_stops_the_log_until_it_is_reopened() {
    for file in [".log", ".data"] {
        let fs = SimFs::new();
        let log = create_sim(&fs);
        for i in 0..5 {
            append(&log, i).unwrap();
        }
        log.sync_all().unwrap();
        let acked = log.next_offset();
        assert_eq!(log.failure(), None);
        fs.inject(fault(FaultOp::Sync, libc::EIO, file, Some(1)));
        append(&log, 5).unwrap();
        let err = log.sync_all().unwrap_err();
        assert_eq!(
            err.code(),
            300,
            "{file}: the sync itself reports the I/O error"
        );
        // The disk "works" again, but the lost pages are not coming back:
        // nothing after the failure may ever be reported durable.
        let err = log.sync_all().unwrap_err();
        assert_eq!(err.code(), 311, "{file}: {err}");
        let err = append(&log, 6).unwrap_err();
        assert_eq!(err.code(), 311, "{file}: {err}");
        assert!(err.to_string().contains("reopen"), "{err}");
        let cause = log.failure().expect("failure is exposed");
        assert!(cause.contains("syncing"), "{cause}");
        drop(log);
        // Power loss, then reopen: everything acknowledged is there.
        let img = fs.crash_image(&mut SimRng::new(7));
        let log = open_sim(&img);
        assert!(log.next_offset() >= acked);
        assert_eq!(log.failure(), None);
        assert!(read_all(&log, 0).len() >= 5);
        append(&log, 7).unwrap();
        log.sync_all().unwrap();
    }
}

#[test]
fn a_failed_write_stops_the_log() {
    let fs = SimFs::new();
    let log = create_sim(&fs);
    append(&log, 0).unwrap();
    fs.inject(fault(FaultOp::Write, libc::EIO, ".data", Some(1)));
    let err = append(&log, 1).unwrap_err();
    assert_eq!(err.code(), 300, "{err}");
    let err = append(&log, 2).unwrap_err();
    assert_eq!(err.code(), 311, "{err}");
    assert!(log.sync_all().is_err());
    assert!(log.failure().unwrap().contains("writing"));
    // Reads of what was appended keep working.
    assert_eq!(read_all(&log, 0).len(), 1);
}

#[test]
fn a_full_disk_is_disk_full_and_the_log_carries_on_when_space_returns() {
    for file in [".log", ".data", ".index"] {
        let fs = SimFs::new();
        let log = create_sim(&fs);
        let mut i = 0;
        while log.stats().segments < 2 {
            append(&log, i).unwrap();
            i += 1;
        }
        log.sync_all().unwrap();
        let next = log.next_offset();
        fs.inject(fault(FaultOp::Write, libc::ENOSPC, file, None));
        let mut full = 0;
        for j in 0..40 {
            match append(&log, 100 + j) {
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.code(), 304, "{file}: {e}");
                    full += 1;
                }
            }
        }
        if file == ".index" {
            // Appends never write index files (rolled segments are sealed
            // off the append path, and a seal that cannot write them only
            // leaves the index to be rebuilt on the next open).
            assert_eq!(full, 0, "{file}: an append wrote an index file");
        } else {
            assert!(full > 0, "{file}: the disk never filled up");
        }
        assert_eq!(log.failure(), None, "{file}");
        log.sync_all().unwrap();
        fs.clear_faults();
        let before = log.next_offset();
        assert!(before >= next);
        assert_eq!(
            append(&log, 999).unwrap(),
            before,
            "{file}: no offset consumed"
        );
        log.sync_all().unwrap();
        let all = read_all(&log, 0);
        drop(log);
        let log = open_sim(&fs.crash_image(&mut SimRng::new(1)));
        assert_eq!(read_all(&log, 0).len(), all.len(), "{file}");
    }
}

#[test]
fn new_directories_and_segments_survive_power_loss_once_synced() {
    for seed in 0..40 {
        let fs = SimFs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
        let dir = Path::new("/data/topic/p0");
        let log = FileLog::create_with(vfs, dir, small_segments()).unwrap();
        // The partition exists as soon as create returns.
        let img = fs.crash_image(&mut SimRng::new(seed));
        let vfs: Arc<dyn Vfs> = Arc::new(img);
        assert_eq!(
            FileLog::open_with(vfs, dir, small_segments())
                .unwrap()
                .next_offset(),
            0
        );
        let mut i = 0;
        while log.stats().segments < 4 {
            append(&log, i).unwrap();
            i += 1;
        }
        log.sync_all().unwrap();
        let acked = log.next_offset();
        let img = fs.crash_image(&mut SimRng::new(seed));
        let vfs: Arc<dyn Vfs> = Arc::new(img);
        let log = FileLog::open_with(vfs, dir, small_segments()).unwrap();
        assert_eq!(log.next_offset(), acked, "seed {seed}");
        assert_eq!(read_all(&log, 0).len() as u64, i, "seed {seed}");
    }
}
