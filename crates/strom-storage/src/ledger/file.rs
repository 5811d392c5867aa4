//! [`LedgerFile`]: the append-only file of one ledger. An 8-byte header
//! (magic `"STRC"`, u32 version) then [`crate::record`] frames whose
//! payloads are [`LedgerRecord`]s, the first a `Start` or a `Snapshot`,
//! kept by a [`RecordFile`] (open, replay, append, rewrite).
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
use crate::record_file::{self, Codec, Format, RecordFile, RecordFileError};
use crate::vfs::{RealFs, Vfs};
use crate::{Result, StorageError};

const FORMAT: Format = Format {
    magic: *b"STRC",
    version: crate::record::VERSION,
    what: "shared-group ledger",
};
/// Compact once the file holds this many records...
const COMPACT_RECORDS: u64 = 4096;
/// ...or this many bytes.
const COMPACT_BYTES: u64 = 4 << 20;

/// The ledger's records as [`RecordFile`] payloads.
struct LedgerCodec;

impl Codec for LedgerCodec {
    type Record = LedgerRecord;
    fn encode(&self, r: &LedgerRecord) -> std::result::Result<Vec<u8>, String> {
        Ok(codec::encode(r))
    }
    fn decode(&self, payload: &[u8]) -> std::result::Result<LedgerRecord, String> {
        codec::decode(payload)
    }
}

/// The open file of one ledger.
pub struct LedgerFile {
    path: PathBuf,
    file: RecordFile<LedgerCodec>,
    /// Why appends are refused, after a failed write or sync.
    failed: Option<String>,
    /// Compaction thresholds: records, bytes.
    compact_at: (u64, u64),
}

fn storage(e: RecordFileError) -> StorageError {
    StorageError::from_record_file(FORMAT.what, e)
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

fn check_specs(records: &[LedgerRecord]) -> Result<()> {
    for r in records {
        match r {
            LedgerRecord::Start { spec, .. } => check_spec(spec)?,
            LedgerRecord::Snapshot(s) => check_spec(&s.spec)?,
            _ => {}
        }
    }
    Ok(())
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
        let (dir, name) = record_file::split_path(path, FORMAT.what)?;
        let mut refused = None;
        let opened = RecordFile::open(vfs, dir, name, FORMAT, LedgerCodec, 1, || {
            tracing::debug!(path = %path.display(), "starting a shared-group ledger");
            let (floor, spec) = init();
            let start = LedgerRecord::Start { floor, spec };
            match check_specs(std::slice::from_ref(&start)) {
                Ok(()) => vec![start],
                Err(e) => {
                    refused = Some(e);
                    Vec::new()
                }
            }
        });
        if let Some(e) = refused {
            return Err(e);
        }
        let (file, records) = opened.map_err(storage)?;
        let corrupt = |at: usize, reason: &str| {
            StorageError::from_record_file(
                FORMAT.what,
                RecordFileError::Corrupt {
                    path: path.to_path_buf(),
                    at,
                    reason: reason.to_string(),
                },
            )
        };
        let mut records = records.into_iter();
        let Some(first) = records.next() else {
            return Err(corrupt(0, "the ledger holds no record"));
        };
        let mut ledger = match first.record {
            LedgerRecord::Start { floor, spec } => ShareLedger::new(floor, spec),
            LedgerRecord::Snapshot(s) => ShareLedger::from_snapshot(&s),
            _ => {
                return Err(corrupt(
                    first.at,
                    "the first record is neither a start nor a snapshot",
                ))
            }
        };
        for r in records {
            ledger.apply(&r.record);
        }
        let lf = LedgerFile {
            path: path.to_path_buf(),
            file,
            failed: None,
            compact_at: (COMPACT_RECORDS, COMPACT_BYTES),
        };
        Ok((lf, ledger))
    }

    /// [`LedgerFile::open`] on the real file system.
    pub fn open_real(
        path: &Path,
        init: impl FnOnce() -> (u64, Vec<u8>),
    ) -> Result<(LedgerFile, ShareLedger)> {
        Self::open(Arc::new(RealFs), path, init)
    }

    fn stopped(&self) -> Result<()> {
        match &self.failed {
            Some(cause) => Err(StorageError::PartitionFailed {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: RecordFileError) -> StorageError {
        self.failed = Some(format!("shared-group ledger {}: {e}", self.path.display()));
        storage(e)
    }

    /// Appends `records` in one write, then fdatasyncs if `sync`. After a
    /// failed write or sync every append fails (the file must be reopened).
    pub fn append(&mut self, records: &[LedgerRecord], sync: bool) -> Result<()> {
        self.stopped()?;
        check_specs(records)?;
        match self.file.append(records, sync) {
            Ok(_) => Ok(()),
            Err(e @ (RecordFileError::TooLarge(_) | RecordFileError::Encode(_))) => Err(storage(e)),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Compacts the file once it holds 4096 records or 4 MiB (see
    /// [`LedgerFile::set_compaction_limits`]): a `Snapshot` of `ledger` (the state the
    /// appended records were applied to) is written to `<path>.tmp`,
    /// fdatasync'ed and renamed over the file, and the directory is fsynced.
    pub fn maybe_compact(&mut self, ledger: &ShareLedger) -> Result<()> {
        self.stopped()?;
        if self.file.records() < self.compact_at.0 && self.file.len() < self.compact_at.1 {
            return Ok(());
        }
        let snap = LedgerRecord::Snapshot(Box::new(ledger.snapshot()));
        check_specs(std::slice::from_ref(&snap))?;
        let (records, bytes) = (self.file.records(), self.file.len());
        match self.file.rewrite(1, std::slice::from_ref(&snap)) {
            Ok(()) => {
                tracing::debug!(path = %self.path.display(), records, bytes,
                    "compacted the shared-group ledger");
                Ok(())
            }
            // Once the rename is attempted, which file the path names is
            // uncertain on failure: stop rather than append to the wrong one.
            Err(
                e @ RecordFileError::Io {
                    step: "renaming into",
                    ..
                },
            ) => Err(self.fail(e)),
            Err(e) if self.file.broken().is_some() => Err(self.fail(e)),
            // The old file is intact and still the one in use.
            Err(e) => Err(storage(e)),
        }
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
        self.file.remove().map_err(storage)
    }
}
