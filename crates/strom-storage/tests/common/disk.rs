//! On-disk helpers for the file-backend tests: listing segment files,
//! copying a partition directory, cutting and flipping bytes.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use strom_storage::{LogConfig, StoredBatch};

pub fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 200,
        ..LogConfig::default()
    }
}

/// Files of `dir` with extension `ext`, sorted by name (= base offset).
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

pub fn size(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

pub fn set_len(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

pub fn flip_byte(path: &Path, pos: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, pos).unwrap();
}

pub fn same_batches(a: &[StoredBatch], b: &[StoredBatch]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (x.base_offset, x.count, x.timestamp_us, x.data_len),
            (y.base_offset, y.count, y.timestamp_us, y.data_len)
        );
        assert_eq!(x.meta, y.meta);
    }
}

/// Log positions of each batch's record, from the stored meta lengths.
pub fn record_positions(batches: &[StoredBatch]) -> Vec<u64> {
    let mut pos = 0;
    batches
        .iter()
        .map(|b| {
            let p = pos;
            pos += 64 + b.meta.len() as u64;
            p
        })
        .collect()
}
