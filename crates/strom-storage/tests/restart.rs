//! Restart cost, measured by what recovery reads (the simulated disk counts
//! bytes read per file extension), never by timing: a clean close leaves a
//! checkpoint of the active segment so that reopening reads no segment
//! body; after a crash only the tail past the last checkpoint is scanned.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{read_all, TestBatch};
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{FileLog, LogConfig, PartitionLog};

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4 << 20,
        ..LogConfig::default()
    }
}

fn log_on(fs: &SimFs, create: bool) -> FileLog {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let dir = Path::new("/p0");
    if create {
        FileLog::create_with(vfs, dir, config()).unwrap()
    } else {
        FileLog::open_with(vfs, dir, config()).unwrap()
    }
}

fn fill(log: &FileLog, from: u64, batches: u64, sync_each: bool) {
    for i in from..from + batches {
        TestBatch::new(i, 2, 4000, 2).append(log);
        if sync_each {
            log.sync_all().unwrap();
        }
    }
}

#[test]
fn a_clean_reopen_reads_no_segment_body() {
    let fs = SimFs::new();
    let log = log_on(&fs, true);
    fill(&log, 0, 300, false);
    assert_eq!(log.stats().segments, 1);
    let before = read_all(&log, 0);
    drop(log); // clean close
    fs.reset_read_counters();
    let log = log_on(&fs, false);
    assert_eq!(fs.bytes_read("data"), 0, "the data was rescanned");
    assert_eq!(fs.bytes_read("log"), 0, "the log was rescanned");
    assert_eq!(log.next_offset(), 600);
    assert_eq!(read_all(&log, 0).len(), before.len());
    TestBatch::new(999, 1, 10, 1).append(&log);
    assert_eq!(log.next_offset(), 601);
}

#[test]
fn after_a_crash_only_the_tail_past_the_last_checkpoint_is_scanned() {
    let fs = SimFs::new();
    let log = log_on(&fs, true);
    fill(&log, 0, 600, true);
    fill(&log, 600, 20, false);
    let data_size = log.stats().bytes;
    // Power loss: the log is not closed.
    let img = fs.crash_image(&mut SimRng::new(3));
    drop(log);
    let log = log_on(&img, false);
    let scanned = img.bytes_read("data");
    assert!(
        scanned < data_size / 3,
        "recovery read {scanned} of {data_size} data bytes"
    );
    assert!(log.next_offset() >= 1200, "synced batches kept");
    assert_eq!(read_all(&log, 0).len() as u64, log.next_offset() / 2);
}
