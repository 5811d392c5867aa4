//! Tiered storage: closed segments copied to a directory tier or an object
//! store, verified, dropped locally, and read back byte for byte from
//! offset 0; a crash at every step of the copy protocol (simulated disk,
//! tier on the same disk) never leaves a local segment dropped before its
//! tier copy is verified, and the next pass finishes the copy; a corrupt
//! tier copy is refused when verified (the local copy is kept) and when
//! read (a `CORRUPT` error, never a panic); retention reaches the tier.
//!
//! The object-store round trip runs against a real S3-compatible server
//! (moto's `moto_server`, started on port 0) when it is installed, else
//! against `object_store`'s local-filesystem backend; it prints which.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use common::{payload, TestBatch};
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::tier::{DirTier, ObjectTier, TierSettings, TierStore, TieredLog};
use strom_storage::vfs::{Vfs, VfsFile};
use strom_storage::{AppendBatch, LogConfig, PartitionLog, Result};

/// What was appended: base offset, count, meta, whole data.
type Expected = Vec<(u64, u32, Vec<u8>, Vec<u8>)>;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Drop every tiered segment locally.
fn settings() -> TierSettings {
    TierSettings {
        prefix: "topic.1/0".into(),
        local_retention_bytes: Some(0),
        cache_segments: 2,
        ..TierSettings::default()
    }
}

fn open(vfs: Arc<dyn Vfs>, dir: &Path, store: Arc<dyn TierStore>, create: bool) -> TieredLog {
    TieredLog::open_with(vfs, dir, config(), create, store, settings()).unwrap()
}

fn append_batches(log: &dyn PartitionLog, n: u64) -> Expected {
    let mut expected = Vec::new();
    for i in 0..n {
        let b = TestBatch::standard(i);
        let a = log
            .append(AppendBatch {
                count: b.count,
                meta: &b.meta,
                data: &b.data,
            })
            .unwrap();
        let data: Vec<u8> = b.data.iter().flat_map(|d| d.iter().copied()).collect();
        expected.push((a.base_offset, b.count, b.meta.clone(), data));
    }
    log.sync_all().unwrap();
    log.seal_rolled().unwrap();
    expected
}

/// Reads the whole log from offset 0 and compares every batch, meta and
/// data, with what was appended.
fn assert_replays(log: &dyn PartitionLog, expected: &Expected) {
    assert_eq!(log.first_offset(), 0, "the log still starts at offset 0");
    let mut from = 0;
    let mut got = 0;
    while from < log.next_offset() {
        let batches = log
            .read(from, 1024)
            .unwrap_or_else(|e| panic!("read at {from}: {e}"));
        assert!(!batches.is_empty(), "no batch at {from}");
        for b in batches {
            let (base, count, meta, data) = &expected[got];
            assert_eq!((b.base_offset, b.count), (*base, *count));
            assert_eq!(&b.meta[..], &meta[..], "meta of batch {base}");
            let mut out = Vec::new();
            log.read_data(b.base_offset, &[(0, b.data_len)], &mut out)
                .unwrap_or_else(|e| panic!("data of batch {base}: {e}"));
            assert_eq!(&out[0][..], &data[..], "data of batch {base}");
            from = b.base_offset + u64::from(b.count);
            got += 1;
        }
    }
    assert_eq!(got, expected.len(), "every batch read back");
}

#[test]
fn replay_from_offset_zero_after_local_segments_dropped_matches_every_byte() {
    let local = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn TierStore> = Arc::new(DirTier::new(tier_dir.path()).unwrap());
    let dir = local.path().join("p0");
    let log = open(
        Arc::new(strom_storage::vfs::RealFs),
        &dir,
        store.clone(),
        true,
    );
    let expected = append_batches(&log, 120);
    let closed = log.local().closed_segments().len();
    assert!(closed >= 5, "many segments rolled ({closed})");
    assert_eq!(log.copy_all().unwrap() as usize, closed);
    let local_first = log.local().first_offset();
    assert!(local_first > 0, "local segments were dropped");
    assert_eq!(
        log.local().stats().segments,
        1,
        "only the active segment is local"
    );
    assert_eq!(
        store.list("topic.1/0/").unwrap().len(),
        2 * closed,
        "tier holds .log and .data"
    );
    assert_replays(&log, &expected);
    // A timestamp lookup covers the tier: the first batch is found there.
    assert_eq!(log.offset_for_timestamp(0), 0);
    // The same after a restart.
    drop(log);
    let log = open(Arc::new(strom_storage::vfs::RealFs), &dir, store, false);
    assert_eq!(log.local().first_offset(), local_first);
    assert_replays(&log, &expected);
}

/// A tier whose reads flip one bit while `flip` is set (a copy that went
/// bad on its way or at rest).
struct Flaky {
    inner: DirTier,
    flip: AtomicBool,
}

impl TierStore for Flaky {
    fn put(&self, key: &str, src: &dyn VfsFile) -> Result<()> {
        self.inner.put(key, src)
    }
    fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = self.inner.get_range(key, start, len)?;
        if self.flip.load(Ordering::Relaxed) && !buf.is_empty() {
            buf[0] ^= 0x10;
        }
        Ok(buf)
    }
    fn size(&self, key: &str) -> Result<u64> {
        self.inner.size(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key)
    }
    fn describe(&self) -> String {
        "flaky".into()
    }
}

#[test]
fn corrupt_tier_copy_is_refused_at_verify_and_the_local_segment_kept() {
    let local = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    let flaky = Arc::new(Flaky {
        inner: DirTier::new(tier_dir.path()).unwrap(),
        flip: AtomicBool::new(true),
    });
    let dir = local.path().join("p0");
    let log = open(
        Arc::new(strom_storage::vfs::RealFs),
        &dir,
        flaky.clone(),
        true,
    );
    let expected = append_batches(&log, 60);
    let segments = log.local().stats().segments;
    let err = log.copy_all().unwrap_err();
    assert_eq!(err.code(), 301, "{err}");
    assert!(
        err.to_string().contains("does not match the local file"),
        "{err}"
    );
    assert!(
        log.manifest().segments.is_empty(),
        "nothing recorded as tiered"
    );
    assert_eq!(
        log.local().stats().segments,
        segments,
        "no local segment dropped"
    );
    assert_eq!(log.local().first_offset(), 0);
    flaky.flip.store(false, Ordering::Relaxed);
    assert!(log.copy_all().unwrap() > 0);
    assert!(log.local().first_offset() > 0);
    assert_replays(&log, &expected);
}

#[test]
fn corrupt_tier_copy_on_read_is_a_corrupt_error_not_a_panic() {
    let local = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn TierStore> = Arc::new(DirTier::new(tier_dir.path()).unwrap());
    let dir = local.path().join("p0");
    let log = open(Arc::new(strom_storage::vfs::RealFs), &dir, store, true);
    append_batches(&log, 60);
    log.copy_all().unwrap();
    assert!(log.local().first_offset() > 0);
    // Damage the first segment's data in the tier.
    let data = tier_dir
        .path()
        .join("topic.1/0")
        .join(format!("{:020}.data", 0));
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();
    let err = log.read(0, 1024).unwrap_err();
    assert_eq!(err.code(), 301, "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
    let mut out = Vec::new();
    let err = log.read_data(0, &[(0, 0)], &mut out).unwrap_err();
    assert_eq!(err.code(), 301, "{err}");
    // A missing tier object is refused the same way.
    std::fs::remove_file(&data).unwrap();
    let err = log.read(0, 1024).unwrap_err();
    assert_eq!(err.code(), 301, "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn retention_deletes_segments_from_the_tier_too() {
    let local = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn TierStore> = Arc::new(DirTier::new(tier_dir.path()).unwrap());
    let dir = local.path().join("p0");
    let config = LogConfig {
        retention_bytes: Some(16 * 1024),
        ..config()
    };
    let log = TieredLog::open_with(
        Arc::new(strom_storage::vfs::RealFs),
        &dir,
        config,
        true,
        store.clone(),
        settings(),
    )
    .unwrap();
    append_batches(&log, 120);
    log.copy_all().unwrap();
    let before = store.list("topic.1/0/").unwrap().len();
    assert!(log.enforce_retention(strom_storage::now_us()).unwrap() > 0);
    let after = store.list("topic.1/0/").unwrap();
    assert!(
        after.len() < before,
        "tier objects removed ({before} -> {})",
        after.len()
    );
    let first = log.first_offset();
    assert!(first > 0);
    assert!(log.stats().bytes <= 16 * 1024 + 4096);
    assert_eq!(log.manifest().segments.first().map(|s| s.base), Some(first));
    let batches = log.read(first, 1024).unwrap();
    assert_eq!(batches[0].base_offset, first);
    assert_eq!(log.read(0, 1024).unwrap_err().code(), 302);
}

const SIM_DIR: &str = "/data/p0";
const SIM_TIER: &str = "/tier";

fn sim_log(fs: &SimFs, create: bool) -> TieredLog {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let store = Arc::new(DirTier::with_vfs(vfs.clone(), Path::new(SIM_TIER)).unwrap());
    open(vfs, Path::new(SIM_DIR), store, create)
}

/// Crashes the first tier pass after `ops` mutating operations; returns
/// whether the crash point was reached.
fn crash_during_copy(ops: u64, seed: u64) -> bool {
    let fs = SimFs::new();
    let log = sim_log(&fs, true);
    let expected = append_batches(&log, 40);
    let closed = log.local().closed_segments().len();
    fs.crash_after(ops);
    let _ = log.copy_all();
    let crashed = fs.crashed();
    drop(log);
    let image = fs.crash_image(&mut SimRng::new(seed));
    let log = sim_log(&image, false);
    // Whatever was dropped locally is verified in the tier: all readable.
    let m = log.manifest();
    assert!(m
        .segments
        .iter()
        .all(|s| s.next <= log.local().next_offset()));
    assert!(
        log.local().first_offset() <= m.segments.last().map_or(0, |s| s.next),
        "ops {ops} seed {seed}: a local segment was dropped that the manifest does not list"
    );
    assert_replays(&log, &expected);
    // The restart finishes the copies.
    log.copy_all()
        .unwrap_or_else(|e| panic!("ops {ops} seed {seed}: {e}"));
    assert_eq!(
        log.manifest().segments.len(),
        closed,
        "ops {ops} seed {seed}"
    );
    assert_eq!(log.local().stats().segments, 1);
    assert_replays(&log, &expected);
    crashed
}

#[test]
fn crash_at_every_step_of_the_copy_never_drops_an_unverified_segment() {
    let mut ops = 1;
    while crash_during_copy(ops, ops) {
        crash_during_copy(ops, ops ^ 0x5eed);
        ops += 1;
    }
    assert!(ops > 50, "the pass has many crash points ({ops})");
    eprintln!("crashed the copy pass at each of {} operations", ops - 1);
}

/// A moto S3 server on a free port, stopped on drop.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `moto_server` from PATH, else from the repository's Python venv, where
/// `make python-setup` installs it (PyPI `moto[server]`).
fn moto_server() -> std::path::PathBuf {
    let venv =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/.venv/bin/moto_server");
    match venv.exists() {
        true => venv,
        false => "moto_server".into(),
    }
}

fn start_moto() -> Option<Moto> {
    let mut child = Command::new(moto_server())
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let stderr = child.stderr.take()?;
    let mut lines = BufReader::new(stderr).lines();
    let endpoint = lines.by_ref().take(20).map_while(|l| l.ok()).find_map(|l| {
        l.split_once("Running on ")
            .map(|(_, url)| url.trim().to_string())
    });
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let moto = Moto {
        child,
        endpoint: endpoint?,
    };
    create_bucket(&moto.endpoint, "strom-tier").ok()?;
    Some(moto)
}

/// `PUT /bucket` (moto accepts unsigned requests).
fn create_bucket(endpoint: &str, bucket: &str) -> std::io::Result<()> {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    if reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(
            reply.lines().next().unwrap_or("").to_string(),
        ))
    }
}

#[test]
fn object_store_round_trip_replays_every_byte() {
    let local = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    let moto = start_moto();
    let tier = match &moto {
        Some(m) => {
            eprintln!("object-store backend: S3 (moto_server at {})", m.endpoint);
            let opts: Vec<(String, String)> = [
                ("aws_endpoint", m.endpoint.as_str()),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", "test"),
                ("aws_secret_access_key", "test"),
                ("aws_region", "us-east-1"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            ObjectTier::from_url("s3://strom-tier/cluster-a", &opts).unwrap()
        }
        None => {
            eprintln!(
                "object-store backend: object_store LocalFileSystem (no moto_server installed)"
            );
            let url = format!("file://{}", tier_dir.path().display());
            ObjectTier::from_url(&url, &[]).unwrap()
        }
    };
    let store: Arc<dyn TierStore> = Arc::new(tier);
    // A multipart upload: one object larger than a chunk.
    let big = payload(7, (9 << 20) + 123);
    let src_path = local.path().join("big");
    std::fs::write(&src_path, &big).unwrap();
    let src = strom_storage::vfs::RealFs.open(&src_path, false).unwrap();
    store.put("misc/big", &*src).unwrap();
    assert_eq!(store.get("misc/big").unwrap(), big);
    assert_eq!(
        store.get_range("misc/big", 5 << 20, 10).unwrap(),
        &big[5 << 20..(5 << 20) + 10]
    );
    store.delete("misc/big").unwrap();
    store.delete("misc/big").unwrap();
    assert!(store.list("misc/").unwrap().is_empty());

    let dir = local.path().join("p0");
    let log = open(
        Arc::new(strom_storage::vfs::RealFs),
        &dir,
        store.clone(),
        true,
    );
    let expected = append_batches(&log, 120);
    let copied = log.copy_all().unwrap();
    assert!(copied >= 5);
    assert_eq!(store.list("topic.1/0/").unwrap().len(), 2 * copied as usize);
    assert!(log.local().first_offset() > 0);
    assert_replays(&log, &expected);
    let _ = Bytes::new();
}
