//! The consumer offset store's file: the upgrade of a version 1 file (also
//! when a crash or an I/O error interrupts it), torn tails and damage
//! (handled as every `RecordFile` user handles them: the ledger's rules and
//! codes), and compaction. Real files live in temporary directories; crash
//! tests use `SimFs`.

use std::path::Path;
use std::sync::Arc;

use strom_storage::record::{self, FILE_HEADER};
use strom_storage::sim::{Fault, FaultOp, SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{OffsetStore, StorageError};

const MAGIC: [u8; 4] = *b"STRO";

/// Encodes a version 1 offset file exactly as the store wrote it before it
/// moved onto `RecordFile`: header `"STRO"` + u32 1, then per commit
/// `u32 crc32c | u16 name_len | u64 offset | name`, the CRC over
/// everything after it. Test-only: nothing writes version 1 any more.
fn v1_file(commits: &[(&str, u64)]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    for (name, offset) in commits {
        let start = out.len();
        out.extend_from_slice(&[0u8; 4]);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        let crc = crc32c::crc32c(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }
    out
}

/// (consumer, offset) pairs.
type Commits<N> = Vec<(N, u64)>;

/// Commits of several consumers, some committed more than once, and the
/// last offset of each (what the store must give back).
fn v1_commits() -> (Commits<&'static str>, Commits<String>) {
    let commits = vec![
        ("alpha", 10),
        ("beta", 20),
        ("alpha", 11),
        ("", 3),
        ("gruppe-ü", 7),
        ("beta", 21),
        ("alpha", 12),
    ];
    let last = vec![
        ("".to_string(), 3),
        ("alpha".to_string(), 12),
        ("beta".to_string(), 21),
        ("gruppe-ü".to_string(), 7),
    ];
    (commits, last)
}

/// Checks that `bytes` is a version 2 offset file and returns its records.
fn v2_records(bytes: &[u8]) -> usize {
    let scan = record::scan_versioned_log(bytes, MAGIC, 2, "offsets")
        .unwrap_or_else(|d| panic!("not a version 2 offset file: {d:?}"));
    assert!(
        scan.torn.is_none(),
        "a torn version 2 file: {:?}",
        scan.torn
    );
    scan.records.len()
}

fn code(r: Result<OffsetStore, StorageError>) -> u16 {
    match r {
        Ok(s) => panic!("opened: {:?}", s.all()),
        Err(e) => e.code(),
    }
}

#[test]
fn a_version_1_file_opens_with_every_commit_and_is_rewritten_as_version_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer-offsets");
    let (commits, last) = v1_commits();
    std::fs::write(&path, v1_file(&commits)).unwrap();
    let store = OffsetStore::open(&path).unwrap();
    assert_eq!(store.all(), last);
    drop(store);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..FILE_HEADER], &record::versioned_header(MAGIC, 2));
    assert_eq!(v2_records(&bytes), last.len(), "one record per consumer");
    // Reopened, it is read as version 2 (no second upgrade) and takes commits.
    let store = OffsetStore::open(&path).unwrap();
    assert_eq!(store.all(), last);
    store.commit("beta", 22).unwrap();
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap()[..bytes.len()], bytes[..]);
    assert_eq!(OffsetStore::open(&path).unwrap().get("beta"), Some(22));
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file left behind");
}

#[test]
fn a_version_1_file_keeps_its_valid_prefix_as_version_1_did() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    let full = v1_file(&[("a", 1), ("b", 2), ("a", 3)]);
    let last_record = 14 + 1;
    for cut in full.len() - last_record..full.len() {
        std::fs::write(&path, &full[..cut]).unwrap();
        let store = OffsetStore::open(&path).unwrap();
        assert_eq!(
            store.all(),
            vec![("a".into(), 1), ("b".into(), 2)],
            "cut at {cut}"
        );
        v2_records(&std::fs::read(&path).unwrap());
    }
    // A version 1 file cut inside its header (a crash while it was
    // created) held no commit.
    std::fs::write(&path, &full[..5]).unwrap();
    assert!(OffsetStore::open(&path).unwrap().all().is_empty());
    assert_eq!(v2_records(&std::fs::read(&path).unwrap()), 0);
}

#[test]
fn a_leftover_temporary_file_of_an_upgrade_is_discarded_and_the_upgrade_redone() {
    let (commits, last) = v1_commits();
    // Left by a crash: a half-written file, or a whole new one not renamed.
    let whole_v2 = {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("consumer-offsets");
        std::fs::write(&p, v1_file(&commits[..2])).unwrap();
        drop(OffsetStore::open(&p).unwrap());
        std::fs::read(&p).unwrap()
    };
    for leftover in [&b"STRO\x02\0\0\0\x05"[..], &whole_v2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("consumer-offsets");
        std::fs::write(&path, v1_file(&commits)).unwrap();
        let tmp = dir.path().join("consumer-offsets.tmp");
        std::fs::write(&tmp, leftover).unwrap();
        let store = OffsetStore::open(&path).unwrap();
        assert_eq!(store.all(), last);
        assert!(!tmp.exists(), "the leftover is removed");
        drop(store);
        assert_eq!(OffsetStore::open(&path).unwrap().all(), last);
    }
}

fn sim_disk_with_v1(commits: &[(&str, u64)]) -> SimFs {
    let fs = SimFs::new();
    fs.create_dir(Path::new("/data")).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    let f = fs.open(Path::new(SIM_PATH), true).unwrap();
    f.write_all_at(&[&v1_file(commits)], 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/data")).unwrap();
    fs
}

const SIM_PATH: &str = "/data/consumer-offsets";

fn sim_read(fs: &SimFs, path: &str) -> Vec<u8> {
    let f = fs.open(Path::new(path), false).unwrap();
    let mut buf = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn an_upgrade_interrupted_by_power_loss_at_any_step_loses_no_commit() {
    let (commits, last) = v1_commits();
    let mut finished = false;
    for ops in 0..64 {
        let fs = sim_disk_with_v1(&commits);
        fs.crash_after(ops);
        let _ = OffsetStore::open_with(Arc::new(fs.clone()), Path::new(SIM_PATH));
        if !fs.crashed() {
            finished = true;
        }
        for seed in 0..16 {
            let image = fs.crash_image(&mut SimRng::new(seed));
            let store = OffsetStore::open_with(Arc::new(image.clone()), Path::new(SIM_PATH))
                .unwrap_or_else(|e| panic!("crash after {ops} ops, seed {seed}: {e}"));
            assert_eq!(store.all(), last, "crash after {ops} ops, seed {seed}");
            drop(store);
            v2_records(&sim_read(&image, SIM_PATH));
            assert!(!image
                .exists(Path::new("/data/consumer-offsets.tmp"))
                .unwrap());
        }
        if finished {
            break;
        }
    }
    assert!(finished, "the upgrade never completed within 64 operations");
}

#[test]
fn an_upgrade_stopped_by_an_io_error_leaves_the_version_1_file_intact() {
    let (commits, last) = v1_commits();
    for (op, path) in [
        (FaultOp::Write, ".tmp"),
        (FaultOp::Sync, ".tmp"),
        (FaultOp::Sync, "/data"),
    ] {
        let fs = sim_disk_with_v1(&commits);
        fs.inject(Fault {
            op,
            errno: libc::EIO,
            path_contains: path.into(),
            times: Some(1),
        });
        let r = OffsetStore::open_with(Arc::new(fs.clone()), Path::new(SIM_PATH));
        assert_eq!(code(r), 300, "{op:?} of {path}");
        // Power loss now: whichever file the name holds, nothing is lost.
        let image = fs.crash_image(&mut SimRng::new(7));
        let store = OffsetStore::open_with(Arc::new(image), Path::new(SIM_PATH)).unwrap();
        assert_eq!(store.all(), last, "{op:?} of {path}");
    }
}

#[test]
fn a_torn_last_commit_is_cut_and_later_commits_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    {
        let store = OffsetStore::open(&path).unwrap();
        store.commit("alpha", 10).unwrap();
        store.commit("beta", 20).unwrap();
        store.commit("alpha", 11).unwrap();
    }
    let full = std::fs::read(&path).unwrap();
    // A record header, kind, offset, name.
    let last_record = record::HEADER + 9 + "alpha".len();
    let good = full.len() - last_record;
    for cut in good..full.len() {
        let work = tempfile::tempdir().unwrap();
        let p = work.path().join("offsets");
        std::fs::write(&p, &full[..cut]).unwrap();
        let store = OffsetStore::open(&p).unwrap();
        assert_eq!(store.get("alpha"), Some(10), "cut at {cut}");
        assert_eq!(store.get("beta"), Some(20));
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            good as u64,
            "the torn tail was truncated (cut at {cut})"
        );
        store.commit("gamma", 1).unwrap();
        drop(store);
        let store = OffsetStore::open(&p).unwrap();
        let want = vec![
            ("alpha".into(), 10),
            ("beta".into(), 20),
            ("gamma".into(), 1),
        ];
        assert_eq!(store.all(), want);
    }
    // A damaged last record, with nothing after it, is a torn tail too.
    let mut bytes = full.clone();
    *bytes.last_mut().unwrap() ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(OffsetStore::open(&path).unwrap().get("alpha"), Some(10));
}

#[test]
fn a_hostile_length_prefix_is_cut_as_a_torn_tail_without_allocating_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    OffsetStore::open(&path).unwrap().commit("a", 1).unwrap();
    let good = std::fs::read(&path).unwrap();
    let mut bytes = good.clone();
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 12]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        OffsetStore::open(&path).unwrap().all(),
        vec![("a".into(), 1)]
    );
    assert_eq!(std::fs::read(&path).unwrap(), good);
}

#[test]
fn a_damaged_commit_followed_by_a_valid_one_is_corrupt_and_left_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    {
        let store = OffsetStore::open(&path).unwrap();
        store.commit("alpha", 10).unwrap();
        store.commit("beta", 20).unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[FILE_HEADER + record::HEADER + 2] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    match OffsetStore::open(&path) {
        Err(e @ StorageError::Corrupt { .. }) => {
            assert_eq!(e.code(), 301);
            let msg = e.to_string();
            assert!(msg.contains("offsets"), "names the file: {msg}");
            assert!(
                msg.contains(&format!("byte {FILE_HEADER}")),
                "names the byte: {msg}"
            );
        }
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(s) => panic!("opened with the damage dropped: {:?}", s.all()),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is left as is"
    );
}

#[test]
fn a_well_framed_record_that_does_not_decode_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    OffsetStore::open(&path).unwrap().commit("a", 1).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&record::encode(2, &[0x7F, 1, 2]));
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(code(OffsetStore::open(&path)), 301);
}

#[test]
fn a_file_of_another_kind_or_a_newer_version_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    for header in [
        record::versioned_header(MAGIC, 3),
        record::versioned_header(*b"STRC", 1),
    ] {
        std::fs::write(&path, header).unwrap();
        assert_eq!(code(OffsetStore::open(&path)), 301);
        assert_eq!(std::fs::read(&path).unwrap(), header, "left as is");
    }
}

#[test]
fn compaction_keeps_the_latest_offset_of_every_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("offsets");
    let store = OffsetStore::open(&path).unwrap();
    store.set_compaction_threshold(32);
    store.commit("once", 5).unwrap();
    for i in 0..300u64 {
        store
            .commit(["a", "b", "c"][(i % 3) as usize], 1000 - i)
            .unwrap();
    }
    drop(store);
    let records = v2_records(&std::fs::read(&path).unwrap());
    assert!(records < 32, "never compacted: {records} records");
    let want = vec![
        ("a".to_string(), 1000 - 297),
        ("b".to_string(), 1000 - 298),
        ("c".to_string(), 1000 - 299),
        ("once".to_string(), 5),
    ];
    assert_eq!(OffsetStore::open(&path).unwrap().all(), want);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary file left behind");
}
