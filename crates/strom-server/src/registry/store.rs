//! The registry's persistence: `registry.log`, an append-only log of
//! [`RegistryCommand`]s (each record fdatasync'ed before it counts), and
//! `registry.snapshot`, the state as of some log index. Opening loads the
//! snapshot and replays the records after it; when the log grows past
//! [`Limits`], it is compacted into a new snapshot and started afresh.
//!
//! The log is a `strom_storage::RecordFile` (framing:
//! `strom_storage::record`, magic `STRG`, JSON payloads).
//!
//! Recovery rules: a damaged *last* record (a crash during an append) is
//! truncated away with a warning. Damage followed by a valid record, a
//! record out of sequence, one that does not decode or apply, or a snapshot
//! that does not parse is corruption: opening fails with `CORRUPT`, naming
//! the file and the byte offset. Nothing read from the files can panic or
//! size an allocation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strom_storage::vfs::Vfs;
use strom_storage::{Codec, Format, RecordFile};

use super::files::{self, StoreError, LOG, LOG_MAGIC, OLD_JSON, SNAPSHOT};
use super::machine::{RegistryCommand, RegistryState};
use super::snapshot;

const FORMAT: Format = Format {
    magic: LOG_MAGIC,
    version: strom_storage::record::VERSION,
    what: "registry log",
};

/// Payloads as they are: commands are decoded after the records the
/// snapshot already covers are skipped.
struct Raw;

impl Codec for Raw {
    type Record = Vec<u8>;
    fn encode(&self, r: &Vec<u8>) -> Result<Vec<u8>, String> {
        Ok(r.clone())
    }
    fn decode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        Ok(payload.to_vec())
    }
}

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
    log: RecordFile<Raw>,
    /// Index of the last command applied (0: none).
    last_index: u64,
    limits: Limits,
}

impl Store {
    /// Opens (or creates) the registry in `dir` and returns the recovered state.
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        limits: Limits,
    ) -> Result<(Store, RegistryState), StoreError> {
        let v = &*vfs;
        files::remove_if_exists(v, &dir.join(format!("{SNAPSHOT}.tmp")))?;
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
        let (log, recs) =
            RecordFile::open(vfs.clone(), dir, LOG, FORMAT, Raw, snap_index + 1, Vec::new)
                .map_err(StoreError::from)?;
        let path = dir.join(LOG);
        let mut last = snap_index;
        let mut stale = 0u64;
        for r in &recs {
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
            let cmd: RegistryCommand = serde_json::from_slice(&r.record)
                .map_err(|e| corrupt(format!("record {} does not decode: {e}", r.index)))?;
            state
                .apply(&cmd)
                .map_err(|e| corrupt(format!("record {} does not apply: {e}", r.index)))?;
            last = r.index;
        }
        let mut store = Store {
            vfs,
            dir: dir.to_path_buf(),
            log,
            last_index: last,
            limits,
        };
        let records = recs.len() as u64;
        if records > 0 && stale == records {
            tracing::info!(file = %path.display(), records, "the snapshot covers the whole registry log; starting a new one");
            store
                .log
                .rewrite(snap_index + 1, &[])
                .map_err(StoreError::from)?;
        }
        Ok((store, state))
    }

    /// Index of the last command in the log or the snapshot.
    #[cfg(test)]
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// Records in the current log file.
    #[cfg(test)]
    pub fn log_records(&self) -> u64 {
        self.log.records()
    }

    /// Appends `cmd` durably (write, then fdatasync) and returns its index.
    /// On failure the log is cut back to where it was, so the command is
    /// not in it and later appends follow valid records.
    pub fn append(&mut self, cmd: &RegistryCommand) -> Result<u64, StoreError> {
        if let Some(why) = self.log.broken() {
            return Err(StoreError::Broken(why.to_string()));
        }
        let path = self.dir.join(LOG);
        let payload = serde_json::to_vec(cmd)
            .map_err(|e| StoreError::io("encoding a record of", &path, std::io::Error::other(e)))?;
        let index = self
            .log
            .append(&[payload], true)
            .map_err(StoreError::from)?;
        self.last_index = index;
        Ok(index)
    }

    pub fn compaction_due(&self) -> bool {
        self.log.records() >= self.limits.records || self.log.len() >= self.limits.bytes
    }

    /// Writes `state` (which must be the state as of [`Self::last_index`])
    /// as the snapshot, then starts a new, empty log. A failure before the
    /// new log takes the old one's name changes nothing: the old log goes
    /// on and the compaction can be retried. A crash between the two steps
    /// leaves records the snapshot covers in the log; opening skips them.
    pub fn compact(&mut self, state: &RegistryState) -> Result<(), StoreError> {
        if let Some(why) = self.log.broken() {
            return Err(StoreError::Broken(why.to_string()));
        }
        snapshot::write(&*self.vfs, &self.dir, self.last_index, state)?;
        self.log
            .rewrite(self.last_index + 1, &[])
            .map_err(StoreError::from)?;
        tracing::debug!(index = self.last_index, "registry log compacted");
        Ok(())
    }
}
