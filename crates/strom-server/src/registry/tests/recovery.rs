//! Reopening the registry's files after crashes and damage (real files in a
//! temporary directory).

use std::fs;

use strom_storage::record::{self, FILE_HEADER};

use super::super::files::{LOG, LOG_MAGIC, SNAPSHOT, SNAPSHOT_MAGIC};
use super::super::snapshot;
use super::*;

/// Writes `n` commands of a random history; returns the state after each
/// prefix (`states[i]`: after `i` commands) and where each record starts.
fn write_history(dir: &Path, n: usize) -> (Vec<RegistryState>, Vec<u64>) {
    let (mut store, mut st) = open_real(dir).unwrap();
    let mut states = vec![st.clone()];
    let mut starts = Vec::new();
    for cmd in random_history(3, n) {
        starts.push(fs::metadata(dir.join(LOG)).unwrap().len());
        commit(&mut store, &mut st, cmd);
        states.push(st.clone());
    }
    (states, starts)
}

fn open_err(dir: &Path) -> ServerError {
    match open_real(dir) {
        Ok(_) => panic!("opening {} should fail", dir.display()),
        Err(e) => e.into(),
    }
}

#[test]
fn a_torn_last_record_is_truncated_and_its_change_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let (states, starts) = write_history(tmp.path(), 12);
    let log = tmp.path().join(LOG);
    let full = fs::read(&log).unwrap();
    let last = *starts.last().unwrap() as usize;
    for cut in last + 1..full.len() {
        fs::write(&log, &full[..cut]).unwrap();
        let (mut store, st) = open_real(tmp.path()).unwrap();
        assert_eq!(st, states[states.len() - 2], "cut at {cut}");
        assert_eq!(
            fs::metadata(&log).unwrap().len() as usize,
            last,
            "cut at {cut}"
        );
        // The next change lands after the valid records and survives.
        let mut st = st;
        let cmd = RegistryCommand::MemberJoined {
            id: 77,
            addr: "after".into(),
        };
        commit(&mut store, &mut st, cmd);
        drop(store);
        assert_eq!(open_real(tmp.path()).unwrap().1, st, "cut at {cut}");
    }
}

#[test]
fn a_flipped_byte_in_the_last_record_drops_only_that_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (states, starts) = write_history(tmp.path(), 12);
    let log = tmp.path().join(LOG);
    let full = fs::read(&log).unwrap();
    let last = *starts.last().unwrap() as usize;
    for at in last..full.len() {
        let mut bytes = full.clone();
        bytes[at] ^= 0x10;
        fs::write(&log, &bytes).unwrap();
        let (_, st) = open_real(tmp.path()).unwrap();
        assert_eq!(st, states[states.len() - 2], "flip at {at}");
        assert_eq!(
            fs::metadata(&log).unwrap().len() as usize,
            last,
            "flip at {at}"
        );
    }
}

#[test]
fn damage_followed_by_valid_records_refuses_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, starts) = write_history(tmp.path(), 12);
    let log = tmp.path().join(LOG);
    let full = fs::read(&log).unwrap();
    // Every byte of the fifth record, header and payload.
    for at in starts[4] as usize..starts[5] as usize {
        let mut bytes = full.clone();
        bytes[at] ^= 0x01;
        fs::write(&log, &bytes).unwrap();
        let err = open_err(tmp.path());
        assert_corrupt(&err, "registry.log");
        assert!(
            err.to_string().contains(&format!("at byte {}", starts[4])),
            "flip at {at}: {err}"
        );
    }
    // A log cut in the middle and glued back together.
    let mut glued = full[..starts[4] as usize].to_vec();
    glued.extend_from_slice(&full[starts[5] as usize..]);
    fs::write(&log, &glued).unwrap();
    assert_corrupt(&open_err(tmp.path()), "registry.log");
}

#[test]
fn a_well_framed_record_that_does_not_apply_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, _) = write_history(tmp.path(), 5);
    let log = tmp.path().join(LOG);
    let mut bytes = fs::read(&log).unwrap();
    let bad = RegistryCommand::DeleteTopic {
        name: "never-created".into(),
    };
    bytes.extend_from_slice(&record::encode(6, &serde_json::to_vec(&bad).unwrap()));
    fs::write(&log, &bytes).unwrap();
    let err = open_err(tmp.path());
    assert_corrupt(&err, "registry.log");
    assert!(err.to_string().contains("does not apply"), "{err}");
    // Not JSON of a command at all, even as the last record.
    let mut bytes = fs::read(&log).unwrap();
    let cut = bytes.len() - record::HEADER - serde_json::to_vec(&bad).unwrap().len();
    bytes.truncate(cut);
    bytes.extend_from_slice(&record::encode(6, b"{\"Unknown\":{}}"));
    fs::write(&log, &bytes).unwrap();
    assert!(open_err(tmp.path()).to_string().contains("does not decode"));
}

#[test]
fn a_damaged_snapshot_refuses_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (states, _) = write_history(tmp.path(), 20);
    let (_, st) = open_real(tmp.path()).unwrap();
    assert!(!st.topics.is_empty());
    snapshot::write(&RealFs, tmp.path(), 20, &st).unwrap();
    let snap = tmp.path().join(SNAPSHOT);
    let good = fs::read(&snap).unwrap();
    assert_eq!(open_real(tmp.path()).unwrap().1, states[20]);
    for at in [0, 5, 9, 20, good.len() / 2, good.len() - 1] {
        let mut bytes = good.clone();
        bytes[at] ^= 0x20;
        fs::write(&snap, &bytes).unwrap();
        assert_corrupt(&open_err(tmp.path()), "registry.snapshot");
    }
    fs::write(&snap, &good[..good.len() - 3]).unwrap();
    assert_corrupt(&open_err(tmp.path()), "registry.snapshot");
    // A snapshot that frames well but holds an inconsistent state.
    let mut body = serde_json::to_value(st.to_persisted()).unwrap();
    body["next_topic_id"] = 0.into();
    let mut bytes = record::file_header(SNAPSHOT_MAGIC).to_vec();
    bytes.extend_from_slice(&record::encode(20, &serde_json::to_vec(&body).unwrap()));
    fs::write(&snap, &bytes).unwrap();
    assert!(open_err(tmp.path()).to_string().contains("inconsistent"));
}

#[test]
fn compaction_writes_a_snapshot_and_starts_a_short_log() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = Limits {
        records: 10,
        bytes: 1 << 20,
    };
    let (mut store, mut st) = Store::open(Arc::new(RealFs), tmp.path(), limits).unwrap();
    for cmd in random_history(11, 25) {
        commit(&mut store, &mut st, cmd);
    }
    assert!(tmp.path().join(SNAPSHOT).exists());
    assert_eq!(store.log_records(), 5);
    assert_eq!(store.last_index(), 25);
    drop(store);
    let (store, again) = Store::open(Arc::new(RealFs), tmp.path(), limits).unwrap();
    assert_eq!(again, st);
    assert_eq!(store.last_index(), 25);
    // Without the snapshot the log alone starts at record 21: a gap.
    drop(store);
    fs::remove_file(tmp.path().join(SNAPSHOT)).unwrap();
    let err = open_err(tmp.path());
    assert_corrupt(&err, "registry.log");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_compaction_interrupted_before_its_new_log_is_finished_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let (states, _) = write_history(tmp.path(), 9);
    // The snapshot was written; the crash came before the new log.
    snapshot::write(&RealFs, tmp.path(), 9, &states[9]).unwrap();
    let (mut store, mut st) = open_real(tmp.path()).unwrap();
    assert_eq!(st, states[9]);
    assert_eq!(store.log_records(), 0);
    let cmd = RegistryCommand::MemberJoined {
        id: 5,
        addr: "later".into(),
    };
    commit(&mut store, &mut st, cmd);
    drop(store);
    let (store, again) = open_real(tmp.path()).unwrap();
    assert_eq!(again, st);
    assert_eq!(store.last_index(), 10);
}

#[test]
fn garbage_files_give_an_error_never_a_panic() {
    let mut rng = SimRng::new(99);
    for round in 0..200u64 {
        let tmp = tempfile::tempdir().unwrap();
        let len = rng.below(600) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let header = rng.below(2) == 0;
        if header && bytes.len() >= FILE_HEADER + 4 {
            bytes[..FILE_HEADER].copy_from_slice(&record::file_header(LOG_MAGIC));
            if rng.below(2) == 0 {
                // A hostile length right after the header.
                bytes[FILE_HEADER..FILE_HEADER + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            }
        }
        let name = if round % 2 == 0 { LOG } else { SNAPSHOT };
        if name == SNAPSHOT && header && bytes.len() >= FILE_HEADER {
            bytes[..4].copy_from_slice(&SNAPSHOT_MAGIC);
        }
        fs::write(tmp.path().join(name), &bytes).unwrap();
        match open_real(tmp.path()) {
            // Random bytes after a valid log header read as a torn tail.
            Ok((_, st)) => {
                assert_eq!(name, LOG, "round {round}: a garbage snapshot was accepted");
                assert_eq!(st, RegistryState::default(), "round {round}");
            }
            Err(e) => assert_eq!(
                ServerError::from(e).code(),
                ErrorCode::CORRUPT,
                "round {round}"
            ),
        }
    }
}

#[test]
fn an_invalid_old_registry_json_refuses_to_open_and_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("registry.json"), b"{ not json").unwrap();
    assert_corrupt(&open_err(tmp.path()), "registry.json");
    assert!(tmp.path().join("registry.json").exists());
    assert!(!tmp.path().join(SNAPSHOT).exists());
}
