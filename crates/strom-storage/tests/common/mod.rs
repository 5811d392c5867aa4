//! Helpers shared by the storage integration tests: deterministic batches
//! whose meta describes their data, a checker that reads a batch back and
//! compares every byte, and a small-segment log on a simulated disk.

#![allow(dead_code)]

pub mod disk;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use strom_storage::sim::SimFs;
use strom_storage::vfs::Vfs;
use strom_storage::{AppendBatch, Appended, FileLog, LogConfig, PartitionLog, StoredBatch};

/// Where the simulated-disk tests keep their partition.
pub const SIM_DIR: &str = "/p0";

/// 8 KiB segments (a roll every few standard batches), an index entry every
/// 256 bytes.
pub fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes: 8 * 1024,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Creates the partition at [`SIM_DIR`] on the simulated disk `fs`.
pub fn create_sim(fs: &SimFs) -> FileLog {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    FileLog::create_with(vfs, Path::new(SIM_DIR), small_segments()).unwrap()
}

/// Opens (recovers) the partition at [`SIM_DIR`] on `fs`.
pub fn open_sim(fs: &SimFs) -> FileLog {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    FileLog::open_with(vfs, Path::new(SIM_DIR), small_segments()).unwrap()
}

/// Deterministic payload byte stream for `seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A batch description: `count` events, meta naming the seed and data length,
/// data split into `pieces` segments.
pub struct TestBatch {
    pub seed: u64,
    pub count: u32,
    pub meta: Vec<u8>,
    pub data: Vec<Bytes>,
}

impl TestBatch {
    pub fn new(seed: u64, count: u32, data_len: usize, pieces: usize) -> Self {
        let all = payload(seed, data_len);
        let meta = format!("seed={seed};len={data_len};count={count}").into_bytes();
        let pieces = pieces.max(1);
        let step = data_len.div_ceil(pieces).max(1);
        let data = all.chunks(step).map(Bytes::copy_from_slice).collect();
        TestBatch {
            seed,
            count,
            meta,
            data,
        }
    }

    /// Batch number `i` of a standard mix: varying counts, sizes (including
    /// empty data) and segment counts.
    pub fn standard(i: u64) -> Self {
        let len = match i % 5 {
            0 => 0,
            1 => 1,
            2 => 100,
            3 => 777,
            _ => 3000,
        };
        TestBatch::new(i, (i % 4 + 1) as u32, len, (i % 3 + 1) as usize)
    }

    pub fn append(&self, log: &dyn PartitionLog) -> Appended {
        log.append(AppendBatch {
            count: self.count,
            meta: &self.meta,
            data: &self.data,
        })
        .unwrap()
    }
}

/// Parses the seed and data length back out of a stored batch's meta.
pub fn parse_meta(meta: &[u8]) -> (u64, usize, u32) {
    let s = std::str::from_utf8(meta).unwrap();
    let mut seed = 0;
    let mut len = 0;
    let mut count = 0;
    for part in s.split(';') {
        let (k, v) = part.split_once('=').unwrap();
        match k {
            "seed" => seed = v.parse().unwrap(),
            "len" => len = v.parse().unwrap(),
            "count" => count = v.parse().unwrap(),
            _ => panic!("unexpected meta key {k}"),
        }
    }
    (seed, len, count)
}

/// Checks that a stored batch is intact: meta consistent with count and
/// data_len, and its data (read in full and in pieces) matches the payload.
pub fn check_batch(log: &dyn PartitionLog, b: &StoredBatch) {
    let (seed, len, count) = parse_meta(&b.meta);
    assert_eq!(b.count, count, "count of batch {}", b.base_offset);
    assert_eq!(
        b.data_len, len as u64,
        "data_len of batch {}",
        b.base_offset
    );
    let expected = payload(seed, len);
    let mut out = Vec::new();
    log.read_data(b.base_offset, &[(0, len as u64)], &mut out)
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        &out[0][..],
        &expected[..],
        "data of batch {}",
        b.base_offset
    );
    if len > 2 {
        let mut out = Vec::new();
        let ranges = [(1, (len - 2) as u64), (0, 1)];
        log.read_data(b.base_offset, &ranges, &mut out).unwrap();
        assert_eq!(&out[0][..], &expected[1..len - 1]);
        assert_eq!(&out[1][..], &expected[..1]);
    }
}

/// Reads every batch from `from` and checks density and integrity; returns them.
pub fn read_all(log: &dyn PartitionLog, from: u64) -> Vec<StoredBatch> {
    let mut all: Vec<StoredBatch> = Vec::new();
    let mut next = from;
    loop {
        let batches = log.read(next, 4096).unwrap();
        if batches.is_empty() {
            break;
        }
        for b in batches {
            if let Some(prev) = all.last() {
                assert_eq!(
                    b.base_offset,
                    prev.base_offset + u64::from(prev.count),
                    "dense offsets"
                );
            }
            next = b.base_offset + u64::from(b.count);
            check_batch(log, &b);
            all.push(b);
        }
    }
    assert_eq!(next.max(from), log.next_offset().max(from));
    all
}
