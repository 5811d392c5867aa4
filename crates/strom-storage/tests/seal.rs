//! Sealing a segment the log rolled away from (fdatasync of its files, then
//! its index files) happens off the append path: an append that rolls never
//! waits for the disk. A `sync` seals first, so it still covers every batch
//! before its token; the server's periodic pass (`seal_rolled`) seals the
//! rest; a crash before a seal loses nothing that was synced and serves
//! nothing damaged.

mod common;

use std::path::Path;

use common::{check_batch, create_sim, open_sim, read_all, TestBatch, SIM_DIR};
use strom_storage::sim::{Fault, FaultOp, SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{AppendBatch, FileLog, PartitionLog, StorageError, StoredBatch};

/// Appends standard batches from `*i` on until the log has `segments`.
fn append_until(log: &FileLog, i: &mut u64, segments: u32) {
    while log.stats().segments < segments {
        TestBatch::standard(*i).append(log);
        *i += 1;
    }
}

/// Every batch left, each checked whole (meta and data); offsets may skip
/// quarantined ranges.
fn read_checked(log: &FileLog) -> Vec<StoredBatch> {
    let mut all = Vec::new();
    let mut next = log.first_offset();
    loop {
        let batches = match log.read(next, 4096) {
            Ok(b) => b,
            // Offsets lost to the crash are quarantined: skip them.
            Err(StorageError::DataCorrupt { last, .. }) => {
                next = last + 1;
                continue;
            }
            Err(e) => panic!("reading at {next}: {e}"),
        };
        let Some(last) = batches.last() else {
            return all;
        };
        next = last.base_offset + u64::from(last.count);
        for b in batches {
            check_batch(log, &b);
            all.push(b);
        }
    }
}

fn index_files_exist(fs: &SimFs, base: u64) -> bool {
    ["index", "timeindex"].iter().all(|ext| {
        fs.exists(&Path::new(SIM_DIR).join(format!("{base:020}.{ext}")))
            .unwrap()
    })
}

fn segment_bases(fs: &SimFs) -> Vec<u64> {
    let mut bases: Vec<u64> = fs
        .list(Path::new(SIM_DIR))
        .unwrap()
        .iter()
        .filter_map(|n| n.strip_suffix(".log"))
        .map(|stem| stem.parse().unwrap())
        .collect();
    bases.sort_unstable();
    bases
}

#[test]
fn an_append_that_rolls_does_not_wait_for_the_disk() {
    let fs = SimFs::new();
    let log = create_sim(&fs);
    // Every fdatasync of the first segment's data fails: an append that
    // sealed it on the way would fail too.
    fs.inject(Fault {
        op: FaultOp::Sync,
        errno: libc::EIO,
        path_contains: format!("{:020}.data", 0),
        times: None,
    });
    let mut i = 0;
    append_until(&log, &mut i, 3);
    assert_eq!(log.failure(), None, "no append touched the failing sync");
    // The seal comes with the next sync, which must cover every batch
    // before its token, so the failure surfaces there and stops the log.
    let err = log.sync_all().unwrap_err();
    assert_eq!(err.code(), 300, "{err}");
    let b = TestBatch::standard(i);
    let err = log
        .append(AppendBatch {
            count: b.count,
            meta: &b.meta,
            data: &b.data,
        })
        .expect_err("the log is stopped");
    assert_eq!(err.code(), 311, "{err}");
}

#[test]
fn the_periodic_pass_seals_rolled_segments_once() {
    let fs = SimFs::new();
    let log = create_sim(&fs);
    let mut i = 0;
    append_until(&log, &mut i, 3);
    let bases = segment_bases(&fs);
    assert_eq!(bases.len(), 3);
    assert!(
        !index_files_exist(&fs, bases[0]) && !index_files_exist(&fs, bases[1]),
        "rolling wrote no index files"
    );
    assert_eq!(log.seal_rolled().unwrap(), 2);
    assert!(index_files_exist(&fs, bases[0]) && index_files_exist(&fs, bases[1]));
    assert_eq!(log.seal_rolled().unwrap(), 0, "nothing left to seal");
    // Sealed means durable: power loss right now keeps both segments whole.
    let expected = read_all(&log, 0);
    let active_first = bases[2];
    let image = fs.crash_image(&mut SimRng::new(7));
    let reopened = open_sim(&image);
    let sealed: Vec<_> = expected
        .iter()
        .filter(|b| b.base_offset < active_first)
        .collect();
    let got = read_checked(&reopened);
    assert!(got.len() >= sealed.len());
    for (a, b) in sealed.iter().zip(&got) {
        assert_eq!(a.base_offset, b.base_offset);
        assert_eq!(a.meta, b.meta);
    }
}

#[test]
fn closing_seals_rolled_segments() {
    let fs = SimFs::new();
    let log = create_sim(&fs);
    let mut i = 0;
    append_until(&log, &mut i, 2);
    let bases = segment_bases(&fs);
    log.close().unwrap();
    assert!(index_files_exist(&fs, bases[0]));
}

#[test]
fn power_loss_before_a_seal_loses_nothing_synced_and_serves_nothing_damaged() {
    for seed in 0..200 {
        let fs = SimFs::new();
        let log = create_sim(&fs);
        let mut i = 0;
        append_until(&log, &mut i, 2);
        log.sync_all().unwrap();
        let synced = log.next_offset();
        let expected = read_all(&log, 0);
        // Roll twice more without any sync or seal, then lose power.
        append_until(&log, &mut i, 4);
        let image = fs.crash_image(&mut SimRng::new(seed));
        drop(log);
        let reopened = open_sim(&image);
        assert!(reopened.next_offset() >= synced, "seed {seed}");
        // Every batch read back is whole (read_all checks the CRCs of meta
        // and data) and the synced ones are the ones written.
        let got = read_checked(&reopened);
        for want in expected.iter().filter(|b| b.base_offset < synced) {
            let have = got
                .iter()
                .find(|b| b.base_offset == want.base_offset)
                .unwrap_or_else(|| panic!("seed {seed}: batch {} lost", want.base_offset));
            assert_eq!(have.meta, want.meta, "seed {seed}");
        }
    }
}
