//! The registry's persistence: `registry.log`, an append-only log of
//! [`RegistryCommand`]s (each record fdatasync'ed before it counts), and
//! `registry.snapshot`, the state as of some log index. Opening loads the
//! snapshot and replays the records after it; when the log grows past
//! [`Limits`], it is compacted into a new snapshot and started afresh.
//!
//! Recovery rules: a damaged *last* record (a crash during an append) is
//! truncated away with a warning. Damage followed by a valid record, a
//! record out of sequence, one that does not decode or apply, or a snapshot
//! that does not parse is corruption: opening fails with `CORRUPT`, naming
//! the file and the byte offset. Nothing read from the files can panic or
//! size an allocation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strom_storage::record::{self, FILE_HEADER, MAX_RECORD};
use strom_storage::vfs::{Vfs, VfsFile};

use super::files::{self, StoreError, LOG, LOG_MAGIC, OLD_JSON, SNAPSHOT};
use super::machine::{RegistryCommand, RegistryState};
use super::snapshot;

/// When the log is compacted: after an append that brings it to either bound.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub records: u64,
    pub bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            records: 1_000,
            bytes: 1 << 20,
        }
    }
}

pub struct Store {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    log: Box<dyn VfsFile>,
    /// Bytes of the log, header included; the next record goes here.
    log_len: u64,
    /// Records in the log (including any the snapshot already covers).
    log_records: u64,
    /// Index of the last command applied (0: none).
    last_index: u64,
    limits: Limits,
    /// Set when a failed write could not be undone: appends are refused.
    broken: Option<String>,
}

impl Store {
    /// Opens (or creates) the registry in `dir` and returns the recovered state.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        limits: Limits,
    ) -> Result<(Store, RegistryState), StoreError> {
        let v = &*vfs;
        for name in [SNAPSHOT, LOG] {
            files::remove_if_exists(v, &dir.join(format!("{name}.tmp")))?;
        }
        let has_snapshot = files::exists(v, &dir.join(SNAPSHOT))?;
        let has_log = files::exists(v, &dir.join(LOG))?;
        let loaded = if files::exists(v, &dir.join(OLD_JSON))? {
            if !has_snapshot && !has_log {
                Some((0, snapshot::migrate(v, dir)?))
            } else if has_snapshot && !has_log {
                // A migration wrote its snapshot and stopped before the rename.
                tracing::info!(dir = %dir.display(), "finishing an interrupted registry migration");
                snapshot::finish_migration(v, dir)?;
                snapshot::load(v, dir)?
            } else {
                tracing::warn!(dir = %dir.display(), "ignoring a stale registry.json: the registry is in registry.snapshot and registry.log");
                snapshot::load(v, dir)?
            }
        } else {
            snapshot::load(v, dir)?
        };
        let (snap_index, mut state) = loaded.unwrap_or_default();
        let store = match files::read_all(v, &dir.join(LOG))? {
            None => Store::fresh(vfs.clone(), dir, limits, snap_index)?,
            Some(buf) => Store::replay(vfs.clone(), dir, limits, snap_index, &mut state, &buf)?,
        };
        Ok((store, state))
    }

    /// Starts an empty log after the snapshot at `index`.
    fn fresh(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        limits: Limits,
        index: u64,
    ) -> Result<Store, StoreError> {
        let log =
            files::replace(&*vfs, dir, LOG, &record::file_header(LOG_MAGIC)).map_err(|(e, _)| e)?;
        Ok(Store {
            vfs,
            dir: dir.to_path_buf(),
            log,
            log_len: FILE_HEADER as u64,
            log_records: 0,
            last_index: index,
            limits,
            broken: None,
        })
    }

    /// Applies the log's records after the snapshot to `state`.
    fn replay(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        limits: Limits,
        snap_index: u64,
        state: &mut RegistryState,
        buf: &[u8],
    ) -> Result<Store, StoreError> {
        let path = dir.join(LOG);
        let header = record::file_header(LOG_MAGIC);
        if buf.len() < FILE_HEADER && header.starts_with(buf) {
            tracing::warn!(file = %path.display(), bytes = buf.len(), "the registry log stops inside its header; starting it again");
            return Store::fresh(vfs, dir, limits, snap_index);
        }
        let scan = record::scan_log(buf, LOG_MAGIC, "registry log")
            .map_err(|d| StoreError::corrupt(&path, d.at, d.reason))?;
        let mut last = snap_index;
        let mut stale = 0u64;
        for r in &scan.records {
            let corrupt = |why: String| StoreError::corrupt(&path, r.at, why);
            if r.index <= snap_index {
                // Already in the snapshot (a compaction stopped before its new log).
                stale += 1;
                continue;
            }
            if r.index != last + 1 {
                return Err(corrupt(format!(
                    "record {} comes after the snapshot of index {snap_index}, so records {}..{} are missing",
                    r.index,
                    last + 1,
                    r.index - 1
                )));
            }
            let cmd: RegistryCommand = serde_json::from_slice(r.payload)
                .map_err(|e| corrupt(format!("record {} does not decode: {e}", r.index)))?;
            state
                .apply(&cmd)
                .map_err(|e| corrupt(format!("record {} does not apply: {e}", r.index)))?;
            last = r.index;
        }
        let records = scan.records.len() as u64;
        if records > 0 && stale == records {
            tracing::info!(file = %path.display(), records, "the snapshot covers the whole registry log; starting a new one");
            return Store::fresh(vfs, dir, limits, snap_index);
        }
        let log = vfs
            .open(&path, false)
            .map_err(|e| StoreError::io("opening", &path, e))?;
        if let Some(t) = &scan.torn {
            tracing::warn!(
                file = %path.display(),
                offset = t.at,
                reason = %t.reason,
                "dropping a damaged last record of the registry log (a crash during an append); its change was never acknowledged"
            );
            log.set_len(t.at as u64)
                .and_then(|_| log.sync_data())
                .map_err(|e| StoreError::io("truncating", &path, e))?;
        }
        Ok(Store {
            vfs,
            dir: dir.to_path_buf(),
            log,
            log_len: scan.valid_len as u64,
            log_records: records,
            last_index: last,
            limits,
            broken: None,
        })
    }

    /// Index of the last command in the log or the snapshot.
    #[cfg(test)]
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Records in the current log file.
    #[cfg(test)]
    pub fn log_records(&self) -> u64 {
        self.log_records
    }

    /// Appends `cmd` durably (write, then fdatasync) and returns its index.
    /// On failure the log is cut back to where it was, so the command is
    /// not in it and later appends follow valid records.
    pub fn append(&mut self, cmd: &RegistryCommand) -> Result<u64, StoreError> {
        if let Some(why) = &self.broken {
            return Err(StoreError::Broken(why.clone()));
        }
        let path = self.dir.join(LOG);
        let payload = serde_json::to_vec(cmd)
            .map_err(|e| StoreError::io("encoding a record of", &path, std::io::Error::other(e)))?;
        if payload.len() > MAX_RECORD {
            return Err(StoreError::TooLarge(payload.len()));
        }
        let index = self.last_index + 1;
        let rec = record::encode(index, &payload);
        let written = self
            .log
            .write_all_at(&[&rec], self.log_len)
            .and_then(|_| self.log.sync_data());
        if let Err(e) = written {
            let undone = self
                .log
                .set_len(self.log_len)
                .and_then(|_| self.log.sync_data());
            if let Err(e2) = undone {
                self.broken = Some(format!("appending: {e}; cutting it back: {e2}"));
            }
            return Err(StoreError::io("appending to", &path, e));
        }
        self.log_len += rec.len() as u64;
        self.log_records += 1;
        self.last_index = index;
        Ok(index)
    }

    pub fn compaction_due(&self) -> bool {
        self.log_records >= self.limits.records || self.log_len >= self.limits.bytes
    }

    /// Writes `state` (which must be the state as of [`Self::last_index`])
    /// as the snapshot, then starts a new, empty log. A failure before the
    /// new log takes the old one's name changes nothing: the old log goes
    /// on and the compaction can be retried.
    pub fn compact(&mut self, state: &RegistryState) -> Result<(), StoreError> {
        if let Some(why) = &self.broken {
            return Err(StoreError::Broken(why.clone()));
        }
        snapshot::write(&*self.vfs, &self.dir, self.last_index, state)?;
        match files::replace(&*self.vfs, &self.dir, LOG, &record::file_header(LOG_MAGIC)) {
            Ok(log) => {
                self.log = log;
                self.log_len = FILE_HEADER as u64;
                self.log_records = 0;
                tracing::debug!(index = self.last_index, "registry log compacted");
                Ok(())
            }
            Err((e, renamed)) => {
                if renamed {
                    // The open handle is the old, unlinked log, and the new
                    // one's name may not survive a crash: stop appending.
                    self.broken = Some(format!("starting a new log: {e}"));
                }
                Err(e)
            }
        }
    }
}
