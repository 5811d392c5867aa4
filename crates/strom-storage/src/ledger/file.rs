//! [`LedgerFile`]: the append-only file of one ledger. An 8-byte header
//! (magic `"STRC"`, u32 version) then [`crate::record`] frames whose
//! payloads are [`LedgerRecord`]s, the first a `Start` or a `Snapshot`.
//!
//! Recovery follows the registry's rules: damage with nothing valid after
//! it (a crash during an append) is truncated with a warning; damage
//! followed by a valid record, or a well-framed record that does not
//! decode, is corruption and opening fails, naming the file and the byte
//! (dropping it would redeliver acked work). A write or fdatasync that
//! fails stops the file: every later append fails until it is reopened.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec;
use super::{LedgerRecord, ShareLedger, MAX_SPEC};
use crate::record::{self, FILE_HEADER, MAX_RECORD};
use crate::vfs::{RealFs, Vfs, VfsFile};
use crate::{Result, StorageError};

const MAGIC: [u8; 4] = *b"STRC";
const WHAT: &str = "shared-group ledger";
/// Compact once the file holds this many records...
const COMPACT_RECORDS: u64 = 4096;
/// ...or this many bytes.
const COMPACT_BYTES: u64 = 4 << 20;

/// The open file of one ledger.
pub struct LedgerFile {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    len: u64,
    records: u64,
    next_index: u64,
    /// Why appends are refused, after a failed write or sync.
    failed: Option<String>,
    /// Compaction thresholds: records, bytes.
    compact_at: (u64, u64),
}

fn io_err(context: &str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
    let context = format!("{context} {}", path.display());
    move |e| StorageError::io(context, e)
}

fn corrupt(path: &Path, at: usize, reason: &str) -> StorageError {
    StorageError::corrupt(format!("{WHAT} {} at byte {at}: {reason}", path.display()))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

fn check_spec(spec: &[u8]) -> Result<()> {
    if spec.len() > MAX_SPEC {
        return Err(StorageError::InvalidArgument(format!(
            "a shared-group spec of {} bytes is over the limit of {MAX_SPEC}",
            spec.len()
        )));
    }
    Ok(())
}

/// Frames `records` from index `first`, refusing any over the cap.
fn frame(records: &[LedgerRecord], first: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        match r {
            LedgerRecord::Start { spec, .. } => check_spec(spec)?,
            LedgerRecord::Snapshot(s) => check_spec(&s.spec)?,
            _ => {}
        }
        let payload = codec::encode(r);
        if payload.len() > MAX_RECORD {
            return Err(StorageError::InvalidArgument(format!(
                "a ledger record of {} bytes is over the limit of {MAX_RECORD}",
                payload.len()
            )));
        }
        out.extend_from_slice(&record::encode(first.wrapping_add(i as u64), &payload));
    }
    Ok(out)
}

/// What the replay of an existing file found.
enum Replay {
    /// The ledger and the file's valid length, records and next index.
    Found(ShareLedger, usize, u64, u64),
    /// Nothing was ever durably written (a crash while the file was being
    /// created): start afresh.
    Empty,
}

fn replay(path: &Path, buf: &[u8]) -> Result<Replay> {
    let header = record::file_header(MAGIC);
    if buf.len() <= FILE_HEADER && header.starts_with(buf) {
        return Ok(Replay::Empty);
    }
    let scan = record::scan_log(buf, MAGIC, WHAT).map_err(|d| corrupt(path, d.at, &d.reason))?;
    if let Some(torn) = &scan.torn {
        tracing::warn!(path = %path.display(), byte = torn.at, reason = %torn.reason,
            "truncating a torn last record of the shared-group ledger");
    }
    let Some(first) = scan.records.first() else {
        return Ok(Replay::Empty);
    };
    let mut ledger = match codec::decode(first.payload) {
        Ok(LedgerRecord::Start { floor, spec }) => ShareLedger::new(floor, spec),
        Ok(LedgerRecord::Snapshot(s)) => ShareLedger::from_snapshot(&s),
        Ok(_) => {
            return Err(corrupt(
                path,
                first.at,
                "the first record is neither a start nor a snapshot",
            ))
        }
        Err(reason) => return Err(corrupt(path, first.at, &reason)),
    };
    for rec in &scan.records[1..] {
        let r = codec::decode(rec.payload).map_err(|reason| corrupt(path, rec.at, &reason))?;
        ledger.apply(&r);
    }
    let next = scan.records.last().map_or(1, |r| r.index.wrapping_add(1));
    Ok(Replay::Found(
        ledger,
        scan.valid_len,
        scan.records.len() as u64,
        next,
    ))
}

impl LedgerFile {
    /// Opens and replays the file at `path`, or creates it (header and
    /// `Start` from `init()`: (floor, spec), fdatasync, fsync of the parent
    /// directory). A torn tail is truncated with a warning; damage followed
    /// by a valid record is [`StorageError::Corrupt`] naming file and byte.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        path: &Path,
        init: impl FnOnce() -> (u64, Vec<u8>),
    ) -> Result<(LedgerFile, ShareLedger)> {
        let tmp = tmp_path(path);
        if vfs.exists(&tmp).map_err(io_err("checking", &tmp))? {
            vfs.remove_file(&tmp).map_err(io_err("removing", &tmp))?;
        }
        let file = vfs.open(path, true).map_err(io_err("opening", path))?;
        let size = file.len().map_err(io_err("reading the size of", path))?;
        let size = usize::try_from(size).map_err(|_| corrupt(path, 0, "the file is too large"))?;
        let mut buf = vec![0u8; size];
        file.read_exact_at(&mut buf, 0)
            .map_err(io_err("reading", path))?;
        let mut lf = LedgerFile {
            vfs,
            path: path.to_path_buf(),
            file,
            len: 0,
            records: 0,
            next_index: 1,
            failed: None,
            compact_at: (COMPACT_RECORDS, COMPACT_BYTES),
        };
        match replay(path, &buf)? {
            Replay::Found(ledger, valid, records, next) => {
                lf.len = valid as u64;
                lf.records = records;
                lf.next_index = next;
                if valid < buf.len() {
                    lf.file
                        .set_len(lf.len)
                        .map_err(io_err("truncating", path))?;
                    lf.file.sync_data().map_err(io_err("syncing", path))?;
                }
                Ok((lf, ledger))
            }
            Replay::Empty => {
                if !buf.is_empty() {
                    tracing::warn!(path = %path.display(), size = buf.len(),
                        "the shared-group ledger holds no complete record; starting it afresh");
                }
                let (floor, spec) = init();
                let ledger = ShareLedger::new(floor, spec.clone());
                let start = LedgerRecord::Start { floor, spec };
                let mut bytes = record::file_header(MAGIC).to_vec();
                bytes.extend_from_slice(&frame(std::slice::from_ref(&start), 1)?);
                lf.file.set_len(0).map_err(io_err("truncating", path))?;
                lf.file
                    .write_all_at(&[&bytes], 0)
                    .map_err(io_err("writing", path))?;
                lf.file.sync_data().map_err(io_err("syncing", path))?;
                lf.sync_dir()?;
                lf.len = bytes.len() as u64;
                lf.records = 1;
                lf.next_index = 2;
                Ok((lf, ledger))
            }
        }
    }

    /// [`LedgerFile::open`] on the real file system.
    pub fn open_real(
        path: &Path,
        init: impl FnOnce() -> (u64, Vec<u8>),
    ) -> Result<(LedgerFile, ShareLedger)> {
        Self::open(Arc::new(RealFs), path, init)
    }

    fn sync_dir(&self) -> Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            self.vfs
                .sync_dir(dir)
                .map_err(io_err("syncing the directory of", &self.path))?;
        }
        Ok(())
    }

    fn stopped(&self) -> Result<()> {
        match &self.failed {
            Some(cause) => Err(StorageError::PartitionFailed {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: StorageError) -> StorageError {
        self.failed = Some(format!("shared-group ledger {}: {e}", self.path.display()));
        e
    }

    /// Appends `records` in one write, then fdatasyncs if `sync`. After a
    /// failed write or sync every append fails (the file must be reopened).
    pub fn append(&mut self, records: &[LedgerRecord], sync: bool) -> Result<()> {
        self.stopped()?;
        let bytes = frame(records, self.next_index)?;
        if !bytes.is_empty() {
            if let Err(e) = self.file.write_all_at(&[&bytes], self.len) {
                return Err(self.fail(io_err("writing", &self.path)(e)));
            }
            self.len += bytes.len() as u64;
            self.records += records.len() as u64;
            self.next_index = self.next_index.wrapping_add(records.len() as u64);
        }
        if sync {
            if let Err(e) = self.file.sync_data() {
                return Err(self.fail(io_err("syncing", &self.path)(e)));
            }
        }
        Ok(())
    }

    /// Compacts the file once it holds 4096 records or 4 MiB (see
    /// [`LedgerFile::set_compaction_limits`]): a `Snapshot` of `ledger` (the state the
    /// appended records were applied to) is written to `<path>.tmp`,
    /// fdatasync'ed and renamed over the file, and the directory is fsynced.
    pub fn maybe_compact(&mut self, ledger: &ShareLedger) -> Result<()> {
        self.stopped()?;
        if self.records < self.compact_at.0 && self.len < self.compact_at.1 {
            return Ok(());
        }
        let snap = LedgerRecord::Snapshot(Box::new(ledger.snapshot()));
        let mut bytes = record::file_header(MAGIC).to_vec();
        bytes.extend_from_slice(&frame(std::slice::from_ref(&snap), 1)?);
        let tmp = tmp_path(&self.path);
        let written = (|| {
            let file = self
                .vfs
                .open(&tmp, true)
                .map_err(io_err("creating", &tmp))?;
            file.set_len(0).map_err(io_err("truncating", &tmp))?;
            file.write_all_at(&[&bytes], 0)
                .map_err(io_err("writing", &tmp))?;
            file.sync_data().map_err(io_err("syncing", &tmp))?;
            Ok::<_, StorageError>(file)
        })();
        let file = match written {
            Ok(f) => f,
            Err(e) => {
                // The old file is intact and still the one in use.
                let _ = self.vfs.remove_file(&tmp);
                return Err(e);
            }
        };
        // Once the rename is attempted, which file the path names is
        // uncertain on failure: stop rather than append to the wrong one.
        if let Err(e) = self.vfs.rename(&tmp, &self.path) {
            return Err(self.fail(io_err("renaming", &tmp)(e)));
        }
        if let Err(e) = self.sync_dir() {
            return Err(self.fail(e));
        }
        tracing::debug!(path = %self.path.display(), records = self.records,
            bytes = self.len, "compacted the shared-group ledger");
        self.file = file;
        self.len = bytes.len() as u64;
        self.records = 1;
        self.next_index = 2;
        Ok(())
    }

    /// Changes when [`LedgerFile::maybe_compact`] compacts: at `records`
    /// records or `bytes` bytes (default 4096 and 4 MiB). Tests use small
    /// limits to compact often.
    pub fn set_compaction_limits(&mut self, records: u64, bytes: u64) {
        self.compact_at = (records, bytes);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes the file (the group was deleted), durably.
    pub fn remove(self) -> Result<()> {
        self.vfs
            .remove_file(&self.path)
            .map_err(io_err("removing", &self.path))?;
        self.sync_dir()
    }
}
