//! `registry.snapshot`: the whole registry state as of a log index, written
//! whole and atomically when the log is compacted. Also the one-time
//! migration of the old `registry.json`, which becomes the first snapshot.

use std::path::Path;

use strom_storage::record::{self, FILE_HEADER};
use strom_storage::record_file::{read_snapshot, write_snapshot};
use strom_storage::vfs::Vfs;
use strom_storage::{Format, RecordFileError};

use super::files::{self, StoreError, OLD_JSON, OLD_JSON_MIGRATED, SNAPSHOT, SNAPSHOT_MAGIC};
use super::machine::{Persisted, RegistryState};

const FORMAT: Format = Format {
    magic: SNAPSHOT_MAGIC,
    version: record::VERSION,
    what: "registry snapshot",
};

/// Writes the state as of log index `index` (temp file, fdatasync, rename,
/// fsync of the directory: `strom_storage::record_file::write_snapshot`).
/// On failure the previous snapshot, if any, may still be the one on disk;
/// either is consistent with the log, which is only reset after this
/// succeeds.
pub fn write(
    vfs: &dyn Vfs,
    dir: &Path,
    index: u64,
    state: &RegistryState,
) -> Result<(), StoreError> {
    let path = dir.join(SNAPSHOT);
    let body = serde_json::to_vec(&state.to_persisted())
        .map_err(|e| StoreError::io("encoding", &path, std::io::Error::other(e)))?;
    write_snapshot(vfs, dir, SNAPSHOT, FORMAT, index, &body).map_err(|e| match e {
        // The state is over the 4 GiB a record can hold.
        RecordFileError::Encode(why) => {
            StoreError::io("writing", &path, std::io::Error::other(why))
        }
        e => e.into(),
    })
}

/// Reads the snapshot: the log index it covers and the state, or `None`
/// when there is none. Anything unreadable is corruption.
pub fn load(vfs: &dyn Vfs, dir: &Path) -> Result<Option<(u64, RegistryState)>, StoreError> {
    let path = dir.join(SNAPSHOT);
    let Some((index, payload)) = read_snapshot(vfs, dir, SNAPSHOT, FORMAT)? else {
        return Ok(None);
    };
    let at = FILE_HEADER + record::HEADER;
    let p: Persisted = serde_json::from_slice(&payload)
        .map_err(|e| StoreError::corrupt(&path, at, format!("the state does not decode: {e}")))?;
    let state = RegistryState::from_persisted(p)
        .map_err(|e| StoreError::corrupt(&path, at, format!("an inconsistent state: {e}")))?;
    Ok(Some((index, state)))
}

/// Turns an old `registry.json` into the first snapshot (index 0), then
/// renames it `registry.json.migrated`. A crash in between leaves the
/// snapshot and the old file; [`finish_migration`] completes the rename.
pub fn migrate(vfs: &dyn Vfs, dir: &Path) -> Result<RegistryState, StoreError> {
    let path = dir.join(OLD_JSON);
    let buf = files::read_all(vfs, &path)?.unwrap_or_default();
    let p: Persisted = serde_json::from_slice(&buf)
        .map_err(|e| StoreError::corrupt(&path, 0, format!("not a valid registry: {e}")))?;
    let state = RegistryState::from_persisted(p)
        .map_err(|e| StoreError::corrupt(&path, 0, format!("an inconsistent registry: {e}")))?;
    write(vfs, dir, 0, &state)?;
    finish_migration(vfs, dir)?;
    tracing::info!(
        from = %path.display(),
        topics = state.topics.len(),
        members = state.members.len(),
        "migrated the registry to a snapshot and a command log; the old file is kept as registry.json.migrated"
    );
    Ok(state)
}

/// Renames `registry.json` to `registry.json.migrated` (its contents are
/// in the snapshot).
pub fn finish_migration(vfs: &dyn Vfs, dir: &Path) -> Result<(), StoreError> {
    let from = dir.join(OLD_JSON);
    let to = dir.join(OLD_JSON_MIGRATED);
    vfs.rename(&from, &to)
        .map_err(|e| StoreError::io("renaming", &from, e))?;
    files::sync_dir(vfs, dir)
}
