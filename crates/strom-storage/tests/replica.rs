//! Replica logs: a follower fed by reading a leader (`read` + `read_data`)
//! and `append_replica` holds the same batches at the same offsets with the
//! same timestamps, byte for byte on disk; `append_replica` refuses a batch
//! that does not continue the log; and the Kafka divergence example, with
//! the leader-epoch history, ends with the follower equal to the leader.

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::{create_sim, open_sim, read_all, TestBatch};
use strom_storage::sim::SimFs;
use strom_storage::vfs::Vfs;
use strom_storage::{
    EpochHistory, FileLog, LogConfig, MemoryLog, PartitionLog, ReplicaBatch, StoredBatch,
};

/// Everything a reader sees of a log: (base, count, timestamp, meta, data).
type Content = Vec<(u64, u32, u64, Bytes, Bytes)>;

fn data_of(log: &dyn PartitionLog, b: &StoredBatch) -> Bytes {
    let mut out = Vec::new();
    log.read_data(b.base_offset, &[(0, b.data_len)], &mut out)
        .unwrap();
    out.pop().unwrap()
}

fn content(log: &dyn PartitionLog) -> Content {
    read_all(log, log.first_offset())
        .into_iter()
        .map(|b| {
            let data = data_of(log, &b);
            (b.base_offset, b.count, b.timestamp_us, b.meta, data)
        })
        .collect()
}

/// Copies what the follower lacks from the leader, as a replica fetcher
/// would; returns the number of batches copied.
fn copy(leader: &dyn PartitionLog, follower: &dyn PartitionLog) -> usize {
    let mut copied = 0;
    loop {
        let batches = leader.read(follower.next_offset(), 4096).unwrap();
        if batches.is_empty() {
            return copied;
        }
        for b in batches {
            let data = [data_of(leader, &b)];
            let a = follower
                .append_replica(ReplicaBatch {
                    base_offset: b.base_offset,
                    count: b.count,
                    timestamp_us: b.timestamp_us,
                    meta: &b.meta,
                    data: &data,
                })
                .unwrap();
            assert_eq!(a.base_offset, b.base_offset);
            assert_eq!(a.timestamp_us, b.timestamp_us);
            copied += 1;
        }
    }
}

fn small_segments() -> LogConfig {
    common::small_segments()
}

fn fill(log: &dyn PartitionLog, from: u64, n: u64) {
    for i in from..from + n {
        TestBatch::standard(i).append(log);
    }
}

#[test]
fn memory_follower_reads_back_what_the_leader_holds() {
    let leader = MemoryLog::new(small_segments());
    fill(&leader, 0, 25);
    let follower = MemoryLog::new(small_segments());
    assert_eq!(copy(&leader, &follower), 25);
    assert_eq!(content(&follower), content(&leader));
    assert_eq!(follower.next_offset(), leader.next_offset());
    fill(&leader, 25, 3);
    assert_eq!(copy(&leader, &follower), 3, "only what is new is copied");
    assert_eq!(content(&follower), content(&leader));
}

#[test]
fn file_follower_of_a_memory_leader_reads_back_equal_after_reopen() {
    let leader = MemoryLog::new(small_segments());
    fill(&leader, 0, 30);
    let fs = SimFs::new();
    let follower = create_sim(&fs);
    copy(&leader, &follower);
    assert!(follower.stats().segments > 2, "the copy rolled segments");
    assert_eq!(content(&follower), content(&leader));
    follower.close().unwrap();
    drop(follower);
    assert_eq!(content(&open_sim(&fs)), content(&leader));
}

fn segment_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "data"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn file_follower_files_are_byte_identical_to_the_leaders() {
    let tmp = tempfile::tempdir().unwrap();
    let (ldir, fdir) = (tmp.path().join("leader"), tmp.path().join("follower"));
    let leader = FileLog::create(&ldir, small_segments()).unwrap();
    let follower = FileLog::create(&fdir, small_segments()).unwrap();
    fill(&leader, 0, 20);
    copy(&leader, &follower);
    fill(&leader, 20, 20);
    copy(&leader, &follower);
    leader.close().unwrap();
    follower.close().unwrap();
    let (l, f) = (segment_files(&ldir), segment_files(&fdir));
    assert!(l.len() > 4, "several segments: {}", l.len());
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&f), names(&l), "same segment files");
    for ((name, lb), (_, fb)) in l.iter().zip(&f) {
        assert!(lb == fb, "{name} differs between leader and follower");
    }
    assert_eq!(content(&follower), content(&leader));
}

/// `append_replica` refuses a batch that does not continue the log, and
/// writes nothing then.
fn refuses_what_does_not_continue(log: &dyn PartitionLog) {
    fill(log, 0, 3);
    let next = log.next_offset();
    let last_ts = log
        .read(0, usize::MAX)
        .unwrap()
        .last()
        .unwrap()
        .timestamp_us;
    let data = [Bytes::from_static(b"xyz")];
    let batch = |base_offset, timestamp_us| ReplicaBatch {
        base_offset,
        count: 2,
        timestamp_us,
        meta: b"m",
        data: &data,
    };
    for (base, ts, what) in [
        (next + 1, last_ts, "a gap"),
        (next - 1, last_ts, "an overlap"),
        (0, last_ts, "a rewrite"),
        (next, last_ts - 1, "a timestamp going back"),
    ] {
        let before = content(log);
        let e = log.append_replica(batch(base, ts)).unwrap_err();
        assert_eq!(e.code(), 308, "{what}: {e}");
        assert_eq!(log.next_offset(), next, "{what} moved the log end");
        assert_eq!(content(log), before, "{what} changed the log");
    }
    let a = log.append_replica(batch(next, last_ts)).unwrap();
    assert_eq!((a.base_offset, a.timestamp_us), (next, last_ts));
    assert_eq!(log.next_offset(), next + 2);
    let a = log.append_replica(batch(next + 2, last_ts + 7)).unwrap();
    assert_eq!(
        a.timestamp_us,
        last_ts + 7,
        "the leader's timestamp is kept"
    );
}

#[test]
fn memory_append_replica_refuses_gaps_overlaps_and_older_timestamps() {
    refuses_what_does_not_continue(&MemoryLog::new(LogConfig::default()));
}

#[test]
fn file_append_replica_refuses_gaps_overlaps_and_older_timestamps() {
    refuses_what_does_not_continue(&create_sim(&SimFs::new()));
}

fn history(fs: &SimFs, name: &str) -> EpochHistory {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    EpochHistory::open(vfs, &Path::new(common::SIM_DIR).join(name)).unwrap()
}

/// Kafka's divergence example: the leader has epochs 1@0 and 2@5, the
/// follower was leader in epoch 1 and wrote up to offset 8 alone.
#[test]
fn follower_truncates_a_divergent_tail_at_the_leaders_epoch_end() {
    let fs = SimFs::new();
    let leader = MemoryLog::new(small_segments());
    let leader_epochs = history(&fs, "leader-epochs");
    let follower = create_sim(&fs);
    let follower_epochs = history(&fs, "follower-epochs");
    leader_epochs.assign(1, 0).unwrap();
    follower_epochs.assign(1, 0).unwrap();
    for i in 0..5 {
        TestBatch::new(i, 1, 100, 1).append(&leader);
    }
    copy(&leader, &follower);
    // The follower, deposed, kept offsets 5..8 of epoch 1 nobody else has.
    for i in 100..103 {
        TestBatch::new(i, 1, 200, 2).append(&follower);
    }
    leader_epochs.assign(2, 5).unwrap();
    for i in 5..10 {
        TestBatch::new(i, 1, 300, 1).append(&leader);
    }
    assert_eq!(follower.next_offset(), 8);

    let latest = follower_epochs.latest().unwrap().epoch;
    let (epoch, end) = leader_epochs
        .end_offset_for(latest, leader.next_offset())
        .unwrap();
    assert_eq!((epoch, end), (1, 5));
    assert_eq!(follower.truncate_from(end).unwrap(), 5);
    follower_epochs.truncate_from(end).unwrap();
    follower_epochs.assign(2, 5).unwrap();
    copy(&leader, &follower);
    assert_eq!(content(&follower), content(&leader));

    follower.close().unwrap();
    drop(follower);
    let follower = open_sim(&fs);
    assert_eq!(content(&follower), content(&leader), "after reopen");
    let epochs = history(&fs, "follower-epochs").entries();
    let pairs: Vec<_> = epochs.iter().map(|e| (e.epoch, e.start_offset)).collect();
    assert_eq!(pairs, vec![(1, 0), (2, 5)]);
}
