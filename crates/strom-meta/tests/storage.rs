//! The durable log on real files: what survives a reopen, how a torn last
//! record and damage in the middle are told apart, and that the file is
//! rewritten when dead records pile up.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use openraft::{CommittedLeaderId, EntryPayload};
use strom_meta::log_file::{LogFile, LogRecord, LOG};
use strom_meta::types::{Blob, Entry, LogId, Vote};
use strom_meta::{code, LogError, Meta, MetaError};
use strom_storage::vfs::{RealFs, Vfs};

fn vfs() -> Arc<dyn Vfs> {
    Arc::new(RealFs)
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entry(term: u64, index: u64) -> LogRecord {
    LogRecord::Entry(Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Blob(index.to_le_bytes().to_vec())),
    })
}

/// The vote and the (index, term) of each entry.
type Reopened = (Option<Vote>, Vec<(u64, u64)>);

/// What `dir`'s log holds, after a reopen.
fn reopen(dir: &Path) -> Result<Reopened, LogError> {
    let log = LogFile::open(vfs(), dir)?;
    let state = log.state();
    let state = state.lock();
    let entries = state
        .entries
        .values()
        .map(|e| (e.log_id.index, e.log_id.leader_id.term))
        .collect();
    Ok((state.vote, entries))
}

fn write_entries(dir: &Path, n: u64) -> u64 {
    let mut log = LogFile::open(vfs(), dir).expect("open");
    log.write(vec![LogRecord::Vote(Vote::new(1, 1))], true)
        .expect("vote");
    for i in 0..n {
        log.write(vec![entry(1, i)], true).expect("append");
    }
    std::fs::metadata(dir.join(LOG)).expect("stat").len()
}

#[test]
fn votes_entries_truncations_and_purges_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_entries(dir.path(), 10);
    let mut log = LogFile::open(vfs(), dir.path()).expect("open");
    log.write(vec![LogRecord::Truncated(7)], true)
        .expect("truncate");
    log.write(vec![entry(2, 7), entry(2, 8)], true)
        .expect("append");
    log.write(vec![LogRecord::Purged(log_id(1, 2))], true)
        .expect("purge");
    log.write(vec![LogRecord::Vote(Vote::new(2, 3))], true)
        .expect("vote");
    drop(log);
    let (vote, entries) = reopen(dir.path()).expect("reopen");
    assert_eq!(vote, Some(Vote::new(2, 3)));
    let expected: Vec<(u64, u64)> = (3..7).map(|i| (i, 1)).chain([(7, 2), (8, 2)]).collect();
    assert_eq!(entries, expected);
}

#[test]
fn an_entry_out_of_sequence_is_refused_before_it_is_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let len = write_entries(dir.path(), 3);
    let mut log = LogFile::open(vfs(), dir.path()).expect("open");
    let e = log.write(vec![entry(1, 5)], true).expect_err("a gap");
    assert!(matches!(e, LogError::OutOfOrder(_)), "{e}");
    drop(log);
    assert_eq!(
        std::fs::metadata(dir.path().join(LOG)).expect("stat").len(),
        len
    );
}

#[test]
fn a_torn_last_record_is_truncated_on_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let full = write_entries(dir.path(), 5);
    let path = dir.path().join(LOG);
    // Cut the last record in half, as a crash during its write would.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(full - 20)
        .expect("cut");
    let (_, entries) = reopen(dir.path()).expect("a torn tail is not corruption");
    assert_eq!(
        entries.iter().map(|e| e.0).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    let after = std::fs::metadata(&path).expect("stat").len();
    assert!(
        after < full - 20,
        "the torn bytes were not cut away ({after})"
    );
    // The log goes on from the last whole record.
    let mut log = LogFile::open(vfs(), dir.path()).expect("open");
    log.write(vec![entry(1, 4)], true)
        .expect("append after recovery");
    drop(log);
    assert_eq!(reopen(dir.path()).expect("reopen").1.len(), 5);
}

#[test]
fn a_flipped_byte_in_the_middle_is_corrupt_naming_file_and_offset() {
    let dir = tempfile::tempdir().expect("temp dir");
    let full = write_entries(dir.path(), 20);
    let path = dir.path().join(LOG);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let at = full / 2;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x40], at).expect("flip");
    let e = reopen(dir.path()).expect_err("damage in the middle must not open");
    assert_eq!(e.code(), code::CORRUPT);
    let LogError::Corrupt { file, offset, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(file, &path);
    assert!(
        *offset <= at && at - *offset < 200,
        "offset {offset} for a flip at {at}"
    );
    assert!(e.to_string().contains("raft.log is damaged at byte"), "{e}");
}

#[test]
fn garbage_in_place_of_the_log_is_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    for bytes in [
        &b"XXXXXXXXXXXXXXXXXXXXXXXXXXXX"[..],
        &[0xff; 4096],
        b"STRR\x01\x00\x00\x00\xff\xff\xff\xff",
    ] {
        std::fs::write(dir.path().join(LOG), bytes).expect("write");
        match reopen(dir.path()) {
            Err(LogError::Corrupt { .. }) | Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
}

/// A small deterministic generator (xorshift64), so failures replay.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn random_damage_to_the_log_is_an_error_or_a_clean_recovery_never_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_entries(dir.path(), 12);
    let good = std::fs::read(dir.path().join(LOG)).expect("read");
    let mut seed = 0x5eed_u64;
    for round in 0..300 {
        let mut bytes = good.clone();
        for _ in 0..1 + next(&mut seed) % 3 {
            let at = (next(&mut seed) % bytes.len() as u64) as usize;
            bytes[at] = next(&mut seed) as u8;
        }
        if round % 4 == 0 {
            bytes.truncate((next(&mut seed) % bytes.len() as u64) as usize);
        }
        std::fs::write(dir.path().join(LOG), &bytes).expect("write");
        match reopen(dir.path()) {
            Ok((_, entries)) => {
                let indexes: Vec<u64> = entries.iter().map(|e| e.0).collect();
                assert_eq!(
                    indexes,
                    (0..indexes.len() as u64).collect::<Vec<_>>(),
                    "round {round}"
                );
            }
            Err(LogError::Corrupt { .. }) => {}
            Err(e) => panic!("round {round}: {e}"),
        }
    }
}

#[test]
fn many_dead_records_make_the_file_be_rewritten() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_entries(dir.path(), 10);
    let mut log = LogFile::open(vfs(), dir.path()).expect("open");
    for _ in 0..3000 {
        log.write(vec![LogRecord::Committed(Some(log_id(1, 9)))], false)
            .expect("commit");
    }
    drop(log);
    let len = std::fs::metadata(dir.path().join(LOG)).expect("stat").len();
    assert!(len < 200_000, "the log was not rewritten: {len} bytes");
    let log = LogFile::open(vfs(), dir.path()).expect("reopen");
    let state = log.state();
    let state = state.lock();
    assert_eq!(state.entries.len(), 10);
    assert_eq!(state.committed, Some(log_id(1, 9)));
    assert_eq!(state.vote, Some(Vote::new(1, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_file_stops_the_member_with_corrupt() {
    let config = strom_meta::MetaConfig {
        snapshot_every: 5,
        ..common::quick()
    };
    let c = common::Cluster::voters(1, config).await;
    c.leader(std::time::Duration::from_secs(5)).await;
    for n in 0..20 {
        c.node(1).propose(common::cmd(n)).await.expect("propose");
    }
    let snap = c.dir(1).join("sm.snapshot");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !snap.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot was written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    c.shutdown().await;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&snap)
        .expect("open");
    let len = f.metadata().expect("stat").len();
    f.write_all_at(b"!", len - 3).expect("damage");
    let net = Arc::new(common::NoNet);
    let started = Meta::start(
        1,
        &c.dir(1),
        common::quick(),
        common::Counter::default(),
        net,
    )
    .await;
    match started {
        Err(e @ MetaError::Log(LogError::Corrupt { .. })) => {
            assert_eq!(e.code(), code::CORRUPT);
            assert!(e.to_string().contains("sm.snapshot"), "{e}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a damaged snapshot was accepted"),
    }
}

#[tokio::test]
async fn a_log_purged_past_its_snapshot_is_refused_with_a_reason_not_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_entries(dir.path(), 6);
    let mut log = LogFile::open(vfs(), dir.path()).expect("open");
    log.write(vec![LogRecord::Purged(log_id(1, 4))], true)
        .expect("purge");
    drop(log);
    let net = Arc::new(common::NoNet);
    let config = common::quick();
    let started = Meta::start(1, dir.path(), config, common::Counter::default(), net).await;
    let e = started
        .err()
        .expect("a log purged with no snapshot must not start");
    assert!(
        matches!(e, MetaError::Log(LogError::Corrupt { .. }))
            && e.to_string().contains("purged up to index 4"),
        "{e}"
    );
}
