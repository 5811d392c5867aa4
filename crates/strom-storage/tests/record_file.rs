//! [`RecordFile`] on the real file system: replay order, a torn tail cut,
//! damage in the middle refused, an oversized length prefix refused without
//! allocating from it, rewrite, and a compaction into a separate snapshot
//! that crashes between the snapshot's rename and the log's restart.

use std::path::Path;
use std::sync::Arc;

use strom_storage::record::{self, FILE_HEADER};
use strom_storage::record_file::{read_snapshot, write_snapshot};
use strom_storage::vfs::RealFs;
use strom_storage::{Codec, Format, RecordFile, RecordFileError};

const FORMAT: Format = Format {
    magic: *b"TSTR",
    version: record::VERSION,
    what: "test log",
};
const SNAP: Format = Format {
    magic: *b"TSTS",
    version: record::VERSION,
    what: "test snapshot",
};

struct Text;

impl Codec for Text {
    type Record = String;
    fn encode(&self, r: &String) -> Result<Vec<u8>, String> {
        Ok(r.as_bytes().to_vec())
    }
    fn decode(&self, payload: &[u8]) -> Result<String, String> {
        String::from_utf8(payload.to_vec()).map_err(|e| e.to_string())
    }
}

type Opened = (RecordFile<Text>, Vec<(u64, String)>);

fn open(dir: &Path) -> Result<Opened, RecordFileError> {
    let (f, recs) = RecordFile::open(Arc::new(RealFs), dir, "t.log", FORMAT, Text, 1, Vec::new)?;
    Ok((f, recs.into_iter().map(|r| (r.index, r.record)).collect()))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn records_replay_in_order_with_their_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut f, recs) = open(dir.path()).unwrap();
    assert!(recs.is_empty());
    assert_eq!(f.append(&strings(&["a", "b"]), true).unwrap(), 1);
    assert_eq!(f.append(&strings(&["c"]), false).unwrap(), 3);
    drop(f);
    let (f, recs) = open(dir.path()).unwrap();
    assert_eq!(
        recs,
        vec![(1, "a".into()), (2, "b".into()), (3, "c".into())]
    );
    assert_eq!(f.next_index(), 4);
    assert_eq!(f.records(), 3);
}

#[test]
fn a_torn_tail_is_cut_and_appends_follow_the_valid_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.log");
    let (mut f, _) = open(dir.path()).unwrap();
    f.append(&strings(&["one", "two"]), true).unwrap();
    let good = std::fs::metadata(&path).unwrap().len();
    f.append(&strings(&["three"]), true).unwrap();
    drop(f);
    // A crash during the third append: half of it reached the disk.
    let full = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(good + (full - good) / 2).unwrap();
    drop(file);
    let (mut f, recs) = open(dir.path()).unwrap();
    assert_eq!(recs, vec![(1, "one".into()), (2, "two".into())]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good, "tail cut");
    assert_eq!(f.append(&strings(&["four"]), true).unwrap(), 3);
    drop(f);
    let (_, recs) = open(dir.path()).unwrap();
    assert_eq!(recs.last(), Some(&(3, "four".into())));
}

#[test]
fn a_corrupted_record_with_valid_ones_after_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.log");
    let (mut f, _) = open(dir.path()).unwrap();
    f.append(&strings(&["first", "second", "third"]), true)
        .unwrap();
    drop(f);
    let mut bytes = std::fs::read(&path).unwrap();
    // Flip a payload byte of the second record.
    let second = FILE_HEADER + record::HEADER + "first".len();
    bytes[second + record::HEADER] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    match open(dir.path()) {
        Err(RecordFileError::Corrupt { at, reason, .. }) => {
            assert_eq!(at, second);
            assert!(reason.contains("CRC"), "{reason}");
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|o| o.1)),
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing was cut");
}

#[test]
fn a_record_that_does_not_decode_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.log");
    let mut bytes = record::file_header(FORMAT.magic).to_vec();
    bytes.extend_from_slice(&record::encode(1, &[0xff, 0xfe]));
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        open(dir.path()),
        Err(RecordFileError::Corrupt {
            at: FILE_HEADER,
            ..
        })
    ));
}

#[test]
fn an_oversized_length_prefix_is_refused_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.log");
    let (mut f, _) = open(dir.path()).unwrap();
    f.append(&strings(&["ok"]), true).unwrap();
    drop(f);
    let good = std::fs::metadata(&path).unwrap().len();
    // A header claiming a 4 GiB record, then a valid record: damage in the
    // middle. Reading it must neither allocate 4 GiB nor panic.
    let mut bytes = std::fs::read(&path).unwrap();
    let mut huge = record::encode(2, b"x");
    huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&huge);
    bytes.extend_from_slice(&record::encode(3, b"later"));
    std::fs::write(&path, &bytes).unwrap();
    match open(dir.path()) {
        Err(RecordFileError::Corrupt { at, reason, .. }) => {
            assert_eq!(at as u64, good);
            assert!(reason.contains("over the limit"), "{reason}");
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|o| o.1)),
    }
    // The same header as the last thing in the file is a torn tail: cut.
    bytes.truncate(good as usize + huge.len());
    std::fs::write(&path, &bytes).unwrap();
    let (_, recs) = open(dir.path()).unwrap();
    assert_eq!(recs, vec![(1, "ok".into())]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
}

#[test]
fn a_file_cut_inside_its_header_starts_again_and_a_wrong_magic_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.log");
    std::fs::write(&path, &record::file_header(FORMAT.magic)[..3]).unwrap();
    let (f, recs) = open(dir.path()).unwrap();
    assert!(recs.is_empty());
    assert_eq!(f.len(), FILE_HEADER as u64);
    drop(f);
    std::fs::write(&path, record::file_header(*b"NOPE")).unwrap();
    assert!(matches!(
        open(dir.path()),
        Err(RecordFileError::Corrupt { at: 0, .. })
    ));
}

#[test]
fn rewrite_replaces_the_file_with_the_snapshot_records() {
    let dir = tempfile::tempdir().unwrap();
    let (mut f, _) = open(dir.path()).unwrap();
    for i in 0..50 {
        f.append(&[format!("r{i}")], false).unwrap();
    }
    f.rewrite(1, &strings(&["state"])).unwrap();
    f.append(&strings(&["after"]), true).unwrap();
    drop(f);
    let (_, recs) = open(dir.path()).unwrap();
    assert_eq!(recs, vec![(1, "state".into()), (2, "after".into())]);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file left behind");
}

#[test]
fn a_compaction_that_crashes_between_the_snapshot_and_the_log_restart_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (mut f, _) = open(dir.path()).unwrap();
    f.append(&strings(&["a", "b", "c"]), true).unwrap();
    // Compaction, step one: the snapshot of the state as of index 3 is
    // renamed into place. The crash comes before the log is restarted.
    write_snapshot(&RealFs, dir.path(), "t.snap", SNAP, 3, b"abc").unwrap();
    drop(f);
    let (snap_index, snap) = read_snapshot(&RealFs, dir.path(), "t.snap", SNAP)
        .unwrap()
        .unwrap();
    assert_eq!((snap_index, &snap[..]), (3, &b"abc"[..]));
    let (mut f, recs) = open(dir.path()).unwrap();
    // Every record is still there; the owner skips those the snapshot covers.
    let after: Vec<_> = recs.iter().filter(|(i, _)| *i > snap_index).collect();
    assert!(after.is_empty());
    assert_eq!(f.next_index(), snap_index + 1);
    // The owner redoes the compaction's second step: an empty log after
    // the snapshot; appends go on in sequence.
    f.rewrite(snap_index + 1, &[]).unwrap();
    assert_eq!(f.next_index(), 4);
    f.append(&strings(&["d"]), true).unwrap();
    drop(f);
    let (_, recs) = open(dir.path()).unwrap();
    assert_eq!(recs, vec![(4, "d".into())]);
    // A restarted, empty log begins where the snapshot ends.
    let (f, recs) = RecordFile::open(
        Arc::new(RealFs),
        dir.path(),
        "n.log",
        FORMAT,
        Text,
        8,
        Vec::new,
    )
    .unwrap();
    assert!(recs.is_empty());
    assert_eq!(f.next_index(), 8);
}

#[test]
fn an_empty_or_oversized_record_is_refused_before_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let (mut f, _) = open(dir.path()).unwrap();
    let len = f.len();
    assert!(matches!(
        f.append(&strings(&[""]), true),
        Err(RecordFileError::Encode(_))
    ));
    let big = "x".repeat(record::MAX_RECORD + 1);
    assert!(matches!(
        f.append(&[big], true),
        Err(RecordFileError::TooLarge(_))
    ));
    assert_eq!(f.len(), len);
    assert_eq!(f.next_index(), 1);
}

#[test]
fn a_new_or_empty_file_starts_with_the_initial_records() {
    let dir = tempfile::tempdir().unwrap();
    let init = || strings(&["start"]);
    let fs = || Arc::new(RealFs);
    let (mut f, recs) = RecordFile::open(fs(), dir.path(), "i.log", FORMAT, Text, 1, init).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!((recs[0].index, recs[0].at), (1, FILE_HEADER));
    f.append(&strings(&["next"]), true).unwrap();
    drop(f);
    let (_, recs) = RecordFile::open(fs(), dir.path(), "i.log", FORMAT, Text, 1, || {
        panic!("the file holds records; init must not run")
    })
    .unwrap();
    let got: Vec<_> = recs.into_iter().map(|r| (r.index, r.record)).collect();
    assert_eq!(got, vec![(1, "start".into()), (2, "next".into())]);
    // A file holding only its header is started again with init().
    std::fs::write(dir.path().join("i.log"), record::file_header(FORMAT.magic)).unwrap();
    let (f, recs) = RecordFile::open(fs(), dir.path(), "i.log", FORMAT, Text, 1, init).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(f.next_index(), 2);
}
